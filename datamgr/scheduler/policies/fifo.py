"""First-in, first-out compute: jobs start in submission order, gang-placed, and are never preempted.

The head of the queue blocks the jobs behind it (no backfilling), as in the paper's FIFO baseline. FIFO is
not performance-aware, so it decides compute only; SiloD pairs it with the greedy storage policy.
"""

from __future__ import annotations

from collections.abc import Mapping

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import Placer, place_gang, take
from datamgr.scheduler.policy import Decision, current_placements
from datamgr.scheduler.snapshot import Snapshot


class FifoPolicy:
    name = "fifo"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        return Decision(placements=start_in_order(snapshot, lambda free, job: place_gang(free, job.gpus), False))


def start_in_order(snapshot: Snapshot, place: Placer, backfill: bool) -> dict[str, Mapping[str, int]]:
    """The running jobs where they are, and the queued ones started in submission order by `place` while it
    finds them room; a job it cannot place stops the queue, or with `backfill` is passed over."""
    placements: dict[str, Mapping[str, int]] = current_placements(snapshot)
    free = snapshot.free_gpus(placements)
    for job in snapshot.queued_jobs():
        placement = place(free, job)
        if placement is None:
            if backfill:
                continue
            break
        take(free, placement)
        placements[job.job_id] = placement
    return placements
