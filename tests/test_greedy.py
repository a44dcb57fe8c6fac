"""The minimal greedy policy: cache goes to the most cache-efficient datasets first, remote IO covers each
job's steady demand first and is then shared without giving any job more than it can use."""

from __future__ import annotations

from datamgr.scheduler.policies.greedy import JobDemand, cache_efficiency, greedy

MB = 10**6


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
