"""Gavel's max-min fairness (the paper's Eq. 9), with cache and remote IO as resources, as one linear program.

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

The IO constraint is bilinear. With y_d = z u_d it becomes  z e_j - e_j y_d <= b_j,  0 <= y_d <= z,
Sum_d d y_d <= C z, all linear; u_d = y_d / z afterwards. Rows are divided through by e_j, G, B and C so
the solver sees ratios near 1 rather than bytes. The IO rows are SiloDPerf's model; a job whose estimate
does not depend on storage (every job under VanillaPerf, or one whose dataset needs no remote IO) gets
none, so with a cache-oblivious estimator the program has X only and the policy leaves storage undecided.

From the solution to one round:
- The program fixes z but lets X_j take any value above what z needs. The policy uses the least share that
  holds job j at the max-min level, X_j = z e_j / f*_j, so the ranking does not depend on which optimal
  vertex the solver returns. Jobs run in descending X_j (ties: least attained GPU service, then
  submission), gang-placed while GPUs last; a job that does not fit is skipped.
- Cache: u_d d for every dataset in the program, including those whose jobs sit this round out: Gavel
  time-shares GPUs across rounds, and a quota dropped for one round would have to be fetched again. When
  the level is set by compute rather than storage the program is indifferent to cache beyond what z needs;
  whatever it leaves idle goes to the running jobs' datasets by cache efficiency.
- Remote IO: each running job first gets what the level needs, z e_j (1 - c_d/d); the jobs sitting out read
  nothing this round, so the rest is water-filled up to f* among the running jobs.
Jobs with e_j = 0 (no GPU share, or storage that cannot feed them at all) have no normalized throughput;
they are left out of the program and run only on GPUs nobody else takes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_array

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import place_in_order
from datamgr.scheduler.policy import Decision
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
    """Gavel's max-min fairness. The program depends only on the jobs present, their demands and the
    capacities, so the last solution is kept and reused while those stay the same (the rounds between
    arrivals and finishes): the same inputs give the same answer, only sooner."""

    name = "gavel"

    def __init__(self) -> None:
        self._last: tuple[Hashable, MaxMin] | None = None

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        equal = equal_share_throughput(snapshot, estimator)
        solution = self._solution(snapshot, estimator, equal)
        # Shares equal up to the solver's tolerance count as ties.
        ranked = sorted(
            snapshot.jobs_by_submission(),
            key=lambda job: (-round(solution.time_share.get(job.job_id, 0.0), 9), job.attained_gpu_seconds),
        )
        placements = place_in_order(snapshot.free_gpus({}), ranked)
        notes = {"gavel": f"max-min normalized throughput {solution.level:.4g}"} | {
            job_id: f"gavel time share {share:.3f}" for job_id, share in solution.time_share.items()
        }
        if not estimator.storage_aware:
            return Decision(placements=placements, notes=notes)
        sizes = _dataset_sizes(snapshot)
        capacity = snapshot.cache_capacity_bytes
        running = [job for job in ranked if job.job_id in placements]
        chosen = _floor_within({uri: u * sizes[uri] for uri, u in solution.hit_ratio.items()}, capacity)
        cache = {uri: 0 for uri in sizes} | fill_idle_cache(chosen, running, capacity)
        io = _remote_io(snapshot, running, solution, equal, cache)
        return Decision(placements=placements, cache_bytes=cache, io_bytes_per_sec=io, notes=notes)

    def _solution(self, snapshot: Snapshot, estimator: Estimator, equal: Mapping[str, float]) -> MaxMin:
        inputs = (
            estimator.name,
            snapshot.total_gpus,
            snapshot.remote_io_bytes_per_sec,
            snapshot.cache_capacity_bytes,
            tuple(
                (j.job_id, j.gpus, j.ideal_bytes_per_sec, j.dataset_uri, j.dataset_bytes, equal[j.job_id])
                for j in snapshot.jobs_by_submission()
            ),
        )
        if self._last is None or self._last[0] != inputs:
            self._last = (inputs, solve_max_min(snapshot, estimator, equal))
        return self._last[1]


def equal_share_throughput(snapshot: Snapshot, estimator: Estimator) -> dict[str, float]:
    """e_j: each job's throughput under the equal share R^equal defined in the module docstring."""
    count = len(snapshot.jobs)
    readers = Counter(job.dataset_uri for job in snapshot.jobs.values())
    equal: dict[str, float] = {}
    for job in snapshot.jobs.values():
        time_share = min(1.0, snapshot.total_gpus / (count * job.gpus)) if job.gpus > 0 else 0.0
        cache = min(job.dataset_bytes, readers[job.dataset_uri] * snapshot.cache_capacity_bytes / count)
        storage_rate = estimator.throughput(job, job.gpus, cache, snapshot.remote_io_bytes_per_sec / count)
        equal[job.job_id] = min(time_share * perf.ideal_rate(job, job.gpus), storage_rate)
    return equal


def solve_max_min(snapshot: Snapshot, estimator: Estimator, equal: Mapping[str, float]) -> MaxMin:
    """The linear program of the module docstring over the jobs with e_j > 0."""
    jobs = [job for job in snapshot.jobs_by_submission() if equal[job.job_id] > 0]
    if not jobs:
        return MaxMin(level=0.0)
    bound = [job for job in jobs if _storage_bound(job, estimator)]
    uris = sorted({job.dataset_uri for job in bound})
    program = _Program(snapshot, jobs, bound, uris, equal)
    result = linprog(
        program.objective(), A_ub=program.matrix(), b_ub=program.limits(), bounds=program.bounds(), method="highs"
    )
    if result.status != 0:
        raise RuntimeError(f"gavel: the max-min program over {len(jobs)} jobs has no solution: {result.message}")
    level = float(result.x[program.z])
    ideal = {job.job_id: perf.ideal_rate(job, job.gpus) for job in jobs}
    return MaxMin(
        level=level,
        time_share={job.job_id: min(1.0, level * equal[job.job_id] / ideal[job.job_id]) for job in jobs},
        hit_ratio={
            uri: min(1.0, max(0.0, float(result.x[program.y(i)]) / level)) if level > 0 else 0.0
            for i, uri in enumerate(uris)
        },
        storage_bound=frozenset(job.job_id for job in bound),
    )


def _storage_bound(job: JobState, estimator: Estimator) -> bool:
    """Whether the estimator slows the job down when it gets no cache and no remote IO."""
    return estimator.throughput(job, job.gpus, 0.0, 0.0) < perf.ideal_rate(job, job.gpus)


class _Program:
    """The constraint matrix, built sparse: columns X_j (every job), beta_j = b_j / B (storage-bound jobs),
    y_d (their datasets), z; rows as listed in the module docstring, each divided through to ratios."""

    def __init__(
        self,
        snapshot: Snapshot,
        jobs: Sequence[JobState],
        bound: Sequence[JobState],
        uris: Sequence[str],
        equal: Mapping[str, float],
    ) -> None:
        self._snapshot = snapshot
        self._jobs, self._bound, self._uris = jobs, bound, uris
        self.z = len(jobs) + len(bound) + len(uris)
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._vals: list[float] = []
        self._limits: list[float] = []
        gpus, io, cache = snapshot.total_gpus, snapshot.remote_io_bytes_per_sec, snapshot.cache_capacity_bytes
        self._row({i: job.gpus / gpus for i, job in enumerate(jobs)}, 1.0)
        for i, job in enumerate(jobs):
            self._row({self.z: 1.0, i: -perf.ideal_rate(job, job.gpus) / equal[job.job_id]}, 0.0)
        dataset_column = {uri: self.y(i) for i, uri in enumerate(uris)}
        for i, job in enumerate(bound):
            terms = {self.z: 1.0, dataset_column[job.dataset_uri]: -1.0}
            if io > 0:
                terms[self._beta(i)] = -io / equal[job.job_id]
            self._row(terms, 0.0)
        if bound:
            self._row({self._beta(i): 1.0 for i in range(len(bound))}, 1.0)
        for column in dataset_column.values():
            self._row({column: 1.0, self.z: -1.0}, 0.0)
        if uris and cache > 0:
            sizes = _dataset_sizes(snapshot)
            self._row({dataset_column[uri]: sizes[uri] / cache for uri in uris} | {self.z: -1.0}, 0.0)

    def y(self, dataset_index: int) -> int:
        return len(self._jobs) + len(self._bound) + dataset_index

    def _beta(self, bound_index: int) -> int:
        return len(self._jobs) + bound_index

    def _row(self, terms: Mapping[int, float], limit: float) -> None:
        row = len(self._limits)
        for column, value in terms.items():
            self._rows.append(row)
            self._cols.append(column)
            self._vals.append(value)
        self._limits.append(limit)

    def objective(self) -> np.ndarray:
        objective = np.zeros(self.z + 1)
        objective[self.z] = -1.0  # linprog minimizes
        return objective

    def matrix(self) -> csr_array:
        return csr_array((self._vals, (self._rows, self._cols)), shape=(len(self._limits), self.z + 1))

    def limits(self) -> np.ndarray:
        return np.asarray(self._limits)

    def bounds(self) -> np.ndarray:
        cache_upper = np.inf if self._snapshot.cache_capacity_bytes > 0 else 0.0
        upper = np.concatenate(
            [np.ones(len(self._jobs) + len(self._bound)), np.full(len(self._uris), cache_upper), [np.inf]]
        )
        return np.column_stack([np.zeros(self.z + 1), upper])


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
    """Whole units of `amounts`, scaled down together if their sum exceeds `capacity`, as a solver's answer
    may within its tolerance."""
    total = sum(amounts.values())
    scale = min(1.0, capacity / total) if total > 0 else 0.0
    return {key: int(amount * scale) for key, amount in amounts.items()}


def _dataset_sizes(snapshot: Snapshot) -> dict[str, int]:
    return {job.dataset_uri: job.dataset_bytes for job in snapshot.jobs_by_submission()}
