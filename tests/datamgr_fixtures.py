"""Fixtures for a real data manager: in-process on its own thread, or as a `silod` subprocess."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from datamgr.client import DataManagerClient
from datamgr.controller import RoundRequests, snapshot_of
from datamgr.embedded import EmbeddedDataManager
from datamgr.liveness import JobUsage
from datamgr.manager import DataManager, PolicyAllocations
from datamgr.server import ServerConfig
from datamgr.store import SQLiteStore
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling

REMOTE_IO_LIMIT = 1_000_000_000
SILOD = [str(Path(sys.executable).parent / "silod")]  # the installed console script itself
_LISTENING = re.compile(r"data manager listening on ([\d.]+:\d+)")


@dataclass
class RunningDataManager:
    address: str
    client: DataManagerClient
    state_dir: Path


STILL_ALIVE_SECONDS = 3600.0


@pytest.fixture
def datamgr(tmp_path: Path) -> Iterator[RunningDataManager]:
    """A data manager on a fresh state dir with a 1 GB/s remote IO limit, and a client connected to it.

    Nodes registered here never report, so the node timeout is an hour: with the 30 s default, a test that
    runs a dozen CLI processes on a busy machine saw its nodes marked unavailable halfway through. Tests of
    liveness start their own data manager with the timeout they need."""
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, STILL_ALIVE_SECONDS)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        yield RunningDataManager(dm.address, client, config.state_dir)


def make_local_dataset(root: Path, files: int = 8, size: int = 1000) -> str:
    """A small dataset directory under `root`; returns its file:// URI."""
    for i in range(files):
        path = root / f"d{i % 3}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i % 256]) * size)
    return f"file://{root}"


def full_state(client: DataManagerClient) -> tuple[bytes, ...]:
    """Everything the queries show but the clock and what a start begins afresh, serialized, to compare before and
    after a call."""
    nodes = client.call(client.stub.ListNodes, pb.ListNodesRequest())
    for node in nodes.nodes:
        node.ClearField("seconds_since_seen")
        node.ClearField("start_grace")  # whether the node was heard from since the data manager started
    jobs = client.call(client.stub.ListJobs, pb.ListJobsRequest())
    for job in jobs.jobs:  # what a job has held and waited grows with the clock
        job.schedule.ClearField("attained_gpu_seconds")
        job.schedule.ClearField("queued_seconds")
    return (
        client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).SerializeToString(),
        client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).SerializeToString(),
        jobs.SerializeToString(),
        nodes.SerializeToString(),
    )


def until_unavailable(
    client: DataManagerClient, silent: str, reporting: Sequence[str] = (), timeout: float = 30.0
) -> None:
    """Wait until the data manager marks node `silent` unavailable, its --node-timeout after its last contact (a
    node registered by a client and never reporting counts as live until then, and `UnregisterNode` refuses a live
    node), the `reporting` nodes reporting meanwhile so that they stay available."""

    def unavailable() -> bool:
        for node_id in reporting:
            client.call(client.stub.ReportUsage, pb.ReportUsageRequest(node_id=node_id))
        return not client.call(client.stub.GetNode, pb.GetNodeRequest(node_id=silent)).available

    polling.eventually(unavailable, timeout=timeout, interval=0.02, what=f"{silent} marked unavailable")


class DataManagerProcess:
    """`silod datamgr serve` as a child process, for restart, signal and CLI tests."""

    def __init__(
        self, state_dir: Path, log_path: Path, *extra: str, listen: str = "127.0.0.1:0", launcher: Sequence[str] = ()
    ) -> None:
        self.listen = listen
        self.launcher = list(launcher)  # a command the process runs under (a fault injector's)
        self.state_dir = state_dir
        self.log_path = log_path
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        self._log_offset = 0

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to listen."""
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        args = [*SILOD, "datamgr", "serve", "--listen", self.listen, "--state-dir", str(self.state_dir)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([*self.launcher, *args, *self.extra], stdout=log, stderr=log)
        return self.process

    def start(self, timeout: float = 30.0) -> DataManagerProcess:
        """Start the process and wait until it logs the address it listens on."""
        process = self.launch()

        def log() -> str:
            return self.log_path.read_text()[self._log_offset :]

        def listening() -> str | None:
            match = _LISTENING.search(log())
            if match is None and process.poll() is not None:
                raise AssertionError(f"data manager exited before it listened:\n{log()}")
            return None if match is None else match.group(1)

        self.address = polling.eventually(listening, what=lambda: f"data manager listening:\n{log()}", timeout=timeout)
        return self

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def datamgr_process(tmp_path: Path) -> Iterator[DataManagerProcess]:
    """A not-yet-started `silod datamgr serve` on a fresh state dir with a 1 GB/s limit."""
    proc = DataManagerProcess(tmp_path / "state", tmp_path / "datamgr.log", "--remote-io-limit", "1GB/s")
    try:
        yield proc
    finally:
        proc.stop()


def silod_cli(*args: str, datamgr: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `silod` command line as an operator would."""
    env = dict(os.environ)
    if datamgr is not None:
        env["SILOD_DATAMGR"] = datamgr
    return subprocess.run([*SILOD, *args], capture_output=True, text=True, env=env, timeout=60)


def cli(datamgr: DataManagerProcess, *args: str) -> str:
    """`silod ARGS` against a running data manager, which must succeed; its output."""
    result = silod_cli(*args, datamgr=datamgr.address)
    assert result.returncode == 0, result.stderr
    return result.stdout


STREAM_DEADLINE = 30.0


class NodeWatch:
    """A node's watch stream as a test drives it: `next()` waits, up to the stream's deadline, for an event."""

    def __init__(self, call: grpc.CallIterator[pb.WatchEvent]) -> None:
        self._call = call
        self._events = iter(call)

    def next(self) -> pb.WatchEvent:
        return next(self._events)

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves cancel() untyped


def watch(client: DataManagerClient, node_id: str, since: int = 0) -> NodeWatch:
    request = pb.WatchAllocationsRequest(node_id=node_id, since_revision=since)
    return NodeWatch(client.stub.WatchAllocations(request, timeout=STREAM_DEADLINE))


# ---- an in-process data manager owned by a policy ----


@contextlib.asynccontextmanager
async def owned_manager(
    tmp_path: Path,
    policy: str | None,
    remote_io_limit: int = 1000,
    wall_clock: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[tuple[DataManager, RoundRequests]]:
    """A data manager on a fresh state dir whose allocations belong to `policy` (None: external), and its round
    requests; `clock` times its nodes' liveness."""
    store = SQLiteStore(tmp_path / "state")
    requests = RoundRequests()
    manager = DataManager(
        store,
        remote_io_limit=remote_io_limit,
        policy=policy,
        request_round=requests.request,
        wall_clock=wall_clock,
        clock=clock,
    )
    try:
        yield manager, requests
    finally:
        await manager.close()
        store.close()


def allocations(manager: DataManager) -> PolicyAllocations:
    """What the policy that owns `manager`'s allocations allocates through, as its controller does."""
    assert manager.policy_allocations is not None
    return manager.policy_allocations


def damage_tables(path: Path) -> None:
    """Overwrite the last pages of a closed database with random bytes: its header and schema still read, its
    tables do not."""
    data = bytearray(path.read_bytes())
    tail = len(data) - 3 * 4096
    data[tail:] = random.Random(5).randbytes(len(data) - tail)
    path.write_bytes(data)


def done_bytes(manager: DataManager, job_id: str) -> float:
    """What the policy is told the job has read."""
    return snapshot_of(manager, 1000, time.time()).jobs[job_id].done_bytes


def read(job_id: str, bytes_read: int) -> list[JobUsage]:
    """A node's report of one job it serves: what the job has read there since the node mounted it."""
    return [JobUsage(job_id, bytes_read=bytes_read)]
