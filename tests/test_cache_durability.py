"""The uniform cache across restarts, crashes and failing disks: what a restart reuses, discards and evicts,
what a kill -9 leaves, and admissions on a disk that fills up or turns read-only."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from xxhash import xxh3_64_intdigest

from fuseclient import cache_disk
from fuseclient.cache import DatasetCache
from fuseclient.cache_disk import FANOUT
from tests import polling
from tests.cache_fixtures import (
    cached_items,
    check_consistent,
    content,
    entries_on_disk,
    entry,
    entry_size,
    files_on_disk,
    hold_deletions,
    item_file,
    one_file_manifest,
)
from tests.disks import Ext4Factory, TmpfsFactory, fill_up

# --- restore ------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def test_restore_reuses_complete_entries_and_discards_partial_ones(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    directory = tmp_path / "cache"
    manifest = one_file_manifest(2000, 100)
    first = make_cache(manifest, 100_000)
    for item in (*range(10), 1500):
        first.admit(item, content(manifest, item))
    first.close()
    # What a crash (or a power loss, or a stranger) can leave behind.
    (directory / "items" / "0" / "11.tmp-999-0").write_bytes(content(manifest, 11)[:40])  # write in progress
    item_file(directory, 5).write_bytes(content(manifest, 5)[:60])  # truncated entry
    item_file(directory, 12).write_bytes(content(manifest, 12) + b"x")  # too long
    (directory / "items" / "0" / "junk").write_bytes(b"?")
    (directory / "items" / "0" / "0007").write_bytes(content(manifest, 7))  # not the canonical name
    (directory / "items" / "1" / "5").write_bytes(content(manifest, 5))  # wrong bucket
    (directory / "items" / "0" / "2000").write_bytes(b"x" * 100)  # beyond the manifest
    (directory / "items" / "stray").mkdir()

    second = make_cache(manifest, 100_000)

    assert cached_items(second) == {0, 1, 2, 3, 4, 6, 7, 8, 9, 1500}
    assert sorted(files_on_disk(directory)) == sorted(f"{item // FANOUT}/{item}" for item in cached_items(second))
    assert not (directory / "items" / "stray").exists()
    for item in cached_items(second):
        assert second.read(item, 0, 100) == content(manifest, item)
    check_consistent(second, directory, manifest)
    assert second.admit(5, content(manifest, 5))
    stats = second.statistics()
    assert (stats.admitted, stats.evicted, stats.cached_items) == (1, 0, 11)


def test_a_restore_above_the_quota_evicts_random_entries_down_to_it(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    manifest = one_file_manifest(100, 10)
    first = make_cache(manifest, 1000)
    for item in range(100):
        first.admit(item, content(manifest, item))
    first.close()

    second = make_cache(manifest, 300, seed=5)

    kept = cached_items(second)
    assert len(kept) == 30 and second.statistics().evicted == 70
    assert kept != set(range(30)) and kept != set(range(70, 100))  # not by number (nor scandir order)
    check_consistent(second, tmp_path / "cache", manifest)


@pytest.mark.parametrize(
    "fault",
    ["other manifest", "missing metadata", "corrupt metadata", "format before checksums", "checksums not of the item"],
)
def test_items_not_vouched_for_by_this_manifest_are_wiped(
    tmp_path: Path, make_cache: Callable[..., DatasetCache], fault: str
) -> None:
    directory = tmp_path / "cache"
    manifest = one_file_manifest(10, 10)
    first = make_cache(manifest, 100)
    for item in range(10):
        first.admit(item, content(manifest, item))
    first.close()
    reopened_with = manifest
    if fault == "other manifest":
        reopened_with = one_file_manifest(10, 10, version="v2")  # same shape, another ETag: other bytes
        assert reopened_with.digest != manifest.digest
    elif fault == "missing metadata":
        (directory / "cache.json").unlink()
    elif fault == "format before checksums":  # what an upgraded node finds: entries without checksums
        metadata = json.loads((directory / "cache.json").read_text())
        (directory / "cache.json").write_text(json.dumps({**metadata, "format": "silod-cache/1"}))
    elif fault == "checksums not of the item":  # from a silod whose checksums were not seeded with the item
        metadata = json.loads((directory / "cache.json").read_text())
        (directory / "cache.json").write_text(json.dumps({**metadata, "format": "silod-cache/2"}))
        for item in range(10):  # whole entries of that format, which this one must not read as its own
            data = content(manifest, item)
            item_file(directory, item).write_bytes(data + xxh3_64_intdigest(data).to_bytes(8, "little"))
    else:
        (directory / "cache.json").write_text("{not json")

    second = make_cache(reopened_with, 100)

    assert not second.cached.any()
    assert files_on_disk(directory) == {}
    polling.eventually(  # the dropped items' tree, deleted by a thread of its own
        lambda: sorted(path.name for path in directory.iterdir()) == ["cache.json", "items"],
        what="the dropped items deleted",
    )
    second.admit(3, content(reopened_with, 3))
    second.close()
    third = make_cache(reopened_with, 100)  # the new metadata now vouches for the new entries
    assert cached_items(third) == {3}


def test_opening_a_cache_does_not_wait_for_the_deletion_of_its_dropped_items(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    manifest = one_file_manifest(10, 10)
    (directory / "items" / "0").mkdir(parents=True)
    (directory / "items" / "0" / "3").write_bytes(b"from a cache no metadata vouches for")
    release = threading.Event()
    deleted: list[str] = []

    def slow_delete(path: str, is_dir: bool) -> None:  # a deletion that takes as long as the test wants
        assert release.wait(30)
        shutil.rmtree(path) if is_dir else os.unlink(path)
        deleted.append(path)

    cache_disk.open_directory(directory, manifest, "dataset", {}, slow_delete)  # returns with the deletion pending

    stale = [path for path in directory.iterdir() if path.name.startswith("items.stale-")]
    assert len(stale) == 1 and (directory / "items").is_dir() and not any((directory / "items").iterdir())
    assert deleted == []
    cache_disk.open_directory(directory, manifest, "dataset", {}, slow_delete)  # opened again meanwhile: left alone
    cache_disk.delete_dropped_items(directory, slow_delete, "dataset", {})  # as a cache that opened does
    release.set()
    polling.eventually(lambda: deleted == [str(stale[0])], what="the dropped tree deleted, once")
    assert sorted(path.name for path in directory.iterdir()) == ["cache.json", "items"]


def test_a_removed_cache_is_deleted_in_the_background_and_a_cache_opened_there_meanwhile_keeps_its_items_slowness_faked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_cache: Callable[..., DatasetCache]
) -> None:
    """A node agent removes a dataset's cache while it applies no other revision: deleting a million items one by one
    held them for minutes. The directory is renamed aside and deleted by a thread, and the dataset may be opened
    again at once, in its old place: the late deletion must take none of the new cache's files. Faked: only the time
    the deletion takes (a large cache), which a test cannot otherwise hold open."""
    directory = tmp_path / "cache"
    manifest = one_file_manifest(10, 10)
    first = make_cache(manifest, 100, directory=directory)
    for item in range(10):
        assert first.admit(item, content(manifest, item))
    release = hold_deletions(monkeypatch)

    assert first.remove() == 10  # returns with the deletion pending
    assert not directory.exists() and first.read(3, 0, 10) is None and not first.admit(3, content(manifest, 3))
    (aside,) = [path for path in tmp_path.iterdir() if cache_disk.removed_directory_of(path.name) == "cache"]
    assert len(entries_on_disk(aside)) == 10
    second = make_cache(manifest, 100, directory=directory)
    assert not second.cached[3] and second.admit(3, content(manifest, 3))
    release.set()
    polling.eventually(lambda: not aside.exists(), what="the removed cache's directory deleted")
    assert second.read(3, 0, 10) == content(manifest, 3)
    assert files_on_disk(directory) == {"0/3": entry_size(10)}


@pytest.mark.expected_warnings  # the directory itself cannot be deleted, named
def test_a_cache_whose_directory_cannot_be_renamed_aside_is_emptied_where_it_is_before_remove_returns(
    ext4: Ext4Factory, tmp_path: Path, make_cache: Callable[..., DatasetCache], caplog: pytest.LogCaptureFixture
) -> None:
    # An immutable cache dir (chattr +i; EPERM even to root) takes no rename and no deletion of its entries, but the
    # dataset's directory below it can still be emptied. Deleted in a thread instead, the directory could lose the
    # files of a cache opened there anew.
    root = ext4(tmp_path / "disk", 16 * 1024 * 1024)
    directory = root / "cache"
    manifest = one_file_manifest(10, 10)
    cache = make_cache(manifest, 100, directory=directory)
    for item in range(10):
        assert cache.admit(item, content(manifest, item))
    subprocess.run(["chattr", "+i", str(root)], check=True)
    try:
        assert cache.remove() == 10
        assert sorted(path.name for path in root.iterdir()) == ["cache", "lost+found"]
        assert list(directory.iterdir()) == []
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
            f"cache of {directory}: cannot delete cache files in {directory} (Operation not permitted); further such "
            "errors are counted, not logged"
        ]
    finally:
        subprocess.run(["chattr", "-i", str(root)], check=True)


def test_a_cache_of_200k_entries_on_disk_is_restored_whole(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    count = 200_000
    directory = tmp_path / "cache"
    manifest = one_file_manifest(count, 1)
    make_cache(manifest, count).close()
    # Hard links to one 1-byte item's entry per bucket: 200 k directory entries in about a second, where creating
    # 200 k files takes 5-20 s on ext4. The restore still does one lstat per entry.
    sources = tmp_path / "sources"
    sources.mkdir()
    for bucket in range(-(-count // FANOUT)):
        source = sources / str(bucket)
        source.write_bytes(entry(bucket * FANOUT, b"x"))  # the right size for every item, which a restore checks
        bucket_dir = directory / "items" / str(bucket)
        bucket_dir.mkdir()
        for item in range(bucket * FANOUT, min(count, (bucket + 1) * FANOUT)):
            os.link(source, bucket_dir / str(item))

    cache = make_cache(manifest, count)

    assert cache.cached.all()
    assert cache.used_bytes == count
    shutil.rmtree(directory)  # do not leave 200 k entries behind in the kept base temp directories


CRASHING_CHILD = """
import sys
from pathlib import Path
from fuseclient.cache import DatasetCache
from silodlib.manifest import Manifest

size = 256 * 1024
manifest = Manifest(size, ["data"], [400 * size], [0], ["v1"])
cache = DatasetCache(Path(sys.argv[1]), manifest, 400 * size)
for item in range(400):
    pattern = item.to_bytes(4, "big") + b"silod"
    assert cache.admit(item, (pattern * (size // len(pattern) + 1))[:size])
    print(item, flush=True)
"""


def test_a_kill_9_during_admissions_loses_no_complete_entry_and_serves_no_partial_one(
    tmp_path: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    directory = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_CHILD, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    try:
        admitted = [int(line) for line, _ in zip(child.stdout, range(40), strict=False)]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
    assert admitted == list(range(40)), "the child died before admitting 40 items"

    manifest = one_file_manifest(400, 256 * 1024)
    cache = make_cache(manifest, 400 * 256 * 1024)

    restored = cached_items(cache)
    assert set(admitted) <= restored  # every admission that returned survived the crash
    for item in restored:
        assert cache.read(item, 0, 256 * 1024) == content(manifest, item)
    check_consistent(cache, directory, manifest)


# --- disk faults (real ones, on a small tmpfs) ---------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path, tmpfs: TmpfsFactory) -> Path:
    """A 256 KiB tmpfs: a real filesystem that fills up (ENOSPC) and can be remounted read-only (EROFS)."""
    return tmpfs(tmp_path / "small", "256k")


def warnings_from_cache(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fuseclient.cache" and r.levelno >= logging.WARNING]


@pytest.mark.expected_warnings
def test_a_full_disk_fails_admissions_cleanly_and_warns_once(
    small_tmpfs: Path, make_cache: Callable[..., DatasetCache], caplog: pytest.LogCaptureFixture
) -> None:
    directory = small_tmpfs / "cache"
    manifest = one_file_manifest(40, 32 * 1024)
    cache = make_cache(manifest, 10 * 1024 * 1024, directory=directory)  # the quota is not what stops us

    results = {item: cache.admit(item, content(manifest, item)) for item in range(40)}

    admitted = {item for item, ok in results.items() if ok}
    assert 0 < len(admitted) < 40
    assert cached_items(cache) == admitted
    stats = cache.statistics()
    assert stats.write_errors == 40 - len(admitted) and stats.rejected_full == 0
    check_consistent(cache, directory, manifest)  # no temporary file left, reservations given back
    assert len(warnings_from_cache(caplog)) == 1
    assert os.strerror(errno.ENOSPC) in warnings_from_cache(caplog)[0]
    for item in admitted:
        assert cache.read(item, 0, 32 * 1024) == content(manifest, item)

    cache.set_quota(cache.used_bytes // 2)  # frees disk space
    cache.set_quota(10 * 1024 * 1024)
    failed = min(set(range(40)) - admitted)
    assert cache.admit(failed, content(manifest, failed))
    assert len(warnings_from_cache(caplog)) == 1


@pytest.mark.expected_warnings
def test_a_read_only_filesystem_fails_admissions_and_evictions_without_breaking_reads(
    small_tmpfs: Path, make_cache: Callable[..., DatasetCache], caplog: pytest.LogCaptureFixture
) -> None:
    directory = small_tmpfs / "cache"
    manifest = one_file_manifest(10, 1024)
    cache = make_cache(manifest, 100 * 1024, directory=directory)
    assert cache.admit(0, content(manifest, 0))
    assert cache.admit(1, content(manifest, 1))
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)

    assert not cache.admit(2, content(manifest, 2))
    assert not cache.admit(3, content(manifest, 3))
    assert cache.read(0, 0, 1024) == content(manifest, 0)
    assert cache.set_quota(1024) == 1  # the accounting shrinks even though the file cannot be deleted

    stats = cache.statistics()
    assert (stats.write_errors, stats.cached_items, stats.used_bytes) == (2, 1, 1024)
    messages = warnings_from_cache(caplog)
    assert len(messages) == 2, messages  # one for writes, one for deletions
    assert all(os.strerror(errno.EROFS) in message for message in messages)


def test_a_cache_tried_again_on_a_read_only_disk_leaves_its_dropped_items_to_the_opening_that_succeeds(
    small_tmpfs: Path, make_cache: Callable[..., DatasetCache], caplog: pytest.LogCaptureFixture
) -> None:
    """A cache that cannot open (its disk turned read-only, a bucket an older silod left readable by others to make
    private) is tried again by the node agent at every usage report. Each try started deleting the items an earlier
    opening had dropped, and each said again that it could not (a WARNING), then that it was done: every 5 s, for as
    long as the disk stayed read-only. They are deleted once the cache opens."""
    directory = small_tmpfs / "cache"
    manifest = one_file_manifest(10, 1024)
    cache = make_cache(manifest, 100 * 1024, directory=directory)
    assert cache.admit(0, content(manifest, 0))
    cache.close()
    dropped = directory / "items.stale-1-2"  # an earlier drop whose deletion its process did not finish
    (dropped / "0").mkdir(parents=True)
    (dropped / "0" / "5").write_bytes(b"an item no metadata vouches for")
    (directory / "items" / "0").chmod(0o755)  # as an older silod made it
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    for _ in range(3):  # the agent's tries
        with pytest.raises(OSError) as raised:
            DatasetCache(directory, manifest, 100 * 1024)
        assert raised.value.errno == errno.EROFS

    subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
    reopened = make_cache(manifest, 100 * 1024, directory=directory)
    assert cached_items(reopened) == {0}
    done = f"cache of {directory}: done deleting its dropped items"
    polling.eventually(lambda: [r for r in caplog.records if r.getMessage().startswith(done)], what="the deletion")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # before: the tries warned
    assert len([r for r in caplog.records if r.getMessage().startswith(done)]) == 1  # and said they were done
    assert not dropped.exists()


def test_a_cache_of_an_older_format_that_fills_its_disk_opens_once_its_dropped_items_are_gone(
    small_tmpfs: Path, make_cache: Callable[..., DatasetCache]
) -> None:
    """An upgrade changed the cache format, and the old items fill the cache's disk: the opening drops them (renamed
    aside), then cannot write the new cache.json. Their deletion waited for an opening that succeeded, which needed
    the room they held: the cache stayed shut for good, its node reading everything from storage. It starts as they
    are dropped, so a later try (the node agent's, at its next usage report) opens the cache."""
    directory = small_tmpfs / "cache"
    manifest = one_file_manifest(10, 1024)
    cache = make_cache(manifest, 100 * 1024, directory=directory)
    assert cache.admit(0, content(manifest, 0))
    cache.close()
    metadata = directory / "cache.json"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "format": "silod-cache/2"}))  # an older silod's
    fill_up(directory / "items" / "0")  # its items, as many as the disk holds

    def opens() -> DatasetCache | None:  # the first try fails, unless their deletion has made room by its cache.json
        try:
            return DatasetCache(directory, manifest, 100 * 1024)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return None

    reopened = polling.eventually(opens, what="the cache opened")
    assert cached_items(reopened) == set()
    reopened.close()
    polling.eventually(
        lambda: sorted(path.name for path in directory.iterdir()) == ["cache.json", "items"], what="the old items gone"
    )
