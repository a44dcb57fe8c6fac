"""The uniform cache on disk: where an item lives, the metadata that vouches for the items, and what a restart
finds and trusts. `DatasetCache` (cache.py) keeps the accounting; this module only reads and writes the tree.

On-disk layout, inside the directory the caller dedicates to this dataset:
- `cache.json`: format tag, manifest digest and chunk size. A restart that finds another digest (the
  dataset was re-registered with different content or numbering) or another format drops every item instead
  of serving bytes that belong to another numbering or that it would read wrongly.
- `items/<item // 1024>/<item>`: an entry, `entry_size(size)` bytes: the item's bytes, exactly
  `manifest.item_size(item)` of them, then their checksums, the XXH3-64 hash of each `CHECKSUM_BLOCK` of the
  item (the last block may be short) seeded with the item's number, 8 bytes little-endian each. The fan-out
  keeps directories at 1024 entries or fewer (ImageNet-1k is 1.28 M items).
- `items/<item // 1024>/<item>.tmp-<pid>-<n>`: an admission in progress; renamed to the final name when
  complete, deleted by a restart that finds it.
Items of size 0 have no file: their content is known from the manifest, so they count as cached from the
start and cost nothing.
Every directory is 0700 and every file 0600, whatever the umask (`privacy`): the items are dataset bytes that the
mount may refuse other users. An opening makes the directories of a cache an older silod left readable by others
private (the dataset's, `items` and its buckets); their files, out of reach below them, keep their modes.

Why checksums, and why per block. The mount promises the backend's bytes, never others, and a
local disk can hand back other bytes than were written at the right size: a flipped bit, a sector that a
power loss left unwritten. Every read of an entry checks the blocks it covers, so a read of 128 KiB (the
kernel's usual request) costs its own bytes and a few bytes of checksums, not the whole 4 MiB item; an
unaligned read reads at most one block more on each side. The checksums cost 8 bytes per 64 KiB on disk
(0.012 %); the quota counts item bytes, not them. XXH3-64 rather than CRC32C: it misses a random corruption
of a block with probability 2^-64 rather than 2^-32, and hashes 64 KiB blocks twice as fast on the reference
machine (23 GB/s against 11 for the `crc32c` package on the CPU's CRC32C instruction), with any 64-bit CPU's
vector unit rather than one instruction.

Why the item's number seeds the hashes: an entry must hold its own item's bytes, not merely bytes that were once
written whole. Two entries of the same size swapped on disk (a file system repair that reattached files by
guess, a copy or a script that got the names wrong) would each pass checks seeded alike, and be served as the
other's bytes; seeded with the item, each fails them, and is dropped and counted as damage like a flipped bit.

Crash safety and the fsync policy: items are written to a temporary name and renamed, never fsynced. A
crash of the process (kill -9 included) at any point leaves either a complete final file or a temporary
one, because data already written sits in the kernel page cache and reaches the disk regardless of the
process. After a power loss or kernel crash, a renamed file may come back truncated or empty (the rename
can reach the disk before the data); the restart check that each file's size is the entry's discards those.
A file of the right size whose blocks were not written (a filesystem that exposes unwritten extents after a
crash; ext4 and XFS in their default modes do not) fails its checksums when read, like a flipped bit, and is
dropped then. Fsyncing every item would cost a large share of write throughput, for a cache whose entries can
always be fetched again. Only `cache.json` is fsynced, since it decides whether items are trusted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bitarray import bitarray
from xxhash import xxh3_64_intdigest

from silodlib.directories import fsync_directory
from silodlib.manifest import Manifest
from silodlib.privacy import PRIVATE_DIRECTORY, PRIVATE_FILE, make_private, make_private_directory

log = logging.getLogger(__name__)

FANOUT = 1024
METADATA_NAME = "cache.json"
ITEMS_NAME = "items"
CHECKSUM_BLOCK = 64 * 1024
_FORMAT = "silod-cache/3"  # /1 had no checksums; /2 did not seed them with the item
_STALE_PREFIX = "items.stale-"
_REMOVED_INFIX = ".removed-"

_CHECKSUM = struct.Struct("<Q")

Delete = Callable[[str, bool], None]  # (path, is a directory): deletes, and only warns when it cannot


class EntryDamaged(Exception):
    """An entry that cannot give its item's bytes: of the wrong size, cut short while read, or failing a checksum."""


class ChecksumMismatch(EntryDamaged):
    """An entry of the right size whose bytes are not those written: the disk changed them, or never wrote them."""


def items_with_files(manifest: Manifest) -> bitarray:
    """Bit k is set iff item k has a file when cached: every item but those of size 0."""
    nonempty = bitarray(manifest.item_count)
    nonempty.setall(1)
    for index, size in enumerate(manifest.sizes):
        if size == 0:
            nonempty[manifest.first_items[index]] = 0
    return nonempty


def item_path(items_dir: Path, item: int) -> str:
    return f"{items_dir}/{item // FANOUT}/{item}"


def entry_size(item_size: int) -> int:
    """Bytes of the file of an item of `item_size` bytes: the item, then the checksum of each of its blocks."""
    return item_size + _CHECKSUM.size * -(-item_size // CHECKSUM_BLOCK)


def checksums(item: int, data: bytes) -> bytes:
    """What follows the bytes `data` of item `item` in its file: the XXH3-64 of each block, seeded with `item`."""
    view = memoryview(data)
    block = CHECKSUM_BLOCK
    return b"".join(
        _CHECKSUM.pack(xxh3_64_intdigest(view[start : start + block], item)) for start in range(0, len(data), block)
    )


def read_entry(fd: int, item: int, item_size: int, offset: int, length: int) -> bytes:
    """`length` bytes (at least 1, all within the item) from `offset` of item `item`'s entry, open as `fd`, read
    with the whole blocks they fall in and checked against those blocks' checksums; `EntryDamaged` if the file is
    not a whole entry or a block does not match its checksum (`ChecksumMismatch`: another item's entry of the same
    size fails them too); the disk's own errors as the OSError `pread` raises."""
    found, expected = os.fstat(fd).st_size, entry_size(item_size)
    # The size first: a file cut short (or swapped for another) may still hold the blocks asked for.
    if found != expected:
        raise EntryDamaged(f"{found} bytes on disk, {expected} expected")
    block = CHECKSUM_BLOCK
    first, last = offset // block, (offset + length - 1) // block
    start = first * block
    data = _pread_exactly(fd, min(item_size, (last + 1) * block) - start, start)
    table = _pread_exactly(fd, _CHECKSUM.size * (last + 1 - first), item_size + _CHECKSUM.size * first)
    view = memoryview(data)
    for index, (wanted,) in enumerate(_CHECKSUM.iter_unpack(table)):
        if xxh3_64_intdigest(view[index * block : (index + 1) * block], item) != wanted:
            at = (first + index) * block
            raise ChecksumMismatch(f"its bytes {at}-{min(item_size, at + block) - 1} do not match their checksum")
    if offset == start and length == len(data):
        return data
    return data[offset - start : offset - start + length]


def _pread_exactly(fd: int, length: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < length:
        chunk = os.pread(fd, length - got, offset + got)
        if not chunk:
            raise EntryDamaged(f"cut short to {offset + got} bytes while read")
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def open_directory(directory: Path, manifest: Manifest, name: str, log_ids: Mapping[str, str], delete: Delete) -> int:
    """Make `directory` and its `items` (private to this user, or private again: `privacy`); drop the items unless
    `cache.json` vouches for them with this manifest, then write it. The items dropped are renamed aside and deleted
    in the background (`delete_dropped_items`) before the new cache.json is written: on a disk that the dropped items
    themselves fill, that write fails until they are gone, and the cache would never open again. Returns how many
    directories had to be made private.

    The drop is logged once it is done: an opening that fails after it (a full disk refusing the new cache.json) is
    tried again by the node agent at every usage report, and finds nothing more to drop."""
    loose = int(make_private_directory(directory) is not None)
    items_dir = directory / ITEMS_NAME
    metadata_path = directory / METADATA_NAME
    wanted = {"format": _FORMAT, "manifest_digest": manifest.digest, "chunk_size": manifest.chunk_size}
    try:
        found = json.loads(metadata_path.read_text())
    except FileNotFoundError:
        found = None
    except (OSError, ValueError):
        found = {}
    if found != wanted:
        # The items go before the new metadata is written: a crash in between must not vouch for them.
        if items_dir.exists():
            os.rename(items_dir, directory / f"{_STALE_PREFIX}{os.getpid()}-{time.time_ns()}")
            fsync_directory(directory)
            log.info(
                "cache of %s: %s was written for another manifest or format (or is unreadable), dropping its items",
                name,
                directory,
                extra=log_ids,
            )
        delete_dropped_items(directory, delete, name, log_ids)
        temp = directory / f"{METADATA_NAME}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        with open(fd, "w") as file:
            os.fchmod(fd, PRIVATE_FILE)  # a temporary file an older silod left keeps its mode through O_TRUNC
            json.dump(wanted, file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temp, metadata_path)
        fsync_directory(directory)
    items_dir.mkdir(mode=PRIVATE_DIRECTORY, exist_ok=True)
    loose += make_private(items_dir, os.stat(items_dir).st_mode) is not None
    return loose


def delete_dropped_items(directory: Path, delete: Delete, name: str, log_ids: Mapping[str, str]) -> None:
    """Delete the item trees that this and earlier openings of the cache in `directory` dropped (`open_directory`), in
    a thread of their own, so that opening the cache does not wait for them: a dropped cache of a million small items
    takes minutes to delete (200,000 took 40 s on the reference machine), and every node drops its caches at once
    when an upgrade changes the format. Called as an opening drops items, and for what earlier processes left, once
    the cache has opened: an opening that fails later (its restore, on a failing disk) is tried again at every usage
    report of the node agent, and each try would start the same deletion again, to warn again of what it cannot
    delete and log its end again. Trees a thread is deleting already are left to it (`delete_in_background`)."""
    with os.scandir(directory) as entries:
        stale = [(e.path, e.is_dir(follow_symlinks=False)) for e in entries if e.name.startswith(_STALE_PREFIX)]
    delete_in_background(stale, delete, f"cache of {name}: done deleting its dropped items", log_ids)


def delete_entry(path: str, is_dir: bool, failed: Callable[[OSError], None]) -> None:
    """Delete the file or the whole tree at `path`, telling `failed` what could not be deleted (never that something
    was gone already) and carrying on with the rest of a tree."""

    def tell(_function: object, _path: str, info: tuple[type[BaseException], BaseException, object]) -> None:
        if isinstance(info[1], OSError) and not isinstance(info[1], FileNotFoundError):
            failed(info[1])

    try:
        if is_dir:
            shutil.rmtree(path, onerror=tell)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        failed(exc)


def remove_directory(directory: Path, delete: Delete, name: str, log_ids: Mapping[str, str]) -> None:
    """Take a cache's whole directory out of use at once: renamed aside, beside it (`<directory>.removed-<pid>-<ns>`),
    and deleted by a thread of its own, as dropped items are (`delete_dropped_items`). Deleting a cache of a million
    items takes minutes, and the node agent applies no revision while it removes a dataset. A directory that cannot be
    renamed is deleted where it is before this returns: a thread deleting it there could take the files of a cache
    opened there anew. A process that exits first leaves the rest to the node agent's next snapshot
    (`removed_directory_of`)."""
    try:
        aside = set_aside(directory)
    except OSError:
        delete(str(directory), True)
        return
    if aside is not None:
        delete_in_background([(str(aside), True)], delete, f"cache of {name}: done deleting its directory", log_ids)


def set_aside(directory: Path) -> Path | None:
    """Rename `directory` beside it, to a name no cache opens (`<directory>.removed-<pid>-<ns>`), so that a thread can
    delete it while a cache opens anew at its name: the new name, or None if it is gone already; OSError if it cannot
    be renamed."""
    aside = directory.with_name(f"{directory.name}{_REMOVED_INFIX}{os.getpid()}-{time.time_ns()}")
    try:
        os.rename(directory, aside)
    except FileNotFoundError:
        return None
    return aside


def removed_directory_of(name: str) -> str | None:
    """The name of the directory that `remove_directory` renamed to `name`, or None if `name` is no such rename."""
    original, infix, tag = name.rpartition(_REMOVED_INFIX)
    pid, dash, ns = tag.partition("-")
    return original if infix and pid.isdigit() and dash and ns.isdigit() else None


_deleting: set[str] = set()  # stale trees a thread is deleting: a cache opened again meanwhile leaves them to it
_deleting_lock = threading.Lock()


def delete_in_background(stale: list[tuple[str, bool]], delete: Delete, done: str, log_ids: Mapping[str, str]) -> None:
    """Delete the `stale` (path, is a directory) entries in a daemon thread, which logs `done` and the time it took;
    those already being deleted are left to the thread deleting them. A process that exits first leaves the rest to
    the next opening of their cache, or the node agent's next snapshot."""
    with _deleting_lock:
        stale = [(path, is_dir) for path, is_dir in stale if path not in _deleting]
        _deleting.update(path for path, _ in stale)
    if stale:
        threading.Thread(
            target=_delete_stale, args=(stale, delete, done, log_ids), name="silod-cache-cleanup", daemon=True
        ).start()


def _delete_stale(stale: list[tuple[str, bool]], delete: Delete, done: str, log_ids: Mapping[str, str]) -> None:
    started = time.monotonic()
    try:
        for path, is_dir in stale:
            delete(path, is_dir)
    finally:
        with _deleting_lock:
            _deleting.difference_update(path for path, _ in stale)
    log.info("%s (%.1f s)", done, time.monotonic() - started, extra=log_ids)


def restore(
    items_dir: Path, manifest: Manifest, cached: bitarray, buckets: set[int], delete: Delete
) -> tuple[int, int, int]:
    """Mark in `cached` the complete entries found on disk (one scandir per bucket, one lstat per file), note
    the bucket folders that exist in `buckets` (made private if an older silod left them readable by others),
    and delete everything else. Returns (entries, their bytes, buckets that had to be made private); OSError if
    a bucket cannot be made private."""
    item_count = manifest.item_count
    item_size = manifest.item_size
    restored = used = loose = 0
    with os.scandir(items_dir) as bucket_entries:
        for bucket_entry in bucket_entries:
            name = bucket_entry.name
            if not (_is_number(name) and bucket_entry.is_dir(follow_symlinks=False)):
                delete(bucket_entry.path, bucket_entry.is_dir(follow_symlinks=False))
                continue
            bucket = int(name)
            buckets.add(bucket)
            loose += make_private(bucket_entry.path, bucket_entry.stat(follow_symlinks=False).st_mode) is not None
            with os.scandir(bucket_entry.path) as entries:
                for entry in entries:
                    name = entry.name
                    if _is_number(name) and entry.is_file(follow_symlinks=False):
                        item = int(name)
                        if item // FANOUT == bucket and item < item_count and not cached[item]:
                            size = item_size(item)
                            if entry.stat(follow_symlinks=False).st_size == entry_size(size):
                                cached[item] = 1
                                used += size
                                restored += 1
                                continue
                    delete(entry.path, entry.is_dir(follow_symlinks=False))  # temporary, truncated, foreign
    return restored, used, loose


def _is_number(name: str) -> bool:
    """A canonical decimal number: what item and bucket names are (no sign, no leading zeros)."""
    return name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0"))
