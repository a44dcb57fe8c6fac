"""SiloD's greedy storage allocation (the paper's Algorithm 2), in its minimal form.

Cache: datasets in descending cache efficiency (the sum of f*/d over the jobs that read them), each given up
to its size while capacity lasts; under uniform caching a dataset's hit ratio is c/d, so a byte of cache is
worth most where f*/d is highest. Remote IO: each job first gets its steady-state demand f* (1 - c/d), most
cache-efficient first; what is left is shared out so that no job gets more than it can use (f*), which is
what carries jobs through their first, uncached epoch ("delayed effectiveness").

Pure: no I/O, deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobDemand:
    job_id: str
    dataset_uri: str
    ideal_bytes_per_sec: int  # f*: the rate the job consumes data at when IO is not the bottleneck


@dataclass(frozen=True, slots=True)
class Allocation:
    cache_bytes: Mapping[str, int]  # per dataset
    io_bytes_per_sec: Mapping[str, int]  # per job


def cache_efficiency(jobs: Sequence[JobDemand], dataset_sizes: Mapping[str, int]) -> dict[str, float]:
    """Sum of f*/d over each dataset's jobs: the throughput one byte of its cache buys."""
    efficiency = dict.fromkeys(dataset_sizes, 0.0)
    for job in jobs:
        efficiency[job.dataset_uri] += job.ideal_bytes_per_sec / dataset_sizes[job.dataset_uri]
    return efficiency


def greedy(
    jobs: Sequence[JobDemand], dataset_sizes: Mapping[str, int], cache_capacity: int, io_limit: int
) -> Allocation:
    efficiency = cache_efficiency(jobs, dataset_sizes)
    order = sorted(dataset_sizes, key=lambda uri: (-efficiency[uri], uri))
    cache: dict[str, int] = {}
    left = cache_capacity
    for uri in order:
        cache[uri] = min(dataset_sizes[uri], left)
        left -= cache[uri]

    by_efficiency = sorted(jobs, key=lambda j: (-efficiency[j.dataset_uri], j.job_id))
    io: dict[str, int] = {}
    budget = io_limit
    for job in by_efficiency:
        uncached = 1 - cache[job.dataset_uri] / dataset_sizes[job.dataset_uri]
        io[job.job_id] = min(round(job.ideal_bytes_per_sec * uncached), budget)
        budget -= io[job.job_id]
    # Share what is left equally, never beyond what a job can use (water-filling).
    hungry = [j for j in by_efficiency if io[j.job_id] < j.ideal_bytes_per_sec]
    while budget > 0 and hungry:
        share = max(1, budget // len(hungry))
        for job in list(hungry):
            extra = min(share, job.ideal_bytes_per_sec - io[job.job_id], budget)
            io[job.job_id] += extra
            budget -= extra
            if io[job.job_id] >= job.ideal_bytes_per_sec:
                hungry.remove(job)
    return Allocation(cache, io)
