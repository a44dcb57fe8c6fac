"""The cache-system baselines: Alluxio sets no quotas (its cache is one LRU pool), CoorDL gives each job a
private equal slice of the cache of the nodes it runs on, Quiver caches whole the datasets that benefit most
by a profile that moves with the remote IO a job gets (`quiver-stable`: by one that does not), and all of them
share remote IO work-conservingly: max-min fair up to what each job misses, then up to what it can use."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

import pytest

from datamgr.scheduler.baselines import AlluxioStorage, CoorDLStorage, QuiverStorage, stable_quiver
from datamgr.scheduler.perf import SiloDPerf, VanillaPerf
from datamgr.scheduler.policy import Decision, Policy
from datamgr.scheduler.registry import CACHE_SYSTEMS, build_scheduler
from datamgr.scheduler.sharing import fill_needs_then_caps
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, SimResult, TraceJob
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot

MB = 10**6
GB = 10**9
TB = 10**12
NODE = "node-0"
BASELINES: list[Policy] = [AlluxioStorage(), CoorDLStorage(), QuiverStorage(), stable_quiver()]


def job(
    job_id: str,
    dataset: str,
    dataset_mb: int,
    rate_mb: float,
    gpus: int = 1,
    held: int | None = None,
    on: Mapping[str, int] | None = None,
    io_mb: float = 0.0,
    hit: float | None = None,
) -> JobState:
    """A job on `NODE` holding `held` GPUs (by default its whole demand; 0: queued), or placed `on` the nodes
    given; `io_mb` is the remote IO it got last round, `hit` its epoch hit ratio (None: not known)."""
    held = gpus if held is None else held
    placement = dict(on) if on is not None else ({NODE: held} if held else {})
    return JobState(
        job_id=job_id,
        submit_time=float(len(job_id)),
        gpus=gpus,
        dataset_uri=dataset,
        dataset_bytes=dataset_mb * MB,
        ideal_bytes_per_sec=rate_mb * MB,
        total_bytes=10.0 * dataset_mb * MB,
        placement=MappingProxyType(placement),
        io_bytes_per_sec=io_mb * MB,
        epoch_hit_ratio=hit,
    )


def snapshot(
    jobs: list[JobState],
    cache_mb: int,
    io_mb: float,
    nodes_mb: Mapping[str, int] | None = None,
    quotas_mb: Mapping[str, int] | None = None,
    cached_mb: Mapping[str, int] | None = None,
) -> Snapshot:
    """`jobs` on `NODE` with `cache_mb` of cache, or on the nodes `nodes_mb` names with their caches; datasets
    with the quotas (and bytes cached) given, none by default."""
    nodes = nodes_mb if nodes_mb is not None else {NODE: cache_mb}
    quotas, cached = quotas_mb or {}, cached_mb or {}
    return Snapshot(
        time=0.0,
        nodes={node_id: NodeState(node_id, 1024, mb * MB) for node_id, mb in nodes.items()},
        remote_io_bytes_per_sec=io_mb * MB,
        datasets={
            j.dataset_uri: DatasetState(
                j.dataset_uri,
                j.dataset_bytes,
                quotas.get(j.dataset_uri, 0) * MB,
                cached[j.dataset_uri] * MB if j.dataset_uri in cached else None,
            )
            for j in jobs
        },
        jobs={j.job_id: j for j in jobs},
    )


def decide(policy: Policy, snap: Snapshot) -> Decision:
    return policy.schedule(snap, VanillaPerf())


def in_mb(allocation: Mapping[str, int] | None) -> dict[str, float]:
    assert allocation is not None
    return {key: value / MB for key, value in allocation.items()}


def test_quiver_stable_is_a_registered_cache_system_running_quiver_profiled_without_io() -> None:
    assert CACHE_SYSTEMS["quiver-stable"] is not None
    assert build_scheduler("fifo", "quiver-stable").name == "fifo/quiver-stable"
    assert [p.name for p in BASELINES] == ["alluxio", "coordl", "quiver", "quiver-stable"]


# Remote IO, every baseline


def test_the_helper_fills_needs_first_and_only_then_up_to_the_caps() -> None:
    needs = {"a": 10.0, "b": 100.0, "c": 100.0}
    caps = {"a": 100.0, "b": 100.0, "c": 100.0}
    assert fill_needs_then_caps(needs, caps, 150) == {"a": 10, "b": 70, "c": 70}  # needs exceed the budget
    assert fill_needs_then_caps({"a": 10.0, "b": 30.0}, {"a": 100.0, "b": 30.0}, 100) == {"a": 70, "b": 30}


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_a_job_whose_cache_serves_most_reads_gets_only_what_it_misses_while_others_want_more(policy: Policy) -> None:
    # a hits 90 % of its 100 MB dataset (every baseline leaves it cached: CoorDL's slice is 100 MB, Quiver
    # caches A whole and B does not fit), so it pulls 10 MB/s; b misses everything. A fair share of 25 MB/s
    # each would leave 15 of a's idle; instead b gets it and all 50 MB/s are used.
    jobs = [job("a", "A", 100, 100, hit=0.9), job("b", "B", 1000, 100, hit=0.0)]
    io = in_mb(decide(policy, snapshot(jobs, 200, 50, quotas_mb={"A": 100})).io_bytes_per_sec)
    assert io == {"a": pytest.approx(10, abs=1e-6), "b": pytest.approx(40, abs=1e-6)}
    assert sum(io.values()) == pytest.approx(50, abs=1e-6)


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_what_is_left_once_every_job_has_what_it_misses_goes_up_to_what_each_can_use(policy: Policy) -> None:
    jobs = [job("a", "A", 100, 100, hit=0.75), job("b", "B", 100, 30, hit=0.0)]
    io = in_mb(decide(policy, snapshot(jobs, 200, 100, quotas_mb={"A": 100, "B": 100})).io_bytes_per_sec)
    assert io == {"a": 70, "b": 30}  # a misses 25 MB/s and gets the 70 b cannot use, up to its f*


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_remote_io_is_shared_equally_when_every_job_wants_more(policy: Policy) -> None:
    jobs = [job("a", "A", 100, 100), job("b", "B", 100, 100), job("c", "A", 100, 100)]
    assert in_mb(decide(policy, snapshot(jobs, 0, 90)).io_bytes_per_sec) == {"a": 30, "b": 30, "c": 30}


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_io_a_job_cannot_use_goes_to_the_others(policy: Policy) -> None:
    jobs = [job("a", "A", 100, 10), job("b", "B", 100, 100), job("c", "C", 100, 100)]
    assert in_mb(decide(policy, snapshot(jobs, 0, 90)).io_bytes_per_sec) == {"a": 10, "b": 40, "c": 40}


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_what_a_job_can_use_is_its_rate_on_the_gpus_it_holds(policy: Policy) -> None:
    jobs = [job("half", "A", 100, 100, gpus=4, held=2), job("whole", "B", 100, 20)]
    assert in_mb(decide(policy, snapshot(jobs, 0, 1000)).io_bytes_per_sec) == {"half": 50, "whole": 20}


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_remote_io_is_max_min_fair_up_to_what_jobs_miss_and_all_used_while_they_miss_more(policy: Policy) -> None:
    # Each job's dataset (100 MB) fits its CoorDL slice and Quiver's cache, so every baseline sees the hit
    # ratios the jobs report and each job misses f* (1 - hit).
    rng = random.Random(5)
    for _ in range(100):
        count = rng.randint(1, 25)
        jobs = [
            job(f"j{i}", f"D{i}", 100, rng.randint(1, 200), hit=rng.choice([None, 0.0, 0.5, 0.75, 1.0]))
            for i in range(count)
        ]
        limit = rng.uniform(0, 2000) * MB
        snap = replace(
            snapshot(jobs, 100 * count, 0, cached_mb={j.dataset_uri: 0 for j in jobs}), remote_io_bytes_per_sec=limit
        )
        io = decide(policy, snap).io_bytes_per_sec
        assert io is not None
        assert sum(io.values()) <= limit
        assert all(io[j.job_id] <= j.ideal_bytes_per_sec for j in jobs)
        misses = {j.job_id: int(j.ideal_bytes_per_sec * (1 - (j.epoch_hit_ratio or 0.0))) for j in jobs}
        if sum(misses.values()) >= limit:
            assert sum(io.values()) == int(limit)
            assert all(io[key] <= miss for key, miss in misses.items())
            short = [io[key] for key, miss in misses.items() if io[key] < miss]
            assert not short or min(short) >= max(io.values()) - 1  # the unmet are at the common level
        else:
            assert all(io[key] >= miss for key, miss in misses.items())


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_queued_jobs_get_no_storage(policy: Policy) -> None:
    decision = decide(policy, snapshot([job("run", "A", 100, 10), job("wait", "B", 100, 10, held=0)], 300, 50))
    assert decision.io_bytes_per_sec is not None and decision.cache_bytes is not None
    assert set(decision.io_bytes_per_sec) == {"run"}
    assert set(decision.job_cache_bytes) <= {"run"}
    assert "B" not in decision.cache_bytes


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_no_running_jobs_gives_an_empty_allocation(policy: Policy) -> None:
    decision = decide(policy, snapshot([job("wait", "A", 100, 10, held=0)], 300, 50))
    assert (decision.cache_bytes, decision.io_bytes_per_sec, decision.job_cache_bytes) == ({}, {}, {})


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_zero_capacity_caches_nothing_but_still_shares_remote_io(policy: Policy) -> None:
    decision = decide(policy, snapshot([job("a", "A", 100, 10), job("b", "A", 100, 10)], 0, 50))
    assert decision.cache_bytes is not None
    assert sum(decision.cache_bytes.values()) + sum(decision.job_cache_bytes.values()) == 0
    assert in_mb(decision.io_bytes_per_sec) == {"a": 10, "b": 10}


@pytest.mark.parametrize("policy", BASELINES, ids=lambda p: p.name)
def test_the_registry_runs_each_cache_system_as_its_baseline_after_fifo_compute(policy: Policy) -> None:
    snap = snapshot([job("run", "A", 100, 10), job("next", "B", 40, 30, held=0)], 120, 25)
    scheduler = build_scheduler("fifo", policy.name)
    decision = scheduler.decide(snap)
    assert decision.placements is not None and set(decision.placements) == {"run", "next"}
    own = decide(policy, snap.with_placements(decision.placements))
    assert isinstance(scheduler.estimator, VanillaPerf)
    assert (decision.cache_bytes, decision.io_bytes_per_sec, decision.job_cache_bytes) == (
        own.cache_bytes,
        own.io_bytes_per_sec,
        own.job_cache_bytes,
    )
    assert set(own.io_bytes_per_sec or {}) == {"run", "next"}


# Alluxio


def test_alluxio_sets_no_quota_because_the_whole_cache_is_one_lru_pool() -> None:
    decision = decide(AlluxioStorage(), snapshot([job("a", "A", 100, 10), job("b", "B", 100, 10)], 150, 20))
    assert decision.cache_bytes == {}
    assert decision.job_cache_bytes == {}
    assert decision.decides_storage and not decision.decides_compute


# CoorDL


def test_coordl_charges_a_shared_dataset_once_per_job() -> None:
    jobs = [job("a1", "A", 200, 10), job("a2", "A", 200, 10), job("b", "B", 500, 10)]
    decision = decide(CoorDLStorage(), snapshot(jobs, 300, 20))
    assert in_mb(decision.job_cache_bytes) == {"a1": 100, "a2": 100, "b": 100}  # A is cached twice
    assert decision.cache_bytes == {}


def test_coordl_caps_a_job_at_its_dataset_and_leaves_its_unused_slice_idle() -> None:
    decision = decide(CoorDLStorage(), snapshot([job("a", "A", 50, 10), job("b", "B", 1000, 10)], 300, 20))
    assert in_mb(decision.job_cache_bytes) == {"a": 50, "b": 150}


def test_coordl_divides_a_nodes_cache_among_the_running_jobs_on_it() -> None:
    jobs = [job("a", "A", 500, 10), job("b", "B", 500, 10), job("q", "C", 500, 10, held=0)]
    assert in_mb(decide(CoorDLStorage(), snapshot(jobs, 100, 20)).job_cache_bytes) == {"a": 50, "b": 50}


def test_coordl_splits_each_nodes_cache_among_the_jobs_placed_on_that_node() -> None:
    # Two jobs on node A (300 MB), one on node B (100 MB); node C (500 MB) runs nothing and caches nothing.
    nodes = {"A": 300, "B": 100, "C": 500}
    jobs = [
        job("x", "X", 1000, 10, on={"A": 1}),
        job("y", "Y", 1000, 10, on={"A": 1}),
        job("z", "Z", 1000, 10, on={"B": 1}),
    ]
    assert in_mb(decide(CoorDLStorage(), snapshot(jobs, 0, 20, nodes_mb=nodes)).job_cache_bytes) == {
        "x": 150,
        "y": 150,
        "z": 100,
    }


def test_coordl_gives_a_job_spanning_two_nodes_its_share_of_each() -> None:
    # w runs on A and B: A is split three ways (x, y, w), B two ways (z, w).
    nodes = {"A": 300, "B": 100}
    jobs = [
        job("x", "X", 1000, 10, on={"A": 1}),
        job("y", "Y", 1000, 10, on={"A": 1}),
        job("z", "Z", 1000, 10, on={"B": 1}),
        job("w", "W", 1000, 10, gpus=2, on={"A": 1, "B": 1}),
    ]
    private = in_mb(decide(CoorDLStorage(), snapshot(jobs, 0, 20, nodes_mb=nodes)).job_cache_bytes)
    assert private == {"x": 100, "y": 100, "z": 50, "w": 100 + 50}


def test_coordl_leaves_what_a_job_cannot_use_idle_on_its_node_rather_than_giving_it_to_other_nodes_jobs() -> None:
    # x's dataset is 40 MB of its 150 MB share of A: the other 110 MB idle; z on B keeps B's 100 MB and no more.
    nodes = {"A": 300, "B": 100}
    jobs = [
        job("x", "X", 40, 10, on={"A": 1}),
        job("y", "Y", 1000, 10, on={"A": 1}),
        job("z", "Z", 1000, 10, on={"B": 1}),
    ]
    private = in_mb(decide(CoorDLStorage(), snapshot(jobs, 0, 20, nodes_mb=nodes)).job_cache_bytes)
    assert private == {"x": 40, "y": 150, "z": 100}


def test_coordl_shares_of_a_node_are_equal_and_never_add_up_to_more_than_its_cache() -> None:
    rng = random.Random(11)
    for _ in range(200):
        count = rng.randint(1, 30)
        jobs = [job(f"j{i}", f"D{k}", 10 + 37 * k, 1) for i, k in enumerate(rng.choices(range(6), k=count))]
        node_mb = rng.randint(0, 2000)
        private = decide(CoorDLStorage(), snapshot(jobs, node_mb, 1)).job_cache_bytes
        assert sum(private.values()) <= node_mb * MB
        assert all(private[j.job_id] == min(node_mb * MB // count, j.dataset_bytes) for j in jobs)


def test_coordl_scales_the_nodes_caches_down_to_a_smaller_capacity() -> None:
    nodes = {"A": 300, "B": 100}
    jobs = [job("x", "X", 1000, 10, on={"A": 1}), job("z", "Z", 1000, 10, on={"B": 1})]
    snap = replace(snapshot(jobs, 0, 20, nodes_mb=nodes), cache_capacity_bytes=200 * MB)
    assert in_mb(decide(CoorDLStorage(), snap).job_cache_bytes) == {"x": 150, "z": 50}


def test_coordl_sizes_io_by_the_hit_ratio_a_job_reports_and_an_unstarted_jobs_copy_as_empty() -> None:
    # Both read A (100 MB) through copies of 100 MB each. a1 hits all of it; a2 has not started reading, so
    # its copy is empty, whatever a1's copy (the dataset's cached bytes) holds: it misses everything.
    jobs = [job("a1", "A", 100, 100, hit=1.0), job("a2", "A", 100, 100)]
    snap = snapshot(jobs, 200, 100, cached_mb={"A": 100})
    assert in_mb(decide(CoorDLStorage(), snap).io_bytes_per_sec) == {"a1": 0, "a2": 100}


# Quiver


def test_quiver_caches_whole_datasets_skipping_one_that_does_not_fit_for_a_smaller_later_one() -> None:
    jobs = [job("a", "A", 60, 60), job("b", "B", 80, 40), job("c", "C", 30, 3)]  # 1, 0.5 and 0.1 per second
    assert in_mb(decide(QuiverStorage(), snapshot(jobs, 100, 20)).cache_bytes) == {"A": 60, "B": 0, "C": 30}


def test_quiver_ranks_a_shared_dataset_by_its_jobs_summed_rates() -> None:
    jobs = [job("a1", "A", 100, 30), job("a2", "A", 100, 30), job("b", "B", 100, 50)]
    assert in_mb(decide(QuiverStorage(), snapshot(jobs, 100, 20)).cache_bytes) == {"A": 100, "B": 0}


def test_quiver_rejects_jobs_that_disagree_on_a_dataset_size() -> None:
    with pytest.raises(ValueError, match=r"size of dataset 'A'.*job 'a2' says 7000000 bytes"):
        decide(QuiverStorage(), snapshot([job("a1", "A", 5, 1), job("a2", "A", 7, 1)], 100, 20))


def test_quiver_benefit_is_the_throughput_caching_gains_a_job_at_the_remote_io_it_gets_now() -> None:
    online, stable = QuiverStorage(), stable_quiver()
    for io_mb, gain in ((0, 100), (30, 70), (100, 0), (250, 0)):
        profiled = job("a", "A", 100, 100, io_mb=io_mb)
        assert online.benefit(profiled) / MB == pytest.approx(gain)
        assert stable.benefit(profiled) / MB == pytest.approx(100)  # as with no remote IO: f*, always
    assert online.benefit(job("half", "A", 100, 100, gpus=4, held=2, io_mb=20)) / MB == pytest.approx(50 - 20)


def test_quiver_evicts_and_recaches_as_io_shares_move_while_quiver_stable_stays_put() -> None:
    # Room for one of A (a: f* 100 MB/s) and B (b: 80 MB/s), both 100 MB: by f*/d, A. A is cached now.
    jobs = [job("a", "A", 100, 100), job("b", "B", 100, 80)]

    def quotas(policy: Policy, io_a: float, io_b: float) -> dict[str, float]:
        profiled = [jobs[0]._replace(io_bytes_per_sec=io_a * MB), jobs[1]._replace(io_bytes_per_sec=io_b * MB)]
        return in_mb(decide(policy, snapshot(profiled, 100, 100, quotas_mb={"A": 100})).cache_bytes)

    # While A fills, a gets 60 MB/s and b 10: a would gain 40, b 70, so Quiver evicts A for B ...
    assert quotas(QuiverStorage(), 60, 10) == {"A": 0, "B": 100}
    # ... and once b has the IO a no longer needs, a would gain 100 and b 30: back to A, rebuilt over an epoch.
    assert quotas(QuiverStorage(), 0, 50) == {"A": 100, "B": 0}
    assert quotas(stable_quiver(), 60, 10) == quotas(stable_quiver(), 0, 50) == {"A": 100, "B": 0}


@pytest.mark.parametrize("held", ["A", "B"])
def test_quiver_keeps_the_dataset_it_holds_against_one_that_only_ties_it(held: str) -> None:
    jobs = [job("a", "A", 100, 100, io_mb=20), job("b", "B", 100, 100, io_mb=20)]
    cache = in_mb(decide(QuiverStorage(), snapshot(jobs, 100, 40, quotas_mb={held: 100})).cache_bytes)
    assert cache == {uri: 100 if uri == held else 0 for uri in "AB"}


def test_quiver_profiles_jobs_that_have_never_run_as_quiver_stable_does() -> None:
    jobs = [job("a", "A", 100, 100), job("b", "B", 50, 30), job("c", "C", 80, 60)]  # no IO yet
    snap = snapshot(jobs, 130, 40)
    assert decide(QuiverStorage(), snap).cache_bytes == decide(stable_quiver(), snap).cache_bytes
    assert in_mb(decide(QuiverStorage(), snap).cache_bytes) == {"A": 100, "B": 0, "C": 0}


def test_quiver_gives_one_job_all_the_cache_in_the_papers_figure_4() -> None:
    # Two V100s, each a ResNet-50 (114 MB/s) on its own 1.36 TB ImageNet-22k; 1.4 TB of cache, 50 MB/s.
    def resnet(job_id: str, io_mb: float, hit: float | None) -> JobState:
        return job(job_id, f"imagenet-22k/{job_id}", 1_360_000, 114, io_mb=io_mb, hit=hit)

    # First round: nothing cached, no IO profiled yet: the two tie and job-0's dataset goes in whole; it is
    # not filled yet, so both miss everything and share the IO equally.
    fresh = [resnet("job-0", 0, None), resnet("job-1", 0, None)]
    cached_now = {"imagenet-22k/job-0": 0, "imagenet-22k/job-1": 0}
    first = decide(QuiverStorage(), snapshot(fresh, 1_400_000, 50, cached_mb=cached_now))
    assert in_mb(first.cache_bytes) == {"imagenet-22k/job-0": 1_360_000, "imagenet-22k/job-1": 0}
    assert in_mb(first.io_bytes_per_sec) == {"job-0": 25, "job-1": 25}
    # Once job-0's cache is filled, job-0 needs no IO and job-1 gets all of it; Quiver keeps the cache where it is.
    steady = [resnet("job-0", 0, 1.0), resnet("job-1", 50, 0.0)]
    quotas = {"imagenet-22k/job-0": 1_360_000}
    later = decide(QuiverStorage(), snapshot(steady, 1_400_000, 50, quotas_mb=quotas))
    cache, io = later.cache_bytes, later.io_bytes_per_sec
    assert cache == first.cache_bytes
    assert cache is not None and io is not None and in_mb(io) == {"job-0": 0, "job-1": 50}
    perf = SiloDPerf()
    rates = {j.job_id: perf.throughput(j, 1, cache[j.dataset_uri], io[j.job_id]) / MB for j in steady}
    assert rates == {"job-0": pytest.approx(114), "job-1": pytest.approx(50)}  # the paper: 114 vs 52 MB/s


def test_quiver_sizes_io_by_the_cache_a_job_can_hit_now_not_by_a_quota_it_holds() -> None:
    # A is cached whole by quota but a's epoch started with half of it: a misses 50 MB/s, b gets the other
    # 70. Sized by the quota, a would need nothing and get only what b leaves, 20.
    jobs = [job("a", "A", 100, 100, hit=0.5), job("b", "B", 1000, 100, hit=0.0)]
    decision = decide(QuiverStorage(), snapshot(jobs, 100, 120, quotas_mb={"A": 100}))
    assert in_mb(decision.cache_bytes) == {"A": 100, "B": 0}
    assert in_mb(decision.io_bytes_per_sec) == {"a": 50, "b": 70}


# In the simulator


def run(trace: list[TraceJob], spec: ClusterSpec, cache_system: str) -> SimResult:
    return simulate(trace, spec, build_scheduler("fifo", cache_system), SimConfig(sample_seconds=10))


def test_simulated_quiver_hands_the_io_a_filled_cache_frees_to_the_other_job_at_the_next_round() -> None:
    # x and y, 10 GB each, f* 100 MB/s, 3 epochs; 10 GB of cache (room for x's dataset, the tie's winner) and
    # 100 MB/s. Both miss everything at first: 50 MB/s each. x's epoch ends at 200 s with its cache filled, so
    # it needs no IO; its 50 MB/s idles until the round at 300 s, which gives y all 100.
    trace = [
        TraceJob("x", 0.0, 1, "model", 100 * MB, "x", 10 * GB, 3.0),
        TraceJob("y", 0.0, 1, "model", 100 * MB, "y", 10 * GB, 3.0),
    ]
    result = run(trace, ClusterSpec(1, 2, 10 * GB, 100 * MB), "quiver")
    remote = {s.time: s.remote_io_bytes_per_sec / MB for s in result.samples if s.running_jobs == 2}
    assert all(rate == pytest.approx(100) for t, rate in remote.items() if t < 200)
    assert all(rate == pytest.approx(50) for t, rate in remote.items() if 200 < t < 300)
    assert all(rate == pytest.approx(100) for t, rate in remote.items() if t > 300)
    assert any(t > 300 for t in remote)
    assert next(j for j in result.jobs if j.job_id == "x").finish == pytest.approx(200 + 2 * 100)


def test_simulated_coordl_caches_on_the_nodes_a_job_runs_on() -> None:
    # Two nodes of 2 GPUs and 10 GB of cache; a and b (1 GPU) land on node-0, c (2 GPUs) on node-1. Each
    # dataset is 10 GB and read twice at f* (IO is plentiful): the second epoch hits 5 GB for a and b, all
    # 10 GB for c. (One pool split three ways would give each 6.7 GB.)
    trace = [
        TraceJob(name, 0.0, gpus, "model", 100 * MB, name, 10 * GB, 2.0)
        for name, gpus in (("a", 1), ("b", 1), ("c", 2))
    ]
    result = run(trace, ClusterSpec(2, 2, 10 * GB, 1000 * MB), "coordl")
    hits = {j.job_id: j.hit_bytes / GB for j in result.jobs}
    assert hits == {"a": pytest.approx(5), "b": pytest.approx(5), "c": pytest.approx(10)}
