"""The simulator's machinery for preemptive policies, end to end: the resume cost, wake-ups that time a demotion
exactly, policy state carried between rounds, the gang rule, the scenario and command-line knobs, and
Tiresias's Figure 7 reproduced."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from datamgr.scheduler.perf import Estimator, SiloDPerf
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import FilledIn, Scheduler, build_scheduler, load_policy
from datamgr.scheduler.sim.decisions import InvalidDecision, check_decision
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.fields import SimInputError
from datamgr.scheduler.sim.model import JobOutcome, SimConfig, TraceJob
from datamgr.scheduler.sim.scenarios import _load, load_scenario
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot
from silodcli.main import main
from tests.sim_fixtures import GB, MB, cluster, job

HOUR = 3600.0
RATE = 100 * MB


def hours_of_work(job_id: str, hours: float, arrival: float = 0.0, gpus: int = 1) -> TraceJob:
    """A job that trains `hours` at full speed (f* = RATE on its GPUs, one epoch of 10 GB is 100 s)."""
    return job(
        job_id, arrival=arrival, gpus=gpus, rate=RATE, dataset=f"ds-{job_id}", epochs=hours * HOUR * RATE / (10 * GB)
    )


def by_id(jobs: list[JobOutcome]) -> dict[str, JobOutcome]:
    return {j.job_id: j for j in jobs}


def test_a_resumed_job_restores_for_the_preemption_cost_holding_its_gpus() -> None:
    """SRTF on one GPU: `short` preempts `long` at 1 h and ends at 1.5 h; `long` resumes, restores 60 s, then
    needs its last hour. Rounds every 30 s come while it restores, reading nothing, and are not a stall."""
    trace = [hours_of_work("long", 2.0), hours_of_work("short", 0.5, arrival=HOUR)]
    config = SimConfig(round_seconds=30, preemption_seconds=60)
    result = simulate(trace, cluster(io=1000 * MB), build_scheduler("srtf", "silod"), config)
    jobs = by_id(result.jobs)
    assert jobs["short"].finish == pytest.approx(1.5 * HOUR)
    assert jobs["long"].finish == pytest.approx(2.5 * HOUR + 60)
    assert jobs["long"].preemptions == 1 and jobs["long"].overhead_seconds == pytest.approx(60)
    assert jobs["long"].queued_seconds == pytest.approx(0.5 * HOUR)
    free = simulate(trace, cluster(io=1000 * MB), build_scheduler("srtf", "silod"), SimConfig(round_seconds=30))
    assert by_id(free.jobs)["long"].finish == pytest.approx(2.5 * HOUR)  # no cost by default


@pytest.mark.parametrize("policy", ["srtf", "sjf", "gavel", "tiresias-las"])
def test_a_decision_that_starts_a_job_on_the_gpus_a_job_it_preempts_holds_through_its_grace_period_is_refused(
    policy: str,
) -> None:
    """SRTF on one GPU: `short` preempts `long`, whose grace period keeps the GPU for 10 minutes. The policy placed
    `short` on it in the same round, and the run went on with two jobs on one GPU (`long` finished 10 minutes
    early, `short` never waited)."""
    trace = [replace(hours_of_work("long", 2.0), grace_seconds=600.0), hours_of_work("short", 0.5, arrival=HOUR)]
    scheduler = build_scheduler(policy, "silod", {"queues": "60s"} if policy == "tiresias-las" else None)
    with pytest.raises(InvalidDecision) as refused:
        simulate(trace, cluster(io=1000 * MB), scheduler, SimConfig(round_seconds=30))
    assert (
        "placed 2 GPUs on node 'node-0', which has 1, counting those that 'long', preempted by this decision, hold"
        in (str(refused.value))
    )
    assert "fitgpp, lrtp, rand and fitgpp-fifo wait for them" in str(refused.value)


def test_fitgpp_starts_the_job_it_preempts_for_once_the_grace_period_is_over() -> None:
    trace = [
        replace(hours_of_work("long", 2.0), grace_seconds=600.0, job_class="be"),
        replace(hours_of_work("short", 0.5, arrival=HOUR), job_class="te"),
    ]
    jobs = by_id(simulate(trace, cluster(io=1000 * MB), build_scheduler("fitgpp", "silod"), SimConfig()).jobs)
    assert jobs["short"].start == pytest.approx(HOUR + 600)
    assert jobs["long"].finish == pytest.approx(2.5 * HOUR + 600)  # short ran its half hour after the grace period


def test_a_demotion_takes_effect_at_the_moment_of_crossing_not_at_the_next_round() -> None:
    """Tiresias-L on one GPU: `second` (queue 1) waits behind `first`, also in queue 1, until `first` has run
    1 GPU-hour; the wake-up `first` asked for preempts it at exactly 3600 s, not at the timed round of 3610 s."""
    trace = [hours_of_work("first", 5.0), hours_of_work("second", 1.0, arrival=10)]
    result = simulate(
        trace, cluster(io=1000 * MB), build_scheduler("tiresias-las", "silod"), SimConfig(round_seconds=300)
    )
    jobs = by_id(result.jobs)
    assert jobs["second"].start == pytest.approx(HOUR)
    assert jobs["second"].finish == pytest.approx(2 * HOUR)
    assert jobs["first"].preemptions == 1 and jobs["first"].finish == pytest.approx(6 * HOUR)


class WakingFifo:
    """FIFO that asks to be woken 100 s after every round, and counts its rounds."""

    name = "waking-fifo"

    def __init__(self) -> None:
        self.rounds: list[float] = []

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        self.rounds.append(snapshot.time)
        fifo = load_policy("fifo").schedule(snapshot, estimator)
        return replace(fifo, wake_at=snapshot.time + 100)


def test_each_decisions_wake_up_replaces_the_one_before() -> None:
    """Five arrivals, five finishes, and a wake-up every 100 s for 1,040 s: about 20 rounds. Were every wake-up
    asked for kept, each arrival and finish would start a chain of its own, and the rounds would multiply."""
    trace = [hours_of_work(f"j{i}", 1000 / HOUR, arrival=10.0 * i) for i in range(5)]
    policy = WakingFifo()
    scheduler = Scheduler(FilledIn(policy, policy, load_policy("greedy"), False), SiloDPerf(), "silod")
    simulate(trace, cluster(nodes=5, io=1000 * MB), scheduler, SimConfig(round_seconds=10_000))
    assert len(policy.rounds) <= 22
    assert [t for t in policy.rounds if t > 1040] == []  # none left over once every job is done


def test_a_decision_that_splits_a_gang_is_refused() -> None:
    waiting = JobState("j", 0.0, 4, "ds", GB, RATE, 10 * GB)
    snap = Snapshot(0.0, {"n0": NodeState("n0", 4, 0)}, GB, {"ds": DatasetState("ds", GB)}, {"j": waiting})
    with pytest.raises(InvalidDecision, match="gave job 'j' 2 GPUs; a job runs on all the 4 it asks for or on none"):
        check_decision(Decision(placements={"j": MappingProxyType({"n0": 2})}), snap, "test")


# --- Figure 7 ------------------------------------------------------------------------------------------------------


def figure_7(policy: str) -> dict[str, float]:
    scenario = load_scenario("tiresias-fig7")
    scheduler = build_scheduler(policy, "silod", scenario.policy_options if policy.startswith("tiresias") else None)
    config = SimConfig(round_seconds=scenario.round_seconds or 0.0)
    return {j.job_id: j.jct / HOUR for j in simulate(scenario.trace, scenario.cluster, scheduler, config).jobs}


def test_figure_7_2d_las_gives_the_papers_average_jct_of_11_7() -> None:
    assert figure_7("tiresias-las") == pytest.approx({"j1": 5, "j2": 14, "j3": 16})  # average 11.67


def test_figure_7_srsf_gives_the_papers_average_jct_of_9_3() -> None:
    assert figure_7("srsf") == pytest.approx({"j1": 2, "j2": 10, "j3": 16})  # average 9.33


def test_figure_7_2d_gittins_by_the_papers_own_formula_runs_srsfs_schedule() -> None:
    """Not the paper's 10: with services 4, 8, 12 equally likely, a job's index only rises while it runs below 4
    GPU-units (1/8 at 0, 1/6 at 2) and stays above a fresh job's 1/8 after (1/6 at 4), so J1, then J2 run to
    completion, exactly SRSF's order here."""
    assert figure_7("tiresias-gittins") == pytest.approx({"j1": 2, "j2": 10, "j3": 16})


# --- knobs from a scenario and the command line ----------------------------------------------------------------------


def test_a_scenario_carries_simulation_settings_and_policy_knobs(tmp_path: Path) -> None:
    scenario = load_scenario("tiresias-fig7")
    assert (scenario.round_seconds, scenario.preemption_seconds) == (HOUR, None)
    assert scenario.policy_options == {"queues": "continuous", "history": "4h,8h,12h"}
    (tmp_path / "t.csv").write_text(
        "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs\nj,0,1,m,1MB/s,d,1GB,1\n"
    )
    path = tmp_path / "bad.toml"
    path.write_text('description = "x"\ntrace = "t.csv"\n[cluster]\nnodes = 1\n[simulation]\npreemption = "60s"\n')
    with pytest.raises(SimInputError, match=r"\[simulation\]: unknown key 'preemption'"):
        _load("bad", path)


def test_the_command_line_runs_figure_7_and_refuses_knobs_no_policy_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--scenario", "tiresias-fig7", "--policy", "tiresias-las", "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "average JCT   11.7h" in printed and "preemptions   " in printed
    argv = ["sim", "--scenario", "tiresias-fig7", "--policy", "fifo", "--policy-option", "queues=2h"]
    assert main([*argv, "--out", str(tmp_path / "b")]) == 2
    assert "--policy-option: none of fifo takes 'queues'" in capsys.readouterr().err
    argv = ["sim", "--scenario", "tiresias-fig7", "--policy", "tiresias-las", "--policy-option", "queues=soon"]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 2
    assert "policy 'tiresias-las': option queues: duration 'soon'" in capsys.readouterr().err


def test_each_policy_gets_only_the_knobs_it_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tiresias-fig7's Tiresias knobs do not reach FitGpp, a comparison's `s` reaches FitGpp alone, and a knob
    no policy of the run takes is refused, naming what they take."""
    argv = ["sim", "--scenario", "tiresias-fig7", "--policy", "fitgpp", "--out", str(tmp_path / "a")]
    assert main(argv) == 0
    assert "fitgpp/silod: 3 of 3 jobs finished" in capsys.readouterr().out
    compare = ["sim", "compare", "--scenario", "tiresias-fig7", "--policies", "tiresias-las,fitgpp"]
    assert main([*compare, "--cache-systems", "silod", "--policy-option", "s=8", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main([*compare, "--cache-systems", "silod", "--policy-option", "z=1", "--out", str(tmp_path / "c")]) == 2
    error = capsys.readouterr().err
    assert (
        "none of tiresias-las, fitgpp takes 'z'" in error
        and "they take: history, hold_cache, pack_limit, preemption_limit" in error
    )


def test_the_preemption_cost_option_reaches_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "--scenario", "tiresias-fig7", "--policy", "tiresias-las", "--preemption-cost", "6m"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    rows = (tmp_path / "jobs.csv").read_text().splitlines()
    header = rows[0].split(",")
    overhead = sum(float(row.split(",")[header.index("overhead_seconds")]) for row in rows[1:])
    preemptions = sum(int(row.split(",")[header.index("preemptions")]) for row in rows[1:])
    assert preemptions > 0 and overhead == pytest.approx(360 * preemptions)
