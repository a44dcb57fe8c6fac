"""The cache-system baselines: Alluxio sets no quotas (its cache is one LRU pool), CoorDL gives each job a
private equal slice, Quiver caches the most beneficial datasets whole, and all three share remote IO max-min
fairly without giving a job more than it can use."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

import pytest

from datamgr.scheduler.baselines import AlluxioStorage, CoorDLStorage, QuiverStorage
from datamgr.scheduler.perf import VanillaPerf
from datamgr.scheduler.policy import Decision, Policy
from datamgr.scheduler.registry import build_scheduler
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot

MB = 10**6
NODE = "node-0"
BASELINES: list[Policy] = [AlluxioStorage(), CoorDLStorage(), QuiverStorage()]


def job(job_id: str, dataset: str, dataset_mb: int, rate_mb: float, gpus: int = 1, held: int | None = None) -> JobState:
    """A job on `NODE` holding `held` GPUs (by default its whole demand; 0: queued)."""
    held = gpus if held is None else held
    return JobState(
        job_id=job_id,
        submit_time=float(len(job_id)),
        gpus=gpus,
        dataset_uri=dataset,
        dataset_bytes=dataset_mb * MB,
        ideal_bytes_per_sec=rate_mb * MB,
        total_bytes=10.0 * dataset_mb * MB,
        placement=MappingProxyType({NODE: held} if held else {}),
    )


def snapshot(jobs: list[JobState], cache_mb: int, io_mb: float) -> Snapshot:
    return Snapshot(
        time=0.0,
        nodes={NODE: NodeState(NODE, 1024, cache_mb * MB)},
        remote_io_bytes_per_sec=io_mb * MB,
        datasets={j.dataset_uri: DatasetState(j.dataset_uri, j.dataset_bytes) for j in jobs},
        jobs={j.job_id: j for j in jobs},
    )


def decide(policy: Policy, snap: Snapshot) -> Decision:
    return policy.schedule(snap, VanillaPerf())


def in_mb(allocation: Mapping[str, int] | None) -> dict[str, float]:
    assert allocation is not None
    return {key: value / MB for key, value in allocation.items()}


def test_alluxio_sets_no_quota_because_the_whole_cache_is_one_lru_pool() -> None:
    decision = decide(AlluxioStorage(), snapshot([job("a", "A", 100, 10), job("b", "B", 100, 10)], 150, 20))
    assert decision.cache_bytes == {}
    assert decision.job_cache_bytes == {}
    assert decision.decides_storage and not decision.decides_compute


def test_coordl_charges_a_shared_dataset_once_per_job() -> None:
    jobs = [job("a1", "A", 200, 10), job("a2", "A", 200, 10), job("b", "B", 500, 10)]
    decision = decide(CoorDLStorage(), snapshot(jobs, 300, 20))
    assert in_mb(decision.job_cache_bytes) == {"a1": 100, "a2": 100, "b": 100}  # A is cached twice
    assert decision.cache_bytes == {}


def test_coordl_caps_a_job_at_its_dataset_and_leaves_its_unused_slice_idle() -> None:
    decision = decide(CoorDLStorage(), snapshot([job("a", "A", 50, 10), job("b", "B", 1000, 10)], 300, 20))
    assert in_mb(decision.job_cache_bytes) == {"a": 50, "b": 150}


def test_coordl_divides_the_capacity_among_the_running_jobs() -> None:
    jobs = [job("a", "A", 500, 10), job("b", "B", 500, 10), job("q", "C", 500, 10, held=0)]
    assert in_mb(decide(CoorDLStorage(), snapshot(jobs, 100, 20)).job_cache_bytes) == {"a": 50, "b": 50}


def test_coordl_shares_are_equal_and_never_add_up_to_more_than_the_capacity() -> None:
    rng = random.Random(11)
    for _ in range(200):
        count = rng.randint(1, 30)
        jobs = [job(f"j{i}", f"D{k}", 10 + 37 * k, 1) for i, k in enumerate(rng.choices(range(6), k=count))]
        capacity = rng.randint(0, 2000 * MB)
        snap = replace(snapshot(jobs, 0, 1), cache_capacity_bytes=capacity)
        private = decide(CoorDLStorage(), snap).job_cache_bytes
        assert sum(private.values()) <= capacity
        assert all(private[j.job_id] == min(capacity // count, j.dataset_bytes) for j in jobs)


def test_quiver_caches_whole_datasets_skipping_one_that_does_not_fit_for_a_smaller_later_one() -> None:
    jobs = [job("a", "A", 60, 60), job("b", "B", 80, 40), job("c", "C", 30, 3)]  # 1, 0.5 and 0.1 per second
    assert in_mb(decide(QuiverStorage(), snapshot(jobs, 100, 20)).cache_bytes) == {"A": 60, "B": 0, "C": 30}


def test_quiver_ranks_a_shared_dataset_by_its_jobs_summed_rates() -> None:
    jobs = [job("a1", "A", 100, 30), job("a2", "A", 100, 30), job("b", "B", 100, 50)]
    assert in_mb(decide(QuiverStorage(), snapshot(jobs, 100, 20)).cache_bytes) == {"A": 100, "B": 0}


def test_quiver_rejects_jobs_that_disagree_on_a_dataset_size() -> None:
    with pytest.raises(ValueError, match=r"size of dataset 'A'.*job 'a2' says 7000000 bytes"):
        decide(QuiverStorage(), snapshot([job("a1", "A", 5, 1), job("a2", "A", 7, 1)], 100, 20))


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
def test_remote_io_never_exceeds_the_limit_and_is_all_used_when_demand_exceeds_it(policy: Policy) -> None:
    rng = random.Random(5)
    for _ in range(100):
        jobs = [job(f"j{i}", f"D{i % 4}", 100, rng.randint(1, 200)) for i in range(rng.randint(1, 25))]
        limit = rng.uniform(0, 2000) * MB
        io = decide(policy, replace(snapshot(jobs, 0, 0), remote_io_bytes_per_sec=limit)).io_bytes_per_sec
        assert io is not None
        assert sum(io.values()) <= limit
        assert all(io[j.job_id] <= j.ideal_bytes_per_sec for j in jobs)
        if sum(j.ideal_bytes_per_sec for j in jobs) >= limit:
            assert sum(io.values()) == int(limit)


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
