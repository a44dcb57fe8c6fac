"""Datasets, contents and checks for tests of the uniform cache, and `make_cache`, which closes what it opens."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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
    assert files_on_disk(directory) == expected
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
