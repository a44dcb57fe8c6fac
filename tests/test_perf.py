"""The performance estimators at their edges: a fully cached dataset, no cache, no remote IO, more cache than
data, shared datasets, fewer GPUs than a job asks for, and the cache-oblivious estimator."""

from __future__ import annotations

import math

import pytest

from datamgr.scheduler import perf
from datamgr.scheduler.perf import SiloDPerf, VanillaPerf
from datamgr.scheduler.snapshot import JobState

MB = 10**6
GB = 10**9


def resnet50(gpus: int = 8, dataset_bytes: int = 143 * GB) -> JobState:
    return JobState("r50", 0.0, gpus, "imagenet-1k", dataset_bytes, 114 * MB * gpus, 90 * dataset_bytes)


def test_a_fully_cached_dataset_needs_no_remote_io_and_trains_at_its_ideal_rate() -> None:
    job = resnet50()
    assert perf.io_bound_rate(job.dataset_bytes, job.dataset_bytes, 0.0) == math.inf
    assert SiloDPerf().throughput(job, job.gpus, job.dataset_bytes, 0.0) == job.ideal_bytes_per_sec
    assert perf.remote_demand(job.ideal_bytes_per_sec, job.dataset_bytes, job.dataset_bytes) == 0.0


def test_without_cache_the_job_trains_at_its_remote_io() -> None:
    job = resnet50()
    assert SiloDPerf().throughput(job, job.gpus, 0.0, 50 * MB) == 50 * MB
    assert SiloDPerf().throughput(job, job.gpus, 0.0, 10 * job.ideal_bytes_per_sec) == job.ideal_bytes_per_sec


def test_without_remote_io_a_partly_cached_dataset_cannot_be_read() -> None:
    job = resnet50()
    assert SiloDPerf().throughput(job, job.gpus, job.dataset_bytes - 1, 0.0) == 0.0


def test_the_io_bound_rate_grows_as_the_misses_shrink() -> None:
    # Three quarters cached: 25 MB/s of remote IO carries the quarter that misses, 100 MB/s in all.
    assert perf.io_bound_rate(75 * GB, 100 * GB, 25 * MB) == 100 * MB


def test_more_cache_than_data_counts_as_the_whole_dataset() -> None:
    assert perf.hit_ratio(200 * GB, 100 * GB) == 1.0
    assert perf.io_bound_rate(200 * GB, 100 * GB, 0.0) == math.inf
    assert perf.remote_demand(100 * MB, 200 * GB, 100 * GB) == 0.0


def test_negative_cache_and_io_count_as_none() -> None:
    assert perf.hit_ratio(-1.0, 100 * GB) == 0.0
    assert perf.io_bound_rate(0.0, 100 * GB, -5.0) == 0.0


def test_an_empty_dataset_is_always_fully_cached() -> None:
    assert perf.hit_ratio(0, 0) == 1.0
    assert perf.cache_efficiency([100 * MB], 0) == math.inf


def test_jobs_sharing_a_dataset_add_up_their_cache_efficiency() -> None:
    alone = perf.cache_efficiency([114 * MB], 143 * GB)
    shared = perf.cache_efficiency([114 * MB, 114 * MB, 43 * MB], 143 * GB)
    assert shared == (114 + 114 + 43) * MB / (143 * GB)
    assert shared > 2 * alone


def test_the_ideal_rate_scales_with_the_gpus_a_job_gets_up_to_its_demand() -> None:
    job = resnet50(gpus=8)
    assert perf.ideal_rate(job, 2) == job.ideal_bytes_per_sec / 4
    assert perf.ideal_rate(job, 16) == job.ideal_bytes_per_sec
    assert perf.ideal_rate(job, 0) == 0.0
    assert SiloDPerf().throughput(job, 2, job.dataset_bytes, 0.0) == job.ideal_bytes_per_sec / 4


def test_the_vanilla_estimator_ignores_cache_and_remote_io() -> None:
    job = resnet50()
    assert VanillaPerf().throughput(job, job.gpus, 0.0, 0.0) == job.ideal_bytes_per_sec
    assert VanillaPerf().throughput(job, 4, 0.0, 0.0) == job.ideal_bytes_per_sec / 2
    assert not VanillaPerf().storage_aware
    assert SiloDPerf.storage_aware


def test_cache_efficiencies_sum_each_datasets_readers_and_give_unread_datasets_zero() -> None:
    readers = [("A", 100 * MB), ("B", 30 * MB), ("A", 50 * MB)]
    efficiency = perf.cache_efficiencies(readers, {"A": 10 * GB, "B": 3 * GB, "C": 1 * GB})
    assert efficiency == {"A": pytest.approx(0.015), "B": pytest.approx(0.01), "C": 0.0}


EDGES = (-1.0, -0.0, 0.0, 0.25, 1.0, 1.5, math.inf, -math.inf, math.nan)


def reference_hit_ratio(cache_bytes: float, dataset_bytes: float) -> float:
    """`perf.hit_ratio` as written with min and max."""
    return 1.0 if dataset_bytes <= 0 else min(1.0, max(0.0, cache_bytes / dataset_bytes))


def reference_io_bound_rate(cache_bytes: float, dataset_bytes: float, io_bytes_per_sec: float) -> float:
    miss = 1.0 - reference_hit_ratio(cache_bytes, dataset_bytes)
    return math.inf if miss <= 0.0 else max(0.0, io_bytes_per_sec) / miss


def identical(got: float, want: float) -> bool:
    """Equal to the bit where it matters: NaN for NaN, and the sign of a zero."""
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


@pytest.mark.parametrize("value", EDGES)
@pytest.mark.parametrize("other", EDGES)
def test_the_clamping_helpers_give_what_min_and_max_give_edges_and_nan_included(value: float, other: float) -> None:
    assert identical(perf.hit_ratio(value, other), reference_hit_ratio(value, other))
    assert identical(perf.io_bound_rate(value, 1.0, other), reference_io_bound_rate(value, 1.0, other))
    assert identical(perf.silod_perf(other, value, 1.0, 0.5), min(other, reference_io_bound_rate(value, 1.0, 0.5)))
    for gpus in (0, 1, 2, 4, 8):
        want = 0.0 if gpus <= 0 else 456 * MB * min(gpus, 4) / 4
        assert identical(perf.ideal_rate(resnet50(gpus=4), gpus), want)
