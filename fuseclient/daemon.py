"""Process plumbing of the FUSE client: the mountpoint made ready (a dead mount detached, a live one refused), who
owns a mount, the open-file limit, detaching into a daemon with its log (reopened on SIGHUP), and unmounting."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import resource
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from fuseclient.readahead import MOUNTINFO, NotMounted, mount_device, silod_mount_entry

log = logging.getLogger(__name__)

ReadyCallback = Callable[[], None]  # called once the mount serves: a detached daemon's parent may then exit

# What a detached daemon tells its parent through the pipe: it serves, or it failed and why.
_READY = b"1"
_FAILED = b"!"  # followed by the reason
_REASON_BYTES = 4096  # well under a pipe's buffer: the write never waits for the parent


def raise_open_file_limit(ids: Mapping[str, str]) -> None:
    """Raise this process's soft limit on open files to its hard limit.

    Every concurrent reader holds a cache file, a backend connection or both, and a node serves the data
    loaders of all its jobs: the soft limit a service manager hands out (often 1,024) is far below the hard
    one, and running out fails reads with EIO. Go's runtime does the same for every Go program since 1.19; an
    unlimited hard limit is left alone rather than turned into an unbounded soft one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log.info("open files limit raised from %d to %d", soft, hard, extra=ids)


M_MMAP_THRESHOLD = -3  # glibc's mallopt(3) parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting threshold, kept fixed
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"


def return_freed_buffers(ids: Mapping[str, str]) -> None:
    """Have glibc's malloc hand blocks of 128 KiB and more back to the system as soon as they are freed.

    A node's items (up to a chunk, 4 MiB) are fetched into buffers allocated in the fetching threads, so across
    glibc's per-thread arenas. After the first large block is freed, glibc raises its mmap threshold to that
    block's size (its dynamic threshold), and from then on such buffers come from the arenas, which keep what is
    freed at their tops: a soak of job churn grew an agent from 56 to 211 MB with 20 MB of it in use, where with
    the threshold fixed at 128 KiB it stayed at 128 MB. Setting the threshold turns the dynamic one off. An
    operator's own MALLOC_MMAP_THRESHOLD_ is left as it is; so is a C library without mallopt (musl)."""
    if os.environ.get(MMAP_THRESHOLD_ENV) is not None:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.info("malloc's mmap threshold could not be set; freed item buffers may stay with the process", extra=ids)


def prepare_mountpoint(mountpoint: Path) -> None:
    """Make sure `mountpoint` is a directory to mount on; raise OSError (e.g. NotADirectoryError) if not.

    A daemon killed with SIGKILL leaves its mount behind, dead ("transport endpoint is not connected"); it is
    detached here, so that a restarted daemon can mount there again. A live silod mount is refused (EBUSY):
    mounting over it would hide it from its jobs while its daemon goes on serving nobody.
    """
    try:
        os.listdir(mountpoint)  # not stat: the kernel may answer that from cached attributes
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise
        log.info("%s is a dead mount left by a previous run; detaching it", mountpoint)
        unmount(mountpoint, lazy=True)
        if not mountpoint.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(mountpoint)) from None
        return
    if has_silod_mount(mountpoint):  # its directory answered above, so the mount is live
        raise OSError(errno.EBUSY, f"is a live silod mount; unmount it first (silod umount {mountpoint})")


def has_silod_mount(mountpoint: Path) -> bool:
    """Whether the kernel's mount table has a silod mount at `mountpoint`: a live one, or one a killed daemon
    left dead (the table lists it until it is unmounted)."""
    try:
        mount_device(Path(os.path.realpath(mountpoint)))
    except NotMounted:
        return False
    return True


def mount_owner(mountpoint: Path, mountinfo: Path = MOUNTINFO) -> int | None:
    """The user id of whoever mounted the silod mount at `mountpoint` (the `user_id` the kernel's mount table shows
    for a FUSE mount), or None if the table has no silod mount there. The mount stacked last wins, as the kernel
    shows it."""
    entry = silod_mount_entry(Path(os.path.realpath(mountpoint)), mountinfo)
    found = None if entry is None else re.search(r"(?:^|,)user_id=(\d+)(?:,|$)", entry[1])
    return int(found.group(1)) if found else None


def open_log(log_file: Path) -> int:
    """A descriptor appending to `log_file`, made 0600 when it is new; OSError if it cannot be opened for writing."""
    return os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


def _log_to(log_file: Path) -> None:
    """Send this process's stdout and stderr (where its log handler writes) to the end of `log_file`."""
    _log_into(open_log(log_file))


def _log_into(log_fd: int) -> None:
    """Send this process's stdout and stderr to `log_fd`, which is closed."""
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def _reopen_log(log_file: Path) -> None:
    """SIGHUP to a detached daemon: logrotate's signal to reopen the log it has just renamed. The default
    action would kill the daemon and leave its jobs a dead mount; a log that cannot be reopened (its
    directory gone) keeps the old one."""
    try:
        _log_to(log_file)
    except OSError as exc:
        log.warning("SIGHUP: could not reopen the log %s, still writing to the old one: %s", log_file, exc)
        return
    log.info("SIGHUP: reopened the log %s", log_file)


def unmount(mountpoint: Path, *, lazy: bool = False) -> None:
    """Unmount with fusermount3 (works for root and for the user who mounted); raises OSError with its reason."""
    command = ["fusermount3", "-u", *(["-z"] if lazy else []), str(mountpoint)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        reason = result.stderr.strip() or f"fusermount3 exited with {result.returncode}"
        if "busy" in reason.lower():
            reason += " (files are open in it; close them or use --lazy)"
        raise OSError(reason)


def run_detached(
    main: Callable[[ReadyCallback], None], log_file: Path, log_fd: int, expected: tuple[type[Exception], ...] = ()
) -> str | None:
    """Run `main(on_ready)` in a daemon process logging to `log_fd`, `log_file` opened (`open_log`, before this, so
    that a log that cannot be written is refused on the terminal); `log_fd` is closed here. Returns None once `main`
    calls `on_ready`; if it dies first, why: the message of an `expected` exception (logged as one line), or "" for
    anything else (its traceback is in the log), so that the parent can tell the terminal what went wrong rather
    than only where to look."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(log_fd)
        os.close(ready_write)
        with os.fdopen(ready_read, "rb") as pipe:
            signal_byte = pipe.read(1)
            reason = pipe.read().decode(errors="replace") if signal_byte == _FAILED else ""
        if signal_byte == _READY:
            return None
        os.waitpid(pid, 0)
        return reason
    os.close(ready_read)
    os.setsid()
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    _log_into(log_fd)
    signal.signal(signal.SIGHUP, lambda signum, frame: _reopen_log(log_file))
    pending = [ready_write]  # the pipe, until the parent has been told how the start went

    def tell_parent(message: bytes) -> None:
        if pending:
            fd = pending.pop()
            os.write(fd, message)
            os.close(fd)

    try:
        main(lambda: tell_parent(_READY))
    except expected as exc:
        log.error("mount failed: %s", exc)
        tell_parent(_FAILED + str(exc).encode()[:_REASON_BYTES])
        os._exit(1)
    except BaseException:
        log.exception("mount failed")
        os._exit(1)
    os._exit(0)
