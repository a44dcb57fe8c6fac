"""A dataset whose backend open hangs on a node, end to end: a data manager and a node agent as processes, a real FUSE
mount, a real S3 server. The node's AWS profile gets its credentials from a `credential_process` that sleeps (as one
waiting for an SSO login does), until the test kills its sleep and it answers with the S3 server's keys.

The open holds only its own dataset: later revisions apply (a rate change, a job on another dataset, the dataset
dropped or given other options) and usage reports go on while it hangs, and so do the other datasets' opens however
many opens hang; past `SLOW_OPEN` the node's WARNING and its usage report name the dataset and the credential
process's command, never its arguments; once the open ends the dataset is served as the data manager sends it then,
or not at all if it no longer does, and a dataset dropped meanwhile has its cache deleted at once. A cache's restore,
held by a named pipe in place of its cache.json, likewise holds neither the other datasets' opens nor the revisions,
and a dataset dropped during it is not served, its restored cache deleted."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.devservers import S3Server
from fuseclient.assembly import dataset_cache_dir
from fuseclient.node_datasets import SLOW_OPEN
from silodlib.backends import open_waits_for
from silodpb.v1 import datamgr_pb2 as pb
from tests.cache_fixtures import entries_on_disk
from tests.cluster_fixtures import eventually
from tests.credential_fixtures import node_lacking_a_profile
from tests.datamgr_fixtures import DataManagerProcess, silod_cli
from tests.mount_fixtures import MountProcess
from tests.storage_servers import DatasetTarget, DatasetTargetFactory

FILES, SIZE = 4, 20_000
PROFILE = "hanging"
COMMAND = "hang-credentials"  # the credential process's program, as the node names it
SECRET_ARGUMENT = "hunter2-not-for-logs"  # an argument of it, which the node must never show
KEYS = ("access_key_id", "secret_access_key")
RATE = 100_000_000
# Opens that hang at once in the tests of many: as many as the threads all opens once shared, which hung opens held for
# good, also once discarded, so that no other dataset on the node opened.
HUNG = 16


@dataclass
class HangingProfile:
    """Node n1's agent (started) whose AWS profile PROFILE runs a credential process that sleeps until `release`."""

    node: MountProcess
    pids: Path  # the sleeps' process ids, one a line, as each credential process starts one

    def running(self) -> bool:
        """Whether a credential process sleeps now."""
        return any(_alive(pid) for pid in self._pids())

    def release(self) -> None:
        """End the sleeps: each credential process then answers with the S3 server's keys."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def started(self) -> int:
        """How many credential processes have started."""
        return len(self._pids())

    def sleeping(self) -> int:
        """How many credential processes sleep now."""
        return sum(1 for pid in self._pids() if _alive(pid))

    def _pids(self) -> list[int]:
        return [int(line) for line in self.pids.read_text().split()] if self.pids.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def files() -> dict[str, bytes]:
    rng = random.Random(23)
    return {f"f{i}.bin": rng.randbytes(SIZE) for i in range(FILES)}


@pytest.fixture
def hanging(
    tmp_path: Path, datamgr_process: DataManagerProcess, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HangingProfile]:
    """The data manager with profile PROFILE as plain keys (`node_lacking_a_profile`), node n1's agent with it as a
    credential process that sleeps; the agent stopped and every sleep ended after the test."""
    node = node_lacking_a_profile(tmp_path, datamgr_process, s3_server, monkeypatch, PROFILE)
    answer = tmp_path / "credentials.json"
    answer.write_text(
        json.dumps(
            {"Version": 1, "AccessKeyId": s3_server.access_key_id, "SecretAccessKey": s3_server.secret_access_key}
        )
    )
    answer.chmod(0o600)
    pids = tmp_path / "sleeps"
    script = tmp_path / COMMAND
    script.write_text(f"#!/bin/sh\nsleep 3600 &\necho $! >> {pids}\nwait $!\ncat {answer}\n")
    script.chmod(0o700)
    config = tmp_path / "node-aws-config"
    config.write_text(f"[profile {PROFILE}]\ncredential_process = {script} --password {SECRET_ARGUMENT}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    profile = HangingProfile(node, pids)
    try:
        node.start()
        yield profile
    finally:
        profile.release()
        node.stop()


def _dataset(factory: DatasetTargetFactory, backend: str, files: dict[str, bytes]) -> DatasetTarget:
    target = factory(backend)
    for name, data in files.items():
        target.put(name, data)
    return target


def _by_profile(target: DatasetTarget) -> dict[str, str]:
    """The target's options with its keys replaced by profile PROFILE."""
    return {key: value for key, value in target.options.items() if key not in KEYS} | {"profile": PROFILE}


def _start_job(client: DataManagerClient, job_id: str, uri: str, rate: int = RATE) -> None:
    client.register_job(job_id, uri, rate, [("n1", 1)])
    client.allocate_remote_io(job_id, rate)


def _job_dir(node: MountProcess, job_id: str) -> Path:
    found: Path = eventually(
        lambda: node.job_dir(job_id).is_dir() and node.job_dir(job_id), what=f"{job_id}'s directory"
    )
    return found


def _reported_bytes_read(client: DataManagerClient, job_id: str) -> int:
    job = client.call(client.stub.GetJob, pb.GetJobRequest(job_id=job_id))
    return sum(usage.bytes_read for usage in job.usage if usage.node_id == "n1")


def _status(address: str) -> str:
    result = silod_cli("status", datamgr=address)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _stuck_lines(address: str, uri: str) -> list[str]:
    return [line for line in _status(address).splitlines() if line.startswith(f"  node n1 cannot open {uri}")]


def test_later_revisions_apply_and_reports_go_on_while_a_datasets_credential_process_hangs_then_it_is_served(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    files: dict[str, bytes],
) -> None:
    """The open of j2's dataset held the revision that sent it, so every later one (j1's new rate, job j3) waited
    behind it, and so did the usage reports (they take the same lock to try unopened datasets again): for as long as
    the credential process hung, for good where it waits for a login."""
    node, address = hanging.node, datamgr_process.address
    local = _dataset(dataset_target_factory, "file", files)
    stuck = _dataset(dataset_target_factory, "s3", files)
    with DataManagerClient(address, timeout=10) as client:
        client.register_dataset(local.uri, local.options)
        _start_job(client, "j1", local.uri)
        j1 = _job_dir(node, "j1")
        assert (j1 / "f0.bin").read_bytes() == files["f0.bin"]

        client.register_dataset(stuck.uri, _by_profile(stuck))
        _start_job(client, "j2", stuck.uri)
        eventually(hanging.running, what="the node's credential process sleeping")

        client.allocate_remote_io("j1", RATE // 2)
        eventually(lambda: node.log_lines(f"remote IO of job j1 = {RATE // 2} bytes/s"), what="j1's new rate")
        _start_job(client, "j3", local.uri)
        assert (_job_dir(node, "j3") / "f1.bin").read_bytes() == files["f1.bin"]
        assert (j1 / "f1.bin").read_bytes() == files["f1.bin"]
        eventually(lambda: _reported_bytes_read(client, "j1") == 2 * SIZE, what="j1's reads reported")
        assert hanging.running() and not node.job_dir("j2").exists()

        # Past SLOW_OPEN the node says which dataset is stuck opening, and on what: in its log and its usage report.
        (shown,) = eventually(lambda: _stuck_lines(address, stuck.uri), timeout=SLOW_OPEN + 30, what="status line")
        assert f"so job j2 waits there: its backend has not opened in {SLOW_OPEN:g} s" in shown
        assert f"credential_process {COMMAND!r} of AWS profile {PROFILE!r}" in shown
        (warning,) = node.log_lines("has not opened in")
        assert "WARNING" in warning and f"credential_process {COMMAND!r}" in warning and stuck.uri in warning
        assert "(backend opens holding a thread each on this node until they return: 1)" in warning

        hanging.release()
        j2 = _job_dir(node, "j2")
        assert (j2 / "f2.bin").read_bytes() == files["f2.bin"]
        eventually(lambda: not _stuck_lines(address, stuck.uri), what="the status line gone")
    assert len(node.log_lines("has not opened in")) == 1
    assert node.log_lines(f"dataset {stuck.uri}: its backend opened after")
    shown_anywhere = node.log_path.read_text() + datamgr_process.log_path.read_text() + _status(address)
    assert SECRET_ARGUMENT not in shown_anywhere and s3_server.secret_access_key not in shown_anywhere


def test_a_dataset_dropped_while_its_open_hangs_is_not_served_when_the_open_ends(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
) -> None:
    node = hanging.node
    stuck = _dataset(dataset_target_factory, "s3", files)
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        client.register_dataset(stuck.uri, _by_profile(stuck))
        _start_job(client, "j2", stuck.uri)
        eventually(hanging.running, what="the node's credential process sleeping")
        client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j2"))
        eventually(lambda: node.log_lines(f"dataset {stuck.uri} is no longer wanted here"), what="the drop applied")

        hanging.release()
        eventually(lambda: node.log_lines(f"dataset {stuck.uri}: its backend opened after"), what="the late open")
        served = node.wait_for_stats(lambda s: s["written_at"] > os.stat(node.log_path).st_mtime)["datasets"]
    assert stuck.uri not in served
    assert not dataset_cache_dir(node.cache_dir, stuck.uri).exists()
    assert not node.log_lines("items already cached") and not node.log_lines("no longer served here")


def test_a_dataset_given_other_options_while_its_open_hangs_is_served_with_them_and_the_late_open_changes_nothing(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
) -> None:
    """The operator gives the dataset keys instead of the hanging profile: the node opens it with them at once, and
    the hung open, answering later, neither replaces the dataset nor opens it again with the profile."""
    node = hanging.node
    stuck = _dataset(dataset_target_factory, "s3", files)
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        client.register_dataset(stuck.uri, _by_profile(stuck))
        _start_job(client, "j2", stuck.uri)
        eventually(hanging.running, what="the node's credential process sleeping")
        client.update_dataset_options(stuck.uri, {key: stuck.options[key] for key in KEYS}, ["profile"])
        j2 = _job_dir(node, "j2")
        assert (j2 / "f0.bin").read_bytes() == files["f0.bin"]
        assert hanging.running()

        hanging.release()
        eventually(lambda: node.log_lines(f"dataset {stuck.uri}: its backend opened after"), what="the late open")
        assert (j2 / "f1.bin").read_bytes() == files["f1.bin"]
    assert len(node.log_lines("items already cached")) == 1  # opened once, with the keys
    assert not node.log_lines("no longer served here") and not node.log_lines("reading with its new options")


@pytest.mark.parametrize(
    ("options", "profile", "shown"),
    [
        ({"profile": "p"}, "", "the credential_process 'wait-for-login' of AWS profile 'p'"),
        ({"profile": "role"}, "", "the credential_process 'wait-for-login' of AWS profile 'p'"),
        ({}, "p", "the credential_process 'wait-for-login' of AWS profile 'p'"),
        ({"profile": "sso"}, "", "the SSO login of AWS profile 'sso'"),
        ({}, "", "boto3's default credential chain (a container's credential endpoint, the instance metadata service)"),
        ({"access_key_id": "AKIA", "secret_access_key": "s"}, "p", ""),
    ],
    ids=["its-profile", "a-role-sourced-from-it", "AWS_PROFILE", "sso", "default-chain", "keys"],
)
def test_what_an_s3_open_waits_for_names_a_credential_process_by_its_program_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str], profile: str, shown: str
) -> None:
    """The hint the stuck open's WARNING and report carry: a credential process's arguments may hold a password."""
    config = tmp_path / "aws-config"
    config.write_text(
        f'[profile p]\ncredential_process = "/opt/my tools/wait-for-login" --password {SECRET_ARGUMENT}\n'
        "[profile role]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = p\n"
        "[profile sso]\nsso_start_url = https://example.awsapps.com/start\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    if profile:
        monkeypatch.setenv("AWS_PROFILE", profile)
    assert open_waits_for("s3://bucket/data", options) == shown
    assert open_waits_for("file:///data", {}) == ""


def _reaches(count: Callable[[], int], n: int) -> Callable[[], bool]:
    return lambda: count() == n


def _hang_by_option_changes(
    hanging: HangingProfile, client: DataManagerClient, factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    """The operator tries other options on a dataset whose open hangs (any change does): each discards the open."""
    stuck = _dataset(factory, "s3", files)
    client.register_dataset(stuck.uri, _by_profile(stuck))
    _start_job(client, "s0", stuck.uri)
    for i in range(1, HUNG):
        eventually(_reaches(hanging.started, i), what=f"credential process {i}")
        client.update_dataset_options(stuck.uri, {"read_timeout": str(30 + i)})


def _hang_by_drop_cycles(
    hanging: HangingProfile, client: DataManagerClient, factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    """Short jobs, one after another, on a dataset whose open hangs: each one's end drops it from the node."""
    stuck = _dataset(factory, "s3", files)
    client.register_dataset(stuck.uri, _by_profile(stuck))
    dropped = f"dataset {stuck.uri} is no longer wanted here"
    for i in range(HUNG):
        _start_job(client, f"s{i}", stuck.uri)
        eventually(_reaches(hanging.started, i + 1), what=f"credential process {i + 1}")
        client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id=f"s{i}"))
        eventually(_reaches(lambda: len(hanging.node.log_lines(dropped)), i + 1), what=f"drop {i + 1}")


def _hang_by_datasets_sharing_the_profile(
    hanging: HangingProfile, client: DataManagerClient, factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    """Datasets that share one profile whose credential process hangs (an expired SSO login)."""
    for i in range(HUNG):
        stuck = _dataset(factory, "s3", files)
        client.register_dataset(stuck.uri, _by_profile(stuck))
        _start_job(client, f"s{i}", stuck.uri, RATE // HUNG // 10)  # the node's remote IO limit: 10 * RATE


@pytest.mark.parametrize(
    "hang",
    [_hang_by_option_changes, _hang_by_drop_cycles, _hang_by_datasets_sharing_the_profile],
    ids=["option-changes-on-one-dataset", "drop-cycles-of-one-dataset", "datasets-sharing-the-profile"],
)
def test_opens_that_hang_never_keep_another_dataset_from_opening_however_many_hang_or_were_discarded(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
    hang: Callable[[HangingProfile, DataManagerClient, DatasetTargetFactory, dict[str, bytes]], None],
) -> None:
    """All opens shared 16 threads, and one that hung kept its thread for good, also once discarded (its dataset given
    other options, or dropped): after 16 no dataset on the node opened, neither one of plain keys nor a local one,
    while the WARNING said the node's other datasets went on."""
    node = hanging.node
    keyed = _dataset(dataset_target_factory, "s3", files)  # its keys in its options: its open runs no process
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        hang(hanging, client, dataset_target_factory, files)
        eventually(lambda: hanging.sleeping() == HUNG, what=f"{HUNG} credential processes sleeping")
        client.register_dataset(keyed.uri, keyed.options)
        _start_job(client, "k", keyed.uri)
        assert (_job_dir(node, "k") / "f3.bin").read_bytes() == files["f3.bin"]
        assert hanging.sleeping() == HUNG


def test_a_dataset_dropped_while_its_open_hangs_has_its_cache_deleted_at_once_not_at_the_next_snapshot(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
) -> None:
    """A dataset cached by an earlier run of the agent, whose open now hangs, dropped: its cache stayed on disk (only
    the sweep after the next snapshot freed it) while the data manager counted its space free."""
    node = hanging.node
    target = _dataset(dataset_target_factory, "s3", files)
    where = dataset_cache_dir(node.cache_dir, target.uri)
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        client.register_dataset(target.uri, target.options)
        client.allocate_cache_size(target.uri, FILES * SIZE)
        _start_job(client, "j2", target.uri)
        j2 = _job_dir(node, "j2")
        for name, data in files.items():
            assert (j2 / name).read_bytes() == data
        eventually(lambda: len(entries_on_disk(where)) == FILES, what="every file cached")
        node.stop()
        client.update_dataset_options(target.uri, {"profile": PROFILE}, list(KEYS))
        node.start()
        eventually(hanging.running, what="the node's credential process sleeping")
        assert len(entries_on_disk(where)) == FILES

        client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j2"))
        eventually(lambda: not where.exists() and not entries_on_disk(node.cache_dir), what="the cache deleted")
        assert hanging.running()
        (dropped,) = node.log_lines(f"dataset {target.uri} is no longer wanted here")
        assert "its cache directory is being deleted" in dropped

        hanging.release()
        eventually(lambda: node.log_lines(f"dataset {target.uri}: its backend opened after"), what="the late open")
        served = node.wait_for_stats(lambda s: s["written_at"] > os.stat(node.log_path).st_mtime)["datasets"]
    assert target.uri not in served and not where.exists()


class HeldRestore:
    """A dataset's cache directory, made before the node opens the dataset, whose `cache.json` is a named pipe: the
    node's restore of that cache (`DatasetCache`, reading it) blocks until `release`, which closes the pipe unwritten
    (read as an unreadable cache.json: the restore then drops the items and writes a new one)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True)
        self.pipe = directory / "cache.json"
        os.mkfifo(self.pipe, 0o600)
        self._writer: int | None = None

    def blocked(self) -> bool:
        """Whether the restore reads the pipe now; from then on it stays blocked until `release`. (Opening the
        pipe's writing end without waiting fails with ENXIO until a reader has it open.)"""
        if self._writer is None:
            self._writer = os.open(self.pipe, os.O_WRONLY | os.O_NONBLOCK)
        return True

    def release(self) -> None:
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None


@contextlib.contextmanager
def _held_restore(directory: Path) -> Iterator[HeldRestore]:
    held = HeldRestore(directory)
    try:
        yield held
    finally:
        with contextlib.suppress(OSError):  # a restore still blocked, or starting to read, must end for the stop
            held.blocked()
        held.release()


def _served(client: DataManagerClient, node: MountProcess, target: DatasetTarget, job_id: str) -> Path:
    """`target` served through a job `job_id` on n1: its directory, once there (the node has its snapshot by then, and
    its sweep of unserved caches done)."""
    client.register_dataset(target.uri, target.options)
    _start_job(client, job_id, target.uri)
    return _job_dir(node, job_id)


def test_a_datasets_restore_holds_neither_another_datasets_open_nor_a_revision(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
) -> None:
    """A dataset's cache restore, however long (a cache of a million items scans for a minute), held every other
    dataset's first open and every revision: the restore ran under the agent's lock."""
    node = hanging.node
    served, slow, other = (_dataset(dataset_target_factory, "s3", files) for _ in range(3))
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        _served(client, node, served, "j1")
        with _held_restore(dataset_cache_dir(node.cache_dir, slow.uri)) as held:
            client.register_dataset(slow.uri, slow.options)
            _start_job(client, "j2", slow.uri)
            eventually(held.blocked, what="the restore of the slow dataset's cache under way")

            j3 = _served(client, node, other, "j3")
            assert (j3 / "f0.bin").read_bytes() == files["f0.bin"]
            client.allocate_remote_io("j1", RATE // 2)
            eventually(lambda: node.log_lines(f"remote IO of job j1 = {RATE // 2} bytes/s"), what="the rate change")
            assert not node.job_dir("j2").exists()
            assert not node.log_lines(f"cache of {slow.uri}: restored")

            held.release()
            j2 = _job_dir(node, "j2")
    for name, data in files.items():
        assert (j2 / name).read_bytes() == data


def test_a_dataset_dropped_while_its_cache_restores_is_not_served_and_its_cache_is_deleted(
    hanging: HangingProfile,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
) -> None:
    """The drop applies while the restore runs, leaving the directory to it: the restore ends, the dataset is not
    served, and the cache it restored is deleted with its directory."""
    node = hanging.node
    served, slow = (_dataset(dataset_target_factory, "s3", files) for _ in range(2))
    where = dataset_cache_dir(node.cache_dir, slow.uri)
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        _served(client, node, served, "j1")
        with _held_restore(where) as held:
            client.register_dataset(slow.uri, slow.options)
            _start_job(client, "j2", slow.uri)
            eventually(held.blocked, what="the restore of the slow dataset's cache under way")
            client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j2"))
            (dropped,) = eventually(
                lambda: node.log_lines(f"dataset {slow.uri} is no longer wanted here"), what="the drop applied"
            )
            assert "deleted as it opens" in dropped
            assert where.exists()  # left to the restore, which reads in it

            held.release()
            eventually(lambda: node.log_lines(f"dataset {slow.uri} was dropped while its cache opened"), what="the end")
            aside = f"{where.name}.removed-*"
            eventually(lambda: not where.exists() and not list(where.parent.glob(aside)), what="the cache deleted")
        stats = node.wait_for_stats(lambda s: s["written_at"] > os.stat(node.log_path).st_mtime)
    assert slow.uri not in stats["datasets"] and served.uri in stats["datasets"]
    assert not node.job_dir("j2").exists()
