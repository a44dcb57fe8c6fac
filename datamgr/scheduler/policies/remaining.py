"""SRTF and SRSF, the full-knowledge references of Tiresias's evaluation (its sections 3.2.1 and 5).

Both know each job's remaining time, which no real scheduler does: here the time its remaining work would
take at full speed on all its GPUs (remaining bytes / f*), so storage never enters the ranking, as in the
paper's world. SRTF ranks by that time; SRSF by remaining service, that time x the job's GPUs. Priorities are
continuous: every round re-ranks all jobs (ties by submission) and `placement.place_by_priority` runs the
prefix that fits, preempting the rest, with Tiresias's placement (the paper: "SRTF uses Tiresias's placement
mechanism"; skew limit as Tiresias's default).
"""

from __future__ import annotations

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import gpus_per_node, place_by_priority, profile_based
from datamgr.scheduler.policy import Decision, LazyNotes
from datamgr.scheduler.snapshot import JobState, Snapshot

PACK_LIMIT = 0.5  # Tiresias's default (`policies/tiresias.py`)


def remaining_seconds(job: JobState) -> float:
    """The time the job's remaining work takes at full speed on all its GPUs."""
    return job.remaining_bytes / job.ideal_bytes_per_sec


class ShortestRemaining:
    """Preemptive shortest-remaining-first by time (`by_service=False`, SRTF) or by GPUs x time (SRSF)."""

    def __init__(self, name: str, by_service: bool) -> None:
        self.name = name
        self.by_service = by_service

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        size = {job.job_id: self._size(job) for job in snapshot.jobs.values()}
        ranked = sorted(snapshot.schedulable_jobs(), key=lambda job: size[job.job_id])  # stable: ties by submission
        everything = snapshot.free_gpus({})
        placements = place_by_priority(everything, ranked, profile_based(gpus_per_node(everything), PACK_LIMIT))
        return Decision(placements=placements, notes=LazyNotes(size, self._describe))

    def _size(self, job: JobState) -> float:
        seconds = remaining_seconds(job)
        return seconds * job.gpus if self.by_service else seconds

    def _describe(self, size: float) -> str:
        return f"remaining {size / 3600:.3g} {'GPU-h' if self.by_service else 'h'}"


def srtf() -> ShortestRemaining:
    return ShortestRemaining("srtf", by_service=False)


def srsf() -> ShortestRemaining:
    return ShortestRemaining("srsf", by_service=True)
