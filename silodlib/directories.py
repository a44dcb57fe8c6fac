"""Making the directories a daemon or a run writes into, with errors that say what is in the way, and flushing
their entries to disk."""

from __future__ import annotations

import errno
import os
import pwd
from pathlib import Path


def make_directory(path: Path, mode: int = 0o777) -> None:
    """`mkdir -p path`. Raises OSError; where a file stands at `path` or above it, one whose `strerror` names
    that file ("/srv/x is not a directory"), where mkdir's own says only "File exists" or "Not a directory"."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is None:
            raise
        raise NotADirectoryError(errno.ENOTDIR, f"{blocker} is not a directory", str(path)) from None


def fsync_directory(path: Path) -> None:
    """Flush the directory `path` to disk, so that the creations, renames and deletions of its entries survive a
    power loss (a file's own fsync does not cover its name). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def user_name(uid: int) -> str:
    """The login name of `uid`, or its number where the password database has none: what `chown` takes, and what
    a message names a user by."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def failure_text(exc: OSError, named: Path | None = None) -> str:
    """`exc`'s reason after the file it is about ("FILE: reason"), unless the reason names it already or it is
    `named`, which the message names before it."""
    reason = exc.strerror or str(exc)
    if exc.filename and str(exc.filename) not in reason and str(exc.filename) != str(named):
        return f"{exc.filename}: {reason}"
    return reason


def ownership_advice(directory: Path, what: str, runner: str, rerun: str) -> str:
    """What to do about a permission `directory`'s files refused this process: `what` (the state dir, the cache
    dir) given to the user `runner` (the program) runs as, or `rerun` (it) run as their owner. Most often files an
    earlier run as another user (root) left."""
    return (
        f"give {what} and its files to the user {runner} runs as (chown -R {user_name(os.geteuid())} {directory}), "
        f"or run {rerun} as the user that owns them"
    )
