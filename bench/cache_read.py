"""What the cache's own read and admission paths cost, against plain file IO on the same files in the same run.

A warm epoch of large files reaches the daemon as one `DatasetCache.read` per kernel request (128 KiB, the
kernel's usual FUSE read) and a cold one as one `DatasetCache.admit` per 4 MiB item. This benchmark times
both in process, without FUSE, so that what the cache adds (opening the entry, checking its size and the
CRC32C of the blocks a read covers, computing them on admission) is not lost in the FUSE request's own cost:

- reads: every 128 KiB piece of every cached item, items in a shuffled order, pieces in order, all from the page
  cache (a first pass warms it); the baseline is `open` + `pread` + `close` of the same ranges of the same files;
- admissions: every item admitted to an empty cache; the baseline writes the same bytes to files of the same
  names (temporary name, 32 KiB pieces, rename), as the cache did before it kept checksums.

Each is timed `--rounds` times, alternating with its baseline; the medians and their ratio are printed.

    PYTHONPATH=. .venv/bin/python bench/cache_read.py [--items 64] [--rounds 5] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fuseclient import cache_disk
from fuseclient.cache import WRITE_PIECE, DatasetCache
from silodlib.manifest import Manifest

CHUNK = 4 * 1024 * 1024  # the mount's default item size
REQUEST = 128 * 1024  # the kernel's usual FUSE read


def _timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _plain_reads(cache_dir: Path, order: list[int]) -> None:
    items_dir = cache_dir / cache_disk.ITEMS_NAME
    for item in order:
        for offset in range(0, CHUNK, REQUEST):
            fd = os.open(cache_disk.item_path(items_dir, item), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fstat(fd)
                assert len(os.pread(fd, REQUEST, offset)) == REQUEST
            finally:
                os.close(fd)


def _cache_reads(cache: DatasetCache, order: list[int]) -> None:
    for item in order:
        for offset in range(0, CHUNK, REQUEST):
            data = cache.read(item, offset, REQUEST)
            assert data is not None and len(data) == REQUEST


def _plain_writes(directory: Path, payloads: list[bytes]) -> None:
    directory.mkdir()
    for item, data in enumerate(payloads):
        temp = directory / f"{item}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:WRITE_PIECE]) :]
        finally:
            os.close(fd)
        os.rename(temp, directory / str(item))


def _admissions(directory: Path, manifest: Manifest, payloads: list[bytes]) -> None:
    cache = DatasetCache(directory, manifest, len(payloads) * CHUNK)
    for item, data in enumerate(payloads):
        assert cache.admit(item, data)
    cache.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=64, help="4 MiB items (default 64: 256 MiB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, help="where the cache files go (default: the system's temp dir)")
    args = parser.parse_args()

    manifest = Manifest(CHUNK, ["data"], [args.items * CHUNK], [0], ["v1"])
    rng = random.Random(1)
    payloads = [rng.randbytes(CHUNK) for _ in range(args.items)]
    order = list(range(args.items))
    rng.shuffle(order)
    megabytes = args.items * CHUNK / 1e6
    with tempfile.TemporaryDirectory(prefix="silod-cache-bench-", dir=args.work_dir) as tmp:
        root = Path(tmp)
        cache = DatasetCache(root / "cache", manifest, args.items * CHUNK)
        for item, data in enumerate(payloads):
            assert cache.admit(item, data)
        _cache_reads(cache, order)  # warm the page cache
        reads = [
            (_timed(lambda: _cache_reads(cache, order)), _timed(lambda: _plain_reads(root / "cache", order)))
            for _ in range(args.rounds)
        ]
        writes = []
        for _ in range(args.rounds):
            admitted = _timed(lambda: _admissions(root / "admitted", manifest, payloads))
            written = _timed(lambda: _plain_writes(root / "written", payloads))
            writes.append((admitted, written))
            shutil.rmtree(root / "admitted")
            shutil.rmtree(root / "written")
        assert cache.statistics().dropped == 0
    requests = args.items * (CHUNK // REQUEST)
    for name, unit, pairs in (("reads of 128 KiB", requests, reads), ("admissions of 4 MiB", args.items, writes)):
        ours, plain = (statistics.median(times) for times in zip(*pairs, strict=True))
        print(
            f"{name:20}: cache {megabytes / ours:8.0f} MB/s ({ours / unit * 1e6:6.1f} us each), "
            f"plain file IO {megabytes / plain:8.0f} MB/s ({plain / unit * 1e6:6.1f} us each): "
            f"{plain / ours:.2f} x, median of {args.rounds}"
        )


if __name__ == "__main__":
    main()
