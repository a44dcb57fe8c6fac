"""Datasets, contents and checks for tests of the uniform cache, and `make_cache`, which closes what it opens."""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from xxhash import xxh3_64_intdigest

from fuseclient import cache_disk
from fuseclient.cache import DatasetCache
from fuseclient.cache_disk import FANOUT
from silodlib.manifest import Manifest


def one_file_manifest(items: int, item_size: int, version: str = "v1") -> Manifest:
    """One file split into `items` chunks of `item_size` bytes: cheap to build even for 200 k items."""
    return Manifest(item_size, ["data"], [items * item_size], [0], [version])


def varied_manifest(seed: int, files: int, max_size: int, chunk: int = 4096) -> Manifest:
    rng = random.Random(seed)
    sizes = [rng.randint(1, max_size) for _ in range(files)]
    return Manifest(chunk, [f"f{i:05d}" for i in range(files)], sizes, [0] * files, [f"v{i}" for i in range(files)])


def content(manifest: Manifest, item: int) -> bytes:
    """Deterministic, item-specific bytes (a truncated or swapped entry would not match)."""
    size = manifest.item_size(item)
    pattern = item.to_bytes(4, "big") + b"silod"
    return (pattern * (size // len(pattern) + 1))[:size]


CHECKSUM_BLOCK = 64 * 1024  # the documented entry format, restated here rather than imported


def entry_size(item_size: int) -> int:
    """The documented entry size: the item's bytes, then 8 bytes of XXH3-64 per started 64 KiB block."""
    return item_size + 8 * ((item_size + CHECKSUM_BLOCK - 1) // CHECKSUM_BLOCK)


def entry(item: int, data: bytes) -> bytes:
    """The documented entry of item `item` of bytes `data`: the bytes, then the little-endian XXH3-64 of each
    block, seeded with the item's number."""
    blocks = range(0, len(data), CHECKSUM_BLOCK)
    return data + b"".join(
        struct.pack("<Q", xxh3_64_intdigest(data[start : start + CHECKSUM_BLOCK], item)) for start in blocks
    )


def held_size(entry_bytes: int) -> int:
    """The size of the item an entry of `entry_bytes` holds (the inverse of `entry_size`)."""
    blocks = -(-entry_bytes // (CHECKSUM_BLOCK + 8))
    return entry_bytes - 8 * blocks


def held_bytes(entry_data: bytes) -> bytes:
    """The item's bytes an entry holds, without its checksums."""
    return entry_data[: held_size(len(entry_data))]


def entries_on_disk(cache_dir: Path) -> dict[Path, int]:
    """Complete entries below `cache_dir` (path -> bytes of the item each holds): named by their item number,
    unlike the temporaries (`<item>.tmp-<pid>-<n>`) of admissions in progress."""
    found = (p for p in cache_dir.rglob("*") if p.name.isdigit() and p.parent.name.isdigit())
    return {p: held_size(p.stat().st_size) for p in found if p.is_file()}


def item_file(directory: Path, item: int) -> Path:
    """The documented layout: items/<item // 1024>/<item>."""
    return directory / "items" / str(item // FANOUT) / str(item)


def files_on_disk(directory: Path) -> dict[str, int]:
    """Relative path -> size of every file below items/."""
    root = directory / "items"
    return {str(path.relative_to(root)): path.stat().st_size for path in root.rglob("*") if path.is_file()}


def cached_items(cache: DatasetCache) -> set[int]:
    return set(cache.cached.search(1))


def check_consistent(cache: DatasetCache, directory: Path, manifest: Manifest) -> None:
    """Accounting, bitset and disk agree: every non-empty cached item has a complete file, nothing else does."""
    expected = {
        f"{item // FANOUT}/{item}": manifest.item_size(item)
        for item in cached_items(cache)
        if manifest.item_size(item) > 0
    }
    assert files_on_disk(directory) == {name: entry_size(size) for name, size in expected.items()}
    assert cache.used_bytes == sum(expected.values())
    assert cache.used_bytes <= cache.quota_bytes


@pytest.fixture
def make_cache(tmp_path: Path) -> Iterator[Callable[..., DatasetCache]]:
    opened: list[DatasetCache] = []

    def make(manifest: Manifest, quota: int, *, seed: int = 1, directory: Path | None = None) -> DatasetCache:
        cache = DatasetCache(directory or tmp_path / "cache", manifest, quota, seed=seed)
        opened.append(cache)
        return cache

    yield make
    for cache in opened:
        cache.close()


def hold_deletions(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make every deletion of cache files (`cache_disk.delete_entry`) wait until the event returned is set: the time
    a large cache takes to delete (minutes for a million items), which a test cannot otherwise hold open."""
    release = threading.Event()
    delete_entry = cache_disk.delete_entry

    def slow_delete_entry(path: str, is_dir: bool, failed: Callable[[OSError], None]) -> None:
        assert release.wait(30)
        delete_entry(path, is_dir, failed)

    monkeypatch.setattr(cache_disk, "delete_entry", slow_delete_entry)
    return release
