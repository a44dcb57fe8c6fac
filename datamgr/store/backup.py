"""Backups of the data manager's state and their restore: SQLite's online backup, through a read-only connection,
so that a copy taken while a data manager runs is consistent and a restore never leaves a backup beside another
database's write-ahead log (docs/datamgr.md, "Backups")."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from datamgr.store.sqlite import (
    DATABASE_NAME,
    SCHEMA_VERSION,
    StateDirError,
    lock_state_dir,
    refusing_damage,
    refusing_disk_errors,
)
from silodlib.directories import fsync_directory, make_directory

# A database's write-ahead log and shared memory, then the database: the order in which they move, so that a
# database never sits beside another database's log.
_DATABASE_FILES = ("-wal", "-shm", "")


def back_up(state_dir: Path, destination: Path) -> int:
    """Copy the state database of `state_dir` into `destination`, a new file readable by its owner only, and
    return the revision copied. SQLite's online backup through a read-only connection: the copy is the last
    committed state, consistent, whether a data manager runs on the state dir or not, which it neither blocks
    nor changes (copying the files instead can catch the database and its write-ahead log at different
    moments). Raises StateDirError for a state dir without a readable database and for a destination that is a
    directory, OSError for a destination that cannot be made (FileExistsError if it exists: a backup never
    replaces a file)."""
    source_path = state_dir / DATABASE_NAME
    if not source_path.is_file():
        raise StateDirError(f"cannot back up state dir {state_dir}: it has no state database ({DATABASE_NAME})")
    if destination.is_dir():  # written under a name of our choosing, the operator would have to find out which
        raise StateDirError(
            f"cannot write the backup {destination}: it is a directory, and a backup is a new file: give the file's "
            f"path (such as {destination / 'silod-backup.db'})"
        )
    os.close(os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    refused = f"cannot back up state dir {state_dir}"
    try:
        with (
            refusing_damage(source_path, refused, "nothing was written"),
            refusing_disk_errors(f"{refused} to {destination}", "nothing was written"),
            contextlib.closing(_read_only(source_path)) as source,
            contextlib.closing(sqlite3.connect(destination)) as copy,
        ):
            source.backup(copy)
            row = copy.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()
    except BaseException:
        destination.unlink(missing_ok=True)
        raise
    return 0 if row is None else int(row[0])


def restore(state_dir: Path, backup: Path) -> tuple[int, Path | None]:
    """Make `backup` (from `back_up`) the state database of `state_dir`, whose data manager must be stopped, and
    return the revision restored and where the database it replaces was kept (None if there was none).

    The database it replaces is renamed with its write-ahead log, never deleted. The log matters: SQLite replays
    a `silod.db-wal` it finds beside `silod.db` whatever database it belongs to, so a backup copied over the
    file of a data manager that was killed (whose log still holds its last changes) would come back as a mix of
    both. Raises StateDirError for a backup that is not a readable silod state database and for a state dir in
    use."""
    if backup.is_dir():
        raise StateDirError(f"cannot restore {backup}: it is a directory, not a backup file")
    if not backup.is_file():
        raise StateDirError(f"cannot restore {backup}: no such file")
    with (
        refusing_damage(backup, f"cannot restore {backup}", "nothing was changed"),
        contextlib.closing(_read_only(backup, immutable=True)) as source,
    ):
        revision = _revision_of_backup(source, backup)
        make_directory(state_dir, mode=0o700)
        lock = lock_state_dir(state_dir)
        try:
            with refusing_disk_errors(f"cannot restore {backup} into state dir {state_dir}", "it is as it was"):
                kept = _copy_in(source, state_dir / DATABASE_NAME)
            _flush_directory(state_dir, backup)
        finally:
            os.close(lock)
    return revision, kept


def _read_only(path: Path, *, immutable: bool = False) -> sqlite3.Connection:
    """A read-only connection to the database at `path`; `immutable` for a file nothing writes (a backup), which
    then needs no locks and gets no shared-memory file beside it."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}", uri=True)


def _revision_of_backup(source: sqlite3.Connection, backup: Path) -> int:
    """The revision the backup open as `source` holds; StateDirError if it is not a silod state database this
    silod can serve."""
    try:
        meta = dict(source.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError:  # no meta table: another SQLite database
        meta = {}
    version = meta.get("schema_version")
    if version is None:
        raise StateDirError(f"cannot restore {backup}: it is not a silod state database")
    if version > SCHEMA_VERSION:
        raise StateDirError(f"cannot restore {backup}: written by a newer silod (schema {version} > {SCHEMA_VERSION})")
    # SQLite's backup copies pages as they are: a file damaged past its first pages would be restored, and the
    # data manager then refuse to start on it. Its structure is checked first (one pass over the file).
    problems = [row[0] for row in source.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise StateDirError(f"cannot restore {backup}: it is damaged ({problems[0]}); nothing was changed")
    return int(meta.get("revision", 0))


def _copy_in(source: sqlite3.Connection, current: Path) -> Path | None:
    """Copy the database open as `source` to `current`, keeping the database there (see `restore`); returns where
    it was kept. A copy that fails (a full disk, say) leaves the state dir as it was."""
    kept = None
    if current.exists():
        kept = _unused_name(current)
        _move_database(current, kept)
    try:
        with contextlib.closing(sqlite3.connect(current)) as copy:
            os.chmod(current, 0o600)
            source.backup(copy)
    except BaseException:
        for suffix in _DATABASE_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{current}{suffix}")
        if kept is not None:
            _move_database(kept, current)
        raise
    return kept


def _flush_directory(state_dir: Path, backup: Path) -> None:
    """Make the restore's renames and the end of SQLite's copy durable. SQLite commits the copy by deleting its
    rollback journal and does not flush the directory after that (`synchronous` FULL): a power loss could bring
    the journal back, and the next open would roll the copy back, leaving an empty database where the state was.
    StateDirError if the directory cannot be flushed: the copy is in place, but a power loss may undo it."""
    try:
        fsync_directory(state_dir)
    except OSError as exc:
        raise StateDirError(
            f"restored {backup} into state dir {state_dir}, but could not flush the directory to disk "
            f"({exc.strerror or exc}): a power loss before the disk writes it back may undo the restore; "
            "check the disk, then restore again"
        ) from None


def _unused_name(current: Path) -> Path:
    """A name to keep the database `current` under that no file beside it has, nor a write-ahead log or shared
    memory of that name: `silod.db.replaced-TIME`, the time to the second, then `-2`, `-3`... for a second restore
    within that second. A rename would replace a kept database, or set the database beside an older one's log, which
    SQLite would replay into it. The state dir's lock keeps any other restore from taking the name meanwhile."""
    stamp = f"{current.name}.replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    kept, count = current.with_name(stamp), 1
    while any(os.path.lexists(f"{kept}{suffix}") for suffix in _DATABASE_FILES):
        count += 1
        kept = current.with_name(f"{stamp}-{count}")
    return kept


def _move_database(source: Path, target: Path) -> None:
    """Rename a database with its write-ahead log and shared memory (`_DATABASE_FILES`) to names that no file has
    (`_unused_name`; the failed restore's own files are gone before its kept database moves back)."""
    for suffix in _DATABASE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{source}{suffix}", f"{target}{suffix}")
