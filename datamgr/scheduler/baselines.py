"""The cache systems SiloD is compared against, as storage-only policies: Alluxio, CoorDL and Quiver.

Each models how a cluster manages its cache when the scheduler above it is cache-oblivious (the paper's
sections 2.1 and 8), so the registry pairs them with the vanilla estimator and they ignore the estimator they
are handed. They allocate to the snapshot's running jobs only and decide storage, never placements.

What they have in common is remote IO: none of them knows what the scheduler is optimizing, so remote IO is
a plain fair share among the jobs reading remotely, work-conserving as flows sharing a link are: max-min fair
up to what each job pulls now, f* (1 - hit) on the GPUs it holds, then the rest max-min fair up to f*
(`fair_shared_io`). Where they differ is the cache:
- Alluxio: one pool of the whole cache capacity, shared by all jobs and evicted LRU; no quotas.
- CoorDL: uniform caching, each job privately on the local disks of the nodes it runs on, an equal static
  share of each node's cache (equal per job rather than per GPU: our choice, see `CoorDLStorage`).
- Quiver: datasets ranked by benefit per byte, the benefit a throughput gain profiled online (so it moves
  with the remote IO a job gets), each cached whole or not at all. `quiver-stable` ranks by the profile a
  job would show with no remote IO at all, f*/d, which does not move.

Pure and deterministic: the same snapshot gives the same decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.sharing import fill_needs_then_caps
from datamgr.scheduler.snapshot import JobState, Snapshot


def fair_shared_io(
    jobs: Sequence[JobState], io_limit: float, usable_cache: Callable[[JobState], float]
) -> dict[str, int]:
    """Remote IO per job, as a link shares it among the flows that cross it: max-min fair up to what each job
    pulls now, f* (1 - c/d) with f* its compute-bound rate on the GPUs it holds and c = `usable_cache(job)`
    the bytes its cache serves now; then what is left max-min fair up to f*, no job above it.

    So a job whose cache serves most of its reads gets only what it misses while others want more, and none
    of the limit idles while the jobs' demand exceeds it. The second fill is harmless (a job fetches only
    what it misses) and covers a demand that grows before the next round. Allocations hold until the next
    round: a job whose demand falls in between leaves the difference idle until then."""
    needs: dict[str, float] = {}
    caps: dict[str, float] = {}
    for job in jobs:
        rate = perf.ideal_rate(job, job.allocated_gpus)
        caps[job.job_id] = rate
        needs[job.job_id] = perf.remote_demand(rate, usable_cache(job), job.dataset_bytes)
    return fill_needs_then_caps(needs, caps, io_limit)


def hit_bytes(job: JobState) -> float:
    """The cache a job hits for the rest of its epoch as the snapshot reports it (its epoch hit ratio times
    its dataset), 0 when not known: a cache the policy sets no quota for (Alluxio's pool), or a private
    copy that a job which has not started reading has not begun to fill (CoorDL)."""
    if job.epoch_hit_ratio is None:
        return 0.0
    return job.epoch_hit_ratio * job.dataset_bytes


class AlluxioStorage:
    """Alluxio, a general-purpose distributed cache: the whole cache capacity is one pool shared by every job
    and managed by LRU, not by quotas.

    So the decision sets no per-dataset quota (`cache_bytes` is empty, which here means "no quotas", not "no
    cache"): what the pool holds is up to LRU, which the simulator models chunk by chunk over the whole
    `snapshot.cache_capacity_bytes`. Under DL training's shuffled once-per-epoch reads, the items LRU keeps
    (the most recently read) are the ones a job will not read again until its next epoch, so once the data
    outgrows the pool it thrashes (section 2.2); that, against uniform caching, is what this baseline shows.
    A job's remote IO demand follows from the hit ratio it reports (`hit_bytes`).
    """

    name = "alluxio"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        io = fair_shared_io(snapshot.running_jobs(), snapshot.remote_io_bytes_per_sec, hit_bytes)
        notes = {"cache": f"one LRU pool of {snapshot.cache_capacity_bytes} bytes shared by all jobs, no quotas"}
        return Decision(cache_bytes={}, io_bytes_per_sec=io, notes=notes)


class CoorDLStorage:
    """CoorDL, a data-loading library that caches uniformly inside each job, on the local disks of the VMs the
    job runs on: each node's cache is split equally among the running jobs placed on it, and a job spanning
    several nodes gets the sum of its shares (CoorDL partitions a distributed job's cache over its servers),
    capped at its dataset's size.

    Equal per job, not per GPU, is our choice: the paper gives CoorDL "the capacity of a job's local storage
    inside the running containers/VMs" (section 2.1) without saying how jobs sharing a node divide its disk, and
    an equal slice per job's container is the simplest static rule. Its extremes: a 1-GPU job alone on a node
    gets the whole node's cache, a 4-GPU job beside four 1-GPU jobs a fifth (a split by GPUs would give it half).

    The cache lives with the job's processes, so jobs reading the same dataset each hold their own copy
    (`job_cache_bytes`): a shared dataset is charged once per job, not once per dataset. And the slice is
    static: it follows from how many jobs share a node, not from how much a job gains from cache, and what a
    job cannot use (its dataset is smaller than its slice) stays idle on its node rather than going to jobs
    elsewhere. Those are the weaknesses the paper shows (sections 2.2 and 8). "Static" means within a round:
    shares are recomputed each round as jobs start and finish on a node (rounded down, so a node's shares
    never add up to more than its cache).

    A snapshot whose cache capacity is below the nodes' caches summed (a storage partition) scales every
    node's cache down by the same factor, so the copies fit the capacity. A job's remote IO demand follows
    from the hit ratio it reports, capped at its copy (`hit_bytes`; a shrunken copy is evicted at once).
    """

    name = "coordl"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        running = snapshot.running_jobs()
        dataset_sizes(running)  # refuses inconsistent sizes, as every baseline does
        node_cache = nodes_cache_bytes(snapshot)
        jobs_on: dict[str, int] = {}
        for job in running:
            for node_id in job.placement:
                jobs_on[node_id] = jobs_on.get(node_id, 0) + 1
        share = {node_id: node_cache.get(node_id, 0) // count for node_id, count in jobs_on.items()}
        private: dict[str, int] = {}
        for job in running:
            slice_bytes = sum(share[node_id] for node_id in job.placement)
            private[job.job_id] = min(job.dataset_bytes, slice_bytes)

        def usable(job: JobState) -> float:
            hit = hit_bytes(job)
            return min(private[job.job_id], hit)

        io = fair_shared_io(running, snapshot.remote_io_bytes_per_sec, usable)
        notes = {
            "cache": f"each of {len(jobs_on)} nodes' cache split equally among the running jobs on it: "
            f"{sum(private.values())} bytes in private copies"
        }
        return Decision(cache_bytes={}, io_bytes_per_sec=io, job_cache_bytes=private, notes=notes)


def nodes_cache_bytes(snapshot: Snapshot) -> dict[str, int]:
    """Each node's cache, scaled down in proportion when the snapshot's capacity is below their sum (rounded
    down, so the result never adds up to more than the capacity)."""
    caches = {node_id: node.cache_bytes for node_id, node in snapshot.nodes.items()}
    total = sum(caches.values())
    capacity = snapshot.cache_capacity_bytes
    if capacity >= total:
        return caches
    return {node_id: cache * capacity // total for node_id, cache in caches.items()}


class QuiverStorage:
    """Quiver, a distributed cache for DL that caches whole the datasets that benefit most, by online profiling.

    A dataset's benefit is the training throughput its running jobs would gain from having it cached, as
    profiled now: for each job SiloDPerf with the dataset cached (f* on the GPUs it holds) minus its rate
    without cache at the remote IO it gets now (min(f*, b), b its allocation in the snapshot, the last
    round's fair share), summed over the dataset's jobs; its cost is its size. Datasets are taken in
    descending benefit per byte, each cached whole if it fits in the capacity left and skipped otherwise (a
    smaller one further down may still fit): Quiver does not cache part of a dataset. Unlike SiloD it cannot
    trade a partial cache against remote IO, nor weigh the scheduler's objective (the paper's Figure 4: it
    gives one job all the cache, however unfair).

    The profile moves with b, and b moves round to round as jobs come and go and caches fill, so the ranking
    moves too: a dataset that falls behind gets quota 0, is evicted at once, and is rebuilt over an epoch if
    it climbs back: the instability the paper's evaluation reports, as issue 13 summarises it (our copy of the
    paper lacks that section; it says only that Quiver allocates cache "to the most beneficial jobs based on
    online profiling", section 8). A job that has never run (b = 0) shows the whole
    f*, as does one its cache serves entirely, since it gets no IO while others want it.

    A dataset cached now (its quota is its size) keeps its place unless another's benefit per byte is
    strictly higher: ties go to the incumbent, with no hysteresis margin beyond that (neither the paper nor issue
    13 says how Quiver breaks ties; this is the simplest rule that does not evict for nothing).

    `stable=True` (cache system `quiver-stable`) turns the instability off: every job is profiled as with no
    remote IO, benefit f*, so the ranking is the steady cache efficiency f*/d, which only arrivals and
    finishes change.
    """

    def __init__(self, stable: bool = False) -> None:
        self.stable = stable
        self.name = "quiver-stable" if stable else "quiver"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        running = snapshot.running_jobs()
        sizes = dataset_sizes(running)
        benefit_per_byte = perf.cache_efficiencies(((j.dataset_uri, self.benefit(j)) for j in running), sizes)
        datasets = snapshot.datasets
        held = {uri for uri in sizes if uri in datasets and datasets[uri].cache_quota_bytes >= sizes[uri]}
        cache: dict[str, int] = {}
        notes: dict[str, str] = {}
        left = snapshot.cache_capacity_bytes
        for uri in sorted(sizes, key=lambda uri: (-benefit_per_byte[uri], uri not in held, uri)):
            if sizes[uri] <= left:
                cache[uri] = sizes[uri]
                left -= sizes[uri]
                verdict = "kept whole" if uri in held else "cached whole"
            else:
                cache[uri] = 0
                verdict = f"{'evicted' if uri in held else 'skipped'}: {sizes[uri]} bytes, {left} left"
            notes[uri] = f"benefit {benefit_per_byte[uri]:.3g}/s per byte, {verdict}"

        def usable(job: JobState) -> float:
            return snapshot.usable_cache_bytes(job, cache[job.dataset_uri])

        io = fair_shared_io(running, snapshot.remote_io_bytes_per_sec, usable)
        return Decision(cache_bytes=cache, io_bytes_per_sec=io, notes=notes)

    def benefit(self, job: JobState) -> float:
        """The throughput (bytes/s) caching its whole dataset gains `job` as Quiver profiles it: SiloDPerf with
        the dataset cached minus SiloDPerf with nothing cached, at the remote IO it gets now (or at none,
        under `stable`)."""
        ideal = perf.ideal_rate(job, job.allocated_gpus)
        io = 0.0 if self.stable else job.io_bytes_per_sec
        cached = perf.silod_perf(ideal, job.dataset_bytes, job.dataset_bytes, io)
        return cached - perf.silod_perf(ideal, 0.0, job.dataset_bytes, io)


def stable_quiver() -> QuiverStorage:
    """Quiver profiled as with no remote IO: the `quiver-stable` cache system."""
    return QuiverStorage(stable=True)


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
