"""The kernel's read-ahead on a silod mount, which also sets the size of the FUSE read requests we serve.

The kernel reads a file ahead in requests of its read-ahead window, 128 KiB by default for a FUSE mount,
so a sequential reader of a large file costs the daemon one FUSE request (a trip through the event loop
and a reply copied into the kernel) per 128 KiB. A window of 1 MiB, the most one FUSE request carries
(256 pages), cuts those requests eightfold; the daemon fetches and caches whole 4 MiB items anyway, so a
larger window never adds remote IO. It is a setting of the mount's backing device in sysfs
(`/sys/class/bdi/<major>:<minor>/read_ahead_kb`), writable by root only, and it must be written after the
kernel's FUSE_INIT handshake, which lowers it to what the handshake agreed (128 KiB).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_READ_AHEAD = 1024 * 1024  # the largest FUSE read request: 256 pages of 4 KiB
FSTYPE = "fuse.silod"
SYSFS_BDI = Path("/sys/class/bdi")
MOUNTINFO = Path("/proc/self/mountinfo")


class NotMounted(OSError):
    """The mount point carries no silod mount (it went away, or was never ours)."""


def check_read_ahead(size: int) -> int:
    """`size` if it is a read-ahead window the kernel takes (a whole number of KiB, 0 for its default)."""
    if size < 0 or size % 1024:
        raise ValueError(f"read-ahead {size} B must be a whole number of KiB (0 keeps the kernel's default)")
    return size


def set_read_ahead(mountpoint: Path, size: int) -> Path:
    """Set the read-ahead window of the silod mount at `mountpoint` to `size` bytes; returns the sysfs file.

    Blocks until the mount answers (its FUSE_INIT handshake is over), so the daemon serving the mount must
    call this from another thread than the one serving requests. Raises `NotMounted` if `mountpoint` carries
    no silod mount, and OSError (PermissionError without root) if sysfs refuses the value.
    """
    os.stat(mountpoint)  # answered only once the kernel has finished FUSE_INIT
    setting = SYSFS_BDI / mount_device(mountpoint) / "read_ahead_kb"
    setting.write_text(str(size // 1024))
    return setting


def mount_device(mountpoint: Path, mountinfo: Path = MOUNTINFO) -> str:
    """The "major:minor" of the silod mount at `mountpoint`, from the kernel's mount table.

    Read from the table, not from `stat`: a mount point whose mount has gone shows the file system below it,
    and that file system's read-ahead is not ours to change.
    """
    entry = silod_mount_entry(mountpoint, mountinfo)
    if entry is None:
        raise NotMounted(f"{mountpoint} carries no {FSTYPE} mount")
    return entry[0]


def silod_mount_entry(mountpoint: Path, mountinfo: Path = MOUNTINFO) -> tuple[str, str] | None:
    """The "major:minor" and the super options (`user_id=0,...`) of the silod mount at exactly `mountpoint` in the
    kernel's mount table, or None if it has none there. The last one wins: mounts stacked on one point hide the
    earlier ones."""
    wanted = str(mountpoint)
    entry = None
    for line in mountinfo.read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, described = fields.split(), tail.split()
        if len(parts) >= 5 and described[:1] == [FSTYPE] and _unescape(parts[4]) == wanted:
            entry = parts[2], described[2] if len(described) >= 3 else ""
    return entry


def _unescape(field: str) -> str:
    r"""A mountinfo path: the kernel writes space, tab, newline and backslash as octal escapes (\040)."""
    for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, char)
    return field
