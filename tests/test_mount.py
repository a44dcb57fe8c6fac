"""Real FUSE mounts of real storage: bytes, POSIX tools, read-only semantics, large directories, the quota,
crash safety, throttling and unmounting."""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import multiprocessing
import os
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import AccessPolicy, ContainerSasPermissions, generate_container_sas

from datamgr.devservers import azure_client, free_port
from fuseclient.daemon import has_silod_mount
from silodlib.backends import parse_dataset_uri
from tests import polling
from tests.cache_fixtures import entries_on_disk
from tests.datamgr_fixtures import make_local_dataset
from tests.datasets import generate_dataset, upload_dataset
from tests.mount_fixtures import MountFactory, MountProcess, options_args
from tests.storage_servers import AzuriteServer, DatasetTarget, DatasetTargetFactory, rewrite_same_size
from tests.test_metrics import samples

CHUNK = 1024 * 1024


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bytes_through_the_mount_equal_the_backends(mount_factory: MountFactory, dataset_target: DatasetTarget) -> None:
    dataset = generate_dataset(seed=11, small_files=40, large_files=2, large_size=3 * CHUNK + 4321)
    upload_dataset(dataset_target, dataset)
    half = f"{dataset_target.uri}={dataset.total_bytes // 2}"
    mount = mount_factory(
        {"job1": dataset_target.uri},
        "--chunk-size",
        "1MiB",
        "--cache-size",
        half,
        *options_args(dataset_target.options),
    )
    root = mount.job_dir("job1")
    for path, data in dataset.files.items():
        assert _sha((root / path).read_bytes()) == _sha(data), path
    for path in dataset.empty_dirs:
        assert (root / path).is_dir() and not list((root / path).iterdir())

    big_path, big = max(dataset.files.items(), key=lambda item: len(item[1]))
    fd = os.open(root / big_path, os.O_RDONLY)
    try:
        for offset, length in [(CHUNK - 3, 10), (2 * CHUNK - 1, CHUNK + 2), (12345, 99), (len(big) - 5, 100)]:
            assert os.pread(fd, length, offset) == big[offset : offset + length], (offset, length)
        assert os.pread(fd, 10, len(big) + 7) == b""
    finally:
        os.close(fd)

    listed = subprocess.run(["find", ".", "-type", "f"], cwd=root, capture_output=True, text=True, check=True)
    assert sorted(line[2:] for line in listed.stdout.splitlines()) == sorted(dataset.files)
    du = subprocess.run(["du", "-sb", "--apparent-size", "."], cwd=root, capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) >= dataset.total_bytes  # plus the directories' own sizes
    assert subprocess.run(["cat", str(root / big_path)], capture_output=True, check=True).stdout == big
    local = mount.cache_dir.parent / "copy.bin"
    local.write_bytes(big)
    assert subprocess.run(["cmp", str(local), str(root / big_path)], check=False).returncode == 0
    stat = (root / big_path).stat()
    assert stat.st_size == len(big) and stat.st_mtime > 0


def test_a_changed_object_is_reported_as_eio_never_served(
    mount_factory: MountFactory, dataset_target: DatasetTarget
) -> None:
    dataset_target.put("shard.bin", b"a" * 5000)
    mount = mount_factory({"job1": dataset_target.uri}, *options_args(dataset_target.options))  # no cache quota
    path = mount.job_dir("job1") / "shard.bin"
    assert path.read_bytes() == b"a" * 5000

    rewrite_same_size(dataset_target, "shard.bin", b"b" * 5000)
    with pytest.raises(OSError) as failed:
        path.read_bytes()
    assert failed.value.errno == errno.EIO
    assert "shard.bin: changed after the dataset was registered" in mount.log_path.read_text()


def test_a_failed_read_at_the_start_of_a_chunk_is_eio_and_the_mount_serves_on(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # A read at a chunk's first byte fetches the next chunk alongside; a failure there came out of that nursery as
    # an ExceptionGroup, which the FUSE layer does not catch: the daemon died, every job's mount with it (ENOTCONN).
    root = tmp_path / "dataset"
    root.mkdir()
    big, small = os.urandom(3 * CHUNK), b"s" * 1000
    (root / "big.bin").write_bytes(big)
    (root / "small.bin").write_bytes(small)
    mount = mount_factory({"job1": f"file://{root}"}, "--chunk-size", "1MiB")
    os.utime(root / "big.bin", ns=(10**18, 10**18))  # changed after registration
    fd = os.open(mount.job_dir("job1") / "big.bin", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as failed:
            os.pread(fd, 128 * 1024, 0)
    finally:
        os.close(fd)
    assert failed.value.errno == errno.EIO
    assert (mount.job_dir("job1") / "small.bin").read_bytes() == small
    assert mount.process is not None and mount.process.poll() is None
    assert "Traceback" not in mount.log_path.read_text()


def test_an_object_deleted_under_a_running_job_fails_its_reads_by_name_and_the_rest_read_on(
    mount_factory: MountFactory, dataset_target: DatasetTarget
) -> None:
    # Someone cleans up the bucket while a job trains on it: the listing the job mounted still shows the
    # object, the backend no longer has it.
    for name, byte in (("gone.bin", b"g"), ("kept.bin", b"k")):
        dataset_target.put(name, byte * 5000)
    mount = mount_factory({"job1": dataset_target.uri}, *options_args(dataset_target.options))  # no cache quota
    root = mount.job_dir("job1")
    assert (root / "gone.bin").read_bytes() == b"g" * 5000

    dataset_target.delete("gone.bin")
    with pytest.raises(OSError) as failed:
        (root / "gone.bin").read_bytes()
    assert failed.value.errno == errno.EIO
    assert "gone.bin" in mount.log_path.read_text()
    assert (root / "kept.bin").read_bytes() == b"k" * 5000
    assert mount.process is not None and mount.process.poll() is None


def test_a_thousand_concurrent_readers_of_one_item_all_get_its_bytes_from_one_fetch(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # The data loaders of many jobs, or many workers of one, opening the same file at the same instant.
    root = tmp_path / "dataset"
    root.mkdir()
    content = random.Random(5).randbytes(CHUNK + 12_345)  # one item under the default chunk size
    (root / "hot.bin").write_bytes(content)
    uri = f"file://{root}"
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}=10MB")
    path = mount.job_dir("job1") / "hot.bin"
    readers = 1000
    start = threading.Barrier(readers)
    digests: list[str] = []

    def read() -> None:
        start.wait()
        digests.append(_sha(path.read_bytes()))

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert digests == [_sha(content)] * readers
    done = time.time()
    stats = mount.wait_for_stats(lambda _: (mount.cache_dir / "stats.json").stat().st_mtime > done)  # counts all reads
    assert stats["jobs"]["job1"]["bytes_from_remote"] == len(content)  # fetched once, then served from cache


def test_passes_over_cached_files_count_as_reads_and_hits_though_the_page_cache_serves_them(
    mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]
) -> None:
    # A file opened from the cache gets keep_cache, so the kernel served later passes from its page cache and the
    # job's counters saw none of them: three passes read, counted, 2/3 of the bytes and one pass of hits.
    uri, files = local_uri
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}=10MB")
    root = mount.job_dir("job1")
    for _ in range(3):
        assert {path: (root / path).read_bytes() for path in files} == files
    total = sum(map(len, files.values()))

    def counted(stats: dict[str, Any]) -> bool:
        return bool(stats["jobs"]["job1"]["bytes_read"] >= 3 * total)

    job = mount.wait_for_stats(counted)["jobs"]["job1"]
    assert (job["bytes_read"], job["bytes_from_remote"]) == (3 * total, total)
    assert (job["cache_hits"], job["cache_misses"]) == (2 * len(files), len(files))


def test_a_cold_pass_counts_each_item_a_miss_and_a_warm_pass_each_a_hit_as_the_epoch_hit_ratio_does(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # Counted per kernel request, not per item: a cold pass of chunked files whose quota held them showed 86% hits
    # (the chunk the open's read-ahead fetched was in the cache when the reader got there), and one without a quota
    # fewer misses than items fetched (requests the open's buffer served counted nothing), while the epoch's hit
    # ratio said 0 for both.
    files, size = 2, 4 * CHUNK
    uris = {job: f"file://{tmp_path / job}" for job in ("cached", "uncached")}
    for seed, job in enumerate(uris):
        _local_dataset(tmp_path / job, files=files, size=size, seed=seed)
    items = files * size // CHUNK
    port = free_port()
    mount = mount_factory(
        uris, "--chunk-size", "1MiB", "--cache-size", f"{uris['cached']}=16MiB", "--metrics-port", str(port)
    )

    def read_pass(job: str) -> None:
        for path in sorted(mount.job_dir(job).rglob("*.bin")):
            with path.open("rb", buffering=0) as file:
                while file.read(128 * 1024):
                    pass

    def counted(passes: int) -> tuple[dict[str, dict[str, Any]], dict[Any, float]]:
        """Each job's statistics and the metrics once every job has read `passes` passes."""
        for job in uris:
            read_pass(job)
        stats = mount.wait_for_stats(
            lambda s: all(s["jobs"][job]["bytes_read"] == passes * files * size for job in uris)
        )
        return stats["jobs"], _scrape(port)

    def hits_and_misses(jobs: dict[str, dict[str, Any]], values: dict[Any, float], job: str) -> tuple[int, int]:
        """A job's hits and misses in `stats.json`, the same as its metrics."""
        in_stats: tuple[int, int] = (jobs[job]["cache_hits"], jobs[job]["cache_misses"])
        labels = (("job_id", job),)
        assert in_stats == (
            values[("silod_job_cache_hits_total", labels)],
            values[("silod_job_cache_misses_total", labels)],
        )
        return in_stats

    cold, values = counted(passes=1)
    assert hits_and_misses(cold, values, "cached") == hits_and_misses(cold, values, "uncached") == (0, items)
    assert [e["hit_bytes"] for e in cold["cached"]["finished_epochs"]] == [0]

    warm, values = counted(passes=2)
    assert hits_and_misses(warm, values, "cached") == (items, items)  # the pass's hits: all of its items
    assert hits_and_misses(warm, values, "uncached") == (0, 2 * items)
    second = warm["cached"]["finished_epochs"][1]
    assert second["hit_bytes"] == second["accessed_bytes"] == files * size  # the epoch's hit ratio: 1, as counted
    assert warm["cached"]["bytes_from_remote"] == files * size


def _forget_pages(path: Path) -> None:
    """Drop a file's pages from the kernel's page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open_file_limits(pid: int) -> tuple[int, int]:
    """A process's (soft, hard) limit on open files, from /proc/PID/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open files limit in /proc/{pid}/limits")


def test_a_mount_raises_its_open_file_limit_to_the_hard_limit(mount_factory: MountFactory, tmp_path: Path) -> None:
    # A service manager's soft limit (often 1,024) is what the daemon inherits; its readers need more.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        mount = mount_factory({"job1": make_local_dataset(tmp_path / "dataset")})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert mount.process is not None
    assert _open_file_limits(mount.process.pid) == (hard, hard)
    assert f"open files limit raised from {low} to {hard}" in mount.log_path.read_text()


# Frees an 8 MiB block (glibc then raises its dynamic mmap threshold to 8 MiB), then allocates 1 MiB, as item
# buffers are: prints 1 if that block was mapped apart (freed, it goes back to the system), 0 if it came from the
# heap (freed, the process keeps it).
_MALLOC_PROBE = """
import ctypes, sys
from fuseclient.daemon import return_freed_buffers
class Mallinfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
if sys.argv[1] == "tuned":
    return_freed_buffers({})
big = bytearray(8 << 20)
del big
before = libc.mallinfo2().hblks
block = bytearray(1 << 20)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.parametrize(
    ("tuned", "environment", "mapped"),
    [(False, {}, 0), (True, {}, 1), (True, {"MALLOC_MMAP_THRESHOLD_": str(16 << 20)}, 0)],
    ids=["glibc-default", "daemon", "operator-setting-kept"],
)
def test_a_daemons_item_sized_buffers_are_mapped_apart_even_after_a_large_block_was_freed(
    tuned: bool, environment: dict[str, str], mapped: int
) -> None:
    """Left to glibc's dynamic threshold, item buffers came from per-thread arenas that kept what was freed: an
    agent under job churn grew from 56 to 211 MB with 20 MB in use (128 MB with the threshold fixed)."""
    env = {name: value for name, value in os.environ.items() if name != "MALLOC_MMAP_THRESHOLD_"} | environment
    probe = subprocess.run(
        [sys.executable, "-c", _MALLOC_PROBE, "tuned" if tuned else "plain"],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    )  # fmt: skip
    assert probe.stdout.strip() == str(mapped), probe.stdout + probe.stderr


@pytest.mark.expected_warnings
def test_a_mount_out_of_file_descriptors_fails_reads_with_eio_stays_up_and_recovers(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    root = tmp_path / "dataset"
    files = _local_dataset(root, files=64, size=20_000)
    uri = f"file://{root}"
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}=100MB")
    assert mount.process is not None
    pid = mount.process.pid
    job_root = mount.job_dir("job1")
    warm = "part0/file00000.bin"
    assert (job_root / warm).read_bytes() == files[warm]  # cached
    _forget_pages(job_root / warm)  # so that reading it again asks the mount, which opens its cache file
    cached = mount.wait_for_stats(lambda s: s["datasets"][uri]["cached_items"] == 1)["datasets"][uri]
    soft, hard = _open_file_limits(pid)
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile=1:{hard}"], check=True)  # no new descriptor at all
    try:

        def read(path: str) -> bytes | int:
            try:
                return (job_root / path).read_bytes()
            except OSError as exc:
                return exc.errno or 0

        with ThreadPoolExecutor(16) as pool:
            starved = dict(zip(files, pool.map(read, files), strict=True))
        assert starved.pop(warm) in (files[warm], errno.EIO)  # never other bytes
        assert set(starved.values()) == {errno.EIO}  # a fetch needs a descriptor
        polling.eventually(
            lambda: "statistics not written" in mount.log_path.read_text(), what="the statistics writer's warning"
        )
        assert mount.process.poll() is None
    finally:
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:{hard}"], check=True)
    polling.eventually(lambda: "statistics written to" in mount.log_path.read_text(), what="statistics resumed")
    resumed = mount.wait_for_stats(lambda s: s["written_at"] > time.time() - 1)["datasets"][uri]
    assert (resumed["cached_items"], resumed["dropped"]) == (cached["cached_items"], 0)  # a shortage is not damage
    for path, data in files.items():
        assert (job_root / path).read_bytes() == data, path


def _local_dataset(root: Path, files: int, size: int, seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    contents = {f"part{i % 4}/file{i:05d}.bin": rng.randbytes(size) for i in range(files)}
    for path, data in contents.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return contents


@pytest.fixture
def local_uri(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    root = tmp_path / "dataset"
    return f"file://{root}", _local_dataset(root, files=64, size=8000)


TWO_CHUNKS = 8 << 20  # two items of the default 4 MiB chunk: a read at the start fetches the second one ahead
READ_BUFFER = 256 << 20  # a daemon's budget for the bytes its open files hold (`ReadBuffers`), by default
SLACK = 48 << 20  # what a daemon's memory may grow by beyond them (threads, fetches under way)


@pytest.fixture
def two_chunk_files(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    root = tmp_path / "dataset"
    return f"file://{root}", _local_dataset(root, files=20, size=TWO_CHUNKS)


def _rss(pid: int) -> int:
    """A process's resident memory, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())


@pytest.mark.parametrize("cached", [False, True], ids=["quota-0", "quota-all"])
def test_files_held_open_hold_fetched_bytes_within_the_nodes_read_buffer_budget(
    mount_factory: MountFactory, two_chunk_files: tuple[str, dict[str, bytes]], cached: bool
) -> None:
    """Loaders that keep a handle on every shard (np.memmap, h5py, LMDB) read a little of each and hold it. Each open
    kept the items it fetched until it was closed, even those the cache admitted, so the daemon grew with the open
    files (an agent, 867 opens: 81 to 959 MiB). A file then read through a fresh open, the budget spent, fetches each
    of its items once."""
    uri, files = two_chunk_files
    port = free_port()
    quota = len(files) * TWO_CHUNKS if cached else 0
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}={quota}", "--metrics-port", str(port))
    assert mount.process is not None
    pid, root = mount.process.pid, mount.job_dir("job1")
    before = _rss(pid)
    opened = []
    try:
        for _ in range(3):  # 60 opens, each fetching 8 MiB while uncached: 480 MiB
            for path, data in files.items():
                opened.append(os.open(root / path, os.O_RDONLY))
                assert os.pread(opened[-1], 4096, 0) == data[:4096]
        grown = _rss(pid) - before
        assert grown < (SLACK if cached else READ_BUFFER + SLACK)  # with quota: every item went to the cache
        values = _scrape(port)
        held = values[("silod_read_buffer_bytes", ())]
        assert values[("silod_read_buffer_budget_bytes", ())] == READ_BUFFER
        assert held == 0 if cached else READ_BUFFER - TWO_CHUNKS <= held <= READ_BUFFER
        fetches = ("silod_backend_read_seconds_count", (("dataset", uri),))
        path, data = next(iter(files.items()))
        assert (root / path).read_bytes() == data
        after = _scrape(port)
        assert after[fetches] - values[fetches] == (0 if cached else 2)
        assert after[("silod_job_refetched_items_total", (("job_id", "job1"),))] == 0
    finally:
        for fd in opened:
            os.close(fd)
    polling.eventually(lambda: _scrape(port)[("silod_read_buffer_bytes", ())] == 0, what="the buffers let go")


def test_a_smaller_read_buffer_bounds_what_files_held_open_hold_and_its_evictions_are_counted_as_refetches(
    mount_factory: MountFactory, two_chunk_files: tuple[str, dict[str, bytes]]
) -> None:
    """`--read-buffer` sets the node's budget: 10 opens each holding a file's two items hold at most 16 MiB, and
    reading on in the first file through its open fetches what the budget let go, counted."""
    uri, files = two_chunk_files
    port = free_port()
    mount = mount_factory(
        {"job1": uri}, "--cache-size", f"{uri}=0", "--metrics-port", str(port), "--read-buffer", "16MiB"
    )
    root = mount.job_dir("job1")
    opened = [os.open(root / path, os.O_RDONLY) for path in list(files)[:10]]
    try:
        for fd, data in zip(opened, files.values(), strict=False):
            assert os.pread(fd, 4096, 0) == data[:4096]
        values = _scrape(port)
        assert values[("silod_read_buffer_budget_bytes", ())] == 16 << 20
        assert values[("silod_read_buffer_bytes", ())] == 16 << 20  # the last two opens' items
        first = next(iter(files.values()))
        chunk = TWO_CHUNKS // 2  # the second item, fetched ahead of the reader; past any kernel read-ahead
        assert os.pread(opened[0], 4096, chunk) == first[chunk : chunk + 4096]
        assert _scrape(port)[("silod_job_refetched_items_total", (("job_id", "job1"),))] == 1
    finally:
        for fd in opened:
            os.close(fd)


def test_files_read_whole_through_handles_kept_open_hold_none_of_their_bytes_and_fetch_each_item_once(
    mount_factory: MountFactory, two_chunk_files: tuple[str, dict[str, bytes]]
) -> None:
    # The kernel keeps what an open read in its page cache, so the open needs none of an item once it read all of it.
    # Each open kept its last two items until it was closed: all of a file of two chunks.
    uri, files = two_chunk_files
    port = free_port()
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}=0", "--metrics-port", str(port))
    assert mount.process is not None
    pid, root = mount.process.pid, mount.job_dir("job1")
    before = _rss(pid)
    with contextlib.ExitStack() as stack:
        for path, data in files.items():
            assert stack.enter_context((root / path).open("rb")).read() == data
        grown, values = _rss(pid) - before, _scrape(port)
    assert grown < SLACK
    assert values[("silod_read_buffer_bytes", ())] == 0
    assert values[("silod_backend_read_seconds_count", (("dataset", uri),))] == 2 * len(files)
    assert values[("silod_job_refetched_items_total", (("job_id", "job1"),))] == 0


def test_writes_are_refused_with_erofs(mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]) -> None:
    uri, files = local_uri
    root = mount_factory({"job1": uri}).job_dir("job1")
    existing = root / next(iter(files))
    attempts: list[Callable[[], Any]] = [
        lambda: open(existing, "r+b"),  # noqa: SIM115
        lambda: open(root / "new.txt", "wb"),  # noqa: SIM115
        lambda: os.mkdir(root / "newdir"),
        lambda: os.unlink(existing),
        lambda: os.rename(existing, root / "renamed"),
        lambda: os.chmod(existing, 0o777),
        lambda: os.truncate(existing, 0),
        lambda: os.symlink("x", root / "link"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS
    assert existing.read_bytes() == files[existing.relative_to(root).as_posix()]


def test_a_directory_of_100k_entries_lists_completely(mount_factory: MountFactory, tmp_path: Path) -> None:
    big_dir = tmp_path / "wide" / "train"
    big_dir.mkdir(parents=True)
    names = {f"img{i:06d}.jpg" for i in range(100_000)}
    for name in names:
        (big_dir / name).touch()
    root = mount_factory({"wide": f"file://{tmp_path / 'wide'}"}).job_dir("wide")
    listed = os.listdir(root / "train")
    assert len(listed) == len(names) and set(listed) == names
    with os.scandir(root / "train") as entries:
        assert sum(1 for entry in entries if entry.is_file()) == len(names)


def test_the_root_shows_one_directory_per_job(mount_factory: MountFactory, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    files_a, files_b = _local_dataset(a, 5, 100, seed=1), _local_dataset(b, 6, 100, seed=2)
    mount = mount_factory({"job-a": f"file://{a}", "job-b": f"file://{b}", "job-c": f"file://{a}"})
    assert sorted(os.listdir(mount.mountpoint)) == ["job-a", "job-b", "job-c"]
    for job, files in (("job-a", files_a), ("job-b", files_b), ("job-c", files_a)):
        for path, data in files.items():
            assert (mount.job_dir(job) / path).read_bytes() == data


def test_the_quota_is_never_exceeded_and_nothing_is_evicted_under_it(
    mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]
) -> None:
    uri, files = local_uri
    quota = 20 * 8000 + 500
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}={quota}")
    root = mount.job_dir("job1")
    order = list(files)
    for epoch in range(2):
        random.Random(epoch).shuffle(order)
        for path in order:
            assert (root / path).read_bytes() == files[path]
        cached = entries_on_disk(mount.cache_dir)
        assert sum(cached.values()) <= quota
        assert len(cached) == 20  # full: 20 whole items fit, the 21st does not
        if epoch == 0:
            after_first = cached
    assert cached == after_first  # uniform caching: once full, nothing replaced


@pytest.mark.expected_warnings
def test_kill_9_during_fetches_then_remount_serves_no_partial_entry(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    root = tmp_path / "dataset"
    files = _local_dataset(root, files=40, size=200_000)
    uri = f"file://{root}"
    args = ("--cache-size", f"{uri}=100MB", "--io-rate", "job1=2MB/s")
    first = mount_factory({"job1": uri}, *args, name="first")
    stop = threading.Event()

    def reader(paths: list[str]) -> None:
        for path in paths:
            if stop.is_set():
                return
            try:
                (first.job_dir("job1") / path).read_bytes()
            except OSError:
                return  # the daemon died under us

    names = sorted(files)
    with ThreadPoolExecutor(4) as pool:
        for i in range(4):
            pool.submit(reader, names[i::4])
        first.wait_for_stats(lambda s: s["datasets"][uri]["cached_items"] >= 5)
        first.kill()
        stop.set()
    complete_before = entries_on_disk(first.cache_dir)
    assert 5 <= len(complete_before) < len(files)

    second = MountProcess(tmp_path / "first", {"job1": uri}, "--cache-size", f"{uri}=100MB")
    second.start()
    try:
        stats = second.wait_for_stats(lambda s: "datasets" in s)
        assert stats["datasets"][uri]["cached_items"] >= len(complete_before)
        for path, data in files.items():
            assert (second.job_dir("job1") / path).read_bytes() == data, path
    finally:
        second.stop()


def test_remote_reads_are_held_to_the_job_rate(mount_factory: MountFactory, tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    files = _local_dataset(root, files=400, size=100_000)
    uri, rate = f"file://{root}", 2_000_000
    mount = mount_factory({"job1": uri}, "--io-rate", f"job1={rate}B/s", "--chunk-size", "64KiB")
    job_root = mount.job_dir("job1")
    read_bytes = 0
    lock = threading.Lock()
    deadline = time.monotonic() + 6.0

    def reader(paths: list[str]) -> None:
        nonlocal read_bytes
        for path in paths:
            if time.monotonic() >= deadline:
                return
            size = len((job_root / path).read_bytes())
            with lock:
                read_bytes += size

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        for i in range(4):
            pool.submit(reader, sorted(files)[i::4])
    elapsed = time.monotonic() - started
    burst = max(64 * 1024, rate // 10)
    assert read_bytes <= rate * elapsed + burst + 100_000  # + one file in flight when the window closed
    assert read_bytes >= 0.95 * rate * (elapsed - 0.5) - 100_000  # demand exceeds the rate throughout


def test_unmount_does_not_hang_on_reads_blocked_by_a_zero_rate(
    mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]
) -> None:
    uri, files = local_uri
    mount = mount_factory({"job1": uri}, "--io-rate", "job1=0")
    outcome: list[BaseException | bytes] = []

    def blocked_read() -> None:
        try:
            outcome.append((mount.job_dir("job1") / next(iter(files))).read_bytes())
        except OSError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=blocked_read, daemon=True)
    reader.start()
    reader.join(timeout=1.0)
    assert reader.is_alive(), "a read with rate 0 must wait for a rate"
    assert mount.process is not None
    mount.process.terminate()
    assert mount.process.wait(timeout=20) == 0
    reader.join(timeout=20)
    assert not reader.is_alive()
    assert isinstance(outcome[0], OSError)
    assert not has_silod_mount(mount.mountpoint)  # the table: ismount takes a dead FUSE mount for none


def test_a_file_modified_after_2262_is_served_with_the_latest_time_a_mount_can_show(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # ext4 keeps times up to 2446; before, listing such a file failed the mount with an OverflowError traceback.
    root = tmp_path / "dataset"
    files = _local_dataset(root, files=2, size=100)
    late = int(datetime.datetime(2400, 1, 1, tzinfo=datetime.UTC).timestamp()) * 10**9
    os.utime(root / "part0/file00000.bin", ns=(late, late))
    assert (root / "part0/file00000.bin").stat().st_mtime_ns == late  # the file system holds it
    job_dir = mount_factory({"job1": f"file://{root}"}).job_dir("job1")
    assert (job_dir / "part0/file00000.bin").stat().st_mtime_ns == 2**63 - 1
    assert (job_dir / "part1/file00001.bin").stat().st_mtime_ns == (root / "part1/file00001.bin").stat().st_mtime_ns
    assert {path: (job_dir / path).read_bytes() for path in files} == files


def test_a_directory_shows_the_newest_time_beneath_it_and_the_root_when_its_jobs_last_changed(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # Directories showed 1970: object stores keep no folder times, and the mount gave none.
    root = tmp_path / "dataset"
    _local_dataset(root, files=8, size=100)
    (root / "empty" / "inner").mkdir(parents=True)
    for i, path in enumerate(sorted(root.rglob("*.bin"))):
        os.utime(path, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    newest = {part: max(p.stat().st_mtime_ns for p in (root / part).iterdir()) for part in ("part0", "part1")}
    before = time.time_ns()
    mount = mount_factory({"job1": f"file://{root}"})
    job_dir = mount.job_dir("job1")
    assert job_dir.stat().st_mtime_ns == max(p.stat().st_mtime_ns for p in root.rglob("*.bin"))
    assert {part: (job_dir / part).stat().st_mtime_ns for part in newest} == newest
    added = (job_dir / "empty").stat().st_mtime_ns  # nothing beneath: when the job came to the node
    assert before <= added <= time.time_ns() and (job_dir / "empty" / "inner").stat().st_mtime_ns == added
    assert before <= mount.mountpoint.stat().st_mtime_ns <= time.time_ns()


def test_a_listing_opens_with_dot_and_dot_dot(mount_factory: MountFactory, tmp_path: Path) -> None:
    _local_dataset(tmp_path / "dataset", files=4, size=10)
    mount = mount_factory({"job1": f"file://{tmp_path / 'dataset'}"})

    def listing(path: Path) -> list[str]:
        return subprocess.run(["ls", "-a1f", str(path)], check=True, capture_output=True, text=True).stdout.split()

    assert listing(mount.mountpoint) == [".", "..", "job1"]
    assert listing(mount.job_dir("job1")) == [".", "..", "part0", "part1", "part2", "part3"]
    assert listing(mount.job_dir("job1") / "part2") == [".", "..", "file00002.bin"]


def test_a_job_at_a_zero_rate_holds_up_no_other_jobs_read_of_the_same_file(
    mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]
) -> None:
    # Before, the second job's read joined the fetch the first had started, which waited on the first's rate:
    # at 0 for good, and the kernel's lock on the page it was reading with it.
    uri, files = local_uri
    mount = mount_factory({"slow": uri, "fast": uri}, "--io-rate", "slow=0")
    name, data = next(iter(files.items()))
    slow_read: list[bytes] = []
    slow = threading.Thread(target=lambda: slow_read.append((mount.job_dir("slow") / name).read_bytes()), daemon=True)
    slow.start()
    slow.join(timeout=1.0)
    assert slow.is_alive(), "a read at a rate of 0 must wait for a rate"
    assert polling.outcome_within(10, (mount.job_dir("fast") / name).read_bytes) == {"result": data}
    slow.join(timeout=10)
    assert slow_read == [data]  # the waiting job read the fetch the other made, uncharged


def _loader_worker(job_root: Path, batches: multiprocessing.Queue[list[str] | None]) -> None:
    """A data loader's worker process: take the next batch, open, read and close each of its files."""
    while (batch := batches.get()) is not None:
        for path in batch:
            (job_root / path).read_bytes()


def test_forked_loader_workers_on_a_step_based_sampler_count_one_epoch_per_pass(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # PyTorch's DataLoader without torch: worker processes forked from the trainer take batches from one
    # stream of shuffle after shuffle (detectron2's TrainingSampler), so batches on either side of a
    # shuffle's end are read at the same time.
    root = tmp_path / "dataset"
    files = _local_dataset(root, files=600, size=2000)
    uri, passes, workers, batch = f"file://{root}", 4, 6, 16
    mount = mount_factory({"job1": uri})
    rng = random.Random(2)
    stream = [path for _ in range(passes) for path in rng.sample(sorted(files), len(files))]
    context = multiprocessing.get_context("fork")
    batches: multiprocessing.Queue[list[str] | None] = context.Queue()
    for start in range(0, len(stream), batch):
        batches.put(stream[start : start + batch])
    for _ in range(workers):
        batches.put(None)
    processes = [context.Process(target=_loader_worker, args=(mount.job_dir("job1"), batches)) for _ in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    assert [process.exitcode for process in processes] == [0] * workers
    # Statistics written after the last open. (Not bytes_read: a worker may read a file another has just paged in
    # from the kernel's page cache, without asking the mount; its open, which counts the access, always does. Such
    # an access is delivered when the file is released, which the kernel sends after close() has returned.)
    done = time.time()
    stats = mount.wait_for_stats(
        lambda s: s["written_at"] > done and len(s["jobs"]["job1"]["finished_epochs"]) >= passes
    )
    epochs = stats["jobs"]["job1"]["finished_epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, passes + 1))
    assert [e["accessed_bytes"] for e in epochs] == [len(files) * 2000] * passes


class _StoredPolicy:
    """A SAS token bound to a stored access policy of a dataset's container on Azurite: storage refuses the token's
    reads at once while the policy has expired (`refuse`), and accepts them again once it is renewed (`accept`)."""

    def __init__(self, azurite: AzuriteServer, target: DatasetTarget) -> None:
        self._container = azure_client(azurite).get_container_client(parse_dataset_uri(target.uri).location[1])
        self.accept()
        sas = generate_container_sas(
            azurite.account_name, self._container.container_name, account_key=azurite.account_key, policy_id="reader"
        )
        self.mount_args = options_args({"account_url": azurite.account_url, "sas_token": sas})

    def accept(self) -> None:
        self._expire_in(datetime.timedelta(hours=1))

    def refuse(self) -> None:
        self._expire_in(-datetime.timedelta(minutes=1))

    def _expire_in(self, delta: datetime.timedelta) -> None:
        permission = ContainerSasPermissions(read=True, list=True)
        expiry = datetime.datetime.now(datetime.UTC) + delta
        self._container.set_container_access_policy({"reader": AccessPolicy(permission, expiry=expiry)})


def test_a_pass_whose_reads_storage_refused_is_no_epoch_and_the_pass_after_the_sas_is_renewed_is_one(
    mount_factory: MountFactory, dataset_target_factory: DatasetTargetFactory, azurite: AzuriteServer
) -> None:
    # Before, the pass between the policy's expiry and its renewal, every read refused (EACCES), counted as an
    # epoch: its opens counted every item, and its bytes as read.
    target = dataset_target_factory("az")
    files = {f"f{i}.bin": os.urandom(3000) for i in range(8)}
    for name, data in files.items():
        target.put(name, data)
    policy = _StoredPolicy(azurite, target)
    mount = mount_factory({"job1": target.uri}, *policy.mount_args)
    root = mount.job_dir("job1")

    policy.refuse()
    for name in files:
        with pytest.raises(PermissionError):
            (root / name).read_bytes()
    done = time.time()
    job = mount.wait_for_stats(lambda s: s["written_at"] > done)["jobs"]["job1"]
    assert job["failed_reads"] == job["denied_reads"] >= len(files)
    assert (job["finished_epochs"], job["access"]["epoch"], job["access"]["items_read"]) == ([], 1, 0)

    policy.accept()
    assert {name: (root / name).read_bytes() for name in files} == files
    done = time.time()
    job = mount.wait_for_stats(lambda s: s["written_at"] > done)["jobs"]["job1"]
    total = sum(map(len, files.values()))
    assert job["finished_epochs"] == [{"epoch": 1, "accessed_bytes": total, "hit_bytes": 0}]
    assert (job["access"]["epoch"], job["bytes_read"]) == (2, total)


def test_a_loader_reading_a_chunked_file_again_after_storage_refused_a_read_counts_one_epoch_per_pass(
    mount_factory: MountFactory, dataset_target_factory: DatasetTargetFactory, azurite: AzuriteServer
) -> None:
    # A loader retries a failed read by opening the file again and reading it from the start. Before, the retry's
    # reads of the chunks its failed open had read were repeats with most of the pass unread: the epoch ended at
    # the first, and two passes (one with an outage) counted as three epochs, for good. No cache quota: every
    # read goes to storage.
    target = dataset_target_factory("az")
    chunk = 64 * 1024
    files = {f"f{i}.bin": os.urandom(32 * chunk + 1000) for i in range(4)}
    for name, data in files.items():
        target.put(name, data)
    policy = _StoredPolicy(azurite, target)
    mount = mount_factory({"job1": target.uri}, "--chunk-size", "64KiB", *policy.mount_args)
    root = mount.job_dir("job1")
    first, *others = sorted(files)

    with (root / first).open("rb", buffering=0) as reader:
        assert reader.read(2 * chunk) == files[first][: 2 * chunk]
        policy.refuse()
        with pytest.raises(PermissionError):
            while reader.read(chunk):  # the first few may come from what the kernel and the mount read ahead
                pass
    policy.accept()
    for name in [first, *others, *sorted(files)]:  # the retry and the rest of the pass, then a whole pass
        assert (root / name).read_bytes() == files[name], name
    done = time.time()
    job = mount.wait_for_stats(lambda s: s["written_at"] > done)["jobs"]["job1"]
    total = sum(map(len, files.values()))
    assert job["failed_reads"] == job["denied_reads"] >= 1
    assert job["finished_epochs"] == [{"epoch": e, "accessed_bytes": total, "hit_bytes": 0} for e in (1, 2)]
    assert (job["access"]["epoch"], job["access"]["items_read"]) == (3, 0)


def test_two_shuffled_epochs_through_the_mount_hit_the_cached_fraction(
    mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]
) -> None:
    uri, files = local_uri
    quota = len(files) * 8000 // 4  # a quarter of the dataset
    mount = mount_factory({"job1": uri}, "--cache-size", f"{uri}={quota}")
    order = sorted(files)
    for epoch in range(2):
        random.Random(epoch).shuffle(order)
        for path in order:
            (mount.job_dir("job1") / path).read_bytes()
    stats = mount.wait_for_stats(lambda s: len(s["jobs"]["job1"]["finished_epochs"]) == 2)
    first, second = stats["jobs"]["job1"]["finished_epochs"]
    assert (first["epoch"], second["epoch"]) == (1, 2)
    assert first["hit_bytes"] == 0 and first["accessed_bytes"] == len(files) * 8000
    assert second["hit_bytes"] / second["accessed_bytes"] == pytest.approx(0.25)
    assert stats["jobs"]["job1"]["access"]["epoch"] == 3


def test_the_statistics_an_earlier_mount_left_are_removed_by_a_mount_that_writes_none(
    mount_factory: MountFactory, local_uri: tuple[str, dict[str, bytes]]
) -> None:
    # Only a mount that wrote statistics removed an earlier one's file: one started without --stats-interval left
    # a stopped daemon's numbers (its jobs, its counts) in place, as if they were its own.
    uri, _ = local_uri
    first = mount_factory({"job1": uri})
    stats = first.cache_dir / "stats.json"
    polling.eventually(stats.exists, what="the first mount's statistics")
    first.stop()
    assert stats.exists()  # a daemon leaves its last numbers when it stops
    second = mount_factory({"job1": uri}, stats_interval=None)
    assert second.cache_dir == first.cache_dir and not stats.exists()
