"""The live compute path's pieces: a job's history as it starts and stops (`datamgr.lifecycle`), a round's moves,
the decisions WatchDecisions publishes, and the data manager's checks on jobs the policy places (bad input
refused naming what is wrong), with the history persisted across a restart; jobs' classes and grace periods,
and the hold a job preempted with a grace period keeps on its GPUs until it ends, across a restart too. End to
end with a launcher following the stream: test_launcher.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from datamgr import convert, lifecycle
from datamgr.clocks import SteadyWallClock
from datamgr.controller import Controller, RoundRequests, snapshot_of
from datamgr.entities import AlreadyExists, FailedPrecondition, InvalidArgument, Job, JobHistory, NotFound, Worker
from datamgr.lifecycle import Move, Phase
from datamgr.manager import DataManager
from datamgr.scheduler.perf import Estimator, SiloDPerf
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import Scheduler, build_scheduler
from datamgr.scheduler.snapshot import Snapshot
from datamgr.store import SQLiteStore
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import allocations, make_local_dataset, owned_manager

# ---- a job's history ----


def placed_job(gpus: int = 2, workers: tuple[Worker, ...] = ()) -> Job:
    return Job("j", "file:///d", 1000, workers, gpus=gpus)


def test_a_job_for_the_policy_waits_from_its_registration_and_one_with_workers_runs_from_it() -> None:
    waiting = lifecycle.registered(placed_job(), now=10.0)
    assert (waiting.submit_time, waiting.pending_since, waiting.first_start_time) == (10.0, 10.0, None)
    assert lifecycle.phase(placed_job(), waiting) == Phase.PENDING
    pinned = Job("j", "file:///d", 1000, (Worker("n1", 2),))
    running = lifecycle.registered(pinned, now=10.0)
    assert (running.first_start_time, running.last_start_time, running.pending_since) == (10.0, 10.0, None)
    assert lifecycle.attained_gpu_seconds(pinned, running, now=25.0) == 30.0  # 2 workers for 15 s


def test_start_stop_and_resume_bank_attained_service_and_time_queued() -> None:
    job, history = placed_job(), lifecycle.registered(placed_job(), now=0.0)

    job, history = lifecycle.moved(job, history, {"n1": 2}, now=5.0)  # waited 5 s, then runs on 2 GPUs
    assert job.workers == (Worker("n1", 2),) and lifecycle.phase(job, history) == Phase.RUNNING
    assert (history.first_start_time, history.last_start_time, history.queued_seconds_before) == (5.0, 5.0, 5.0)
    assert lifecycle.attained_gpu_seconds(job, history, now=8.0) == 6.0

    job, history = lifecycle.moved(job, history, {"n2": 1, "n3": 1}, now=8.0)  # a migration: no preemption
    assert (history.preemptions, history.last_start_time) == (0, 5.0)

    job, history = lifecycle.moved(job, history, {}, now=10.0)  # preempted after 5 s on 2 GPUs
    assert lifecycle.phase(job, history) == Phase.PREEMPTED
    assert (history.preemptions, history.pending_since, history.attained_gpu_seconds_before) == (1, 10.0, 10.0)
    assert lifecycle.attained_gpu_seconds(job, history, now=100.0) == 10.0  # no service while it waits
    assert lifecycle.queued_seconds(history, now=14.0) == 9.0  # 5 before it first ran, 4 since the preemption

    job, history = lifecycle.moved(job, history, {"n1": 2}, now=20.0)  # resumed
    assert (history.first_start_time, history.last_start_time, history.queued_seconds_before) == (5.0, 20.0, 15.0)
    assert lifecycle.attained_gpu_seconds(job, history, now=21.0) == 12.0


def test_what_a_job_read_on_the_nodes_it_leaves_is_banked_at_its_stops_and_migrations() -> None:
    job, history = placed_job(), lifecycle.registered(placed_job(), now=0.0)
    job, history = lifecycle.moved(job, history, {"n1": 2}, now=1.0)
    assert lifecycle.nodes_joined(job, {"n1": 1, "n2": 1}) == ["n2"] and lifecycle.nodes_left(job, {"n2": 2}) == ["n1"]

    job, history = lifecycle.moved(job, history, {"n2": 2}, now=2.0, read_on_nodes_left=300)  # a migration
    assert (history.bytes_read_before, history.preemptions) == (300, 0)
    job, history = lifecycle.moved(job, history, {}, now=3.0, read_on_nodes_left=200)  # preempted
    assert (history.bytes_read_before, history.preemptions) == (500, 1)
    job, history = lifecycle.moved(job, history, {"n1": 2}, now=4.0)  # resumed: its nodes count from 0
    assert history.bytes_read_before == 500


def test_policy_state_is_kept_only_when_it_changes() -> None:
    history = JobHistory("j", 0.0)
    updated = lifecycle.with_policy_state(history, {"queue": 1}, "tiresias-las")
    assert updated is not None and dict(updated.policy_state) == {"queue": 1.0}
    assert lifecycle.with_policy_state(updated, {"queue": 1.0}, "tiresias-las") is None
    rewritten = lifecycle.with_policy_state(updated, {"queue": 1.0}, "hived")  # the same numbers, another writer
    assert rewritten is not None and rewritten.policy_state_by == "hived"


def test_a_policy_is_handed_only_the_state_it_wrote_or_one_kept_before_writers_were() -> None:
    written = JobHistory("j", 0.0, policy_state={"queue": 1.0}, policy_state_by="tiresias-las")
    assert dict(lifecycle.policy_state_of(written, "tiresias-las")) == {"queue": 1.0}
    assert dict(lifecycle.policy_state_of(written, "hived")) == {}
    unmarked = JobHistory("j", 0.0, policy_state={"queue": 1.0})
    assert dict(lifecycle.policy_state_of(unmarked, "hived")) == {"queue": 1.0}
    cleared = lifecycle.with_policy_state(written, {}, "hived")
    assert cleared is not None and (dict(cleared.policy_state), cleared.policy_state_by) == ({}, "")


def test_a_rounds_moves_put_stops_first_and_leave_jobs_registered_with_workers_where_they_are() -> None:
    jobs = {
        "a-starts": Job("a-starts", "file:///d", 1, (), gpus=1),
        "b-runs": Job("b-runs", "file:///d", 1, (Worker("n1", 1),), gpus=1),
        "c-stops": Job("c-stops", "file:///d", 1, (Worker("n2", 1),), gpus=1),
        "d-pinned": Job("d-pinned", "file:///d", 1, (Worker("n3", 1),)),
    }
    placements = {"a-starts": {"n2": 1}, "b-runs": {"n1": 1}}  # c and d left out: preempted

    moves, unapplied = lifecycle.compute_moves(jobs, [*jobs, "gone"], placements)

    assert [str(m) for m in moves] == ["preempt c-stops (n2:1 -> nothing)", "start a-starts (nothing -> n2:1)"]
    assert unapplied == ["d-pinned"]


def test_decisions_changed_by_a_change_list_stops_before_starts_and_name_jobs_that_left() -> None:
    def view(job_id: str, phase: Phase, placement: tuple[tuple[str, int], ...] = ()) -> lifecycle.DecisionView:
        return lifecycle.DecisionView(job_id, phase, placement, 1, "file:///d")

    before = {"a": view("a", Phase.PENDING), "b": view("b", Phase.RUNNING, (("n1", 1),)), "c": view("c", Phase.PENDING)}
    after = {"a": view("a", Phase.RUNNING, (("n1", 1),)), "b": view("b", Phase.PREEMPTED), "c": None}

    changed, finished = lifecycle.changed_decisions(before, after)

    assert [(v.job_id, v.phase) for v in changed] == [("b", Phase.PREEMPTED), ("a", Phase.RUNNING)]
    assert finished == ["c"]
    assert lifecycle.decision_view(Job("p", "file:///d", 1, (Worker("n1", 1),)), JobHistory("p", 0.0)) is None


# ---- the data manager's checks and the stream, in process ----


@contextlib.asynccontextmanager
async def placing_manager(tmp_path: Path, policy: str | None = "sjf") -> AsyncIterator[tuple[DataManager, str]]:
    """A data manager on a fresh state dir, two nodes with 2 GPUs each for the policy, and a dataset."""
    async with owned_manager(tmp_path, policy) as (manager, _):
        await manager.register_node("n1", "h1:1", 10_000, gpus=2)
        await manager.register_node("n2", "h2:1", 10_000, gpus=2)
        dataset, _, _ = await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0)
        yield manager, dataset.uri


def test_placements_that_cannot_be_carried_out_are_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with placing_manager(tmp_path) as (manager, uri):
            await manager.register_job("big", uri, 1000, [], gpus=2)
            await manager.register_job("pinned", uri, 1000, [Worker("n2", 1)])
            with pytest.raises(NotFound, match=r"job_id: job 'nosuch' is not registered"):
                await allocations(manager).place("nosuch", {"n1": 2})
            with pytest.raises(NotFound, match=r"placement: node 'n9' is not registered"):
                await allocations(manager).place("big", {"n9": 2})
            with pytest.raises(InvalidArgument, match=r"job 'big': 1 GPUs \(n1:1\); it runs on all the 2 it asks"):
                await allocations(manager).place("big", {"n1": 1})
            with pytest.raises(FailedPrecondition, match=r"node 'n2' has 1 GPUs free for the policy, not 2"):
                await allocations(manager).place("big", {"n2": 2})  # the pinned job's worker holds one of them
            with pytest.raises(FailedPrecondition, match=r"job 'pinned' was registered with its workers"):
                await allocations(manager).place("pinned", {"n1": 1})
            assert lifecycle.placement_of(manager.state.jobs["big"]) == {}
            await allocations(manager).place("big", {"n1": 2})
            assert lifecycle.placement_of(manager.state.jobs["big"]) == {"n1": 2}

    asyncio.run(scenario())


def test_registrations_for_the_policy_are_checked(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with placing_manager(tmp_path) as (manager, uri):
            with pytest.raises(InvalidArgument, match=r"gpus 1 and workers n1:1 are both given"):
                await manager.register_job("j", uri, 1000, [Worker("n1", 1)], gpus=1)
            with pytest.raises(InvalidArgument, match=r"workers must name at least one node \(or give gpus"):
                await manager.register_job("j", uri, 1000, [])
            await manager.register_job("j", uri, 1000, [], gpus=2)
            await allocations(manager).place("j", {"n1": 2})
            _, created, _ = await manager.register_job("j", uri, 1000, [], gpus=2)  # placed since: still the same
            assert not created
            with pytest.raises(AlreadyExists, match=r"registered with gpus 2, not gpus 1"):
                await manager.register_job("j", uri, 1000, [], gpus=1)
        async with placing_manager(tmp_path / "external", policy=None) as (manager, uri):
            with pytest.raises(FailedPrecondition, match=r"gpus 1: no policy places jobs on this data manager"):
                await manager.register_job("j", uri, 1000, [], gpus=1)
            with pytest.raises(FailedPrecondition, match=r"WatchDecisions: no policy places jobs"):
                await anext(manager.watch_decisions())

    asyncio.run(scenario())


def test_the_stream_starts_with_every_decision_then_follows_changes_and_a_gone_follower_unsubscribes(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with placing_manager(tmp_path) as (manager, uri):
            await manager.register_job("a", uri, 1000, [], gpus=2)
            await manager.register_job("pinned", uri, 1000, [Worker("n2", 1)])  # not the policy's: not listed
            stream = manager.watch_decisions()
            first = await anext(stream)
            assert first.snapshot and [(d.job_id, d.phase) for d in first.jobs] == [("a", pb.JOB_PHASE_PENDING)]
            assert first.revision == manager.state.revision

            await allocations(manager).place("a", {"n1": 2})
            started = await anext(stream)
            assert not started.snapshot and started.revision == first.revision + 1
            (decision,) = started.jobs
            assert (decision.phase, [(w.node_id, w.count) for w in decision.placement]) == (
                pb.JOB_PHASE_RUNNING,
                [("n1", 2)],
            )
            await allocations(manager).hand_back({"a": {"queue": 1}})  # no decision changes: nothing published
            await manager.register_job("b", uri, 1000, [], gpus=1)
            await manager.finish_job("a")
            assert [(d.job_id, d.phase) for d in (await anext(stream)).jobs] == [("b", pb.JOB_PHASE_PENDING)]
            assert list((await anext(stream)).jobs_finished) == ["a"]

            assert manager.decision_hub.watcher_count("decisions") == 1
            await stream.aclose()  # the launcher went away
            assert manager.decision_hub.watcher_count("decisions") == 0

    asyncio.run(scenario())


class PreemptsForNewest:
    """A compute policy that runs only the newest job on n1, and marks every job's queue as 1."""

    name = "newest"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        newest = max(snapshot.jobs.values(), key=lambda j: (j.submit_time, j.job_id))
        return Decision(
            placements={newest.job_id: {"n1": newest.gpus}},
            cache_bytes={},
            io_bytes_per_sec={},
            job_states={job_id: {"queue": 1.0} for job_id in snapshot.jobs},
            wake_at=snapshot.time + 60.0,
        )


def test_a_round_preempts_then_places_keeps_policy_state_and_history_survives_a_restart(tmp_path: Path) -> None:
    clock = [100.0]

    def wall_clock() -> float:
        return clock[0]

    async def round_with(manager: DataManager) -> None:
        controller = Controller(manager, Scheduler(PreemptsForNewest(), SiloDPerf(), "silod"), RoundRequests())
        report = await controller.run_round("test")
        assert report.error == "" and report.wake_at == clock[0] + 60.0

    async def first_run() -> None:
        async with owned_manager(tmp_path, "newest", wall_clock=wall_clock) as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000, gpus=1)
            uri = (await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0))[0].uri
            await manager.register_job("old", uri, 1000, [], gpus=1)
            await round_with(manager)
            clock[0] = 130.0
            await manager.register_job("new", uri, 1000, [], gpus=1)
            await round_with(manager)
            assert {j: job.node_ids for j, job in manager.state.jobs.items()} == {"old": (), "new": ("n1",)}

    asyncio.run(first_run())
    clock[0] = 140.0

    async def after_restart() -> None:
        async with owned_manager(tmp_path, "newest", wall_clock=wall_clock) as (manager, _):
            old = snapshot_of(manager, 1000, now=clock[0]).jobs["old"]
            assert (old.submit_time, old.first_start_time, old.last_start_time) == (100.0, 100.0, 100.0)
            assert (old.pending_since, old.preemptions, old.attained_gpu_seconds) == (130.0, 1, 30.0)
            assert old.queued_seconds(clock[0]) == 10.0 and dict(old.policy_state) == {"queue": 1.0}
            new = snapshot_of(manager, 1000, now=clock[0]).jobs["new"]
            assert (dict(new.placement), new.attained_gpu_seconds, new.preemptions) == ({"n1": 1}, 10.0, 0)

    asyncio.run(after_restart())


# ---- classes and grace periods ----


def test_a_preemption_with_a_grace_period_suspends_the_job_holding_its_gpus_until_the_period_ends() -> None:
    job = Job("j", "file:///d", 1000, (), gpus=2, grace_seconds=60.0)
    job, history = lifecycle.moved(job, lifecycle.registered(job, now=0.0), {"n1": 2}, now=5.0)

    job, history = lifecycle.moved(job, history, {}, now=10.0)

    assert job.workers == () and lifecycle.phase(job, history) == Phase.SUSPENDING
    assert (dict(history.held), history.suspended_until, history.preemptions) == ({"n1": 2}, 70.0, 1)
    assert lifecycle.attained_gpu_seconds(job, history, now=50.0) == 10.0  # no service while it suspends
    view = lifecycle.decision_view(job, history)
    assert view is not None and (view.phase, view.suspended_until) == (Phase.SUSPENDING, 70.0)
    released = lifecycle.released(history)
    assert lifecycle.phase(job, released) == Phase.PREEMPTED and (dict(released.held), released.suspended_until) == (
        {},
        None,
    )
    no_grace = replace(job, workers=(Worker("n1", 2),), grace_seconds=0.0)
    _, stopped = lifecycle.moved(no_grace, released, {}, now=80.0)  # without a grace period: released at once
    assert (dict(stopped.held), stopped.suspended_until) == ({}, None)


def test_class_and_grace_period_are_checked_at_registration_and_bad_ones_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with placing_manager(tmp_path) as (manager, uri):
            revision = manager.state.revision
            with pytest.raises(InvalidArgument, match=r"job_class 'xx' must be te \(trial-and-error\) or be"):
                await manager.register_job("j", uri, 1000, [], gpus=1, job_class="xx")
            for grace in (-180.0, math.nan, math.inf, 86_401.0):
                with pytest.raises(InvalidArgument, match=r"grace_seconds .* must be a number of seconds from 0 to"):
                    await manager.register_job("j", uri, 1000, [], gpus=1, grace_seconds=grace)
            assert (manager.state.revision, list(manager.state.jobs)) == (revision, [])

            job, _, _ = await manager.register_job("j", uri, 1000, [], gpus=1, job_class="te", grace_seconds=90.0)
            assert (job.job_class, job.grace_seconds) == ("te", 90.0)
            with pytest.raises(AlreadyExists, match=r"registered with job_class te, grace_seconds 90 s, not "):
                await manager.register_job("j", uri, 1000, [], gpus=1)  # best-effort, no grace: another job
            with pytest.raises(InvalidArgument, match=r"job_class 7 is not a job class"):
                convert.job_class(pb.JobClass.ValueType(7))
            assert convert.job_class(pb.JOB_CLASS_UNSPECIFIED) == "be"  # what a client older than classes sends

    asyncio.run(scenario())


def test_a_suspending_job_holds_its_gpus_against_every_placement_until_released(tmp_path: Path) -> None:
    clock = [100.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "sjf", wall_clock=lambda: clock[0]) as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000, gpus=2)
            uri = (await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0))[0].uri
            await manager.register_job("be", uri, 1000, [], gpus=2, grace_seconds=30.0)
            await manager.register_job("te", uri, 1000, [], gpus=2, job_class="te")
            await allocations(manager).place("be", {"n1": 2})
            await allocations(manager).place("be", {})  # preempted at 100: suspends until 130

            with pytest.raises(FailedPrecondition, match=r"node 'n1' has 0 GPUs free for the policy \(2 held by"):
                await allocations(manager).place("te", {"n1": 2})
            with pytest.raises(FailedPrecondition, match=r"job 'be': it is suspending through its grace period until"):
                await allocations(manager).place("be", {"n1": 2})
            with pytest.raises(FailedPrecondition, match=r"node 'n1' holds GPUs for jobs \['be'\] through their"):
                await manager.unregister_node("n1")
            snapshot = snapshot_of(manager, 1000, now=clock[0])
            assert [j.job_id for j in snapshot.suspending_jobs()] == ["be"] and snapshot.free_gpus() == {"n1": 0}
            assert [j.job_id for j in snapshot.queued_jobs()] == ["te"]
            assert manager.next_release() == 130.0

            clock[0] = 129.9
            assert await allocations(manager).release_due() == []
            clock[0] = 130.0
            assert await allocations(manager).release_due() == ["be"]
            assert manager.next_release() is None
            assert lifecycle.phase(manager.state.jobs["be"], manager.history("be")) == Phase.PREEMPTED
            await allocations(manager).place("te", {"n1": 2})

    asyncio.run(scenario())


@pytest.mark.expected_warnings  # the grace period re-dated
def test_a_grace_period_stamped_by_a_clock_a_day_ahead_ends_a_whole_grace_period_after_a_restart(
    tmp_path: Path,
) -> None:
    """A data manager restarted after the system clock was stepped back a day found a grace period ending a day
    from now, and held the job's GPUs for that day. It now ends no later than the job's grace period from then."""
    clock = [100_000.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "sjf", wall_clock=lambda: clock[0]) as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000, gpus=2)
            uri = (await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0))[0].uri
            await manager.register_job("be", uri, 1000, [], gpus=2, grace_seconds=30.0)
            await allocations(manager).place("be", {"n1": 2})
            await allocations(manager).place("be", {})  # suspends until 100,030
        clock[0] = 100_000.0 - 86_400  # the restart, the clock a day back
        async with owned_manager(tmp_path, "sjf", wall_clock=lambda: clock[0]) as (manager, _):
            assert manager.next_release() == clock[0]  # due at once: to be re-dated
            assert await allocations(manager).release_due() == []
            assert manager.history("be").suspended_until == clock[0] + 30.0
            assert manager.next_release() == clock[0] + 30.0
            clock[0] += 30.0
            assert await allocations(manager).release_due() == ["be"]

    asyncio.run(scenario())


def test_jobs_registered_after_a_restart_with_the_clock_stepped_back_still_queue_behind_earlier_ones(
    tmp_path: Path,
) -> None:
    """FIFO ranks by submit time: a job registered after the clock went back was ranked before earlier ones."""
    clock = [100_000.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "fifo", wall_clock=lambda: clock[0]) as (manager, _):
            uri = (await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0))[0].uri
            await manager.register_job("first", uri, 1000, [], gpus=2)
        clock[0] -= 3600
        async with owned_manager(tmp_path, "fifo", wall_clock=lambda: clock[0]) as (manager, _):
            await manager.register_job("second", uri, 1000, [], gpus=2)
            snapshot = snapshot_of(manager, 1000, now=clock[0])
            assert [job.job_id for job in snapshot.jobs_by_submission()] == ["first", "second"]
            assert manager.history("second").submit_time == 100_000.0

    asyncio.run(scenario())


def test_the_data_managers_own_clock_follows_the_monotonic_clock_from_the_wall_clock_at_its_start() -> None:
    wall, monotonic = [1_000_000.0], [50.0]
    clock = SteadyWallClock(lambda: wall[0], lambda: monotonic[0])
    monotonic[0] += 10.0
    wall[0] -= 86_400  # an NTP step back, or the date set by hand
    assert clock() == 1_000_010.0
    wall[0] += 2 * 86_400
    monotonic[0] += 5.0
    assert clock() == 1_000_015.0


def test_a_data_manager_stamps_histories_by_its_steady_clock_unless_given_another(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SQLiteStore(tmp_path / "state")
        manager = DataManager(store)
        try:
            assert isinstance(manager.wall_clock, SteadyWallClock)
            assert abs(manager.wall_clock() - time.time()) < 5
        finally:
            await manager.close()
            store.close()

    asyncio.run(scenario())


def test_finishing_a_suspending_job_releases_what_it_held(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with placing_manager(tmp_path) as (manager, uri):
            await manager.register_job("be", uri, 1000, [], gpus=2, grace_seconds=600.0)
            await allocations(manager).place("be", {"n1": 2})
            await allocations(manager).place("be", {})
            assert manager.state.node_gpus_held("n1") == 2
            await manager.finish_job("be")
            assert (manager.state.node_gpus_held("n1"), manager.next_release()) == (0, None)

    asyncio.run(scenario())


def test_fitgpp_live_a_te_job_waits_for_the_grace_period_of_the_be_job_it_preempts_across_a_restart(
    tmp_path: Path,
) -> None:
    """The data manager in process with its wall clock in the test's hands: the BE job's GPUs stay held, through
    rounds and a restart, until its grace period ends, and only then go to the TE job."""
    clock = [1000.0]

    def round_with(manager: DataManager) -> Controller:
        return Controller(manager, build_scheduler("fitgpp"), RoundRequests())

    async def until_restart() -> list[pb.DecisionEvent]:
        async with owned_manager(tmp_path, "fitgpp", wall_clock=lambda: clock[0]) as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000, gpus=2)
            uri = (await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0))[0].uri
            await manager.register_job("be", uri, 1000, [], gpus=2, grace_seconds=60.0)
            stream = manager.watch_decisions()
            events = [await anext(stream)]
            await round_with(manager).run_round("test")  # the BE job starts
            events.append(await anext(stream))
            clock[0] = 1010.0
            await manager.register_job("te", uri, 1000, [], gpus=2, job_class="te")
            events.append(await anext(stream))  # the TE job, pending
            report = await round_with(manager).run_round("test")  # preempts the BE job, which suspends
            assert [str(move) for move in report.applied if isinstance(move, Move)] == ["preempt be (n1:2 -> nothing)"]
            events.append(await anext(stream))
            clock[0] = 1069.0
            await round_with(manager).run_round("test")  # a round within the grace period: the hold stays
            await stream.aclose()
            assert lifecycle.placement_of(manager.state.jobs["te"]) == {}
            return events

    events = asyncio.run(until_restart())
    decisions = [[(d.job_id, pb.JobPhase.Name(d.phase), d.suspended_until) for d in e.jobs] for e in events]
    assert decisions == [
        [("be", "JOB_PHASE_PENDING", 0.0)],
        [("be", "JOB_PHASE_RUNNING", 0.0)],
        [("te", "JOB_PHASE_PENDING", 0.0)],
        [("be", "JOB_PHASE_SUSPENDING", 1070.0)],  # published at once, with the end of its grace period
    ]

    async def after_restart() -> None:
        async with owned_manager(tmp_path, "fitgpp", wall_clock=lambda: clock[0]) as (manager, _):
            be = snapshot_of(manager, 1000, now=clock[0]).jobs["be"]
            assert (dict(be.held), be.placement, be.job_class, be.grace_seconds) == ({"n1": 2}, {}, "be", 60.0)
            assert snapshot_of(manager, 1000, now=clock[0]).jobs["te"].job_class == "te"
            assert manager.next_release() == 1070.0
            controller = round_with(manager)
            report = await controller.run_round("start")  # restarted a second before the end: still held
            assert report.released == () and not [move for move in report.applied if isinstance(move, Move)]
            stream = manager.watch_decisions()
            await anext(stream)
            clock[0] = 1070.0
            report = await controller.run_round("grace period over")
            assert report.released == ("be",)
            assert [str(move) for move in report.applied if isinstance(move, Move)] == ["start te (nothing -> n1:2)"]
            released, started = (await anext(stream)), (await anext(stream))
            assert [(d.job_id, d.phase) for d in released.jobs] == [("be", pb.JOB_PHASE_PREEMPTED)]
            assert [(d.job_id, d.phase) for d in started.jobs] == [("te", pb.JOB_PHASE_RUNNING)]
            await stream.aclose()

    asyncio.run(after_restart())


@pytest.mark.expected_warnings  # the refused start: the round that refuses a change logs it at WARNING
def test_any_policy_is_held_to_a_grace_period_a_start_on_the_held_gpus_is_refused_until_they_are_released(
    tmp_path: Path,
) -> None:
    """`PreemptsForNewest` knows nothing of grace periods: it preempts the old job and places the new one on the
    same GPUs in one round; the start waits, refused, for the old job's grace period to end."""
    clock = [100.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "newest", wall_clock=lambda: clock[0]) as (manager, _):
            controller = Controller(manager, Scheduler(PreemptsForNewest(), SiloDPerf(), "silod"), RoundRequests())
            await manager.register_node("n1", "h1:1", 10_000, gpus=1)
            uri = (await manager.register_dataset(make_local_dataset(tmp_path / "d", 2, 500), {}, 0))[0].uri
            await manager.register_job("old", uri, 1000, [], gpus=1, grace_seconds=30.0)
            await controller.run_round("test")
            clock[0] = 110.0
            await manager.register_job("new", uri, 1000, [], gpus=1)

            report = await controller.run_round("test")

            assert [str(move) for move in report.applied if isinstance(move, Move)] == ["preempt old (n1:1 -> nothing)"]
            ((refused, reason),) = report.refused
            assert str(refused) == "start new (nothing -> n1:1)"
            assert "node 'n1' has 0 GPUs free for the policy (1 held by suspending jobs), not 1" in reason
            assert lifecycle.phase(manager.state.jobs["old"], manager.history("old")) == Phase.SUSPENDING

            clock[0] = 140.0
            report = await controller.run_round("grace period over")
            assert report.released == ("old",) and report.refused == ()
            assert [str(move) for move in report.applied if isinstance(move, Move)] == ["start new (nothing -> n1:1)"]

    asyncio.run(scenario())
