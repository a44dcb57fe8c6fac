"""FitGpp in the simulator: grace periods held by suspending jobs, the TE-first and requeue-at-the-head queue,
claims on suspending resources, CPUs and RAM in traces, clusters and decisions, the TE/BE generator whose
arrivals keep FIFO's load at 2.0, and the paper's Table 1 pattern on a small cluster."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from datamgr.scheduler.perf import SiloDPerf
from datamgr.scheduler.policies.fitgpp import fitgpp, fitgpp_fifo, fitgpp_silod, lrtp
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import UnknownPolicy, build_scheduler
from datamgr.scheduler.sim.cluster import load_cluster
from datamgr.scheduler.sim.decisions import InvalidDecision, check_decision
from datamgr.scheduler.sim.engine import check_inputs, simulate
from datamgr.scheduler.sim.fields import SimInputError
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, SimConfig, TraceJob
from datamgr.scheduler.sim.scenarios import _load, load_scenario
from datamgr.scheduler.sim.te_be import TeBeConfig, generate_te_be
from datamgr.scheduler.sim.trace import load_trace, write_trace
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot
from tests.sim_fixtures import GB, MB

RATE = 10 * MB  # f* of every job here: one 10 GB epoch is 1,000 s


def task(
    job_id: str,
    seconds: float,
    arrival: float = 0.0,
    job_class: str = "be",
    gpus: int = 1,
    cpus: float = 1.0,
    ram_gb: int = 1,
    grace: float = 0.0,
) -> TraceJob:
    """A single-node job that executes for `seconds` at full speed."""
    return TraceJob(
        job_id, arrival, gpus, "m", RATE, f"ds-{job_id}", 10 * GB, seconds * RATE / (10 * GB),
        job_class=job_class, cpus=cpus, ram_bytes=ram_gb * GB, grace_seconds=grace,
    )  # fmt: skip


def node_cluster(nodes: int = 1, gpus: int = 1, cpus: float = 8, ram_gb: int = 64) -> ClusterSpec:
    return ClusterSpec(nodes, gpus, 0, 100 * GB, cpus, ram_gb * GB)


def run(trace: list[TraceJob], policy: str, cluster: ClusterSpec | None = None) -> dict[str, JobOutcome]:
    result = simulate(trace, cluster or node_cluster(), build_scheduler(policy, "silod"), SimConfig(round_seconds=60))
    return {j.job_id: j for j in result.jobs}


# --- the grace period ------------------------------------------------------------------------------------------------


def test_a_victim_holds_its_gpu_through_its_grace_period_and_the_te_job_starts_when_it_ends() -> None:
    jobs = run([task("be", 3000, grace=120), task("te", 300, arrival=600, job_class="te")], "fitgpp")
    assert jobs["te"].start == pytest.approx(720)  # 600 + the victim's 120 s grace period, not 600
    assert jobs["be"].preemptions == 1
    assert jobs["be"].restart_seconds == pytest.approx((420,))  # preempted at 600, back when te ends at 1020
    assert jobs["be"].finish == pytest.approx(1020 + 2400)  # its 600 s before the preemption are kept
    assert jobs["be"].queued_seconds == pytest.approx(420)  # the grace period counts as waiting
    assert jobs["be"].slowdown == pytest.approx(1 + 420 / 3000)


def test_a_victim_without_a_grace_period_frees_its_gpu_in_the_same_round() -> None:
    jobs = run([task("be", 3000), task("te", 300, arrival=600, job_class="te")], "fitgpp")
    assert jobs["te"].start == pytest.approx(600) and jobs["te"].slowdown == pytest.approx(1.0)
    assert jobs["be"].restart_seconds == pytest.approx((300,))


def test_without_preemption_fifo_makes_the_te_job_wait_its_turn() -> None:
    jobs = run([task("be", 3000, grace=120), task("te", 300, arrival=600, job_class="te")], "fitgpp-fifo")
    assert jobs["te"].start == pytest.approx(3000) and jobs["be"].preemptions == 0


def test_a_te_job_waiting_on_a_suspending_victim_claims_its_room_and_preempts_no_more() -> None:
    """Two nodes, two BE jobs; the TE job's victim suspends 300 s, through five one-minute rounds: none of them
    preempts the other BE job, and the third BE job, queued, does not take the claimed GPU either."""
    trace = [
        task("be-a", 5000, grace=300),
        task("be-b", 5000, grace=10),
        task("te", 100, arrival=600, job_class="te"),
        task("be-c", 100, arrival=650),
    ]
    jobs = run(trace, "lrtp", node_cluster(nodes=2))
    assert sum(j.preemptions for j in jobs.values()) == 1
    victim = "be-a" if jobs["be-a"].preemptions else "be-b"
    assert jobs["te"].start == pytest.approx(600 + (300 if victim == "be-a" else 10))
    assert jobs["be-c"].start >= jobs["te"].finish  # the claimed GPU went to te first


def test_without_waiting_for_release_each_round_preempts_again_while_the_victim_suspends() -> None:
    """`wait_for_release = false`, Eq. 2's N read literally as what is unallocated now: LRTP's first victim
    (`be-a`, the tie on remaining time broken by id) suspends 300 s, so a round within the minute finds no room
    for the TE job and preempts `be-b` too, whose 10 s grace period lets it start long before 900 s."""
    trace = [task("be-a", 5000, grace=300), task("be-b", 5000, grace=10), task("te", 100, arrival=600, job_class="te")]
    scheduler = build_scheduler("lrtp", "silod", {"wait_for_release": "false"})
    result = simulate(trace, node_cluster(nodes=2), scheduler, SimConfig(round_seconds=60))
    jobs = {j.job_id: j for j in result.jobs}
    assert jobs["be-a"].preemptions == jobs["be-b"].preemptions == 1
    assert jobs["te"].start < 900


def test_a_suspending_job_cannot_be_placed_and_its_gpus_count_as_taken() -> None:
    held = JobState("s", 0.0, 1, "d", GB, RATE, GB, held=MappingProxyType({"n": 1}), pending_since=5.0)
    waiting = JobState("w", 1.0, 1, "d", GB, RATE, GB, pending_since=1.0)
    snapshot = Snapshot(10.0, {"n": NodeState("n", 1, 0)}, GB, {}, {"s": held, "w": waiting})
    assert snapshot.queued_jobs() == [waiting] and snapshot.free_gpus({}) == {"n": 0}
    with pytest.raises(InvalidDecision, match="placed job 's', which is still suspending"):
        check_decision(Decision(placements={"s": {"n": 1}}), snapshot, "test")
    with pytest.raises(InvalidDecision, match="placed 2 GPUs on node 'n', which has 1"):
        check_decision(Decision(placements={"w": {"n": 1}}), snapshot, "test")


# --- the queue --------------------------------------------------------------------------------------------------------


def snapshot_of(jobs: list[JobState], nodes: int = 1, gpus: int = 1) -> Snapshot:
    node_states = {f"n{i}": NodeState(f"n{i}", gpus, 0, 8, 64 * GB) for i in range(nodes)}
    return Snapshot(100.0, node_states, 100 * GB, {}, {job.job_id: job for job in jobs})


def waiting(job_id: str, submit: float, job_class: str = "be", gpus: int = 1, **fields: object) -> JobState:
    state = JobState(job_id, submit, gpus, "d", GB, RATE, GB, pending_since=submit, job_class=job_class, cpus=1)
    return state._replace(**fields)  # type: ignore[arg-type]


def placed(decision: Decision) -> set[str]:
    return {job_id for job_id, placement in (decision.placements or {}).items() if placement}


def test_a_preempted_be_job_goes_back_to_the_head_of_the_queue() -> None:
    older = waiting("older", 0.0)
    requeued = waiting("requeued", 50.0, preemptions=1)
    assert placed(fitgpp().schedule(snapshot_of([older, requeued]), SiloDPerf())) == {"requeued"}


def test_te_jobs_go_ahead_of_every_be_job_and_fifo_keeps_submission_order() -> None:
    be, te = waiting("be", 0.0), waiting("te", 50.0, job_class="te")
    assert placed(fitgpp().schedule(snapshot_of([be, te]), SiloDPerf())) == {"te"}
    assert placed(fitgpp_fifo().schedule(snapshot_of([be, te]), SiloDPerf())) == {"be"}


def test_be_jobs_start_in_strict_fifo_order_behind_a_head_that_does_not_fit() -> None:
    head, small = waiting("head", 0.0, gpus=2), waiting("small", 10.0)
    assert placed(fitgpp().schedule(snapshot_of([head, small], gpus=1), SiloDPerf())) == set()


def test_the_preemption_limit_bounds_the_baselines_too() -> None:
    running = waiting("once", 0.0, placement=MappingProxyType({"n0": 1}), pending_since=None, preemptions=1)
    te = waiting("te", 50.0, job_class="te")
    assert placed(lrtp().schedule(snapshot_of([running, te]), SiloDPerf())) == {"once"}  # P = 1: no victim
    unlimited = lrtp({"preemption_limit": "inf"}).schedule(snapshot_of([running, te]), SiloDPerf())
    assert placed(unlimited) == {"te"}


def test_fitgpp_knobs_are_checked_by_name() -> None:
    assert fitgpp({"s": 8}).config.s == 8
    with pytest.raises(UnknownPolicy, match="unknown option 's'"):
        build_scheduler("lrtp", "silod", {"s": 8})  # LRTP has no score to weigh
    with pytest.raises(UnknownPolicy, match=r"preemption_limit: 0\.5 must be a whole number, at least 1 \(or inf\)"):
        build_scheduler("fitgpp", "silod", {"preemption_limit": 0.5})
    # Accepted before: a limit of 1.5 preemptions, and a weight that makes every score infinite.
    with pytest.raises(UnknownPolicy, match=r"preemption_limit: 1\.5 must be a whole number"):
        build_scheduler("fitgpp", "silod", {"preemption_limit": "1.5"})
    with pytest.raises(UnknownPolicy, match="option s: inf must be a finite number, at least 0"):
        build_scheduler("fitgpp", "silod", {"s": "1e400"})
    assert fitgpp({"preemption_limit": "2"}).config.preemption_limit == 2


# --- CPUs, RAM and grace periods in the inputs ------------------------------------------------------------------------


def test_a_trace_carries_cpus_ram_and_a_grace_period_and_writes_them_back(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs,class,cpus,ram,grace_period\n"
        "a,0,1,m,10MB/s,d,10GB,1,te,4,16GB,3m\n"
        "b,0,1,m,10MB/s,e,10GB,1,be,,,\n"
    )
    a, b = load_trace(path)
    assert (a.job_class, a.cpus, a.ram_bytes, a.grace_seconds) == ("te", 4.0, 16 * GB, 180.0)
    assert (b.cpus, b.ram_bytes, b.grace_seconds) == (0.0, 0, 0.0)
    for suffix in (".csv", ".jsonl"):
        written = tmp_path / f"back{suffix}"
        write_trace(written, [a, b])
        assert load_trace(written) == [a, b]


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("x,16GB,3m", "cpus: 'x' is not a number"),
        ("4,-1GB,3m", "ram:"),
        ("4,16GB,-3m", "grace_period: duration '-3m' must not be negative"),
    ],
)
def test_bad_cpu_ram_or_grace_cells_are_refused_by_name(tmp_path: Path, cells: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs,cpus,ram,grace_period\n"
                    f"a,0,1,m,10MB/s,d,10GB,1,{cells}\n")  # fmt: skip
    with pytest.raises(SimInputError, match=message):
        load_trace(path)


def test_a_cluster_file_gives_cpus_and_ram_together(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    base = 'nodes = 2\ngpus_per_node = 8\ncache_per_node = "0B"\nremote_io = "1GB/s"\n'
    path.write_text(base + 'cpus_per_node = 32\nram_per_node = "256GB"\n')
    assert (load_cluster(path).cpus_per_node, load_cluster(path).ram_bytes_per_node) == (32, 256 * GB)
    path.write_text(base + "cpus_per_node = 32\n")
    with pytest.raises(SimInputError, match="cpus_per_node is given without ram_per_node"):
        load_cluster(path)


def test_a_job_needing_cpus_runs_only_on_a_cluster_that_has_them_and_within_one_node() -> None:
    with pytest.raises(ValueError, match="asks for CPUs and RAM, but the cluster gives none"):
        check_inputs([task("a", 60)], ClusterSpec(1, 1, 0, GB))
    with pytest.raises(ValueError, match="runs on one node and needs 16 CPUs; a node has 8"):
        check_inputs([task("a", 60, cpus=16)], node_cluster())


def test_a_policy_that_ignores_cpus_cannot_overcommit_them() -> None:
    """FIFO places by GPUs alone: two 6-CPU jobs on one 8-CPU node are refused, naming the policies that can."""
    trace = [task("a", 60, cpus=6), task("b", 60, cpus=6)]
    with pytest.raises(InvalidDecision, match=r"needing 12 CPUs .* which has 8 .*fitgpp"):
        run(trace, "fifo", node_cluster(gpus=2))
    assert run(trace, "fitgpp-fifo", node_cluster(gpus=2))["b"].start == pytest.approx(60)


# --- the generator and the scenario -----------------------------------------------------------------------------------


def present_load(
    jobs: list[JobOutcome], trace: dict[str, TraceJob], cluster: ClusterSpec, arrived: float, after: float
) -> float:
    """The demand of the jobs that arrived before `arrived` and finish after `after`, over the cluster's
    capacity, in its highest resource."""
    present = [trace[j.job_id] for j in jobs if j.arrival < arrived and j.finish > after]
    return max(
        sum(t.cpus for t in present) / (cluster.cpus_per_node * cluster.nodes),
        sum(t.ram_bytes for t in present) / (cluster.ram_bytes_per_node * cluster.nodes),
        sum(t.gpus for t in present) / (cluster.gpus_per_node * cluster.nodes),
    )


def test_generated_arrivals_keep_fifos_load_at_the_target() -> None:
    """Replayed under FIFO, each burst of arrivals comes when the present demand has fallen below twice the
    capacity and brings it back to at least that. Arrivals are rounded to whole seconds, so a job counts as
    present if it finishes more than a second after a burst."""
    cluster = node_cluster(nodes=4, gpus=8, cpus=32, ram_gb=256)
    trace = generate_te_be(TeBeConfig(jobs=400, seed=3), cluster)
    by_id = {t.job_id: t for t in trace}
    jobs = simulate(trace, cluster, build_scheduler("fitgpp-fifo", "silod"), SimConfig(round_seconds=60)).jobs
    bursts = sorted({t.arrival for t in trace})
    assert len(bursts) > 100
    for at in bursts[1:-1]:
        assert (
            present_load(jobs, by_id, cluster, at, at + 1) < 2.0 <= present_load(jobs, by_id, cluster, at + 1, at + 1)
        )


def test_generated_jobs_follow_the_papers_classes_and_truncations() -> None:
    trace = generate_te_be(TeBeConfig(jobs=4000, seed=1), node_cluster(nodes=84, gpus=8, cpus=32, ram_gb=256))
    te = [t for t in trace if t.job_class == "te"]
    be = [t for t in trace if t.job_class == "be"]
    assert 0.27 < len(te) / len(trace) < 0.33
    seconds = {id(t): t.epochs * t.dataset_bytes / t.ideal_bytes_per_sec for t in trace}
    assert min(seconds.values()) >= 180 - 1 and max(seconds[id(t)] for t in te) <= 30 * 60 + 1
    assert max(seconds[id(t)] for t in be) <= 24 * 3600 + 1
    assert min(t.grace_seconds for t in trace) >= 0 and max(t.grace_seconds for t in trace) <= 20 * 60
    assert all(1 <= t.gpus <= 8 and 1 <= t.cpus <= 32 and GB <= t.ram_bytes <= 256 * GB for t in trace)
    mean_te = sum(seconds[id(t)] for t in te) / len(te)
    mean_be = sum(seconds[id(t)] for t in be) / len(be)
    assert mean_be > 3 * mean_te  # 30 against 5 minutes before truncation


def test_the_grace_scale_stretches_the_grace_period_distribution() -> None:
    cluster = node_cluster(nodes=84, gpus=8, cpus=32, ram_gb=256)
    plain = generate_te_be(TeBeConfig(jobs=2000, seed=1), cluster)
    doubled = generate_te_be(TeBeConfig(jobs=2000, seed=1, grace_scale=2.0), cluster)
    assert sum(t.grace_seconds for t in doubled) == pytest.approx(2 * sum(t.grace_seconds for t in plain), rel=0.02)
    assert max(t.grace_seconds for t in doubled) > 20 * 60


def test_fitgpp_synthetic_is_the_papers_cluster_and_workload() -> None:
    scenario = load_scenario("fitgpp-synthetic")
    cluster = scenario.cluster
    assert (cluster.nodes, cluster.gpus_per_node, cluster.cpus_per_node, cluster.ram_bytes_per_node) == (
        84, 8, 32, 256 * GB,
    )  # fmt: skip
    assert scenario.round_seconds == 60 and len(scenario.trace) == 8192
    assert 0.28 < sum(t.job_class == "te" for t in scenario.trace) / len(scenario.trace) < 0.32


def test_figure_6_workloads_change_what_jobs_read_and_nothing_else() -> None:
    cluster = node_cluster(nodes=84, gpus=8, cpus=32, ram_gb=256)
    uniform = generate_te_be(TeBeConfig(jobs=500, seed=2), cluster)
    figure_6 = generate_te_be(TeBeConfig(jobs=500, seed=2, workloads="figure-6"), cluster)

    def shape(t: TraceJob) -> tuple[object, ...]:
        return (t.arrival, t.job_class, t.gpus, t.cpus, t.ram_bytes, t.grace_seconds)

    def seconds(t: TraceJob) -> float:
        return t.epochs * t.dataset_bytes / t.ideal_bytes_per_sec

    assert [shape(t) for t in uniform] == [shape(t) for t in figure_6]
    assert [seconds(t) for t in uniform] == pytest.approx([seconds(t) for t in figure_6], rel=1e-5)
    assert {t.model for t in figure_6} >= {"resnet50", "bert", "vlad"}
    assert len({t.dataset for t in figure_6}) == 500  # private copies
    assert load_scenario("fitgpp-io").cluster.remote_io_bytes_per_sec == 672 * 10 * MB


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ('kind = "te-be"\njobs = 10\nseed = 1\nte_share = 0.3\n', "missing required key 'load'"),
        ('kind = "tebe"\njobs = 10\n', "kind: 'tebe' is not one of philly, te-be"),
        ('kind = "te-be"\njobs = 10\nseed = 1\nte_share = 1.3\nload = 2\n', "te_share: 1.3 must be between 0 and 1"),
    ],
)
def test_a_bad_te_be_recipe_is_refused_naming_the_key(tmp_path: Path, recipe: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'description = "x"\n[cluster]\nnodes = 1\ngpus_per_node = 8\ncache_per_node = "0B"\nremote_io = "1GB/s"\n'
        f'cpus_per_node = 32\nram_per_node = "256GB"\n[generate]\n{recipe}'
    )
    with pytest.raises(SimInputError, match=message):
        _load("s", path)


# --- the paper's pattern ---------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def test_fitgpps_table_1_pattern_on_a_small_cluster() -> None:
    """12 of the paper's nodes and 1,500 jobs: preemption cuts TE p95 slowdown by over 90 % against FIFO, and of
    the preemptive rules FitGpp keeps BE p95 lowest while preempting the fewest jobs."""
    cluster = node_cluster(nodes=12, gpus=8, cpus=32, ram_gb=256)
    trace = generate_te_be(TeBeConfig(jobs=1500, seed=5), cluster)
    outcomes = {}
    for policy in ("fitgpp-fifo", "fitgpp", "lrtp", "rand"):
        result = simulate(trace, cluster, build_scheduler(policy, "silod"), SimConfig(round_seconds=60))
        assert len(result.jobs) == len(trace)
        outcomes[policy] = result.jobs

    def slowdown(policy: str, job_class: str) -> float:
        return percentile([j.slowdown for j in outcomes[policy] if j.job_class == job_class], 0.95)

    def preempted(policy: str) -> int:
        return sum(1 for j in outcomes[policy] if j.preemptions)

    assert slowdown("fitgpp", "te") < 0.1 * slowdown("fitgpp-fifo", "te")
    assert slowdown("fitgpp", "be") < min(slowdown("lrtp", "be"), slowdown("rand", "be"))
    assert preempted("fitgpp") < min(preempted("lrtp"), preempted("rand"))


# --- FitGpp-SiloD -----------------------------------------------------------------------------------------------------


def io_snapshot(*jobs: JobState) -> Snapshot:
    """Two 1-GPU nodes sharing 100 MB/s of remote IO, no cache."""
    nodes = {f"n{i}": NodeState(f"n{i}", 1, 0, 8, 64 * GB) for i in range(2)}
    return Snapshot(100.0, nodes, 100 * MB, {}, {job.job_id: job for job in jobs})


def running_be(job_id: str, node: str, rate: float, grace: float) -> JobState:
    return waiting(
        job_id, 0.0, placement=MappingProxyType({node: 1}), pending_since=None, grace_seconds=grace
    )._replace(ideal_bytes_per_sec=rate)


def test_fitgpp_silod_takes_the_victim_whose_io_lets_the_te_job_run_at_full_speed() -> None:
    """The TE job needs 60 MB/s. Max-min sharing leaves it 10 beside `big` (80) and `small` (30): freeing
    `small` gives it 40, freeing `big` 70. Vanilla FitGpp takes `small` (shorter grace period); SiloD's `big`."""
    big, small = running_be("big", "n0", 80 * MB, grace=60), running_be("small", "n1", 30 * MB, grace=10)
    te = waiting("te", 50.0, job_class="te")._replace(ideal_bytes_per_sec=60 * MB)
    snapshot = io_snapshot(big, small, te)
    assert set(fitgpp().schedule(snapshot, SiloDPerf()).placements or {}) == {"big"}  # small preempted
    silod = fitgpp_silod().schedule(snapshot, SiloDPerf())
    assert set(silod.placements or {}) == {"small"}  # big preempted
    assert silod.decides_storage


def test_fitgpp_silod_falls_back_to_vanillas_victim_when_none_frees_enough_io() -> None:
    big, small = running_be("big", "n0", 80 * MB, grace=60), running_be("small", "n1", 30 * MB, grace=10)
    te = waiting("te", 50.0, job_class="te")._replace(ideal_bytes_per_sec=100 * MB)  # needs all of it
    assert set(fitgpp_silod().schedule(io_snapshot(big, small, te), SiloDPerf()).placements or {}) == {"big"}


def test_fitgpp_silod_holds_the_cache_quota_of_a_suspending_victim() -> None:
    suspending = waiting("s", 0.0, held=MappingProxyType({"n0": 1}), preemptions=1)._replace(dataset_uri="ds-s")
    snapshot = replace(
        io_snapshot(suspending),
        datasets={"ds-s": DatasetState("ds-s", 10 * GB, cache_quota_bytes=4 * GB)},
        cache_capacity_bytes=10 * GB,
    )
    assert (fitgpp_silod().schedule(snapshot, SiloDPerf()).cache_bytes or {}).get("ds-s") == 4 * GB


@pytest.mark.parametrize("grace", [0.0, 60.0])
def test_fitgpp_silod_holds_a_victims_cache_quota_in_the_round_that_preempts_it(grace: float) -> None:
    """The round that picks `victim` must hold its quota already: storage recomputed without it gives the
    quota away, and the next round (`victim` suspending or queued, preempted once) would find none to hold.
    Without a grace period the TE job starts at once, beside it."""
    victim = running_be("victim", "n0", RATE, grace=grace)._replace(dataset_uri="ds-victim")
    te = waiting("te", 50.0, job_class="te")._replace(dataset_uri="ds-te")
    snapshot = replace(
        io_snapshot(victim, te),
        nodes={"n0": NodeState("n0", 1, 10 * GB, 8, 64 * GB)},
        datasets={
            "ds-victim": DatasetState("ds-victim", 10 * GB, cache_quota_bytes=4 * GB),
            "ds-te": DatasetState("ds-te", 10 * GB),
        },
    )
    decision = fitgpp_silod().schedule(snapshot, SiloDPerf())
    assert placed(decision) == ({"te"} if grace == 0 else set())  # `victim` is preempted in this round
    assert (decision.cache_bytes or {}).get("ds-victim") == 4 * GB
    assert sum((decision.cache_bytes or {}).values()) <= 10 * GB
