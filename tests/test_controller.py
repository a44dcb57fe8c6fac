"""The live controller (`silod datamgr serve --policy NAME`): the snapshot a policy sees of the data manager's
state, storage decisions applied through the manager's own allocation calls (decreases first, refusals
retried, failures survived), manual allocations refused while a policy owns them, and what triggers a round.
Its flags and the end-to-end runs with real node agents are in test_controller_live.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import pytest

from datamgr import queries
from datamgr.controller import Controller, RoundReport, RoundRequests, Step, plan, snapshot_of
from datamgr.entities import Dataset, FailedPrecondition, Job, Node, Worker
from datamgr.liveness import DatasetUsage, JobUsage
from datamgr.manager import DataManager, PolicyAllocations
from datamgr.scheduler.perf import Estimator, SiloDPerf
from datamgr.scheduler.policies.fifo import FifoPolicy
from datamgr.scheduler.policies.greedy import GreedyStorage
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import Scheduler, build_scheduler
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot
from datamgr.state import ClusterState
from silodcli.tables import read_text
from tests.datamgr_fixtures import allocations, done_bytes, make_local_dataset, owned_manager, read

# ---- an in-process data manager owned by a policy ----


async def add_dataset(manager: DataManager, root: Path, files: int, size: int) -> str:
    """A registered dataset of `files` x `size` bytes; returns its URI."""
    dataset, _, _ = await manager.register_dataset(make_local_dataset(root, files, size), {}, 0)
    return dataset.uri


@dataclass
class FixedPolicy:
    """A site's plugin policy that always decides the same storage allocation (and placements, if given)."""

    cache: Mapping[str, int]
    io: Mapping[str, int]
    placements: Mapping[str, Mapping[str, int]] | None = None
    name: str = "fixed"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        return Decision(placements=self.placements, cache_bytes=self.cache, io_bytes_per_sec=self.io)


@dataclass
class FailsOncePolicy:
    """A plugin policy whose first call raises (a bug, a model not loaded yet), then decides like `then`."""

    then: FixedPolicy
    calls: int = 0
    name: str = "fixed"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("profile table not loaded yet")
        return self.then.schedule(snapshot, estimator)


def scheduler_of(policy: FixedPolicy | FailsOncePolicy) -> Scheduler:
    return Scheduler(policy, SiloDPerf(), "silod")


# ---- the snapshot ----


def test_the_snapshot_places_jobs_on_their_workers_and_budgets_the_smallest_cache_of_nodes_running_jobs(
    tmp_path: Path,
) -> None:
    now = [1.0]  # the data manager's wall clock: ja is registered at 1.0, jb at 11.0

    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy", remote_io_limit=7000, wall_clock=lambda: now[0]) as (manager, _):
            await manager.register_node("n1", "h1:1", 5000)
            await manager.register_node("n2", "h2:1", 3000)
            await manager.register_node("idle", "h3:1", 100)  # runs no job: its small cache does not count
            a = await add_dataset(manager, tmp_path / "a", files=8, size=1000)
            b = await add_dataset(manager, tmp_path / "b", files=4, size=500)
            await manager.register_job("ja", a, 1000, [Worker("n1", 2), Worker("n2", 1)])
            now[0] = 11.0
            await manager.register_job("jb", b, 500, [Worker("n2", 1)], epochs=2.5, irregular=True)
            manager.report_usage(
                "n1",
                [DatasetUsage(dataset_uri=a, cached_bytes=700)],
                [JobUsage(job_id="ja", bytes_read=300, effective_cache_bytes=2000, epoch_progress=0.5)],
            )
            manager.report_usage(
                "n2",
                [DatasetUsage(dataset_uri=a, cached_bytes=400), DatasetUsage(dataset_uri=b, cached_bytes=100)],
                [JobUsage(job_id="ja", bytes_read=200, effective_cache_bytes=600, epoch_progress=0.75)],
            )

            snapshot = snapshot_of(manager, 7000, now=11.0)

            assert snapshot.cache_capacity_bytes == 3000
            assert snapshot.remote_io_bytes_per_sec == 7000
            assert snapshot.seed == manager.state.revision
            assert {n.node_id: n.gpus for n in snapshot.nodes.values()} == {"n1": 2, "n2": 2, "idle": 0}
            ja, jb = snapshot.jobs["ja"], snapshot.jobs["jb"]
            assert (dict(ja.placement), ja.gpus, ja.ideal_bytes_per_sec) == ({"n1": 2, "n2": 1}, 3, 1000)
            assert (ja.dataset_uri, ja.dataset_bytes, ja.done_bytes) == (a, 8000, 500)
            assert (ja.total_bytes, ja.irregular) == (math.inf, False)  # ja did not say how long it trains
            assert (jb.total_bytes, jb.irregular) == (5000, True)  # 2.5 epochs of its 2000-byte dataset
            assert (ja.submit_time, ja.attained_gpu_seconds) == (1.0, 30.0)
            assert (jb.submit_time, jb.attained_gpu_seconds, jb.done_bytes) == (11.0, 0.0, 0)  # seen now
            # Hits still to come over items not read yet, the least over ja's nodes. Each node reads its workers'
            # share of the items per pass and reports its progress through that share: n1 (2 of 3 workers) is
            # half through its 2/3, so 2000 cached of the 8000 x (1 - 1/3) bytes it has not read; n2 (1 of 3)
            # three quarters through its 1/3: 600 of 8000 x (1 - 1/4). Nothing reported for jb: its dataset's
            # cache stands in.
            assert ja.epoch_hit_ratio == pytest.approx(0.1) and jb.epoch_hit_ratio is None
            assert snapshot.datasets[a] == DatasetState(a, 8000, 0, 400)  # the least cached on a node mounting it
            assert snapshot.datasets[b] == DatasetState(b, 2000, 0, 100)

    asyncio.run(scenario())


# ---- applying decisions ----


def test_a_greedy_round_applies_what_greedy_decides_for_the_snapshot(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy", remote_io_limit=3000) as (manager, requests):
            await manager.register_node("n1", "h1:1", 3000)
            fast = await add_dataset(manager, tmp_path / "fast", files=4, size=500)
            slow = await add_dataset(manager, tmp_path / "slow", files=4, size=500)
            await manager.register_job("ja", fast, 10_000, [Worker("n1", 1)])
            await manager.register_job("jb", slow, 1000, [Worker("n1", 1)])
            controller = Controller(manager, build_scheduler("greedy"), requests)
            expected = GreedyStorage().schedule(snapshot_of(manager, 3000, now=0.0), SiloDPerf())

            report = await controller.run_round("test")

            assert report.error == "" and report.refused == ()
            assert {uri: d.cache_quota_bytes for uri, d in manager.state.datasets.items()} == expected.cache_bytes
            assert {j.job_id: j.io_bytes_per_sec for j in manager.state.jobs.values()} == expected.io_bytes_per_sec
            assert expected.cache_bytes == {fast: 2000, slow: 1000}  # the scenario exercises both resources
            jb = report.estimates["jb"]
            assert (jb.ideal_bytes_per_sec, jb.cache_bytes, jb.dataset_bytes) == (1000, 1000, 2000)
            assert jb.throughput_bytes_per_sec == SiloDPerf().throughput(
                snapshot_of(manager, 3000, now=0.0).jobs["jb"], 1, 1000, jb.io_bytes_per_sec
            )
            again = await controller.run_round("test")
            assert again.applied == () and again.number == 2  # an unchanged state changes nothing

    asyncio.run(scenario())


def test_sjf_gives_remote_io_first_to_the_job_with_the_least_work_left_and_last_to_one_of_unknown_length(
    tmp_path: Path,
) -> None:
    """Three jobs alike but for their registered length, on a node without cache, and remote IO for two and a
    half of them. Registration order and ids favour the job of unknown length, then the long one: were
    lengths ignored (every job's remaining work infinite), ties would go their way."""

    async def scenario() -> None:
        async with owned_manager(tmp_path, "sjf", remote_io_limit=2500) as (manager, requests):
            await manager.register_node("n1", "h1:1", 0)
            for job_id, epochs in (("a-unknown", 0.0), ("b-long", 10.0), ("c-short", 0.07)):
                uri = await add_dataset(manager, tmp_path / job_id, files=4, size=500)
                await manager.register_job(job_id, uri, 1000, [Worker("n1", 1)], epochs=epochs)

            report = await Controller(manager, build_scheduler("sjf"), requests).run_round("test")

            assert report.error == "" and report.refused == ()
            rates = {job_id: job.io_bytes_per_sec for job_id, job in manager.state.jobs.items()}
            assert rates == {"c-short": 1000, "b-long": 1000, "a-unknown": 500}

    asyncio.run(scenario())


def test_a_job_registered_irregular_gets_storage_from_a_partition_of_its_own(tmp_path: Path) -> None:
    """Greedy alone would give all the cache to the curriculum job's dataset, ten times as cache-efficient;
    registered irregular, the job gets the storage share of the GPUs it holds, half, shared with no model."""

    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy", remote_io_limit=1000) as (manager, requests):
            await manager.register_node("n1", "h1:1", 1000)
            regular = await add_dataset(manager, tmp_path / "regular", files=4, size=500)
            curriculum = await add_dataset(manager, tmp_path / "curriculum", files=4, size=500)
            await manager.register_job("resnet", regular, 5000, [Worker("n1", 1)])
            await manager.register_job("curriculum", curriculum, 50_000, [Worker("n1", 1)], irregular=True)

            report = await Controller(manager, build_scheduler("greedy"), requests).run_round("test")

            assert report.error == "" and report.refused == ()
            quotas = {uri: d.cache_quota_bytes for uri, d in manager.state.datasets.items()}
            assert quotas == {regular: 500, curriculum: 500}
            assert {job_id: job.io_bytes_per_sec for job_id, job in manager.state.jobs.items()} == {
                "resnet": 500,
                "curriculum": 500,
            }
            assert report.notes["partition"] == ("regular cache 500 B, io 500 B/s; irregular cache 500 B, io 500 B/s")
            # SiloDPerf for the regular job, min(f*, b / (1 - c/d)); f* for the one SiloDPerf cannot model
            assert report.estimates["resnet"].throughput_bytes_per_sec == pytest.approx(500 / (1 - 500 / 2000))
            assert report.estimates["curriculum"].throughput_bytes_per_sec == 50_000

    asyncio.run(scenario())


def test_decreases_go_first_so_every_step_of_a_swap_is_within_the_limits(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed", remote_io_limit=1000) as (manager, requests):
            await manager.register_node("n1", "h1:1", 1000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            b = await add_dataset(manager, tmp_path / "b", files=2, size=500)
            await manager.register_job("ja", a, 5000, [Worker("n1", 1)])
            await manager.register_job("jb", b, 5000, [Worker("n1", 1)])
            for allocate in (
                allocations(manager).cache_size(a, 800),
                allocations(manager).cache_size(b, 200),
                allocations(manager).remote_io("ja", 900),
                allocations(manager).remote_io("jb", 100),
            ):
                await allocate
            with pytest.raises(FailedPrecondition):  # an increase first would break the node's capacity
                await allocations(manager).cache_size(b, 800)
            policy = FixedPolicy(cache={a: 200, b: 800}, io={"ja": 100, "jb": 900})

            report = await Controller(manager, scheduler_of(policy), requests).run_round("test")

            assert report.refused == ()
            assert [str(step) for step in report.applied] == [
                f"cache of {a} 800 B -> 200 B",
                "io of ja 900 B/s -> 100 B/s",
                f"cache of {b} 200 B -> 800 B",
                "io of jb 100 B/s -> 900 B/s",
            ]
            assert (manager.state.datasets[b].cache_quota_bytes, manager.state.jobs["jb"].io_bytes_per_sec) == (
                800,
                900,
            )

    asyncio.run(scenario())


def test_a_plan_releases_what_the_decision_leaves_out_and_leaves_later_changes_to_the_next_round() -> None:
    def dataset(uri: str, quota: int) -> Dataset:
        return Dataset(uri, {}, 100, 1, 1, 4096, "digest", cache_quota_bytes=quota)

    def job_state(job_id: str) -> JobState:
        return JobState(job_id, 0.0, 1, "file:///a", 100, 50.0, math.inf, placement=MappingProxyType({"n1": 1}))

    snapshot = Snapshot(
        time=0.0,
        nodes={"n1": NodeState("n1", 2, 1000)},
        remote_io_bytes_per_sec=100.0,
        datasets={uri: DatasetState(uri, 100) for uri in ("file:///a", "file:///idle")},
        jobs={"ja": job_state("ja"), "gone": job_state("gone")},
    )
    state = ClusterState(  # since the snapshot: job "gone" finished, dataset "new" was registered
        datasets=[dataset("file:///a", 30), dataset("file:///idle", 70), dataset("file:///new", 5)],
        jobs=[Job("ja", "file:///a", 50, (Worker("n1", 1),), io_bytes_per_sec=40)],
        nodes=[Node("n1", "h1:1", 1000)],
    )

    steps = plan(state, snapshot, Decision(cache_bytes={"file:///a": 30}, io_bytes_per_sec={"ja": 60}))

    assert steps == [Step("cache", "file:///idle", 70, 0), Step("io", "ja", 40, 60)]


@pytest.mark.expected_warnings
def test_a_refused_change_is_logged_with_the_reason_and_retried_next_round_while_the_rest_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="datamgr.controller")

    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("ja", a, 5000, [Worker("n1", 1)])
            policy = FixedPolicy(cache={a: 5000}, io={"ja": 300})  # more cache than the dataset has
            controller = Controller(manager, scheduler_of(policy), requests)

            first = await controller.run_round("test")
            second = await controller.run_round("test")
            policy.cache = {a: 6000}
            await controller.run_round("test")  # another refusal

            assert [str(step) for step in first.applied] == ["io of ja 0 B/s -> 300 B/s"]
            [(step, reason)] = first.refused
            assert step == Step("cache", a, 0, 5000)
            assert "larger than dataset" in reason
            assert second.refused == first.refused and second.applied == ()  # tried again
            status = controller.status()
            assert (status.rounds, status.last_round_changes) == (3, 0)
            assert [text.startswith(f"cache of {a} 0 B -> 5.9 KiB: ") for text in status.last_round_refusals] == [True]

    asyncio.run(scenario())
    [line, repeated, other] = [r for r in caplog.records if r.name == "datamgr.controller"]
    # The same refusal again is no news: it logged a WARNING every round, forever, where the policy kept asking.
    assert (line.levelno, repeated.levelno, other.levelno) == (logging.WARNING, logging.DEBUG, logging.WARNING)
    assert "larger than dataset" in line.getMessage()
    assert vars(line)["refused"][0]["reason"].startswith("cache_size_bytes 5000 is larger than dataset")


@pytest.mark.expected_warnings
def test_a_round_whose_policy_raises_is_logged_and_the_next_round_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("ja", a, 5000, [Worker("n1", 1)])
            controller = Controller(
                manager, scheduler_of(FailsOncePolicy(FixedPolicy({a: 1000}, {"ja": 300}))), requests
            )

            failed = await controller.run_round("test")
            assert failed.error == "RuntimeError: profile table not loaded yet"
            assert controller.status().last_round_error == failed.error
            assert manager.state.jobs["ja"].io_bytes_per_sec == 0

            retried = await controller.run_round("timer")
            assert retried.error == "" and len(retried.applied) == 2
            assert manager.state.jobs["ja"].io_bytes_per_sec == 300

    asyncio.run(scenario())
    failure = next(r for r in caplog.records if r.name == "datamgr.controller")
    assert failure.levelno == logging.ERROR and failure.exc_info is not None  # with the policy's traceback


def test_placements_a_policy_would_change_are_reported_and_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            await manager.register_node("n2", "h2:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            for job_id in ("stays", "moved", "preempted"):
                await manager.register_job(job_id, a, 5000, [Worker("n1", 1)])
            placements = {"stays": {"n1": 1}, "moved": {"n2": 1}}
            controller = Controller(manager, scheduler_of(FixedPolicy({a: 1000}, {}, placements)), requests)

            report = await controller.run_round("test")

            assert report.unapplied_placements == ("moved", "preempted")
            assert {job_id: job.node_ids for job_id, job in manager.state.jobs.items()} == {
                "stays": ("n1",),
                "moved": ("n1",),
                "preempted": ("n1",),
            }

    asyncio.run(scenario())
    line = next(r for r in caplog.records if r.name == "datamgr.controller")
    assert "placements not applied (the cluster scheduler's): moved, preempted" in line.getMessage()


@pytest.mark.expected_warnings
def test_a_policy_that_leaves_storage_undecided_fails_its_round_instead_of_freeing_everything(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "fifo") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("ja", a, 5000, [Worker("n1", 1)])
            await allocations(manager).remote_io("ja", 300)
            compute_only = Scheduler(FifoPolicy(), SiloDPerf(), "silod")  # not filled in by build_scheduler

            report = await Controller(manager, compute_only, requests).run_round("test")

            assert "left storage undecided" in report.error and report.applied == ()
            assert manager.state.jobs["ja"].io_bytes_per_sec == 300

    asyncio.run(scenario())


def test_manual_allocations_are_refused_naming_the_policy_that_owns_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy") as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("ja", a, 5000, [Worker("n1", 1)])
            with pytest.raises(FailedPrecondition, match=r"AllocateRemoteIO: the greedy policy allocates .*external"):
                await manager.allocate_remote_io("ja", 100)
            with pytest.raises(FailedPrecondition, match=r"AllocateCacheSize: the greedy policy"):
                await manager.allocate_cache_size(a, 100)
            assert manager.state.jobs["ja"].io_bytes_per_sec == 0
            assert manager.state.datasets[a].cache_quota_bytes == 0

    asyncio.run(scenario())


# ---- triggers ----


async def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll `check` on the event loop (which the controller shares) until it holds, bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.01)  # polling observable state, bounded by the deadline


@contextlib.asynccontextmanager
async def controller_running(controller: Controller) -> AsyncIterator[None]:
    """The controller's `run` as a task for the block's length, cancelled and awaited after it."""
    running = asyncio.create_task(controller.run())
    try:
        yield
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def test_a_burst_of_job_registrations_is_served_by_one_round(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            assert requests.take() == "registered node n1"  # a round of its own, had a controller been running
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            controller = Controller(manager, build_scheduler("greedy"), requests, round_seconds=3600)
            for i in range(5):  # before the controller runs: all of them wait for the same round
                await manager.register_job(f"j{i}", a, 1000, [Worker("n1", 1)])
            async with controller_running(controller):
                await wait_until(lambda: controller.status().rounds == 2, "the round after the start round")
            status = controller.status()
            assert status.last_round_trigger == "registered job j0, registered job j1, registered job j2 and 2 more"
            assert sum(j.io_bytes_per_sec for j in manager.state.jobs.values()) == 1000  # the limit, shared out

    asyncio.run(scenario())


def test_round_requests_coalesce_and_name_what_changed() -> None:
    async def scenario() -> None:
        requests = RoundRequests()
        assert not await requests.wait(0)
        for reason in ("registered job a", "registered job a", "finished job b"):
            requests.request(reason)
        assert await requests.wait(3600)
        assert requests.take() == "registered job a, finished job b"
        assert not await requests.wait(0)

    asyncio.run(scenario())


# ---- switching policies on a state dir ----


def test_a_policy_is_handed_only_the_job_states_it_wrote_after_a_switch_either_way(tmp_path: Path) -> None:
    """hived runs a job and keeps its cells as its state; restarted with tiresias-las, the state is not handed
    to Tiresias (it read it as a queue: every round failed) and is cleared; restarted with hived again, Tiresias's
    queue is not handed to HiveD either, and the job stays where it runs."""

    async def round_by(policy: str, *, new_job: str = "") -> tuple[DataManager, str]:
        async with owned_manager(tmp_path, policy) as (manager, requests):
            if new_job:
                uri = next(iter(manager.state.datasets))
                await manager.register_job(new_job, uri, 1000, [], gpus=1)
            report = await Controller(manager, build_scheduler(policy, "silod"), requests).run_round("test")
            assert report.error == ""
            return manager, ",".join(sorted(j for j, job in manager.state.jobs.items() if job.workers))

    async def scenario() -> None:
        async with owned_manager(tmp_path, "hived") as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000, gpus=2)
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("first", uri, 1000, [], gpus=1)
        manager, placed = await round_by("hived")
        assert placed == "first" and manager.history("first").policy_state["opportunistic"] == 1.0
        assert manager.history("first").policy_state_by == "hived"
        manager, placed = await round_by("tiresias-las", new_job="second")
        assert placed == "first,second"
        assert snapshot_of(manager, 1000, time.time()).jobs["first"].policy_state["queue"] == 0.0
        assert "opportunistic" not in manager.history("first").policy_state  # HiveD's cells are gone
        assert manager.history("first").policy_state_by == "tiresias-las"
        manager, placed = await round_by("hived", new_job="third")
        assert placed == "first,second"  # no GPU left for the third
        assert snapshot_of(manager, 1000, time.time()).jobs["first"].policy_state["opportunistic"] == 1.0

    asyncio.run(scenario())


# ---- nodes that stop reporting ----


def placed(manager: DataManager, job_id: str) -> list[tuple[str, int]]:
    """Where the policy placed a job: (node, GPUs) of its workers."""
    return [(worker.node_id, worker.count) for worker in manager.state.jobs[job_id].workers]


@pytest.mark.expected_warnings  # node n1 stopped reporting; marked unavailable
def test_no_job_is_placed_on_a_node_that_stopped_reporting_and_its_running_jobs_keep_their_gpus(
    tmp_path: Path,
) -> None:
    """n1's agent falls silent with 4 GPUs, 2 of them free: fifo saw them free and placed the next job there, on
    a node that may be gone, and nothing moved it. Now the snapshot shows only the GPUs n1's jobs hold, a placement
    there is refused, and once n1 reports again the job goes there."""
    clock = [0.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "fifo", clock=lambda: clock[0]) as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000, gpus=4)
            await manager.register_node("n2", "h2:1", 10_000, gpus=1)
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("first", uri, 1000, [], gpus=2)
            controller = Controller(manager, build_scheduler("fifo", "silod"), requests)
            assert (await controller.run_round("test")).error == ""
            assert placed(manager, "first") == [("n1", 2)]
            clock[0] = 60.0  # past the 30 s node timeout; n2 reports, n1 does not
            manager.report_usage("n2", [], [])
            assert manager.expire_nodes() == ["n1"]
            assert snapshot_of(manager, 1000, time.time()).nodes["n1"].gpus == 2  # its job's, none free
            await manager.register_job("second", uri, 1000, [], gpus=2)
            assert (await controller.run_round("test")).error == ""
            assert placed(manager, "second") == []  # pending: n2 has 1 GPU, n1 is silent
            assert placed(manager, "first") == [("n1", 2)]
            with pytest.raises(FailedPrecondition, match="node 'n1' is unavailable"):
                await allocations(manager).place("second", {"n1": 2})
            manager.report_usage("n1", [], [])  # back
            assert (await controller.run_round("test")).error == ""
            assert placed(manager, "second") == [("n1", 2)]

    asyncio.run(scenario())


@pytest.mark.expected_warnings  # the round's refusals
def test_a_job_whose_start_is_refused_is_given_no_remote_io_that_round(tmp_path: Path) -> None:
    # Before, the start was refused (n1 has 1 GPU, not 2) but the rate was applied: the job held remote IO that no
    # node read with, taken from the jobs that could, until the next round.
    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000, gpus=1)
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("big", uri, 1000, [], gpus=2)
            policy = FixedPolicy(cache={}, io={"big": 500}, placements={"big": {"n1": 2}})
            report = await Controller(manager, scheduler_of(policy), requests).run_round("test")
            assert manager.state.jobs["big"].io_bytes_per_sec == 0
            assert [reason for _, reason in report.refused][-1] == "its start was refused this round"
            assert "node 'n1' has 1 GPUs free for the policy, not 2" in report.refused[0][1]

    asyncio.run(scenario())


def test_the_cache_budget_counts_an_idle_node_that_offers_the_policy_gpus_so_a_job_can_start_there(
    tmp_path: Path,
) -> None:
    """n1 (15 KB of cache, 4 GPUs for the policy) runs nothing; n2 (30 KB) runs x on a 20 KB dataset. The budget
    was n2's cache alone: greedy kept the dataset's 20 KB quota, which n1 has no room for, so y's start there was
    refused round after round while n1's GPUs stayed free."""

    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy", remote_io_limit=10_000) as (manager, requests):
            await manager.register_node("n1", "h1:1", 15_000, gpus=4)
            await manager.register_node("n2", "h2:1", 30_000)
            uri = await add_dataset(manager, tmp_path / "a", files=20, size=1000)
            await manager.register_job("x", uri, 5000, [Worker("n2", 4)])
            await manager.register_job("y", uri, 5000, [], gpus=4)
            assert snapshot_of(manager, 10_000, time.time()).cache_capacity_bytes == 15_000
            controller = Controller(manager, build_scheduler("greedy", "silod"), requests)
            report = await controller.run_round("test")
            assert (report.error, report.refused) == ("", ())
            assert placed(manager, "y") == [("n1", 4)]
            assert manager.state.datasets[uri].cache_quota_bytes <= 15_000

    asyncio.run(scenario())


def test_jobs_trading_gpus_between_nodes_move_in_one_change_where_one_at_a_time_every_order_is_refused(
    tmp_path: Path,
) -> None:
    """A runs on n1's 4 GPUs and B on 2 of n2's 4; the policy moves A to n2, B to n1 and starts C on n1 (as sjf
    does when a short job arrives): A needs the GPUs B leaves, B those A leaves. Applied one at a time, each move
    was refused whatever the order, every round, and C waited with 2 GPUs free."""

    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000, gpus=4)
            await manager.register_node("n2", "h2:1", 10_000, gpus=4)
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            for job_id, gpus in (("A", 4), ("B", 2), ("C", 2)):
                await manager.register_job(job_id, uri, 1000, [], gpus=gpus)
            await allocations(manager).place("A", {"n1": 4})
            await allocations(manager).place("B", {"n2": 2})
            revision = manager.state.revision
            placements = {"A": {"n2": 4}, "B": {"n1": 2}, "C": {"n1": 2}}
            policy = FixedPolicy(cache={}, io={}, placements=placements)
            report = await Controller(manager, scheduler_of(policy), requests).run_round("test")
            assert (report.error, report.refused) == ("", ())
            assert {job_id: dict(placed(manager, job_id)) for job_id in placements} == placements
            assert manager.state.revision == revision + 1  # one change: nodes never see a half-done trade
            assert manager.history("A").preemptions == manager.history("B").preemptions == 0  # moved, not stopped

    asyncio.run(scenario())


@pytest.mark.expected_warnings  # the round's refusal
def test_moves_refused_together_are_tried_one_at_a_time_and_each_refusal_names_its_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000, gpus=2)
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("fits", uri, 1000, [], gpus=2)
            await manager.register_job("too-big", uri, 1000, [], gpus=3)
            policy = FixedPolicy(cache={}, io={}, placements={"fits": {"n1": 2}, "too-big": {"n1": 3}})
            report = await Controller(manager, scheduler_of(policy), requests).run_round("test")
            assert placed(manager, "fits") == [("n1", 2)] and placed(manager, "too-big") == []
            assert [(str(change), reason) for change, reason in report.refused] == [
                (
                    "start too-big (nothing -> n1:3)",
                    "placement of job 'too-big': node 'n1' has 0 GPUs free for the policy, not 3",
                )
            ]

    asyncio.run(scenario())


@pytest.mark.expected_warnings  # node n1 stopped reporting; marked unavailable
def test_a_node_registered_or_available_again_requests_a_round(tmp_path: Path) -> None:
    # A job waiting for GPUs waited for the timer (30 s by default) after a node joined or came back.
    clock = [0.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "fifo", clock=lambda: clock[0]) as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000, gpus=4)
            assert requests.take() == "registered node n1"
            await manager.register_node("n1", "h1:1", 10_000, gpus=4)  # the same registration again: nothing new
            assert not await requests.wait(0)
            clock[0] = 60.0  # past the node timeout
            assert manager.expire_nodes() == ["n1"]
            manager.report_usage("n1", [], [])
            assert requests.take() == "node n1 is available again"

    asyncio.run(scenario())


@dataclass
class RecordingPolicy:
    """Greedy's decisions, keeping every snapshot it was handed."""

    snapshots: list[Snapshot]
    name: str = "greedy"

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        self.snapshots.append(snapshot)
        return GreedyStorage().schedule(snapshot, estimator)


@pytest.mark.parametrize("reports", [True, False], ids=["node-reports", "node-silent"])
def test_a_restarted_controller_holds_its_first_round_until_the_nodes_running_jobs_report_their_usage(
    tmp_path: Path, reports: bool
) -> None:
    """Before, the first round after a restart saw the nodes' caches as empty (no report yet) and moved remote IO to
    the jobs reading them, for the next round to move it back. A node that stays silent holds the round no longer
    than the start's grace, the node timeout."""
    clock = [0.0]

    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy") as (manager, _):
            await manager.register_node("n1", "h1:1", 10_000)
            await manager.register_node("n2", "h2:1", 10_000)  # runs no job: not waited for
            uri = await add_dataset(manager, tmp_path / "a", files=4, size=500)
            await manager.register_job("j1", uri, 1000, [Worker("n1", 1)])
        async with owned_manager(tmp_path, "greedy", clock=lambda: clock[0]) as (manager, requests):
            policy = RecordingPolicy([])
            controller = Controller(manager, Scheduler(policy, SiloDPerf(), "silod"), requests, round_seconds=3600)
            async with controller_running(controller):
                await asyncio.sleep(0.5)  # several of the controller's polls
                assert controller.status().rounds == 0 and not policy.snapshots
                if reports:
                    manager.report_usage("n1", [DatasetUsage(uri, cached_bytes=1_500)], [JobUsage("j1")])
                else:
                    clock[0] = 31.0  # past the node timeout, 30 s
                await wait_until(lambda: controller.status().rounds == 1, "the start round")
            assert controller.status().last_round_trigger == "start"
            assert policy.snapshots[0].datasets[uri].cached_bytes == (1_500 if reports else 0)

    asyncio.run(scenario())


def test_a_grace_period_that_ends_while_a_restarted_controller_waits_for_reports_is_released_then(
    tmp_path: Path,
) -> None:
    """The release needs no usage report: held for the first round, a grace period ended up to the node timeout late
    after a restart, the job shown SUSPENDING past its `suspended_until` and the GPUs it held idle."""
    wall, clock = [1000.0], [0.0]

    async def before() -> None:
        async with owned_manager(tmp_path, "fixed", wall_clock=lambda: wall[0]) as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000, gpus=1)
            await manager.register_node("n2", "h2:1", 10_000)
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("w", uri, 1000, [Worker("n2", 1)])  # n2 runs a job: its report is awaited
            await manager.register_job("g", uri, 1000, [], gpus=1, grace_seconds=60)
            policy = FixedPolicy({}, {}, {"g": {"n1": 1}, "w": {"n2": 1}})
            controller = Controller(manager, scheduler_of(policy), requests)
            assert (await controller.run_round("test")).error == ""
            policy.placements = {"w": {"n2": 1}}
            assert (await controller.run_round("test")).error == ""
            assert manager.history("g").suspended_until == 1060.0

    async def after_a_restart() -> None:
        wall[0] = 1100.0  # the grace period ended while the data manager was down
        async with owned_manager(tmp_path, "fixed", wall_clock=lambda: wall[0], clock=lambda: clock[0]) as (
            manager,
            requests,
        ):
            controller = Controller(manager, scheduler_of(FixedPolicy({}, {})), requests, round_seconds=3600)
            async with controller_running(controller):
                await wait_until(lambda: not manager.history("g").suspending, "g released")
                assert controller.status().rounds == 0  # n2 has not reported: the first round still waits

    asyncio.run(before())
    asyncio.run(after_a_restart())


def test_a_controller_on_a_fresh_state_dir_runs_its_first_round_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with owned_manager(tmp_path, "greedy", clock=lambda: 0.0) as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)  # registered since the start: no report awaited
            uri = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("j1", uri, 1000, [Worker("n1", 1)])
            controller = Controller(manager, build_scheduler("greedy"), requests, round_seconds=3600)
            async with controller_running(controller):
                await wait_until(lambda: controller.status().rounds >= 1, "the start round", timeout=5)

    asyncio.run(scenario())


def test_a_round_that_repeats_the_one_before_logs_at_debug_and_one_that_changes_anything_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A timer's round on a cluster at rest repeats its predecessor's line: at one a minute with hundreds of jobs,
    # INFO lines that say nothing new would fill the log. The first round, and one whose decision or expectations
    # change, stay at INFO.
    caplog.set_level(logging.DEBUG, logger="datamgr.controller")

    async def scenario() -> list[int]:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("j1", a, 5000, [Worker("n1", 1)])
            policy = FixedPolicy({a: 1000}, {"j1": 500})
            controller = Controller(manager, scheduler_of(policy), requests)
            await controller.run_round("registered job j1")  # changes the allocation: INFO
            await controller.run_round("timer")  # the same decision and expectations: DEBUG
            await controller.run_round("timer")
            policy.io = {"j1": 800}
            await controller.run_round("timer")  # another rate: INFO
            await controller.run_round("timer")
            # A job that waits changes no allocation and no estimate; its round is where one looks for why it waits
            # (before, an idle cluster's operator saw no line for it at INFO).
            await manager.register_job("j2", a, 5000, [], gpus=2)
            await controller.run_round("registered job j2")  # INFO
            await controller.run_round("timer")
            return [r.levelno for r in caplog.records if r.name == "datamgr.controller" and "round " in r.getMessage()]

    levels = asyncio.run(scenario())
    assert levels == [
        logging.INFO,
        logging.DEBUG,
        logging.DEBUG,
        logging.INFO,
        logging.DEBUG,
        logging.INFO,
        logging.DEBUG,
    ]


def test_a_job_that_finishes_while_a_round_applies_its_changes_is_left_out_not_refused_interleaving_forced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """datamgr.md: jobs that go while the policy runs are left to the next round. A job finished between two of the
    round's changes (live, one finish in about 150 under churn) made its own change a refusal, logged as a WARNING
    (`io of j1 0 B/s -> 500 B/s: job_id: job 'j1' is not registered`). Forced: the finish, run right after the round's
    first change is applied."""

    async def scenario() -> RoundReport:
        async with owned_manager(tmp_path, "fixed") as (manager, requests):
            await manager.register_node("n1", "h1:1", 10_000)
            a = await add_dataset(manager, tmp_path / "a", files=2, size=500)
            await manager.register_job("j1", a, 5000, [Worker("n1", 1)])
            await manager.register_job("j2", a, 5000, [Worker("n1", 1)])
            cache_size = PolicyAllocations.cache_size

            async def cache_size_then_finish(self: PolicyAllocations, uri: str, size: int) -> tuple[Dataset, int]:
                answer = await cache_size(self, uri, size)
                await manager.finish_job("j1")
                return answer

            monkeypatch.setattr(PolicyAllocations, "cache_size", cache_size_then_finish)
            policy = FixedPolicy({a: 1000}, {"j1": 500, "j2": 400})
            report = await Controller(manager, scheduler_of(policy), requests).run_round("timer")
            assert "j1" not in manager.state.jobs and manager.state.jobs["j2"].io_bytes_per_sec == 400
            return report

    report = asyncio.run(scenario())
    assert not report.refused
    applied = [str(change) for change in report.applied]
    assert any(text.startswith("io of j2") for text in applied) and not any("j1" in text for text in applied)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---- what a job has read, across its runs ----


def test_srtf_resumes_a_preempted_job_by_what_it_read_before_and_its_progress_survives_a_restart(
    tmp_path: Path,
) -> None:
    """The tester's run: A (10 kB) read 8 kB, was preempted for the shorter B, and once B finished srtf started C
    (3 kB) over A (2 kB left), which it saw at 0 B read: what a job read was its nodes' current reports, and no node
    reports a preempted job (its agent counts it from 0 when it mounts it again). Now its history banks what it read
    as it leaves a node, and the bank outlives the data manager."""

    async def rounds() -> None:
        async with owned_manager(tmp_path, "srtf") as (manager, requests):
            controller = Controller(manager, build_scheduler("srtf", "silod"), requests)
            await manager.register_node("n1", "h1:1", 10_000, gpus=1)
            uri = await add_dataset(manager, tmp_path / "a", files=10, size=1000)
            await manager.register_job("A", uri, 1000, [], gpus=1, epochs=1)
            assert (await controller.run_round("test")).error == ""
            assert placed(manager, "A") == [("n1", 1)]
            manager.report_usage("n1", [], read("A", 4000))
            manager.report_usage("n1", [], read("A", 8000))
            await manager.register_job("B", uri, 1000, [], gpus=1, epochs=0.1)
            assert (await controller.run_round("test")).error == ""
            assert (placed(manager, "A"), placed(manager, "B")) == ([], [("n1", 1)])
            manager.report_usage("n1", [], read("B", 500))  # n1's agent removed A, mounted B
            assert done_bytes(manager, "A") == 8000  # was 0
            shown = queries.job_info(manager, "A")  # what `silod status` shows as READ: it showed 0 B
            assert (shown.bytes_read, read_text(shown)) == (8000, "7.8 KiB")
            await manager.register_job("C", uri, 1000, [], gpus=1, epochs=0.3)
            await manager.finish_job("B")
            assert (await controller.run_round("test")).error == ""
            assert (placed(manager, "A"), placed(manager, "C")) == ([("n1", 1)], [])  # 2 kB left against C's 3 kB
            manager.report_usage("n1", [], read("A", 1000))  # n1's agent counts A from 0 again
            assert done_bytes(manager, "A") == 9000

    async def after_a_restart() -> None:
        async with owned_manager(tmp_path, "srtf") as (manager, requests):
            assert done_bytes(manager, "A") == 8000  # the bank; its current run's until n1 reports again
            manager.report_usage("n1", [], read("A", 1500))
            assert done_bytes(manager, "A") == 9500
            assert (await Controller(manager, build_scheduler("srtf", "silod"), requests).run_round("test")).error == ""
            assert (placed(manager, "A"), placed(manager, "C")) == ([("n1", 1)], [])

    asyncio.run(rounds())
    asyncio.run(after_a_restart())
