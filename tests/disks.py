"""Real disks a test can fill up, pull away or read from cold: file systems mounted for the test (tmpfs, or
ext4 on a loop device) and unmounted after it; and, where the kernel cannot be made to, a faked flush failure.
Also a directory other users may enter (`shared_dir`), for tests of what they can read."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.storage_servers import missing_dependency

TmpfsFactory = Callable[[Path, str], Path]
Ext4Factory = Callable[[Path, int], Path]


class _Mounts:
    """File systems mounted by one test, unmounted (lazily if still busy) in reverse order at its end."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []

    def run(self, command: list[str], what: str) -> None:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            missing_dependency(f"cannot {what} here: {result.stderr.strip()}")

    def mount(self, command: list[str], path: Path, what: str) -> Path:
        if os.geteuid() != 0:
            missing_dependency(f"{what} needs root")
        path.mkdir(parents=True, exist_ok=True)
        self.run([*command, str(path)], what)
        self.mounted.append(path)
        return path

    def unmount_all(self) -> None:
        for path in reversed(self.mounted):
            if os.path.ismount(path) and subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's own temporary directories are private to the user running it)."""
    path = Path(tempfile.mkdtemp(prefix="silod-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def tmpfs() -> Iterator[TmpfsFactory]:
    """`mount(path, size)` puts a tmpfs of `size` (mount's syntax: "512k", "16m") at `path` and returns it.

    Ask for this fixture before daemons that use the disk (`mount_factory`, a data manager), so that its
    teardown, which unmounts (lazily if the disk is still busy), runs after theirs.
    """
    mounts = _Mounts()

    def mount(path: Path, size: str) -> Path:
        command = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs"]
        return mounts.mount(command, path, "mounting a tmpfs")

    yield mount
    mounts.unmount_all()


@pytest.fixture
def ext4() -> Iterator[Ext4Factory]:
    """`mount(path, size_bytes)` puts a fresh ext4 on a loop device at `path` (its image beside it) and returns
    it: a block-device file system, whose reads come from the disk once a file's pages are dropped and which
    answers `RWF_NOWAIT` reads, as a node's cache disk does and tmpfs does not. Teardown as `tmpfs`'s."""
    mounts = _Mounts()

    def mount(path: Path, size_bytes: int) -> Path:
        image = _image_of(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(image, "wb") as file:
            file.truncate(size_bytes)
        mounts.run(["mkfs.ext4", "-q", "-F", str(image)], "make an ext4 file system")
        return mounts.mount([*_MOUNT_EXT4, str(image)], path, "mounting an ext4 image on a loop device")

    yield mount
    mounts.unmount_all()


# errors=remount-ro, as a production disk is mounted: the first error makes the file system refuse writes.
_MOUNT_EXT4 = ("mount", "-o", "loop,errors=remount-ro")


def _image_of(disk: Path) -> Path:
    return disk.with_name(disk.name + ".img")


def fail_ext4(disk: Path) -> None:
    """Make the ext4 that `ext4` mounted at `disk` meet an error, as a failing disk's does: from then on it
    refuses every write (EROFS, ext4's emergency read-only) until it is unmounted, checked and mounted again
    (`repair_ext4`). Reads go on. The kernel's own knob for this (/sys/fs/ext4/DEV/trigger_fs_error) runs
    ext4's real error path; nothing is faked."""
    device = subprocess.run(["findmnt", "-no", "SOURCE", str(disk)], capture_output=True, text=True).stdout.strip()
    trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
    if not device or not trigger.exists():
        missing_dependency(f"cannot make ext4 at {disk} fail here: no {trigger} (a kernel of 5.10 or later has it)")
    trigger.write_text("silod test: a failing disk\n")


def repair_ext4(disk: Path) -> None:
    """What an operator does for a disk `fail_ext4` failed, once nothing uses it: unmount, check, mount again."""
    subprocess.run(["umount", str(disk)], check=True)
    image = _image_of(disk)
    check = subprocess.run(["e2fsck", "-f", "-y", str(image)], capture_output=True, text=True)
    assert check.returncode in (0, 1), f"e2fsck exited {check.returncode}: {check.stdout}{check.stderr}"  # 1: fixed
    subprocess.run([*_MOUNT_EXT4, str(image), str(disk)], check=True)


def fill_up(disk: Path) -> Path:
    """Write a file into `disk` until its file system refuses another byte (ENOSPC); returns the file, which the
    test deletes to free the disk."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as file:
        while file.write(b"\0" * 4096):
            file.flush()
    return filler


class PosixFaults:
    """Make calls of one process fail with EIO, as a disk that answers an I/O error and stays usable (a transient
    fault, a bad sector) makes them, or with another error (EMFILE: a process out of descriptors). FAKED: the
    kernel cannot be made to do that here (no device-mapper for dm-flakey, no fail_make_request), so libfiu's
    wrappers of the calls, preloaded into the process (`launcher`), answer instead of the kernel while told to
    (`fiu-ctrl`). Every other call reaches the real file system."""

    FLUSHES = "posix/io/sync/*"  # fsync, fdatasync
    PREADS = "posix/io/rw/pread"
    OPENS = "posix/io/oc/open"

    def __init__(self) -> None:
        if shutil.which("fiu-run") is None or shutil.which("fiu-ctrl") is None:
            missing_dependency("libfiu's fiu-run and fiu-ctrl are not installed (Debian package fiu-utils)")
        self.pid = 0

    @property
    def launcher(self) -> list[str]:
        """The command prefix that starts a process this can fail (set `pid` to it once started)."""
        return ["fiu-run", "-x"]

    def fail_next(self, calls: str, error: int = errno.EIO) -> None:
        """Fail the process's next call of `calls` (one of the names above) only, with `error`."""
        self._control(f"enable name={calls},failinfo={error},onetime=1")

    def fail_every(self, calls: str) -> None:
        """Fail every call of `calls` until `heal`."""
        self._control(f"enable name={calls},failinfo={errno.EIO}")

    def heal(self, calls: str) -> None:
        self._control(f"disable name={calls}")

    def _control(self, command: str) -> None:
        assert self.pid, "start the process under `launcher` and set `pid` first"
        subprocess.run(["fiu-ctrl", "-c", command, str(self.pid)], check=True, capture_output=True, timeout=10)
