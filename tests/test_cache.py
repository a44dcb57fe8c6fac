"""The uniform dataset cache: quota invariants, uniform eviction on shrink, restore, crash and disk faults."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from xxhash import xxh3_64_intdigest

from fuseclient.cache import WRITE_PIECE, CacheStats, DatasetCache, NoCache
from silodlib.manifest import Manifest
from tests.cache_fixtures import (
    cached_items,
    check_consistent,
    content,
    entry,
    files_on_disk,
    item_file,
    one_file_manifest,
    varied_manifest,
)

# --- admission and reads ---------------------------------------------------------------------------


def test_admitted_items_are_files_under_the_documented_layout_and_read_back(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = Manifest(100, ["a", "b", "c"], [30, 250, 0], [0, 0, 0], ["1", "2", "3"])  # items: a, b*3, c
    cache = make_cache(manifest, 10_000)
    for item in range(4):
        assert cache.admit(item, content(manifest, item))

    assert files_on_disk(tmp_path / "cache") == {"0/0": 38, "0/1": 108, "0/2": 108, "0/3": 58}
    assert item_file(tmp_path / "cache", 3).read_bytes() == entry(3, content(manifest, 3))
    assert cache.read(1, 0, 100) == content(manifest, 1)
    assert cache.read(1, 10, 20) == content(manifest, 1)[10:30]
    assert cache.read(3, 40, 100) == content(manifest, 3)[40:]  # short at the item's end
    assert cache.read(3, 50, 10) == b""
    assert cache.read(2, 0, 0) == b""
    assert cache.used_bytes == 280
    assert [cache.contains(item) for item in range(5)] == [True] * 5
    check_consistent(cache, tmp_path / "cache", manifest)


def test_items_larger_than_one_write_piece_are_written_whole(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    """Items are written in WRITE_PIECE pieces: a multiple of the piece, one more byte and one less, all whole."""
    chunk = 3 * WRITE_PIECE
    sizes = [chunk, 2 * WRITE_PIECE + 1, WRITE_PIECE - 1]
    manifest = Manifest(chunk, ["a", "b", "c"], sizes, [0, 0, 0], ["1", "2", "3"])
    cache = make_cache(manifest, sum(sizes))
    for item in range(3):
        assert cache.admit(item, content(manifest, item))

    for item in range(3):
        assert item_file(tmp_path / "cache", item).read_bytes() == entry(item, content(manifest, item))
        assert cache.read(item, 0, chunk) == content(manifest, item)
    check_consistent(cache, tmp_path / "cache", manifest)


# --- checksums ---------------------------------------------------------------------------------------


def test_an_entry_is_the_items_bytes_then_the_xxh3_64_of_each_64_kib_block_seeded_with_the_item(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    known = b"123456789"
    data = bytes(range(256)) * 600  # 150 KiB: two whole blocks and a short one
    manifest = Manifest(len(data), ["check", "data"], [len(known), len(data)], [0, 0], ["1", "2"])
    cache = make_cache(manifest, 1_000_000)
    assert cache.admit(0, known) and cache.admit(1, data)

    assert item_file(tmp_path / "cache", 0).read_bytes() == known + xxh3_64_intdigest(known, 0).to_bytes(8, "little")
    on_disk = item_file(tmp_path / "cache", 1).read_bytes()
    assert on_disk == entry(1, data) and len(on_disk) == len(data) + 3 * 8


def test_reads_at_any_offset_and_length_return_exactly_the_admitted_bytes(
    make_cache: Callable[..., DatasetCache],
) -> None:
    """Reads are widened to whole 64 KiB blocks to check them, then cut back: block edges, unaligned and short."""
    block = 64 * 1024
    manifest = one_file_manifest(2, 3 * block + 1000)
    cache = make_cache(manifest, 10**7)
    data = content(manifest, 1)
    assert cache.admit(1, data)
    edges = [0, 1, block - 1, block, block + 1, 2 * block, 3 * block - 7, 3 * block + 999]
    cases = [(offset, length) for offset in edges for length in (1, 7, block, block + 2, 4 * block)]
    rng = random.Random(5)
    cases += [(rng.randrange(len(data)), rng.randrange(1, 2 * block)) for _ in range(50)]
    for offset, length in cases:
        assert cache.read(1, offset, length) == data[offset : offset + length], (offset, length)
    assert cache.statistics().dropped == 0


@pytest.mark.expected_warnings
@pytest.mark.parametrize("where", ["in the item's bytes", "in a checksum"])
def test_a_changed_byte_is_served_by_no_read_that_covers_its_block_and_drops_the_entry_as_corrupt(
    tmp_path: Path, make_cache: Callable[..., DatasetCache], where: str
) -> None:
    block = 64 * 1024
    manifest = one_file_manifest(1, 3 * block)
    cache = make_cache(manifest, 10**7)
    data = content(manifest, 0)
    assert cache.admit(0, data)
    path = item_file(tmp_path / "cache", 0)
    damaged = bytearray(path.read_bytes())
    damaged[2 * block + 10 if where == "in the item's bytes" else 3 * block + 2 * 8 + 1] ^= 0x01  # block 2
    path.write_bytes(damaged)

    assert cache.read(0, 0, 2 * block) == data[: 2 * block]  # blocks 0 and 1 are whole: served
    assert cache.read(0, 2 * block - 1, 2) is None  # touches block 2
    assert not cache.contains(0) and not path.exists()
    stats = cache.statistics()
    assert (stats.dropped, stats.corrupt, stats.used_bytes, stats.cached_items) == (1, 1, 0, 0)
    assert cache.admit(0, data) and cache.read(0, 0, 3 * block) == data  # fetched and cached again
    check_consistent(cache, tmp_path / "cache", manifest)


@pytest.mark.expected_warnings
def test_two_entries_of_the_same_size_swapped_on_disk_are_served_as_neither_item_and_dropped_as_corrupt(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    """Whole entries, each checksummed right, under each other's names (a file system repair, a script that got the
    names wrong): checksums seeded alike would pass, and the mount would serve one file's bytes as another's."""
    manifest = one_file_manifest(3, 100)
    cache = make_cache(manifest, 10**6)
    for item in range(3):
        assert cache.admit(item, content(manifest, item))
    first, second = item_file(tmp_path / "cache", 0), item_file(tmp_path / "cache", 1)
    os.rename(first, tmp_path / "swapping")
    os.rename(second, first)
    os.rename(tmp_path / "swapping", second)

    assert cache.read(0, 0, 100) is None and cache.read(1, 0, 100) is None  # never the other item's bytes
    assert cache.read(2, 0, 100) == content(manifest, 2)
    stats = cache.statistics()
    assert (stats.dropped, stats.corrupt, stats.cached_items) == (2, 2, 1)
    assert not first.exists() and not second.exists()
    assert cache.admit(0, content(manifest, 0)) and cache.read(0, 0, 100) == content(manifest, 0)
    check_consistent(cache, tmp_path / "cache", manifest)


def test_items_are_fanned_out_1024_per_directory(tmp_path: Path, make_cache: Callable[..., DatasetCache]) -> None:
    manifest = one_file_manifest(3000, 1)
    cache = make_cache(manifest, 3000)
    for item in (0, 1023, 1024, 2999):
        assert cache.admit(item, content(manifest, item))
    assert sorted(files_on_disk(tmp_path / "cache")) == ["0/0", "0/1023", "1/1024", "2/2999"]


def test_reads_of_uncached_items_return_none_and_bad_arguments_raise(make_cache: Callable[..., DatasetCache]) -> None:
    manifest = one_file_manifest(4, 10)
    cache = make_cache(manifest, 100)
    assert cache.read(2, 0, 10) is None
    assert not cache.contains(2)
    with pytest.raises(IndexError):
        cache.read(4, 0, 1)
    with pytest.raises(IndexError):
        cache.contains(-1)
    with pytest.raises(ValueError, match="offset and length"):
        cache.read(0, -1, 1)
    with pytest.raises(IndexError):
        cache.admit(4, b"x" * 10)


def test_admitting_data_of_the_wrong_length_raises_and_stores_nothing(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = one_file_manifest(4, 10)
    cache = make_cache(manifest, 100)
    with pytest.raises(ValueError, match="item 1 is 10 bytes, got 9"):
        cache.admit(1, b"x" * 9)
    assert not cache.contains(1)
    assert files_on_disk(tmp_path / "cache") == {}
    assert cache.statistics().admitted == 0


def test_admitting_a_cached_item_again_is_a_no_op(tmp_path: Path, make_cache: Callable[..., DatasetCache]) -> None:
    manifest = one_file_manifest(4, 10)
    cache = make_cache(manifest, 100)
    assert cache.admit(1, content(manifest, 1))
    assert cache.admit(1, b"y" * 10)
    assert cache.read(1, 0, 10) == content(manifest, 1)
    assert cache.statistics().admitted == 1
    assert cache.used_bytes == 10


def test_empty_items_are_cached_from_the_start_and_cost_nothing(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = Manifest(100, ["a", "empty", "z"], [10, 0, 10], [0, 0, 0], ["1", "2", "3"])
    cache = make_cache(manifest, 0)
    assert cache.cached.tolist() == [0, 1, 0]
    assert cache.read(1, 0, 4096) == b""
    assert cache.admit(1, b"")
    assert cache.set_quota(0) == 0  # an empty item is never a victim: it frees nothing
    assert cache.statistics() == CacheStats(0, 0, 0, 0, 0, 0, 0)  # and no entry among the cached items
    assert files_on_disk(tmp_path / "cache") == {}


def test_a_restart_counts_only_entries_as_restored_and_cached_and_names_the_empty_files_apart(
    make_cache: Callable[..., DatasetCache], caplog: pytest.LogCaptureFixture
) -> None:
    # A dataset with empty files said "restored 0 items" and then "N items already cached", N its empty files, and
    # its statistics showed more cached items than were ever admitted.
    manifest = Manifest(100, ["a", "empty", "b", "void"], [10, 0, 10, 0], [0] * 4, ["1", "2", "3", "4"])
    first = make_cache(manifest, 100)
    assert first.statistics().cached_items == 0
    assert first.admit(0, content(manifest, 0))
    assert (first.statistics().admitted, first.statistics().cached_items) == (1, 1)
    first.close()
    caplog.clear()

    second = make_cache(manifest, 100)
    assert second.statistics().cached_items == 1
    assert second.cached.tolist() == [1, 1, 0, 1]  # the empty files still read as cached
    (restored,) = [r.getMessage() for r in caplog.records if "restored" in r.getMessage()]
    assert ": restored 1 items (10 bytes) from " in restored
    assert restored.endswith(" s; its 2 empty files need no entry")


def test_no_cache_holds_and_admits_nothing_but_empty_items_and_keeps_its_quota_for_the_real_one() -> None:
    manifest = Manifest(100, ["a", "empty", "z"], [10, 0, 10], [0, 0, 0], ["1", "2", "3"])
    cache = NoCache(manifest, 50)
    assert cache.cached.tolist() == [0, 1, 0]
    assert (cache.contains(0), cache.contains(1)) == (False, True)
    assert cache.read(0, 0, 10) is None and cache.read(1, 0, 4096) == b""
    assert not cache.admit(0, b"x" * 10) and cache.admit(1, b"")
    assert cache.set_quota(70) == 0 and cache.quota_bytes == 70
    assert cache.statistics() == CacheStats(70, 0, 0, 0, 0, 0, 0, directory_lost=True)
    with pytest.raises(ValueError, match=">= 0"):
        cache.set_quota(-1)


def test_close_refuses_further_admissions(make_cache: Callable[..., DatasetCache]) -> None:
    manifest = one_file_manifest(4, 10)
    cache = make_cache(manifest, 100)
    assert cache.admit(0, content(manifest, 0))
    cache.close()
    assert not cache.admit(1, content(manifest, 1))
    assert cache.read(0, 0, 10) == content(manifest, 0)


def test_statistics_is_a_frozen_snapshot(make_cache: Callable[..., DatasetCache]) -> None:
    manifest = one_file_manifest(10, 10)
    cache = make_cache(manifest, 50)
    for item in range(7):
        cache.admit(item, content(manifest, item))
    evicted = cache.set_quota(20)
    stats = cache.statistics()
    assert stats == CacheStats(
        quota_bytes=20, used_bytes=20, cached_items=2, admitted=5, rejected_full=2, evicted=evicted, write_errors=0
    )
    assert evicted == 3
    with pytest.raises(FrozenInstanceError):
        stats.used_bytes = 0  # type: ignore[misc]
    cache.admit(9, content(manifest, 9))
    assert stats.rejected_full == 2  # a snapshot, not a live view


# --- the quota: uniform caching ----------------------------------------------------------------------


def test_beyond_the_quota_misses_are_rejected_and_nothing_is_evicted(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = one_file_manifest(20, 100)
    cache = make_cache(manifest, 550)
    admitted = [item for item in range(20) if cache.admit(item, content(manifest, item))]
    assert admitted == [0, 1, 2, 3, 4]  # first come, first cached; then full
    before = files_on_disk(tmp_path / "cache")
    for item in range(5, 20):
        assert not cache.admit(item, content(manifest, item))
    assert files_on_disk(tmp_path / "cache") == before
    assert cached_items(cache) == {0, 1, 2, 3, 4}
    stats = cache.statistics()
    assert (stats.used_bytes, stats.admitted, stats.rejected_full, stats.evicted) == (500, 5, 30, 0)


def test_a_quota_increase_evicts_nothing_and_admissions_resume(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = one_file_manifest(20, 100)
    cache = make_cache(manifest, 300)
    for item in range(20):
        cache.admit(item, content(manifest, item))
    assert cache.set_quota(300) == 0
    assert cache.set_quota(1000) == 0
    assert cached_items(cache) == {0, 1, 2}
    assert cache.admit(10, content(manifest, 10))
    assert cached_items(cache) == {0, 1, 2, 10}
    check_consistent(cache, tmp_path / "cache", manifest)


def test_a_shrink_evicts_until_under_the_new_quota_and_deletes_the_victims(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = varied_manifest(seed=3, files=200, max_size=3000)
    cache = make_cache(manifest, manifest.size_bytes)
    for item in range(manifest.item_count):
        assert cache.admit(item, content(manifest, item))
    before = cached_items(cache)

    evicted = cache.set_quota(cache.used_bytes // 3)

    after = cached_items(cache)
    assert len(before) - len(after) == evicted > 0
    assert cache.used_bytes <= cache.quota_bytes
    # No more victims than needed: putting back the last one (at most the largest) would exceed the quota.
    assert cache.used_bytes + max(manifest.item_size(item) for item in before - after) > cache.quota_bytes
    check_consistent(cache, tmp_path / "cache", manifest)
    for item in before - after:
        assert cache.read(item, 0, 10) is None
    for item in after:
        assert cache.read(item, 0, 4096) == content(manifest, item)
    assert cache.set_quota(0) == len(after)
    assert files_on_disk(tmp_path / "cache") == {}


def chi_square_uniform(counts: list[int], trials: int, p: float) -> float:
    """Pearson's statistic for per-item eviction counts, each expected Binomial(trials, p)."""
    mean, variance = trials * p, trials * p * (1 - p)
    return sum((count - mean) ** 2 for count in counts) / variance


@pytest.fixture
def memory_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in /dev/shm when there is one: for tests that churn many small files and time nothing."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="silod-test-cache-", dir="/dev/shm"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def test_shrink_eviction_is_uniformly_random(memory_dir: Path, make_cache: Callable[..., DatasetCache]) -> None:
    items, trials = 1000, 40
    manifest = one_file_manifest(items, 1)
    cache = make_cache(manifest, items, seed=12345, directory=memory_dir / "cache")
    counts = [0] * items
    for item in range(items):
        cache.admit(item, content(manifest, item))
    for _ in range(trials):
        assert cache.set_quota(items // 2) == items // 2
        for item in set(range(items)) - cached_items(cache):
            counts[item] += 1
        cache.set_quota(items)
        for item in range(items):
            cache.admit(item, content(manifest, item))  # the victims come back as the most recent admissions
        assert cache.cached.all()

    # Each count is Binomial(40, 1/2): the statistic is about chi-square with 999 degrees of freedom (sd 45).
    statistic = chi_square_uniform(counts, trials, 0.5)
    assert 1000 - 5 * 45 < statistic < 1000 + 5 * 45, statistic
    # The same bounds reject the biased policies this test exists to catch.
    lowest_first = [trials] * (items // 2) + [0] * (items // 2)
    most_recent_first = [trials // 2 + (1 if i % 2 else -1) * (trials // 2) for i in range(items)]
    exactly_alternating = [trials // 2] * items
    for biased in (lowest_first, most_recent_first, exactly_alternating):
        assert not 1000 - 5 * 45 < chi_square_uniform(biased, trials, 0.5) < 1000 + 5 * 45


def test_a_shrink_holds_no_lock_while_deleting_files(
    monkeypatch: pytest.MonkeyPatch, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = one_file_manifest(10, 10)
    cache = make_cache(manifest, 100)
    for item in range(6):
        cache.admit(item, content(manifest, item))
    deleting, release = threading.Event(), threading.Event()
    real_unlink = os.unlink

    def slow_unlink(path: str | bytes | os.PathLike[str] | os.PathLike[bytes], **kwargs: object) -> None:
        deleting.set()
        release.wait(10)
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", slow_unlink)  # what cache.py deletes with
    shrinker = threading.Thread(target=cache.set_quota, args=(30,))
    shrinker.start()
    try:
        assert deleting.wait(10)
        # While a deletion is stuck, the accounting is already right and every other call proceeds.
        kept = min(cached_items(cache) - {9})
        answers: list[object] = []
        others = threading.Thread(
            target=lambda: answers.extend(
                (cache.statistics().used_bytes, cache.admit(9, content(manifest, 9)), cache.read(kept, 0, 10))
            )
        )
        others.start()
        others.join(5)
        assert not others.is_alive(), "a reader or admission waited for a file deletion"
        assert answers == [30, False, content(manifest, kept)]  # full: the shrink's victims are already gone
        assert len(cached_items(cache)) == 3
    finally:
        release.set()
        shrinker.join(10)
    assert cache.statistics().evicted == 3


def test_an_admission_that_completes_after_a_shrink_is_dropped_if_it_no_longer_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = one_file_manifest(10, 10)
    cache = make_cache(manifest, 100)
    for item in range(5):
        cache.admit(item, content(manifest, item))
    writing, release = threading.Event(), threading.Event()
    real_rename = os.rename

    def slow_rename(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        writing.set()
        release.wait(10)
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", slow_rename)  # what cache.py renames with
    results: list[bool] = []
    admitter = threading.Thread(target=lambda: results.append(cache.admit(7, content(manifest, 7))))
    admitter.start()
    assert writing.wait(10)
    assert cache.set_quota(50) == 0  # the quota still covers the cached items, not the one in flight
    release.set()
    admitter.join(10)
    assert results == [False]
    assert not cache.contains(7)
    check_consistent(cache, tmp_path / "cache", manifest)
    assert cache.statistics().rejected_full == 1


def test_concurrent_admissions_and_quota_changes_never_exceed_the_quota(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = varied_manifest(seed=7, files=400, max_size=8192)
    total = manifest.size_bytes
    cache = make_cache(manifest, total // 3, seed=7)
    violations: list[CacheStats] = []
    done = threading.Event()

    def admitter(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            item = rng.randrange(manifest.item_count)
            cache.admit(item, content(manifest, item))

    def quota_changer() -> None:
        rng = random.Random(99)
        while not done.is_set():
            cache.set_quota(rng.randrange(total // 10, total // 2))

    def monitor() -> None:
        while not done.is_set():
            stats = cache.statistics()
            if stats.used_bytes > stats.quota_bytes:
                violations.append(stats)

    workers = [threading.Thread(target=admitter, args=(seed,)) for seed in range(16)]
    watchers = [threading.Thread(target=quota_changer), threading.Thread(target=monitor)]
    for thread in workers + watchers:
        thread.start()
    for thread in workers:
        thread.join(30)
    done.set()
    for thread in watchers:
        thread.join(30)

    assert not violations
    stats = cache.statistics()
    assert stats.admitted > 0 and stats.evicted > 0 and stats.rejected_full > 0
    assert stats.admitted - stats.evicted == stats.cached_items
    check_consistent(cache, tmp_path / "cache", manifest)
    assert not [name for name in files_on_disk(tmp_path / "cache") if ".tmp" in name]
