"""A `silod datamgr serve` process killed with SIGKILL and started again on the same state dir serves the
same state and revisions, and watching nodes resume across the restart without loss."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.store.sqlite import SQLiteStore, StateDirError
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import (
    SILOD,
    STREAM_DEADLINE,
    DataManagerProcess,
    NodeWatch,
    full_state,
    make_local_dataset,
    silod_cli,
    watch,
)
from tests.state_files import (
    files_of,
    killed_copy,
    killed_state_dir,
    linked_state_dir,
    revision_and_nodes,
    state_of_nodes,
)
from tests.storage_servers import missing_dependency
from tests.test_store import schema_of, write_schema_4_state_dir


def _populate(client: DataManagerClient, tmp_path: Path) -> tuple[str, int]:
    """Two nodes, a dataset, a job on both nodes and both allocations; returns the URI and last revision."""
    client.register_node("n1", "h1:1", 1_000_000)
    client.register_node("n2", "h2:1", 1_000_000)
    uri = make_local_dataset(tmp_path / "ds", files=12, size=4000)
    client.register_dataset(uri, chunk_size=64 * 1024)
    client.register_job("j1", uri, 50_000_000, [("n1", 2), ("n2", 1)])
    client.allocate_cache_size(uri, 30_000)
    return uri, client.allocate_remote_io("j1", 30_000_000).revision


def test_sigkill_then_restart_serves_the_same_state_and_revisions(
    datamgr_process: DataManagerProcess, tmp_path: Path
) -> None:
    with DataManagerClient(datamgr_process.start().address) as client:
        uri, revision = _populate(client, tmp_path)
        before = full_state(client)
        manifest = b"".join(c.data for c in client.stub.GetManifest(pb.GetManifestRequest(dataset_uri=uri)))
    datamgr_process.kill()

    with DataManagerClient(datamgr_process.start().address) as client:
        assert full_state(client) == before
        summary = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
        assert summary.revision == revision
        restored = b"".join(c.data for c in client.stub.GetManifest(pb.GetManifestRequest(dataset_uri=uri)))
        assert restored == manifest
        assert client.allocate_remote_io("j1", 1).revision == revision + 1  # numbering continues


def test_one_bit_a_disk_changed_in_a_jobs_row_stops_the_start_naming_the_row_and_changes_nothing(
    datamgr_process: DataManagerProcess, tmp_path: Path
) -> None:
    """What docs/datamgr.md ("Durability") promises of a byte a failing disk changed inside a row, whose pages SQLite
    finds whole: a job's dataset URI, one bit changed, named a dataset that is not there. The start served it, and
    `silod status` and FinishJob then failed with UNKNOWN (a KeyError traceback)."""
    with DataManagerClient(datamgr_process.start().address) as client:
        uri, _ = _populate(client, tmp_path)
    assert datamgr_process.terminate() == 0
    database = datamgr_process.state_dir / "silod.db"
    data = bytearray(database.read_bytes())
    record = b"j1" + uri.encode()  # the jobs row: its job_id, then its dataset_uri
    at = data.find(record)
    assert at >= 0 and data.find(record, at + 1) < 0
    data[at + len(record) - 1] ^= 0x01  # .../ds -> .../dr
    database.write_bytes(data)

    datamgr_process.launch()
    assert datamgr_process.wait() == 2
    assert (
        f"{database} holds a row this silod cannot read: table jobs, row 'j1': its dataset '{uri[:-1]}r' is not "
        "registered (table datasets has no such row); nothing was changed: restore the state dir from a backup"
    ) in datamgr_process.log_path.read_text()
    assert database.read_bytes() == data


def test_a_backup_taken_while_the_data_manager_runs_is_restored_to_the_state_it_had_then(
    datamgr_process: DataManagerProcess, tmp_path: Path
) -> None:
    """`silod datamgr backup` copies the state while the server runs and commits; `silod datamgr restore`, refused
    while the server runs, makes the copy the state dir's database again, over the database and log a killed
    server left. The server then serves exactly the state and revision of the moment of the backup and carries on
    from there; the replaced database is kept with its log."""
    backup = tmp_path / "backup.db"
    with DataManagerClient(datamgr_process.start().address) as client:
        _, revision = _populate(client, tmp_path)
        at_backup = full_state(client)
        taken = silod_cli("datamgr", "backup", "--state-dir", str(datamgr_process.state_dir), str(backup))
        assert taken.returncode == 0, taken.stderr
        assert (
            taken.stdout.strip()
            == f"backed up state dir {datamgr_process.state_dir} at revision {revision} to {backup}"
        )
        assert backup.stat().st_mode & 0o777 == 0o600  # dataset options may hold credentials
        client.allocate_remote_io("j1", 9_000_000)  # changes after the backup
        client.register_node("n3", "h3:1", 1_000_000)
        again = silod_cli("datamgr", "backup", "--state-dir", str(datamgr_process.state_dir), str(backup))
        assert again.returncode == 2, again.stderr
        assert f"cannot write the backup {backup}: a file of that name is there" in again.stderr
        state_dir = str(datamgr_process.state_dir)
        in_use = silod_cli("datamgr", "restore", "--state-dir", state_dir, str(backup))
        assert in_use.returncode == 2, in_use.stderr
        assert datamgr_process.process is not None
        assert (
            f"is in use by another data manager (pid {datamgr_process.process.pid}); nothing was changed: stop it, "
            "then restore again"
        ) in in_use.stderr
        after_backup = full_state(client)
    datamgr_process.kill()  # its write-ahead log still holds its last changes
    assert (datamgr_process.state_dir / "silod.db-wal").stat().st_size > 0

    restored = silod_cli("datamgr", "restore", "--state-dir", state_dir, str(backup))
    assert restored.returncode == 0, restored.stderr
    kept = Path(restored.stdout.strip().rsplit(" ", 1)[1])
    assert restored.stdout.startswith(f"restored state dir {state_dir} to revision {revision} from {backup}; ")
    with DataManagerClient(datamgr_process.start().address) as client:
        assert full_state(client) == at_backup  # not a mix of the backup and the replaced database's log
        assert client.allocate_remote_io("j1", 7_000_000).revision == revision + 1
    datamgr_process.kill()

    # Nothing is lost: the replaced database, with its log, restored in turn, is the state it had.
    replaced = tmp_path / "replaced-state"
    replaced.mkdir()
    for name in ("", "-wal"):
        shutil.copyfile(f"{kept}{name}", replaced / f"silod.db{name}")
    replaced_datamgr = DataManagerProcess(replaced, tmp_path / "replaced.log", "--remote-io-limit", "1GB/s")
    try:
        with DataManagerClient(replaced_datamgr.start().address) as client:
            assert full_state(client) == after_backup
    finally:
        replaced_datamgr.stop()


def test_a_node_resumes_its_watch_across_a_restart(datamgr_process: DataManagerProcess, tmp_path: Path) -> None:
    with DataManagerClient(datamgr_process.start().address) as client:
        _populate(client, tmp_path)
        stream = watch(client, "n1")
        last = stream.next().revision
        stream.cancel()
        missed_before_kill = client.allocate_remote_io("j1", 9_000_000).revision
    datamgr_process.kill()

    with DataManagerClient(datamgr_process.start().address) as client:
        missed_after = client.allocate_remote_io("j1", 6_000_000).revision
        resumed = watch(client, "n1", since=last)
        events = [resumed.next(), resumed.next()]
        assert [e.revision for e in events] == [missed_before_kill, missed_after]
        assert [e.changes[0].job_set.io_bytes_per_sec for e in events] == [6_000_000, 4_000_000]


def test_sigterm_stops_gracefully(datamgr_process: DataManagerProcess) -> None:
    datamgr_process.start()
    assert datamgr_process.terminate() == 0
    log = datamgr_process.log_path.read_text()
    assert "data manager stopped" in log


def test_a_second_server_on_the_same_state_dir_refuses_to_start(
    datamgr_process: DataManagerProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    datamgr_process.start()
    second = DataManagerProcess(datamgr_process.state_dir, tmp_path / "second.log")
    request.addfinalizer(second.stop)
    second.launch()
    assert second.wait() == 2
    assert "is in use by another data manager" in (tmp_path / "second.log").read_text()


def test_a_second_server_on_the_same_port_refuses_to_start(
    datamgr_process: DataManagerProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # gRPC servers share a port with SO_REUSEPORT by default; two data managers on one port would then answer
    # clients at random, each from its own state.
    datamgr_process.start()
    port = datamgr_process.address.rsplit(":", 1)[1]
    second = DataManagerProcess(tmp_path / "other-state", tmp_path / "second.log", listen=f"127.0.0.1:{port}")
    request.addfinalizer(second.stop)
    second.launch()
    assert second.wait() == 2
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in (tmp_path / "second.log").read_text()


_REFUSALS = {  # a start refused after the state dir is open: its extra options, and what it says (PORT: one in use)
    "its port in use": (("--listen", "127.0.0.1:PORT"), "cannot listen on 127.0.0.1:PORT: the port is in use"),
    "its metrics port in use": (("--metrics-port", "PORT"), "--metrics-port PORT: cannot serve /metrics on 127.0.0.1"),
    "cell levels smaller than a node": (
        ("--cell-levels", "gpu:1,node:2"),
        "--cell-levels: nodes: node 'n1' has 4 GPUs, more than the 2 of a node cell",
    ),
}


@pytest.mark.parametrize("refusal", list(_REFUSALS))
def test_a_refused_start_leaves_a_schema_4_state_dir_as_it_was_and_the_next_start_upgrades_it(
    tmp_path: Path, refusal: str, request: pytest.FixtureRequest
) -> None:
    """The open upgraded the state dir for good before these checks: a refused start left it at schema 5, and the
    silod that wrote it, to which the operator would roll back, refused it as written by a newer silod."""
    state_dir = tmp_path / "state"
    path = write_schema_4_state_dir(state_dir)
    before = files_of(state_dir)
    options, says = _REFUSALS[refusal]
    with contextlib.closing(socket.socket()) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        refused = DataManagerProcess(state_dir, tmp_path / "refused.log", *(o.replace("PORT", port) for o in options))
        request.addfinalizer(refused.stop)
        refused.launch()
        assert refused.wait() == 2
    log = (tmp_path / "refused.log").read_text()
    assert says.replace("PORT", port) in log and "upgraded" not in log
    assert files_of(state_dir) == before and schema_of(path) == 4

    started = DataManagerProcess(state_dir, tmp_path / "datamgr.log")
    request.addfinalizer(started.stop)
    started.start()
    assert started.terminate() == 0
    assert schema_of(path) == 5
    assert (
        f"upgraded state dir {state_dir} from schema 4 to 5: silods of schema 4 and before refuse it now"
        in (tmp_path / "datamgr.log").read_text()
    )


def test_a_linked_database_killed_after_its_upgrade_starts_again_upgraded(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`silod.db` linking to a schema 4 database on another volume: a start upgrades it (in the log beside the file
    the link names) and is killed before a checkpoint. Every later start read the schema version beside the link,
    took the file alone for schema 4, ran the upgrade again and exited 1: "duplicate column name: tenant"."""
    volume, state_dir = tmp_path / "volume", tmp_path / "state"
    write_schema_4_state_dir(volume)
    linked_state_dir(state_dir, volume)
    first = DataManagerProcess(state_dir, tmp_path / "first.log")
    request.addfinalizer(first.stop)
    with DataManagerClient(first.start().address) as client:
        revision = client.register_node("n9", "h9:1", 1_000_000).revision
    first.kill()
    assert (volume / "silod.db-wal").stat().st_size > 0

    again = DataManagerProcess(state_dir, tmp_path / "again.log")
    request.addfinalizer(again.stop)
    with DataManagerClient(again.start().address) as client:
        summary = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
        assert summary.revision == revision
    assert again.terminate() == 0
    assert schema_of(volume / "silod.db") == 5


def _state_dir_and_its_backup(tmp_path: Path) -> tuple[Path, Path]:
    """A state dir with its (empty) database, and a backup of it taken with `silod datamgr backup`."""
    state_dir, backup = tmp_path / "state", tmp_path / "backup.db"
    SQLiteStore(state_dir).close()
    assert silod_cli("datamgr", "backup", "--state-dir", str(state_dir), str(backup)).returncode == 0
    return state_dir, backup


def test_a_restore_flushes_its_copy_before_renaming_it_over_the_database_and_the_state_dir_after(
    tmp_path: Path,
) -> None:
    """Durability, traced: the restore writes the backup to `silod.db.restoring`, flushes it, renames it over
    `silod.db` and flushes the state dir. Without the first flush a power loss could leave the name on a file whose
    pages never reached the disk; without the last, bring back the database it replaced."""
    if shutil.which("strace") is None:
        missing_dependency("strace is not installed (make setup installs it)")
    state_dir, backup = _state_dir_and_its_backup(tmp_path)
    trace = tmp_path / "trace"

    traced = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=openat,rename,renameat,renameat2,fsync,fdatasync", "-o", str(trace),
         *SILOD, "datamgr", "restore", "--state-dir", str(state_dir), str(backup)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert traced.returncode == 0, traced.stderr
    calls = trace.read_text().splitlines()
    copy, database = f'"{state_dir}/silod.db.restoring"', f'"{state_dir}/silod.db"'
    renamed = [i for i, call in enumerate(calls) if "rename" in call and copy in call and call.rstrip().endswith("= 0")
               and f"{database}" in call.split(copy, 1)[1]]  # fmt: skip
    assert len(renamed) == 1, "\n".join(calls)

    def flushes_of(path: str) -> list[int]:
        fds = {
            m[1] for call in calls if (m := re.search(rf"openat\(AT_FDCWD, {re.escape(path)}, [^)]*\) = (\d+)", call))
        }
        return [i for i, call in enumerate(calls) if (m := re.search(r"\b(fsync|fdatasync)\((\d+)\)", call))
                and m[2] in fds]  # fmt: skip

    assert any(i < renamed[0] for i in flushes_of(copy)), "\n".join(calls[: renamed[0] + 1])
    assert any(i > renamed[0] for i in flushes_of(f'"{state_dir}"')), "\n".join(calls[renamed[0] :])


def _restore_failing_directory_fsyncs(state_dir: Path, backup: Path) -> subprocess.CompletedProcess[str]:
    """`silod datamgr restore` with libfiu failing every `fsync` (the restore flushes files with `fdatasync`, so
    only its directory flushes fail)."""
    if shutil.which("fiu-run") is None:
        missing_dependency("fiu-run is not installed (make setup installs fiu-utils)")
    return subprocess.run(
        ["fiu-run", "-x", "-c", "enable name=posix/io/sync/fsync,failinfo=5",
         *SILOD, "datamgr", "restore", "--state-dir", str(state_dir), str(backup)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_restore_whose_state_dir_cannot_be_flushed_exits_2_saying_it_may_not_last_faked_eio(tmp_path: Path) -> None:
    """libfiu fails the restore's `fsync`s of directories (files are flushed with `fdatasync`, as SQLite flushes
    them): into a new state dir, where no database is kept first, the one after the rename. The copy is in place,
    but not known to be on the disk, so the restore is not reported as done."""
    _, backup = _state_dir_and_its_backup(tmp_path)
    state_dir = tmp_path / "new-state"

    failed = _restore_failing_directory_fsyncs(state_dir, backup)

    assert failed.returncode == 2, failed.stderr
    assert f"restored {backup} into state dir {state_dir}, but could not flush the directory" in failed.stderr
    assert "Input/output error" in failed.stderr and "restore again" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_a_restore_whose_state_dir_cannot_be_flushed_before_the_rename_exits_2_and_changes_nothing_faked_eio(
    tmp_path: Path,
) -> None:
    """libfiu fails every `fsync` of a directory: over a killed data manager's files, the restore keeps them under
    another name and must flush that before its copy takes the database's name. Refused there, it puts them back."""
    _, backup = _state_dir_and_its_backup(tmp_path)
    state_dir = tmp_path / "killed"
    killed_state_dir(state_dir, 3)
    before = files_of(state_dir, but=("lock", "silod.db-shm"))

    failed = _restore_failing_directory_fsyncs(state_dir, backup)

    assert failed.returncode == 2, failed.stderr
    assert f"cannot restore {backup} into state dir {state_dir}: Input/output error; it is as it was" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert files_of(state_dir, but=("lock", "silod.db-shm")) == before
    assert revision_and_nodes(state_dir) == (3, ["killed1", "killed2", "killed3"])


@pytest.mark.parametrize("killed", ["while copying the backup", "while keeping the database it replaces"])
def test_a_restore_killed_midway_leaves_the_old_database_and_a_start_refuses_until_it_is_run_again(
    tmp_path: Path, killed: str
) -> None:
    """strace kills the restore (SIGKILL, as the OOM killer or a power loss stops it) at its 20th write, in the middle
    of copying the backup, or at its first rename, once it has begun to keep the database it replaces. Before, the
    state dir then held a half copy with its journal, which SQLite rolled back to an empty database: the next start
    served an empty cluster at revision 0, the real state only in a `.replaced-*` file named nowhere."""
    if shutil.which("strace") is None:
        missing_dependency("strace is not installed (make setup installs it)")
    state_of_nodes(tmp_path / "other", 2000)  # some 50 pages to copy
    backup = tmp_path / "backup.db"
    assert silod_cli("datamgr", "backup", "--state-dir", str(tmp_path / "other"), str(backup)).returncode == 0
    state_dir = tmp_path / "state"
    killed_state_dir(state_dir, 3)  # its log holds acknowledged changes
    database = (state_dir / "silod.db").read_bytes()
    calls, when = ("pwrite64", 20) if killed == "while copying the backup" else ("rename,renameat,renameat2", 1)

    interrupted = subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
         "-e", f"inject={calls}:signal=KILL:when={when}",
         *SILOD, "datamgr", "restore", "--state-dir", str(state_dir), str(backup)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert interrupted.returncode != 0 and (state_dir / "silod.db.restoring").exists(), interrupted.stderr
    assert (state_dir / "silod.db").read_bytes() == database
    with pytest.raises(StateDirError) as refused:
        SQLiteStore(state_dir)
    assert str(refused.value).startswith(
        f"cannot use state dir {state_dir}: a restore into it was interrupted ({state_dir}/silod.db.restoring is its "
        f"unfinished copy); nothing was changed: run the restore again (silod datamgr restore --state-dir {state_dir} "
    )

    again = silod_cli("datamgr", "restore", "--state-dir", str(state_dir), str(backup))
    assert again.returncode == 0, again.stderr
    kept = Path(again.stdout.strip().rsplit(" ", 1)[1])
    assert revision_and_nodes(state_dir) == (1, [f"n{i:04d}" for i in range(2000)])
    assert sorted(p.name for p in state_dir.iterdir() if p.name.startswith("silod.db.")) == [
        kept.name, f"{kept.name}-shm", f"{kept.name}-wal"
    ]  # fmt: skip
    replaced = tmp_path / "replaced"  # nothing lost: the kept database with its log is the killed one's state
    replaced.mkdir()
    for suffix in ("", "-wal"):
        shutil.copyfile(f"{kept}{suffix}", replaced / f"silod.db{suffix}")
    assert revision_and_nodes(replaced) == (3, ["killed1", "killed2", "killed3"])


def test_what_an_interrupted_restore_of_an_older_silod_left_is_refused_naming_the_kept_database(tmp_path: Path) -> None:
    """A silod before this one restored by renaming the database away and copying the backup in its place: killed,
    it left a half copy and its hot journal, which SQLite rolls back to an empty database, beside the kept one."""
    state_of_nodes(tmp_path / "other", 2000)
    backup = tmp_path / "backup.db"
    assert silod_cli("datamgr", "backup", "--state-dir", str(tmp_path / "other"), str(backup)).returncode == 0
    state_dir = tmp_path / "state"
    state_of_nodes(state_dir, 3, prefix="old")
    kept = state_dir / "silod.db.replaced-20261127T100000Z"
    (state_dir / "silod.db").rename(kept)
    killed_copy(backup, state_dir / "silod.db")
    before = files_of(state_dir)

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(state_dir)

    assert str(refused.value) == (
        f"cannot use state dir {state_dir}: {state_dir}/silod.db is an unfinished copy, with a rollback journal "
        f"({state_dir}/silod.db-journal) beside it, as a restore by a silod before this one leaves when it is "
        f"interrupted: SQLite would roll it back to an empty database; the database it replaced is kept as {kept}; "
        f"nothing was changed: run the restore again (silod datamgr restore --state-dir {state_dir} BACKUP)"
    )
    assert files_of(state_dir) == before
    again = silod_cli("datamgr", "restore", "--state-dir", str(state_dir), str(backup))
    assert again.returncode == 0, again.stderr
    assert revision_and_nodes(state_dir)[0] == 1
    assert _revision_and_nodes_of_copy(kept, tmp_path / "kept") == (1, ["old0000", "old0001", "old0002"])


def _revision_and_nodes_of_copy(database: Path, directory: Path) -> tuple[int, list[str]]:
    """What a data manager would serve from a copy of the closed database `database` in a new state dir."""
    directory.mkdir()
    shutil.copyfile(database, directory / "silod.db")
    return revision_and_nodes(directory)


def test_a_second_server_on_the_same_state_dir_is_refused_after_its_lock_file_was_deleted(
    datamgr_process: DataManagerProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`rm lock` while a data manager serves (the file looks stale): the next one used to lock the new file it made
    and serve the same state dir, both handing out the same revision numbers to different changes."""
    datamgr_process.start()
    assert datamgr_process.process is not None
    (datamgr_process.state_dir / "lock").unlink()
    second = DataManagerProcess(datamgr_process.state_dir, tmp_path / "second.log")
    request.addfinalizer(second.stop)

    second.launch()

    assert second.wait() == 2
    said = (tmp_path / "second.log").read_text()
    assert f"is in use by another process (pid {datamgr_process.process.pid}); nothing was changed" in said, said
    with DataManagerClient(datamgr_process.address) as client:  # the first serves on
        assert client.register_node("n1", "h1:1", 1_000_000).revision == 1


def _watch_from(client: DataManagerClient, since: int, history: int) -> NodeWatch:
    """Node n1's watch resumed from revision `since` of `history`, as a node agent resumes it."""
    request = pb.WatchAllocationsRequest(node_id="n1", since_revision=since, history=history)
    return NodeWatch(client.stub.WatchAllocations(request, timeout=STREAM_DEADLINE))


def test_a_node_resumes_its_watch_in_the_history_it_was_told_across_a_restart(
    datamgr_process: DataManagerProcess, tmp_path: Path
) -> None:
    with DataManagerClient(datamgr_process.start().address) as client:
        _populate(client, tmp_path)
        stream = watch(client, "n1")
        first = stream.next()
        stream.cancel()
        missed_before_kill = client.allocate_remote_io("j1", 9_000_000).revision
    datamgr_process.kill()

    with DataManagerClient(datamgr_process.start().address) as client:
        missed_after = client.allocate_remote_io("j1", 6_000_000).revision
        resumed = _watch_from(client, first.revision, first.history)
        events = [resumed.next(), resumed.next()]
        assert [e.revision for e in events] == [missed_before_kill, missed_after]
        assert not any(e.HasField("snapshot") for e in events)  # from the log, not a snapshot
        assert events[0].history not in (0, first.history)  # a new history from the restart on


def test_a_node_past_a_restored_backup_gets_a_snapshot_after_the_restored_state_passes_its_revision(
    datamgr_process: DataManagerProcess, tmp_path: Path
) -> None:
    """Backup at revision R; the node sees later changes (R+2); restore; the restored data manager changes until it
    is past the node's revision before the node resumes. The node's revision names another change there: resumed
    from the log, the node would get the last change alone and keep a job the data manager does not know."""
    backup = tmp_path / "backup.db"
    state_dir = str(datamgr_process.state_dir)
    with DataManagerClient(datamgr_process.start().address) as client:
        uri, _ = _populate(client, tmp_path)
        assert silod_cli("datamgr", "backup", "--state-dir", state_dir, str(backup)).returncode == 0
        stream = watch(client, "n1")
        history = stream.next().history
        client.allocate_remote_io("j1", 9_000_000)
        seen = client.register_job("j2", uri, 1_000, [("n1", 1)]).revision
        while (event := stream.next()).revision < seen:
            pass
        stream.cancel()
    datamgr_process.kill()
    restored = silod_cli("datamgr", "restore", "--state-dir", state_dir, str(backup))
    assert restored.returncode == 0, restored.stderr

    with DataManagerClient(datamgr_process.start().address) as client:
        rate = 3_000_000
        while (revision := client.allocate_remote_io("j1", rate).revision) <= seen:
            rate += 3_000_000
        resumed = _watch_from(client, event.revision, history).next()
        assert resumed.HasField("snapshot") and resumed.revision == revision
        assert [(j.job_id, j.job_io_bytes_per_sec) for j in resumed.snapshot.jobs] == [("j1", rate)]


def _revision_of(database: Path) -> int:
    """The revision a closed state database holds (with the write-ahead log beside it, if any)."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        return int(db.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()[0])


def test_two_restores_in_the_same_second_keep_both_replaced_databases(
    datamgr_process: DataManagerProcess, tmp_path: Path
) -> None:
    """The replaced database's name has the time to the second: libfaketime stops the clock, so both restores
    happen in the same second, deterministically. The first keeps the database of a killed data manager, with its
    write-ahead log; the second must neither rename over it nor set its own beside that log."""
    if shutil.which("faketime") is None:
        missing_dependency("faketime is not installed (make setup installs it)")
    backup = tmp_path / "backup.db"
    state_dir = str(datamgr_process.state_dir)
    with DataManagerClient(datamgr_process.start().address) as client:
        _, revision = _populate(client, tmp_path)
        assert silod_cli("datamgr", "backup", "--state-dir", state_dir, str(backup)).returncode == 0
        client.allocate_remote_io("j1", 9_000_000)
    datamgr_process.kill()  # its write-ahead log holds its last change

    kept = []
    for _ in range(2):
        restore = subprocess.run(
            ["faketime", "-f", "2026-11-27 10:00:00", *SILOD, "datamgr", "restore", "--state-dir", state_dir,
             str(backup)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert restore.returncode == 0, restore.stderr
        kept.append(Path(restore.stdout.strip().rsplit(" ", 1)[1]))

    assert kept[0] != kept[1] and kept[0].name.startswith("silod.db.replaced-20261127T100000Z")
    assert not Path(f"{kept[1]}-wal").exists()  # nothing of the first's beside the second
    assert [_revision_of(path) for path in kept] == [revision + 1, revision]
