"""Multi-resource shortest job first (the paper's Eq. 7): Tetris's weighted resource-time with GPUs, cache
and remote IO as the resources, job duration from the estimator.

    score(j) = min over R of  (g/G + c_j/C + b/B) * remaining_bytes(j) / perf(j, R)

with weights 1/total per resource (as in Tetris) and R = (g GPUs, c cache bytes, b remote IO bytes/s).

Which R minimizes the score. GPUs are fixed at the job's demand g (gang scheduling; f* is linear in GPUs,
so fewer would not lower GPU-time anyway); F = f*(j, g). Write u = c/d for the hit ratio. Cache is charged
once per dataset (section 6), so the k jobs reading a dataset split its cost: c_j = c/k. With SiloDPerf,
perf = min(F, b / (1 - u)):

- For fixed u, while b < F (1 - u) the job is IO-bound and the score falls as b grows (the weights grow
  linearly, the duration falls in proportion); beyond it the duration stays and IO is charged for nothing.
  So b = F (1 - u) (Eq. 2), or all of B when that is less.
- Where F (1 - u) <= B the score is then  remaining/F * (g/G + F/B + u d (1/(kC) - F/(dB))),  linear in u:
  the whole dataset is cached (u = min(1, C/d)) exactly when F/d > B/(kC), i.e. when the cache a job pays
  for saves more IO than it costs at the cluster's exchange rate of B/C bytes/s per cached byte; otherwise
  nothing is. Where F (1 - u) > B (u < u0 = 1 - B/F) the score is (1 - u) remaining/B (g/G + u d/(kC) + 1),
  concave in u. Either way the minimum lies at an end of a piece: u in {0, u0, min(1, C/d)}.

Those candidates are evaluated with the estimator handed to `schedule`, together with R = (g, 0, 0): under
an estimator that ignores storage (VanillaPerf) that one wins and the score is plain GPU-time, while under
SiloDPerf it is useless (rate 0) for any dataset that needs remote IO.

Compute is preemptive: every round all jobs are re-ranked by ascending score (ties by submission) and
gang-placed in that order. A job that does not fit is skipped so smaller ones behind it can start: SJF's
aim is the average completion time, which head-of-line blocking behind a large job would only hurt (large
jobs wait longer, as they do under any SJF). With a storage-aware estimator the policy also decides storage:
the jobs that will run, in score order, are granted their chosen cache (per dataset, once) and the remote IO
their cache leaves them needing, f* (1 - c/d), while capacity lasts. Cache no job chose goes to the most
cache-efficient datasets (idle, it would save nothing) before IO demands are worked out, and leftover IO is
water-filled up to what each job can use (f*, which carries a job through the epoch in which its cache is
still filling).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import place_in_order
from datamgr.scheduler.policy import Decision, LazyNotes
from datamgr.scheduler.sharing import fill_idle_cache, fill_in_order, water_fill
from datamgr.scheduler.snapshot import JobState, Snapshot


class Choice(NamedTuple):
    """The allocation that minimizes a job's score, and the score (a named tuple: one per job per round)."""

    score: float
    cache_bytes: float  # for the job's dataset
    io_bytes_per_sec: float


NO_STORAGE: tuple[float, float] = (0.0, 0.0)  # (cache bytes, remote IO) of R = (g, 0, 0), the first candidate


class MultiResourceSJF:
    name = "sjf"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        choices = score_jobs(snapshot, estimator)
        ranked = sorted(snapshot.schedulable_jobs(), key=lambda job: choices[job.job_id].score)
        placements = place_in_order(snapshot.free_gpus({}), ranked)
        notes = LazyNotes(choices, _describe)
        if not estimator.storage_aware:
            return Decision(placements=placements, notes=notes)
        running = [job for job in ranked if job.job_id in placements]
        cache, io = _grant_storage(snapshot, running, choices)
        return Decision(placements=placements, cache_bytes=cache, io_bytes_per_sec=io, notes=notes)


def score_jobs(snapshot: Snapshot, estimator: Estimator) -> dict[str, Choice]:
    """Eq. 7 for every job of the snapshot, with the allocation that attains it."""
    readers = Counter(job.dataset_uri for job in snapshot.jobs.values())
    return {
        job.job_id: best_choice(job, snapshot, estimator, readers[job.dataset_uri]) for job in snapshot.jobs.values()
    }


def best_choice(job: JobState, snapshot: Snapshot, estimator: Estimator, readers: int) -> Choice:
    """The lowest-scoring of the candidate allocations derived in the module docstring (the first of equals).

    Under an estimator that ignores storage every candidate runs at the same rate, so the first, R = (g, 0, 0),
    the cheapest, wins: the others are not worked out (a cache-oblivious round scores its whole queue)."""
    if not estimator.storage_aware:
        return _lowest(job, (NO_STORAGE,), snapshot, estimator, readers)
    candidates = candidate_allocations(
        perf.ideal_rate(job, job.gpus),
        job.dataset_bytes,
        snapshot.cache_capacity_bytes,
        snapshot.remote_io_bytes_per_sec,
    )
    return _lowest(job, candidates, snapshot, estimator, readers)


@functools.lru_cache(maxsize=4096)
def candidate_allocations(
    ideal: float, dataset_bytes: int, cache_capacity: int, io_limit: float
) -> tuple[tuple[float, float], ...]:
    """(cache bytes, remote IO) of the allocations one of which minimizes the score of a job with f* `ideal`
    on a dataset of `dataset_bytes` (the module docstring): none, then the hit ratios {0, u0, min(1, C/d)}
    in ascending order, each with the IO that feeds f* at that ratio (at most the limit).

    A function of four numbers that most jobs share with others, round after round (the same models on the
    same datasets), so the answers are remembered."""
    full = perf.hit_ratio(cache_capacity, dataset_bytes)
    hit_ratios = {0.0, full}
    if ideal > io_limit:
        hit_ratios.add(min(full, 1.0 - io_limit / ideal))
    storage = [
        (u * dataset_bytes, min(io_limit, perf.remote_demand(ideal, u * dataset_bytes, dataset_bytes)))
        for u in sorted(hit_ratios)
    ]
    return (NO_STORAGE, *storage)


def _lowest(
    job: JobState, candidates: Sequence[tuple[float, float]], snapshot: Snapshot, estimator: Estimator, readers: int
) -> Choice:
    """The candidate with the lowest score, the first of equals (as `min` picks)."""
    remaining = job.remaining_bytes
    if remaining <= 0:
        return Choice(0.0, *candidates[0])  # nothing left to run: every allocation scores 0, the first wins
    cache_limit = snapshot.cache_capacity_bytes
    io_limit = snapshot.remote_io_bytes_per_sec
    gpu_share = _share(job.gpus, snapshot.total_gpus)  # the same in every candidate
    best: tuple[float, float, float] | None = None  # (score, cache, io)
    for cache, io in candidates:
        rate = estimator.throughput(job, job.gpus, cache, io)
        if rate <= 0:
            score = math.inf
        else:
            weighted = gpu_share + _share(cache / readers, cache_limit) + _share(io, io_limit)
            score = weighted * remaining / rate
        if best is None or score < best[0]:
            best = (score, cache, io)
    assert best is not None  # there is always a candidate
    return Choice(*best)


def _share(amount: float, total: float) -> float:
    """amount / total, where taking nothing of an absent resource costs nothing."""
    if amount <= 0:
        return 0.0
    return amount / total if total > 0 else math.inf


def _grant_storage(
    snapshot: Snapshot, running: list[JobState], choices: dict[str, Choice]
) -> tuple[dict[str, int], dict[str, int]]:
    """Cache and remote IO for the jobs that will run (in score order), while capacity lasts.

    A dataset gets the most cache any of its running readers chose, at the rank of its best-ranked reader;
    cache nobody chose is then filled by cache efficiency, since idle it saves nothing. Each job then gets
    the remote IO its dataset's cache leaves it needing, f* (1 - c/d) with c the cache it can hit now
    (`Snapshot.usable_cache_bytes`), and leftover IO is water-filled.
    """
    wanted: dict[str, float] = {}
    for job in running:
        wanted[job.dataset_uri] = max(wanted.get(job.dataset_uri, 0.0), choices[job.job_id].cache_bytes)
    capacity = snapshot.cache_capacity_bytes
    chosen = fill_in_order(wanted, capacity)
    cache = {job.dataset_uri: 0 for job in snapshot.jobs_by_submission()} | fill_idle_cache(chosen, running, capacity)
    caps = {job.job_id: perf.ideal_rate(job, job.gpus) for job in running}
    demands = {
        job.job_id: perf.remote_demand(
            caps[job.job_id], snapshot.usable_cache_bytes(job, cache[job.dataset_uri]), job.dataset_bytes
        )
        for job in running
    }
    budget = snapshot.remote_io_bytes_per_sec
    return cache, water_fill(caps, budget, floor=fill_in_order(demands, budget))


def _describe(choice: Choice) -> str:
    return f"sjf score {choice.score:.4g} with cache {choice.cache_bytes:.4g} B, io {choice.io_bytes_per_sec:.4g} B/s"
