"""The node agent's stop while a storage node hangs: its TCP connections open, no answer (a frozen server, SIGSTOP).

A read inside a backend call waits in a worker thread that cannot be interrupted, until the backend's `read_timeout`
cuts the try (and its retries after it). The stop held on until then, past any service manager's grace (Kubernetes
SIGKILLs after 30 s by default): the stop now abandons such calls at the end of its grace, failing their reads with
EIO, and the agent exits without waiting for their threads (`fuseclient.backend_calls`, `runtime.Stop`)."""

from __future__ import annotations

import errno
import functools
import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pyfuse3
import pytest
import trio

from datamgr.client import DataManagerClient
from datamgr.devservers import S3Server, free_port, running_server, s3_client
from fuseclient.assembly import MountConfig, build_state
from fuseclient.fs import SilodFS
from fuseclient.mounted import MountedJob
from tests.cache_fixtures import entries_on_disk
from tests.cluster_fixtures import eventually
from tests.datamgr_fixtures import DataManagerProcess
from tests.mount_fixtures import MountProcess
from tests.storage_servers import missing_dependency

SIZE = 50_000  # one item per file
READ_TIMEOUT = 600  # seconds: the backend's wait for an answer, far beyond any stop's grace
# Seconds the test gives the agent to exit after its SIGTERM: the stop's grace (5 s) and its 1 s after it, with room
# for a loaded machine, and far below the read timeout, which held the stop before.
STOP_BOUND = 60


@dataclass(frozen=True)
class FreezableS3:
    """A moto server of this test's own, which `freeze` stops (SIGSTOP) as a hung storage node: the kernel keeps its
    connections open and takes the requests sent on them, and nothing answers."""

    server: S3Server
    process: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.server.endpoint_url.rsplit(":", 1)[1])

    def freeze(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def has_unread_requests(self) -> bool:
        """Whether a connection to the server holds bytes it has not read: a request waiting for the frozen server
        (the kernel's own count, `ss`: Recv-Q of the server's end)."""
        listed = subprocess.run(
            ["ss", "-tnH", "state", "established", f"( sport = :{self.port} )"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return any(int(line.split()[0]) > 0 for line in listed.splitlines())


@pytest.fixture
def freezable_s3(tmp_path: Path) -> Iterator[FreezableS3]:
    """A moto server for this test alone (freezing the session's would hang every other test using it); thawed and
    killed at the end, whatever happened."""
    executable = Path(sys.executable).parent / "moto_server"
    if not executable.exists():
        missing_dependency(f"moto_server is not installed next to {sys.executable} (pip install 'moto[server]')")
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "us-east-1", "silod-test", f"silod-secret-{uuid.uuid4().hex}")
    argv = [str(executable), "-H", "127.0.0.1", "-p", str(port)]
    with running_server("moto_server", argv, tmp_path, ready=s3_client(server).list_buckets) as process:
        try:
            yield FreezableS3(server, process)
        finally:
            process.send_signal(signal.SIGCONT)  # a frozen server takes no SIGTERM


def test_an_agent_stopping_while_a_read_waits_on_a_hung_storage_node_exits_after_its_grace_failing_the_read_with_eio(
    tmp_path: Path, datamgr_process: DataManagerProcess, freezable_s3: FreezableS3
) -> None:
    rng = random.Random(5)
    files = {"cached.bin": rng.randbytes(SIZE), "hung.bin": rng.randbytes(SIZE)}
    bucket = f"silod-{uuid.uuid4().hex[:16]}"
    admin = s3_client(freezable_s3.server)
    admin.create_bucket(Bucket=bucket)
    for name, data in files.items():
        admin.put_object(Bucket=bucket, Key=f"data/{name}", Body=data)
    uri = f"s3://{bucket}/data"
    datamgr_process.start()
    node = MountProcess.node(tmp_path / "n1", datamgr_process.address, "n1", "--cache-capacity", "1GiB")
    reader = threading.Thread()
    try:
        node.start()
        with DataManagerClient(datamgr_process.address, timeout=10) as client:
            client.register_dataset(uri, {**freezable_s3.server.backend_options(), "read_timeout": str(READ_TIMEOUT)})
            client.register_job("j1", uri, 100_000_000, [("n1", 1)])
            client.allocate_cache_size(uri, len(files) * SIZE)
            client.allocate_remote_io("j1", 100_000_000)
        job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory")
        assert (job_dir / "cached.bin").read_bytes() == files["cached.bin"]
        eventually(lambda: len(entries_on_disk(node.cache_dir)) == 1, what="cached.bin in the cache")

        freezable_s3.freeze()
        outcome: dict[str, object] = {}

        def read_hung() -> None:
            try:
                outcome["data"] = (job_dir / "hung.bin").read_bytes()
            except OSError as exc:
                outcome["error"] = exc

        reader = threading.Thread(target=read_hung, daemon=True)
        reader.start()
        eventually(freezable_s3.has_unread_requests, what="the read's GET waiting at the frozen server")

        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
        try:
            exit_code = node.process.wait(timeout=STOP_BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent still runs {STOP_BOUND} s after its SIGTERM (the read timeout is {READ_TIMEOUT} s)")
        assert exit_code == 0
        reader.join(timeout=30)
        error = outcome.get("error")
        assert isinstance(error, OSError) and error.errno == errno.EIO, outcome
        assert len(node.log_lines("abandoned 1 backend call ")) == 1

        freezable_s3.thaw()
        node.start()  # on the same cache dir
        job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory again")
        assert node.log_lines(f"restored 1 items ({SIZE} bytes)")
        assert list(entries_on_disk(node.cache_dir).values()) == [SIZE]  # cached.bin's entry, and no other
        assert [path for path in node.cache_dir.rglob("*") if ".tmp-" in path.name] == []
        assert (job_dir / "hung.bin").read_bytes() == files["hung.bin"]
    finally:
        freezable_s3.thaw()  # a frozen server holds the agent's teardown up as it held its stop
        node.stop()
        reader.join(timeout=30)


@pytest.mark.expected_warnings  # the failed reads, named
def test_a_backend_call_the_stop_abandons_fails_its_read_with_eio_and_its_late_answer_never_reaches_the_cache(
    tmp_path: Path, freezable_s3: FreezableS3
) -> None:
    """The FUSE operations driven directly, over the same hung server: the read gets EIO as the stop abandons its
    call, a read after that fails at once, and the abandoned thread, answered once the server thaws, admits nothing
    to the cache."""
    bucket = f"silod-{uuid.uuid4().hex[:16]}"
    admin = s3_client(freezable_s3.server)
    admin.create_bucket(Bucket=bucket)
    rng = random.Random(6)
    for name in ("a.bin", "b.bin"):
        admin.put_object(Bucket=bucket, Key=f"data/{name}", Body=rng.randbytes(SIZE))
    uri = f"s3://{bucket}/data"
    options = {**freezable_s3.server.backend_options(), "read_timeout": str(READ_TIMEOUT)}
    config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"j": uri}, {uri: 2 * SIZE}, backend_options=options)

    async def main() -> None:
        mount = await build_state(config)
        fs, job = SilodFS(mount), mount.jobs["j"]
        dataset = job.dataset
        first, second = await _open(fs, job, 0), await _open(fs, job, 1)
        errors: list[int] = []

        async def read(handle: int) -> None:
            with pytest.raises(pyfuse3.FUSEError) as failed:
                await fs.read(handle, 0, SIZE)
            errors.append(failed.value.errno)

        freezable_s3.freeze()
        async with trio.open_nursery() as guard:
            # A read left waiting for the frozen server would hold the test for the read timeout (a thread's wait
            # cannot be cancelled): the server thaws after a minute whatever happens, and the test fails instead.
            guard.start_soon(_thaw_after, freezable_s3, 60.0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, first)
                waiting = functools.partial(trio.to_thread.run_sync, freezable_s3.has_unread_requests)
                await _eventually(waiting, "the read's GET waiting at the frozen server")
                assert mount.backend_calls.abandon() == (1, 0)
            assert errors == [errno.EIO]
            await read(second)  # after the stop's abandonment: fails at once, asking no storage
            assert errors == [errno.EIO, errno.EIO]
            guard.cancel_scope.cancel()

        freezable_s3.thaw()  # the abandoned call gets its answer

        async def thread_done() -> bool:  # it gives its token back to the limiter as it ends
            return dataset.fetch_limiter.borrowed_tokens == 0

        await _eventually(thread_done, "the abandoned thread done")
        assert dataset.cache.statistics().admitted == 0
        assert entries_on_disk(config.cache_dir) == {}
        for handle in (first, second):
            await fs.release(handle)
        dataset.cache.close()
        dataset.backend.close()

    trio.run(main)


async def _open(fs: SilodFS, job: MountedJob, file_index: int) -> int:
    """A handle on the job's file `file_index`, opened as a reader would: by its path."""
    context = cast(pyfuse3.RequestContext, None)  # the operations never look at the request context
    inode = (await fs.lookup(pyfuse3.ROOT_INODE, job.job_id.encode(), context)).st_ino
    for name in job.dataset.manifest.paths[file_index].split("/"):
        inode = (await fs.lookup(inode, name.encode(), context)).st_ino
    return (await fs.open(inode, os.O_RDONLY, context)).fh


async def _thaw_after(server: FreezableS3, seconds: float) -> None:
    await trio.sleep(seconds)
    server.thaw()


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> None:
    """Poll `check` until it is true; fail naming `what` after `timeout` seconds."""
    with trio.move_on_after(timeout):
        while not await check():
            await trio.sleep(0.05)  # polling observable state, bounded by the deadline
        return
    pytest.fail(f"{what} not reached within {timeout} s")
