"""The simulator's pieces on their own: the equal-share rates it remembers, a uniform-cache space's fetch
rates and fill, and the state a running job shows policies."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest

from datamgr.scheduler.sim.jobs import JobRun, Segment
from datamgr.scheduler.sim.measures import EqualShare, EqualShareRates
from datamgr.scheduler.sim.model import ClusterSpec
from datamgr.scheduler.sim.uniform import _PlacedReader, _Space
from datamgr.scheduler.snapshot import JobState
from tests.sim_fixtures import GB, MB, job


def test_the_remembered_equal_share_rates_follow_the_number_of_jobs_present() -> None:
    spec = ClusterSpec(nodes=4, gpus_per_node=4, cache_bytes_per_node=100 * GB, remote_io_bytes_per_sec=1000 * MB)
    rates = EqualShareRates(spec)
    shapes = [(100 * MB, 1, 10 * GB), (100 * MB, 4, 10 * GB), (400 * MB, 4, 500 * GB), (2 * MB, 8, 20_000 * GB)]
    for jobs in (1, 5, 5, 2, 30, 1):
        for shape in shapes:
            assert rates.rate(jobs, *shape) == EqualShare.of(spec, jobs).rate(*shape)


def test_a_space_recounts_its_fetch_rates_after_any_change_and_only_then() -> None:
    space = _Space("ds", 10 * GB, 0.0)
    reader = _PlacedReader(JobRun(job("a")), space)
    space.readers["a"] = reader
    for fetch in (0.1, 0.7, 0.3):  # incremental updates leave float drift behind
        space.add_fetch(reader.region, -reader.fetch)
        reader.fetch = fetch
        space.add_fetch(reader.region, fetch)
    space.recount_fetches()
    assert space.whole_fetch == space.total_fetch == 0.3
    space.whole_fetch = 99.0  # not a change recount_fetches can know of: a recounted space is left alone
    space.recount_fetches()
    assert space.whole_fetch == 99.0
    space.add_fetch(reader.region, 0.0)
    space.recount_fetches()
    assert space.whole_fetch == 0.3


def test_a_jobs_state_carries_each_field_where_the_snapshot_expects_it() -> None:
    run_ = JobRun(job("a", arrival=5.0, gpus=2, epochs=3.0, irregular=True, model="VGG16"))
    queued = run_.state()
    assert queued == JobState(
        job_id="a",
        submit_time=5.0,
        gpus=2,
        dataset_uri="ds",
        dataset_bytes=10 * GB,
        ideal_bytes_per_sec=100 * MB,
        total_bytes=30 * GB,
        irregular=True,
        pending_since=5.0,
        skew=0.743,  # vgg16's, from the model table
    )
    assert run_.state() is queued  # unchanged while it waits
    run_.place({"n": 2}, 40 * MB, 7.0)
    run_.segment = Segment(0.25, 10 * GB)
    run_.rate, run_.remote_rate = 50 * MB, 37.5 * MB
    run_.advance(17.0)
    running = run_.state()
    assert running == queued._replace(
        done_bytes=500 * MB,
        attained_gpu_seconds=20.0,
        placement=MappingProxyType({"n": 2}),
        io_bytes_per_sec=40 * MB,
        epoch_hit_ratio=0.25,
        first_start_time=7.0,
        last_start_time=7.0,
        pending_since=None,
        queued_seconds_before=2.0,
    )
    run_.place({}, 0.0, 20.0)
    run_.rate, run_.remote_rate = 0.0, 0.0  # as the engine's rate update leaves a stopped job
    run_.hand_state({"queue": 1.0})
    run_.place({"n": 2}, 40 * MB, 26.0)
    assert run_.state() == running._replace(
        done_bytes=running.done_bytes + 3 * 50 * MB,
        attained_gpu_seconds=26.0,
        last_start_time=26.0,
        queued_seconds_before=8.0,
        preemptions=1,
        policy_state=MappingProxyType({"queue": 1.0}),
    )


@pytest.mark.parametrize(
    ("quota_room", "expected"), [(1000.0, [20.0, 60.0, 100.0, 36.0]), (23.0, [10.0, 55.0, 100.0, 28.0])]
)
def test_a_filling_space_spreads_a_whole_dataset_fetch_over_its_bins_by_their_room_up_to_the_quota(
    quota_room: float, expected: list[float]
) -> None:
    space = _Space("ds", 400, 0.0)  # 4 bins of 100 bytes
    space.cached, space.held, space.quota = [0.0, 50.0, 100.0, 20.0], 170.0, 170.0 + quota_room
    space.whole_fetch = space.total_fetch = 23.0  # bytes/s: 10, 5, 0 and 8 a second by room left (100:50:0:80)
    space.settle(2.0)  # 46 bytes in 2 s, all of them, or half when only 23 fit under the quota
    assert space.cached == pytest.approx(expected)
    assert space.held == pytest.approx(sum(expected))


@pytest.mark.parametrize("seed", range(30))
def test_a_filling_space_never_overfills_a_bin_or_its_quota_and_never_loses_bytes(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([4, 10 * GB, 1300 * GB])
    bin_bytes = size / 4
    cached = [rng.choice([0.0, bin_bytes, rng.uniform(0, bin_bytes)]) for _ in range(4)]
    quota = rng.choice([sum(cached), sum(cached) + rng.uniform(0, 4 * bin_bytes), 4 * bin_bytes])
    whole_fetch = rng.choice([0.0, rng.uniform(0, 500 * MB)])
    bin_fetch = [rng.choice([0.0, 0.0, rng.uniform(0, 100 * MB)]) for _ in range(4)]
    for now in (0.0, rng.uniform(0, 10), rng.uniform(0, 1e5)):
        space = _Space("ds", size, 0.0)  # each time settled from the same state
        space.cached, space.held, space.quota = list(cached), sum(cached), quota
        space.whole_fetch, space.bin_fetch = whole_fetch, list(bin_fetch)
        space.total_fetch = whole_fetch + sum(bin_fetch)
        space.settle(now)
        slack = 1e-9 * size
        assert all(
            before - slack <= after <= bin_bytes + slack for before, after in zip(cached, space.cached, strict=True)
        )
        assert space.held == pytest.approx(sum(space.cached))
        assert space.held <= max(quota, sum(cached)) + slack
        if now == 0.0 or space.total_fetch == 0.0:
            assert space.cached == cached
