"""Irregular jobs (section 6): storage split into a partition SiloDPerf governs and one it does not.

SiloDPerf assumes every item is read once per epoch in uniform random order; curriculum learning and the
like break that, so their estimates cannot be trusted and must not steer the cache and remote IO that
regular jobs depend on. When irregular jobs are present:

- Compute is decided once over all jobs by the wrapped policy (with the state it carries and the wake-up it
  asks for), with irregular jobs estimated by the vanilla estimator (their rate is taken to be f*, as a
  cache-oblivious scheduler would) and regular jobs by the policy's own estimator. GPUs are not partitioned.
- Cache and remote IO are split in proportion to the GPUs each partition's jobs hold this round. Storage
  matters only while a job reads, and a job's appetite for data grows with its GPUs (f* is linear in them),
  so the GPU share is the best stand-in for each side's demand that needs no performance model, and it is
  the share the cluster scheduler has already judged fair. No running job: everything is regular.
- The regular partition gets the wrapped policy's storage decision with the policy's estimator, inside
  `Snapshot.restricted(...)` over the running regular jobs and the regular capacities, with each node's GPUs
  cut to what those jobs hold, so the policy allocates for exactly the jobs that run.
- The irregular partition is shared fairly (`fair_share`): equal cache per dataset capped at its size, remote
  IO water-filled up to what each job can use. A dataset read by a running regular job is the regular
  partition's: one quota per dataset, decided where a performance model holds.

Without irregular jobs the wrapped policy runs unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator, VanillaPerf
from datamgr.scheduler.policy import Decision, Policy, current_placements
from datamgr.scheduler.sharing import water_fill
from datamgr.scheduler.snapshot import JobState, Snapshot


class ByRegularity:
    """An estimator that trusts `regular` for regular jobs and falls back to `irregular` for the others."""

    def __init__(self, regular: Estimator, irregular: Estimator) -> None:
        self.regular = regular
        self.irregular = irregular
        self.name = f"{regular.name}, {irregular.name} for irregular jobs"
        self.storage_aware = regular.storage_aware

    def throughput(self, job: JobState, gpus: int, cache_bytes: float, io_bytes_per_sec: float) -> float:
        estimator = self.irregular if job.irregular else self.regular
        return estimator.throughput(job, gpus, cache_bytes, io_bytes_per_sec)


@dataclass(frozen=True, slots=True)
class Split:
    """Storage capacities of the two partitions; each pair sums to the cluster's."""

    regular_cache_bytes: int
    irregular_cache_bytes: int
    regular_io_bytes_per_sec: float
    irregular_io_bytes_per_sec: float


def split_storage(snapshot: Snapshot) -> Split:
    """Cache and remote IO in proportion to the GPUs the snapshot's running irregular jobs hold."""
    running = snapshot.running_jobs()
    held = sum(job.allocated_gpus for job in running)
    irregular = sum(job.allocated_gpus for job in running if job.irregular)
    share = irregular / held if held > 0 else 0.0
    cache = int(snapshot.cache_capacity_bytes * share)
    io = snapshot.remote_io_bytes_per_sec * share
    return Split(
        regular_cache_bytes=snapshot.cache_capacity_bytes - cache,
        irregular_cache_bytes=cache,
        regular_io_bytes_per_sec=snapshot.remote_io_bytes_per_sec - io,
        irregular_io_bytes_per_sec=io,
    )


@dataclass(frozen=True, slots=True)
class FairShare:
    cache_bytes: dict[str, int]  # per dataset
    io_bytes_per_sec: dict[str, int]  # per job


def fair_share(
    running: Sequence[JobState], cache_capacity: int, io_limit: float, owned_elsewhere: Collection[str] = ()
) -> FairShare:
    """Storage shared with no performance model: every dataset of `running` an equal share of the cache up
    to its size (but none to those `owned_elsewhere`), every job an equal share of remote IO up to its f*."""
    sizes = {job.dataset_uri: job.dataset_bytes for job in running if job.dataset_uri not in owned_elsewhere}
    caps = {job.job_id: perf.ideal_rate(job, job.allocated_gpus) for job in running}
    return FairShare(water_fill(sizes, cache_capacity), water_fill(caps, io_limit))


@dataclass(frozen=True)
class IrregularPartition:
    """`policy` with irregular jobs kept out of the storage SiloDPerf allocates (see the module docstring)."""

    policy: Policy

    @property
    def name(self) -> str:
        return self.policy.name

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        if not any(job.irregular for job in snapshot.jobs.values()):
            return self.policy.schedule(snapshot, estimator)
        compute = self.policy.schedule(snapshot, ByRegularity(estimator, VanillaPerf()))
        placements = compute.placements
        if placements is None:
            placements = current_placements(snapshot)
        placed = snapshot.with_placements(placements)
        split = split_storage(placed)
        regular = self.policy.schedule(_regular_partition(placed, split), estimator)
        regular_cache = dict(regular.cache_bytes or {})
        running_irregular = [job for job in placed.running_jobs() if job.irregular]
        irregular = fair_share(
            running_irregular, split.irregular_cache_bytes, split.irregular_io_bytes_per_sec, regular_cache
        )
        notes = {
            "partition": f"regular cache {split.regular_cache_bytes} B, io {split.regular_io_bytes_per_sec:.0f} B/s; "
            f"irregular cache {split.irregular_cache_bytes} B, io {split.irregular_io_bytes_per_sec:.0f} B/s"
        }
        unallocated = {job.dataset_uri: 0 for job in snapshot.jobs_by_submission()}
        return Decision(
            placements=placements,
            cache_bytes=unallocated | regular_cache | irregular.cache_bytes,
            io_bytes_per_sec=dict(regular.io_bytes_per_sec or {}) | irregular.io_bytes_per_sec,
            job_cache_bytes=regular.job_cache_bytes,
            notes={**regular.notes, **notes},
            job_states=compute.job_states,
            wake_at=compute.wake_at,
        )


def _regular_partition(placed: Snapshot, split: Split) -> Snapshot:
    """The running regular jobs alone, on the GPUs they hold and the regular share of storage."""
    running = {job.job_id: job.placement for job in placed.running_jobs() if not job.irregular}
    free = placed.free_gpus(running)
    nodes = {node_id: replace(node, gpus=node.gpus - free[node_id]) for node_id, node in placed.nodes.items()}
    partition = placed.restricted(running, split.regular_cache_bytes, split.regular_io_bytes_per_sec)
    return replace(partition, nodes=nodes)
