"""The live compute path's pieces: a job's history as it starts and stops (`datamgr.lifecycle`), a round's moves,
the decisions WatchDecisions publishes, and the data manager's checks on jobs the policy places (bad input
refused naming what is wrong), with the history persisted across a restart. End to end with a launcher
following the stream: test_launcher.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from datamgr import lifecycle
from datamgr.controller import Controller, RoundRequests, snapshot_of
from datamgr.entities import AlreadyExists, FailedPrecondition, InvalidArgument, Job, JobHistory, NotFound, Worker
from datamgr.lifecycle import Phase
from datamgr.manager import DataManager
from datamgr.scheduler.perf import Estimator, SiloDPerf
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import Scheduler
from datamgr.scheduler.snapshot import Snapshot
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


def test_policy_state_is_kept_only_when_it_changes() -> None:
    history = JobHistory("j", 0.0)
    updated = lifecycle.with_policy_state(history, {"queue": 1})
    assert updated is not None and dict(updated.policy_state) == {"queue": 1.0}
    assert lifecycle.with_policy_state(updated, {"queue": 1.0}) is None


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
