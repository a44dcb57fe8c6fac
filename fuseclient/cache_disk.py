"""The uniform cache on disk: where an item lives, the metadata that vouches for the items, and what a restart
finds and trusts. `DatasetCache` (cache.py) keeps the accounting; this module only reads and writes the tree.

On-disk layout, inside the directory the caller dedicates to this dataset:
- `cache.json`: format tag, manifest digest and chunk size. A restart that finds another digest (the
  dataset was re-registered with different content or numbering) drops every item instead of serving
  bytes that belong to another numbering.
- `items/<item // 1024>/<item>`: the item's bytes, exactly `manifest.item_size(item)` of them. The fan-out
  keeps directories at 1024 entries or fewer (ImageNet-1k is 1.28 M items).
- `items/<item // 1024>/<item>.tmp-<pid>-<n>`: an admission in progress; renamed to the final name when
  complete, deleted by a restart that finds it.
Items of size 0 have no file: their content is known from the manifest, so they count as cached from the
start and cost nothing.

Crash safety and the fsync policy: items are written to a temporary name and renamed, never fsynced. A
crash of the process (kill -9 included) at any point leaves either a complete final file or a temporary
one, because data already written sits in the kernel page cache and reaches the disk regardless of the
process. After a power loss or kernel crash, a renamed file may come back truncated or empty (the rename
can reach the disk before the data); the restart check that each file's size equals the manifest's item
size discards those. What it cannot catch is a file of the right size whose blocks were not written (a
filesystem that exposes unwritten extents after a crash; ext4 and XFS in their default modes do not) —
fsyncing every item would close that gap at a large cost in write throughput, for a cache whose entries
can always be fetched again. Only `cache.json` is fsynced, since it decides whether items are trusted.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bitarray import bitarray

from silodlib.manifest import Manifest

log = logging.getLogger(__name__)

FANOUT = 1024
METADATA_NAME = "cache.json"
ITEMS_NAME = "items"
_FORMAT = "silod-cache/1"
_STALE_PREFIX = "items.stale-"

Delete = Callable[[str, bool], None]  # (path, is a directory): deletes, and only warns when it cannot


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


def open_directory(directory: Path, manifest: Manifest, name: str, log_ids: Mapping[str, str], delete: Delete) -> None:
    """Drop the items unless `cache.json` vouches for them with this manifest; then write it. Leftover item
    trees of earlier drops are deleted."""
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
        if found is not None or items_dir.exists():
            log.info(
                "cache of %s: %s was written for another manifest (or is unreadable), dropping its items",
                name,
                directory,
                extra=log_ids,
            )
        # The items go before the new metadata is written: a crash in between must not vouch for them.
        if items_dir.exists():
            os.rename(items_dir, directory / f"{_STALE_PREFIX}{os.getpid()}-{time.time_ns()}")
            _fsync_directory(directory)
        temp = directory / f"{METADATA_NAME}.tmp"
        with open(temp, "w") as file:
            json.dump(wanted, file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temp, metadata_path)
        _fsync_directory(directory)
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(_STALE_PREFIX):
                delete(entry.path, entry.is_dir(follow_symlinks=False))
    items_dir.mkdir(exist_ok=True)


def restore(
    items_dir: Path, manifest: Manifest, cached: bitarray, buckets: set[int], delete: Delete
) -> tuple[int, int]:
    """Mark in `cached` the complete entries found on disk (one scandir per bucket, one lstat per file), note
    the bucket folders that exist in `buckets`, and delete everything else. Returns (entries, their bytes)."""
    item_count = manifest.item_count
    item_size = manifest.item_size
    restored = used = 0
    with os.scandir(items_dir) as bucket_entries:
        for bucket_entry in bucket_entries:
            name = bucket_entry.name
            if not (_is_number(name) and bucket_entry.is_dir(follow_symlinks=False)):
                delete(bucket_entry.path, bucket_entry.is_dir(follow_symlinks=False))
                continue
            bucket = int(name)
            buckets.add(bucket)
            with os.scandir(bucket_entry.path) as entries:
                for entry in entries:
                    name = entry.name
                    if _is_number(name) and entry.is_file(follow_symlinks=False):
                        item = int(name)
                        if item // FANOUT == bucket and item < item_count and not cached[item]:
                            size = item_size(item)
                            if entry.stat(follow_symlinks=False).st_size == size:
                                cached[item] = 1
                                used += size
                                restored += 1
                                continue
                    delete(entry.path, entry.is_dir(follow_symlinks=False))  # temporary, truncated, foreign
    return restored, used


def _is_number(name: str) -> bool:
    """A canonical decimal number: what item and bucket names are (no sign, no leading zeros)."""
    return name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0"))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
