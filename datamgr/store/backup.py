"""Backups of the data manager's state and their restore: SQLite's online backup, through a read-only connection,
so that a copy taken while a data manager runs is consistent and a restore never leaves a backup beside another
database's write-ahead log (docs/datamgr.md, "Backups").

Both write their copy under a temporary name, flush it and rename it into place, so a backup or restore killed
midway (or cut by a power loss) leaves the file it was to replace or make as it was, never a half-written one under
the final name. Both read the copy as a data manager would (every row) before they call it done."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from datamgr.store.rows import read_state
from datamgr.store.sqlite import (
    SCHEMA_VERSION,
    flush_file,
    read_only,
    refusing_damage,
    refusing_disk_errors,
    refusing_unreadable_rows,
    remove_database,
    upgrade,
)
from datamgr.store.statedir import (
    DATABASE_NAME,
    LOG_SUFFIXES,
    StateDirError,
    check_database_not_dangling,
    check_log,
    check_not_dangling,
    check_restore_finished,
    lock_state_dir,
    replaced_databases,
    restoring_copy,
)
from datamgr.store.wal import DatabaseFiles, files_of
from silodlib.directories import fsync_directory, make_directory

# What `link` answers on a file system without hard links (vfat, some FUSE file systems).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK})


def back_up(state_dir: Path, destination: Path) -> int:
    """Copy the state database of `state_dir` into `destination`, a new file readable by its owner only, and
    return the revision copied. SQLite's online backup through a read-only connection: the copy is the last
    committed state, consistent, whether a data manager runs on the state dir or not, which it neither blocks
    nor changes (copying the files instead can catch the database and its write-ahead log at different
    moments). The copy is written as `destination.partial-PID`, read whole, flushed and then linked to its name:
    a backup killed midway leaves that partial file (to delete), never a partial `destination`.

    The database is read with its write-ahead log, where SQLite keeps it (beside the file a linked `silod.db`
    names): a data manager that runs or was killed holds its last changes there. Without one (a data manager
    stopped cleanly folds it back in and deletes it), the database is read as an immutable file: a read-only
    connection would otherwise leave an empty log and a shared-memory index beside the database of a stopped data
    manager, which a backup is not to change. A data manager that starts meanwhile writes to a new log and folds it
    in only once it holds some 400 KiB of changes (`wal.CHECKPOINT_PAGES`), or after each change on a disk short of
    room: a copy that caught such a fold half done would not read whole, and the backup would be refused.

    Raises StateDirError for a state dir without a database this silod can read whole (a log whose header SQLite
    would not take included: it would copy an older state) and for a destination that is a directory or exists (a
    backup never replaces a file), OSError for a destination that cannot be made."""
    refused, outcome = f"cannot back up state dir {state_dir}", "nothing was written"
    check_not_dangling(state_dir, refused, "back up again")
    check_database_not_dangling(
        state_dir, refused, "mount the volume (or put back the file it names), then back up again"
    )
    source_path = state_dir / DATABASE_NAME
    if not source_path.is_file():
        raise StateDirError(f"{refused}: it has no state database ({DATABASE_NAME})")
    if destination.is_dir():  # written under a name of our choosing, the operator would have to find out which
        raise StateDirError(
            f"cannot write the backup {destination}: it is a directory, and a backup is a new file: give the file's "
            f"path (such as {destination / 'silod-backup.db'})"
        )
    if os.path.lexists(destination):
        raise _exists(destination)
    check_restore_finished(state_dir, refused)  # its database may lack its log, which the restore moved away
    if source_path.stat().st_size == 0:
        raise StateDirError(f"{refused}: {source_path} is empty (0 bytes), not a database; {outcome}")
    check_log(source_path, refused)
    source_files = files_of(source_path)
    partial = destination.with_name(f"{destination.name}.partial-{os.getpid()}")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    linked = False
    try:
        with (
            refusing_damage(source_path, refused, outcome),
            refusing_disk_errors(f"{refused} to {destination}", outcome),
            contextlib.closing(read_only(source_path, immutable=not source_files.log.exists())) as source,
            contextlib.closing(sqlite3.connect(partial)) as copy,
        ):
            copy.execute("PRAGMA journal_mode=OFF")  # a file no one uses until it is whole: nothing to roll back
            source.backup(copy)
            revision = _checked_revision(
                copy,
                source_path,
                refused,
                str(source_path),
                outcome,
                "restore the state dir from a backup (silod datamgr restore)",
                "back it up with that silod version (or newer)",
            )
        flush_file(partial)
        _link(partial, destination)
        linked = True
        fsync_directory(destination.parent)
    except BaseException:
        if linked:  # the directory could not be flushed: the backup is not known to be on the disk
            destination.unlink(missing_ok=True)
        raise
    finally:
        partial.unlink(missing_ok=True)
    return revision


def _exists(destination: Path) -> StateDirError:
    """The refusal of a backup to `destination`, where a file (or a link, even one to nothing) already is."""
    what = "a symbolic link" if destination.is_symlink() else "a file"
    return StateDirError(
        f"cannot write the backup {destination}: {what} of that name is there, and a backup never replaces one; "
        f"nothing was written: give the backup another name (or move {destination} aside)"
    )


def _link(source: Path, target: Path) -> None:
    """Give the file `source` the name `target` as well (then `source` is removed), never replacing a file there
    (StateDirError, as `back_up` refuses one found before). A file system without hard links gets a rename, which
    checks `target` just before."""
    try:
        os.link(source, target)
    except FileExistsError:
        raise _exists(target) from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(target):
            raise _exists(target) from None
        os.rename(source, target)


def restore(state_dir: Path, backup: Path) -> tuple[int, Path | None]:
    """Make `backup` (from `back_up`) the state database of `state_dir`, whose data manager must be stopped, and
    return the revision restored and where the database it replaces was kept (None if there was none).

    The backup is copied to `silod.db.restoring` in the state dir and flushed; then the database it replaces is
    kept, with its write-ahead log, as `silod.db.replaced-TIME` (a hard link, so that `silod.db` stays in place
    meanwhile), and the copy renamed over `silod.db`. Killed at any point, the state dir holds the old database or
    the restored one; while `silod.db.restoring` is there the data manager refuses to start, and a restore run
    again finishes the job, keeping the database the first try kept. The log matters: SQLite replays a
    `silod.db-wal` it finds beside `silod.db` whatever database it belongs to, so a backup copied over the file
    of a data manager that was killed (whose log still holds its last changes) would come back as a mix of both.

    A state dir whose `silod.db` links to a database on another volume keeps that layout: the copy is written and
    renamed beside the file the link names, and the database it replaces kept there, so the state stays on its
    volume (before, the link was kept as `silod.db.replaced-TIME` and a file put in its place, on the state dir's
    disk). A link to no file (its volume not mounted) is refused.

    Raises StateDirError for a backup that is not a whole silod state database this silod can read (a log beside
    it, which it would not read, included) and for a state dir in use or behind a link to nothing."""
    if backup.is_dir():
        raise StateDirError(f"cannot restore {backup}: it is a directory, not a backup file")
    if not backup.exists():
        raise StateDirError(f"cannot restore {backup}: no such file")
    if not backup.is_file():
        raise StateDirError(
            f"cannot restore {backup}: it is not a regular file (a pipe, a device or a socket), as a backup is"
        )
    _refuse_logs_beside(backup)
    into = f"cannot restore into state dir {state_dir}"
    check_not_dangling(state_dir, into, "restore again")
    check_database_not_dangling(
        state_dir,
        into,
        "mount the volume (or put back the file it names), then restore again; or delete the link to restore into "
        "the state dir itself",
    )
    refused = f"cannot restore {backup}"
    with (
        refusing_damage(backup, refused, "nothing was changed"),
        contextlib.closing(read_only(backup, immutable=True)) as source,
    ):
        revision = _checked_revision(
            source,
            backup,
            refused,
            "it",
            "nothing was changed",
            "restore another backup",
            "restore it with that silod version (or newer)",
        )
        make_directory(state_dir, mode=0o700)
        lock = lock_state_dir(state_dir, "restore")
        try:
            copying = f"cannot restore {backup} into state dir {state_dir}"
            files = files_of(state_dir / DATABASE_NAME)
            try:
                with refusing_disk_errors(copying, "it is as it was"):
                    kept = _copy_in(source, files)
            except OSError as exc:  # a flush or rename the disk refused
                raise StateDirError(f"{copying}: {exc.strerror or exc}; it is as it was") from None
            _flush_directory(files.database.parent, state_dir, backup)
        finally:
            lock.release()
    return revision, kept


def _refuse_logs_beside(backup: Path) -> None:
    """Refuse a backup with a write-ahead log or a rollback journal beside it. A restore reads the file alone
    (`immutable`), so what the log holds would be lost: a state dir's `silod.db`, whose data manager runs or was
    killed, holds acknowledged changes there. A journal says the file is a copy that was never finished."""
    files = files_of(backup)  # SQLite's, beside the file a link names
    database, wal, journal = files.database, files.log, files.journal
    beside = f"the file it links to ({database})" if backup.is_symlink() else "it"
    if os.path.lexists(wal):
        how = (
            f"back that state dir up with silod datamgr backup --state-dir {database.parent} FILE, which reads the "
            "log, and restore FILE"
            if database.name == DATABASE_NAME
            else f"copy {database} and {wal} into an empty directory as {DATABASE_NAME} and {DATABASE_NAME}-wal, back "
            "that directory up with silod datamgr backup --state-dir DIR FILE, which reads the log, and restore FILE"
        )
        raise StateDirError(
            f"cannot restore {backup}: a write-ahead log ({wal}) is beside {beside}, holding changes a restore would "
            f"not read (it is the database of a data manager that runs, or was stopped without closing it); nothing "
            f"was changed: {how}"
        )
    if os.path.lexists(journal):
        raise StateDirError(
            f"cannot restore {backup}: a rollback journal ({journal}) is beside {beside}: it is a copy that was not "
            "finished (a backup or restore was interrupted); nothing was changed: restore a whole backup"
        )


def _checked_revision(
    db: sqlite3.Connection, path: Path, refused: str, subject: str, outcome: str, advice: str, newer_advice: str
) -> int:
    """The revision the silod state database open as `db` (at `path`, called `subject` in messages) holds, once
    every row of it has been read as a data manager reads it at start: a copy it could not start on is no backup.
    StateDirError saying `refused` ("cannot restore FILE") and `outcome` ("nothing was changed") for a database
    that is not silod's, is damaged, is from a newer silod (then `newer_advice`) or holds a row this silod cannot
    read (`advice`)."""
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError:  # no meta table: another SQLite database
        meta = {}
    version = meta.get("schema_version")
    if version is None:
        raise StateDirError(f"{refused}: {subject} is not a silod state database; {outcome}")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateDirError(f"{refused}: {subject} is damaged (its schema version is {version!r}); {outcome}")
    if version > SCHEMA_VERSION:
        raise StateDirError(
            f"{refused}: {subject} was written by a newer silod (schema {version} > {SCHEMA_VERSION}); {outcome}: "
            f"{newer_advice}"
        )
    # SQLite's backup copies pages as they are: a file damaged past its first pages would be copied, and the data
    # manager then refuse to start on it. Its structure is checked first (one pass over the file).
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise StateDirError(f"{refused}: {subject} is damaged ({problems[0]}); {outcome}")
    # Then its rows, as the data manager reads them, in a copy in memory brought to the current schema.
    with (
        contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as scratch,
        refusing_unreadable_rows(
            path,
            refused,
            f"{outcome}: {advice}",
            f"{outcome}: if a newer silod wrote it, {newer_advice}; if not, {advice}",
        ),
    ):
        db.backup(scratch)
        upgrade(scratch, version)
        return read_state(scratch).revision


def _copy_in(source: sqlite3.Connection, files: DatabaseFiles) -> Path | None:
    """Copy the database open as `source` over the state database of `files` (beside the file a linked `silod.db`
    names), keeping the one there beside it (see `restore`); returns where it was kept. A copy that fails (a full
    disk, say) leaves the state dir as it was."""
    current, copy = files.database, restoring_copy(files)
    remove_database(copy)  # an interrupted restore's unfinished copy: ours, since we hold the state dir
    try:
        os.close(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        with contextlib.closing(sqlite3.connect(copy)) as db:
            db.execute("PRAGMA journal_mode=OFF")  # nothing to roll back: a copy not yet whole is never used
            source.backup(db)
        flush_file(copy)
        undo: list[Callable[[], None]] = []
        try:
            kept = _keep(current, undo)
            if kept is not None:
                fsync_directory(current.parent)  # the kept files under their names before the copy takes the database's
            os.rename(copy, current)
        except BaseException:
            for action in reversed(undo):
                with contextlib.suppress(OSError):
                    action()
            raise
    except BaseException:
        remove_database(copy)
        raise
    return kept


def _keep(current: Path, undo: list[Callable[[], None]]) -> Path | None:
    """Keep the database at `current` and its log and shared memory under a name no file has (`_unused_name`),
    leaving `current` in place (a hard link): the copy renamed over it then replaces it in one step. Appends to
    `undo` what puts things back. A database an interrupted restore already kept (the same file under a
    `silod.db.replaced-*` name) keeps that name. None if there is nothing to keep."""
    if not any(os.path.lexists(f"{current}{suffix}") for suffix in ("", *LOG_SUFFIXES)):
        return None
    kept = _kept_before(current) or _unused_name(current)
    renamed = False
    if os.path.lexists(current) and not os.path.lexists(kept):
        try:
            os.link(current, kept)
            undo.append(lambda: os.unlink(kept))
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            renamed = True  # after its log: the database never sits beside another's
    for suffix in LOG_SUFFIXES:
        if os.path.lexists(f"{current}{suffix}"):
            _rename(f"{current}{suffix}", f"{kept}{suffix}", undo)
    if renamed:
        _rename(str(current), str(kept), undo)
    return kept


def _rename(source: str, target: str, undo: list[Callable[[], None]]) -> None:
    os.rename(source, target)
    undo.append(lambda: os.rename(target, source))


def _kept_before(current: Path) -> Path | None:
    """The name an interrupted restore kept the database at `current` under (the same file), if it did and none of
    the files beside both would clash."""
    if not current.exists():
        return None
    for kept in replaced_databases(files_of(current)):
        if os.path.samefile(kept, current) and not any(
            os.path.lexists(f"{kept}{suffix}") and os.path.lexists(f"{current}{suffix}") for suffix in LOG_SUFFIXES
        ):
            return kept
    return None


def _flush_directory(directory: Path, state_dir: Path, backup: Path) -> None:
    """Make the restore's rename of its copy over the database of `state_dir` (in `directory`) durable: until the
    directory is flushed, a power loss could bring back the database it replaced. StateDirError if the directory
    cannot be flushed: the copy is in place, but a power loss may undo it."""
    try:
        fsync_directory(directory)
    except OSError as exc:
        raise StateDirError(
            f"restored {backup} into state dir {state_dir}, but could not flush the directory to disk "
            f"({exc.strerror or exc}): a power loss before the disk writes it back may undo the restore; "
            "check the disk, then restore again"
        ) from None


def _unused_name(current: Path) -> Path:
    """A name to keep the database `current` under that no file beside it has, nor a write-ahead log, rollback
    journal or shared memory of that name: `silod.db.replaced-TIME`, the time to the second, then `-2`, `-3`... for
    a second restore within that second. A rename would replace a kept database, or set the database beside an older
    one's log, which SQLite would replay into it. The state dir's lock keeps any other restore from taking the name
    meanwhile."""
    stamp = f"{current.name}.replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    kept, count = current.with_name(stamp), 1
    while any(os.path.lexists(f"{kept}{suffix}") for suffix in ("", *LOG_SUFFIXES)):
        count += 1
        kept = current.with_name(f"{stamp}-{count}")
    return kept
