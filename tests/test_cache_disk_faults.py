"""Cache-disk faults under a running `silod mount`: the disk unmounted, the cache's files deleted, an entry cut
short, a read of an entry failing with EIO (faked), the daemon out of file descriptors (faked). Each drives the
real entry point over a `file://` dataset and checks what a training job relies on: every read returns the
backend's bytes (never EIO for an item the backend has, never a short or wrong read), the mount goes on and
unmounts cleanly, one warning names the cache dir, and the cache's numbers (the same `statistics()` behind the
stats file and /metrics) never claim bytes the cache no longer holds.

An entry of the right size that holds other bytes (a flipped bit, another item's entry swapped in) fails the
checksums every read checks, which are seeded with the item. Not a fault but the same machinery: a cold cache
disk (its files' pages dropped, as on a node whose datasets outgrow its memory) still serves every hit from disk.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import re
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from datamgr.devservers import free_port
from tests import polling
from tests.cache_fixtures import entries_on_disk, held_bytes
from tests.datamgr_fixtures import SILOD
from tests.disks import Ext4Factory, PosixFaults, TmpfsFactory
from tests.mount_fixtures import MountFactory, MountProcess

CHUNK = 64 * 1024  # the smallest chunk size: several items a file, for a small dataset
FILE_SIZE = 2 * CHUNK + 5000  # 3 items; a file of several items is opened without the kernel's keep_cache,
# so every open after a fault reaches the daemon instead of the kernel's page cache
FILES = 16
_LOG_LINE = re.compile(r" (WARNING|ERROR|CRITICAL) ([\w.]+): (.*)")

Dataset = tuple[str, dict[str, bytes]]


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    """A `file://` dataset of FILES files of 3 items each, random bytes (an item's bytes occur nowhere else)."""
    root = tmp_path / "dataset"
    rng = random.Random(7)
    files = {f"part{i % 3}/file{i:03d}.bin": rng.randbytes(FILE_SIZE) for i in range(FILES)}
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return f"file://{root}", files


def start_mount(mount_factory: MountFactory, uri: str, launcher: Sequence[str] = ()) -> tuple[MountProcess, int]:
    """A mount caching the whole dataset if it can (quota 100 MB), with its metrics on a free port; `launcher`: a
    command it runs under (a fault injector's)."""
    port = free_port()
    mount = mount_factory(
        {"job1": uri},
        "--chunk-size", str(CHUNK), "--cache-size", f"{uri}=100MB", "--metrics-port", str(port),
        launcher=launcher,
    )  # fmt: skip
    return mount, port


def numbers(port: int) -> dict[str, float]:
    """The daemon's live numbers from /metrics (one dataset, one job): sample name -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


def read_all(mount: MountProcess, files: dict[str, bytes], paths: list[str]) -> None:
    """Read `paths` whole through the mount and compare with the backend's bytes (an EIO fails the test)."""
    root = mount.job_dir("job1")
    for path in paths:
        assert (root / path).read_bytes() == files[path], path


def warnings_in_log(mount: MountProcess) -> list[tuple[str, str]]:
    """(logger, message) of every WARNING or worse the daemon logged."""
    found = (_LOG_LINE.search(line) for line in mount.log_path.read_text().splitlines())
    return [(match[2], match[3]) for match in found if match]


def assert_one_cache_warning_naming(mount: MountProcess, cache_dir: Path) -> None:
    """One warning from the cache, naming the cache dir; any other names it too (the statistics file, which lives
    there, warns once while it cannot be written: the cache dir gone, or an `rm` racing the write)."""
    warnings = warnings_in_log(mount)
    from_cache = [message for logger, message in warnings if logger == "fuseclient.cache"]
    assert len(from_cache) == 1 and str(cache_dir) in from_cache[0], warnings
    assert all(str(cache_dir) in message for _, message in warnings), warnings


def unmount_cleanly(mount: MountProcess) -> None:
    """`silod umount` succeeds and the daemon exits 0, leaving nothing mounted."""
    assert mount.process is not None
    result = subprocess.run([*SILOD, "umount", str(mount.mountpoint)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert mount.process.wait(timeout=30) == 0, mount.log_path.read_text()[-3000:]
    assert not os.path.ismount(mount.mountpoint)
    assert "Traceback" not in mount.log_path.read_text()


def cached_and_fresh(files: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """Half the files (read before the fault, so cached) and the other half, in a fixed shuffled order."""
    order = sorted(files)
    random.Random(3).shuffle(order)
    return order[: FILES // 2], order[FILES // 2 :]


@pytest.mark.expected_warnings
@pytest.mark.parametrize("layout", ["the cache dir is the disk", "the cache dir is a folder on the disk"])
def test_a_cache_disk_unmounted_under_a_running_mount_serves_every_read_from_the_backend_and_claims_nothing(
    tmpfs: TmpfsFactory, mount_factory: MountFactory, tmp_path: Path, dataset: Dataset, layout: str
) -> None:
    uri, files = dataset
    root = tmp_path / "m"  # the mount's own folder (mount_factory's name "m")
    if layout == "the cache dir is the disk":
        disk = tmpfs(root / "cache", "16m")
    else:  # --cache-dir /mnt/nvme/silod: once the disk is gone, the cache dir does not even exist
        disk = tmpfs(root / "disk", "16m")
        (root / "cache").symlink_to(disk / "silod")  # the daemon resolves it to the folder on the disk
    mount, port = start_mount(mount_factory, uri)
    cache_dir = mount.cache_dir.resolve()
    before, after = cached_and_fresh(files)
    read_all(mount, files, before)
    held = numbers(port)
    assert (held["silod_cache_items"], held["silod_cache_bytes"]) == (3 * len(before), FILE_SIZE * len(before))

    subprocess.run(["umount", "-l", str(disk)], check=True)  # as an operator, or a failing disk's removal

    read_all(mount, files, before + after)  # the cached half from the backend now, and the half never cached
    read_all(mount, files, sorted(files))
    assert mount.process is not None and mount.process.poll() is None
    now = numbers(port)
    assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (0, 0)  # nothing claimed: the disk is gone
    assert now["silod_cache_dropped_items_total"] == 3 * len(before)
    total = FILE_SIZE * FILES
    assert now["silod_backend_bytes_total"] == FILE_SIZE * len(before) + 2 * total  # every read after the loss
    # Nothing is written where the disk was (the root file system, under an unmounted disk's mountpoint), the
    # statistics file included: it is written through the cache dir's descriptor, which still leads to the disk.
    assert os.listdir(disk) == []
    assert_one_cache_warning_naming(mount, cache_dir)
    unmount_cleanly(mount)


@pytest.mark.expected_warnings
@pytest.mark.parametrize("deleted", ["everything in the cache dir", "the dataset's item folders"])
def test_cache_files_deleted_under_a_running_mount_are_read_from_the_backend_and_leave_the_accounting(
    mount_factory: MountFactory, dataset: Dataset, deleted: str
) -> None:
    uri, files = dataset
    mount, port = start_mount(mount_factory, uri)
    before, after = cached_and_fresh(files)
    read_all(mount, files, before)
    assert numbers(port)["silod_cache_items"] == 3 * len(before)

    if deleted == "everything in the cache dir":  # rm -rf <cache dir>/*
        doomed = list(mount.cache_dir.iterdir())
    else:  # rm -rf <cache dir>/<dataset>/items/*
        doomed = list(mount.cache_dir.glob("*/items/*"))
    assert doomed
    for path in doomed:
        subprocess.run(["rm", "-rf", str(path)], check=True)

    read_all(mount, files, before + after)
    read_all(mount, files, sorted(files))
    assert mount.process is not None and mount.process.poll() is None
    now = numbers(port)
    on_disk = entries_on_disk(mount.cache_dir)
    total = FILE_SIZE * FILES
    assert now["silod_cache_dropped_items_total"] == 3 * len(before)
    if deleted == "everything in the cache dir":
        # The dataset's cache folder is gone with its vouching metadata (and the cache dir's lock): caching
        # stops until a restart instead of writing where the cache no longer is.
        assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (0, 0)
        assert on_disk == {}
        assert now["silod_backend_bytes_total"] == FILE_SIZE * len(before) + 2 * total
    else:
        # Each missing entry is dropped when a read finds it gone, then fetched and admitted again.
        assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (3 * FILES, total)
        assert sum(on_disk.values()) == total and len(on_disk) == 3 * FILES
        assert now["silod_backend_bytes_total"] == FILE_SIZE * len(before) + total
    assert_one_cache_warning_naming(mount, mount.cache_dir.resolve())
    unmount_cleanly(mount)


@pytest.mark.expected_warnings
def test_a_cache_dir_deleted_and_taken_by_a_second_mount_gets_no_file_from_the_first(
    mount_factory: MountFactory, dataset: Dataset
) -> None:
    """`rm -rf` of a running mount's cache dir takes its lock with it, so a second mount given the same cache dir
    takes it. The first must not write into the second's cache (its admissions would be counted by neither) nor
    over the second's statistics file: it caches nothing more, and the cache dir holds exactly what the second
    one counts."""
    uri, files = dataset
    first, first_port = start_mount(mount_factory, uri)
    cache_dir = first.cache_dir
    before, after = cached_and_fresh(files)
    read_all(first, files, before)
    subprocess.run(["rm", "-rf", str(cache_dir)], check=True)

    second_port = free_port()
    second = mount_factory(
        {"job1": uri}, "--chunk-size", str(CHUNK), "--cache-size", f"{uri}=100MB", "--metrics-port",
        str(second_port), "--cache-dir", str(cache_dir), name="second",
    )  # fmt: skip
    read_all(second, files, before)
    read_all(first, files, after)  # never cached by the first: fetched, and offered to its cache
    read_all(first, files, before)  # its cached entries are gone: found so, dropped, fetched again

    first_numbers, second_numbers = numbers(first_port), numbers(second_port)
    assert (first_numbers["silod_cache_items"], first_numbers["silod_cache_bytes"]) == (0, 0)
    on_disk = entries_on_disk(cache_dir)
    assert len(on_disk) == second_numbers["silod_cache_items"] == 3 * len(before)
    assert sum(on_disk.values()) == second_numbers["silod_cache_bytes"]
    polling.eventually((cache_dir / "stats.json").exists, what="the second mount's first statistics")
    for _ in range(5):  # over several of both daemons' statistics intervals: always the second's file
        written = json.loads((cache_dir / "stats.json").read_text())
        assert [d["cached_items"] for d in written["datasets"].values()] == [3 * len(before)]
        time.sleep(0.2)
    assert_one_cache_warning_naming(first, cache_dir.resolve())
    unmount_cleanly(first)
    unmount_cleanly(second)


def _locate(entry: bytes, files: dict[str, bytes]) -> tuple[str, int]:
    """The file and offset whose bytes a (complete) cache entry holds: random bytes occur once."""
    for path, data in files.items():
        at = data.find(entry)
        if at >= 0:
            return path, at
    raise AssertionError("a cache entry holds bytes of no file")


def direct_read(path: Path, offset: int) -> bytes:
    """One page at `offset` (page-aligned) with O_DIRECT: the daemon is asked for exactly this page, not the
    kernel's read-ahead window, so a cache entry cut short past it would be read, not found short."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        with mmap.mmap(-1, 4096) as buffer:  # page-aligned, as O_DIRECT wants
            return buffer[: os.preadv(fd, [buffer], offset)]
    finally:
        os.close(fd)


def _whole_chunks_cached(mount_factory: MountFactory, dataset: Dataset) -> tuple[MountProcess, int, list[Path]]:
    """A mount with half the files read (cached), its metrics port, and its entries of whole chunks, sorted."""
    uri, files = dataset
    mount, port = start_mount(mount_factory, uri)
    before, _ = cached_and_fresh(files)
    read_all(mount, files, before)
    entries = sorted(entries_on_disk(mount.cache_dir).items())
    assert len(entries) == 3 * len(before)
    return mount, port, [path for path, size in entries if size == CHUNK]


@pytest.mark.expected_warnings
def test_a_cache_entry_cut_short_on_disk_is_never_served_but_dropped_and_fetched_again(
    mount_factory: MountFactory, dataset: Dataset
) -> None:
    _, files = dataset
    mount, port, whole_chunks = _whole_chunks_cached(mount_factory, dataset)
    halved, emptied, replaced = whole_chunks[0], whole_chunks[3], whole_chunks[6]
    where = {path: _locate(held_bytes(path.read_bytes()), files) for path in (halved, emptied, replaced)}
    os.truncate(halved, CHUNK // 2)  # a partial file where a complete entry was
    os.truncate(emptied, 0)
    replaced.write_bytes(b"\xff" * (CHUNK - 4096))  # shorter, and other bytes

    for path in (halved, emptied, replaced):  # a page that the shortened file still holds (not the emptied)
        name, offset = where[path]
        assert direct_read(mount.job_dir("job1") / name, offset + 4096) == files[name][offset + 4096 : offset + 8192]
    read_all(mount, files, sorted(files))
    assert mount.process is not None and mount.process.poll() is None

    on_disk = entries_on_disk(mount.cache_dir)
    assert sum(on_disk.values()) == FILE_SIZE * FILES and len(on_disk) == 3 * FILES
    for path, size in on_disk.items():  # every entry whole again: the damaged three dropped and fetched again
        name, offset = _locate(held_bytes(path.read_bytes()), files)
        assert offset % CHUNK == 0 and size == len(files[name][offset : offset + CHUNK]), path
    now = numbers(port)
    assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (3 * FILES, FILE_SIZE * FILES)
    assert now["silod_cache_dropped_items_total"] == 3
    assert now["silod_backend_bytes_total"] == FILE_SIZE * FILES + 3 * CHUNK  # each damaged entry once more
    assert_one_cache_warning_naming(mount, mount.cache_dir.resolve())
    unmount_cleanly(mount)


@pytest.mark.expected_warnings
def test_a_flipped_bit_in_a_cache_entry_is_never_served_but_dropped_counted_corrupt_and_fetched_again(
    mount_factory: MountFactory, dataset: Dataset
) -> None:
    _, files = dataset
    mount, port, whole_chunks = _whole_chunks_cached(mount_factory, dataset)
    flipped = whole_chunks[2]
    name, offset = _locate(held_bytes(flipped.read_bytes()), files)
    with open(flipped, "r+b") as entry_file:  # one bit, at the right size: what a failing disk hands back
        entry_file.seek(5000)
        byte = entry_file.read(1)[0]
        entry_file.seek(5000)
        entry_file.write(bytes([byte ^ 0x10]))
    cached = numbers(port)

    assert direct_read(mount.job_dir("job1") / name, offset + 4096) == files[name][offset + 4096 : offset + 8192]
    read_all(mount, files, sorted(files))
    assert mount.process is not None and mount.process.poll() is None

    now = numbers(port)
    assert now["silod_cache_corrupt_items_total"] == now["silod_cache_dropped_items_total"] == 1
    # The item fetched once more, read whole from the backend, then cached again with the right bytes.
    assert now["silod_backend_bytes_total"] == cached["silod_backend_bytes_total"] + CHUNK + FILE_SIZE * FILES // 2
    assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (3 * FILES, FILE_SIZE * FILES)
    assert held_bytes(flipped.read_bytes()) == files[name][offset : offset + CHUNK]
    warnings = warnings_in_log(mount)
    assert_one_cache_warning_naming(mount, mount.cache_dir.resolve())
    assert "do not match their checksum" in warnings[0][1] and "other bytes than were written" in warnings[0][1]
    unmount_cleanly(mount)


@pytest.mark.expected_warnings
def test_two_cache_entries_of_the_same_size_swapped_on_disk_are_never_served_as_each_other_but_dropped_and_refetched(
    mount_factory: MountFactory, dataset: Dataset
) -> None:
    """Two whole entries, each with the right checksums for its own bytes, under each other's names (a file system
    repair, a copy or script that got the names wrong): the checksums are seeded with the item, so each fails."""
    _, files = dataset
    mount, port, whole_chunks = _whole_chunks_cached(mount_factory, dataset)
    one, other = whole_chunks[1], whole_chunks[4]
    where = {path: _locate(held_bytes(path.read_bytes()), files) for path in (one, other)}
    os.rename(one, one.parent / "swapping")
    os.rename(other, one)
    os.rename(one.parent / "swapping", other)
    cached = numbers(port)

    for path in (one, other):  # a page of each item, which the swapped entry would hand over as the other's
        name, offset = where[path]
        assert direct_read(mount.job_dir("job1") / name, offset + 4096) == files[name][offset + 4096 : offset + 8192]
    read_all(mount, files, sorted(files))
    assert mount.process is not None and mount.process.poll() is None

    now = numbers(port)
    assert now["silod_cache_corrupt_items_total"] == now["silod_cache_dropped_items_total"] == 2
    assert now["silod_backend_bytes_total"] == cached["silod_backend_bytes_total"] + 2 * CHUNK + FILE_SIZE * FILES // 2
    assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (3 * FILES, FILE_SIZE * FILES)
    for path in (one, other):  # fetched and cached again, each under its own name
        assert _locate(held_bytes(path.read_bytes()), files) == where[path]
    assert_one_cache_warning_naming(mount, mount.cache_dir.resolve())
    unmount_cleanly(mount)


def _half_cached_under_faults(
    mount_factory: MountFactory, dataset: Dataset
) -> tuple[MountProcess, int, PosixFaults, list[str], dict[str, float]]:
    """A mount whose calls libfiu can fail, with half the files read (cached): the mount, its metrics port, the
    faults, the cached files and the numbers then."""
    uri, files = dataset
    faults = PosixFaults()
    mount, port = start_mount(mount_factory, uri, launcher=faults.launcher)
    assert mount.process is not None
    faults.pid = mount.process.pid
    before, _ = cached_and_fresh(files)
    read_all(mount, files, before)
    return mount, port, faults, before, numbers(port)


@pytest.mark.expected_warnings
def test_a_cache_entry_whose_read_fails_with_eio_is_served_from_the_backend_and_cached_again_faked_eio(
    mount_factory: MountFactory, dataset: Dataset
) -> None:
    """A bad sector under a cached entry: the read of it answers EIO (faked with libfiu: the daemon's next `pread`,
    the cache's, fails; the file stays whole). The training job gets the backend's bytes, not an error; the entry
    is dropped, fetched once more and cached again; one warning names the cache dir and the error."""
    files = dataset[1]
    mount, port, faults, before, cached = _half_cached_under_faults(mount_factory, dataset)
    assert cached["silod_cache_items"] == 3 * len(before)

    faults.fail_next(PosixFaults.PREADS)
    read_all(mount, files, before[:1])  # served, although the first pread of its first item failed
    read_all(mount, files, sorted(files))
    assert mount.process is not None and mount.process.poll() is None

    now = numbers(port)
    assert now["silod_cache_dropped_items_total"] == 1
    assert now["silod_backend_bytes_total"] == cached["silod_backend_bytes_total"] + CHUNK + FILE_SIZE * (
        FILES - len(before)
    )  # the failed entry once more, and the files not read before
    assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (3 * FILES, FILE_SIZE * FILES)
    assert_one_cache_warning_naming(mount, mount.cache_dir.resolve())
    assert any("Input/output error" in message for _, message in warnings_in_log(mount))
    unmount_cleanly(mount)


@pytest.mark.expected_warnings
def test_a_cache_entry_the_daemon_cannot_open_for_want_of_descriptors_is_fetched_once_and_kept_faked_emfile(
    mount_factory: MountFactory, dataset: Dataset
) -> None:
    """The daemon out of file descriptors (EMFILE, faked with libfiu: its next `open`, the cache's) says nothing
    about the entry: the reader gets the backend's bytes, the entry stays cached and serves the next reads, and one
    warning names the cache dir and the shortage."""
    files = dataset[1]
    mount, port, faults, before, cached = _half_cached_under_faults(mount_factory, dataset)

    faults.fail_next(PosixFaults.OPENS, errno.EMFILE)
    read_all(mount, files, before)  # the first item's cache file cannot be opened; the rest are read from disk
    read_all(mount, files, before)
    now = numbers(port)
    assert now["silod_cache_dropped_items_total"] == 0
    assert now["silod_backend_bytes_total"] == cached["silod_backend_bytes_total"] + CHUNK  # that item, once
    assert (now["silod_cache_items"], now["silod_cache_bytes"]) == (
        cached["silod_cache_items"],
        cached["silod_cache_bytes"],
    )
    assert_one_cache_warning_naming(mount, mount.cache_dir.resolve())
    assert any("Too many open files" in message for _, message in warnings_in_log(mount))
    unmount_cleanly(mount)


def test_a_cold_cache_disk_serves_every_cached_item_without_refetching_or_dropping_it(
    ext4: Ext4Factory, mount_factory: MountFactory, tmp_path: Path, dataset: Dataset
) -> None:
    uri, files = dataset
    ext4(tmp_path / "m" / "cache", 64 * 1024 * 1024)  # the mount's cache dir (mount_factory's name "m")
    mount, port = start_mount(mount_factory, uri)
    read_all(mount, files, sorted(files))
    cached = numbers(port)
    assert cached["silod_cache_items"] == 3 * FILES

    for path in entries_on_disk(mount.cache_dir):  # a read now waits for the disk
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    read_all(mount, files, sorted(files))

    now = numbers(port)
    assert now["silod_backend_bytes_total"] == cached["silod_backend_bytes_total"] == FILE_SIZE * FILES
    assert now["silod_cache_items"] == 3 * FILES and now["silod_cache_dropped_items_total"] == 0
    assert now["silod_job_cache_hits_total"] >= cached["silod_job_cache_hits_total"] + 3 * FILES
    assert warnings_in_log(mount) == []
    unmount_cleanly(mount)
