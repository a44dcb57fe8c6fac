"""The cache systems SiloD is compared against, as storage-only policies: Alluxio, CoorDL and Quiver.

Each models how a cluster manages its cache when the scheduler above it is cache-oblivious (the paper's
sections 2.1 and 8), so the registry pairs them with the vanilla estimator and they ignore the estimator they
are handed. They allocate to the snapshot's running jobs only and decide storage, never placements.

What they have in common is remote IO: none of them knows what the scheduler is optimizing, so the best a
storage layer can do is share the egress limit max-min fairly, giving no job more than it can consume (its
compute-bound rate on the GPUs it holds). Where they differ is the cache:
- Alluxio: one pool of the whole cache capacity, shared by all jobs and evicted LRU; no quotas.
- CoorDL: uniform caching, but each job caches privately in a statically sized slice of the cache.
- Quiver: datasets ranked by benefit per byte, each cached whole or not at all.

Pure and deterministic: the same snapshot gives the same decision.
"""

from __future__ import annotations

from collections.abc import Iterable

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.sharing import water_fill
from datamgr.scheduler.snapshot import JobState, Snapshot


def fair_shared_io(jobs: Iterable[JobState], io_limit: float) -> dict[str, int]:
    """Remote IO per job: max-min fair shares of `io_limit`, none above the job's compute-bound rate on the
    GPUs it holds, so IO a job cannot use goes to the others and none of the limit idles while a job could
    use it."""
    return water_fill({job.job_id: perf.ideal_rate(job, job.allocated_gpus) for job in jobs}, io_limit)


class AlluxioStorage:
    """Alluxio, a general-purpose distributed cache: the whole cache capacity is one pool shared by every job
    and managed by LRU, not by quotas.

    So the decision sets no per-dataset quota (`cache_bytes` is empty, which here means "no quotas", not "no
    cache"): what the pool holds is up to LRU, which the simulator models chunk by chunk over the whole
    `snapshot.cache_capacity_bytes`. Under DL training's shuffled once-per-epoch reads, the items LRU keeps
    (the most recently read) are the ones a job will not read again until its next epoch, so once the data
    outgrows the pool it thrashes (section 2.2); that, against uniform caching, is what this baseline shows.
    """

    name = "alluxio"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        io = fair_shared_io(snapshot.running_jobs(), snapshot.remote_io_bytes_per_sec)
        notes = {"cache": f"one LRU pool of {snapshot.cache_capacity_bytes} bytes shared by all jobs, no quotas"}
        return Decision(cache_bytes={}, io_bytes_per_sec=io, notes=notes)


class CoorDLStorage:
    """CoorDL, a data-loading library that caches uniformly inside each job: every running job gets a private
    cache of an equal, fixed share of the capacity, capped at its dataset's size.

    The cache lives with the job's processes, so jobs reading the same dataset each hold their own copy: a
    shared dataset is charged once per job, not once per dataset. And the slice is static: it follows from
    how many jobs run, not from how much a job gains from cache, and what a job cannot use (its dataset is
    smaller than its slice) is left idle rather than handed to others. Those are the weaknesses the paper
    shows (sections 2.2 and 8). "Fixed" means fixed within a round: the share is the capacity divided
    equally among the jobs running after the round (rounded down, so the shares never add up to more than
    the capacity), and it is recomputed each round as jobs start and finish.
    """

    name = "coordl"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        running = snapshot.running_jobs()
        sizes = dataset_sizes(running)
        share = snapshot.cache_capacity_bytes // len(running) if running else 0
        private = {job.job_id: min(share, sizes[job.dataset_uri]) for job in running}
        io = fair_shared_io(running, snapshot.remote_io_bytes_per_sec)
        notes = {"cache": f"{share} bytes private to each of {len(running)} running jobs"}
        return Decision(cache_bytes={}, io_bytes_per_sec=io, job_cache_bytes=private, notes=notes)


class QuiverStorage:
    """Quiver, a distributed cache for DL that caches the datasets that benefit most, whole.

    A dataset's benefit is the remote IO caching it saves per second, the sum of its running jobs' rates;
    its cost is its size. Datasets are taken in descending benefit per byte, each cached whole if it fits in
    the capacity left and skipped otherwise (a smaller one further down may still fit): Quiver does not
    cache part of a dataset. Unlike SiloD it cannot trade a partial cache against remote IO, nor weigh the
    scheduler's objective (the paper's Figure 4: it gives one job all the cache, however unfair).
    """

    name = "quiver"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        running = snapshot.running_jobs()
        sizes = dataset_sizes(running)
        benefit_per_byte = perf.cache_efficiencies(
            ((j.dataset_uri, perf.ideal_rate(j, j.allocated_gpus)) for j in running), sizes
        )
        cache: dict[str, int] = {}
        notes: dict[str, str] = {}
        left = snapshot.cache_capacity_bytes
        for uri in sorted(sizes, key=lambda uri: (-benefit_per_byte[uri], uri)):
            if sizes[uri] <= left:
                cache[uri] = sizes[uri]
                left -= sizes[uri]
                verdict = "cached whole"
            else:
                cache[uri] = 0
                verdict = f"skipped: {sizes[uri]} bytes, {left} left"
            notes[uri] = f"benefit {benefit_per_byte[uri]:.3g}/s per byte, {verdict}"
        io = fair_shared_io(running, snapshot.remote_io_bytes_per_sec)
        return Decision(cache_bytes=cache, io_bytes_per_sec=io, notes=notes)


def dataset_sizes(jobs: Iterable[JobState]) -> dict[str, int]:
    """Bytes per dataset the jobs read. A negative size, or jobs disagreeing on a dataset's size, is an error:
    a cache sized from it would be meaningless."""
    sizes: dict[str, int] = {}
    for job in jobs:
        if job.dataset_bytes < 0:
            raise ValueError(
                f"job {job.job_id!r} gives dataset {job.dataset_uri!r} a negative size, {job.dataset_bytes}"
            )
        known = sizes.setdefault(job.dataset_uri, job.dataset_bytes)
        if known != job.dataset_bytes:
            raise ValueError(
                f"jobs disagree on the size of dataset {job.dataset_uri!r}: job {job.job_id!r} says "
                f"{job.dataset_bytes} bytes, an earlier job {known}"
            )
    return sizes
