"""The minimal greedy policy: cache goes to the most cache-efficient datasets first, remote IO covers each
job's steady demand first and is then shared without giving any job more than it can use. The same order
places the cache other policies leave idle."""

from __future__ import annotations

from datamgr.scheduler.policies.greedy import JobDemand, cache_efficiency, greedy
from datamgr.scheduler.sharing import fill_idle_cache, fill_in_order
from datamgr.scheduler.snapshot import JobState

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
