"""A failed read costs storage one request, not two: Linux asks again for a page whose read failed (its read-ahead,
then the page itself), and the read path answers that re-request with the failure it just got
(`readpath.FailedFetch`), while a read through another open, a re-read after the window and a read after the
backend was swapped (rotated credentials) ask storage again.

Storage requests are counted by a fault proxy in front of the real server (moto, Azurite). Through a real mount the
kernel makes the re-request; driven directly (no kernel), the FUSE operations make it under trio's MockClock, so the
window is crossed by moving the clock, not by waiting."""

from __future__ import annotations

import errno
import gc
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import pyfuse3
import pytest
import trio
import trio.testing

from datamgr.devservers import AzuriteServer
from fuseclient.assembly import MountConfig, build_state
from fuseclient.fs import SilodFS
from fuseclient.mounted import MountState
from fuseclient.readpath import RE_REQUEST_WINDOW
from silodlib.backends import RetryingBackend, RetryPolicy, open_backend
from tests import polling
from tests.credential_fixtures import expiring_sas, sas_refused
from tests.fault_proxy import AZURE_SERVER_BUSY, S3_SLOW_DOWN, FaultProxy
from tests.mount_fixtures import MountFactory, MountProcess, options_args
from tests.storage_servers import DatasetTarget, DatasetTargetFactory

FAULTY, OTHER = "faulty.bin", "other.bin"
SIZE = 256 * 1024  # one item: one backend GET per fetch
ATTEMPTS = RetryPolicy().attempts  # the tries of one fetch the backend answers "busy"
CTX = cast(pyfuse3.RequestContext, None)  # the operations never look at the request context


@pytest.fixture
def files() -> dict[str, bytes]:
    rng = random.Random(31)
    return {FAULTY: rng.randbytes(SIZE), OTHER: rng.randbytes(SIZE)}


@contextmanager
def _proxied(target: DatasetTarget, options: dict[str, str]) -> Iterator[tuple[FaultProxy, dict[str, str]]]:
    """A fault proxy in front of `target`'s server, and `options` with the server's URL pointing at the proxy."""
    url_option = "endpoint_url" if "endpoint_url" in options else "account_url"
    server = urlsplit(options[url_option])
    assert server.hostname is not None and server.port is not None
    with FaultProxy((server.hostname, server.port)) as proxy:
        yield proxy, {**options, url_option: proxy.url + server.path}


def _target(factory: DatasetTargetFactory, backend: str, files: dict[str, bytes]) -> DatasetTarget:
    target = factory(backend)
    for name, data in files.items():
        target.put(name, data)
    return target


def _read(path: Path) -> bytes | int:
    """The file's bytes, or the errno its read failed with."""
    try:
        return path.read_bytes()
    except OSError as exc:
        assert exc.errno is not None
        return exc.errno


def _job_stats_after(mount: MountProcess, moment: float) -> dict[str, Any]:
    """Job "job"'s statistics as written after `moment` (wall clock): its counters once the reads before it ended."""
    stats: dict[str, Any] = mount.wait_for_stats(lambda s: s["written_at"] > moment)["jobs"]["job"]
    return stats


# --- through a real mount: the kernel's own re-request ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["s3", "az"])
def test_a_read_of_an_object_deleted_from_storage_fails_with_eio_asking_storage_once_though_the_kernel_asks_twice(
    mount_factory: MountFactory, dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes], backend: str
) -> None:
    target = _target(dataset_target_factory, backend, files)
    with _proxied(target, target.options) as (proxy, options):
        mount = mount_factory({"job": target.uri}, *options_args(options))
        target.delete(FAULTY)  # after the listing: storage answers 404, which is not retried

        assert _read(mount.job_dir("job") / FAULTY) == errno.EIO
        assert len(proxy.gets(FAULTY)) == 1  # before: 2, the kernel's re-request fetched again
        job = _job_stats_after(mount, time.time())
        assert job["failed_reads"] >= 2 and job["denied_reads"] == 0  # counted per kernel request, as documented

        assert _read(mount.job_dir("job") / FAULTY) == errno.EIO  # the loader's retry, opening the file again
        assert len(proxy.gets(FAULTY)) == 2  # asked storage at once, without waiting out any window
        assert _read(mount.job_dir("job") / OTHER) == files[OTHER]


def test_a_read_storage_refuses_fails_with_eacces_asking_storage_once_though_the_kernel_asks_twice(
    mount_factory: MountFactory,
    dataset_target_factory: DatasetTargetFactory,
    azurite: AzuriteServer,
    files: dict[str, bytes],
) -> None:
    target = _target(dataset_target_factory, "az", files)
    sas, expire = expiring_sas(azurite, target)
    with _proxied(target, {"account_url": azurite.account_url, "sas_token": sas}) as (proxy, options):
        mount = mount_factory({"job": target.uri}, *options_args(options))
        expire()
        polling.eventually(lambda: sas_refused(sas, azurite, target, OTHER), what="storage refusing the SAS")

        assert _read(mount.job_dir("job") / FAULTY) == errno.EACCES
        assert len(proxy.gets(FAULTY)) == 1  # before: 2
        job = _job_stats_after(mount, time.time())
        assert job["denied_reads"] >= 2 and job["failed_reads"] == job["denied_reads"]

        assert _read(mount.job_dir("job") / FAULTY) == errno.EACCES  # a retry through a new open asks storage
        assert len(proxy.gets(FAULTY)) == 2


@pytest.mark.parametrize("backend", ["s3", "az"])
def test_an_outage_of_busy_answers_from_the_fault_proxy_costs_a_failed_read_its_tries_once_not_twice(
    mount_factory: MountFactory, dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes], backend: str
) -> None:
    """Storage shedding load (S3's 503 SlowDown, Azure's ServerBusy) for longer than a fetch's tries: each failed
    `read(2)` used to send the tries twice, the kernel's re-request sending them again into the overload."""
    target = _target(dataset_target_factory, backend, files)
    with _proxied(target, target.options) as (proxy, options):
        proxy.busy(FAULTY, 1_000_000, S3_SLOW_DOWN if backend == "s3" else AZURE_SERVER_BUSY)
        mount = mount_factory({"job": target.uri}, *options_args(options))

        assert _read(mount.job_dir("job") / FAULTY) == errno.EIO
        assert [g.fault for g in proxy.gets(FAULTY)] == ["busy"] * ATTEMPTS  # before: twice as many

        proxy.heal()  # the outage ends: the loader's retry reads the bytes, asking storage at once
        assert _read(mount.job_dir("job") / FAULTY) == files[FAULTY]
        assert [g.fault for g in proxy.gets(FAULTY)] == ["busy"] * ATTEMPTS + [None]


# --- the FUSE operations driven directly: the window and the backend swap ----------------------------------------


class Reads:
    """The FUSE operations over an in-process mount of job "job" reading an S3 dataset through a fault proxy."""

    def __init__(self, mount: MountState, proxy: FaultProxy, target: DatasetTarget, options: dict[str, str]) -> None:
        self.mount = mount
        self.fs = SilodFS(mount)
        self.proxy = proxy
        self.target = target
        self.options = options
        self.job = mount.jobs["job"]

    async def open(self, name: str) -> int:
        job_dir = await self.fs.lookup(pyfuse3.ROOT_INODE, b"job", CTX)
        entry = await self.fs.lookup(job_dir.st_ino, name.encode(), CTX)
        return (await self.fs.open(entry.st_ino, 0, CTX)).fh

    async def read(self, fh: int) -> bytes | int:
        """What a read of the whole file through `fh` gets: its bytes, or the errno it failed with."""
        try:
            return await self.fs.read(fh, 0, SIZE)
        except pyfuse3.FUSEError as exc:
            return exc.errno

    def gets(self) -> int:
        return len(self.proxy.gets(FAULTY))


def _run_reads(
    tmp_path: Path,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
    scenario: Callable[[Reads, trio.testing.MockClock], Awaitable[None]],
) -> None:
    """Run `scenario` over an S3 dataset whose FAULTY object was deleted after it was listed, under a MockClock that
    moves only when the scenario moves it."""
    target = _target(dataset_target_factory, "s3", files)
    with _proxied(target, target.options) as (proxy, options):
        config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": target.uri}, backend_options=options)

        async def main() -> None:
            mount = await build_state(config)
            target.delete(FAULTY)
            await scenario(Reads(mount, proxy, target, options), clock)
            for dataset in mount.datasets.values():
                dataset.cache.close()

        clock = trio.testing.MockClock()
        trio.run(main, clock=clock)


@pytest.mark.expected_warnings  # the failed reads' WARNING line
def test_a_reread_through_the_same_open_gets_the_failure_within_the_window_and_asks_storage_after_it(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    async def scenario(reads: Reads, clock: trio.testing.MockClock) -> None:
        fh = await reads.open(FAULTY)
        assert await reads.read(fh) == errno.EIO
        reads.target.put(FAULTY, files[FAULTY])  # the same bytes, the same ETag: storage would serve them now
        assert await reads.read(fh) == errno.EIO  # the re-request: the same failure, storage not asked
        assert reads.gets() == 1
        assert reads.job.failed_reads == 2  # each counted, as the kernel's requests are

        clock.jump(RE_REQUEST_WINDOW)
        assert await reads.read(fh) == files[FAULTY]
        assert reads.gets() == 2

    _run_reads(tmp_path, dataset_target_factory, files, scenario)


@pytest.mark.expected_warnings
def test_a_read_through_another_open_of_the_file_asks_storage_within_the_window(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    async def scenario(reads: Reads, clock: trio.testing.MockClock) -> None:
        failed = await reads.open(FAULTY)
        assert await reads.read(failed) == errno.EIO
        reads.target.put(FAULTY, files[FAULTY])
        assert await reads.read(failed) == errno.EIO
        assert reads.gets() == 1

        assert await reads.read(await reads.open(FAULTY)) == files[FAULTY]  # the loader's retry opens the file again
        assert reads.gets() == 2

    _run_reads(tmp_path, dataset_target_factory, files, scenario)


def test_a_failure_is_forgotten_when_the_dataset_backend_is_swapped_and_does_not_keep_the_old_backend(
    tmp_path: Path,
    dataset_target_factory: DatasetTargetFactory,
    files: dict[str, bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What `silod dataset set-options` does on the node (`NodeAgent._replace_backend`): rotated credentials are read
    with at once, also by an open file whose read the old ones failed a moment ago."""
    caplog.set_level(logging.ERROR, logger="fuseclient.fs")  # a record of the failure would hold the old backend

    async def scenario(reads: Reads, clock: trio.testing.MockClock) -> None:
        fh = await reads.open(FAULTY)
        assert await reads.read(fh) == errno.EIO
        reads.target.put(FAULTY, files[FAULTY])
        assert await reads.read(fh) == errno.EIO
        assert reads.gets() == 1

        dataset = reads.job.dataset
        old = weakref.ref(dataset.backend)
        dataset.backend = RetryingBackend(open_backend(reads.target.uri, reads.options))
        await trio.lowlevel.checkpoint()  # trio's run loop drops the last outcome it sent this task: the failure
        gc.collect()
        assert old() is None  # the open file's failure holds no reference to it
        assert await reads.read(fh) == files[FAULTY]  # the clock has not moved: the swap alone
        assert reads.gets() == 2

    _run_reads(tmp_path, dataset_target_factory, files, scenario)


@pytest.mark.expected_warnings  # the first read's failure, named
def test_a_read_that_joined_a_fetch_the_old_credentials_began_fetches_again_once_the_backend_is_swapped(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    """Credentials rotated while a fetch through the old ones is under way: the read that began it fails with them,
    but a read that joined it meanwhile fetches again through the new backend instead of taking the old failure.
    The old backend's first GET hangs (the fault proxy) until its read deadline, 1 s: the window for the swap."""
    target = _target(dataset_target_factory, "s3", files)
    with _proxied(target, {**target.options, "read_timeout": "1"}) as (proxy, options):
        proxy.stall(FAULTY, 1, after_bytes=0)
        proxy.busy(FAULTY, 1_000_000)  # and every try after it: the old credentials get nothing
        config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": target.uri}, backend_options=options)
        results: dict[str, bytes | int] = {}

        async def main() -> None:
            reads = Reads(await build_state(config), proxy, target, options)
            began, joined = await reads.open(FAULTY), await reads.open(FAULTY)

            async def read(name: str, fh: int) -> None:
                results[name] = await reads.read(fh)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, "began", began)
                while not proxy.stalls_in_progress():
                    await trio.sleep(0.01)
                nursery.start_soon(read, "joined", joined)
                await trio.testing.wait_all_tasks_blocked()  # it waits for the fetch under way
                dataset = reads.job.dataset
                dataset.backend = RetryingBackend(open_backend(target.uri, target.options))  # straight to storage
            dataset.cache.close()

        trio.run(main)
    assert results == {"began": errno.EIO, "joined": files[FAULTY]}


@pytest.mark.expected_warnings
def test_concurrent_reads_of_a_failing_item_share_one_fetch_and_their_re_requests_ask_storage_for_nothing(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory, files: dict[str, bytes]
) -> None:
    async def scenario(reads: Reads, clock: trio.testing.MockClock) -> None:
        handles = [await reads.open(FAULTY) for _ in range(3)]
        outcomes: list[bytes | int] = []

        async def read(fh: int) -> None:
            outcomes.append(await reads.read(fh))

        async with trio.open_nursery() as nursery:
            for fh in handles:
                nursery.start_soon(read, fh)
        assert outcomes == [errno.EIO] * 3 and reads.gets() == 1  # one fetch, its failure given to each

        for fh in handles:  # each open's re-request: before, each fetched again
            assert await reads.read(fh) == errno.EIO
        assert reads.gets() == 1

    _run_reads(tmp_path, dataset_target_factory, files, scenario)
