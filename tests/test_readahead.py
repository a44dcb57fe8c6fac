"""The kernel's read-ahead on a silod mount: found by the mount table, set on real mounts, refused when odd."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuseclient.readahead import NotMounted, check_read_ahead, mount_device
from tests import polling
from tests.mount_fixtures import MountFactory

MOUNTINFO = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
80 22 0:52 / /mnt/with\\040space rw,nosuid,nodev,relatime shared:40 - fuse.silod silod ro,user_id=0
81 22 0:53 / /mnt/other rw,relatime shared:41 - fuse.sshfs host: rw
82 22 0:54 / /mnt/stacked rw,nosuid,nodev,relatime shared:42 - fuse.silod silod ro,user_id=0
83 82 0:55 / /mnt/stacked rw,nosuid,nodev,relatime shared:43 - fuse.silod silod ro,user_id=0
"""


@pytest.fixture
def mountinfo(tmp_path: Path) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return path


def test_the_device_comes_from_the_mount_table_with_escaped_paths_and_the_top_mount(mountinfo: Path) -> None:
    assert mount_device(Path("/mnt/with space"), mountinfo) == "0:52"
    assert mount_device(Path("/mnt/stacked"), mountinfo) == "0:55"


@pytest.mark.parametrize("mountpoint", ["/", "/mnt/other", "/mnt/absent", "/mnt/with"])
def test_a_mount_point_without_a_silod_mount_is_refused(mountinfo: Path, mountpoint: str) -> None:
    with pytest.raises(NotMounted, match=f"{mountpoint} carries no fuse.silod mount"):
        mount_device(Path(mountpoint), mountinfo)


@pytest.mark.parametrize("size", [-1024, 1000, 1536 + 1])
def test_a_window_that_is_not_whole_kib_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"read-ahead {size} B must be a whole number of KiB"):
        check_read_ahead(size)


def _dataset(tmp_path: Path) -> str:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "one.bin").write_bytes(b"1" * 1000)
    return f"file://{tmp_path / 'data'}"


def _read_ahead_kb(mountpoint: Path) -> int:
    return int((Path("/sys/class/bdi") / mount_device(mountpoint) / "read_ahead_kb").read_text())


@pytest.mark.parametrize(("args", "expected_kb"), [((), 1024), (("--kernel-read-ahead", "256KiB"), 256)])
def test_a_mount_sets_the_kernel_read_ahead(
    mount_factory: MountFactory, tmp_path: Path, args: tuple[str, ...], expected_kb: int
) -> None:
    mount = mount_factory({"job": _dataset(tmp_path)}, *args)
    polling.eventually(lambda: _read_ahead_kb(mount.mountpoint) == expected_kb, what=f"read_ahead_kb {expected_kb}")


def test_a_zero_window_leaves_the_kernel_default(mount_factory: MountFactory, tmp_path: Path) -> None:
    mount = mount_factory({"job": _dataset(tmp_path)}, "--kernel-read-ahead", "0")
    assert _read_ahead_kb(mount.mountpoint) == 128  # FUSE_INIT's agreed window on Linux
    mount.stop()
    assert "kernel read-ahead" not in mount.log_path.read_text()  # it never tried, now or later
