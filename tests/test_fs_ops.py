"""The FUSE operations and read path driven directly (no kernel), over a real local backend and cache:
epoch accounting, hit ratios under a quota, and one backend fetch per concurrent miss."""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import random
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import grpc
import pyfuse3
import pytest
import trio
import trio.testing
from azure.storage.blob import ContainerSasPermissions
from bitarray import bitarray

from fuseclient import readpath
from fuseclient.agent import AgentConfig, NodeAgent
from fuseclient.assembly import MountConfig, build_state
from fuseclient.fs import SilodFS
from fuseclient.mounted import EpochRecord, MountedJob, MountState
from fuseclient.read_buffers import DEFAULT_READ_BUFFER_BYTES, ReadBuffers
from fuseclient.runtime import _write_statistics_every
from silodlib.backends import AccessDenied, Backend
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc
from tests.storage_servers import AzuriteServer, DatasetTargetFactory, container_sas

CTX = cast(pyfuse3.RequestContext, None)  # the operations never look at the request context
FILES, SIZE = 100, 5000


def _dataset(root: Path) -> str:
    rng = random.Random(5)
    for i in range(FILES):
        path = root / f"c{i % 7}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(SIZE))
    return f"file://{root}"


def _run(
    tmp_path: Path,
    quota: int,
    scenario: Callable[[MountState, SilodFS], Awaitable[None]],
    io_rates: dict[str, int] | None = None,
) -> None:
    """Run `scenario` over a mount of one dataset read by job "job", or by the jobs `io_rates` names."""
    uri = _dataset(tmp_path / "ds")
    jobs = dict.fromkeys(io_rates or ["job"], uri)
    config = MountConfig(tmp_path / "mnt", tmp_path / "cache", jobs, cache_sizes={uri: quota}, io_rates=io_rates or {})

    async def main() -> None:
        mount = await build_state(config)
        await scenario(mount, SilodFS(mount))
        for dataset in mount.datasets.values():
            dataset.cache.close()

    trio.run(main)


async def _read_epoch(fs: SilodFS, job: MountedJob, rng: random.Random) -> None:
    """Open and read every file once, in a fresh random order, as a DL data loader does."""
    job_dir = await fs.lookup(pyfuse3.ROOT_INODE, job.job_id.encode(), CTX)
    inodes = []
    tree = job.dataset.tree
    for node in range(len(tree.dirs), tree.node_count):
        inodes.append(job_dir.st_ino + node)  # the job directory is node 0
    rng.shuffle(inodes)
    for inode in inodes:
        info = await fs.open(inode, 0, CTX)
        data = await fs.read(info.fh, 0, SIZE + 100)
        assert len(data) == SIZE
        await fs.release(info.fh)


@pytest.mark.parametrize("cached_fraction", [0.0, 0.3, 0.5, 1.0])
def test_epochs_and_hit_ratios_follow_the_quota(tmp_path: Path, cached_fraction: float) -> None:
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        rng = random.Random(1)
        for _ in range(3):
            await _read_epoch(fs, job, rng)
        epochs = job.finished_epochs
        assert [e.epoch for e in epochs] == [1, 2, 3]
        assert job.tracker.epoch == 4
        assert epochs[0].hit_bytes == 0  # nothing was cached before the first pass
        expected = int(cached_fraction * FILES) * SIZE / (FILES * SIZE)
        assert epochs[1].hit_ratio == pytest.approx(expected)
        assert epochs[2].hit_ratio == pytest.approx(expected)
        assert job.bytes_from_remote == FILES * SIZE + 2 * (FILES * SIZE - int(cached_fraction * FILES) * SIZE)
        assert job.dataset.cache.used_bytes <= job.dataset.cache.quota_bytes

    _run(tmp_path, int(cached_fraction * FILES * SIZE), scenario)


def test_reading_a_file_again_mid_epoch_ends_the_epoch(tmp_path: Path) -> None:
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        job_dir = await fs.lookup(pyfuse3.ROOT_INODE, b"job", CTX)
        first_file = job_dir.st_ino + len(job.dataset.tree.dirs)
        for _ in range(2):
            info = await fs.open(first_file, 0, CTX)
            await fs.release(info.fh)
        assert job.tracker.epoch == 2
        assert [e.accessed_bytes for e in job.finished_epochs] == [SIZE]

    _run(tmp_path, 0, scenario)


def test_the_stragglers_of_an_epoch_its_loader_overlaps_with_the_next_count_in_it(tmp_path: Path) -> None:
    # Parallel workers: the next pass's first items arrive before the last pass's last ones.
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        for item in range(FILES - 2):
            job.record_access(item)
        for item in range(5):
            job.record_access(item)
        assert (job.tracker.epoch, job.finished_epochs) == (2, [])  # the new pass is reported, the old one open
        for item in (FILES - 2, FILES - 1):
            job.record_access(item)
        assert [(e.epoch, e.accessed_bytes) for e in job.finished_epochs] == [(1, FILES * SIZE)]
        assert job.open_epochs[2].accessed_bytes == 5 * SIZE
        assert job.statistics(trio.current_time()).access.items_read == 5

    _run(tmp_path, 0, scenario)


class _CountingBackend:
    """The real backend, counting its reads per key."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.reads: list[str] = []

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        self.reads.append(key)
        return self.inner.read(key, offset, length, version)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.mark.parametrize("quota", [0, FILES * SIZE])
def test_concurrent_misses_on_one_item_fetch_it_once(tmp_path: Path, quota: int) -> None:
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        counting = _CountingBackend(job.dataset.backend)
        job.dataset.backend = cast(Backend, counting)
        results: list[bytes] = []

        async def reader() -> None:
            results.append(await readpath.read(job, 3, 0, SIZE))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(reader)
        assert len(set(results)) == 1 and len(results[0]) == SIZE
        assert counting.reads == [job.dataset.manifest.paths[3]]

    _run(tmp_path, quota, scenario)


def _counted(job: MountedJob) -> _CountingBackend:
    """Count the backend reads of the job's dataset from now on."""
    counting = _CountingBackend(job.dataset.backend)
    job.dataset.backend = cast(Backend, counting)
    return counting


def test_a_job_at_a_zero_rate_holds_up_no_other_jobs_fetch_of_the_item_and_reads_it_uncharged(tmp_path: Path) -> None:
    # Before, "fast" joined the fetch "slow" had started, which waited on slow's rate: for good at 0.
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        slow, fast = mount.jobs["slow"], mount.jobs["fast"]
        counting = _counted(slow)
        results: dict[str, bytes] = {}

        async def reader(job: MountedJob) -> None:
            results[job.job_id] = await readpath.read(job, 3, 0, SIZE)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, slow)
            await trio.testing.wait_all_tasks_blocked()
            assert slow.bucket is not None and slow.bucket.statistics().waiting == 1
            with trio.fail_after(5):
                await reader(fast)
        assert results["slow"] == results["fast"] and len(results["fast"]) == SIZE
        assert counting.reads == [slow.dataset.manifest.paths[3]]
        assert (fast.bytes_from_remote, slow.bytes_from_remote, slow.bucket.statistics().granted_bytes) == (SIZE, 0, 0)
        assert slow.dataset.inflight == {}

    _run(tmp_path, 0, scenario, io_rates={"slow": 0, "fast": 10**9})


def test_jobs_granted_an_item_in_the_same_instant_fetch_it_once_and_only_the_one_that_fetched_is_charged(
    tmp_path: Path,
) -> None:
    # Both throttles wake together: the job resumed second finds the fetch taken off and gives its bytes back.
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        jobs = [mount.jobs["a"], mount.jobs["b"]]
        counting = _counted(jobs[0])
        results: list[bytes] = []

        async def reader(job: MountedJob) -> None:
            results.append(await readpath.read(job, 3, 0, SIZE))

        async with trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(reader, job)
            await trio.testing.wait_all_tasks_blocked()
            for job in jobs:
                assert job.bucket is not None
                job.bucket.set_rate(10**9)
        assert len(results) == 2 and results[0] == results[1]
        assert counting.reads == [jobs[0].dataset.manifest.paths[3]]
        granted = sorted(job.bucket.statistics().granted_bytes for job in jobs if job.bucket is not None)
        assert granted == [0, SIZE]
        assert sorted(job.bytes_from_remote for job in jobs) == [0, SIZE]

    _run(tmp_path, 0, scenario, io_rates={"a": 0, "b": 0})


async def _open(fs: SilodFS, job: MountedJob, file_index: int) -> int:
    """A handle on the job's file `file_index`, opened as a reader would: by its path."""
    inode = (await fs.lookup(pyfuse3.ROOT_INODE, job.job_id.encode(), CTX)).st_ino
    for name in job.dataset.manifest.paths[file_index].split("/"):
        inode = (await fs.lookup(inode, name.encode(), CTX)).st_ino
    return (await fs.open(inode, os.O_RDONLY, CTX)).fh


class _RefusingBackend:
    """The real backend, whose reads storage refuses while `refusing` (as under an expired SAS token)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.refusing = False

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        if self.refusing:
            raise AccessDenied(f"{key}: read refused")
        return self.inner.read(key, offset, length, version)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _refusing(job: MountedJob) -> _RefusingBackend:
    refusing = _RefusingBackend(job.dataset.backend)
    job.dataset.backend = cast(Backend, refusing)
    return refusing


async def _read_file(fs: SilodFS, job: MountedJob, file_index: int) -> None:
    """Open, read whole and close the job's file `file_index`."""
    handle = await _open(fs, job, file_index)
    try:
        assert len(await fs.read(handle, 0, SIZE)) == SIZE
    finally:
        await fs.release(handle)


@pytest.mark.expected_warnings  # the refused read, named
def test_a_refused_read_of_a_passs_last_file_leaves_the_pass_open_and_its_retry_completes_it_once(
    tmp_path: Path,
) -> None:
    # The open counts the access; the refused read takes it back, with the bytes its epoch was credited with.
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        refusing = _refusing(job)
        for file_index in range(FILES - 1):
            await _read_file(fs, job, file_index)
        refusing.refusing = True
        with pytest.raises(pyfuse3.FUSEError) as refused:
            await _read_file(fs, job, FILES - 1)
        assert refused.value.errno == errno.EACCES
        assert (job.finished_epochs, job.tracker.read.count()) == ([], FILES - 1)
        assert job.open_epochs[1] == EpochRecord(1, (FILES - 1) * SIZE, 0)
        refusing.refusing = False
        await _read_file(fs, job, FILES - 1)  # the loader's retry
        assert job.finished_epochs == [EpochRecord(1, FILES * SIZE, 0)]
        assert (job.tracker.epoch, job.tracker.read.count()) == (2, 0)

    _run(tmp_path, 0, scenario)


@pytest.mark.expected_warnings  # the refused reads, named
def test_opens_of_one_file_at_once_whose_reads_storage_refused_count_no_epoch(tmp_path: Path) -> None:
    # Threads of a loader open one file, then read it, while storage refuses reads. Before, each open after the
    # first was a repeat of an item read in the epoch, which ended it: eight opens, eight epochs, no data.
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        refusing = _refusing(job)
        refusing.refusing = True
        handles = [await _open(fs, job, 0) for _ in range(8)]
        refused: list[int] = []

        async def read(handle: int) -> None:
            try:
                await fs.read(handle, 0, SIZE)
            except pyfuse3.FUSEError as exc:
                refused.append(exc.errno)
            finally:
                await fs.release(handle)

        async with trio.open_nursery() as nursery:
            for handle in handles:
                nursery.start_soon(read, handle)
        assert refused == [errno.EACCES] * 8
        assert (job.finished_epochs, job.tracker.epoch, job.tracker.read.count()) == ([], 1, 0)
        assert job.open_epochs[1] == EpochRecord(1, 0, 0)
        refusing.refusing = False
        await _read_epoch(fs, job, random.Random(1))
        assert job.finished_epochs == [EpochRecord(1, FILES * SIZE, 0)]

    _run(tmp_path, 0, scenario)


@pytest.mark.expected_warnings  # each failed read, named
def test_a_removed_jobs_reads_waiting_for_remote_io_fail_with_eio_and_its_cached_items_still_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The data manager gives a job that left the node no remote IO: at a rate of 0 its reads waited for good.
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job = mount.jobs["job"]
        cached = await readpath.read(mount.jobs["warm"], 0, 0, SIZE)  # the quota holds the whole dataset
        handles = [await _open(fs, job, file_index) for file_index in (0, 3, 4)]
        errors: list[int] = []

        async def reader() -> None:
            with pytest.raises(pyfuse3.FUSEError) as raised:
                await fs.read(handles[1], 0, SIZE)
            errors.append(raised.value.errno)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            mount.remove_job("job")
        assert errors == [errno.EIO]
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await fs.read(handles[2], 0, SIZE)
        assert raised.value.errno == errno.EIO
        assert await fs.read(handles[0], 0, SIZE) == cached  # what the cache holds still reads
        assert job.dataset.inflight == {}
        assert (job.failed_reads, job.denied_reads) == (2, 0)  # what stats.json, metrics and usage reports show
        failed = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        # Two failed reads of the job, the second within the failure log's interval: one line.
        assert failed == ["job job: read failed: it has left this node, so it has no remote IO to read with"]

    _run(tmp_path, FILES * SIZE, scenario, io_rates={"job": 0, "warm": 10**9})


def test_a_name_longer_than_statfs_allows_is_enametoolong_and_one_as_long_as_it_allows_is_looked_up(
    tmp_path: Path,
) -> None:
    async def scenario(mount: MountState, fs: SilodFS) -> None:
        job_dir = await fs.lookup(pyfuse3.ROOT_INODE, b"job", CTX)
        assert (await fs.statfs(CTX)).f_namemax == 255
        for name, expected in ((b"x" * 255, errno.ENOENT), (b"x" * 256, errno.ENAMETOOLONG)):
            for parent in (pyfuse3.ROOT_INODE, job_dir.st_ino):
                with pytest.raises(pyfuse3.FUSEError) as raised:
                    await fs.lookup(parent, name, CTX)
                assert raised.value.errno == expected

    _run(tmp_path, 0, scenario)


CHUNK, BIG = 64 * 1024, 4 * 64 * 1024 + 1000  # a file of four full chunks and a 1000-byte tail


def _run_big_file(
    tmp_path: Path,
    quota: int,
    scenario: Callable[[MountedJob, SilodFS, int, bytes], Awaitable[None]],
    clock: trio.abc.Clock | None = None,
    read_buffers: ReadBuffers | None = None,
) -> None:
    """Run `scenario(job, fs, inode, content)` over a dataset of one chunked file, its reads counted; under `clock`,
    and with `read_buffers` for the open files, if given."""
    (tmp_path / "ds").mkdir()
    content = random.Random(3).randbytes(BIG)
    (tmp_path / "ds" / "big.bin").write_bytes(content)
    uri = f"file://{tmp_path / 'ds'}"
    config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": uri}, {uri: quota}, chunk_size=CHUNK)

    async def main() -> None:
        mount = await build_state(config)
        if read_buffers is not None:
            mount.read_buffers = read_buffers
        fs = SilodFS(mount)
        job = mount.jobs["job"]
        job.dataset.backend = cast(Backend, _CountingBackend(job.dataset.backend))
        job_dir = await fs.lookup(pyfuse3.ROOT_INODE, b"job", CTX)
        big = await fs.lookup(job_dir.st_ino, b"big.bin", CTX)
        await scenario(job, fs, big.st_ino, content)
        job.dataset.cache.close()

    trio.run(main, clock=clock)


async def _read_sequentially(fs: SilodFS, inode: int) -> bytes:
    """One open, then reads of 16 KiB from the start to the end, as a reader streaming the file."""
    info = await fs.open(inode, 0, CTX)
    data = b"".join([await fs.read(info.fh, offset, 16 * 1024) for offset in range(0, BIG, 16 * 1024)])
    await fs.release(info.fh)
    return data


@pytest.mark.parametrize("quota", [0, 1 << 20])
def test_a_missed_chunk_costs_one_backend_read_however_many_reads_cover_it(tmp_path: Path, quota: int) -> None:
    async def scenario(job: MountedJob, fs: SilodFS, inode: int, content: bytes) -> None:
        assert await _read_sequentially(fs, inode) == content
        assert len(cast(_CountingBackend, job.dataset.backend).reads) == 5  # one per chunk, the tail included
        assert job.bytes_from_remote == BIG

    _run_big_file(tmp_path, quota, scenario)


def test_chunks_the_reader_read_ahead_count_as_misses_and_cached_ones_as_hits_next_epoch(tmp_path: Path) -> None:
    # Each chunk the reader starts fetches the next one too, which reaches the cache before the reader does;
    # its bytes still came from remote for this reader, so the first epoch has no hits at all.
    async def scenario(job: MountedJob, fs: SilodFS, inode: int, content: bytes) -> None:
        for _ in range(2):  # each pass reads every item: it completes an epoch
            assert await _read_sequentially(fs, inode) == content
        assert [(e.accessed_bytes, e.hit_bytes) for e in job.finished_epochs] == [(BIG, 0), (BIG, BIG)]
        assert len(cast(_CountingBackend, job.dataset.backend).reads) == 5

    _run_big_file(tmp_path, 1 << 20, scenario)


@pytest.mark.expected_warnings  # the refused read, named
def test_a_chunk_whose_read_failed_is_taken_back_and_counted_by_the_read_that_delivers_it(tmp_path: Path) -> None:
    # The chunks read before the failure stand; the one refused counts when a read of it succeeds, once.
    clock = trio.testing.MockClock()

    async def scenario(job: MountedJob, fs: SilodFS, inode: int, content: bytes) -> None:
        refusing = _refusing(job)
        handle = (await fs.open(inode, 0, CTX)).fh
        assert await fs.read(handle, 0, CHUNK) == content[:CHUNK]  # fetches chunk 1 ahead
        assert await fs.read(handle, CHUNK, CHUNK) == content[CHUNK : 2 * CHUNK]
        refusing.refusing = True
        with pytest.raises(pyfuse3.FUSEError):
            await fs.read(handle, 2 * CHUNK, CHUNK)
        assert job.tracker.read == bitarray("11000")
        assert job.open_epochs[1].accessed_bytes == 2 * CHUNK
        refusing.refusing = False
        clock.jump(readpath.RE_REQUEST_WINDOW)  # a re-read through this open sooner gets the failure again
        for offset in range(2 * CHUNK, BIG, CHUNK):
            assert await fs.read(handle, offset, CHUNK) == content[offset : offset + CHUNK]
        await fs.release(handle)
        assert job.finished_epochs == [EpochRecord(1, BIG, 0)]

    _run_big_file(tmp_path, 0, scenario, clock)


@pytest.mark.expected_warnings  # the refused read, named
def test_a_chunked_file_read_again_after_a_refused_read_counts_once_in_its_pass(tmp_path: Path) -> None:
    # A loader retries a failed read by opening the file again and reading it from the start. Before, the retry's
    # read of chunk 0, which the failed open had read, was a repeat with most of the pass unread: it ended the
    # epoch, two chunks long, and the pass counted as two epochs.
    async def scenario(job: MountedJob, fs: SilodFS, inode: int, content: bytes) -> None:
        refusing = _refusing(job)
        handle = (await fs.open(inode, 0, CTX)).fh
        assert await fs.read(handle, 0, 2 * CHUNK) == content[: 2 * CHUNK]
        refusing.refusing = True
        with pytest.raises(pyfuse3.FUSEError):
            await fs.read(handle, 2 * CHUNK, CHUNK)
        await fs.release(handle)
        refusing.refusing = False
        assert await _read_sequentially(fs, inode) == content  # the loader's retry
        assert job.finished_epochs == [EpochRecord(1, BIG, 0)]
        assert (job.tracker.epoch, job.tracker.read.count()) == (2, 0)
        assert await _read_sequentially(fs, inode) == content  # the next pass
        assert job.finished_epochs == [EpochRecord(1, BIG, 0), EpochRecord(2, BIG, 0)]

    _run_big_file(tmp_path, 0, scenario)


def test_a_reader_going_backwards_through_a_file_keeps_at_most_two_fetched_chunks(tmp_path: Path) -> None:
    # Before, a handle kept every chunk numbered above the one it read: reading a file backwards held it all.
    async def scenario(job: MountedJob, fs: SilodFS, inode: int, content: bytes) -> None:
        buffers = ReadBuffers(DEFAULT_READ_BUFFER_BYTES)
        fetched = readpath.FetchedItems(buffers)
        data, held = [], []
        for offset in reversed(range(0, BIG, 16 * 1024)):
            data.append(await readpath.read(job, 0, offset, 16 * 1024, fetched))
            held.append(buffers.held_bytes)
        assert b"".join(reversed(data)) == content
        assert max(held) <= 2 * CHUNK
        assert len(cast(_CountingBackend, job.dataset.backend).reads) == 5

    _run_big_file(tmp_path, 0, scenario)


def test_an_open_whose_bytes_the_budget_let_go_fetches_its_item_again_and_counts_it(tmp_path: Path) -> None:
    # Two opens' chunks under a budget of two: the second open's fetches take the first's place, least recently
    # read first, and the first open, reading on, fetches its chunk again rather than hold memory past the budget.
    buffers = ReadBuffers(2 * CHUNK)

    async def scenario(job: MountedJob, fs: SilodFS, inode: int, content: bytes) -> None:
        first, second = (await fs.open(inode, 0, CTX)).fh, (await fs.open(inode, 0, CTX)).fh
        reads = cast(_CountingBackend, job.dataset.backend).reads
        held = []
        for handle, offset in [(first, 0), (second, 0), (second, 16 * 1024), (first, 16 * 1024)]:
            assert await fs.read(handle, offset, 16 * 1024) == content[offset : offset + 16 * 1024]
            held.append(buffers.held_bytes)
        assert held == [2 * CHUNK] * 4  # each open fetched chunk 1 ahead with chunk 0
        assert (len(reads), job.statistics(trio.current_time()).refetched_items) == (5, 1)
        for handle in (first, second):
            await fs.release(handle)
        assert buffers.held_bytes == 0

    _run_big_file(tmp_path, 0, scenario, read_buffers=buffers)


def test_the_statistics_writer_keeps_no_finished_job_or_its_dataset_alive(tmp_path: Path) -> None:
    """Its loop variables kept the last job it wrote about, and through it the dataset, its backend and its cache,
    in memory long after the job had finished on the node (found in a soak with tracemalloc)."""
    uri = _dataset(tmp_path / "ds")
    config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": uri}, cache_sizes={uri: 0})
    stats_file = tmp_path / "stats.json"

    def written() -> dict[str, object]:
        try:
            document: dict[str, object] = json.loads(stats_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return document

    async def until(check: Callable[[], bool]) -> None:
        with trio.fail_after(10):
            while not check():
                await trio.sleep(0.01)

    async def main() -> None:
        mount = await build_state(config)
        directory = os.open(tmp_path, os.O_RDONLY)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_write_statistics_every, mount, 0.01, directory, stats_file, None)
                await until(lambda: "job" in cast(dict[str, object], written().get("jobs", {})))
                job = weakref.ref(mount.remove_job("job"))
                removed = mount.remove_dataset(uri)
                assert removed is not None
                removed.cache.close()
                dataset = weakref.ref(removed)
                del removed
                await until(lambda: written().get("jobs") == {} and written().get("datasets") == {})
                await trio.sleep(0.05)  # a few more writes
                gc.collect()
                assert job() is None, gc.get_referrers(job())
                assert dataset() is None, gc.get_referrers(dataset())
                nursery.cancel_scope.cancel()
        finally:
            os.close(directory)

    trio.run(main)


def test_the_agents_usage_reports_keep_no_dataset_alive_once_it_is_no_longer_served(tmp_path: Path) -> None:
    """Its reporting loop's variable kept the last dataset it looked at (to reopen its cache), with its backend and
    cache, for as long as the agent ran (found in a soak with tracemalloc)."""
    uri = _dataset(tmp_path / "ds")
    mount_config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": uri}, cache_sizes={uri: 0})
    config = AgentConfig("127.0.0.1:1", "n1", tmp_path / "mnt", tmp_path / "cache", report_interval=0.01)

    async def main() -> None:
        mount = await build_state(mount_config)
        with grpc.insecure_channel(config.datamgr) as channel:  # nobody listens there: each report fails at once
            agent = NodeAgent(config, mount, pb_grpc.DataManagerStub(channel))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent.report_usage)
                await trio.sleep(0.1)  # reports made with the dataset served
                mount.remove_job("job")
                removed = mount.remove_dataset(uri)
                assert removed is not None
                removed.cache.close()
                dataset = weakref.ref(removed)
                del removed
                await trio.sleep(0.1)  # reports made since
                gc.collect()
                assert dataset() is None, gc.get_referrers(dataset())
                nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.expected_warnings  # the refused read, named
def test_a_read_storage_refuses_is_eacces_and_counted_as_denied(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory, azurite: AzuriteServer
) -> None:
    """A SAS allowed to list but not to read (as one that expires between listing and reading): Azurite refuses
    the read with 403. The job counts it, so that `silod job show` and the metrics tell a job whose storage refuses
    it from one reading along."""
    target = dataset_target_factory("az")
    target.put("x.bin", b"hello")
    sas = container_sas(azurite, target.uri, ContainerSasPermissions(list=True))
    options = {"account_url": azurite.account_url, "sas_token": sas}
    config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": target.uri}, backend_options=options)

    async def main() -> None:
        mount = await build_state(config)
        fs, job = SilodFS(mount), mount.jobs["job"]
        handle = await _open(fs, job, 0)
        with pytest.raises(pyfuse3.FUSEError) as refused:
            await fs.read(handle, 0, 5)
        assert refused.value.errno == errno.EACCES
        assert (job.failed_reads, job.denied_reads) == (1, 1)
        stats = job.statistics(trio.current_time())
        assert (stats.failed_reads, stats.denied_reads) == (1, 1)
        for dataset in mount.datasets.values():
            dataset.cache.close()

    trio.run(main)
