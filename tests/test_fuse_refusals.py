"""Why FUSE refuses a mount, and whose mount is in the way, told in one line with the fix: the checks a daemon runs
before mounting, and the messages of the refusals that need another user than root (this suite's) to happen."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fuseclient import assembly
from fuseclient.daemon import mount_owner
from fuseclient.fuse_refusals import fuse_refusal, kernel_refusal, may_mount_directly, user_allow_other
from silodcli.fuse_client import _log_refusal, _mountpoint_refusal
from silodcli.umount import foreign_mount
from silodlib.directories import user_name

USER = 1000  # a user other than root, as fusermount3 sees one
OPENABLE = Path("/dev/null")  # stands in for /dev/fuse: the device checks open it read-write
ME = user_name(os.geteuid())  # the suite's user, root


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    """/etc/fuse.conf as the fuse3 package installs it: the option commented out."""
    path = tmp_path / "fuse.conf"
    path.write_text("# user_allow_other - lets users use allow_other\n\n#user_allow_other\n#mount_max = 1000\n")
    return path


def test_a_fuse_device_that_is_missing_or_cannot_be_opened_is_named_with_the_fix(tmp_path: Path) -> None:
    missing = fuse_refusal(tmp_path, False, uid=0, direct=True, device=tmp_path / "fuse")
    assert missing == (
        f"FUSE is not available: {tmp_path / 'fuse'}: No such file or directory; load the kernel's fuse module "
        f"(modprobe fuse) or, in a container, pass the device in (--device {tmp_path / 'fuse'})"
    )
    unopenable = fuse_refusal(tmp_path, False, uid=0, direct=True, device=tmp_path)  # a directory: EISDIR
    assert unopenable == f"cannot open {tmp_path}: Is a directory; FUSE needs it readable and writable by {ME}"


def test_allow_other_without_user_allow_other_is_refused_for_a_user_other_than_root_only(
    tmp_path: Path, conf: Path
) -> None:
    def refusal(allow_other: bool = True, uid: int = USER, direct: bool = False) -> str | None:
        return fuse_refusal(tmp_path, allow_other, uid=uid, direct=direct, device=OPENABLE, fuse_conf=conf)

    assert refusal() == (
        f"--allow-other needs user_allow_other in {conf} for a user other than root: add that line to {conf}, "
        "or drop --allow-other"
    )
    assert refusal(allow_other=False) is None
    assert refusal(uid=0) is None  # fusermount3 lets root use it
    assert refusal(direct=True) is None  # a process with CAP_SYS_ADMIN mounts without fusermount3
    conf.write_text("  user_allow_other   # users may\n")
    assert user_allow_other(conf) and refusal() is None
    assert not user_allow_other(tmp_path / "missing.conf")


def test_a_mountpoint_fusermount3_would_refuse_a_user_is_named_with_the_fix(tmp_path: Path) -> None:
    unwritable = Path("/proc/1")  # one even root may not write to, as a user's mountpoint may be
    user = user_name(USER)
    assert fuse_refusal(unwritable, False, uid=USER, direct=False, device=OPENABLE) == (
        f"{user} has no write access to mountpoint /proc/1, which fusermount3 requires of a user other than root: "
        f"mount on a directory of {user}'s, or give {user} write access to it"
    )
    assert fuse_refusal(unwritable, False, uid=0, direct=False, device=OPENABLE) is None
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    refusal = fuse_refusal(sticky, False, uid=USER, direct=False, device=OPENABLE)
    assert refusal is not None and refusal.startswith(f"mountpoint {sticky} is a sticky directory {ME} owns")


def test_a_process_mounts_directly_only_with_cap_sys_admin(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapEff:\t000001ffffffffff\n")
    assert may_mount_directly(status)
    status.write_text("Name:\tpython\nCapEff:\t00000000a80425fb\n")  # docker's default root: no CAP_SYS_ADMIN
    assert not may_mount_directly(status)


def test_a_refused_mount_quotes_the_line_libfuse_wrote_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    def refused() -> None:
        os.write(2, b"a log line of another thread\nfuse: mount failed: Invalid argument\n")
        raise RuntimeError("fuse_session_mount failed")

    assert kernel_refusal(refused) == (
        "the kernel refused the FUSE mount (fuse_session_mount failed): fuse: mount failed: Invalid argument"
    )
    assert capfd.readouterr().err == "a log line of another thread\n"

    def mounted() -> None:
        os.write(2, b"fuse: a warning of a mount that worked\n")

    assert kernel_refusal(mounted) is None
    assert capfd.readouterr().err == "fuse: a warning of a mount that worked\n"


MOUNTINFO = """\
36 27 0:31 / /tmp/x/rootmnt2 ro,nosuid,nodev,relatime shared:1 - fuse.silod silod ro,user_id=0,group_id=0
37 27 0:32 / /home/u/a\\040mount ro,nosuid,nodev,relatime - fuse.silod silod ro,user_id=1000,group_id=1000
38 27 0:33 / /home/u/other ro,relatime - fuse.sshfs host: rw,user_id=1000,group_id=1000
"""


def test_the_owner_of_a_silod_mount_comes_from_the_mount_table(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    assert mount_owner(Path("/tmp/x/rootmnt2"), table) == 0
    assert mount_owner(Path("/home/u/a mount"), table) == 1000
    assert mount_owner(Path("/home/u/other"), table) is None  # not a silod mount
    assert mount_owner(Path("/home/u"), table) is None


def test_umount_of_another_users_mount_says_whose_it_is_and_who_can_unmount_it() -> None:
    refusal = foreign_mount(Path("/tmp/x/rootmnt2"), USER, 0)
    assert refusal is not None
    assert refusal.startswith("/tmp/x/rootmnt2 is root's silod mount (uid 0), not ")
    assert refusal.endswith(": only root can unmount it (sudo silod umount /tmp/x/rootmnt2); nothing unmounted")
    assert foreign_mount(Path("/m"), 0, USER) is None  # root unmounts any mount
    assert foreign_mount(Path("/m"), USER, USER) is None
    assert foreign_mount(Path("/m"), USER, None) is None  # the table does not say: fusermount3 answers


def test_a_mountpoint_another_users_mount_hides_says_so_and_who_can_unmount_it() -> None:
    denied = PermissionError(errno.EACCES, "Permission denied", "/home/u/mnt3")
    refusal = _mountpoint_refusal("mountpoint", Path("/home/u/mnt3"), denied, USER, 0)
    assert refusal == (
        "mountpoint /home/u/mnt3 cannot be checked (listing it: Permission denied): it is a silod mount of root's, "
        "live or dead, which only root can unmount: as root, run silod umount /home/u/mnt3 (or fusermount3 -u "
        "/home/u/mnt3)"
    )
    refusal = _mountpoint_refusal("--mountpoint", Path("/srv/m"), denied, USER, None)
    assert refusal.startswith("--mountpoint /srv/m cannot be checked (listing it: Permission denied): give ")
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "/srv/m")
    assert (
        _mountpoint_refusal("mountpoint", Path("/srv/m"), missing, USER, None) == "mountpoint /srv/m is not a directory"
    )


def test_a_cache_dir_file_another_user_owns_is_named_with_the_fix() -> None:
    denied = PermissionError(errno.EACCES, "Permission denied", "/tmp/x/rc2/silod.lock")
    refusal = assembly.cache_dir_refusal(Path("/tmp/x/rc2"), denied)
    assert refusal == (
        "cannot use --cache-dir /tmp/x/rc2: /tmp/x/rc2/silod.lock: Permission denied; give the cache dir and its "
        f"files to the user silod runs as (chown -R {ME} /tmp/x/rc2), or run silod as the user that owns them"
    )
    in_the_way = NotADirectoryError(errno.ENOTDIR, "/srv/c is not a directory", "/srv/c/cache")
    assert assembly.cache_dir_refusal(Path("/srv/c/cache"), in_the_way) == (
        "cannot use --cache-dir /srv/c/cache: /srv/c is not a directory"
    )


def test_a_log_file_another_user_owns_is_named_with_the_fix(tmp_path: Path) -> None:
    log_file = tmp_path / "mount.log"
    log_file.touch()
    denied = PermissionError(errno.EACCES, "Permission denied", str(log_file))
    assert _log_refusal(log_file, denied) == (
        f"cannot write the log {log_file}: Permission denied; give the file to {ME} (chown {ME} {log_file}), "
        "or choose another --log-file"
    )
    assert _log_refusal(tmp_path / "new.log", denied).endswith(f"; choose a --log-file in a directory {ME} can write")
