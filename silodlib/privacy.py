"""What a daemon writes under its cache dir is its own user's alone: directories 0700, files 0600, whatever the umask.
(The data manager's database, which holds datasets' credentials, is made private the same way: `make_private`.)

The cache holds dataset bytes, and the mount serves them to its own user only (without `--allow-other`), or to the
users a job's pod runs as: a cache readable by all would hand any local user what the mount refuses them. A cache
dir and dataset directories an older silod made readable by others are made private again when a daemon opens them
(the directories only: a file below a private directory is out of other users' reach, so the millions of item
files need not be visited). Nothing here decides what goes in the cache; `cache_disk` and `assembly` call it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from silodlib.directories import make_directory

PRIVATE_DIRECTORY = 0o700
PRIVATE_FILE = 0o600
OTHERS = 0o077  # the group's and other users' permission bits


def make_private_directory(path: Path) -> int | None:
    """`mkdir -p path`, the directory itself made 0700 (its missing parents get the usual modes, as `mkdir -p` gives
    them), or made private if it is there with bits for others. Returns the mode it had when it had to be made
    private, else None. Raises OSError, with "(making it private to its owner)" in its `strerror` when the chmod
    is what failed (a directory another user owns, a read-only file system)."""
    make_directory(path, PRIVATE_DIRECTORY)
    return make_private(path, os.stat(path).st_mode)


def make_private(path: str | Path, mode: int, fd: int | None = None) -> int | None:
    """Take the bits for others away from `path`, whose `st_mode` is `mode` (through `fd`, open on it, if given: no
    path lookup that a rename could redirect); the owner's bits stay as they are. Returns the permission bits it had
    when they changed, else None. Raises OSError as `make_private_directory`, naming `path`."""
    bits = stat.S_IMODE(mode)
    if not bits & OTHERS:
        return None
    try:
        os.chmod(path if fd is None else fd, bits & ~OTHERS)
    except OSError as exc:
        raise type(exc)(exc.errno, f"{exc.strerror} (making it private to its owner)", str(path)) from None
    return bits
