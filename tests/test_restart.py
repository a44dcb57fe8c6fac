"""A `silod datamgr serve` process killed with SIGKILL and started again on the same state dir serves the
same state and revisions, and watching nodes resume across the restart without loss."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.store.sqlite import SQLiteStore
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import SILOD, DataManagerProcess, full_state, make_local_dataset, silod_cli, watch
from tests.storage_servers import missing_dependency


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
        assert again.returncode == 2 and f"cannot write the backup {backup}: File exists" in again.stderr
        state_dir = str(datamgr_process.state_dir)
        in_use = silod_cli("datamgr", "restore", "--state-dir", state_dir, str(backup))
        assert in_use.returncode == 2 and "in use by another data manager" in in_use.stderr, in_use.stderr
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


def _state_dir_and_its_backup(tmp_path: Path) -> tuple[Path, Path]:
    """A state dir with its (empty) database, and a backup of it taken with `silod datamgr backup`."""
    state_dir, backup = tmp_path / "state", tmp_path / "backup.db"
    SQLiteStore(state_dir).close()
    assert silod_cli("datamgr", "backup", "--state-dir", str(state_dir), str(backup)).returncode == 0
    return state_dir, backup


def test_a_restore_flushes_the_state_dir_after_sqlite_commits_its_copy(tmp_path: Path) -> None:
    """Durability, traced: SQLite commits the restored copy by deleting its rollback journal and does not flush the
    directory after that, so a power loss could bring the journal back and the next open would roll the copy
    back. The restore must flush the state dir after that deletion (and so after its own renames)."""
    if shutil.which("strace") is None:
        missing_dependency("strace is not installed (make setup installs it)")
    state_dir, backup = _state_dir_and_its_backup(tmp_path)
    trace = tmp_path / "trace"

    traced = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=openat,unlink,fsync,fdatasync", "-o", str(trace),
         *SILOD, "datamgr", "restore", "--state-dir", str(state_dir), str(backup)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert traced.returncode == 0, traced.stderr
    calls = trace.read_text().splitlines()
    journal_gone = max(i for i, call in enumerate(calls) if f'unlink("{state_dir}/silod.db-journal")' in call)
    directory_fds = {
        match[1]
        for call in calls
        if (match := re.search(rf'openat\(AT_FDCWD, "{re.escape(str(state_dir))}", [^)]*\) = (\d+)', call))
    }
    flushed = [i for i, call in enumerate(calls) if (m := re.search(r"\b(fsync|fdatasync)\((\d+)\)", call))
               and m[2] in directory_fds]  # fmt: skip
    assert flushed and max(flushed) > journal_gone, "\n".join(calls[journal_gone:])


def test_a_restore_whose_state_dir_cannot_be_flushed_exits_2_saying_it_may_not_last_faked_eio(tmp_path: Path) -> None:
    """libfiu fails the restore's `fsync` (not SQLite's `fdatasync`s): the copy is in place, but not known to be on
    the disk, so the restore is not reported as done."""
    if shutil.which("fiu-run") is None:
        missing_dependency("fiu-run is not installed (make setup installs fiu-utils)")
    state_dir, backup = _state_dir_and_its_backup(tmp_path)

    failed = subprocess.run(
        ["fiu-run", "-x", "-c", "enable name=posix/io/sync/fsync,failinfo=5",
         *SILOD, "datamgr", "restore", "--state-dir", str(state_dir), str(backup)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert failed.returncode == 2, failed.stderr
    assert f"restored {backup} into state dir {state_dir}, but could not flush the directory" in failed.stderr
    assert "Input/output error" in failed.stderr and "restore again" in failed.stderr
    assert "Traceback" not in failed.stderr
