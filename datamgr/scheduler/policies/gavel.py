"""Gavel's max-min fairness (the paper's Eq. 9), with cache and remote IO as resources, as a linear program.

    maximize z  such that every job trains at t_j >= z e_j  and  Sum(R) <= totalResource

e_j is job j's throughput under the equal share R^equal, from the estimator: with n jobs, G GPUs, C cache
and B remote IO, job j gets the time share s_j = min(1, G / (n g_j)) of its gang of g_j GPUs (G/n GPUs'
worth, Gavel's equal time share), C/n cache charged to its dataset (so a dataset k jobs read holds
min(d, k C/n)) and B/n remote IO:  e_j = min(s_j f*_j, perf(j, g_j, c^equal_d, B/n)), which for SiloDPerf
is exactly min(s_j f*_j, b / (1 - c/d)) at that fractional GPU share.

Variables: the time fraction X_j in [0, 1] during which job j holds its gang, its remote IO b_j >= 0, the
hit ratio u_d = c_d/d in [0, 1] of each dataset, and z. Constraints:

    Sum_j X_j g_j <= G        Sum_j b_j <= B        Sum_d u_d d <= C
    z e_j <= f*_j X_j                      compute: the job holds its GPUs X_j of the time
    z e_j (1 - u_d) <= b_j                 remote IO carries the misses (Eq. 2)

The IO constraint is bilinear; with y_d = z u_d it becomes  z e_j - e_j y_d <= b_j,  0 <= y_d <= z,
Sum_d d y_d <= C z, all linear. The IO rows are SiloDPerf's model; a job whose estimate does not depend on
storage (every job under VanillaPerf, or one whose dataset needs no remote IO) gets none, so with a
cache-oblivious estimator the program has X only and the policy leaves storage undecided.

The program is solved exactly, in closed form: a simulated month poses it some 16,000 times (once per
arrival or finish), and an LP solver's fixed cost per call was most of such a run. The compute rows and the
storage rows share only z, so the optimum z* is the smaller of the largest level each admits:
- Compute: shares X_j in [0, 1] with X_j >= z e_j / f*_j and Sum_j X_j g_j <= G exist exactly when
  z <= f*_j / e_j for every j and z Sum_j g_j e_j / f*_j <= G.
- Storage: a dataset's readers need z E_d (1 - u_d) of remote IO, E_d the sum of their e_j, so the level
  needs  z Sum_d E_d (1 - u_d) <= B  for some u with Sum_d u_d d <= C. The u leaving remote IO the least
  is a fractional knapsack: datasets by E_d / d (the rate one cached byte takes off remote IO), highest
  first, each cached whole while the cache lasts. The largest z is B over the rate it leaves (unbounded
  if it leaves none).
tests/test_policies.py checks z* against HiGHS solving the linear program itself.

From the solution to one round:
- The program fixes z but lets X_j take any value above what z needs. The policy uses the least share that
  holds job j at the max-min level, X_j = z e_j / f*_j, and realizes the shares over rounds as Gavel's
  mechanism does: jobs run in descending priority, X_j over the share of time the job has had since it
  arrived (`_rank`), gang-placed while GPUs last; a job that does not fit is skipped.
- Cache: at z* the program fixes the rate the cache must take off remote IO, Sum_d E_d - B / z*, not which
  u_d do it. The policy takes the least cache that does, in the knapsack's order (all of it, the knapsack
  itself, when storage sets the level; datasets the program cannot tell apart by E_d / d go by their
  readers' f*/d, which is what a cached byte saves once they run above the level), for every dataset in the
  program, including those whose jobs sit this round out: Gavel time-shares GPUs across rounds, and a quota
  dropped for one round would have to be fetched again. Cache the level does not need goes to the running
  jobs' datasets by cache efficiency.
- Remote IO: each running job first gets what the level needs, z e_j (1 - c_d/d); the jobs sitting out read
  nothing this round, so the rest is water-filled up to f* among the running jobs.
Jobs with e_j = 0 (no GPU share, or storage that cannot feed them at all) have no normalized throughput;
they are left out of the program and run only on GPUs nobody else takes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import place_in_order
from datamgr.scheduler.policy import Decision, LazyNotes, MergedNotes
from datamgr.scheduler.sharing import fill_idle_cache, water_fill
from datamgr.scheduler.snapshot import JobState, Snapshot


@dataclass(frozen=True, slots=True)
class MaxMin:
    """The program's answer: the max-min level z, each job's least time share at that level, each dataset's
    hit ratio, and the jobs whose rate the program bounds by remote IO."""

    level: float
    time_share: Mapping[str, float] = field(default_factory=dict)
    hit_ratio: Mapping[str, float] = field(default_factory=dict)
    storage_bound: frozenset[str] = frozenset()


class GavelMaxMin:
    """Gavel's max-min fairness."""

    name = "gavel"
    # Gavel is round-based: it decides every 6 minutes (the Gavel paper's round length) and jobs that arrive
    # or finish in between wait for the next round. Declared here, the simulator keeps that cadence.
    round_seconds = 360.0

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        equal = equal_share_throughput(snapshot, estimator)
        solution = solve_max_min(snapshot, estimator, equal)
        shares = solution.time_share
        ranked = sorted(
            snapshot.schedulable_jobs(),
            key=lambda job: _rank(job, shares.get(job.job_id, 0.0), snapshot.time),
        )
        placements = place_in_order(snapshot.free_gpus({}), ranked)
        level = {"gavel": f"max-min normalized throughput {solution.level:.4g}"}
        notes = MergedNotes(level, LazyNotes(solution.time_share, _describe_share))
        if not estimator.storage_aware:
            return Decision(placements=placements, notes=notes)
        sizes = _dataset_sizes(snapshot)
        capacity = snapshot.cache_capacity_bytes
        running = [job for job in ranked if job.job_id in placements]
        chosen = _floor_within({uri: u * sizes[uri] for uri, u in solution.hit_ratio.items()}, capacity)
        cache = {uri: 0 for uri in sizes} | fill_idle_cache(chosen, running, capacity)
        io = _remote_io(snapshot, running, solution, equal, cache)
        return Decision(placements=placements, cache_bytes=cache, io_bytes_per_sec=io, notes=notes)


def equal_share_throughput(snapshot: Snapshot, estimator: Estimator) -> dict[str, float]:
    """e_j: each job's throughput under the equal share R^equal defined in the module docstring."""
    count = len(snapshot.jobs)
    if count == 0:
        return {}
    readers = Counter(job.dataset_uri for job in snapshot.jobs.values())
    io = snapshot.remote_io_bytes_per_sec / count
    time_shares: dict[int, float] = {}  # by GPU demand, and cache shares by dataset: most jobs share them
    caches: dict[str, float] = {}
    equal: dict[str, float] = {}
    for job in snapshot.jobs.values():
        time_share = time_shares.get(job.gpus)
        if time_share is None:
            time_share = time_shares[job.gpus] = (
                min(1.0, snapshot.total_gpus / (count * job.gpus)) if job.gpus > 0 else 0.0
            )
        cache = caches.get(job.dataset_uri)
        if cache is None:
            cache = caches[job.dataset_uri] = min(
                job.dataset_bytes, readers[job.dataset_uri] * snapshot.cache_capacity_bytes / count
            )
        storage_rate = estimator.throughput(job, job.gpus, cache, io)
        equal[job.job_id] = min(time_share * perf.ideal_rate(job, job.gpus), storage_rate)
    return equal


def solve_max_min(snapshot: Snapshot, estimator: Estimator, equal: Mapping[str, float]) -> MaxMin:
    """The program of the module docstring over the jobs with e_j > 0, solved in closed form."""
    jobs = [job for job in snapshot.jobs_by_submission() if equal[job.job_id] > 0]
    if not jobs:
        return MaxMin(level=0.0)
    ideal = {job.job_id: perf.ideal_rate(job, job.gpus) for job in jobs}
    # The storage-bound jobs: those the estimator slows down when they get no cache and no remote IO.
    bound = [job for job in jobs if estimator.throughput(job, job.gpus, 0.0, 0.0) < ideal[job.job_id]]
    datasets = _datasets_by_worth(bound, equal, ideal)
    io, cache = snapshot.remote_io_bytes_per_sec, snapshot.cache_capacity_bytes
    level = min(_compute_level(jobs, ideal, equal, snapshot.total_gpus), _storage_level(datasets, cache, io))
    saving = sum(dataset.rate for dataset in datasets) - io / level if level > 0 else 0.0
    return MaxMin(
        level=level,
        time_share={job.job_id: min(1.0, level * equal[job.job_id] / ideal[job.job_id]) for job in jobs},
        hit_ratio=_least_cache(datasets, cache, saving),
        storage_bound=frozenset(job.job_id for job in bound),
    )


class _Dataset:
    """A dataset in the storage rows: its size d, E_d (the summed e_j of its storage-bound readers) and their
    summed f*.

    A plain class, compiled to a native one, rather than a frozen dataclass: a round builds one per dataset
    of a storage-bound job (over a thousand deep in a cluster400 run), and a compiled frozen dataclass takes
    about four times as long to build. Treat it as immutable."""

    __slots__ = ("ideal_rate", "rate", "size", "uri")

    def __init__(self, uri: str, size: int, rate: float, ideal_rate: float) -> None:
        self.uri = uri
        self.size = size
        self.rate = rate
        self.ideal_rate = ideal_rate

    def order(self) -> tuple[float, float, str]:
        """The knapsack's order: most rate per cached byte at the level first (E_d / d). Ties, which the
        program is indifferent to, go to the most cache-efficient at full speed (f*/d summed, Algorithm 2's
        order, what a cached byte saves once jobs run above the level), then by URI."""
        return (-_per_byte(self.rate, self.size), -_per_byte(self.ideal_rate, self.size), self.uri)


def _per_byte(rate: float, size: int) -> float:
    return rate / size if size > 0 else math.inf


def _datasets_by_worth(
    bound: Sequence[JobState], equal: Mapping[str, float], ideal: Mapping[str, float]
) -> list[_Dataset]:
    """The storage-bound jobs' datasets in the knapsack's order (`_Dataset.order`)."""
    rates: dict[str, float] = {}
    ideal_rates: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for job in bound:
        uri = job.dataset_uri
        rates[uri] = rates.get(uri, 0.0) + equal[job.job_id]
        ideal_rates[uri] = ideal_rates.get(uri, 0.0) + ideal[job.job_id]
        sizes[uri] = job.dataset_bytes
    datasets = [_Dataset(uri, sizes[uri], rate, ideal_rates[uri]) for uri, rate in rates.items()]
    return sorted(datasets, key=_Dataset.order)


def _compute_level(
    jobs: Sequence[JobState], ideal: Mapping[str, float], equal: Mapping[str, float], gpus: int
) -> float:
    """The largest z that time shares X_j in [0, 1] within the cluster's GPUs hold every job at."""
    full_time = min(ideal[job.job_id] / equal[job.job_id] for job in jobs)
    gpus_per_level = sum(job.gpus * equal[job.job_id] / ideal[job.job_id] for job in jobs)
    return min(full_time, gpus / gpus_per_level)


def _storage_level(datasets: Sequence[_Dataset], cache: float, io: float) -> float:
    """The largest z the remote IO rows allow, with the cache split that leaves remote IO the least."""
    hit = _least_cache(datasets, cache, math.inf)
    remote = sum(dataset.rate * (1.0 - hit[dataset.uri]) for dataset in datasets)
    return io / remote if remote > 0 else math.inf


def _least_cache(datasets: Sequence[_Dataset], cache: float, saving: float) -> dict[str, float]:
    """Hit ratios u_d that take `saving` of the storage-bound rate off remote IO with the least cache, at
    most `cache`: `datasets` in order, each cached as far as the saving still needs and the cache holds."""
    hit: dict[str, float] = {}
    for dataset in datasets:
        fits = cache / dataset.size if dataset.size > 0 else 1.0
        share = max(0.0, min(1.0, fits, saving / dataset.rate))
        hit[dataset.uri] = share
        cache -= share * dataset.size
        saving -= share * dataset.rate
    return hit


def _remote_io(
    snapshot: Snapshot,
    running: Sequence[JobState],
    solution: MaxMin,
    equal: Mapping[str, float],
    cache: Mapping[str, int],
) -> dict[str, int]:
    """What the max-min level needs for each running job first, with the cache it can hit now
    (`Snapshot.usable_cache_bytes`), then the rest water-filled up to f*."""
    caps = {job.job_id: perf.ideal_rate(job, job.gpus) for job in running}
    needs = {
        job.job_id: min(
            caps[job.job_id],
            perf.remote_demand(
                solution.level * equal[job.job_id],
                snapshot.usable_cache_bytes(job, cache[job.dataset_uri]),
                job.dataset_bytes,
            ),
        )
        for job in running
        if job.job_id in solution.storage_bound
    }
    budget = snapshot.remote_io_bytes_per_sec
    return water_fill(caps, budget, floor=_floor_within(needs, budget))


def _floor_within(amounts: Mapping[str, float], capacity: float) -> dict[str, int]:
    """Whole units of `amounts`, scaled down together if their sum exceeds `capacity`, as float rounding
    may make the program's cache, and a cache not yet filled its IO needs."""
    total = sum(amounts.values())
    scale = min(1.0, capacity / total) if total > 0 else 0.0
    return {key: int(amount * scale) for key, amount in amounts.items()}


def _rank(job: JobState, share: float, now: float) -> tuple[float, float, float]:
    """Gavel's round-based mechanism (its section 5): a job's priority is the time share the program gives
    it over the share of time it has had, so the jobs furthest behind their X_j run first and, round after
    round, every job holds its GPUs for about X_j of the time. Its time so far is counted from its arrival
    (GPU seconds over its gang and its time present); a job that has not run yet comes first. Ties (shares
    equal up to float rounding) go to the larger share, then the least attained GPU service."""
    share = round(share, 9)
    present = now - job.submit_time
    held = job.attained_gpu_seconds / job.gpus if job.gpus > 0 else 0.0
    if share <= 0.0:
        priority = 0.0
    elif held <= 0.0 or present <= 0.0:
        priority = math.inf
    else:
        priority = share * present / held
    return (-priority, -share, job.attained_gpu_seconds)


def _dataset_sizes(snapshot: Snapshot) -> dict[str, int]:
    return {job.dataset_uri: job.dataset_bytes for job in snapshot.jobs_by_submission()}


def _describe_share(share: float) -> str:
    return f"gavel time share {share:.3f}"
