"""The state directory as files: who holds it, and what it must hold before SQLite may open its database.

A state dir holds `silod.db` (with SQLite's `-wal` and `-shm` while it is open), the `lock` file, and the databases
restores replaced (`silod.db.replaced-TIME`, each with its log). SQLite opens whatever it finds: an empty file as an
empty database, and a rollback journal beside a database as a transaction to undo. So before it opens one, the data
manager checks what the files say (`check_files`): an interrupted restore, an empty database, a log without its
database, a log whose header SQLite would not take (`wal`), a link to a database on a volume that is not mounted,
files it cannot write. Each is refused by name, changing nothing (docs/datamgr.md, "Durability")."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Literal

from datamgr.store.wal import DatabaseFiles, files_of, header_problem
from silodlib.directories import failure_text, ownership_advice
from silodlib.privacy import make_private

DATABASE_NAME = "silod.db"
LOCK_NAME = "lock"
# A fresh state dir's database while it is made: renamed into place whole, so that an empty `silod.db` is never
# one silod left (`check_files`).
CREATING_NAME = f"{DATABASE_NAME}.creating"
LOG_SUFFIXES = ("-wal", "-shm", "-journal")  # SQLite's files beside a database: its logs and shared memory

# Who takes a state dir (`lock_state_dir`), written into its lock file after the pid so that a refusal can say
# what holds it and what to do about it; and the command to run again once it is free.
Holder = Literal["data manager", "restore"]
_AGAIN: dict[Holder, str] = {"data manager": "start again", "restore": "restore again"}
# What a refusal calls a holder, and how it is to be freed; the last for a lock file that does not say (a silod
# before it wrote the holder, or a lock file deleted and the directory's lock the only one left).
_HOLDERS: dict[str, tuple[str, str]] = {
    "data manager": ("another data manager", "stop it"),
    "restore": ("a restore", "wait for it to finish"),
}
_UNKNOWN_HOLDER = ("another process", "stop it (a data manager) or wait for it to finish (a restore)")


class StateDirError(RuntimeError):
    """The state directory cannot be used: not creatable or writable, locked by another process, from a newer
    silod, damaged, or left by an interrupted restore. The message says what to do."""


class StateDirLock:
    """A state dir held by this process (`lock_state_dir`) until `release`."""

    def __init__(self, descriptors: list[int]) -> None:
        self._descriptors = descriptors

    def release(self) -> None:
        while self._descriptors:
            os.close(self._descriptors.pop())


def lock_state_dir(state_dir: Path, holder: Holder) -> StateDirLock:
    """Take `state_dir` for this process, a `holder`: an exclusive `flock` of the directory itself, then of DIR/lock,
    which holds our pid and `holder`. StateDirError naming what holds it (a data manager, a restore, and its pid) if
    another process has it, and naming the lock file if it is a symbolic link; OSError if the directory or its lock
    file cannot be opened.

    The directory is the lock that counts: its inode cannot be swapped while it holds the database, whereas the lock
    file can be deleted (it looks stale to an operator) and made again, after which a second data manager would
    lock the new file and run beside the first. The lock file is still taken, for a silod from before the directory
    was locked, and for the holder's pid. A file system that cannot lock a directory (NFS emulates `flock` with
    POSIX locks, which need a file open for writing) has the lock file only."""
    held: list[int] = []
    try:
        directory = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        held.append(directory)
        try:
            fcntl.flock(directory, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(state_dir, holder, _holder_of_directory(directory)) from None
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            held.remove(directory)
            os.close(directory)
        lock = _open_lock_file(state_dir, holder)
        held.append(lock)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(state_dir, holder, None) from None
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{os.getpid()} {holder}".encode(), 0)
    except BaseException:
        StateDirLock(held).release()
        raise
    return StateDirLock(held)


def _open_lock_file(state_dir: Path, holder: Holder) -> int:
    """Open (or make) DIR/lock for writing our pid into, not following a symbolic link there: through one, the data
    manager truncated and overwrote whatever file it named. StateDirError naming the link for one."""
    lock = state_dir / LOCK_NAME
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    raise StateDirError(
        f"cannot use state dir {state_dir}: {lock} is a symbolic link (to {os.readlink(lock)}), not the lock file "
        "silod makes, and the data manager writes its pid into its lock file, which would overwrite the file it "
        f"names; nothing was changed: delete the link {lock} (silod makes the lock file itself), then {_AGAIN[holder]}"
    )


def _in_use(state_dir: Path, refused: Holder, pid: str | None) -> StateDirError:
    """The refusal of `refused` (who asked for the state dir) while the process `pid` holds it (None: the one its
    lock file names). What that process is comes from the lock file ("PID data manager", "PID restore"), when the
    file names that pid; a lock file of a silod before it held only the pid."""
    said: list[str] = []
    with contextlib.suppress(OSError), open(state_dir / LOCK_NAME, "rb") as file:
        said = file.read(64).decode(errors="replace").split(maxsplit=1)
    pid = pid or (said[0] if said else "unknown")
    what = said[1].strip() if len(said) == 2 and said[0] == pid else ""
    holder, freeing = _HOLDERS.get(what, _UNKNOWN_HOLDER)
    return StateDirError(
        f"state dir {state_dir} is in use by {holder} (pid {pid}); nothing was changed: {freeing}, then "
        f"{_AGAIN[refused]}"
    )


def _holder_of_directory(directory: int) -> str | None:
    """The pid holding a `flock` of the directory open as `directory`, from /proc/locks (where its lock file may be
    gone); None if it cannot be told."""
    found = os.fstat(directory)
    inode = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks") as locks:
        for line in locks:
            parts = line.split()
            if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == inode and parts[4] != "0":
                return parts[4]  # 0: a process in another pid namespace
    return None


def check_not_dangling(state_dir: Path, refused: str, again: str) -> None:
    """Refuse (StateDirError, saying `refused` first) a state dir whose path runs through a symbolic link to nothing,
    as one to a volume that is not mounted does: making it would fail with only "File exists", naming neither the
    link nor where it points. `again`: the command to run once the volume is back ("start again")."""
    link = next((p for p in (state_dir, *state_dir.parents) if p.is_symlink() and not p.exists()), None)
    if link is not None:
        raise _dangling(refused, link, f"mount the volume it is on (or make the directory it names), then {again}")


def check_database_not_dangling(state_dir: Path, refused: str, advice: str) -> None:
    """Refuse (StateDirError, saying `refused` first, then `advice`) a state dir whose `silod.db` is a symbolic link
    to no file, as one to a database on a volume that is not mounted is: SQLite would make a new, empty database
    there (or on the disk under the mount point), and a restore would replace the link, moving the state off its
    volume for good."""
    database = state_dir / DATABASE_NAME
    if database.is_symlink() and not database.exists():
        raise _dangling(refused, database, advice)


def _dangling(refused: str, link: Path, advice: str) -> StateDirError:
    return StateDirError(
        f"{refused}: {link} is a symbolic link to {os.readlink(link)}, which does not exist (on a volume that is "
        f"not mounted?); nothing was changed: {advice}"
    )


def check_files(state_dir: Path) -> None:
    """Refuse (StateDirError) a state dir whose files SQLite must not open as they are, changing nothing: one that
    an interrupted restore left, one whose database the file system emptied or whose link names no file, one
    holding a log without its database or one whose header is damaged. Raise OSError, naming the file, for a file
    (or the directory) this process may not write."""
    database = state_dir / DATABASE_NAME
    refused = f"cannot use state dir {state_dir}"
    check_restore_finished(state_dir, refused)
    check_database_not_dangling(
        state_dir,
        refused,
        "mount the volume (or put back the file it names), then start again; or delete the link to start with "
        "an empty state",
    )
    files = files_of(database)
    if not database.exists():
        for log in (files.log, files.journal):
            if log.exists() and log.stat().st_size > 0:
                raise StateDirError(
                    f"{refused}: {log} is there without {database}, whose log it is (the database was deleted or "
                    f"moved), and SQLite would write its changes into a new one; nothing was changed: put {database} "
                    f"back, or move {log} aside to start with an empty state"
                )
        _check_writable(state_dir)
        return
    _check_writable(state_dir, files.database, files.log, files.index)
    if database.stat().st_size == 0:
        raise StateDirError(
            f"{refused}: {database} is empty (0 bytes), as silod never leaves it (it makes a database whole before "
            "naming it so): the file system lost its contents (a power loss before the disk wrote them, a disk "
            "fault); nothing was changed: restore the state dir from a backup (silod datamgr restore), or delete "
            f"{database} to start with an empty state"
        )
    check_log(database, refused)


def check_log(database: Path, refused: str) -> None:
    """Refuse (StateDirError, saying `refused` first) a database whose write-ahead log holds changes SQLite would not
    replay, its header damaged (`wal.header_problem`): SQLite would serve what the database alone holds, without a
    word, and overwrite the log at the first change; a backup would copy that older state and call it whole."""
    log = files_of(database).log
    try:
        problem = header_problem(log)
    except FileNotFoundError:
        return
    if problem is not None:
        raise StateDirError(
            f"{refused}: {log}, the write-ahead log of {database}, is damaged: {problem}; SQLite would not replay "
            f"the changes it holds (every change since the log was last folded into {database.name}) and would "
            "serve an older state; nothing was changed: restore the state dir from a backup (silod datamgr "
            f"restore), or move {log} aside to start from what {database} alone holds"
        )


def check_restore_finished(state_dir: Path, refused: str) -> None:
    """Refuse (StateDirError, saying `refused` first) a state dir that a restore left between its old database and
    the restored one: this silod's (its copy, `silod.db.restoring`, beside the database), whether the restore still
    runs (it holds the state dir) or was interrupted, or an older silod's interrupted one (a half copy in `silod.db`
    with its hot rollback journal, which SQLite would roll back to an empty database)."""
    database = state_dir / DATABASE_NAME
    files = files_of(database)
    restoring = restoring_copy(files)
    if any(os.path.lexists(f"{restoring}{suffix}") for suffix in ("", *LOG_SUFFIXES)):
        running = _other_holder(state_dir)
        if running is not None:
            raise StateDirError(
                f"{refused}: a restore into it is under way (pid {running}; {restoring} is its copy, not yet whole); "
                "nothing was changed: wait for it to finish, then try again"
            )
        raise StateDirError(
            f"{refused}: a restore into it was interrupted ({restoring} is its unfinished copy); nothing was changed: "
            f"run the restore again (silod datamgr restore --state-dir {state_dir} BACKUP), which keeps the database "
            f"it replaces as {files.database.name}.replaced-TIME, as a restore that completes does"
        )
    if database.exists() and files.journal.exists() and files.journal.stat().st_size > 0:
        journal = files.journal
        replaced = replaced_databases(files)
        kept = f"; the database it replaced is kept as {replaced[-1]}" if replaced else ""
        raise StateDirError(
            f"{refused}: {database} is an unfinished copy, with a rollback journal ({journal}) beside it, as a restore "
            "by a silod before this one leaves when it is interrupted: SQLite would roll it back to an empty "
            f"database{kept}; nothing was changed: run the restore again (silod datamgr restore --state-dir "
            f"{state_dir} BACKUP)"
        )


def _check_writable(state_dir: Path, *files: Path) -> None:
    """Raise OSError naming the first of the directory and `files` (those that exist) that this process cannot
    write, and a database it cannot make private to its owner: SQLite itself says only "unable to open database
    file" or "attempt to write a readonly database", naming none."""
    if not os.access(state_dir, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(state_dir))
    for path in files:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            make_private(path, os.fstat(fd).st_mode, fd)  # dataset options may hold credentials
        finally:
            os.close(fd)


def _other_holder(state_dir: Path) -> str | None:
    """The pid of another process that holds `state_dir` (`lock_state_dir`), read from /proc/locks without taking
    the lock; None if none does, or if it cannot be told."""
    try:
        directory = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        holder = _holder_of_directory(directory)
    finally:
        os.close(directory)
    return None if holder == str(os.getpid()) else holder


def restoring_copy(files: DatabaseFiles) -> Path:
    """The copy a restore writes before it renames it over the database of `files` (backup.py), beside the file a
    linked `silod.db` names, for the rename to stay on its volume: while it is there, the state dir is between its
    old database and the restored one."""
    return files.database.with_name(f"{files.database.name}.restoring")


def replaced_databases(files: DatabaseFiles) -> list[Path]:
    """The databases restores replaced (not their logs), kept beside the database of `files` as
    `silod.db.replaced-TIME`, oldest first."""
    prefix = f"{files.database.name}.replaced-"

    def order(path: Path) -> tuple[str, int]:
        stamp, _, count = path.name[len(prefix) :].partition("-")  # TIME, then -2, -3... (`_unused_name`)
        return stamp, int(count) if count.isdigit() else 1

    found = [
        path
        for path in files.database.parent.glob(f"{prefix}*")
        if not path.name.endswith(LOG_SUFFIXES) and path.is_file()
    ]
    return sorted(found, key=order)


def access_advice(state_dir: Path, exc: OSError) -> str:
    """What to do about `exc`, an error opening or locking a file of `state_dir`: "FILE: strerror; ..."."""
    said = failure_text(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{said}; nothing was changed: {ownership_advice(state_dir, 'the state dir', 'the data manager', 'it')}"
    if exc.errno == errno.EROFS:
        return (
            f"{said}; nothing was changed: repair the disk and mount it read-write, then start the data manager again"
        )
    return said
