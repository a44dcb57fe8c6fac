"""SiloD's greedy storage with the cache of preempted jobs held while they wait.

A preemptive scheduler stops jobs that will run again soon. Storage that follows only the running jobs gives
a preempted job's cache quota away at once; under uniform caching the quota's shrinking evicts its items, and
when the job resumes it reads from remote storage for a whole epoch while its cache refills. Holding the quota
of a waiting, preempted job's dataset (at what it was, out of the capacity the greedy allocation shares), from
the round that preempts it on, lets it resume at the speed it was preempted at. A dataset a running job reads
needs no hold: the greedy allocation weighs it anyway. Jobs that never ran hold nothing: they have nothing
cached to lose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policies.greedy import GreedyStorage
from datamgr.scheduler.policy import Decision, MergedNotes
from datamgr.scheduler.snapshot import Snapshot


def held_quotas(snapshot: Snapshot, placements: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, int]:
    """The cache quota, per dataset, of the preempted jobs that wait once `placements` (a round's compute
    decision on `snapshot`; None: the jobs running in it run on) is applied, whose datasets no job it runs reads.

    A preempted job is one that `placements` stops now, or one preempted before that still waits (suspending
    through a grace period, or queued again). The round that preempts a job must hold its quota already:
    storage recomputed without it gives the quota away, and the next round would find nothing to hold. What it
    holds is its dataset's quota in `snapshot`, what the nodes cache for it now, since nothing has taken it."""
    if placements is None:
        placements = {job.job_id: job.placement for job in snapshot.running_jobs()}
    jobs = snapshot.jobs
    read_by_running = {
        jobs[job_id].dataset_uri for job_id, placement in placements.items() if placement and job_id in jobs
    }
    stopped_now = [job for job in snapshot.running_jobs() if not placements.get(job.job_id)]
    waiting = [job for job in [*snapshot.queued_jobs(), *snapshot.suspending_jobs()] if job.preemptions > 0]
    held: dict[str, int] = {}
    for job in [*stopped_now, *waiting]:
        if job.dataset_uri not in read_by_running:
            dataset = snapshot.datasets.get(job.dataset_uri)
            if dataset is not None and dataset.cache_quota_bytes > 0:
                held[job.dataset_uri] = dataset.cache_quota_bytes
    return held


def hold_waiting_quotas(snapshot: Snapshot, compute: Decision, estimator: Estimator) -> Decision:
    """`compute` (a decision on `snapshot`'s placements) with storage from SiloD's greedy allocation over the
    snapshot with those placements, the quotas of the preempted jobs that wait after it (`held_quotas`) held
    out of it."""
    placed = snapshot if compute.placements is None else snapshot.with_placements(compute.placements)
    held = held_quotas(snapshot, compute.placements)
    capacity = max(0, placed.cache_capacity_bytes - sum(held.values()))
    storage = GreedyStorage().schedule(replace(placed, cache_capacity_bytes=capacity), estimator)
    notes = {uri: f"cache held for its preempted job: {quota} B" for uri, quota in held.items()}
    return replace(
        compute,
        cache_bytes={**(storage.cache_bytes or {}), **held},
        io_bytes_per_sec=storage.io_bytes_per_sec,
        notes=MergedNotes(compute.notes, storage.notes, notes),
    )
