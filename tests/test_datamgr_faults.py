"""Control-plane faults driven against the real data manager (`silod datamgr serve` as a subprocess) and, where
the fault concerns nodes, a real node agent with its FUSE mount.

- The data manager's state disk fills up: allocations are refused with RESOURCE_EXHAUSTED and change nothing;
  the server keeps serving its state and accepts the next allocation once space is freed. Its own write-ahead log
  never holds the disk's last room, and gives back what it holds when the disk fills (or the refusal says what
  keeps it from doing so).
- The state disk meets an error and turns read-only: allocations are refused with FAILED_PRECONDITION naming
  it; after a repair and a restart nothing acknowledged is lost.
- The connection between a node agent and the data manager goes silent without closing (half-open): keepalive
  finds it and the agent follows the data manager again over a new connection.
- The wall clock is stepped a day forward and back (an NTP step) under a running data manager and node agent,
  with libfaketime: liveness, allocations, watches and token buckets go by monotonic clocks and do not notice.
- The wall clock is stepped a day back or forward while a job preempted by FitGpp keeps its GPUs for its grace
  period: the data manager's own clock (`datamgr.clocks`) ends the period in real time.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import grpc
import pytest

from datamgr.client import ClientError, DataManagerClient
from datamgr.store.sqlite import read_only
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.cluster_fixtures import SIZE, System, eventually
from tests.datamgr_fixtures import DataManagerProcess, full_state, make_local_dataset, silod_cli, watch
from tests.disks import Ext4Factory, PosixFaults, TmpfsFactory, fail_ext4, repair_ext4
from tests.mount_fixtures import MountProcess
from tests.net_faults import connection_ports, silenced_connections
from tests.rate_sampling import WINDOW, Sample, assert_held_to, readers_demanding_more, sample
from tests.state_files import linked_state_dir
from tests.storage_servers import missing_dependency

STATE_DISK_SIZE = "512k"  # room for the state dir of a small cluster, and little more
PAGE = 4096
REFUSED_ROUNDS = 2  # the first refusal must leave the store able to refuse the next one as cleanly


# --- the state disk fills up ------------------------------------------------------------------------------


@pytest.fixture
def state_disk(tmpfs: TmpfsFactory, tmp_path: Path) -> Path:
    """A tmpfs of STATE_DISK_SIZE: a real file system that fills up (ENOSPC), for the data manager's state."""
    return tmpfs(tmp_path / "state-disk", STATE_DISK_SIZE)


@pytest.fixture
def datamgr_on_state_disk(state_disk: Path, tmp_path: Path) -> Iterator[DataManagerProcess]:
    """A not-yet-started data manager whose state dir is on `state_disk` (its log is not), stopped before the
    disk is unmounted."""
    proc = DataManagerProcess(state_disk / "state", tmp_path / "datamgr.log", "--remote-io-limit", "1GB/s")
    try:
        yield proc
    finally:
        proc.stop()


def fill(disk: Path) -> Path:
    """Write a file on `disk` until the file system refuses more (ENOSPC), then give back one page: the next
    commit starts and runs out of room midway, leaving a partial write in the log. Returns the file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    block = b"\xff" * PAGE
    try:
        while True:
            os.write(fd, block)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    os.truncate(filler, filler.stat().st_size - PAGE)
    assert os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize == PAGE
    return filler


def _cluster(client: DataManagerClient, tmp_path: Path) -> str:
    """A node, a dataset with a quota and a job with a rate on it; returns the dataset's URI."""
    client.register_node("n1", "h1:1", 1_000_000)
    uri = make_local_dataset(tmp_path / "ds", files=12, size=4000)
    client.register_dataset(uri)
    client.register_job("j1", uri, 50_000_000, [("n1", 1)])
    client.allocate_cache_size(uri, 20_000)
    client.allocate_remote_io("j1", 30_000_000)
    return uri


def _manifest(client: DataManagerClient, uri: str) -> bytes:
    return b"".join(c.data for c in client.stub.GetManifest(pb.GetManifestRequest(dataset_uri=uri), timeout=10))


def _node_view(client: DataManagerClient) -> tuple[int, int, int]:
    """What a node watching afresh is told: (revision, its job's rate, its dataset's quota)."""
    stream = watch(client, "n1")
    event = stream.next()
    stream.cancel()
    return event.revision, event.snapshot.jobs[0].io_bytes_per_sec, event.snapshot.datasets[0].cache_quota_bytes


def _resumed(client: DataManagerClient, since: int) -> pb.WatchEvent:
    """The first event a node resuming its watch from revision `since` gets."""
    stream = watch(client, "n1", since=since)
    event = stream.next()
    stream.cancel()
    return event


def _assert_refused(
    client: DataManagerClient,
    uri: str,
    code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED,
    reason: str = "state disk is full",
) -> None:
    """Both allocation calls, with values never acknowledged, are refused with `code`, saying `reason`."""
    for refused in (lambda: client.allocate_remote_io("j1", 7_000_000), lambda: client.allocate_cache_size(uri, 5_000)):
        with pytest.raises(ClientError) as caught:
            refused()
        assert caught.value.code == code, caught.value
        assert reason in str(caught.value)


def test_a_full_state_disk_refuses_allocations_cleanly_keeps_serving_and_recovers_when_freed(
    datamgr_on_state_disk: DataManagerProcess, state_disk: Path, tmp_path: Path
) -> None:
    """SQLite answers SQLITE_FULL; callers get RESOURCE_EXHAUSTED, not UNAVAILABLE, which would tell clients to
    retry with backoff when no retry can succeed before an operator frees space. Refused changes are undone in
    memory and on disk, so the state served, and the state a kill -9 and restart finds, is the last acknowledged
    one, even over the partial write the first refusal leaves behind."""
    datamgr = datamgr_on_state_disk.start()
    with DataManagerClient(datamgr.address, timeout=10) as client:
        uri = _cluster(client, tmp_path)
        acknowledged, manifest, view = full_state(client), _manifest(client, uri), _node_view(client)
        filler = fill(state_disk)

        for _ in range(REFUSED_ROUNDS):
            _assert_refused(client, uri)
        for argv in (("alloc", "io", "j1", "9MB/s"), ("alloc", "cache", uri, "6000")):
            cli = silod_cli(*argv, datamgr=datamgr.address)
            assert cli.returncode == 1, cli.stderr
            assert "RESOURCE_EXHAUSTED" in cli.stderr and "state disk is full" in cli.stderr, cli.stderr
            assert "Traceback" not in cli.stderr

        assert datamgr.process is not None and datamgr.process.poll() is None, "the data manager died"
        assert full_state(client) == acknowledged  # the revision too: a refused change leaves no number behind
        assert _manifest(client, uri) == manifest
        assert _node_view(client) == view
        assert _resumed(client, view[0]).revision == view[0]  # told it is current at the last durable revision
        log = datamgr.log_path.read_text()
        assert "state disk is full" in log
        assert "Traceback" not in log, log

    datamgr.kill()  # on the still-full disk, over the partial write the first refusal left
    with DataManagerClient(datamgr.start().address, timeout=10) as client:
        assert full_state(client) == acknowledged
        _assert_refused(client, uri)

        filler.unlink()
        assert client.allocate_remote_io("j1", 11_000_000).revision == view[0] + 1
        assert client.allocate_cache_size(uri, 12_000).revision == view[0] + 2
        last = full_state(client)
        # A node that resumed during the outage gets the first change after it, numbered as no refusal was.
        resumed = _resumed(client, view[0])
        assert (resumed.revision, resumed.changes[0].job_set.io_bytes_per_sec) == (view[0] + 1, 11_000_000)

    datamgr.kill()
    with DataManagerClient(datamgr.start().address, timeout=10) as client:
        assert full_state(client) == last
        assert _node_view(client) == (view[0] + 2, 11_000_000, 12_000)
    assert "Traceback" not in datamgr.log_path.read_text()


@pytest.mark.expected_warnings  # the agent's "waiting for the data manager"
def test_a_node_agent_registering_while_the_state_disk_is_full_says_why_it_waits_and_registers_once_freed(
    datamgr_on_state_disk: DataManagerProcess, state_disk: Path, tmp_path: Path
) -> None:
    """A refusal that waiting may cure (the data manager's state disk full) keeps the agent waiting, serving its
    mount, and its log gives the data manager's reason, not the bare status code."""
    datamgr = datamgr_on_state_disk.start()
    filler = fill(state_disk)
    node = MountProcess.node(tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", "1GiB")
    try:
        node.start()
        waiting = eventually(
            lambda: node.log_lines("waiting for the data manager"),
            what="the agent waiting",
        )
        assert "(RESOURCE_EXHAUSTED: the data manager's state disk is full" in waiting[0], waiting[0]
        filler.unlink()
        with DataManagerClient(datamgr.address, timeout=10) as client:
            eventually(
                lambda: client.call(client.stub.GetNode, pb.GetNodeRequest(node_id="n1")),
                timeout=30.0,  # the agent's backoff reaches 10 s between tries
                what="the node registered once space was freed",
            )
        assert "Traceback" not in node.log_path.read_text()
    finally:
        node.stop()


CHANGES_ON_A_SMALL_DISK = 300  # a data manager's own log filled a 512 KiB state disk after 34-77 changes


def test_a_state_disk_only_the_data_managers_own_log_fills_takes_every_change_without_a_restart(
    datamgr_on_state_disk: DataManagerProcess, state_disk: Path, tmp_path: Path
) -> None:
    """The state dir alone on a small disk, as a small cluster's is. SQLite folded its write-ahead log into the
    database only every 1000 pages (4 MiB), so the log filled the disk after a few dozen changes, and every change
    after was refused as "state disk is full" with nothing the operator could delete (only a restart, whose close
    folds the log in, freed it). Now the log is folded in every 100 pages, and after every commit on a disk with
    less room than that, so it never holds the disk's last room."""
    datamgr = datamgr_on_state_disk.start()
    with DataManagerClient(datamgr.address, timeout=10) as client:
        _cluster(client, tmp_path)
        first = client.allocate_remote_io("j1", 1).revision
        for rate in range(2, CHANGES_ON_A_SMALL_DISK + 1):
            assert client.allocate_remote_io("j1", rate).revision == first + rate - 1
        changed = full_state(client)
    datamgr.kill()
    with DataManagerClient(datamgr.start().address, timeout=10) as client:
        assert full_state(client) == changed
        assert _node_view(client)[:2] == (first + CHANGES_ON_A_SMALL_DISK - 1, CHANGES_ON_A_SMALL_DISK)


def _state_disk_with_a_log(
    tmpfs: TmpfsFactory, tmp_path: Path, size: str
) -> tuple[DataManagerProcess, DataManagerClient, str]:
    """A data manager on a tmpfs of `size`, holding a dataset no job reads, started afresh (its log empty, so that
    the changes it then writes to its log are all there is to fold into the database), and a client of it; returns
    them and the dataset's URI. Each change of the dataset's quota rewrites pages the database has, and adds none."""
    disk = tmpfs(tmp_path / "state-disk", size)
    datamgr = DataManagerProcess(disk / "state", tmp_path / "datamgr.log", "--remote-io-limit", "1GB/s")
    with DataManagerClient(datamgr.start().address, timeout=10) as client:
        uri = make_local_dataset(tmp_path / "ds", files=4, size=1000)
        client.register_dataset(uri)
    assert datamgr.terminate() == 0
    return datamgr, DataManagerClient(datamgr.start().address, timeout=30), uri


def test_a_full_state_disk_whose_room_the_data_managers_log_holds_takes_the_change_once_the_log_is_folded_in(
    tmpfs: TmpfsFactory, tmp_path: Path
) -> None:
    """Another file fills the disk while the log holds changes: the change that finds it full gets the room the
    log held, folded into the database, and is taken. It was refused, and so was every change after, until a
    restart: SQLite folds its log in only after a commit that succeeded."""
    datamgr, client, uri = _state_disk_with_a_log(tmpfs, tmp_path, "2m")
    try:
        with client:
            for quota in range(1, 11):
                client.allocate_cache_size(uri, quota)
            log = datamgr.state_dir / "silod.db-wal"
            assert log.stat().st_size > 10 * PAGE  # the ten changes, not yet folded in
            fill(datamgr.state_dir.parent)
            revision = client.allocate_cache_size(uri, 3_000).revision
            changed = full_state(client)
            assert log.stat().st_size < 10 * PAGE
        datamgr.kill()
        with DataManagerClient(datamgr.start().address, timeout=10) as client:
            assert full_state(client) == changed
            dataset = client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=uri))
            assert dataset.cache_quota_bytes == 3_000
            assert client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision == revision
    finally:
        datamgr.stop()


def test_a_change_refused_while_a_reader_keeps_the_log_from_being_folded_in_names_the_log_and_the_reader(
    tmpfs: TmpfsFactory, tmp_path: Path
) -> None:
    """A reader of the database (an sqlite3 shell, a backup of a large state) keeps SQLite from folding the log
    into it, so the log grows until the disk is full. The refusal says that the log holds the room and what keeps
    it, not only "free space", which the operator may not find on a disk that holds the state dir alone; once the
    reader is done, the next change is taken without a restart."""
    datamgr, client, uri = _state_disk_with_a_log(tmpfs, tmp_path, "1m")
    database = datamgr.state_dir / "silod.db"
    try:
        with client, contextlib.closing(read_only(database)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM datasets").fetchone()  # holds the database as of now
            with pytest.raises(ClientError) as refused:
                for quota in range(1, 1_000):
                    acknowledged = client.allocate_cache_size(uri, quota).revision
            reader.rollback()
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
            said = str(refused.value)
            assert (
                f"the data manager's state disk is full: nothing was changed; its write-ahead log {database}-wal"
                in said
            )
            assert "a reader holds the database: an sqlite3 shell, a backup): end the reader" in said, said

            assert client.allocate_cache_size(uri, 3_000).revision == acknowledged + 1
        assert "Traceback" not in datamgr.log_path.read_text()
    finally:
        datamgr.stop()


# --- the state disk fails and turns read-only --------------------------------------------------------------

UNWRITABLE = "cannot write its state disk"


def test_a_state_disk_turned_read_only_by_an_error_refuses_changes_by_name_keeps_serving_and_loses_nothing(
    ext4: Ext4Factory, tmp_path: Path
) -> None:
    """ext4 mounted errors=remount-ro, as production disks are, refuses every write after its first error
    (EROFS), under the open database. Changes are refused with FAILED_PRECONDITION naming the state file and
    the file system's answer, not UNKNOWN with a traceback; reads, watches and manifests go on. Once the operator
    has stopped the data manager, checked the disk and mounted it again, a restart serves the last acknowledged
    state, and the next change takes the revision the refused ones never used."""
    disk = ext4(tmp_path / "state-disk", 16 * 1024 * 1024)
    datamgr = DataManagerProcess(disk / "state", tmp_path / "datamgr.log", "--remote-io-limit", "1GB/s")
    try:
        with DataManagerClient(datamgr.start().address, timeout=10) as client:
            uri = _cluster(client, tmp_path)
            acknowledged, manifest, view = full_state(client), _manifest(client, uri), _node_view(client)
            fail_ext4(disk)

            for _ in range(REFUSED_ROUNDS):
                _assert_refused(client, uri, grpc.StatusCode.FAILED_PRECONDITION, UNWRITABLE)
            cli = silod_cli("alloc", "io", "j1", "9MB/s", datamgr=datamgr.address)
            assert cli.returncode == 1, cli.stderr
            for said in ("FAILED_PRECONDITION", UNWRITABLE, str(disk / "state" / "silod.db"), "Read-only file system"):
                assert said in cli.stderr, cli.stderr
            assert "Traceback" not in cli.stderr

            assert datamgr.process is not None and datamgr.process.poll() is None, "the data manager died"
            assert full_state(client) == acknowledged
            assert _manifest(client, uri) == manifest
            assert _node_view(client) == view
            log = datamgr.log_path.read_text()
            assert UNWRITABLE in log or "could not persist" in log
            assert "Traceback" not in log, log

        datamgr.kill()
        repair_ext4(disk)
        with DataManagerClient(datamgr.start().address, timeout=10) as client:
            assert full_state(client) == acknowledged
            assert client.allocate_remote_io("j1", 11_000_000).revision == view[0] + 1
            assert _node_view(client) == (view[0] + 1, 11_000_000, view[2])
        assert "Traceback" not in datamgr.log_path.read_text()
    finally:
        datamgr.stop()


def test_a_linked_database_whose_volume_turns_read_only_is_refused_with_that_volumes_answer(
    ext4: Ext4Factory, tmp_path: Path
) -> None:
    """`silod.db` linking to a database on another volume: SQLite reports the failed write only as "disk I/O error",
    and the file system's own answer was asked of the state dir's disk, which writes, so the refusal never said the
    volume was read-only."""
    volume = ext4(tmp_path / "volume", 16 * 1024 * 1024)
    made = DataManagerProcess(volume, tmp_path / "made.log", "--remote-io-limit", "1GB/s")
    made.start()
    assert made.terminate() == 0
    (volume / "lock").unlink()
    linked_state_dir(tmp_path / "state", volume)
    datamgr = DataManagerProcess(tmp_path / "state", tmp_path / "datamgr.log", "--remote-io-limit", "1GB/s")
    try:
        with DataManagerClient(datamgr.start().address, timeout=10) as client:
            _cluster(client, tmp_path)
            fail_ext4(volume)
            with pytest.raises(ClientError) as refused:
                client.allocate_remote_io("j1", 7_000_000)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        assert "(Read-only file system)" in str(refused.value), refused.value
    finally:
        datamgr.stop()


# --- a flush of the state disk fails and the disk stays writable (faked: libfiu) ---------------------------------

MAY_REAPPEAR = "a restart of the data manager before its next successful write may bring it back"


def _flaky_state_disk(tmp_path: Path) -> tuple[DataManagerProcess, PosixFaults]:
    flushes = PosixFaults()
    datamgr = DataManagerProcess(
        tmp_path / "state", tmp_path / "datamgr.log", "--remote-io-limit", "1GB/s", launcher=flushes.launcher
    )
    return datamgr, flushes


def _start_failable(datamgr: DataManagerProcess, flushes: PosixFaults) -> str:
    datamgr.start()
    assert datamgr.process is not None
    flushes.pid = datamgr.process.pid
    return datamgr.address


def test_a_change_refused_on_a_failed_flush_stays_refused_after_a_crash_and_the_next_needs_no_restart_faked_eio(
    tmp_path: Path,
) -> None:
    """SQLite writes a commit's whole transaction to its log, then flushes it; when the flush fails (EIO) it rolls
    the change back in memory but leaves it in the log, and a restart replays every complete transaction it finds
    there. So a data manager that said "nothing was changed" and was then killed came back with the change. It now
    erases the log after such a failure: the refused change never comes back, and the next change is written
    without a restart, taking the revision the refused one never used."""
    datamgr, flushes = _flaky_state_disk(tmp_path)
    try:
        with DataManagerClient(_start_failable(datamgr, flushes), timeout=10) as client:
            uri = _cluster(client, tmp_path)
            acknowledged, view = full_state(client), _node_view(client)
            flushes.fail_next(PosixFaults.FLUSHES)
            _assert_refused_once(client, "nothing was changed")
            assert full_state(client) == acknowledged
        datamgr.kill()  # at once: nothing written since the refusal can hide what the disk holds

        with DataManagerClient(_start_failable(datamgr, flushes), timeout=10) as client:
            assert full_state(client) == acknowledged, "the refused change came back after a restart"
            flushes.fail_next(PosixFaults.FLUSHES)
            _assert_refused_once(client, "nothing was changed")
            assert client.allocate_cache_size(uri, 6_000).revision == view[0] + 1  # no restart in between
            changed = full_state(client)
        datamgr.kill()

        with DataManagerClient(_start_failable(datamgr, flushes), timeout=10) as client:
            assert full_state(client) == changed
            assert _node_view(client) == (view[0] + 1, view[1], 6_000)
        log = datamgr.log_path.read_text()
        assert "could not persist revisions" in log and "Traceback" not in log, log
    finally:
        datamgr.stop()


def test_a_change_whose_flushes_keep_failing_is_refused_as_one_a_restart_may_bring_back_faked_eio(
    tmp_path: Path,
) -> None:
    """While the disk keeps failing, the log holding the refused change cannot be erased either: the caller, the
    CLI and the log say that a restart before the next successful write may bring it back, and it does (SQLite
    replays it), which is why the message cannot say "nothing was changed". Meanwhile the change is not served."""
    datamgr, flushes = _flaky_state_disk(tmp_path)
    try:
        with DataManagerClient(_start_failable(datamgr, flushes), timeout=10) as client:
            _cluster(client, tmp_path)
            acknowledged, view = full_state(client), _node_view(client)
            flushes.fail_every(PosixFaults.FLUSHES)
            _assert_refused_once(client, MAY_REAPPEAR)
            cli = silod_cli("alloc", "io", "j1", "9MB/s", datamgr=datamgr.address)
            assert cli.returncode == 1 and MAY_REAPPEAR in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
            assert full_state(client) == acknowledged
            assert _node_view(client) == view
        log = datamgr.log_path.read_text()
        assert "a restart before the next successful write may bring them back" in log, log
        datamgr.kill()

        with DataManagerClient(_start_failable(datamgr, flushes), timeout=10) as client:
            assert _node_view(client)[:2] == (view[0] + 1, 9_000_000), "the last refused change is back, as warned"
    finally:
        datamgr.stop()


@pytest.mark.expected_warnings  # "resumes from revision 1 with a snapshot: the event log cannot be read"
def test_a_state_disk_failing_reads_refuses_manifests_by_name_and_resumes_watches_from_memory_faked_eio(
    tmp_path: Path,
) -> None:
    """Reads of the state disk answering EIO (libfiu fails the data manager's `pread`s): a manifest, which only the
    disk holds, is refused with FAILED_PRECONDITION naming the dataset and the disk, where it was UNKNOWN
    "Unexpected <class 'sqlite3.OperationalError'>" with a traceback; a node resuming its watch, whose missed events
    are on disk, gets a snapshot of the state in memory instead, and changes go on. Once the disk reads again,
    both are as before."""
    datamgr, faults = _flaky_state_disk(tmp_path)
    try:
        with DataManagerClient(_start_failable(datamgr, faults), timeout=10) as client:
            uri = _cluster(client, tmp_path)
            manifest = _manifest(client, uri)
            client.allocate_cache_size(uri, 10_000)  # a change: the reader's cached pages are stale, reads go to disk
            view = _node_view(client)
            faults.fail_every(PosixFaults.PREADS)
            with pytest.raises(grpc.RpcError) as caught:
                _manifest(client, uri)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            said = caught.value.details() or ""
            assert f"cannot read the manifest of {uri} from its state disk: {datamgr.state_dir / 'silod.db'}: " in said
            assert "disk I/O error" in said or "malformed" in said  # SQLite's words for a failed read of the log
            resumed = _resumed(client, 1)
            assert resumed.HasField("snapshot") and resumed.revision == view[0]
            assert client.allocate_remote_io("j1", 9_000_000).revision == view[0] + 1

            faults.heal(PosixFaults.PREADS)
            assert _manifest(client, uri) == manifest
            assert not _resumed(client, 1).HasField("snapshot")  # from the event log again
        log = datamgr.log_path.read_text()
        assert "resumes from revision 1 with a snapshot" in log and "Traceback" not in log, log
    finally:
        datamgr.stop()


def _assert_refused_once(client: DataManagerClient, outcome: str) -> None:
    """A change of j1's rate, never acknowledged, is refused with FAILED_PRECONDITION saying `outcome`."""
    with pytest.raises(ClientError) as caught:
        client.allocate_remote_io("j1", 7_000_000)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION, caught.value
    assert UNWRITABLE in str(caught.value) and outcome in str(caught.value), caught.value


# --- the connection between a node agent and the data manager goes silent ---------------------------------------

# The agent's keepalive pings every 20 s and gives a silent peer 10 s (`fuseclient.agent.CHANNEL_OPTIONS`); then
# it reconnects after at most RECONNECT's 10 s. Half as much again for a loaded machine.
SILENT_CONNECTION_FOUND_WITHIN = 60.0


@pytest.mark.expected_warnings  # "lost the data manager"
def test_a_half_open_connection_to_the_data_manager_is_found_by_keepalive_and_the_agent_reconnects(
    system: System,
) -> None:
    """Every packet of the agent's connection is dropped both ways, so neither end hears a FIN or a reset, as
    after a NAT or firewall dropped the connection's state. The agent keeps enforcing its last allocation, finds
    the connection dead by keepalive, says so, and follows the data manager again over a new connection."""
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 30_000_000)
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000, what="rate")
    assert node.process is not None
    port = int(system.datamgr.address.rsplit(":", 1)[1])

    with silenced_connections(node.process.pid, port) as silenced:
        revision = system.client.allocate_remote_io("j1", 9_000_000).revision
        assert system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000  # not heard over a silent connection
        eventually(
            lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 9_000_000,
            timeout=SILENT_CONNECTION_FOUND_WITHIN,
            what="the change, over a new connection",
        )
        assert not set(connection_ports(node.process.pid, port)) & set(silenced)

    log = node.log_path.read_text()
    assert "lost the data manager" in log
    assert f"is back; at revision {revision}" in log
    assert "Traceback" not in log


# --- the wall clock steps a day forward, then back -----------------------------------------------------------

DAY = 86_400.0
# The node reports its usage far less often than the data manager sweeps for silent nodes (every second), and the
# timeout outlasts the test: if liveness went by the wall clock, the sweep after a step would come before any
# report could save the node, every time.
NODE_TIMEOUT, REPORT_INTERVAL, SWEEP_INTERVAL = 120.0, 100.0, 1.0
LIBFAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ ")


class SteppedWallClock:
    """The wall clock of every process the test starts from now on, stepped while they run (libfaketime with an
    offset file read on every call). Only CLOCK_REALTIME is faked: monotonic clocks and file times stay real."""

    def __init__(self, offset_file: Path) -> None:
        self.offset_file = offset_file
        self.offset = 0.0
        self.step_to(0.0)

    def step_to(self, offset: float) -> float:
        """Set the processes' wall clock `offset` seconds from the real one; returns when (monotonic) it was."""
        self.offset_file.write_text(f"{offset:+.0f}\n")
        self.offset = offset
        return time.monotonic()

    def seen_in(self, wall_time: float) -> bool:
        """Whether `wall_time`, read by a faked process just now, shows the current offset (within an hour)."""
        return abs(wall_time - time.time() - self.offset) < 3600


@pytest.fixture
def stepped_wall_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SteppedWallClock:
    """Processes started after this fixture run with libfaketime preloaded; a missing libfaketime fails in CI."""
    found = sorted(path for pattern in LIBFAKETIME_GLOBS for path in glob.glob(pattern))
    if not found:
        missing_dependency("libfaketime is not installed (Debian package faketime; `make setup` installs it)")
    clock = SteppedWallClock(tmp_path / "faketime-offset")
    preload = " ".join(filter(None, [found[0], os.environ.get("LD_PRELOAD")]))
    monkeypatch.setenv("LD_PRELOAD", preload)
    monkeypatch.setenv("FAKETIME_TIMESTAMP_FILE", str(clock.offset_file))
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")  # read the offset on every call: a step lands at once
    for name in ("DONT_FAKE_MONOTONIC", "FAKETIME_DONT_FAKE_MONOTONIC"):  # an NTP step moves CLOCK_REALTIME only
        monkeypatch.setenv(name, "1")
    # Left on (libfaketime turns it on for this glibc), its "monotonic fix" ends timed waits on monotonic
    # condition variables early or late: Python's GIL hand-off among them, which halved the node's reads.
    monkeypatch.setenv("FAKETIME_FORCE_MONOTONIC_FIX", "0")
    monkeypatch.setenv("NO_FAKE_STAT", "1")  # nor does it change the times of files (the file backend's versions)
    return clock


class ClockCluster(System):
    """A data manager and one node agent (`n1`, with its mount, started by the test) on loopback, both under the
    stepped wall clock, and a dataset directory of FILES random files of SIZE bytes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, node_timeout=NODE_TIMEOUT)
        # The last --report-interval on the command line wins over the one MountProcess.node gives.
        self.node = MountProcess.node(
            root / "n1", self.datamgr.address, "n1", "--cache-capacity", "1GiB",
            "--report-interval", f"{REPORT_INTERVAL:g}",
        )  # fmt: skip
        self.nodes.append(self.node)  # stopped with the rest

    def sample(self) -> Sample:
        """Job j1 on the node, timed by the node's monotonic clock."""
        return sample(self.node)

    def enforced(self) -> tuple[float, int]:
        """(rate, cache quota) the node enforces for j1 and its dataset."""
        stats = self.node.stats()
        return stats["jobs"]["j1"]["io_bytes_per_sec"], stats["datasets"][self.uri]["quota_bytes"]

    def allocate(self, rate: int, quota: int) -> int:
        """Both allocations, through the real client; waits until the node enforces them. Returns the revision."""
        self.client.allocate_cache_size(self.uri, quota)
        revision = self.client.allocate_remote_io("j1", rate).revision
        eventually(lambda: self.enforced() == (rate, quota), what=f"rate {rate} and quota {quota} on the node")
        return revision

    def logged_at(self, revision: int) -> float:
        """The data manager's wall clock when it logged `revision` as accepted."""
        return _logged_at(self.datamgr.log_path, f" revision {revision}: ")


def _logged_at(log: Path, said: str) -> float:
    """The system's wall clock in a process when it logged the first line of `log` that says `said`."""
    for line in log.read_text().splitlines():
        match = _LOG_TIME.match(line)
        if match and said in line:
            return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    raise AssertionError(f"{said!r} not in {log.name}")


@pytest.fixture
def clock_cluster(stepped_wall_clock: SteppedWallClock, tmp_path: Path) -> Iterator[ClockCluster]:
    cluster = ClockCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


def _step(cluster: ClockCluster, clock: SteppedWallClock, offset: float) -> float:
    """Step the processes' wall clock to `offset` and wait until the node's shows it; returns when (monotonic)."""
    stepped = clock.step_to(offset)
    eventually(lambda: clock.seen_in(cluster.node.stats()["written_at"]), what="the node's wall clock stepped")
    return stepped


def _window(cluster: ClockCluster, rate: int, clock: SteppedWallClock | None = None, offset: float = 0.0) -> float:
    """Check the node's fetched bytes over WINDOW seconds of its monotonic clock under `rate`; with `clock`, step
    it to `offset` as the window opens, so that the window spans the step. Returns when (monotonic) it stepped."""
    start: Sample = eventually(lambda: (s := cluster.sample()).rate == rate and s, what=f"rate {rate} on the node")
    stepped = time.monotonic() if clock is None else _step(cluster, clock, offset)
    end: Sample = eventually(lambda: (s := cluster.sample()).at >= start.at + WINDOW and s, what="the window's end")
    assert end.rate == rate, "the rate changed within the window"
    assert_held_to(rate, start, end)
    return stepped


def _assert_node_live_and_allocations_kept(cluster: ClockCluster, stepped: float, rate: int, quota: int) -> None:
    """Once the data manager has swept for silent nodes since the step: n1 was never marked unavailable, its
    silence is counted in real seconds, and the rate and quota are as allocated, there and on the node."""
    # CLOCK_MONOTONIC is one clock for the whole machine: the test's reading says the sweeps have come due.
    polling.eventually(lambda: time.monotonic() >= stepped + 2 * SWEEP_INTERVAL, what="two sweeps since the step")
    node = cluster.client.call(cluster.client.stub.GetNode, pb.GetNodeRequest(node_id="n1"))
    assert node.available
    assert 0 <= node.seconds_since_seen < NODE_TIMEOUT, node.seconds_since_seen
    assert "stopped reporting" not in cluster.datamgr.log_path.read_text()
    assert cluster.client.call(cluster.client.stub.GetJob, pb.GetJobRequest(job_id="j1")).io_bytes_per_sec == rate
    dataset = cluster.client.call(cluster.client.stub.GetDataset, pb.GetDatasetRequest(uri=cluster.uri))
    assert dataset.cache_quota_bytes == quota
    assert cluster.enforced() == (rate, quota)


def test_a_wall_clock_stepped_a_day_forward_and_back_changes_no_liveness_allocation_watch_or_rate_libfaketime_fake(
    clock_cluster: ClockCluster, stepped_wall_clock: SteppedWallClock
) -> None:
    """libfaketime fakes only the clock the fault is about, CLOCK_REALTIME, in the data manager and the node agent
    (and nothing else: monotonic clocks and file times are real). The forward step lands while readers hold the
    job's remote IO to its rate, inside a measurement window timed by the node's monotonic clock (the stats file's
    `monotonic_seconds`: its `written_at` jumps with the step). The backward step lands while the job is idle: a
    bucket that counted elapsed time on the wall clock would then owe a day of tokens and stall the next reads,
    where waiting readers would have hidden it (their timers run on trio's clock and top the bucket up)."""
    cluster, clock = clock_cluster, stepped_wall_clock
    cluster.node.start()
    eventually(lambda: cluster.client.call(cluster.client.stub.GetNode, pb.GetNodeRequest(node_id="n1")), what="n1")
    cluster.client.register_dataset(cluster.uri)
    cluster.client.register_job("j1", cluster.uri, 100_000_000, [("n1", 1)])
    job_dir = eventually(lambda: cluster.node.job_dir("j1").is_dir() and cluster.node.job_dir("j1"), what="j1's dir")
    cluster.allocate(2_000_000, 2 * SIZE)  # a cache of two items: nearly every read still fetches

    with readers_demanding_more(job_dir, cluster.files):
        stepped = _window(cluster, 2_000_000, clock, +DAY)
    _assert_node_live_and_allocations_kept(cluster, stepped, 2_000_000, 2 * SIZE)
    revision = cluster.allocate(3_000_000, 3 * SIZE)  # a change after the step reaches the node's watch
    assert clock.seen_in(cluster.logged_at(revision)), "the data manager's wall clock was not stepped"

    stepped = _step(cluster, clock, 0.0)  # a day back, the job idle
    _assert_node_live_and_allocations_kept(cluster, stepped, 3_000_000, 3 * SIZE)
    revision = cluster.allocate(1_000_000, SIZE)
    assert clock.seen_in(cluster.logged_at(revision))
    with readers_demanding_more(job_dir, cluster.files):
        _window(cluster, 1_000_000)
    _assert_node_live_and_allocations_kept(cluster, stepped, 1_000_000, SIZE)

    for log in (cluster.datamgr.log_path, cluster.node.log_path):
        loud = [line for line in log.read_text().splitlines() if " WARNING " in line or " ERROR " in line]
        assert not loud, f"{log.name}: {loud}"


# --- the wall clock steps a day while a preempted job's grace period runs ----------------------------------------

GRACE_SECONDS = 20.0  # the BE job's
ROUND_SECONDS = 2.0  # --round: rounds come every 2 s, whatever the grace period's timer says
# The grace period ends on the data manager's timer, and the TE job starts in the round it wakes for: LATE allows
# three rounds more for a loaded machine. With its clock stepped back with the system's, the data manager held the
# GPUs a day (or, with the re-dating a restart needs, a whole grace period from the first round after the step);
# the step lands STEPPED_BACK_BEFORE_THE_END before the end, more than LATE, so that either misses the deadline.
LATE = 3 * ROUND_SECONDS
STEPPED_BACK_BEFORE_THE_END = GRACE_SECONDS / 2
CLOCKS_APART = 0.5  # how far apart the data manager's and the test's clocks may be read (both the system's at first)
NODE_GPUS = 2


@pytest.fixture
def fitgpp_stepped(
    stepped_wall_clock: SteppedWallClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[DataManagerProcess]:
    """`silod datamgr serve --policy fitgpp`, rounds every ROUND_SECONDS, under the stepped wall clock; its nodes
    never report, and are never timed out while the test runs. It logs at DEBUG: the rounds that repeat the one
    before, whose log lines tell when its clock stepped (`_after_rounds_since_step`), log there."""
    monkeypatch.setenv("SILOD_LOG_LEVEL", "DEBUG")
    datamgr = DataManagerProcess(
        tmp_path / "state", tmp_path / "datamgr.log",
        "--policy", "fitgpp", "--round", f"{ROUND_SECONDS:g}", "--node-timeout", "600", "--remote-io-limit", "1MB/s",
    )  # fmt: skip
    try:
        yield datamgr.start()
    finally:
        datamgr.stop()


def _schedule(client: DataManagerClient, job_id: str) -> pb.JobSchedule:
    return client.call(client.stub.GetJob, pb.GetJobRequest(job_id=job_id)).schedule


def _rounds(client: DataManagerClient) -> int:
    return client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).controller.rounds


def _held(schedule: pb.JobSchedule) -> list[tuple[str, int]]:
    return [(worker.node_id, worker.count) for worker in schedule.held]


def _preempt(client: DataManagerClient, tmp_path: Path) -> tuple[float, float]:
    """n1 with NODE_GPUS GPUs, the BE job `be` running on all of them with a grace period of GRACE_SECONDS, then the
    TE job `te` wanting them all: FitGpp preempts `be`, which suspends holding its GPUs. Returns when its grace
    period ends, as the data manager reports it (its clock), and the same time on the monotonic clock."""
    client.register_node("n1", "n1:1", 10_000_000, gpus=NODE_GPUS)
    uri = make_local_dataset(tmp_path / "data", files=4, size=500)
    client.register_dataset(uri)
    client.register_job(
        "be", uri, 1_000_000, [], gpus=NODE_GPUS, job_class=pb.JOB_CLASS_BEST_EFFORT, grace_seconds=GRACE_SECONDS
    )
    polling.eventually(lambda: _schedule(client, "be").phase == pb.JOB_PHASE_RUNNING, what="be running", timeout=10)
    registered = time.time()
    client.register_job("te", uri, 1_000_000, [], gpus=NODE_GPUS, job_class=pb.JOB_CLASS_TRIAL_AND_ERROR)
    be: pb.JobSchedule = polling.eventually(
        lambda: (s := _schedule(client, "be")).phase == pb.JOB_PHASE_SUSPENDING and s, what="be suspending", timeout=10
    )
    assert _held(be) == [("n1", NODE_GPUS)]
    assert _schedule(client, "te").phase == pb.JOB_PHASE_PENDING
    # Preempted by the round the TE job's registration started: until a step, the data manager's clock reads as the
    # test's does.
    now = time.time()
    preempted = be.suspended_until - GRACE_SECONDS
    assert registered - CLOCKS_APART <= preempted <= now + CLOCKS_APART, (registered, be, now)
    return be.suspended_until, time.monotonic() + be.suspended_until - now


def _after_rounds_since_step(datamgr: DataManagerProcess, client: DataManagerClient, clock: SteppedWallClock) -> None:
    """Wait until a whole round began after the step (rounds are counted once over), and check that the data
    manager's system clock had stepped by then: its log line is stamped with the step."""
    since = _rounds(client)
    polling.eventually(lambda: _rounds(client) >= since + 2, what="2 rounds since the step", timeout=4 * ROUND_SECONDS)
    assert clock.seen_in(_logged_at(datamgr.log_path, f" round {since + 2} (")), "the data manager's clock did not step"


def _assert_still_suspending(client: DataManagerClient, until: float) -> None:
    be = _schedule(client, "be")
    assert (be.phase, be.suspended_until, _held(be)) == (pb.JOB_PHASE_SUSPENDING, until, [("n1", NODE_GPUS)])
    assert _schedule(client, "te").phase == pb.JOB_PHASE_PENDING


def _assert_handed_over(datamgr: DataManagerProcess, client: DataManagerClient, until: float) -> None:
    """`be` released once, its GPUs gone to `te`, which started by the data manager's clock once the grace period
    was over; nothing in the data manager's log above INFO (a re-dated grace period is a WARNING)."""
    be, te = _schedule(client, "be"), _schedule(client, "te")
    assert (be.phase, be.preemptions, _held(be)) == (pb.JOB_PHASE_PREEMPTED, 1, [])
    assert until <= te.first_start_time < until + LATE, (te.first_start_time, until)
    loud = [line for line in datamgr.log_path.read_text().splitlines() if " WARNING " in line or " ERROR " in line]
    assert not loud, loud


def test_a_wall_clock_stepped_a_day_back_in_a_grace_period_still_releases_the_gpus_when_it_ends_libfaketime_fake(
    fitgpp_stepped: DataManagerProcess, stepped_wall_clock: SteppedWallClock, tmp_path: Path
) -> None:
    """The step lands halfway through the BE job's grace period. The data manager's clock goes on by the monotonic
    clock: the grace period it reports stays where it was, and the TE job gets the GPUs when it ends in real time,
    where before they stayed held for the day the clock went back."""
    datamgr, clock = fitgpp_stepped, stepped_wall_clock
    with DataManagerClient(datamgr.address, timeout=10) as client:
        until, ends = _preempt(client, tmp_path)
        halfway = ends - STEPPED_BACK_BEFORE_THE_END
        polling.eventually(lambda: time.monotonic() >= halfway, what="halfway through", timeout=GRACE_SECONDS)
        clock.step_to(-DAY)
        _after_rounds_since_step(datamgr, client, clock)
        assert time.monotonic() < ends, "the rounds after the step came after the grace period: nothing was checked"
        _assert_still_suspending(client, until)

        polling.eventually(
            lambda: _schedule(client, "te").phase == pb.JOB_PHASE_RUNNING,
            what="te started on the GPUs be released",
            timeout=ends + LATE - time.monotonic(),
        )
        _assert_handed_over(datamgr, client, until)


def test_a_wall_clock_stepped_a_day_forward_in_a_grace_period_keeps_the_gpus_held_until_it_ends_libfaketime_fake(
    fitgpp_stepped: DataManagerProcess, stepped_wall_clock: SteppedWallClock, tmp_path: Path
) -> None:
    """The step lands right after the preemption. The BE job keeps its GPUs, and the time to checkpoint that its
    grace period promises, until the period ends in real time, where before the next round released them."""
    datamgr, clock = fitgpp_stepped, stepped_wall_clock
    with DataManagerClient(datamgr.address, timeout=10) as client:
        until, ends = _preempt(client, tmp_path)
        clock.step_to(+DAY)
        _after_rounds_since_step(datamgr, client, clock)
        _assert_still_suspending(client, until)

        polling.eventually(
            lambda: _schedule(client, "te").phase == pb.JOB_PHASE_RUNNING,
            what="te started on the GPUs be released",
            timeout=ends + LATE - time.monotonic(),
        )
        assert time.monotonic() >= ends - CLOCKS_APART, "be's GPUs were released before its grace period was over"
        _assert_handed_over(datamgr, client, until)
