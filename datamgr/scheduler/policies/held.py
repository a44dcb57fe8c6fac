"""SiloD's greedy storage with the cache of preempted jobs held while they wait.

A preemptive scheduler stops jobs that will run again soon. Storage that follows only the running jobs gives
a preempted job's cache quota away at once; under uniform caching the quota's shrinking evicts its items, and
when the job resumes it reads from remote storage for a whole epoch while its cache refills. Holding the quota
of a waiting, once-preempted job's dataset (at what it was, out of the capacity the greedy allocation shares)
lets it resume at the speed it was preempted at. A dataset a running job reads needs no hold: the greedy
allocation weighs it anyway. Jobs that never ran hold nothing: they have nothing cached to lose.
"""

from __future__ import annotations

from dataclasses import replace

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policies.greedy import GreedyStorage
from datamgr.scheduler.policy import Decision, MergedNotes
from datamgr.scheduler.snapshot import Snapshot


def held_quotas(snapshot: Snapshot) -> dict[str, int]:
    """The cache quota, per dataset, of the preempted jobs waiting in `snapshot` (suspending through a grace
    period, or queued again) whose datasets no running job reads: what they had when they stopped, since
    nothing has taken it from them."""
    read_by_running = {job.dataset_uri for job in snapshot.running_jobs()}
    held: dict[str, int] = {}
    for job in [*snapshot.queued_jobs(), *snapshot.suspending_jobs()]:
        if job.preemptions > 0 and job.dataset_uri not in read_by_running:
            dataset = snapshot.datasets.get(job.dataset_uri)
            if dataset is not None and dataset.cache_quota_bytes > 0:
                held[job.dataset_uri] = dataset.cache_quota_bytes
    return held


def hold_waiting_quotas(placed: Snapshot, compute: Decision, estimator: Estimator) -> Decision:
    """`compute` (a decision on placements) with storage from SiloD's greedy allocation over `placed` (the
    snapshot with those placements), the quotas of waiting preempted jobs held out of it."""
    held = held_quotas(placed)
    capacity = max(0, placed.cache_capacity_bytes - sum(held.values()))
    storage = GreedyStorage().schedule(replace(placed, cache_capacity_bytes=capacity), estimator)
    notes = {uri: f"cache held for its preempted job: {quota} B" for uri, quota in held.items()}
    return replace(
        compute,
        cache_bytes={**(storage.cache_bytes or {}), **held},
        io_bytes_per_sec=storage.io_bytes_per_sec,
        notes=MergedNotes(compute.notes, storage.notes, notes),
    )
