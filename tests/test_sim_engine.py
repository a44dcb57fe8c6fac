"""The simulator engine: conservation of bytes and remote IO, the cache models (uniform with delayed
effectiveness, private copies, LRU), scheduling order, preemption, determinism and job times.

Most cases are small enough to check by hand: a 10 GB dataset, f* = 100 MB/s, so an epoch takes 100 s at
f* and 200 s at 50 MB/s of remote IO with nothing cached.
"""

from __future__ import annotations

import io
import json
import math
import random

import pytest

from datamgr.scheduler.perf import Estimator, SiloDPerf
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import CACHE_SYSTEMS, FilledIn, Scheduler, build_scheduler, load_policy
from datamgr.scheduler.sim.decisions import InvalidDecision
from datamgr.scheduler.sim.engine import check_inputs, simulate
from datamgr.scheduler.sim.generator import GeneratorConfig, generate
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, Sample, SimConfig, SimResult, TraceJob, Usage
from datamgr.scheduler.sim.report import makespan, summarize
from datamgr.scheduler.snapshot import Snapshot
from tests.sim_fixtures import GB, MB, cluster, job


def run(
    trace: list[TraceJob], spec: ClusterSpec, cache_system: str = "silod", policy: str = "fifo", **config: float
) -> SimResult:
    return simulate(trace, spec, build_scheduler(policy, cache_system), SimConfig(**config))  # type: ignore[arg-type]


def outcome(result: SimResult, job_id: str) -> JobOutcome:
    return next(j for j in result.jobs if j.job_id == job_id)


def hit_ratio(sample: Sample) -> float:
    return 1.0 - sample.remote_io_bytes_per_sec / sample.throughput_bytes_per_sec


def samples_within(result: SimResult, start: float, end: float) -> list[Sample]:
    return [s for s in result.samples if start < s.time < end]


def synthetic_trace(jobs: int, seed: int) -> list[TraceJob]:
    """A busy, IO-starved mix: the generator's Philly-like jobs, shortened so a run stays small."""
    trace = generate(GeneratorConfig(jobs=jobs, arrivals_per_hour=30, sharing=0.6, irregular=0.2, seed=seed))
    rng = random.Random(seed)
    return [
        TraceJob(
            j.job_id, j.arrival, j.gpus, j.model, j.ideal_bytes_per_sec, j.dataset, j.dataset_bytes // 100,
            min(j.epochs * 100, 20.0) * rng.uniform(0.2, 1.0), j.irregular,
        )
        for j in trace
    ]  # fmt: skip


SYNTHETIC_CLUSTER = ClusterSpec(
    nodes=4, gpus_per_node=4, cache_bytes_per_node=10 * GB, remote_io_bytes_per_sec=100 * MB
)


@pytest.mark.parametrize("cache_system", CACHE_SYSTEMS)
def test_conservation_every_byte_read_is_a_hit_or_remote_and_remote_io_never_exceeds_the_limit(
    cache_system: str,
) -> None:
    trace = synthetic_trace(60, seed=7)
    result = run(trace, SYNTHETIC_CLUSTER, cache_system, sample_seconds=600)
    assert len(result.jobs) == len(trace)
    for j in result.jobs:
        total = next(t.total_bytes for t in trace if t.job_id == j.job_id)
        assert j.bytes_read == pytest.approx(total, rel=1e-9)
        assert j.hit_bytes + j.remote_bytes == pytest.approx(j.bytes_read, rel=1e-9)
        assert j.hit_bytes >= 0 and j.remote_bytes >= 0
    limit = SYNTHETIC_CLUSTER.remote_io_bytes_per_sec
    ledger = result.remote_io
    assert ledger.peak() <= limit * (1 + 1e-9)
    rng = random.Random(1)
    for _ in range(200):
        start = rng.uniform(0, ledger.end)
        end = rng.uniform(start, ledger.end)
        assert ledger.bytes_between(start, end) <= limit * (end - start) * (1 + 1e-9) + 1e-3
    remote_total = math.fsum(j.remote_bytes for j in result.jobs)
    assert ledger.bytes_between(0, ledger.end) == pytest.approx(remote_total, rel=1e-6)
    assert ledger.peak() > 0.9 * limit  # the trace really is IO-bound, so the bound was tested


def test_a_lone_job_on_a_fully_cached_dataset_runs_at_its_ideal_rate_and_fetches_nothing() -> None:
    # Epoch 1 fills the cache at 50 MB/s (200 s); from then on the whole dataset is cached.
    result = run([job("a", epochs=3)], cluster(cache=10 * GB, io=50 * MB), sample_seconds=10)
    cached_epochs = samples_within(result, 200, 400)
    assert cached_epochs
    for sample in cached_epochs:
        assert sample.throughput_bytes_per_sec == pytest.approx(100 * MB)
        assert sample.remote_io_bytes_per_sec == 0
    assert outcome(result, "a").finish == pytest.approx(400)


def test_a_job_starting_on_a_dataset_all_cached_after_evictions_and_refills_runs_at_its_ideal_rate() -> None:
    # Generated jobs (`sim generate --jobs 40 --arrivals-per-hour 20 --seed 3`, cut to the ten that matter): the
    # quota of imagenet-1k shrinks and grows as jobs come and go, and its cache, refilled bin by bin, ends a
    # hair short of the dataset in floating point. Counted as a miss, that left job-0025, which the policy gave
    # no remote IO for an all-cached dataset, at b / (1 - hit) = 0 B/s on its two GPUs for 12 hours.
    rows = [
        ("job-0004", 800, 4, 172, "openimages/job-0004", 660, 38.8239),
        ("job-0008", 2248, 8, 80, "youtube-8m", 1460, 0.122353),
        ("job-0009", 2401, 1, 114, "imagenet-1k", 143, 46.7225),
        ("job-0010", 2496, 1, 114, "imagenet-22k", 1360, 3.75218),
        ("job-0011", 2504, 2, 228, "imagenet-22k/job-0011", 1360, 9.62017),
        ("job-0013", 2602, 1, 10, "youtube-8m/job-0013", 1460, 0.0356277),
        ("job-0019", 3068, 1, 114, "imagenet-22k", 1360, 0.124437),
        ("job-0020", 3334, 1, 114, "openimages", 660, 2.11606),
        ("job-0021", 3383, 1, 43, "imagenet-22k", 1360, 0.23984),
        ("job-0025", 3913, 2, 138, "imagenet-1k", 143, 0.772775),
    ]
    trace = [
        job(job_id, arrival, gpus, rate * MB, dataset, size * GB, epochs)
        for job_id, arrival, gpus, rate, dataset, size, epochs in rows
    ]
    result = run(trace, cluster(nodes=2, gpus=4, cache=500 * GB, io=300 * MB))
    late = outcome(result, "job-0025")
    assert late.remote_bytes == 0  # its dataset was all cached when it started
    assert late.finish - late.start == pytest.approx(143 * GB * 0.772775 / (138 * MB))


def test_half_cached_dataset_second_epoch_hits_half_and_first_epoch_hits_nothing() -> None:
    # c = d/2 fills during epoch 1 (misses at 50 MB/s), but delayed effectiveness keeps epoch 1 at 0 hits;
    # epoch 2 hits half its reads, so 50 MB/s of IO carries f* = 100 MB/s.
    result = run([job("a", epochs=2)], cluster(cache=5 * GB, io=50 * MB), sample_seconds=10)
    first, second = samples_within(result, 0, 200), samples_within(result, 200, 300)
    assert first and second
    assert all(hit_ratio(s) == 0 for s in first)
    assert all(hit_ratio(s) == pytest.approx(0.5) for s in second)
    assert outcome(result, "a").hit_bytes == pytest.approx(5 * GB)
    assert outcome(result, "a").finish == pytest.approx(300)
    assert max(s.cached_bytes for s in result.samples) == 5 * GB  # the quota stops admissions


def test_delayed_effectiveness_shows_in_the_effective_cache_while_the_first_epoch_fills_it() -> None:
    result = run([job("a", epochs=2)], cluster(cache=5 * GB, io=50 * MB), sample_seconds=10)
    filled_in_epoch_1 = [s for s in samples_within(result, 100, 200)]
    assert all(s.cached_bytes == 5 * GB and s.effective_cached_bytes == 0 for s in filled_in_epoch_1)
    assert all(s.effective_cached_bytes == 5 * GB for s in samples_within(result, 200, 300))


def test_lru_pool_of_half_the_dataset_thrashes_under_shuffled_epochs_where_uniform_caching_hits_half() -> None:
    trace = [job("a", epochs=10)]
    spec = cluster(cache=5 * GB, io=100 * MB)
    lru, uniform = run(trace, spec, "alluxio"), run(trace, spec, "silod")
    after_first_epoch = 9 * 10 * GB  # epoch 1 misses everything in both
    assert outcome(uniform, "a").hit_bytes / after_first_epoch == pytest.approx(0.5)
    assert outcome(lru, "a").hit_bytes / after_first_epoch < 0.3
    assert outcome(lru, "a").hit_bytes > 0  # LRU does keep something: the chunks read last


def test_lru_pool_holding_the_whole_dataset_hits_everything_after_the_first_epoch() -> None:
    result = run([job("a", epochs=3)], cluster(cache=10 * GB, io=100 * MB), "alluxio")
    assert outcome(result, "a").hit_bytes == pytest.approx(2 * 10 * GB)


def test_coordl_copies_cost_twice_the_cache_for_two_jobs_on_one_dataset_while_silod_shares_one_copy() -> None:
    trace = [job("a", epochs=3), job("b", epochs=3)]
    spec = cluster(gpus=2, cache=40 * GB, io=200 * MB)
    coordl, silod = run(trace, spec, "coordl", sample_seconds=10), run(trace, spec, "silod", sample_seconds=10)
    assert max(s.cached_bytes for s in coordl.samples) == 20 * GB
    assert max(s.cached_bytes for s in silod.samples) == 10 * GB


def test_fifo_starts_jobs_in_submission_order_without_backfilling() -> None:
    # c (1 GPU) would fit beside a (3 of 4 GPUs), but b (4 GPUs) is ahead of it in the queue.
    trace = [job("a", 0, gpus=3, rate=300 * MB), job("b", 1, gpus=4, rate=400 * MB), job("c", 2, gpus=1)]
    result = run(trace, cluster(gpus=4, io=1000 * MB))
    a, b, c = (outcome(result, name) for name in "abc")
    assert a.start == 0
    assert b.start == pytest.approx(a.finish)
    assert c.start == pytest.approx(b.finish)


class NewestOnly:
    """A preemptive policy for the test: only the most recently submitted job runs."""

    name = "newest-only"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        jobs = snapshot.jobs_by_submission()
        if not jobs:
            return Decision(placements={})
        newest = jobs[-1]
        return Decision(placements={newest.job_id: {min(snapshot.nodes): newest.gpus}})


def test_a_preempted_job_keeps_its_progress_and_counts_the_preemption() -> None:
    # a alone would take 100 s; b arrives at 30 s and runs 10 s; a resumes at 40 s with 70 s left.
    scheduler = Scheduler(
        FilledIn(NewestOnly(), load_policy("fifo"), load_policy("greedy"), False), SiloDPerf(), "silod"
    )
    trace = [job("a"), job("b", 30, dataset="other", size=1 * GB)]
    result = simulate(trace, cluster(io=1000 * MB), scheduler)
    a, b = outcome(result, "a"), outcome(result, "b")
    assert (b.start, b.finish) == pytest.approx((30, 40))
    assert a.preemptions == 1 and b.preemptions == 0
    assert a.finish == pytest.approx(110)
    assert a.bytes_read == pytest.approx(10 * GB)


def test_a_fixed_seed_gives_identical_runs_and_the_seed_drives_the_lru_read_order() -> None:
    trace = synthetic_trace(30, seed=3)
    first = run(trace, SYNTHETIC_CLUSTER, "alluxio", seed=5, sample_seconds=600)
    again = run(trace, SYNTHETIC_CLUSTER, "alluxio", seed=5, sample_seconds=600)
    other = run(trace, SYNTHETIC_CLUSTER, "alluxio", seed=6, sample_seconds=600)
    assert first.jobs == again.jobs
    assert first.samples == again.samples
    assert first.remote_io.spans() == again.remote_io.spans()
    assert [j.hit_bytes for j in first.jobs] != [j.hit_bytes for j in other.jobs]


def test_sampling_more_often_does_not_change_the_run() -> None:
    trace = synthetic_trace(30, seed=4)
    coarse = run(trace, SYNTHETIC_CLUSTER, "silod", sample_seconds=3600)
    fine = run(trace, SYNTHETIC_CLUSTER, "silod", sample_seconds=60)
    for c, f in zip(coarse.jobs, fine.jobs, strict=True):
        assert c.job_id == f.job_id
        assert c.finish == pytest.approx(f.finish, rel=1e-9)
        assert c.hit_bytes == pytest.approx(f.hit_bytes, rel=1e-6, abs=1.0)


def test_jct_and_makespan_of_a_tiny_trace() -> None:
    # One GPU: a runs 0-100 s, b (arrived at 10 s, 50 s of work) runs 100-150 s.
    trace = [job("a"), job("b", 10, dataset="other", size=5 * GB)]
    result = run(trace, cluster(io=100 * MB))
    a, b = outcome(result, "a"), outcome(result, "b")
    assert (a.start, a.finish, a.jct) == pytest.approx((0, 100, 100))
    assert (b.start, b.finish, b.jct) == pytest.approx((100, 150, 140))
    assert makespan(result.jobs) == pytest.approx(150)


def test_a_jobs_fairness_is_what_it_read_over_an_equal_shares_reads_over_its_stay_waiting_included() -> None:
    # One GPU, remote IO for two jobs at full speed: a runs 0-100 s while b waits, then b runs 100-200 s.
    # Equal share while both are present (0-100 s): half the GPU, 50 MB/s each; from 100 s b alone: 100 MB/s.
    trace = [job("a"), job("b", dataset="other")]
    result = run(trace, cluster(io=200 * MB))
    a, b = outcome(result, "a"), outcome(result, "b")
    assert a.equal_share_bytes == pytest.approx(50 * MB * 100)
    assert b.equal_share_bytes == pytest.approx(50 * MB * 100 + 100 * MB * 100)
    assert (a.fairness, b.fairness) == pytest.approx((2.0, 2 / 3))  # b's 100 s in the queue count against it


def test_samples_carry_the_running_jobs_demand_with_no_cache_as_the_sum_of_their_ideal_rates() -> None:
    # Two GPUs: a (100 MB/s, 100 s of work) and b (50 MB/s, 200 s of work) run at once on ample remote IO.
    trace = [job("a", rate=100 * MB), job("b", rate=50 * MB, dataset="other")]
    result = run(trace, cluster(gpus=2, io=1000 * MB), sample_seconds=60)
    demand = {s.time: s.demand_bytes_per_sec for s in result.samples}
    assert demand[0] == demand[60] == pytest.approx(150 * MB)  # both running
    assert demand[120] == demand[180] == pytest.approx(50 * MB)  # a finished at 100 s, b runs until 200 s


def test_the_decision_log_has_one_json_line_per_round_with_placements_cache_io_and_notes() -> None:
    # Rounds at 0 (a arrives), 10 (b arrives, waits) and 100 (a finishes, b starts); the run ends with b.
    log = io.StringIO()
    trace = [job("a"), job("b", 10, dataset="other", size=5 * GB)]
    scheduler = build_scheduler("fifo", "silod")
    simulate(trace, cluster(cache=20 * GB), scheduler, SimConfig(round_seconds=1000), decision_log=log)
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [r["time"] for r in records] == pytest.approx([0, 10, 100])
    first, _, last = records
    assert first["placements"] == {"a": {"node-0": 1}}
    assert last["placements"] == {"b": {"node-0": 1}}
    assert first["io_bytes_per_sec"] == {"a": 100 * MB}
    assert first["cache_quota_bytes"] == {"ds": 10 * GB}
    assert last["cached_bytes"].get("ds", 0) == 0  # a finished: its dataset lost its quota, and its cache with it
    assert first["notes"]


def test_a_round_comes_at_every_arrival_and_finish_and_at_most_round_seconds_after_the_last() -> None:
    # As the live controller does: the round timer restarts at every round, so the timed rounds follow the
    # arrival at 250 s (550, 850) and the finish at 1000 s (1300, ...), not a fixed grid (300, 600, 900).
    log = io.StringIO()
    trace = [job("a", epochs=10), job("b", 250, dataset="other", epochs=10)]  # 1,000 s each on the only GPU
    simulate(trace, cluster(), build_scheduler("fifo", "silod"), SimConfig(round_seconds=300), decision_log=log)
    times = [json.loads(line)["time"] for line in log.getvalue().splitlines()]
    assert times[:7] == pytest.approx([0, 250, 550, 850, 1000, 1300, 1600])


def test_a_round_based_policy_decides_on_its_own_grid_and_arrivals_wait_for_it() -> None:
    # Gavel declares 6-minute rounds: b, arriving at 10 s to a free GPU, starts at the next round (360 s),
    # and a's finish at 100 s starts no round of its own.
    log = io.StringIO()
    trace = [job("a"), job("b", 10, dataset="other", epochs=10)]
    scheduler = build_scheduler("gavel", "silod")
    assert scheduler.round_seconds == 360
    result = simulate(trace, cluster(gpus=2), scheduler, SimConfig(round_seconds=300), decision_log=log)
    times = [json.loads(line)["time"] for line in log.getvalue().splitlines()]
    assert times[:4] == pytest.approx([0, 360, 720, 1080])
    assert outcome(result, "b").start == pytest.approx(360)
    assert outcome(result, "a").finish == pytest.approx(100)


def test_gpu_use_is_integrated_exactly_where_gavels_rounds_end_an_idle_gap_on_a_sample_instant() -> None:
    # One GPU: a runs 0-100 s; b arrives at 10 s and starts at Gavel's next round, 360 s, running to 460 s. Busy
    # 200 of 460 s. The minute samples (0, 60, ..., 420) see a busy GPU at 0, 60, 360 and 420 (the round at 360
    # comes before the sample there) and an idle one at 120-300: 4 of 8, so their mean read 0.5.
    trace = [job("a"), job("b", 10, dataset="other")]
    spec = cluster()
    result = simulate(trace, spec, build_scheduler("gavel", "silod"), SimConfig())
    assert [(j.job_id, j.start, j.finish) for j in result.jobs] == [("a", 0, 100), ("b", 360, 460)]
    assert [s.busy_gpus for s in result.samples] == [1, 1, 0, 0, 0, 0, 1, 1]  # the biased picture
    assert result.usage == Usage(
        end=460,
        gpu_seconds=200,
        regular_gpu_seconds=200,
        fragmented_node_seconds=200,
        running_seconds=200,
        io_bound_seconds=0,  # a demand of 100 MB/s is not above the limit of 100 MB/s
    )
    summary = summarize(result, spec)
    assert summary.gpu_utilisation == summary.regular_gpu_utilisation == pytest.approx(200 / 460)
    assert summary.fragmentation == pytest.approx(200 / 460)
    assert summary.io_bound_share == 0


def test_the_io_bound_share_is_the_time_the_demand_exceeded_the_limit_over_the_time_jobs_ran() -> None:
    # Two GPUs on one node, 150 MB/s of remote IO, no cache. x (9 GB) reads alone at 100 MB/s from 0 to 30 s;
    # from 30 s y (6 GB) runs too, their demand of 200 MB/s above the limit, and they share it, 75 MB/s each:
    # both finish at 110 s. IO-bound 80 of 110 s where the samples (0 and 60) said 1 of 2; GPUs busy 30 + 2 x 80
    # of 2 x 110 GPU-seconds.
    trace = [job("x", size=9 * GB), job("y", 30, dataset="other", size=6 * GB)]
    spec = cluster(gpus=2, io=150 * MB)
    result = run(trace, spec)
    assert [j.job_id for j in result.jobs] == ["x", "y"]
    assert [j.finish for j in result.jobs] == pytest.approx([110, 110])
    summary = summarize(result, spec)
    assert summary.io_bound_share == pytest.approx(80 / 110)
    assert summary.gpu_utilisation == pytest.approx(190 / 220)
    assert summary.fragmentation == 1.0  # the one node has a job on it all along


def test_progress_is_reported_at_each_finish_and_at_the_end() -> None:
    calls: list[tuple[float, int, int]] = []
    trace = [job("a"), job("b", 10, dataset="other", size=5 * GB)]
    run_progress = build_scheduler("fifo", "silod")
    simulate(trace, cluster(), run_progress, progress=lambda t, done, total: calls.append((t, done, total)))
    assert calls == [pytest.approx((100, 1, 2)), pytest.approx((150, 2, 2)), pytest.approx((150, 2, 2))]


def test_a_lone_job_training_at_its_ideal_rate_has_fairness_one() -> None:
    result = run([job("a", epochs=2)], cluster(io=100 * MB), sample_seconds=10)
    running = [s for s in result.samples if s.running_jobs]
    assert running
    assert all(s.fairness_min == pytest.approx(1.0) and s.fairness_mean == pytest.approx(1.0) for s in running)


def test_fairness_is_rate_over_silodperf_on_an_equal_share() -> None:
    # Two jobs on two GPUs, 100 MB/s of IO, no cache: an equal share is 1 GPU and 50 MB/s, so SiloDPerf
    # is 50 MB/s for each; Quiver's max-min fair IO gives each 50 MB/s, which they train at.
    trace = [job("a", dataset="x"), job("b", dataset="y")]
    result = run(trace, cluster(gpus=2, io=100 * MB), "quiver", sample_seconds=10)
    both = [s for s in result.samples if s.running_jobs == 2]
    assert both
    assert all(s.fairness_min == pytest.approx(1.0) for s in both)


def test_an_irregular_job_hits_all_or_nothing_by_stage_and_trains_slower_than_a_regular_one() -> None:
    # 4 epochs, c = d/2: the curriculum's first two stages (a quarter of the data each) get cached in their
    # first pass and hit fully after; the last two find the quota full and miss everything.
    spec = cluster(cache=5 * GB, io=50 * MB)
    irregular = run([job("a", epochs=4, irregular=True)], spec, sample_seconds=5)
    regular = run([job("a", epochs=4)], spec, sample_seconds=5)
    stage_hits = sorted({round(hit_ratio(s), 9) for s in irregular.samples if s.running_jobs})
    assert stage_hits == [0.0, 1.0]
    assert outcome(regular, "a").finish == pytest.approx(200 + 3 * 100)
    assert outcome(irregular, "a").finish == pytest.approx(2 * (50 + 3 * 25) + 2 * 200)
    assert outcome(irregular, "a").hit_bytes == pytest.approx(outcome(regular, "a").hit_bytes)


def test_a_time_limit_cuts_the_run_and_lists_what_did_not_finish() -> None:
    trace = [job("a"), job("b", 10, dataset="other", size=5 * GB), job("c", 500)]
    result = run(trace, cluster(io=100 * MB), time_limit=120)
    assert [j.job_id for j in result.jobs] == ["a"]
    assert result.unfinished == ["b", "c"]
    assert result.remote_io.end == 120
    # The GPU was busy all along: a to 100 s, then b, unfinished, to the limit.
    assert result.usage.end == 120 and result.usage.gpu_seconds == pytest.approx(120)


def test_a_decision_beyond_the_remote_io_limit_is_refused_naming_the_scheduler() -> None:
    class IoHog:
        name = "io-hog"

        def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
            io = {j.job_id: int(2 * snapshot.remote_io_bytes_per_sec) for j in snapshot.jobs_by_submission()}
            return Decision(cache_bytes={}, io_bytes_per_sec=io)

    scheduler = Scheduler(FilledIn(IoHog(), load_policy("fifo"), load_policy("greedy"), False), SiloDPerf(), "silod")
    with pytest.raises(InvalidDecision, match=r"io-hog.*remote IO"):
        simulate([job("a")], cluster(), scheduler)


def test_a_job_needing_more_gpus_than_the_cluster_has_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'big'.*8 GPUs"):
        run([job("big", gpus=8)], cluster(gpus=4))


YEAR = 365 * 86_400


@pytest.mark.parametrize(
    ("late", "message"),
    [
        # A Unix timestamp for an arrival: 54 years of empty rounds and samples before the first job (the run took
        # over 5 minutes and 9.5 GB and was still stepping when stopped).
        (job("ts", arrival=1_700_000_000), "'ts': arrival 1700000000 s is 53.9 years after the trace start, past"),
        # A rate without its unit: 114 bytes/s for 13 epochs of 143 GB.
        (job("r50", rate=114, size=143 * GB, epochs=13), "'r50': it would run 517 years even at its ideal rate"),
    ],
)
def test_a_job_past_the_horizon_is_refused_as_a_unit_mistake_naming_it(late: TraceJob, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_inputs([job("a"), late], cluster())
    assert message in str(refused.value)
    assert "past the simulator's horizon of 10 years" in str(refused.value)


def test_a_remote_io_limit_that_would_take_past_the_horizon_to_bring_in_the_datasets_is_refused() -> None:
    """10 GB read once by each of two jobs on one dataset (counted once) and 5 GB of another's half epoch, at 1 B/s:
    476 years, whatever the caches. A remote_io of `1` meant as 1 GB/s."""
    trace = [job("a", epochs=3), job("b", epochs=1), job("c", dataset="other", epochs=0.5)]
    with pytest.raises(ValueError) as refused:
        check_inputs(trace, cluster(io=1))
    assert str(refused.value).startswith(
        "the trace's jobs read at least 14.0 GiB from remote storage, 476 years at the cluster's remote IO limit of "
        "1 B/s, past the simulator's horizon of 10 years"
    )
    check_inputs(trace, cluster(io=50))  # 9.5 years


def test_a_job_just_within_the_horizon_is_accepted() -> None:
    """The bound is on the trace, not a limit of the model: a job arriving and running just within it is taken."""
    check_inputs([job("late", arrival=10 * YEAR, rate=GB, size=GB, epochs=10 * YEAR - 1)], cluster())


class StorageScript:
    """Storage by the clock: `before` until t = 300 s (the second periodic round), `after` from then on, with
    the same remote IO throughout, so the job's placement and IO never change."""

    name = "storage-script"

    def __init__(self, before: Decision, after: Decision) -> None:
        self.before, self.after = before, after

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        return self.before if snapshot.time < 300 else self.after


def scripted(before: Decision, after: Decision) -> Scheduler:
    policy = StorageScript(before, after)
    return Scheduler(FilledIn(policy, load_policy("fifo"), load_policy("greedy"), False), SiloDPerf(), "silod")


def test_a_quota_shrink_slows_a_job_at_once_though_its_placement_and_io_stay() -> None:
    # Epoch 1 (0-200 s) fills the 10 GB quota at 50 MB/s, epoch 2 (200-300 s) hits everything. At 300 s the
    # quota drops to 2.5 GB: epoch 3 hits a quarter, so 50 MB/s of IO carries 66.7 MB/s and it takes 150 s.
    io = {"a": 50 * MB}
    scheduler = scripted(
        Decision(cache_bytes={"ds": 10 * GB}, io_bytes_per_sec=io),
        Decision(cache_bytes={"ds": 10 * GB // 4}, io_bytes_per_sec=io),
    )
    result = simulate([job("a", epochs=3)], cluster(cache=10 * GB, io=50 * MB), scheduler)
    assert outcome(result, "a").finish == pytest.approx(450)
    assert outcome(result, "a").remote_bytes == pytest.approx(10 * GB + 7.5 * GB)


def test_a_private_copy_granted_mid_run_slows_a_job_at_once_though_its_placement_and_io_stay() -> None:
    # As above, but at 300 s the job moves to a private copy of its own, which is empty: epoch 3 hits
    # nothing and reads at its 50 MB/s of IO.
    io = {"a": 50 * MB}
    scheduler = scripted(
        Decision(cache_bytes={"ds": 10 * GB}, io_bytes_per_sec=io),
        Decision(cache_bytes={}, io_bytes_per_sec=io, job_cache_bytes={"a": 10 * GB}),
    )
    result = simulate([job("a", epochs=3)], cluster(cache=10 * GB, io=50 * MB), scheduler)
    assert outcome(result, "a").finish == pytest.approx(500)
    assert outcome(result, "a").remote_bytes == pytest.approx(20 * GB)


def test_each_rounds_snapshot_shows_the_datasets_quota_and_cached_bytes_of_that_moment() -> None:
    seen: dict[float, tuple[int, int | None]] = {}

    class Recording(StorageScript):
        def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
            dataset = snapshot.datasets["ds"]
            seen[snapshot.time] = (dataset.cache_quota_bytes, dataset.cached_bytes)
            return super().schedule(snapshot, estimator)

    io = {"a": 50 * MB}
    policy = Recording(
        Decision(cache_bytes={"ds": 10 * GB}, io_bytes_per_sec=io),
        Decision(cache_bytes={"ds": 12 * GB}, io_bytes_per_sec=io),
    )
    scheduler = Scheduler(FilledIn(policy, load_policy("fifo"), load_policy("greedy"), False), SiloDPerf(), "silod")
    simulate([job("a", epochs=4)], cluster(cache=12 * GB, io=50 * MB), scheduler, SimConfig(round_seconds=100))
    # Epoch 1 fills the cache at 50 MB/s until 200 s (cached bytes change, the quota stays); the quota grows
    # at 300 s over a full cache (the quota changes, the cached bytes stay).
    assert seen[0.0] == (0, 0)
    assert seen[100.0] == (10 * GB, 5 * GB)
    assert seen[200.0] == seen[300.0] == (10 * GB, 10 * GB)
    assert seen[400.0] == (12 * GB, 10 * GB)
