"""The greedy policy: cache goes to the most cache-efficient datasets first, remote IO covers what each job
needs with the cache it can hit now and is then shared without giving any job more than it can use. The same order
places the cache other policies leave idle."""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from datamgr.scheduler.perf import SiloDPerf
from datamgr.scheduler.policies.greedy import GreedyStorage, JobDemand, cache_efficiency, greedy
from datamgr.scheduler.sharing import fill_idle_cache, fill_in_order, water_fill
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot

MB = 10**6
GB = 10**9


def test_the_most_cache_efficient_dataset_is_cached_first_and_whole() -> None:
    jobs = [JobDemand("a", "A", 25 * MB), JobDemand("b", "B", 12 * MB)]
    sizes = {"A": 60 * MB, "B": 80 * MB}
    allocation = greedy(jobs, sizes, cache_capacity=80 * MB, io_limit=20 * MB)
    assert cache_efficiency(jobs, sizes)["A"] > cache_efficiency(jobs, sizes)["B"]
    assert allocation.cache_bytes == {"A": 60 * MB, "B": 20 * MB}


def test_remote_io_covers_steady_demand_first_then_fills_without_exceeding_what_jobs_use() -> None:
    jobs = [JobDemand("a", "A", 25 * MB), JobDemand("b", "B", 12 * MB)]
    allocation = greedy(jobs, {"A": 60 * MB, "B": 80 * MB}, cache_capacity=80 * MB, io_limit=20 * MB)
    b_demand = round(12 * MB * (1 - 20 / 80))
    assert allocation.io_bytes_per_sec["b"] >= b_demand  # 9 MB/s: what its uncached three quarters need
    assert sum(allocation.io_bytes_per_sec.values()) == 20 * MB  # work-conserving
    assert allocation.io_bytes_per_sec["a"] <= 25 * MB


def test_io_beyond_what_jobs_can_use_is_left_unallocated() -> None:
    jobs = [JobDemand("a", "A", 5 * MB), JobDemand("b", "B", 3 * MB)]
    allocation = greedy(jobs, {"A": 10 * MB, "B": 10 * MB}, cache_capacity=0, io_limit=100 * MB)
    assert allocation.io_bytes_per_sec == {"a": 5 * MB, "b": 3 * MB}


def test_shared_datasets_add_up_their_jobs_efficiency() -> None:
    jobs = [JobDemand("a1", "A", 4 * MB), JobDemand("a2", "A", 4 * MB), JobDemand("b", "B", 6 * MB)]
    allocation = greedy(jobs, {"A": 10 * MB, "B": 10 * MB}, cache_capacity=10 * MB, io_limit=10 * MB)
    assert allocation.cache_bytes == {"A": 10 * MB, "B": 0}


def test_strict_priority_fills_each_claimant_before_the_next_gets_any() -> None:
    assert fill_in_order({"x": 5 * MB, "y": 10 * MB, "z": 10 * MB}, 12 * MB) == {"x": 5 * MB, "y": 7 * MB, "z": 0}
    assert fill_in_order({"x": 5 * MB, "y": 10 * MB}, 12 * MB, floor={"w": 10 * MB}) == {"x": 2 * MB, "y": 0}


def test_idle_cache_goes_to_the_most_cache_efficient_datasets_on_top_of_what_is_granted() -> None:
    running = [
        JobState("a", 0.0, 1, "A", 100 * GB, 50 * MB, 500 * GB),
        JobState("b", 0.0, 1, "B", 100 * GB, 10 * MB, 500 * GB),
    ]
    # "Z" holds cache for a job that sits this round out: it is kept and counts against the capacity.
    cache = fill_idle_cache({"A": 20 * GB, "Z": 30 * GB}, running, 150 * GB)
    assert cache == {"A": 100 * GB, "B": 20 * GB, "Z": 30 * GB}


def _running(job_id: str, dataset: str, dataset_bytes: int, rate: float, hit_ratio: float | None = None) -> JobState:
    return JobState(
        job_id=job_id,
        submit_time=0.0,
        gpus=1,
        dataset_uri=dataset,
        dataset_bytes=dataset_bytes,
        ideal_bytes_per_sec=rate,
        total_bytes=10.0 * dataset_bytes,
        placement=MappingProxyType({"n": 1}),
        epoch_hit_ratio=hit_ratio,
    )


def _snapshot(jobs: list[JobState], cached: dict[str, int | None], cache: int, io: float) -> Snapshot:
    return Snapshot(
        time=0.0,
        nodes={"n": NodeState("n", 8, cache)},
        remote_io_bytes_per_sec=io,
        datasets={uri: DatasetState(uri, 100 * MB, cached_bytes=c) for uri, c in cached.items()},
        jobs={j.job_id: j for j in jobs},
    )


def test_a_job_whose_quota_is_not_filled_yet_is_not_starved_of_remote_io() -> None:
    # The paper's delayed effectiveness: A gets all of its dataset as quota, but nothing is cached yet, so
    # for now A needs its full rate from remote storage, like B.
    jobs = [_running("a", "A", 100 * MB, 20 * MB), _running("b", "B", 100 * MB, 10 * MB)]
    cold = GreedyStorage().schedule(_snapshot(jobs, {"A": 0, "B": 0}, 100 * MB, 20 * MB), SiloDPerf())
    assert cold.cache_bytes == {"A": 100 * MB, "B": 0}
    assert cold.io_bytes_per_sec == {"a": 10 * MB, "b": 10 * MB}  # max-min fair, both capped by need
    warm = GreedyStorage().schedule(_snapshot(jobs, {"A": 100 * MB, "B": 0}, 100 * MB, 20 * MB), SiloDPerf())
    assert warm.io_bytes_per_sec is not None and warm.io_bytes_per_sec["b"] == 10 * MB  # A needs nothing now
    unknown = GreedyStorage().schedule(_snapshot(jobs, {"A": None, "B": None}, 100 * MB, 20 * MB), SiloDPerf())
    assert unknown.io_bytes_per_sec == warm.io_bytes_per_sec  # unknown cache: the quota is taken as filled


def test_usable_cache_prefers_the_jobs_epoch_hit_ratio_and_never_exceeds_the_quota() -> None:
    fresh = _running("a", "A", 100 * MB, 20 * MB, hit_ratio=0.1)  # cached while it read them this epoch
    snap = _snapshot([fresh], {"A": 80 * MB}, 100 * MB, 20 * MB)
    assert snap.usable_cache_bytes(fresh, 60 * MB) == 10 * MB
    known = _running("b", "A", 100 * MB, 20 * MB)
    assert snap.usable_cache_bytes(known, 60 * MB) == 60 * MB  # the dataset's 80 MB, capped at the quota
    assert snap.usable_cache_bytes(known, 90 * MB) == 80 * MB


def water_fill_by_the_unit(caps: Mapping[str, float], budget: float, floor: Mapping[str, int]) -> dict[str, int]:
    """Water-filling as first written, pass by pass over a list of the hungry keys: the oracle `water_fill`
    must match share for share (every policy's IO split, and so every simulation, depends on it)."""
    shares = {key: int(floor.get(key, 0)) for key in caps}
    left = int(budget) - sum(shares.values())
    hungry = sorted(key for key in caps if shares[key] < caps[key])
    while left > 0 and hungry:
        share = max(1, left // len(hungry))
        for key in list(hungry):
            extra = min(share, int(caps[key]) - shares[key], left)
            shares[key] += extra
            left -= extra
            if shares[key] >= int(caps[key]):
                hungry.remove(key)
            if left == 0:
                break
    return shares


@pytest.mark.parametrize("seed", range(40))
def test_water_filling_matches_its_pass_by_pass_definition(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"job-{i}" for i in rng.sample(range(100), rng.randint(1, 30))]
    caps = {key: rng.choice([0.0, 0.5, 3.0, rng.uniform(0, 1000), float(rng.randint(0, 1000))]) for key in keys}
    floor = {key: rng.randint(0, 200) for key in keys if rng.random() < 0.3}
    budget = rng.choice([0.0, 1.0, 7.0, rng.uniform(0, 20_000), rng.uniform(0, 300)])
    assert water_fill(caps, budget, floor) == water_fill_by_the_unit(caps, budget, floor)
    assert water_fill(caps, budget) == water_fill_by_the_unit(caps, budget, {})


@pytest.mark.parametrize("seed", range(40))
def test_strict_priority_matches_its_key_by_key_definition(seed: int) -> None:
    def by_the_key(caps: Mapping[str, float], budget: float, floor: Mapping[str, int]) -> dict[str, int]:
        shares = {key: int(floor.get(key, 0)) for key in caps}
        left = int(budget) - sum(floor.values())
        for key, cap in caps.items():
            extra = max(0, min(int(cap) - shares[key], left))
            shares[key] += extra
            left -= extra
        return shares

    rng = random.Random(seed)
    keys = [f"d-{i}" for i in rng.sample(range(100), rng.randint(1, 30))]
    caps = {key: rng.choice([0.0, 0.5, 3.0, rng.uniform(0, 1000), float(rng.randint(0, 1000))]) for key in keys}
    floor = {key: rng.randint(0, 300) for key in [*keys, "elsewhere"] if rng.random() < 0.3}
    budget = rng.choice([0.0, 7.0, rng.uniform(0, 20_000), rng.uniform(0, 3000)])
    assert fill_in_order(caps, budget, floor) == by_the_key(caps, budget, floor)
    assert fill_in_order(caps, budget) == by_the_key(caps, budget, {})
