"""Performance estimators: how fast a job trains given GPUs, cache and remote IO.

SiloD's estimator (the paper's Eq. 4) is `SiloDPerf = min(f*, b / (1 - c/d))`: under uniform caching a job
hits its dataset's cache with probability c/d whichever items are cached, so remote IO b only has to carry
the uncached fraction of the data the job consumes. The vanilla estimator is what cache-oblivious schedulers
assume: every job runs at its compute-bound rate f*. Both are pure functions of their arguments.

Rates are in bytes/s of training data consumed, sizes in bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol

from datamgr.scheduler.snapshot import JobState


def ideal_rate(job: JobState, gpus: int) -> float:
    """f*(job, gpus): the job's compute-bound data rate on `gpus` GPUs, linear in its share of its demand."""
    if gpus <= 0 or job.gpus <= 0:
        return 0.0
    return job.ideal_bytes_per_sec * min(gpus, job.gpus) / job.gpus


def clamp_ratio(ratio: float) -> float:
    """`ratio` within [0, 1]; NaN (0/0 upstream) as 0."""
    if not ratio > 0.0:
        return 0.0
    return min(1.0, ratio)


def hit_ratio(cache_bytes: float, dataset_bytes: float) -> float:
    """c/d, clamped to [0, 1]: the share of reads a uniformly cached dataset serves locally."""
    if dataset_bytes <= 0:
        return 1.0
    return clamp_ratio(cache_bytes / dataset_bytes)


def io_rate_at_hit_ratio(hit: float, io_bytes_per_sec: float) -> float:
    """b / (1 - hit): the training rate remote IO sustains when a share `hit` of the reads is served from cache;
    unbounded when all of them are."""
    miss = 1.0 - clamp_ratio(hit)
    if miss <= 0.0:
        return math.inf
    return max(0.0, io_bytes_per_sec) / miss


def io_bound_rate(cache_bytes: float, dataset_bytes: float, io_bytes_per_sec: float) -> float:
    """IOPerf (Eq. 3), b / (1 - c/d): the rate remote IO sustains; unbounded once the dataset is cached."""
    return io_rate_at_hit_ratio(hit_ratio(cache_bytes, dataset_bytes), io_bytes_per_sec)


def rate_at_hit_ratio(ideal_bytes_per_sec: float, hit: float, io_bytes_per_sec: float) -> float:
    """SiloDPerf at a known hit ratio, min(f*, b / (1 - hit)): what the simulator runs a job at, with the hit
    ratio its cache model measures rather than the c/d a quota promises."""
    return min(ideal_bytes_per_sec, io_rate_at_hit_ratio(hit, io_bytes_per_sec))


def silod_perf(ideal_bytes_per_sec: float, cache_bytes: float, dataset_bytes: float, io_bytes_per_sec: float) -> float:
    """SiloDPerf (Eq. 4): the slower of compute and data loading, which run as a pipeline."""
    return rate_at_hit_ratio(ideal_bytes_per_sec, hit_ratio(cache_bytes, dataset_bytes), io_bytes_per_sec)


def remote_demand(rate_bytes_per_sec: float, cache_bytes: float, dataset_bytes: float) -> float:
    """b = f (1 - c/d) (Eq. 2): the remote IO a job needs to train at `rate` with `cache_bytes` cached."""
    return rate_bytes_per_sec * (1.0 - hit_ratio(cache_bytes, dataset_bytes))


def cache_efficiency(ideal_rates: Iterable[float], dataset_bytes: float) -> float:
    """Sum of f*/d (Eq. 5) over the jobs sharing a dataset: the remote IO one cached byte saves.

    The cache is charged once per dataset but helps every job reading it, so efficiencies add up.
    """
    if dataset_bytes <= 0:
        return math.inf
    return sum(ideal_rates) / dataset_bytes


def cache_efficiencies(readers: Iterable[tuple[str, float]], dataset_bytes: Mapping[str, int]) -> dict[str, float]:
    """`cache_efficiency` of every dataset in `dataset_bytes`, from (dataset, f*) pairs of its readers; a
    dataset nobody reads has efficiency 0."""
    totals = dict.fromkeys(dataset_bytes, 0.0)
    for uri, rate in readers:
        totals[uri] += rate
    return {uri: cache_efficiency((totals[uri],), size) for uri, size in dataset_bytes.items()}


class Estimator(Protocol):
    """What a policy asks to predict a job's training rate (bytes/s) under a candidate allocation."""

    name: str
    storage_aware: bool  # False: cache and remote IO do not change the estimate (cache-oblivious)

    def throughput(self, job: JobState, gpus: int, cache_bytes: float, io_bytes_per_sec: float) -> float: ...


class SiloDPerf:
    """The storage-aware estimator: min(f*(job, gpus), b / (1 - c/d))."""

    name = "silod"
    storage_aware = True

    def throughput(self, job: JobState, gpus: int, cache_bytes: float, io_bytes_per_sec: float) -> float:
        return silod_perf(ideal_rate(job, gpus), cache_bytes, job.dataset_bytes, io_bytes_per_sec)


class VanillaPerf:
    """The cache-oblivious estimator of the original schedulers: f*(job, gpus), storage ignored."""

    name = "vanilla"
    storage_aware = False

    def throughput(self, job: JobState, gpus: int, cache_bytes: float, io_bytes_per_sec: float) -> float:
        return ideal_rate(job, gpus)
