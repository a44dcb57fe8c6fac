"""SQLite's write-ahead log: where SQLite keeps it, whether SQLite would replay what it holds, and how much of the
state disk it may take.

SQLite reads the log's 32-byte header before any frame (https://www.sqlite.org/fileformat.html, "WAL File Format"),
and a header it does not take makes it ignore the whole log without a word: it opens the database as the last
checkpoint left it and overwrites the log at the first change. Until silod's log is checkpointed (every
`CHECKPOINT_PAGES` pages) every change since lives only there, so a data manager killed with SIGKILL and started
over a log whose header a disk damaged served an older state (an empty cluster at revision 0, for a young state
dir), and its first change destroyed the rest. `header_problem` finds that before SQLite opens the log.

A log that fills its disk cannot be emptied: the checkpoint that would give its room back needs room itself, for the
pages the database grows by. So the log is kept small (`bound`), and emptied after each commit where the disk is
short of room (`short_of_room`, `empty`).
"""

from __future__ import annotations

import os
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path

# The log is folded into the database (a checkpoint) once it holds this many pages, some 400 KiB, rather than
# SQLite's default 1000 (4 MiB): a small cluster's whole state is some 100 KiB, and each change writes some 6 pages,
# so a 4 MiB log was most of a small state disk, which it filled (SQLite checkpoints only after a commit that
# succeeded). A checkpoint costs one flush of the database every 15 changes or so.
CHECKPOINT_PAGES = 100
# The most the log takes before its next checkpoint: that many frames, each a 4 KiB page and its 24-byte header.
_ROOM = CHECKPOINT_PAGES * (4096 + 24)
# After a checkpoint, a log that one large transaction grew (a big dataset's manifest) is cut back to this size when
# it is next written from its start, rather than keep its largest size for good.
_SIZE_LIMIT = 1 << 20
A_READER_HOLDS_IT = "a reader holds the database: an sqlite3 shell, a backup"  # why `empty` may fail

_HEADER_SIZE = 32
_HEADER = struct.Struct(">8I")  # magic, format version, page size, checkpoint count, 2 salts, 2 checksums
_MAGIC = 0x377F0682  # with the low bit set (0x377F0683), the checksums sum big-endian words, else little-endian
_FORMAT_VERSION = 3007000
_MIN_PAGE_SIZE, _MAX_PAGE_SIZE = 512, 65536


@dataclass(frozen=True)
class DatabaseFiles:
    """A SQLite database's files where SQLite keeps them: `database`, the file a path names with its symbolic links
    resolved, and its write-ahead log, shared-memory index and rollback journal beside that file, not beside the
    link. A state dir's `silod.db` may link to a database on another volume: its log, its index, the disk they fill
    and the directory a restore renames its copy in are that volume's, and a check made beside the link finds
    nothing there."""

    database: Path

    @property
    def log(self) -> Path:
        return Path(f"{self.database}-wal")

    @property
    def index(self) -> Path:
        return Path(f"{self.database}-shm")

    @property
    def journal(self) -> Path:
        return Path(f"{self.database}-journal")


def files_of(database: Path) -> DatabaseFiles:
    """The files of the database at `database`, as SQLite resolves them (the log of a state dir's `silod.db` that
    links to /vol/silod.db is /vol/silod.db-wal)."""
    return DatabaseFiles(Path(os.path.realpath(database)))


def bound(db: sqlite3.Connection) -> None:
    """Keep the log that the connection `db` writes to some 400 KiB (`CHECKPOINT_PAGES`), and cut it back to 1 MiB
    after a larger transaction."""
    db.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_PAGES}")
    db.execute(f"PRAGMA journal_size_limit={_SIZE_LIMIT}")


def short_of_room(directory: Path) -> bool:
    """Whether the disk holding `directory` has less room left than a log may take before its next checkpoint
    (False where the disk cannot say)."""
    try:
        room = os.statvfs(directory)
    except OSError:
        return False
    return room.f_bavail * room.f_frsize < _ROOM


def empty(db: sqlite3.Connection) -> str | None:
    """Move what the log of the connection `db` holds that was committed into the database, then truncate the log to
    nothing (`PRAGMA wal_checkpoint(TRUNCATE)`, which waits up to the connection's busy timeout for readers); None
    once it is empty, else why it is not: a reader holds it (`A_READER_HOLDS_IT`), or SQLite's error (the database
    has no room to grow into what the log holds, the disk fails)."""
    try:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error as exc:
        return str(exc)
    return None if busy == 0 else A_READER_HOLDS_IT


def header_problem(log: Path) -> str | None:
    """What makes SQLite ignore the changes the write-ahead log at `log` holds, or refuse to open it: a header that
    is not SQLite's, of a format version it does not read, or whose checksum does not match. None for a log SQLite
    replays, and for one that holds no change to lose (none, or a header alone). Raises OSError if it cannot be
    read."""
    with open(log, "rb") as file:
        header = file.read(_HEADER_SIZE + 1)  # a byte past the header: a frame follows, or the log holds nothing
    if len(header) <= _HEADER_SIZE:  # SQLite reads no frame from such a log: nothing to lose
        return None
    magic, version, page_size, _, _, _, *checksum = _HEADER.unpack(header[:_HEADER_SIZE])
    if magic & ~1 != _MAGIC:
        return f"its header's magic number is {magic:#010x}, not SQLite's {_MAGIC:#010x} or {_MAGIC | 1:#010x}"
    if not (_MIN_PAGE_SIZE <= page_size <= _MAX_PAGE_SIZE and page_size & (page_size - 1) == 0):
        return f"its header gives a page size of {page_size} bytes, which no SQLite database has"
    if _checksum(header[:24], big_endian=bool(magic & 1)) != tuple(checksum):
        return "its header's checksum does not match the header"
    if version != _FORMAT_VERSION:
        return f"its header gives the format version {version}, not {_FORMAT_VERSION}, the one SQLite reads"
    return None


def _checksum(data: bytes, *, big_endian: bool) -> tuple[int, int]:
    """SQLite's checksum of `data` (a multiple of 8 bytes) as its log header stores it: two 32-bit sums over the
    data's 32-bit words, taken in pairs."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    first = second = 0
    for even, odd in zip(words[::2], words[1::2], strict=True):
        first = (first + even + second) & 0xFFFFFFFF
        second = (second + odd + first) & 0xFFFFFFFF
    return first, second
