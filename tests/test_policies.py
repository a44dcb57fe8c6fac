"""Each policy's defining property: greedy caches by cache efficiency, SJF runs the lowest Eq. 7 score first
(and with SiloDPerf prefers the more cache-efficient job), Gavel with SiloDPerf raises the least normalized
throughput, and the irregular partition keeps irregular jobs' storage apart."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest
from scipy.optimize import linprog

from datamgr.scheduler import perf
from datamgr.scheduler.partition import IrregularPartition, fair_share, split_storage
from datamgr.scheduler.perf import Estimator, SiloDPerf, VanillaPerf
from datamgr.scheduler.policies.gavel import GavelMaxMin, equal_share_throughput, solve_max_min
from datamgr.scheduler.policies.greedy import GreedyStorage
from datamgr.scheduler.policies.sjf import MultiResourceSJF, best_choice, candidate_allocations, score_jobs
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import build_scheduler
from datamgr.scheduler.snapshot import JobState, NodeState, Snapshot

MB = 10**6
GB = 10**9
TB = 10**12
RESNET50_V100 = 114 * MB  # f* of ResNet-50 on one V100 (the paper's Figure 6)


def job(
    job_id: str,
    dataset: str,
    dataset_bytes: int,
    *,
    gpus: int = 1,
    ideal: float = RESNET50_V100,
    epochs: float = 10.0,
    submitted: float = 0.0,
    on: Mapping[str, int] | None = None,
    attained: float = 0.0,
    irregular: bool = False,
) -> JobState:
    return JobState(
        job_id=job_id,
        submit_time=submitted,
        gpus=gpus,
        dataset_uri=dataset,
        dataset_bytes=dataset_bytes,
        ideal_bytes_per_sec=ideal * gpus,
        total_bytes=epochs * dataset_bytes,
        attained_gpu_seconds=attained,
        irregular=irregular,
        placement=MappingProxyType(dict(on or {})),
    )


def cluster(jobs: Iterable[JobState], *, gpus: int, cache: int, io: float, nodes: int = 1) -> Snapshot:
    states = {f"node-{i}": NodeState(f"node-{i}", gpus // nodes, cache // nodes) for i in range(nodes)}
    return Snapshot(0.0, states, io, {}, {j.job_id: j for j in jobs})


# --- greedy -------------------------------------------------------------------------------------------


def test_greedy_caches_the_most_cache_efficient_dataset_first() -> None:
    fast_small = job("a", "imagenet-1k", 143 * GB, on={"node-0": 1})
    slow_large = job("b", "web-search", 2 * TB, ideal=2 * MB, on={"node-0": 1})
    snapshot = cluster([fast_small, slow_large], gpus=2, cache=500 * GB, io=100 * MB)
    decision = GreedyStorage().schedule(snapshot, SiloDPerf())
    assert decision.cache_bytes == {"imagenet-1k": 143 * GB, "web-search": 357 * GB}


# --- SJF ----------------------------------------------------------------------------------------------


def test_sjf_starts_the_job_with_the_smallest_score_first() -> None:
    long = job("long", "A", 100 * GB, epochs=50)
    short = job("short", "B", 100 * GB, epochs=5, submitted=10.0)
    snapshot = cluster([long, short], gpus=1, cache=0, io=10 * GB)
    scores = score_jobs(snapshot, SiloDPerf())
    assert scores["short"].score < scores["long"].score
    assert MultiResourceSJF().schedule(snapshot, SiloDPerf()).placements == {"short": {"node-0": 1}}


def test_sjf_preempts_a_running_job_for_one_with_a_smaller_score() -> None:
    long = job("long", "A", 100 * GB, epochs=50, on={"node-0": 1})
    short = job("short", "B", 100 * GB, epochs=5, submitted=10.0)
    snapshot = cluster([long, short], gpus=1, cache=0, io=10 * GB)
    assert MultiResourceSJF().schedule(snapshot, VanillaPerf()).placements == {"short": {"node-0": 1}}


def test_sjf_skips_a_job_that_does_not_fit_so_a_smaller_one_can_start() -> None:
    running = job("running", "A", 100 * GB, gpus=4, epochs=1, on={"node-0": 4})
    wide = job("wide", "B", 100 * GB, gpus=8, epochs=2)
    narrow = job("narrow", "C", 100 * GB, gpus=4, epochs=50)
    snapshot = cluster([running, wide, narrow], gpus=8, cache=0, io=10 * GB)
    placements = MultiResourceSJF().schedule(snapshot, VanillaPerf()).placements
    assert placements == {"running": {"node-0": 4}, "narrow": {"node-0": 4}}


@pytest.mark.parametrize("policy", [MultiResourceSJF(), GavelMaxMin()], ids=lambda p: p.name)
def test_a_job_that_keeps_running_keeps_its_gpus(policy: MultiResourceSJF | GavelMaxMin) -> None:
    # Placed afresh, the job would go to the tightest fitting node, node-0; it already runs on node-1.
    running = job("running", "A", 100 * GB, gpus=2, on={"node-1": 2})
    snapshot = cluster([running], gpus=8, cache=0, io=10 * GB, nodes=2)
    assert policy.schedule(snapshot, VanillaPerf()).placements == {"running": {"node-1": 2}}


def test_with_silod_perf_sjf_prefers_the_more_cache_efficient_of_two_otherwise_equal_jobs() -> None:
    # Section 5.1: two ResNet-50 jobs on the same GPUs for the same number of steps; ImageNet-1k costs a
    # tenth of ImageNet-22k's cache. The 22k job was submitted first, so only its cost can put it second.
    steps_bytes = 90 * 143 * GB
    on_22k = job("22k", "imagenet-22k", 1360 * GB, gpus=8)._replace(total_bytes=steps_bytes)
    on_1k = job("1k", "imagenet-1k", 143 * GB, gpus=8, submitted=1.0)._replace(total_bytes=steps_bytes)
    snapshot = cluster([on_22k, on_1k], gpus=8, cache=1400 * GB, io=50 * MB)
    assert MultiResourceSJF().schedule(snapshot, VanillaPerf()).placements == {"22k": {"node-0": 8}}
    assert MultiResourceSJF().schedule(snapshot, SiloDPerf()).placements == {"1k": {"node-0": 8}}


def test_under_the_vanilla_estimator_the_sjf_score_is_gpu_time_and_storage_is_left_open() -> None:
    one = job("one", "A", 100 * GB, gpus=2, epochs=3)
    snapshot = cluster([one], gpus=8, cache=50 * GB, io=1 * GB)
    choice = score_jobs(snapshot, VanillaPerf())["one"]
    assert choice.score == pytest.approx(2 / 8 * one.remaining_bytes / one.ideal_bytes_per_sec)
    assert (choice.cache_bytes, choice.io_bytes_per_sec) == (0.0, 0.0)
    assert not MultiResourceSJF().schedule(snapshot, VanillaPerf()).decides_storage


@pytest.mark.parametrize("seed", range(8))
def test_the_analytic_sjf_allocation_scores_no_worse_than_any_on_a_fine_grid(seed: int) -> None:
    rng = random.Random(seed)
    candidate = job("j", "A", rng.randint(10, 2000) * GB, gpus=rng.choice([1, 2, 4, 8]), ideal=rng.uniform(2, 300) * MB)
    others = [job(f"k{i}", "A", candidate.dataset_bytes) for i in range(rng.randint(0, 2))]
    snapshot = cluster([candidate, *others], gpus=16, cache=rng.randint(0, 3000) * GB, io=rng.uniform(1, 3000) * MB)
    readers = 1 + len(others)
    analytic = best_choice(candidate, snapshot, SiloDPerf(), readers)
    caches = [snapshot.cache_capacity_bytes * i / 40 for i in range(41)]
    ios = [snapshot.remote_io_bytes_per_sec * i / 40 for i in range(41)]
    for cache, io in itertools.product(caches, ios):
        if cache > candidate.dataset_bytes:
            continue
        rate = SiloDPerf().throughput(candidate, candidate.gpus, cache, io)
        weighted = candidate.gpus / 16 + cache / readers / snapshot.cache_capacity_bytes
        weighted += io / snapshot.remote_io_bytes_per_sec
        grid_score = weighted * candidate.remaining_bytes / rate if rate > 0 else math.inf
        assert analytic.score <= grid_score * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_remembered_candidates_serve_only_jobs_of_the_same_rate_dataset_size_and_cluster(seed: int) -> None:
    # The candidate allocations are remembered per (f*, dataset size, cache, remote IO); every job must still
    # get exactly the choice worked out for it alone, on this cluster and on one with other capacities.
    rng = random.Random(seed)
    sizes = {"A": 143 * GB, "B": 143 * GB, "C": 1360 * GB, "D": 20 * TB}  # A and B: two datasets, one size
    datasets = [rng.choice(list(sizes)) for _ in range(40)]
    jobs = [
        job(
            f"j{i}",
            dataset,
            sizes[dataset],
            gpus=rng.choice([1, 2, 4]),
            ideal=rng.choice([2 * MB, 43 * MB, 114 * MB]),
            epochs=rng.uniform(0.5, 20),
        )
        for i, dataset in enumerate(datasets)
    ]
    readers = Counter(j.dataset_uri for j in jobs)
    for cache, io in ((rng.randint(0, 30) * TB, rng.uniform(0.1, 10) * GB), (5 * TB, 1 * GB), (20 * TB, 1 * GB)):
        snapshot = cluster(jobs, gpus=64, cache=cache, io=io)
        for estimator in (SiloDPerf(), VanillaPerf()):
            choices = score_jobs(snapshot, estimator)
            assert choices == {j.job_id: best_choice(j, snapshot, estimator, readers[j.dataset_uri]) for j in jobs}
        for j in jobs:
            shape = (perf.ideal_rate(j, j.gpus), j.dataset_bytes, snapshot.cache_capacity_bytes, io)
            assert candidate_allocations(*shape) == candidate_allocations.__wrapped__(*shape)


def test_sjf_grants_a_shared_dataset_its_cache_once() -> None:
    readers = [job(f"r{i}", "imagenet-1k", 143 * GB, submitted=i) for i in range(3)]
    snapshot = cluster(readers, gpus=3, cache=200 * GB, io=20 * MB)
    decision = MultiResourceSJF().schedule(snapshot, SiloDPerf())
    assert decision.cache_bytes == {"imagenet-1k": 143 * GB}
    assert decision.io_bytes_per_sec is not None
    assert sum(decision.io_bytes_per_sec.values()) == 20 * MB


# --- Gavel --------------------------------------------------------------------------------------------


def figure_4_like() -> Snapshot:
    """Figure 4's cluster (two V100s, 1.4 TB cache, 50 MB/s) with two ResNet-50 jobs, one on ImageNet-22k
    (1.36 TB) and one on a 1 TB dataset: cache is worth more to the second, which fair shares ignore."""
    jobs = [job("on-22k", "imagenet-22k", 1360 * GB), job("on-1tb", "one-terabyte", 1000 * GB, submitted=1.0)]
    return cluster(jobs, gpus=2, cache=1400 * GB, io=50 * MB)


def least_normalized_throughput(
    snapshot: Snapshot, placements: Mapping[str, Mapping[str, int]], storage: Decision
) -> float:
    """min over running jobs of SiloDPerf under `storage` / SiloDPerf under the equal share."""
    equal = equal_share_throughput(snapshot, SiloDPerf())
    assert storage.cache_bytes is not None and storage.io_bytes_per_sec is not None
    return min(
        SiloDPerf().throughput(
            snapshot.jobs[job_id],
            sum(placement.values()),
            storage.cache_bytes.get(snapshot.jobs[job_id].dataset_uri, 0),
            storage.io_bytes_per_sec.get(job_id, 0),
        )
        / equal[job_id]
        for job_id, placement in placements.items()
    )


def test_silod_gavel_raises_the_least_normalized_throughput_over_vanilla_gavel_with_fair_shared_storage() -> None:
    snapshot = figure_4_like()
    vanilla = GavelMaxMin().schedule(snapshot, VanillaPerf())
    assert vanilla.placements is not None and not vanilla.decides_storage
    shared = fair_share(
        snapshot.with_placements(vanilla.placements).running_jobs(),
        snapshot.cache_capacity_bytes,
        snapshot.remote_io_bytes_per_sec,
    )
    fair = Decision(cache_bytes=shared.cache_bytes, io_bytes_per_sec=shared.io_bytes_per_sec)
    silod = GavelMaxMin().schedule(snapshot, SiloDPerf())
    assert silod.placements is not None
    fair_level = least_normalized_throughput(snapshot, vanilla.placements, fair)
    silod_level = least_normalized_throughput(snapshot, silod.placements, silod)
    assert fair_level == pytest.approx(1.0)
    assert silod_level > 1.3 * fair_level


def test_gavels_level_is_the_max_min_optimum_worked_out_by_hand() -> None:
    # Equal share: 0.7 TB of cache and 25 MB/s each, so e = 25 / (1 - 0.7/1.36) and 25 / (1 - 0.7) MB/s.
    # Caching the 1 TB dataset whole lets its job reach f* = 114 MB/s, 114 / 83.3 of its equal share,
    # while the 22k job's 0.4 TB of cache and all 50 MB/s would carry it further: the 1 TB job binds.
    snapshot = figure_4_like()
    equal = equal_share_throughput(snapshot, SiloDPerf())
    assert equal["on-22k"] == pytest.approx(25 * MB / (1 - 700 / 1360))
    assert equal["on-1tb"] == pytest.approx(25 * MB / (1 - 700 / 1000))
    solution = solve_max_min(snapshot, SiloDPerf(), equal)
    assert solution.level == pytest.approx(RESNET50_V100 / equal["on-1tb"], rel=1e-6)
    assert solution.hit_ratio["one-terabyte"] == pytest.approx(1.0, rel=1e-6)


def random_gavel_cluster(rng: random.Random) -> Snapshot:
    """Up to 30 jobs of the paper's models on shared and private datasets. Every other cluster is short of
    storage (megabytes per second of remote IO for the lot, a terabyte of cache at most), where storage can
    set the max-min level; the others may be short of GPUs, cache or remote IO, or have none of them."""
    models = [(114 * MB, "imagenet-1k", 143 * GB), (43 * MB, "imagenet-22k", 1360 * GB)]
    models += [(10 * MB, "landmarks", 500 * GB), (2 * MB, "websearch", 20_971 * GB)]
    jobs = []
    for i in range(rng.randint(1, 30)):
        ideal, dataset, size = rng.choice(models)
        name = dataset if rng.random() < 0.5 else f"{dataset}/job-{i}"
        jobs.append(job(f"j{i}", name, size, gpus=rng.choice([1, 2, 4, 8]), ideal=ideal, submitted=float(i)))
    if rng.random() < 0.5:
        cache, io = rng.choice([100 * GB, 1 * TB]), rng.choice([1.0 * MB, 10.0 * MB])
    else:
        cache = rng.choice([0, 100 * GB, 1 * TB, 10 * TB, 100 * TB])
        io = rng.choice([0.0, 10 * MB, 100 * MB, 1 * GB, 10 * GB])
    return cluster(jobs, gpus=rng.choice([8, 16, 32, 128]), cache=cache, io=io)


def max_min_level_by_highs(snapshot: Snapshot, estimator: Estimator, equal: Mapping[str, float]) -> float:
    """z* of the linear program in gavel's docstring, from HiGHS: the reference its closed form must match.
    Columns X_j, beta_j = b_j / B (storage-bound jobs), y_d = z u_d, z; rows divided through to ratios."""
    jobs = [j for j in snapshot.jobs_by_submission() if equal[j.job_id] > 0]
    if not jobs:  # z alone would be unbounded; no job has a normalized throughput to raise
        return 0.0
    bound = [j for j in jobs if estimator.throughput(j, j.gpus, 0.0, 0.0) < perf.ideal_rate(j, j.gpus)]
    uris = sorted({j.dataset_uri for j in bound})
    y = {uri: len(jobs) + len(bound) + i for i, uri in enumerate(uris)}
    z = len(jobs) + len(bound) + len(uris)
    gpus, io, cache = snapshot.total_gpus, snapshot.remote_io_bytes_per_sec, snapshot.cache_capacity_bytes
    rows: list[tuple[dict[int, float], float]] = [({i: j.gpus / gpus for i, j in enumerate(jobs)}, 1.0)]
    for i, j in enumerate(jobs):  # z e_j <= f*_j X_j
        rows.append(({z: 1.0, i: -perf.ideal_rate(j, j.gpus) / equal[j.job_id]}, 0.0))
    for i, j in enumerate(bound):  # z e_j - e_j y_d <= b_j
        beta = {len(jobs) + i: -io / equal[j.job_id]} if io > 0 else {}
        rows.append(({z: 1.0, y[j.dataset_uri]: -1.0} | beta, 0.0))
    rows.append(({len(jobs) + i: 1.0 for i in range(len(bound))}, 1.0))  # Sum_j b_j <= B
    rows += [({y[uri]: 1.0, z: -1.0}, 0.0) for uri in uris]  # y_d <= z
    if cache > 0:  # Sum_d d y_d <= C z
        sizes = {j.dataset_uri: j.dataset_bytes for j in bound}
        rows.append(({y[uri]: sizes[uri] / cache for uri in uris} | {z: -1.0}, 0.0))
    matrix = np.zeros((len(rows), z + 1))
    for r, (terms, _) in enumerate(rows):
        for column, value in terms.items():
            matrix[r, column] = value
    limits = [limit for _, limit in rows]
    upper = [1.0] * (len(jobs) + len(bound)) + [math.inf if cache > 0 else 0.0] * len(uris) + [math.inf]
    objective = np.zeros(z + 1)
    objective[z] = -1.0
    result = linprog(objective, A_ub=matrix, b_ub=limits, bounds=[(0.0, u) for u in upper], method="highs")
    assert result.status == 0, result.message
    return float(result.x[z])


@pytest.mark.parametrize("seed", range(40))
def test_gavels_closed_form_is_the_linear_programs_optimum(seed: int) -> None:
    snapshot = random_gavel_cluster(random.Random(seed))
    equal = equal_share_throughput(snapshot, SiloDPerf())
    solution = solve_max_min(snapshot, SiloDPerf(), equal)
    assert solution.level == pytest.approx(max_min_level_by_highs(snapshot, SiloDPerf(), equal), rel=1e-6)
    # The shares and hit ratios returned hold every job at that level within the cluster's resources.
    jobs = {job_id: snapshot.jobs[job_id] for job_id in solution.time_share}
    assert sum(share * jobs[job_id].gpus for job_id, share in solution.time_share.items()) <= snapshot.total_gpus * (
        1 + 1e-9
    )
    sizes = {j.dataset_uri: j.dataset_bytes for j in jobs.values()}
    assert sum(u * sizes[uri] for uri, u in solution.hit_ratio.items()) <= snapshot.cache_capacity_bytes * (1 + 1e-9)
    remote = sum(equal[j] * (1 - solution.hit_ratio[jobs[j].dataset_uri]) for j in solution.storage_bound)
    assert solution.level * remote <= snapshot.remote_io_bytes_per_sec * (1 + 1e-9) + 1e-6


def test_the_random_clusters_have_levels_set_by_storage_and_by_compute() -> None:
    # Without storage rows (a cache-oblivious estimator) the program's level is what compute allows.
    storage_set = compute_set = 0
    for seed in range(40):
        snapshot = random_gavel_cluster(random.Random(seed))
        equal = equal_share_throughput(snapshot, SiloDPerf())
        level = max_min_level_by_highs(snapshot, SiloDPerf(), equal)
        by_compute = max_min_level_by_highs(snapshot, VanillaPerf(), equal)
        if level < by_compute * (1 - 1e-6):
            storage_set += 1
        elif level > 0:
            compute_set += 1
    assert storage_set >= 10 and compute_set >= 10


def test_gavel_asks_only_the_cache_its_level_needs_and_gives_the_rest_to_running_jobs() -> None:
    # 1 GB/s of remote IO carries both jobs at f* (the level, 1, is set by compute) without any cache.
    jobs = [job("small", "imagenet-1k", 143 * GB), job("large", "imagenet-22k", 1360 * GB, submitted=1.0)]
    snapshot = cluster(jobs, gpus=2, cache=2 * TB, io=1 * GB)
    solution = solve_max_min(snapshot, SiloDPerf(), equal_share_throughput(snapshot, SiloDPerf()))
    assert solution.level == pytest.approx(1.0)
    assert solution.hit_ratio == {"imagenet-1k": 0.0, "imagenet-22k": 0.0}
    decision = GavelMaxMin().schedule(snapshot, SiloDPerf())
    assert decision.cache_bytes == {"imagenet-1k": 143 * GB, "imagenet-22k": 1360 * GB}


def test_gavel_caches_first_the_dataset_of_faster_readers_when_the_level_cannot_tell_them_apart() -> None:
    # Both jobs are held by storage alike on their equal shares (e = 5 MB/s / (1 - 0.25), whatever their f*),
    # so the level is the same whichever dataset gets the cache; the ResNet-50 job can use it beyond the level.
    jobs = [job("vlad", "landmarks", 2 * TB, ideal=10 * MB), job("r50", "web-images", 2 * TB, submitted=1.0)]
    snapshot = cluster(jobs, gpus=2, cache=1 * TB, io=10 * MB)
    solution = solve_max_min(snapshot, SiloDPerf(), equal_share_throughput(snapshot, SiloDPerf()))
    assert solution.level == pytest.approx(1.0)
    assert solution.hit_ratio == pytest.approx({"web-images": 0.5, "landmarks": 0.0})


def test_gavel_with_a_cache_oblivious_estimator_decides_compute_only() -> None:
    decision = GavelMaxMin().schedule(figure_4_like(), VanillaPerf())
    assert decision.decides_compute and not decision.decides_storage


def test_gavel_breaks_equal_time_shares_by_least_attained_service() -> None:
    jobs = [job(f"j{i}", f"D{i}", 100 * GB, submitted=i, attained=attained) for i, attained in enumerate([30, 10, 20])]
    snapshot = cluster(jobs, gpus=2, cache=0, io=10 * GB)
    placements = GavelMaxMin().schedule(snapshot, VanillaPerf()).placements
    assert placements is not None and set(placements) == {"j1", "j2"}


@pytest.mark.parametrize(
    ("small_held", "big_held", "runs"),
    [(1000, 0, "big"), (1000, 400, "big"), (400, 600, "small")],
    ids=["big-never-ran", "big-behind-its-share", "small-further-behind"],
)
def test_gavel_runs_the_job_furthest_behind_its_time_share(small_held: float, big_held: float, runs: str) -> None:
    # Two GPUs, two jobs present since t=0 that cannot run together. The program gives the 1-GPU job the time
    # share 1 and the 2-GPU job 0.5 (Gavel's equal shares, s_j = min(1, G / (n g_j))); at t=1000 the job whose
    # share of time so far is furthest below its share runs, as Gavel's round-based mechanism does, not always
    # the larger share.
    small = job("small", "A", 100 * GB, gpus=1, attained=small_held)
    big = job("big", "B", 100 * GB, gpus=2, attained=2 * big_held)
    snapshot = replace(cluster([small, big], gpus=2, cache=0, io=10 * GB), time=1000.0)
    decision = GavelMaxMin().schedule(snapshot, VanillaPerf())
    assert decision.placements is not None and set(decision.placements) == {runs}


@pytest.mark.parametrize(
    ("jobs", "gpus", "cache", "io"),
    [
        ([], 4, 100 * GB, 100 * MB),
        ([job("a", "A", 100 * GB), job("b", "B", 100 * GB)], 2, 0, 0.0),
        ([job("a", "A", 100 * GB)], 0, 100 * GB, 100 * MB),
        ([job("a", "A", 100 * GB, ideal=0.0), job("b", "B", 0)], 2, 50 * GB, 100 * MB),
    ],
    ids=["no-jobs", "no-storage", "no-gpus", "zero-rate-and-empty-dataset"],
)
def test_gavel_handles_degenerate_clusters(jobs: list[JobState], gpus: int, cache: int, io: float) -> None:
    snapshot = cluster(jobs, gpus=gpus, cache=cache, io=io)
    for estimator in (SiloDPerf(), VanillaPerf()):
        decision = GavelMaxMin().schedule(snapshot, estimator)
        assert decision.placements is not None
        assert sum(sum(p.values()) for p in decision.placements.values()) <= snapshot.total_gpus


# --- irregular jobs -----------------------------------------------------------------------------------


def mixed_cluster(irregular_ideal: float = RESNET50_V100) -> Snapshot:
    """Three GPUs: two regular ResNet-50 jobs and one irregular (curriculum) job, all running."""
    jobs = [
        job("r1", "imagenet-1k", 143 * GB, on={"node-0": 1}),
        job("r2", "imagenet-22k", 1360 * GB, on={"node-0": 1}),
        job("c1", "curriculum", 500 * GB, ideal=irregular_ideal, on={"node-0": 1}, irregular=True),
    ]
    return cluster(jobs, gpus=3, cache=900 * GB, io=300 * MB)


@pytest.mark.parametrize("policy", ["fifo", "greedy", "sjf", "gavel"])
def test_the_irregular_partition_gets_storage_in_proportion_to_its_gpus(policy: str) -> None:
    snapshot = mixed_cluster()
    decision = build_scheduler(policy, "silod").decide(snapshot)
    assert decision.cache_bytes is not None and decision.io_bytes_per_sec is not None
    split = split_storage(snapshot.with_placements(decision.placements or {}))
    assert split.irregular_cache_bytes == 300 * GB and split.irregular_io_bytes_per_sec == pytest.approx(100 * MB)
    assert decision.cache_bytes["curriculum"] <= 300 * GB
    assert decision.io_bytes_per_sec["c1"] <= 100 * MB
    assert decision.cache_bytes["imagenet-1k"] + decision.cache_bytes["imagenet-22k"] <= 600 * GB
    assert decision.io_bytes_per_sec["r1"] + decision.io_bytes_per_sec["r2"] <= 200 * MB


@pytest.mark.parametrize("policy", ["fifo", "greedy", "sjf", "gavel"])
def test_an_irregular_jobs_appetite_does_not_change_what_regular_jobs_get(policy: str) -> None:
    scheduler = build_scheduler(policy, "silod")
    modest = scheduler.decide(mixed_cluster(irregular_ideal=10 * MB))
    hungry = scheduler.decide(mixed_cluster(irregular_ideal=10 * GB))
    assert modest.placements == hungry.placements
    assert regular_storage(modest) == regular_storage(hungry)


def regular_storage(decision: Decision) -> tuple[dict[str, int], dict[str, int]]:
    """What `mixed_cluster`'s regular jobs and datasets get."""
    assert decision.cache_bytes is not None and decision.io_bytes_per_sec is not None
    cache = {uri: decision.cache_bytes[uri] for uri in ("imagenet-1k", "imagenet-22k")}
    return cache, {job_id: decision.io_bytes_per_sec[job_id] for job_id in ("r1", "r2")}


def test_irregular_jobs_share_their_partition_evenly() -> None:
    running = [
        job("c1", "small", 50 * GB, on={"node-0": 1}, irregular=True),
        job("c2", "large", 900 * GB, on={"node-0": 1}, irregular=True),
        job("c3", "large", 900 * GB, ideal=10 * MB, on={"node-0": 1}, irregular=True),
    ]
    shared = fair_share(running, 300 * GB, 150 * MB)
    assert shared.cache_bytes == {"small": 50 * GB, "large": 250 * GB}
    assert shared.io_bytes_per_sec == {"c1": 70 * MB, "c2": 70 * MB, "c3": 10 * MB}


@pytest.mark.parametrize("estimator", [SiloDPerf(), VanillaPerf()], ids=lambda e: e.name)
@pytest.mark.parametrize("policy", [MultiResourceSJF(), GavelMaxMin(), GreedyStorage()], ids=lambda p: p.name)
def test_without_irregular_jobs_the_partition_changes_nothing(
    policy: MultiResourceSJF | GavelMaxMin | GreedyStorage, estimator: Estimator
) -> None:
    snapshot = replace(mixed_cluster(), jobs={j.job_id: j for j in mixed_cluster().jobs.values() if not j.irregular})
    assert IrregularPartition(policy).schedule(snapshot, estimator) == policy.schedule(snapshot, estimator)
