"""What a daemon writes under its cache dir is its own user's alone (directories 0700, files 0600, whatever the
umask): the cache holds dataset bytes that the mount refuses other users. A local user could read every cached
item of a mount that refused them its directory (`cat CACHE/<dataset>/items/0/0`): items were written 0644 in
directories 0755. Caches an older silod left so are made private when opened."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuseclient import assembly
from fuseclient.cache import DatasetCache
from tests.cache_fixtures import content, entries_on_disk, item_file, one_file_manifest
from tests.cluster_fixtures import FILES, SIZE, System, eventually
from tests.mount_fixtures import MountProcess
from tests.storage_servers import missing_dependency

NOBODY = 65534


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    """The usual umask, which gives others read access to what a process creates unless it asks otherwise; the
    daemons the tests start inherit it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def modes_below(root: Path) -> dict[str, str]:
    """The permission bits of `root` and of everything below it, as "d0700" and "f0600", by relative path."""
    found = {}
    for directory, _, files in os.walk(root):
        for path in (Path(directory), *(Path(directory) / name for name in files)):
            mode = path.lstat().st_mode
            kind = "d" if stat.S_ISDIR(mode) else "f" if stat.S_ISREG(mode) else "?"
            found[str(path.relative_to(root))] = f"{kind}{stat.S_IMODE(mode):04o}"
    return found


def assert_private_throughout(root: Path) -> None:
    modes = modes_below(root)
    assert len(modes) > 1
    loose = {path: mode for path, mode in modes.items() if mode not in ("d0700", "f0600")}
    assert not loose, f"open to other users below {root}: {loose}"


def as_nobody(*command: str) -> subprocess.CompletedProcess[bytes]:
    if os.geteuid() != 0:
        missing_dependency("root, to try the cache as another user (setpriv)")
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    return subprocess.run(argv, capture_output=True, timeout=30, check=False)  # bytes: an entry is no text


def test_a_cache_made_under_umask_022_has_every_directory_0700_and_every_file_0600(tmp_path: Path) -> None:
    directory = tmp_path / "dataset-cache"
    manifest = one_file_manifest(1030, 100)  # two buckets of items
    cache = DatasetCache(directory, manifest, 10**6)
    for item in (0, 1, 1024, 1029):
        assert cache.admit(item, content(manifest, item))
    assert cache.set_quota(300) == 1  # an eviction leaves no file of another mode
    cache.close()

    assert {path for path, mode in modes_below(directory).items() if mode.startswith("f")} >= {"cache.json"}
    assert len(entries_on_disk(directory)) == 3
    assert_private_throughout(directory)


def test_a_cache_an_older_silod_left_readable_by_others_is_made_private_at_open_and_serves_its_items(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "dataset-cache"
    manifest = one_file_manifest(1030, 100)
    cache = DatasetCache(directory, manifest, 10**6)
    for item in (0, 1024):
        assert cache.admit(item, content(manifest, item))
    cache.close()
    for path in (directory, directory / "items", directory / "items" / "0", directory / "items" / "1"):
        path.chmod(0o755)  # as a silod before this one made them
    for item in (0, 1024):
        item_file(directory, item).chmod(0o644)
    caplog.clear()

    reopened = DatasetCache(directory, manifest, 10**6, dataset_uri="file:///d")

    assert reopened.read(0, 0, 100) == content(manifest, 0)
    assert reopened.read(1024, 0, 100) == content(manifest, 1024)
    assert reopened.statistics().cached_items == 2
    directories = {path: mode for path, mode in modes_below(directory).items() if mode.startswith("d")}
    assert set(directories.values()) == {"d0700"} and len(directories) == 4
    assert stat.S_IMODE(item_file(directory, 0).stat().st_mode) == 0o644  # out of reach: not walked
    said = [r.getMessage() for r in caplog.records if "private" in r.getMessage()]
    assert said == [
        f"cache of file:///d: made 4 directories in {directory} private to this user (mode 0700): an earlier silod "
        "left them readable by other users"
    ]
    caplog.clear()
    DatasetCache(directory, manifest, 10**6).close()  # private already: nothing more to say
    assert not [r for r in caplog.records if "private" in r.getMessage()]


def test_a_mounts_cache_dir_is_private_throughout_and_another_user_cannot_read_its_items(shared_dir: Path) -> None:
    """The reproduction: without --allow-other another user is refused the job's directory, and was not refused the
    cache's copies of its files."""
    dataset = shared_dir / "dataset"
    dataset.mkdir()
    files = {f"f{i}.bin": bytes([i]) * 5000 for i in range(8)}
    for name, data in files.items():
        (dataset / name).write_bytes(data)
    uri = f"file://{dataset}"
    mount = MountProcess(shared_dir / "m", {"job1": uri}, "--cache-size", f"{uri}=10MB")
    try:
        mount.start()
        for name, data in files.items():
            assert (mount.job_dir("job1") / name).read_bytes() == data
        eventually(lambda: len(entries_on_disk(mount.cache_dir)) == len(files), what="every file cached")
        mount.wait_for_stats(lambda s: s["datasets"][uri]["cached_items"] == len(files))
        cached = sorted(entries_on_disk(mount.cache_dir))[0]

        listing = as_nobody("ls", str(mount.job_dir("job1")))
        assert listing.returncode != 0 and b"Permission denied" in listing.stderr
        refused = as_nobody("cat", str(cached))
        assert refused.returncode != 0 and b"Permission denied" in refused.stderr and refused.stdout == b""
        assert_private_throughout(mount.cache_dir)
        assert {"silod.lock", "stats.json"} <= set(modes_below(mount.cache_dir))
        assert not mount.log_lines("made private to this user")  # the cache dir it made was private from the start
    finally:
        mount.stop()


def test_a_node_agents_cache_dir_is_private_throughout(system: System) -> None:
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_cache_size(system.uri, FILES * SIZE)
    system.client.allocate_remote_io("j1", 40_000_000)
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    eventually(lambda: sum(entries_on_disk(node.cache_dir).values()) == FILES * SIZE, what="cache filled")
    node.wait_for_stats(lambda s: s["datasets"][system.uri]["cached_items"] == FILES)

    assert_private_throughout(node.cache_dir)
    assert {"silod.lock", "stats.json"} <= set(modes_below(node.cache_dir))


def test_a_cache_dir_readable_by_others_is_made_private_once_and_a_shared_one_keeps_its_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o755)  # as an operator's mkdir, or a silod before this one, made it
    os.close(os.open(cache_dir / "silod.lock", os.O_CREAT | os.O_WRONLY, 0o644))
    assembly.make_cache_dir_private(cache_dir)
    assert modes_below(cache_dir) == {".": "d0700", "silod.lock": "f0600"}
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "made private to this user (0700 for directories, 0600 for files): "
        f"{cache_dir} (was 0755), {cache_dir}/silod.lock (was 0644)"
    ]
    caplog.clear()
    assembly.make_cache_dir_private(cache_dir)
    assert not caplog.records

    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # /tmp given as the cache dir: no daemon's own
    assembly.make_cache_dir_private(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
