"""Making the directories a daemon or a run writes into, with errors that say what is in the way, and flushing
their entries to disk."""

from __future__ import annotations

import errno
import os
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
