"""The frozen listing of a dataset and the numbering of its items.

A manifest is taken once, when the dataset is registered, and never changes: every node and the data manager
agree on what item k is because items are numbered in manifest (path) order. A file up to the chunk size is
one item; a larger file is ceil(size / chunk) items; an empty file is one empty item, so that opening it still
counts as reading it.

The manifest is columnar (one list or array per field) rather than a list of records, because ImageNet-1k
has 1.28 M files and a record object per file would cost several hundred bytes each in memory.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import overload

from silodlib.backends.base import ObjectInfo

DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
_FORMAT_TAG = b"silod-manifest/1\n"
_MAX_NAME_BYTES = 255
_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1  # the modification times a manifest (and the kernel's inode) can hold


class ManifestError(ValueError):
    """A listing that cannot be shown as a POSIX tree, or bytes that are not a manifest."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of the manifest with the range of item numbers it owns."""

    path: str
    size: int
    version: str
    mtime_ns: int
    first_item: int
    item_count: int


def items_in_file(size: int, chunk_size: int) -> int:
    """Number of items a file of `size` bytes is split into."""
    return max(1, -(-size // chunk_size))


class StringColumn(Sequence[str]):
    """Many strings as one NUL-separated UTF-8 blob with an array of start offsets.

    About one byte a character plus eight an entry, where a `str` object each would cost 50 bytes more: at
    1.28 M paths and ETags that is the difference between fitting a node's memory budget and not.
    """

    __slots__ = ("_blob", "_starts")

    def __init__(self, joined: str, count: int) -> None:
        """`joined` is the strings joined by NUL (which no path or version contains)."""
        self._blob = joined.encode()
        lengths = (len(part) + 1 for part in self._blob.split(b"\0")) if count else ()
        self._starts = array("q", accumulate(lengths, initial=0))
        if len(self._starts) != count + 1:
            raise ManifestError(f"string column holds {len(self._starts) - 1} entries, expected {count}")

    @classmethod
    def of(cls, strings: Sequence[str]) -> StringColumn:
        return cls("\0".join(strings), len(strings))

    def joined(self) -> str:
        return self._blob.decode()

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self._blob[self._starts[index] : self._starts[index + 1] - 1].decode()

    def __iter__(self) -> Iterator[str]:
        return (part.decode() for part in self._blob.split(b"\0")) if len(self) else iter(())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringColumn):
            return self._blob == other._blob and len(self) == len(other)
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


class Manifest:
    """A dataset's files (sorted by path), its explicitly empty folders, and its item numbering."""

    def __init__(
        self,
        chunk_size: int,
        paths: Sequence[str],
        sizes: Sequence[int],
        mtimes_ns: Sequence[int],
        versions: Sequence[str],
        empty_dirs: Sequence[str] = (),
    ) -> None:
        if chunk_size <= 0:
            raise ManifestError(f"chunk size must be positive, got {chunk_size}")
        if not len(paths) == len(sizes) == len(mtimes_ns) == len(versions):
            raise ManifestError("manifest columns have different lengths")
        self.chunk_size = chunk_size
        self.paths = paths if isinstance(paths, StringColumn) else StringColumn.of(paths)
        self.sizes = array("q", sizes)
        try:
            self.mtimes_ns = array("q", mtimes_ns)
        except OverflowError:  # a time before 1677 or after 2262 (ext4 goes to 2446): the nearest that 64 bits hold
            self.mtimes_ns = array("q", (min(max(ns, _MIN_NS), _MAX_NS) for ns in mtimes_ns))
        self.versions = versions if isinstance(versions, StringColumn) else StringColumn.of(versions)
        self.empty_dirs = tuple(empty_dirs)
        item_counts = (items_in_file(size, chunk_size) for size in self.sizes)
        self.first_items = array("q", accumulate(item_counts, initial=0))

    @property
    def file_count(self) -> int:
        return len(self.paths)

    @property
    def item_count(self) -> int:
        return self.first_items[-1]

    @cached_property
    def size_bytes(self) -> int:
        return sum(self.sizes)

    @cached_property
    def largest_item(self) -> int:
        """The size of the biggest item: what one fetch can cost, hence the smallest sensible burst."""
        return min(self.chunk_size, max(self.sizes, default=0))

    def file_of_item(self, item: int) -> int:
        """Index of the file that owns `item`."""
        if not 0 <= item < self.item_count:
            raise IndexError(f"item {item} is outside 0..{self.item_count - 1}")
        return bisect_right(self.first_items, item) - 1

    def item_extent(self, item: int) -> tuple[int, int, int]:
        """(file index, byte offset in the file, length in bytes) of `item`."""
        index = self.file_of_item(item)
        offset = (item - self.first_items[index]) * self.chunk_size
        return index, offset, min(self.chunk_size, self.sizes[index] - offset)

    def items_covering(self, file_index: int, offset: int, size: int) -> range:
        """The items holding bytes [offset, offset + size) of a file, clipped at its end (empty past it)."""
        end = min(offset + size, self.sizes[file_index])
        if offset >= end:
            return range(0)
        first = self.first_items[file_index]
        return range(first + offset // self.chunk_size, first + (end - 1) // self.chunk_size + 1)

    def item_size(self, item: int) -> int:
        return self.item_extent(item)[2]

    def file(self, index: int) -> FileEntry:
        first = self.first_items[index]
        return FileEntry(
            self.paths[index],
            self.sizes[index],
            self.versions[index],
            self.mtimes_ns[index],
            first,
            self.first_items[index + 1] - first,
        )

    def encode(self) -> bytes:
        """A compact, self-describing byte form (zlib-compressed JSON columns behind a format tag)."""
        return self._encoded

    @cached_property
    def _encoded(self) -> bytes:
        body = {
            "chunk_size": self.chunk_size,
            "files": len(self.paths),
            "paths": self.paths.joined(),
            "sizes": self.sizes.tolist(),
            "mtimes_ns": self.mtimes_ns.tolist(),
            "versions": self.versions.joined(),
            "empty_dirs": list(self.empty_dirs),
        }
        # Level 1: ETags are incompressible, so higher levels cost several times the time for ~4 % less.
        return _FORMAT_TAG + zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 1)

    @cached_property
    def digest(self) -> str:
        """SHA-256 of the encoded form: two nodes with the same digest number items the same way."""
        return hashlib.sha256(self.encode()).hexdigest()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        if not data.startswith(_FORMAT_TAG):
            raise ManifestError("not a silod manifest (unknown format tag)")
        try:
            body = json.loads(zlib.decompress(data[len(_FORMAT_TAG) :]))
            files = body["files"]
            manifest = cls(
                body["chunk_size"],
                StringColumn(body["paths"], files),
                body["sizes"],
                body["mtimes_ns"],
                StringColumn(body["versions"], files),
                body["empty_dirs"],
            )
        except (zlib.error, ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"corrupt manifest: {exc}") from exc
        manifest.__dict__["_encoded"] = bytes(data)  # its digest is that of the bytes it was read from
        return manifest


def build_manifest(objects: Iterable[ObjectInfo], chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    """Freeze a backend listing, refusing what a POSIX tree cannot show (the message names the key)."""
    files: dict[str, ObjectInfo] = {}
    explicit_dirs: set[str] = set()
    for obj in objects:
        if obj.is_dir and obj.key == "":
            continue  # a marker for the dataset's own prefix
        _check_key(obj.key)
        if obj.is_dir:
            explicit_dirs.add(obj.key)
        elif obj.key in files:
            raise ManifestError(f"object key {obj.key!r} is listed twice")
        else:
            files[obj.key] = obj
    implied_dirs = _ancestors_of([*files, *explicit_dirs])
    clashes = sorted(files.keys() & (implied_dirs | explicit_dirs))
    if clashes:
        raise ManifestError(f"object key {clashes[0]!r} is both a file and a folder")
    ordered = sorted(files.values(), key=lambda o: o.key)
    return Manifest(
        chunk_size,
        [o.key for o in ordered],
        [o.size for o in ordered],
        [o.mtime_ns for o in ordered],
        [o.version for o in ordered],
        sorted(explicit_dirs - implied_dirs),
    )


def _ancestors_of(paths: Iterable[str]) -> set[str]:
    """Every proper ancestor folder of `paths`, computed level by level (files share few parents)."""
    ancestors: set[str] = set()
    level = {path.rpartition("/")[0] for path in paths} - {""}
    while level:
        ancestors |= level
        level = {folder.rpartition("/")[0] for folder in level} - ancestors - {""}
    return ancestors


_BAD_COMPONENT = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")


def _check_key(key: str) -> None:
    if _BAD_COMPONENT.search(key):
        raise ManifestError(f"object key {key!r} has an empty, '.' or '..' path component")
    if "\0" in key:
        raise ManifestError(f"object key {key!r} contains a NUL character")
    if len(key) > _MAX_NAME_BYTES // 4 and any(len(part.encode()) > _MAX_NAME_BYTES for part in key.split("/")):
        raise ManifestError(f"object key {key!r} has a name longer than {_MAX_NAME_BYTES} bytes")
