"""Rotating a dataset's credentials under a running job, end to end: a data manager and a node agent as processes,
a real FUSE mount, real storage. Once storage refuses the old credentials the job's remote reads fail with EACCES;
`silod dataset set-options` gives the node new ones, and it reads with them without remounting, its cache and its
open files kept."""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from datamgr.client import DataManagerClient
from datamgr.devservers import S3Server
from tests.cache_fixtures import entries_on_disk
from tests.cluster_fixtures import eventually
from tests.credential_fixtures import expiring_sas, node_lacking_a_profile, sas_refused
from tests.datamgr_fixtures import DataManagerProcess, silod_cli
from tests.mount_fixtures import MountProcess
from tests.storage_servers import (
    AzuriteServer,
    DatasetTarget,
    DatasetTargetFactory,
    container_sas,
)

FILES, SIZE = 6, 50_000
POLICY = "rotating"


@pytest.fixture
def files() -> dict[str, bytes]:
    rng = random.Random(11)
    return {f"f{i}.bin": rng.randbytes(SIZE) for i in range(FILES)}


@pytest.fixture
def node(tmp_path: Path, datamgr_process: DataManagerProcess) -> Iterator[MountProcess]:
    """Node n1's agent following a started data manager, stopped after the test."""
    datamgr_process.start()
    agent = MountProcess.node(tmp_path / "n1", datamgr_process.address, "n1", "--cache-capacity", "1GiB")
    try:
        yield agent.start()
    finally:
        agent.stop()


def _start_job(client: DataManagerClient, node: MountProcess, uri: str, options: dict[str, str]) -> Path:
    """Job j1 on n1 reading `uri`, with a quota for its whole dataset; its directory on the node."""
    client.register_dataset(uri, options)
    client.register_job("j1", uri, 100_000_000, [("n1", 1)])
    client.allocate_cache_size(uri, FILES * SIZE)
    client.allocate_remote_io("j1", 100_000_000)
    job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="the job's directory")
    return job_dir


def test_a_job_whose_sas_expired_reads_again_with_the_one_set_options_gives_keeping_its_cache_and_open_files(
    datamgr_process: DataManagerProcess,
    node: MountProcess,
    dataset_target_factory: DatasetTargetFactory,
    azurite: AzuriteServer,
    files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = dataset_target_factory("az")
    for name, data in files.items():
        target.put(name, data)
    old_sas, expire = expiring_sas(azurite, target)
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        job_dir = _start_job(client, node, target.uri, {"account_url": azurite.account_url, "sas_token": old_sas})
    early, late = sorted(files)[:3], sorted(files)[3:]
    for name in early:
        assert (job_dir / name).read_bytes() == files[name]
    eventually(lambda: sum(entries_on_disk(node.cache_dir).values()) == len(early) * SIZE, what="early files cached")

    expire()
    eventually(lambda: sas_refused(old_sas, azurite, target, "f0.bin"), what="storage refusing the old SAS")
    with (job_dir / late[0]).open("rb") as held:
        with pytest.raises(OSError) as denied:
            held.read()
        assert denied.value.errno == errno.EACCES
        for name in early:  # cached: read without storage
            assert (job_dir / name).read_bytes() == files[name]

        new_sas = container_sas(azurite, target.uri)
        monkeypatch.setenv("SILOD_TEST_SAS", new_sas)
        command = ("dataset", "set-options", target.uri, "--option-env", "sas_token=SILOD_TEST_SAS")
        result = silod_cli(*command, datamgr=datamgr_process.address)
        assert result.returncode == 0, result.stderr
        eventually(lambda: node.log_lines("reading with its new options (sas_token replaced)"), what="the swap")
        held.seek(0)
        assert held.read() == files[late[0]]  # a file opened before the new SAS reads with it
    for name in [*early, *late]:
        assert (job_dir / name).read_bytes() == files[name]
    done = time.time()
    job = node.wait_for_stats(lambda s: s["written_at"] > done)["jobs"]["j1"]
    assert job["bytes_from_remote"] == FILES * SIZE  # every file fetched once: the early ones before, from the cache
    assert job["denied_reads"] >= 1
    assert node.process is not None and node.process.poll() is None
    assert len(node.log_lines("items already cached")) == 1  # the dataset was never opened again
    assert not node.log_lines("no longer served here")

    logs = node.log_path.read_text() + datamgr_process.log_path.read_text() + result.stdout + result.stderr
    for secret in (old_sas, new_sas, parse_qs(new_sas)["sig"][0], parse_qs(old_sas)["sig"][0]):
        assert secret not in logs


def _s3_dataset(dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes]) -> DatasetTarget:
    return _dataset_of(dataset_target_factory, "s3", files)


def _dataset_of(dataset_target_factory: DatasetTargetFactory, backend: str, files: dict[str, bytes]) -> DatasetTarget:
    """A fresh dataset target on `backend` holding `files`."""
    target = dataset_target_factory(backend)
    for name, data in files.items():
        target.put(name, data)
    return target


def test_new_options_a_node_cannot_open_leave_it_reading_with_the_old_ones_after_one_error_line(
    tmp_path: Path,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An AWS profile the data manager's host has and the node's lacks: the data manager reads the dataset with it,
    the node cannot even open a backend with it, so it keeps reading with the keys it had."""
    target = _s3_dataset(dataset_target_factory, files)
    node = node_lacking_a_profile(tmp_path, datamgr_process, s3_server, monkeypatch, POLICY)
    try:
        node.start()
        with DataManagerClient(datamgr_process.address, timeout=10) as client:
            job_dir = _start_job(client, node, target.uri, target.options)
            assert (job_dir / "f0.bin").read_bytes() == files["f0.bin"]
            reply = client.update_dataset_options(
                target.uri, {"profile": POLICY}, ["access_key_id", "secret_access_key"]
            )
            assert reply.changed
            error = "reads on with its old options, not the new ones (access_key_id removed, profile set, "
            eventually(lambda: node.log_lines(error), what="the node's error")
            assert (job_dir / "f1.bin").read_bytes() == files["f1.bin"]  # from storage, with the old keys
            client.allocate_cache_size(target.uri, SIZE)  # the dataset again, with the same options
            eventually(lambda: node.log_lines(f"cache quota of {target.uri} = {SIZE} bytes"), what="the new quota")
        assert len(node.log_lines(error)) == 1
        assert "option 'profile': no such AWS profile" in node.log_lines(error)[0]
        assert s3_server.secret_access_key not in node.log_path.read_text()
    finally:
        node.stop()


def test_a_job_whose_dataset_the_node_could_not_open_appears_once_set_options_fixes_the_dataset(
    tmp_path: Path,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node dropped the job with its dataset: set-options opened the dataset, but the job's directory never
    came back until some later change to the job (as after an upgrade refusing options an older silod took)."""
    target = _s3_dataset(dataset_target_factory, files)
    node = node_lacking_a_profile(tmp_path, datamgr_process, s3_server, monkeypatch, POLICY)
    keys = ("access_key_id", "secret_access_key")
    try:
        node.start()
        with DataManagerClient(datamgr_process.address, timeout=10) as client:
            client.register_dataset(target.uri, _by_profile(target))
            client.register_job("j1", target.uri, 100_000_000, [("n1", 1)])
            client.allocate_remote_io("j1", 100_000_000)
            eventually(lambda: node.log_lines("job j1 reads"), what="the node's refusal of the job")
            assert not node.job_dir("j1").exists()

            client.update_dataset_options(target.uri, {key: target.options[key] for key in keys}, ["profile"])

            job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's folder")
            assert (job_dir / "f0.bin").read_bytes() == files["f0.bin"]
        assert len(node.log_lines("job j1 reads")) == 1
    finally:
        node.stop()


def test_a_node_serves_its_mount_and_stops_while_a_profiles_credential_process_hangs(
    tmp_path: Path,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making an S3 client reads the host's profiles and may run a profile's `credential_process` or ask the instance
    metadata service. The agent did it on the mount's loop, so every file system request of every job waited for it,
    and for good where it hangs (an SSO login waiting for a browser), the agent's own stop included. Here the node's
    profile runs `cat` on a pipe that nothing writes."""
    target, local = _s3_dataset(dataset_target_factory, files), _dataset_of(dataset_target_factory, "file", files)
    node, pipe = _node_whose_profile_reads_a_pipe(tmp_path, datamgr_process, s3_server, monkeypatch)
    writer: int | None = None
    try:
        node.start()
        with DataManagerClient(datamgr_process.address, timeout=10) as client:
            job_dir = _start_job(client, node, local.uri, local.options)
            assert (job_dir / "f0.bin").read_bytes() == files["f0.bin"]
            client.register_dataset(target.uri, _by_profile(target))
            client.register_job("j2", target.uri, 100_000_000, [("n1", 1)])
        # Held open, never written: the credential process waits to read.
        writer = eventually(lambda: _open_for_writing(pipe), what="the node's credential process running")

        read: list[bytes] = []
        reader = threading.Thread(target=lambda: read.append((job_dir / "f1.bin").read_bytes()), daemon=True)
        reader.start()
        reader.join(timeout=30)  # a liveness bound, not a speed one: with the loop held the read never ends
        assert read == [files["f1.bin"]], "a read of j1's waited for j2's backend to open"
        assert not node.job_dir("j2").exists()

        node.stop()
        assert node.process is not None and node.process.returncode == 0  # stopped, not killed after 30 s
    finally:
        pipe.unlink()  # the credential processes to come fail at once,
        if writer is not None:
            os.close(writer)  # and the one waiting reads the end of its input
        node.stop()


def _open_for_writing(pipe: Path) -> int | None:
    """`pipe` open to write once a process has it open to read (opened without blocking, that succeeds only then)."""
    try:
        return os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise


def test_a_restarted_node_mounts_the_jobs_of_its_other_datasets_while_one_datasets_credential_process_hangs(
    tmp_path: Path,
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart applies the data manager's snapshot, whose datasets were opened one after another and whose jobs were
    mounted after the last: one dataset's hanging open kept every job's directory from appearing. They open side by
    side now, each followed by its jobs."""
    target, local = _s3_dataset(dataset_target_factory, files), _dataset_of(dataset_target_factory, "file", files)
    node, pipe = _node_whose_profile_reads_a_pipe(tmp_path, datamgr_process, s3_server, monkeypatch)
    writer: int | None = None
    try:
        node.start()
        with DataManagerClient(datamgr_process.address, timeout=10) as client:
            _start_job(client, node, local.uri, local.options)
            node.stop()
            client.register_dataset(target.uri, _by_profile(target))
            client.register_job("j2", target.uri, 100_000_000, [("n1", 1)])
            client.allocate_remote_io("j2", 100_000_000)
        node.start()
        writer = eventually(lambda: _open_for_writing(pipe), what="the node's credential process running")
        job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory")
        assert (job_dir / "f1.bin").read_bytes() == files["f1.bin"]
        assert not node.job_dir("j2").exists()
        credentials = {"Version": 1, "AccessKeyId": s3_server.access_key_id}
        os.write(writer, json.dumps(credentials | {"SecretAccessKey": s3_server.secret_access_key}).encode())
        os.close(writer)
        writer = None
        j2_dir: Path = eventually(lambda: node.job_dir("j2").is_dir() and node.job_dir("j2"), what="j2's directory")
        assert (j2_dir / "f2.bin").read_bytes() == files["f2.bin"]
    finally:
        pipe.unlink()
        if writer is not None:
            os.close(writer)
        node.stop()


def _node_whose_profile_reads_a_pipe(
    tmp_path: Path, datamgr_process: DataManagerProcess, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> tuple[MountProcess, Path]:
    """Node n1's agent (not started) whose AWS profile POLICY gets its credentials from a `credential_process` that
    reads the pipe returned: it waits, as one waiting for a login does, until the test writes them there (JSON) or
    closes it. The data manager has the profile with the S3 server's keys (`node_lacking_a_profile`)."""
    node = node_lacking_a_profile(tmp_path, datamgr_process, s3_server, monkeypatch, POLICY)
    pipe = tmp_path / "credentials.pipe"
    os.mkfifo(pipe)
    node_config = tmp_path / "node-aws-config"
    node_config.write_text(f"[profile {POLICY}]\ncredential_process = cat {pipe}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(node_config))
    return node, pipe


def _by_profile(target: DatasetTarget) -> dict[str, str]:
    """The target's options with its keys replaced by profile POLICY."""
    keys = ("access_key_id", "secret_access_key")
    return {key: value for key, value in target.options.items() if key not in keys} | {"profile": POLICY}
