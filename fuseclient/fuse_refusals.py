"""Why FUSE would refuse a mount, or did: what libfuse and fusermount3 check, checked before mounting, and their own
line caught when they refuse anyway. Both write their reasons to file descriptor 2 and hand back a bare failure
("fuse_session_mount failed"), which would leave a daemon's log with a traceback and its terminal with no reason."""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from silodlib.directories import user_name

FUSE_DEVICE = Path("/dev/fuse")
FUSE_CONF = Path("/etc/fuse.conf")  # fusermount3's configuration: `user_allow_other` lets users use allow_other
CAP_SYS_ADMIN = 21  # linux/capability.h: what mount(2) asks of a process


def may_mount_directly(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process may call mount(2) itself (CAP_SYS_ADMIN), as libfuse tries first: root, as a rule. A
    process that may not mounts through fusermount3, which checks the user's rights first (`fuse_refusal`)."""
    try:
        text = status.read_text()
    except OSError:
        return os.geteuid() == 0
    found = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", text, re.MULTILINE)
    return bool(found and int(found.group(1), 16) >> CAP_SYS_ADMIN & 1)


def fuse_refusal(
    mountpoint: Path,
    allow_other: bool,
    *,
    uid: int,
    direct: bool,
    device: Path = FUSE_DEVICE,
    fuse_conf: Path = FUSE_CONF,
) -> str | None:
    """Why FUSE would refuse to mount at `mountpoint`, in one line naming the fix; None if none of the refusals
    checked here applies. Checked before mounting because libfuse and fusermount3 do not raise theirs: they write
    them to file descriptor 2 and return a bare failure ("fuse_session_mount failed").

    Only what they check, the way they check it: whether `device` opens for reading and writing (libfuse opens it
    before anything else, for every user). A process that cannot mount `direct`ly (without CAP_SYS_ADMIN) and is not
    root (real user id `uid`) goes through fusermount3, which also requires that the user may write to `mountpoint`
    (and own it, if it is a sticky directory such as /tmp), and that `fuse_conf` has `user_allow_other` for
    `allow_other`."""
    try:
        os.close(os.open(device, os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
            return (
                f"FUSE is not available: {device}: {exc.strerror}; load the kernel's fuse module (modprobe fuse) "
                f"or, in a container, pass the device in (--device {device})"
            )
        said = f"cannot open {device}: {exc.strerror}; FUSE needs it readable and writable by {user_name(uid)}"
        if exc.errno not in (errno.EACCES, errno.EPERM):
            return said
        if uid == 0:
            return f"{said}: in a container, pass the device in (--device {device})"
        return f"{said}: give its users access (mode 0666, as the fuse3 package makes it), or run as root"
    if direct or uid == 0:
        return None
    try:
        info = os.stat(mountpoint)
    except OSError:
        return None  # the mountpoint was checked before: what went wrong since is for the mount to say
    if stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and info.st_uid != uid:
        return (
            f"mountpoint {mountpoint} is a sticky directory {user_name(info.st_uid)} owns, which fusermount3 lets "
            f"only its owner mount on: mount on a directory of {user_name(uid)}'s"
        )
    if not os.access(mountpoint, os.W_OK):
        return (
            f"{user_name(uid)} has no write access to mountpoint {mountpoint}, which fusermount3 requires of a user "
            f"other than root: mount on a directory of {user_name(uid)}'s, or give {user_name(uid)} write access to it"
        )
    if allow_other and not user_allow_other(fuse_conf):
        return (
            f"--allow-other needs user_allow_other in {fuse_conf} for a user other than root: add that line to "
            f"{fuse_conf}, or drop --allow-other"
        )
    return None


def user_allow_other(fuse_conf: Path = FUSE_CONF) -> bool:
    """Whether `fuse_conf` has a line `user_allow_other`, as fusermount3 reads it: a `#` starts a comment, and
    blanks around the word are ignored. A missing or unreadable file has none."""
    try:
        lines = fuse_conf.read_text(errors="replace").splitlines()
    except OSError:
        return False
    return any(line.partition("#")[0].strip() == "user_allow_other" for line in lines)


def kernel_refusal(mount: Callable[[], None]) -> str | None:
    """Call `mount` (`pyfuse3.init`): None once mounted, else why not in one line. libfuse and fusermount3 write
    their reason to file descriptor 2, not into the RuntimeError `mount` raises, so what is written there meanwhile
    is caught: their lines ("fuse: ...", "fusermount3: ...") are quoted in the reason, anything else written there
    (a log line of another thread) is passed on to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            mount()
            failure = None
        except RuntimeError as exc:  # pyfuse3's "fuse_session_mount failed" (or "fuse_session_new failed")
            failure = str(exc)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        lines = captured.read().decode(errors="replace").splitlines()
    quoted = [line.strip() for line in lines if failure is not None and line.startswith(("fuse:", "fusermount"))]
    sys.stderr.write("".join(f"{line}\n" for line in lines if line.strip() not in quoted))
    sys.stderr.flush()
    if failure is None:
        return None
    return f"the kernel refused the FUSE mount ({failure})" + (f": {'; '.join(quoted)}" if quoted else "")
