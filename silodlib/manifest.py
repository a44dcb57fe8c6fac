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
import logging
import re
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import overload

from silodlib.backends.base import ObjectInfo
from silodlib.logfields import log_ids

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
_FORMAT_TAG = b"silod-manifest/1\n"
_MAX_NAME_BYTES = 255
_MIN_NS, _MAX_NS = -(2**63), 2**63 - 1  # the modification times a manifest (and the kernel's inode) can hold


class ManifestError(ValueError):
    """A listing that cannot be shown as a POSIX tree, or bytes that are not a manifest."""


class EmptyListing(ManifestError):
    """A listing with no file: a dataset without items could never be read, and it is nearly always a wrong
    bucket, prefix or path. The message starts with the dataset's URI and says what the listing held instead."""


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


# Why a listed key cannot be a path below a mount point: what one such key is, and what several are.
_EMPTY_COMPONENT = ("key with an empty, '.' or '..' component", "keys with an empty, '.' or '..' component")
_NUL = ("key with a NUL character", "keys with a NUL character")
_NOT_UTF8 = ("name that is not valid UTF-8", "names that are not valid UTF-8")
_EXAMPLES = 3  # skipped keys named per reason, in log lines and refusals


@dataclass
class Skipped:
    """The keys of one reason that a listing held and `build_manifest` left out: how many, and the first few."""

    count: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class ListingTally:
    """What a listing held, as `build_manifest` counted it: the objects (the prefix's own folder marker aside), the
    folder markers among them, and the keys it skipped because no path below a mount point can name them, by
    reason. The numbers behind the refusal of a listing without a file, and behind one log line per listing
    for its skipped keys rather than one per key (a bucket uploaded with a leading '/' skips every key)."""

    objects: int = 0
    folders: int = 0
    folder_example: str = ""
    skipped: dict[tuple[str, str], Skipped] = field(default_factory=dict)

    @property
    def skipped_count(self) -> int:
        return sum(skips.count for skips in self.skipped.values())

    def skip(self, name: str, reason: tuple[str, str]) -> None:
        skips = self.skipped.setdefault(reason, Skipped())
        skips.count += 1
        if len(skips.examples) < _EXAMPLES:
            skips.examples.append(name)

    def describe_skipped(self) -> str:
        """The skipped keys by reason, "keys with an empty, '.' or '..' component, such as '/a', '/b'"; with
        several reasons, each one's count first."""
        parts = []
        for (one, several), skips in self.skipped.items():
            what = one if skips.count == 1 else several
            if len(self.skipped) > 1:
                what = f"{skips.count:,} {what}"
            parts.append(f"{what}, such as {', '.join(repr(name) for name in skips.examples)}")
        return "; ".join(parts)

    def why_empty(self, uri: str) -> str:
        """Why the listing of `uri` gives no file: it listed nothing, or what it listed instead."""
        check = "check the bucket, container, prefix or path"
        if not self.objects:
            return f"{uri} lists no objects; {check}"
        held = []
        if self.skipped:
            held.append(f"{self.skipped_count:,} skipped: {self.describe_skipped()}")
        if self.folders:
            markers = "folder marker" if self.folders == 1 else "folder markers"
            held.append(f"{self.folders:,} {markers}, such as {self.folder_example + '/'!r}")
        listed = f"{self.objects:,} object" + ("" if self.objects == 1 else "s")
        fix = f"rename the objects to relative paths, or {check}" if self.skipped else check
        return f"{uri} lists {listed}, none of which can be a file below a mount point ({'; '.join(held)}); {fix}"


def build_manifest(
    objects: Iterable[ObjectInfo], chunk_size: int = DEFAULT_CHUNK_SIZE, tally: ListingTally | None = None
) -> Manifest:
    """Freeze a backend listing. Keys that no path below a mount point can name (an empty, '.' or '..' component,
    as in '/x' or 'a//b'; a NUL; a name that is not UTF-8) are left out and counted in `tally`: such a key has no
    path to serve it under. What a POSIX tree cannot show is refused (`ManifestError` naming the key): a key both
    a file and a folder (a file 'k' beside 'k/x' or the folder marker 'k/'), a name over 255 bytes, a key listed
    twice. Those are paths, so leaving one out would silently drop a file the dataset's users expect."""
    tally = ListingTally() if tally is None else tally
    files: dict[str, ObjectInfo] = {}
    explicit_dirs: set[str] = set()
    for obj in objects:
        if obj.is_dir and obj.key == "":
            continue  # a marker for the dataset's own prefix
        tally.objects += 1
        reason = _unpathable(obj.key)
        if reason is not None:
            tally.skip(obj.key + "/" if obj.is_dir else obj.key, reason)
            continue
        _check_name_lengths(obj.key)
        if obj.is_dir:
            tally.folders += 1
            tally.folder_example = tally.folder_example or obj.key
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


def freeze_listing(uri: str, objects: Iterable[ObjectInfo], chunk_size: int = DEFAULT_CHUNK_SIZE) -> Manifest:
    """The manifest of the dataset at `uri` from its listing, as the data manager registers it and a standalone
    mount serves it (`build_manifest`). Refuses a listing without a file (`EmptyListing`, saying what it held
    instead: nothing, only folder markers, or keys it skipped and why). Keys skipped from a dataset that is kept
    are logged as one WARNING with their count and a few examples, however many there are."""
    tally = ListingTally()
    manifest = build_manifest(objects, chunk_size, tally)
    if manifest.file_count == 0:
        raise EmptyListing(tally.why_empty(uri))
    if tally.skipped:
        one = tally.skipped_count == 1
        log.warning(
            "%s: %s of the %s objects listed %s left out of the dataset, since no path below a mount point can "
            "name %s: %s",
            uri,
            f"{tally.skipped_count:,}",
            f"{tally.objects:,}",
            "is" if one else "are",
            "it" if one else "them",
            tally.describe_skipped(),
            extra=log_ids(dataset_uri=uri),
        )
    return manifest


def _ancestors_of(paths: Iterable[str]) -> set[str]:
    """Every proper ancestor folder of `paths`, computed level by level (files share few parents)."""
    ancestors: set[str] = set()
    level = {path.rpartition("/")[0] for path in paths} - {""}
    while level:
        ancestors |= level
        level = {folder.rpartition("/")[0] for folder in level} - ancestors - {""}
    return ancestors


_BAD_COMPONENT = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")


def _unpathable(key: str) -> tuple[str, str] | None:
    """Why no path below a mount point can name `key`, or None if one can."""
    if _BAD_COMPONENT.search(key):
        return _EMPTY_COMPONENT
    if "\0" in key:
        return _NUL
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError:  # a local name that is not UTF-8, held with surrogate escapes
            return _NOT_UTF8
    return None


def _check_name_lengths(key: str) -> None:
    if len(key) > _MAX_NAME_BYTES // 4 and any(len(part.encode()) > _MAX_NAME_BYTES for part in key.split("/")):
        raise ManifestError(f"object key {key!r} has a name longer than {_MAX_NAME_BYTES} bytes")
