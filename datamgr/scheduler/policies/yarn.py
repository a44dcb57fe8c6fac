"""The production baselines Tiresias compares against: YARN-CS and Best-effort (its sections 5.1 and 5.3).

YARN-CS, the capacity scheduler Microsoft's Philly ran: jobs start first-come first-served, never preempted,
each consolidated on as few nodes as its GPUs need (`placement.place_consolidated`), and the head of the
queue blocks everything behind it until it can be placed so. Best-effort is YARN-CS without that head-of-line
blocking: a job that cannot be placed is passed over and later jobs that can be, start. Both decide compute
only; the cache system decides storage.
"""

from __future__ import annotations

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import gpus_per_node, place_consolidated
from datamgr.scheduler.policies.fifo import start_in_order
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.snapshot import Snapshot


class ConsolidatingFifo:
    """FIFO with consolidated placement; `backfill` lets jobs pass a head that cannot be placed."""

    def __init__(self, name: str, backfill: bool) -> None:
        self.name = name
        self.backfill = backfill

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        per_node = gpus_per_node(snapshot.free_gpus({}))
        placements = start_in_order(
            snapshot, lambda free, job: place_consolidated(free, job.gpus, per_node), self.backfill
        )
        return Decision(placements=placements)


def yarn_cs() -> ConsolidatingFifo:
    return ConsolidatingFifo("yarn-cs", backfill=False)


def best_effort() -> ConsolidatingFifo:
    return ConsolidatingFifo("best-effort", backfill=True)
