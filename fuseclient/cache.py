"""SiloD's uniform cache: one per dataset per node, one file per cached item on local disk.

Why uniform caching: a training job reads every item exactly once per epoch in a fresh random order, so
whichever items are cached, the hit ratio is c/d (cache bytes / dataset bytes). The optimal policy is
therefore to admit fetched items while they fit under the dataset's quota and then never evict; LRU would
only churn the disk for the same hit ratio (and thrashes when several jobs share the dataset). Evictions
happen only when the quota shrinks, and then uniformly at random, so that the remaining cache is still a
uniform sample of the dataset and every job sharing it keeps the c/d hit ratio. The quota is charged once
per dataset, however many jobs on this node read it.

Promises (each pinned by tests/test_cache.py):
- The bytes of cached items never exceed the quota. Admissions reserve their bytes under a lock before
  writing, so concurrent admissions cannot overshoot together; a shrink takes its victims out of the
  accounting (and out of the `cached` bitset) atomically with the quota change.
- While under quota nothing is evicted, and a quota increase evicts nothing.
- An item is visible (its bit set, `read` serving it) only once its file is complete under its final name.
- A restart reuses every complete entry and never serves a partial one.
- An entry whose file goes missing, is cut short, cannot be read or holds other bytes than were written under a
  running cache (an operator's clean-up, a failing disk, another item's entry put in its place: every read checks
  the checksums of the blocks it covers, which are seeded with the item, `cache_disk`) is never served: the read
  that finds it so drops it from the accounting and the bitset, the caller fetches the item from the backend,
  and the cache may admit it again. If the whole directory is gone
  (its disk unmounted, its tree deleted), every entry is dropped at once and nothing more is cached until a
  restart: the path may now lead to another disk (the root file system under an unmounted disk's mountpoint),
  which the quota was never meant for. One WARNING per cache says which (tests/test_cache_disk_faults.py).
  Every admission checks first that the directory is still the one the cache opened, so a directory deleted and
  made again, by an operator or by another daemon given the same cache dir (the lock went with the files), gets
  no file from this cache.
- What the cache writes is private to this user, whatever the umask: directories 0700, files 0600; directories an
  earlier silod left readable by others are made private at the open (tests/test_cache_permissions.py).

The on-disk layout, what a restart trusts and the fsync policy: `cache_disk`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bitarray import bitarray

from fuseclient import cache_disk
from silodlib.logfields import log_ids
from silodlib.manifest import Manifest
from silodlib.privacy import PRIVATE_DIRECTORY, PRIVATE_FILE

log = logging.getLogger(__name__)

# Cache files are written in pieces of this size. One large write makes the file system (ext4 and XFS on
# Linux 6.x, with large folios) take high-order page-cache folios, which the page allocator serves far more
# slowly than order-3 ones (kept on per-CPU lists): on the development VM a 4 MiB item costs 10-12 ms of CPU
# written at once and 1.4-3.5 ms in 32 KiB pieces, the difference between a cold epoch of large files
# keeping pace with the object store or not (docs/benchmarks.md).
WRITE_PIECE = 32 * 1024


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A consistent snapshot of one dataset cache's accounting, for logs, metrics and the status command."""

    quota_bytes: int
    used_bytes: int
    # Items with an entry (restored or admitted, less those evicted or dropped). Empty items are left out: they read as
    # cached from the start (`cache_disk`) but hold nothing, and counting them said "N items already cached" of a cache
    # that had restored none, and more items than were ever admitted.
    cached_items: int
    admitted: int  # items admitted since start
    rejected_full: int  # misses not admitted because the quota was full
    evicted: int  # items evicted by quota shrinks (including a restore above the quota)
    write_errors: int  # admissions that failed on disk (ENOSPC, EACCES, EROFS, ...)
    dropped: int = 0  # entries whose file went missing, short, unreadable or corrupt (all if the directory is lost)
    corrupt: int = 0  # of those, entries whose bytes failed their checksums: a sign of a failing cache disk
    # The cache cannot use its directory: it vanished (nothing cached or admitted until restart), or could not be
    # opened (`NoCache`, until the node agent opens it).
    directory_lost: bool = False


class DatasetCache:
    """The local cache of one dataset on this node, bounded by a quota the data manager may change.

    Every method blocks (on small amounts of disk IO) and is thread-safe: the read path calls them from
    worker threads concurrently. `read` and `contains` take no lock. `set_quota` never holds the lock while
    deleting files, so a shrink does not stall reads or admissions of other items.
    """

    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        quota_bytes: int,
        *,
        seed: int | None = None,
        dataset_uri: str | None = None,
    ) -> None:
        """Open (creating it if needed) the cache in `directory`, which belongs to this dataset alone, private to
        this user (made so again if an earlier silod left it readable by others, logged once).

        Restores what a previous run left: complete entries are reused, temporary and wrong-sized files
        deleted, everything dropped if the manifest digest changed; if the restored bytes exceed
        `quota_bytes`, uniformly random entries are evicted down to it. `seed` fixes the eviction choices.
        `dataset_uri` names the dataset in log lines (message and field); without it they name `directory`.
        """
        _check_quota(quota_bytes)
        self._directory = Path(directory)
        self._name = dataset_uri or str(self._directory)
        self._log_ids = log_ids(dataset_uri=dataset_uri)
        self._items_dir = self._directory / cache_disk.ITEMS_NAME
        self._manifest = manifest
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._quota = quota_bytes
        self._used = 0
        self._reserved = 0
        self._busy: set[int] = set()  # items being written or deleted: no other admission may touch them
        self._closed = False
        self._admitted = 0
        self._rejected_full = 0
        self._evicted = 0
        self._write_errors = 0
        self._dropped = 0
        self._corrupt = 0
        self._lost = False
        self._warned: set[tuple[str, int]] = set()
        self._made_buckets: set[int] = set()
        self._temp_names = itertools.count()

        self._nonempty = cache_disk.items_with_files(manifest)
        self._cached = ~self._nonempty  # empty items are cached from the start (`cache_disk`)
        self._empty_items = len(self._nonempty) - self._nonempty.count()  # set in `cached`, never entries

        loose = cache_disk.open_directory(self._directory, manifest, self._name, self._log_ids, self._delete_quietly)
        found = os.stat(self._items_dir)
        self._items_dir_id = (found.st_dev, found.st_ino)  # to tell a lost directory from a lost entry
        started = time.monotonic()
        restored, self._used, loose_buckets = cache_disk.restore(
            self._items_dir, manifest, self._cached, self._made_buckets, self._delete_quietly
        )
        if loose or loose_buckets:
            log.info(
                "cache of %s: made %d directories in %s private to this user (mode 0700): an earlier silod left "
                "them readable by other users",
                self._name,
                loose + loose_buckets,
                self._directory,
                extra=self._log_ids,
            )
        seconds, found_bytes = time.monotonic() - started, self._used
        evicted = self.set_quota(self._quota)  # an earlier run may have had a larger quota
        log.info(
            "cache of %s: restored %d items (%d bytes) from %s in %.2f s%s",
            self._name,
            restored,
            found_bytes,
            self._directory,
            seconds,
            self._restore_notes(evicted),
            extra=self._log_ids,
        )
        cache_disk.delete_dropped_items(self._directory, self._delete_quietly, self._name, self._log_ids)

    # --- queries ---------------------------------------------------------------------------------------

    @property
    def cached(self) -> bitarray:
        """Bit k is set iff item k is cached: a live view, for the caller to read and never to modify."""
        return self._cached

    @property
    def quota_bytes(self) -> int:
        return self._quota

    @property
    def used_bytes(self) -> int:
        """Bytes of the cached items (admissions in progress are not counted until complete)."""
        return self._used

    def contains(self, item: int) -> bool:
        self._check_item(item)
        return bool(self._cached[item])

    def statistics(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                quota_bytes=self._quota,
                used_bytes=self._used,
                cached_items=self._cached.count() - self._empty_items,
                admitted=self._admitted,
                rejected_full=self._rejected_full,
                evicted=self._evicted,
                write_errors=self._write_errors,
                dropped=self._dropped,
                corrupt=self._corrupt,
                directory_lost=self._lost,
            )

    # --- the read path ---------------------------------------------------------------------------------

    def read(self, item: int, offset: int, length: int) -> bytes | None:
        """Up to `length` bytes of cached `item` from `offset` (short at its end), or None if not cached.

        None also when the item was evicted meanwhile, or when its file is missing, of another size than the
        entry, unreadable or holding bytes that fail their checksums (`cache_disk`), which drops the entry (see
        the module docstring): the caller then fetches from the backend, which always has the right bytes. Never
        returns a partial entry's bytes, nor bytes other than those admitted.
        """
        if offset < 0 or length < 0:
            raise ValueError(f"item {item}: read offset and length must be >= 0")
        self._check_item(item)
        if not self._cached[item]:
            return None
        size = self._manifest.item_size(item)
        wanted = max(0, min(length, size - offset))
        if wanted == 0:
            return b""
        try:
            fd = os.open(cache_disk.item_path(self._items_dir, item), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in _SHORTAGES:  # this process is out of descriptors or memory: the entry is fine
                self._warn_once("read", exc)
            else:  # missing: evicted since the bit check (then _drop does nothing), or deleted
                self._drop(item, _reason(exc))
            return None
        try:
            return cache_disk.read_entry(fd, item, size, offset, wanted)
        except cache_disk.EntryDamaged as exc:
            self._drop(item, str(exc), corrupt=isinstance(exc, cache_disk.ChecksumMismatch))
        except OSError as exc:
            self._drop(item, _reason(exc))
        finally:
            os.close(fd)
        return None

    def admit(self, item: int, data: bytes) -> bool:
        """Store a freshly fetched item if it fits under the quota; True if it is cached on return.

        A cached item is left alone (True). False when the quota has no room for it (counted in
        `rejected_full`; nothing is evicted to make room), when the disk refuses the write (counted in
        `write_errors`, one WARNING per errno per cache), when another thread is admitting or evicting the
        same item at this moment, after `close`, or once the cache directory is lost.
        """
        size = self._manifest.item_size(item)
        if len(data) != size:
            raise ValueError(f"item {item} is {size} bytes, got {len(data)} to admit")
        with self._lock:
            if self._cached[item]:
                return True
            if self._closed or self._lost or item in self._busy:
                return False
            if self._used + self._reserved + size > self._quota:
                self._rejected_full += 1
                return False
            self._reserved += size
            self._busy.add(item)
        if self._directory_gone():  # deleted or replaced (another daemon's now, maybe): write nothing there
            self._release(item, size, write_error=False)
            self._lose_directory("it was deleted, unmounted or replaced")
            return False
        try:
            self._write(item, data)
        except OSError as exc:
            self._release(item, size, write_error=True)
            if self._directory_gone():
                self._lose_directory(_reason(exc))
            else:
                self._warn_once("write", exc)
            return False
        except BaseException:
            self._release(item, size, write_error=False)
            raise
        with self._lock:
            self._reserved -= size
            fits = not self._lost and self._used + size <= self._quota  # the quota may have shrunk meanwhile
            if fits:
                self._used += size
                self._cached[item] = 1
                self._admitted += 1
                self._busy.discard(item)
            elif not self._lost:
                self._rejected_full += 1
        if not fits:
            self._unlink(item)  # still busy: no other admission can have put a file there meanwhile
            with self._lock:
                self._busy.discard(item)
        return fits

    # --- quota changes ---------------------------------------------------------------------------------

    def set_quota(self, quota_bytes: int) -> int:
        """Apply a new quota; if it is below the cached bytes, evict uniformly random items until under it.

        Returns the number of items evicted. The victims leave the `cached` bitset and the accounting at
        once (readers stop using them); their files are deleted afterwards without holding the lock, before
        this call returns. A quota increase evicts nothing. Logs nothing, so that a change is one line: its caller's,
        which knows more (the node agent, its node; a restore, what it found).
        """
        _check_quota(quota_bytes)
        with self._lock:
            self._quota = quota_bytes
            victims = self._take_victims_locked() if self._used > quota_bytes else []
        if not victims:
            return 0
        for item in victims:
            self._unlink(item)
        with self._lock:
            self._busy.difference_update(victims)
        return len(victims)

    def close(self) -> None:
        """Refuse further admissions. No file descriptor is held between calls, so nothing else to release."""
        with self._lock:
            self._closed = True

    def remove(self) -> int:
        """Drop every cached item and delete the cache's directory, and refuse admissions from now on: the dataset is
        no longer served here, and a directory left behind for each dataset a node ever served (a per-run prefix, a
        dataset registered anew) adds up. Returns the number of items dropped. The directory is renamed aside at once
        and deleted by a thread of its own (`cache_disk.remove_directory`): deleting a million items one by one held
        the node agent's revisions for minutes. An admission under way when this is called writes into a directory
        that goes: it fails quietly (a closed cache does not care)."""
        with self._lock:
            self._closed = True
            dropped = (self._cached & self._nonempty).count()
            self._cached &= ~self._nonempty  # in place: `cached` is a live view; reads of open files go to the backend
            self._used = 0
        cache_disk.remove_directory(self._directory, self._delete_quietly, self._name, self._log_ids)
        return dropped

    # --- internals -------------------------------------------------------------------------------------

    def _restore_notes(self, evicted: int) -> str:
        """What the restore line adds to its count: the entries evicted to fit the quota, in the same line (one line
        per event), and the empty files, which read as cached but are no entry, so that "restored 0 items" next to
        hits on them, or to the dataset's count of cached items, is not taken for a lost cache."""
        notes = [f"evicted {evicted} of them at random to fit its quota of {self._quota} bytes"] if evicted else []
        if self._empty_items:
            notes.append(f"its {self._empty_items} empty files need no entry")
        return "".join(f"; {note}" for note in notes)

    def _take_victims_locked(self) -> list[int]:
        """Uniformly random cached items until under quota, taken out of the bitset and the accounting.

        A partial Fisher-Yates shuffle of the cached (non-empty) items: every step picks uniformly among
        those not yet picked, so the victims are a uniform random sample whatever the admission order.
        O(cached items) to list the candidates, then O(victims).
        """
        candidates = list((self._cached & self._nonempty).search(1))
        randrange, item_size = self._rng.randrange, self._manifest.item_size
        used, remaining = self._used, len(candidates)
        while used > self._quota and remaining:
            pick = randrange(remaining)
            item = candidates[pick]
            remaining -= 1
            candidates[pick] = candidates[remaining]
            candidates[remaining] = item  # the victims gather at the end
            used -= item_size(item)
        victims = candidates[remaining:]
        self._cached[victims] = 0
        self._busy.update(victims)
        self._used = used
        self._evicted += len(victims)
        return victims

    def _drop(self, item: int, reason: str, *, corrupt: bool = False) -> None:
        """Take cached `item`, whose file turned out missing, of the wrong size, unreadable or `corrupt` (failing
        its checksums), out of the accounting and the bitset (and its file off the disk), so that nothing claims
        it and a fetch may admit it again; or lose the whole cache if its directory is gone. Does nothing if the
        item was evicted meanwhile: its file was deleted on purpose. The first drop of each kind is logged: a
        corrupt entry says more about the disk than a deleted one, so it is not hidden behind one."""
        if not self._cached[item]:
            return
        if self._directory_gone():
            self._lose_directory(reason)
            return
        with self._lock:
            if not self._cached[item]:
                return
            self._cached[item] = 0
            self._used -= self._manifest.item_size(item)
            self._dropped += 1
            self._corrupt += int(corrupt)
            self._busy.add(item)  # no admission may write it until the damaged file is gone
        self._unlink(item)
        with self._lock:
            self._busy.discard(item)
        if self._first_time(("corrupt" if corrupt else "drop", 0)):
            log.warning(
                "cache of %s: dropped item %d, its cache file in %s is unusable (%s); reading it from the backend "
                "and caching it again; further such entries are counted (%s), not logged",
                self._name,
                item,
                self._directory,
                reason + ("; the cache disk returned other bytes than were written to it" if corrupt else ""),
                "corrupt" if corrupt else "dropped",
                extra=self._log_ids,
            )

    def _directory_gone(self) -> bool:
        """Whether the items directory is no longer the one this cache opened: its disk unmounted (the path now
        leads to the mountpoint's own file system), its tree deleted (or made again), or unreachable."""
        try:
            found = os.stat(self._items_dir)
        except OSError:
            return True
        return (found.st_dev, found.st_ino) != self._items_dir_id

    def _lose_directory(self, reason: str) -> None:
        """Drop every entry at once and refuse admissions until restart (see the module docstring). Quietly for a
        closed cache: it admits nothing, and `remove` deletes its directory on purpose."""
        with self._lock:
            if self._lost or self._closed:
                return
            self._lost = True
            items = (self._cached & self._nonempty).count()
            held = self._used
            self._cached &= ~self._nonempty  # in place: `cached` is a live view; empty items need no file
            self._used = 0
            self._dropped += items
        log.warning(
            "cache of %s: its directory %s is gone (%s): the cache disk was unmounted or the cache's files deleted; "
            "dropped its %d items (%d bytes), reading from the backend and caching nothing until silod restarts",
            self._name,
            self._directory,
            reason,
            items,
            held,
            extra=self._log_ids,
        )

    def _check_item(self, item: int) -> None:
        if not 0 <= item < len(self._cached):
            raise IndexError(f"item {item} is outside 0..{len(self._cached) - 1}")

    def _release(self, item: int, size: int, *, write_error: bool) -> None:
        """Give back the reservation of an admission that wrote nothing."""
        with self._lock:
            self._reserved -= size
            self._busy.discard(item)
            self._write_errors += int(write_error)

    def _write(self, item: int, data: bytes) -> None:
        """Write `item` under a temporary name and rename it into place; no temporary file survives errors."""
        bucket = item // cache_disk.FANOUT
        directory = self._items_dir / str(bucket)
        if bucket not in self._made_buckets:
            directory.mkdir(mode=PRIVATE_DIRECTORY, exist_ok=True)
            self._made_buckets.add(bucket)
        temp = directory / f"{item}.tmp-{os.getpid()}-{next(self._temp_names)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            try:
                fd = os.open(temp, flags, PRIVATE_FILE)
            except FileNotFoundError:  # the bucket's folder was deleted under us: make it again (never `items`,
                directory.mkdir(mode=PRIVATE_DIRECTORY, exist_ok=True)  # whose loss means the cache directory is gone)
                fd = os.open(temp, flags, PRIVATE_FILE)
            try:
                for part in (data, cache_disk.checksums(item, data)):
                    view = memoryview(part)
                    while view:
                        view = view[os.write(fd, view[:WRITE_PIECE]) :]
            finally:
                os.close(fd)
            os.rename(temp, directory / str(item))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def _unlink(self, item: int) -> None:
        try:
            os.unlink(cache_disk.item_path(self._items_dir, item))
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._warn_once("delete", exc)

    def _delete_quietly(self, path: str, is_dir: bool) -> None:
        """Delete a file or tree that holds no complete entry (what a restart found, a removed cache's directory); a
        failure only warns, once per errno."""
        cache_disk.delete_entry(path, is_dir, functools.partial(self._warn_once, "delete"))

    def _first_time(self, key: tuple[str, int]) -> bool:
        """True the first time `key` is asked about: each kind of trouble is logged once per cache, then counted."""
        with self._lock:
            if key in self._warned:
                return False
            self._warned.add(key)
            return True

    def _warn_once(self, action: str, exc: OSError) -> None:
        """One WARNING per action and errno for this cache: a full disk must not log once per read."""
        if not self._first_time((action, exc.errno or 0)):
            return
        log.warning(
            "cache of %s: cannot %s cache files in %s (%s); further such errors are counted, not logged",
            self._name,
            action,
            self._directory,
            _reason(exc),
            extra=self._log_ids,
        )


class NoCache:
    """The stand-in for the cache of a dataset whose cache directory could not be opened (a full or failing cache
    disk): it holds and admits nothing, so that the dataset is served from its backend, uncached, rather than not
    at all. It keeps the quota it is given, for the cache that replaces it once the directory opens (the node
    agent tries again: `fuseclient.agent`). Items of size 0 read as cached and count as no entry in its statistics, as
    in `DatasetCache`."""

    def __init__(self, manifest: Manifest, quota_bytes: int) -> None:
        _check_quota(quota_bytes)
        self._quota = quota_bytes
        self._cached = ~cache_disk.items_with_files(manifest)

    @property
    def cached(self) -> bitarray:
        return self._cached

    @property
    def quota_bytes(self) -> int:
        return self._quota

    @property
    def used_bytes(self) -> int:
        return 0

    def contains(self, item: int) -> bool:
        return bool(self._cached[item])

    def read(self, item: int, offset: int, length: int) -> bytes | None:
        return b"" if self._cached[item] else None

    def admit(self, item: int, data: bytes) -> bool:
        return bool(self._cached[item])

    def set_quota(self, quota_bytes: int) -> int:
        _check_quota(quota_bytes)
        self._quota = quota_bytes
        return 0

    def close(self) -> None:
        pass

    def remove(self) -> int:
        """Nothing cached, and the directory that could not be opened is left as it is."""
        return 0

    def statistics(self) -> CacheStats:
        return CacheStats(self._quota, 0, 0, 0, 0, 0, 0, directory_lost=True)


def _check_quota(quota_bytes: int) -> None:
    if quota_bytes < 0:
        raise ValueError(f"cache quota must be >= 0 bytes, got {quota_bytes}")


# Errors that say this process is short of something, not that an entry is damaged.
_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def _reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)
