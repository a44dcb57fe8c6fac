"""The co-location simulator with Harmony, Isolated and naive co-location, on hand-computable clusters."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

import pytest

from datamgr.scheduler.colocation import JobProfile, group_iteration_seconds
from datamgr.scheduler.colocation_storage import ObliviousStorage
from datamgr.scheduler.colocation_view import GroupView, JobStatus, JobView, PlannedGroup, View
from datamgr.scheduler.policies.harmony import HarmonyPolicy
from datamgr.scheduler.policies.isolated import IsolatedPolicy
from datamgr.scheduler.policies.naive import NaivePolicy, contended_iterations
from datamgr.scheduler.sim.colocation_engine import InvalidPlan, simulate_colocation
from datamgr.scheduler.sim.colocation_model import ColocationCluster, ColocationJob, ColocationResult
from datamgr.scheduler.sim.harmony_workload import HarmonyWorkloadConfig, generate_harmony_workload
from datamgr.scheduler.sim.model import SimulationStalled

BANDWIDTH = 1e6  # bytes/s per machine: costs in whole seconds below


def pjob(
    name: str, cpu: float, net: float, iterations: float, arrival: float = 0.0, model: int = 0, data: int = 0
) -> ColocationJob:
    return ColocationJob(name, arrival, "app", "data", cpu, net, iterations, model, data)


def cluster(machines: int, profile_iterations: int = 1) -> ColocationCluster:
    return ColocationCluster(machines, BANDWIDTH, profile_iterations)


def finishes(result: ColocationResult) -> dict[str, float]:
    return {job.job_id: job.finish for job in result.jobs}


# --- Isolated ---------------------------------------------------------------------------------------------------


def test_isolated_runs_a_job_alone_at_its_balanced_dop_after_loading_its_input() -> None:
    # C = 8, T_net = 2: DoP 4 (COMP 2 s = COMM 2 s), 4 s per iteration; loading 12 MB over 4 machines takes 3 s
    result = simulate_colocation([pjob("a", 8, 2, 10, data=12_000_000)], cluster(4), IsolatedPolicy())
    (outcome,) = result.jobs
    assert outcome.start == 0.0
    assert outcome.finish == pytest.approx(43.0)
    assert outcome.overhead_seconds == pytest.approx(3.0)


def test_isolated_jobs_wait_for_machines_in_arrival_order_and_a_narrower_one_may_go_first() -> None:
    jobs = [pjob("wide", 8, 2, 10), pjob("wide2", 8, 2, 10, arrival=1), pjob("narrow", 2, 2, 5, arrival=2)]
    result = simulate_colocation(jobs, cluster(5), IsolatedPolicy())
    by_id = {job.job_id: job for job in result.jobs}
    assert by_id["wide"].finish == pytest.approx(40.0)
    assert by_id["narrow"].start == pytest.approx(2.0)  # DoP 1 fits beside "wide"; "wide2" (DoP 4) does not
    assert by_id["wide2"].start == pytest.approx(40.0)


# --- Harmony ----------------------------------------------------------------------------------------------------


def test_harmony_co_locates_two_balanced_jobs_and_halves_the_makespan_of_isolated() -> None:
    # Each job alone on 4 machines: COMP 2 s, COMM 2 s, U = (1/2, 1/2). Together: COMP 4, COMM 4, own 4: T_g = 4 s,
    # U = (1, 1), one iteration of each every 4 s. Both are profiled together for their first iteration (4 s), then
    # regrouped into the same pairing (no machines change, but the group is new: a migration of 0 bytes).
    jobs = [pjob("a", 8, 2, 10), pjob("b", 8, 2, 10)]
    harmony = simulate_colocation(jobs, cluster(4), HarmonyPolicy())
    isolated = simulate_colocation(jobs, cluster(4), IsolatedPolicy())
    assert finishes(harmony) == {"a": pytest.approx(40.0), "b": pytest.approx(40.0)}
    assert sorted(finishes(isolated).values()) == [pytest.approx(40.0), pytest.approx(80.0)]
    assert max(s.cpu for s in harmony.samples) == pytest.approx(1.0)
    assert max(s.cpu for s in isolated.samples) == pytest.approx(0.5)


def test_moving_a_job_costs_its_checkpoint_and_restore_and_holds_only_that_job() -> None:
    # as above, with 4 MB models: after profiling each job moves to the new group, checkpointing 4 MB over 4 machines
    # (1 s) and restoring it (1 s): both restart at 6 s and finish 9 iterations later
    jobs = [pjob("a", 8, 2, 10, model=4_000_000), pjob("b", 8, 2, 10, model=4_000_000)]
    result = simulate_colocation(jobs, cluster(4), HarmonyPolicy())
    assert finishes(result) == {"a": pytest.approx(42.0), "b": pytest.approx(42.0)}
    assert all(job.migrations == 1 and job.overhead_seconds == pytest.approx(2.0) for job in result.jobs)
    # from 4 s to 6 s nothing progresses (the timeline's samples are exact steps)
    moving = next(i for i, s in enumerate(result.samples) if s.time == pytest.approx(4.0))
    assert result.samples[moving].running_jobs == 0
    assert result.samples[moving + 1].time == pytest.approx(6.0)
    assert result.samples[moving + 1].running_jobs == 2


def test_harmony_profiles_a_newcomer_in_the_group_with_fewest_machines() -> None:
    seen: list[View] = []

    class Watching(HarmonyPolicy):
        def plan(self, view: View) -> list[PlannedGroup]:
            seen.append(view)
            return super().plan(view)

    jobs = [pjob("a", 8, 2, 100), pjob("b", 8, 2, 100), pjob("c", 4, 4, 5, arrival=10.0)]
    simulate_colocation(jobs, cluster(4), Watching())
    arrival_round = next(view for view in seen if view.arrived == ("c",))
    assert arrival_round.jobs["c"].status is JobStatus.NEW
    after = next(view for view in seen if view.time > 10.0)
    assert after.jobs["c"].status is not JobStatus.NEW
    assert after.jobs["c"].group in {group.key for group in arrival_round.groups}


def test_harmony_runs_every_job_of_a_quarter_of_harmony_80_faster_than_isolated() -> None:
    jobs = generate_harmony_workload(HarmonyWorkloadConfig(seed=3))[:20]
    machines = ColocationCluster(25)
    harmony = simulate_colocation(jobs, machines, HarmonyPolicy())
    isolated = simulate_colocation(jobs, machines, IsolatedPolicy())
    assert len(harmony.jobs) == len(isolated.jobs) == 20

    def average_jct(result: ColocationResult) -> float:
        return statistics.fmean(job.jct for job in result.jobs)

    def makespan(result: ColocationResult) -> float:
        return max(job.finish for job in result.jobs)

    assert average_jct(harmony) < average_jct(isolated)
    assert makespan(harmony) < makespan(isolated)


# --- naive co-location ------------------------------------------------------------------------------------------


def test_naive_pairs_jobs_and_each_runs_at_its_own_contended_pace() -> None:
    # "a" and "b" want DoP 4 each on a 4-machine cluster: "a" starts alone, "b" joins it (no machines left)
    jobs = [pjob("a", 8, 2, 10), pjob("b", 2, 6, 10)]
    result = simulate_colocation(jobs, cluster(4, profile_iterations=0), NaivePolicy())
    times = contended_iterations([JobProfile("a", 8, 2), JobProfile("b", 2, 6)], 4)
    assert times[0] != pytest.approx(times[1])  # unlike Harmony's lockstep groups
    expected_first = min(10 * times[0], 10 * times[1])
    assert min(finishes(result).values()) == pytest.approx(expected_first)
    assert times[0] > group_iteration_seconds([JobProfile("a", 8, 2)], 4)  # slowed by "b"


# --- the engine's checks ----------------------------------------------------------------------------------------


class Scripted(ObliviousStorage):
    """A test double of a policy: returns the plans it was given, one per round, then keeps the last."""

    name = "scripted"

    def __init__(self, plans: Sequence[Sequence[PlannedGroup]]) -> None:
        self.plans = list(plans)
        self.views: list[View] = []

    def job_iteration_seconds(self, jobs: Sequence[JobProfile], machines: int) -> list[float]:
        return [group_iteration_seconds(jobs, machines)] * len(jobs)

    def plan(self, view: View) -> Sequence[PlannedGroup]:
        self.views.append(view)
        plan = self.plans.pop(0) if len(self.plans) > 1 else self.plans[0]
        keys = {group.key for group in view.groups}
        return [g if g.key is None or g.key in keys else PlannedGroup(None, g.job_ids, g.machines) for g in plan]


def test_a_job_left_out_is_paused_and_pays_its_restore_when_it_resumes() -> None:
    # 2 machines move 2 MB/s. Round 1: "a" alone, loading its 1 MB input (0.5 s), profiled after 1 iteration of
    # 2 s; round 2 (2.5 s): "b" instead, "a" paused; "b" finishes 2 iterations later (6.5 s), then "a" resumes,
    # restoring 1 MB of model and reloading 1 MB of input (1 s), and runs its 2 remaining iterations
    jobs = [pjob("a", 2, 1, 3, model=1_000_000, data=1_000_000), pjob("b", 2, 1, 2)]
    policy = Scripted(
        [
            [PlannedGroup(None, ("a",), 2)],
            [PlannedGroup(None, ("b",), 2)],
            [PlannedGroup(None, ("b",), 2)],
            [PlannedGroup(None, ("a",), 2)],
        ]
    )
    result = simulate_colocation(jobs, cluster(2), policy)
    by_id = {job.job_id: job for job in result.jobs}
    assert by_id["a"].pauses == 1
    assert by_id["a"].overhead_seconds == pytest.approx(0.5 + 1.0)  # loaded at the start, restored at the resume
    assert by_id["b"].finish == pytest.approx(6.5)
    assert by_id["a"].finish == pytest.approx(6.5 + 1.0 + 2 * 2.0)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ([PlannedGroup(None, ("a",), 2), PlannedGroup(None, ("a",), 1)], "job 'a' is in two groups"),
        ([PlannedGroup(None, ("ghost",), 1)], "job 'ghost' is unknown or finished"),
        ([PlannedGroup(None, ("a",), 5)], "uses 5 machines of 4"),
        ([PlannedGroup(None, (), 1)], "has no jobs"),
        ([PlannedGroup(None, ("a",), 0)], "has 0 machines"),
        ([PlannedGroup(7, ("a",), 1)], "no running group has key 7"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_by_name(plan: list[PlannedGroup], message: str) -> None:
    class Fixed(ObliviousStorage):
        name = "fixed"

        def job_iteration_seconds(self, jobs: Sequence[JobProfile], machines: int) -> list[float]:
            return [1.0] * len(jobs)

        def plan(self, view: View) -> list[PlannedGroup]:
            return plan

    with pytest.raises(InvalidPlan, match=message):
        simulate_colocation([pjob("a", 1, 1, 1)], cluster(4), Fixed())


def test_a_policy_that_never_runs_the_jobs_left_stalls_the_run() -> None:
    policy = Scripted([[]])
    with pytest.raises(SimulationStalled, match="1 jobs are left"):
        simulate_colocation([pjob("a", 1, 1, 1)], cluster(2), policy)


def test_a_trace_naming_a_job_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        simulate_colocation([pjob("a", 1, 1, 1), pjob("a", 1, 1, 1)], cluster(2), IsolatedPolicy())


def test_the_silod_variant_beats_harmony_where_remote_io_is_scarce() -> None:
    # a quarter of harmony-80-io: 20 of its jobs on 25 machines, a quarter of its egress and cache
    jobs = generate_harmony_workload(HarmonyWorkloadConfig(seed=3, epoch_iterations=100))[:20]
    machines = ColocationCluster(25, remote_io_bytes_per_sec=125e6, cache_bytes=25 * 10**9)
    vanilla = simulate_colocation(jobs, machines, HarmonyPolicy())
    silod = simulate_colocation(jobs, machines, HarmonyPolicy(storage_aware=True))
    assert statistics.fmean(j.jct for j in silod.jobs) < statistics.fmean(j.jct for j in vanilla.jobs)
    assert max(j.finish for j in silod.jobs) < max(j.finish for j in vanilla.jobs)


def test_a_job_that_must_wait_after_profiling_lets_harmony_regroup_when_that_gains_5_percent() -> None:
    # "a" runs alone on the 4 machines at U = (1/2, 1/2); "c" waits, paused; "b" has just been profiled in a's group.
    # b must wait (c waits before it), but regrouping a's group with the waiting jobs runs a and c together:
    # COMP 4, COMM 4, U = (1, 1), a 100 % gain (Algorithm 1 keeps the 2 jobs, within 5 % of the best).
    profile = JobProfile("x", 8, 2)
    jobs = {
        "a": JobView(replace(profile, job_id="a"), JobStatus.RUNNING, 0.0, group=1),
        "b": JobView(replace(profile, job_id="b"), JobStatus.RUNNING, 2.0, group=1),
        "c": JobView(replace(profile, job_id="c"), JobStatus.PAUSED, 1.0),
    }
    view = View(60.0, 4, jobs, [GroupView(1, ("a", "b"), 4)], profiled=("b",))
    plan = HarmonyPolicy().plan(view)
    assert [(set(group.job_ids), group.machines) for group in plan] == [({"a", "c"}, 4)]
