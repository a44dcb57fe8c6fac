"""The allocation watch stream: a snapshot, then one event per revision for exactly what the node enforces;
a node that reconnects with its last revision gets what it missed, once, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from datamgr.client import DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from datamgr.watch import WatchClosed, WatchHub, WatchOverflow
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import STREAM_DEADLINE, NodeWatch, RunningDataManager, make_local_dataset, watch


def kinds(event: pb.WatchEvent) -> list[tuple[str, str]]:
    """(change kind, key) per change, e.g. ("job_set", "j1")."""
    result = []
    for change in event.changes:
        kind = change.WhichOneof("change")
        value = getattr(change, str(kind))
        key = value if isinstance(value, str) else getattr(value, "job_id", "") or value.uri
        result.append((str(kind), key))
    return result


@pytest.fixture
def cluster(datamgr: RunningDataManager, tmp_path: Path) -> tuple[DataManagerClient, str, str]:
    client = datamgr.client
    client.register_node("n1", "h1:1", 1_000_000)
    client.register_node("n2", "h2:1", 1_000_000)
    a = make_local_dataset(tmp_path / "a")
    b = make_local_dataset(tmp_path / "b")
    client.register_dataset(a)
    client.register_dataset(b)
    client.register_job("j1", a, 10_000_000, [("n1", 1)])
    return client, a, b


def test_watch_sends_a_snapshot_then_each_change_for_the_node_in_order(
    cluster: tuple[DataManagerClient, str, str],
) -> None:
    client, a, b = cluster
    stream = watch(client, "n1")
    snapshot = stream.next()
    assert snapshot.HasField("snapshot")
    assert [j.job_id for j in snapshot.snapshot.jobs] == ["j1"]
    assert [d.uri for d in snapshot.snapshot.datasets] == [a]

    r_cache = client.allocate_cache_size(a, 4000).revision
    r_io = client.allocate_remote_io("j1", 5_000_000).revision
    client.register_job("elsewhere", b, 1, [("n2", 1)])  # not n1's business: no event
    r_job = client.register_job("j2", b, 1_000, [("n1", 1), ("n2", 1)]).revision
    r_io2 = client.allocate_remote_io("j2", 3001).revision
    r_finish = client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j2")).revision

    events = [stream.next() for _ in range(5)]
    assert [e.revision for e in events] == [r_cache, r_io, r_job, r_io2, r_finish]
    assert events[0].changes[0].dataset_set.cache_quota_bytes == 4000
    assert events[1].changes[0].job_set.io_bytes_per_sec == 5_000_000
    assert kinds(events[2]) == [("dataset_set", b), ("job_set", "j2")]
    assert events[3].changes[0].job_set.io_bytes_per_sec == 1501  # half of 3001, remainder to the first node
    assert kinds(events[4]) == [("job_removed", "j2"), ("dataset_removed", b)]
    assert not any(e.HasField("snapshot") for e in events)


def test_reconnecting_with_the_last_revision_resumes_without_loss_or_duplication(
    cluster: tuple[DataManagerClient, str, str],
) -> None:
    client, a, _ = cluster
    stream = watch(client, "n1")
    last = stream.next().revision
    client.allocate_remote_io("j1", 1)
    last = stream.next().revision
    stream.cancel()

    missed = [client.allocate_remote_io("j1", rate).revision for rate in (2, 3, 4)]
    missed.append(client.allocate_cache_size(a, 10).revision)
    resumed = watch(client, "n1", since=last)
    replayed = [resumed.next() for _ in missed]
    assert [e.revision for e in replayed] == missed
    assert [e.changes[0].job_set.io_bytes_per_sec for e in replayed[:3]] == [2, 3, 4]
    assert not any(e.HasField("snapshot") for e in replayed)

    live = client.allocate_remote_io("j1", 5).revision
    assert resumed.next().revision == live


@pytest.mark.parametrize("since", [10_000, -1 % 2**64], ids=["ahead-of-server", "huge"])
def test_a_revision_the_server_never_had_gets_a_fresh_snapshot(
    cluster: tuple[DataManagerClient, str, str], since: int
) -> None:
    client, _, _ = cluster
    first = watch(client, "n1", since=since).next()
    assert first.HasField("snapshot")
    assert [j.job_id for j in first.snapshot.jobs] == ["j1"]


def test_a_subscriber_that_falls_behind_is_told_to_resume_instead_of_buffering_forever() -> None:
    async def scenario() -> None:
        hub: WatchHub[pb.WatchEvent] = WatchHub(backlog=2)
        with hub.subscribe("n1") as subscription:
            for revision in (1, 2, 3):
                hub.publish("n1", pb.WatchEvent(revision=revision))
            assert (await subscription.next()).revision == 1
            assert (await subscription.next()).revision == 2
            with pytest.raises(WatchOverflow):
                await subscription.next()
        assert hub.watcher_count("n1") == 0

    asyncio.run(scenario())


def test_a_subscriber_that_fell_behind_gets_no_event_past_the_first_one_dropped() -> None:
    # A reader still taking events freed room for later ones: it got 1, 2, 3, then 6, missing 4 and 5, and went on
    # with that hole until its queue emptied (a node resuming from 6 never got 4 and 5; a launcher acted on a view
    # with a hole). Its stream must end where the hole would begin.
    async def scenario() -> None:
        hub: WatchHub[pb.WatchEvent] = WatchHub(backlog=3)
        with hub.subscribe("n1") as subscription:
            got: list[int | str] = []
            for revision in (1, 2, 3, 4):
                hub.publish("n1", pb.WatchEvent(revision=revision))  # 4 is dropped: the queue holds 3
            got.append((await subscription.next()).revision)
            for revision in (5, 6):
                hub.publish("n1", pb.WatchEvent(revision=revision))
            while len(got) < 10:
                try:
                    got.append((await subscription.next()).revision)
                except WatchOverflow:
                    got.append("overflow")
                    break
            assert got == [1, 2, 3, "overflow"]

    asyncio.run(scenario())


def test_a_closed_hub_ends_its_streams_after_what_they_have_queued_and_every_stream_opened_later() -> None:
    async def scenario() -> None:
        hub: WatchHub[pb.WatchEvent] = WatchHub(backlog=2)
        with hub.subscribe("n1") as waiting, hub.subscribe("n1") as behind:
            blocked = asyncio.create_task(waiting.next())
            await asyncio.sleep(0)
            for revision in (1, 2):
                hub.publish("n1", pb.WatchEvent(revision=revision))
            assert (await blocked).revision == 1
            hub.close()
            assert (await waiting.next()).revision == 2
            assert [(await behind.next()).revision for _ in range(2)] == [1, 2]  # its queue was full when closed
            for subscription in (waiting, behind):
                with pytest.raises(WatchClosed):
                    await subscription.next()
        with hub.subscribe("n2") as late, pytest.raises(WatchClosed):
            await late.next()

    asyncio.run(scenario())


def test_a_stopping_data_manager_ends_open_watch_streams_at_once_saying_so(tmp_path: Path) -> None:
    # They were cancelled at the end of the server's grace period, and grpcio now and then logged the cancellation
    # as an ERROR with a traceback.
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 1_000_000_000, 3600.0)
    with EmbeddedDataManager(config) as datamgr, DataManagerClient(datamgr.address, timeout=10) as client:
        client.register_node("n1", "h1:1", 1_000_000)
        stream = watch(client, "n1")
        assert stream.next().HasField("snapshot")
        datamgr.stop()
        with pytest.raises(grpc.RpcError) as ended:
            stream.next()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ended.value.details() == "the data manager is stopping; reconnect once it is back"


def test_resuming_with_nothing_missed_starts_with_an_empty_event_at_the_current_revision(
    cluster: tuple[DataManagerClient, str, str],
) -> None:
    client, _, _ = cluster
    stream = watch(client, "n1")
    current = stream.next().revision
    stream.cancel()
    resumed = watch(client, "n1", since=current)
    marker = resumed.next()
    assert (marker.revision, len(marker.changes), marker.HasField("snapshot")) == (current, 0, False)
    live = client.allocate_remote_io("j1", 7).revision
    assert resumed.next().revision == live


def test_every_stream_names_its_history_and_a_revision_of_another_gets_a_fresh_snapshot(
    cluster: tuple[DataManagerClient, str, str],
) -> None:
    """A node resumes with its revision and the history the stream named: the same number in another history of the
    state (a state dir restored from an older copy) names other changes, so it gets a snapshot. A node from before
    histories (0) resumes by its revision alone, as it always did."""
    client, _, _ = cluster
    stream = watch(client, "n1")
    first = stream.next()
    history = first.history
    assert history != 0
    current = client.allocate_remote_io("j1", 2).revision
    live = stream.next()
    assert (live.revision, live.history) == (current, 0)  # only a stream's first event names it
    stream.cancel()

    def first_event(history: int) -> pb.WatchEvent:
        request = pb.WatchAllocationsRequest(node_id="n1", since_revision=current, history=history)
        resumed = NodeWatch(client.stub.WatchAllocations(request, timeout=STREAM_DEADLINE))
        event = resumed.next()
        resumed.cancel()
        return event

    same, other, unknown = first_event(history), first_event(1 if history != 1 else 2), first_event(0)
    assert [e.HasField("snapshot") for e in (same, other, unknown)] == [False, True, False]
    assert [j.job_id for j in other.snapshot.jobs] == ["j1"] and other.revision == current
    assert {e.history for e in (same, other, unknown)} == {history}  # every stream names the history it is in
