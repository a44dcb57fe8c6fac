"""`silod mount` / `silod umount` as an operator uses them: argument checks, daemon mode, failures."""

from __future__ import annotations

import errno
import os
import pwd
import random
import signal
import subprocess
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from datamgr.devservers import free_port
from fuseclient.daemon import has_silod_mount
from tests import polling
from tests.datamgr_fixtures import SILOD, silod_cli
from tests.disks import TmpfsFactory, fill_up
from tests.mount_fixtures import MountFactory, MountProcess
from tests.storage_servers import DatasetTarget, DatasetTargetFactory


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "a" / "one.bin").write_bytes(b"1" * 1000)
    (root / "two.bin").write_bytes(b"2" * 10)
    return f"file://{root}"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--job", "j=DATA"), "not a directory"),  # mountpoint missing (see the test body)
        (("--job", "a/b=DATA"), "--job JOB_ID 'a/b' must match"),
        (("--job", "j=gs://bucket/x"), "--job DATASET_URI"),
        (("--job", "j=DATA", "--job", "j=DATA"), "--job j is given twice"),
        (("--job", "j=DATA", "--cache-size", "file:///elsewhere=1GiB"), "which no --job reads"),
        (("--job", "j=DATA", "--io-rate", "k=1MB/s"), "'k', which is not a --job"),
        (("--job", "j=DATA", "--cache-size", "DATA=1G"), "ambiguous"),
        (("--job", "j=DATA", "--io-rate", "j=200MB"), "did you mean 200MB/s?"),
        (("--job", "j"), "must be NAME=VALUE"),
        (("--job", "j=DATA", "--chunk-size", "1KiB"), "--chunk-size"),
        (("--job", "j=DATA", "--kernel-read-ahead", "1000"), "must be a whole number of KiB"),
        (("--job", "j=DATA", "--read-buffer", "4MiB"), "read buffer 4194304 B is below the least it may be, 8MiB"),
        (("--job", "j=s3://bucket/x", "--option", "path_style=maybe"), "option 'path_style' must be 'true' or"),
        (("--job", "j=s3://bucket/x", "--option", "read_timeout=0"), "option 'read_timeout' must be a number"),
        (("--job", "j=s3://bucket/x", "--option", "bogus=1"), "unknown option 'bogus' for s3://"),
        (("--job", "j=DATA/missing"), "missing: No such file or directory"),
    ],
)
def test_bad_mount_arguments_exit_2_naming_the_problem(
    tmp_path: Path, dataset: str, args: tuple[str, ...], fragment: str
) -> None:
    mountpoint = tmp_path / ("missing" if fragment == "not a directory" else "mnt")
    if fragment != "not a directory":
        mountpoint.mkdir()
    argv = [a.replace("DATA", dataset) for a in args]
    result = silod_cli("mount", str(mountpoint), "--cache-dir", str(tmp_path / "cache"), "--foreground", *argv)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr
    assert not os.path.ismount(mountpoint)


def _unreachable_s3_options() -> list[str]:
    """Options that point an s3:// dataset at a loopback port nothing listens on."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    return ["--option", f"endpoint_url={endpoint}", "--option", "access_key_id=a", "--option", "secret_access_key=s"]


def test_a_dataset_that_cannot_be_listed_fails_the_mount_with_its_reason_not_a_traceback(tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = ["--cache-dir", str(tmp_path / "cache"), "--foreground", "--job", "j=s3://bkt/x"]
    result = silod_cli("mount", str(mountpoint), *argv, *_unreachable_s3_options())
    assert result.returncode == 1
    assert "silod mount: cannot list the dataset: s3://bkt/x: endpoint unreachable" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.ismount(mountpoint)


def test_a_cache_disk_full_at_start_fails_the_mount_naming_the_dataset_and_the_reason_not_a_traceback(
    tmpfs: TmpfsFactory, tmp_path: Path, dataset: str
) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    disk = tmpfs(tmp_path / "cache-disk", "64k")
    (disk / "cache").mkdir()
    fill_up(disk)
    result = silod_cli(
        "mount", str(mountpoint), "--cache-dir", str(disk / "cache"), "--foreground", "--job", f"j={dataset}"
    )
    assert result.returncode == 1, result.stderr
    assert f"silod mount: cannot open the cache of dataset {dataset} in {disk / 'cache'}/" in result.stderr
    assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.ismount(mountpoint)


def _options(target: DatasetTarget) -> list[str]:
    return [arg for name, value in target.options.items() for arg in ("--option", f"{name}={value}")]


CHECK = "check the bucket, container, prefix or path"
CANNOT = "silod mount: cannot serve the dataset: "


def _empty_prefix(target: DatasetTarget) -> tuple[str, str]:
    return target.uri, f"{target.uri} lists no objects; {CHECK}"


def _only_folder_markers(target: DatasetTarget) -> tuple[str, str]:
    target.make_dir("a")
    target.make_dir("b/c")
    return target.uri, (
        f"{target.uri} lists 2 objects, none of which can be a file below a mount point (2 folder markers, such as "
        f"'a/'); {CHECK}"
    )


def _one_object(target: DatasetTarget) -> tuple[str, str]:
    target.put("x.bin", b"1")  # a dataset's URI names a prefix: this one lists nothing below it
    return f"{target.uri}/x.bin", f"{target.uri}/x.bin lists no objects; {CHECK}"


def _all_keys_skipped(target: DatasetTarget) -> tuple[str, str]:
    target.put("/train/img0.jpg", b"1")  # a leading '/': 'data/train//train/img0.jpg'
    target.put("/train/img1.jpg", b"2")
    return target.uri, (
        f"{target.uri} lists 2 objects, none of which can be a file below a mount point (2 skipped: keys with an "
        "empty, '.' or '..' component, such as '/train/img0.jpg', '/train/img1.jpg'); rename the objects to "
        f"relative paths, or {CHECK}"
    )


def _long_name(target: DatasetTarget) -> tuple[str, str]:
    target.put("ok.bin", b"1")
    target.put("d/" + "x" * 300, b"2")
    return target.uri, f"{target.uri}: object key 'd/{'x' * 300}' has a name longer than 255 bytes"


def _file_and_folder(target: DatasetTarget) -> tuple[str, str]:
    target.put("a", b"1")
    target.put("a/b", b"2")
    return target.uri, f"{target.uri}: object key 'a' is both a file and a folder"


def _file_and_folder_marker(target: DatasetTarget) -> tuple[str, str]:
    target.put("k", b"1")
    target.make_dir("k")
    return target.uri, f"{target.uri}: object key 'k' is both a file and a folder"


REFUSED_LISTINGS = {
    "empty prefix": _empty_prefix,
    "only folder markers": _only_folder_markers,
    "a URI naming one object": _one_object,
    "every key skipped": _all_keys_skipped,
    "a name over 255 bytes": _long_name,
    "a file and a folder": _file_and_folder,
    "a file and a folder marker": _file_and_folder_marker,
}


@pytest.mark.parametrize("backend_name", ["s3", "az"])
@pytest.mark.parametrize("case", sorted(REFUSED_LISTINGS))
def test_a_listing_the_data_manager_would_refuse_fails_the_mount_with_its_reason_not_a_traceback(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory, backend_name: str, case: str
) -> None:
    target = dataset_target_factory(backend_name)
    uri, reason = REFUSED_LISTINGS[case](target)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = ["--cache-dir", str(tmp_path / "cache"), "--foreground", "--job", f"j={uri}", *_options(target)]
    result = silod_cli("mount", str(mountpoint), *argv)
    assert result.returncode == 1, result.stderr
    assert result.stderr.endswith(f"{CANNOT}{reason}\n")
    assert "Traceback" not in result.stderr
    assert not os.path.ismount(mountpoint)


def test_a_detached_mount_of_an_empty_prefix_says_why_in_one_line(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory
) -> None:
    target = dataset_target_factory("s3")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = ["--cache-dir", str(tmp_path / "cache"), "--job", f"j={target.uri}", *_options(target)]
    result = silod_cli("mount", str(mountpoint), *argv)
    log = tmp_path / "cache" / "mount.log"
    assert result.returncode == 1
    assert result.stderr == f"{CANNOT}{target.uri} lists no objects; {CHECK}; see {log}\n"
    assert "Traceback" not in log.read_text()
    assert not os.path.ismount(mountpoint)


def test_a_mount_that_leaves_keys_out_logs_their_count_once_and_serves_the_rest(
    tmp_path: Path, dataset_target_factory: DatasetTargetFactory
) -> None:
    target = dataset_target_factory("s3")
    target.put("good.bin", b"g" * 10)
    for i in range(20):
        target.put(f"/train/img{i}.jpg", b"x")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = ["--cache-dir", str(tmp_path / "cache"), "--job", f"j={target.uri}", *_options(target)]
    result = silod_cli("mount", str(mountpoint), *argv)
    try:
        assert result.returncode == 0, result.stderr
        assert os.listdir(mountpoint / "j") == ["good.bin"]
        assert (mountpoint / "j" / "good.bin").read_bytes() == b"g" * 10
    finally:
        assert silod_cli("umount", str(mountpoint)).returncode == 0
    _wait_for_exit(mountpoint)
    lines = (tmp_path / "cache" / "mount.log").read_text().splitlines()
    [left_out] = [line for line in lines if "img" in line]
    assert left_out.endswith(
        f"{target.uri}: 20 of the 21 objects listed are left out of the dataset, since no path below a mount point "
        "can name them: keys with an empty, '.' or '..' component, such as '/train/img0.jpg', '/train/img1.jpg', "
        "'/train/img10.jpg'"
    )


def _daemons(mountpoint: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"mount {mountpoint} "], capture_output=True, text=True, check=False)
    return found.stdout.split()


def _wait_for_exit(mountpoint: Path) -> None:
    polling.eventually(lambda: not _daemons(mountpoint), what="the daemon's exit after umount", timeout=20)


def test_the_mount_daemonizes_once_live_and_umount_stops_it(tmp_path: Path, dataset: str) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = silod_cli("mount", str(mountpoint), "--cache-dir", str(tmp_path / "cache"), "--job", f"j={dataset}")
    try:
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(mountpoint)  # live when the command returns
        assert (mountpoint / "j" / "a" / "one.bin").read_bytes() == b"1" * 1000
        assert _daemons(mountpoint)
        assert "mounted" in (tmp_path / "cache" / "mount.log").read_text()
    finally:
        unmount = silod_cli("umount", str(mountpoint))
    assert unmount.returncode == 0, unmount.stderr
    assert not os.path.ismount(mountpoint)
    _wait_for_exit(mountpoint)


def test_a_daemon_sent_sighup_keeps_serving_and_reopens_its_log_for_logrotate(tmp_path: Path, dataset: str) -> None:
    # logrotate renames the log and signals the daemon (postrotate `kill -HUP`); the default action of SIGHUP
    # would kill it and leave its jobs a dead mount.
    mountpoint, log_file = tmp_path / "mnt", tmp_path / "mount.log"
    mountpoint.mkdir()
    argv = ["--cache-dir", str(tmp_path / "cache"), "--log-file", str(log_file), "--stats-interval", "0.1"]
    result = silod_cli("mount", str(mountpoint), *argv, "--job", f"j={dataset}")
    assert result.returncode == 0, result.stderr
    try:
        [daemon] = _daemons(mountpoint)
        rotated = log_file.rename(tmp_path / "mount.log.1")
        os.kill(int(daemon), signal.SIGHUP)
        polling.eventually(lambda: log_file.exists() and "job j: epoch" in log_file.read_text(), what="the new log")
        assert "reopened the log" in log_file.read_text()
        written = rotated.stat().st_size
        assert (mountpoint / "j" / "a" / "one.bin").read_bytes() == b"1" * 1000
        polling.eventually(lambda: log_file.read_text().count("job j: epoch") >= 2, what="more lines in the new log")
        assert rotated.stat().st_size == written  # the rotated file is left alone
        assert _daemons(mountpoint) == [daemon]
    finally:
        unmount = silod_cli("umount", str(mountpoint))
    assert unmount.returncode == 0, unmount.stderr
    _wait_for_exit(mountpoint)


def test_a_daemon_that_cannot_start_fails_the_command_and_says_where_to_look(tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    args = ["--cache-dir", str(tmp_path / "cache"), "--job", "j=s3://bkt/x", *_unreachable_s3_options()]
    result = silod_cli("mount", str(mountpoint), *args)
    assert result.returncode == 1
    log = tmp_path / "cache" / "mount.log"
    assert str(log) in result.stderr
    assert "cannot list the dataset: s3://bkt/x: endpoint unreachable" in log.read_text()
    assert not os.path.ismount(mountpoint)


def test_a_second_daemon_on_the_same_cache_dir_is_refused_until_the_first_stops(tmp_path: Path, dataset: str) -> None:
    cache = tmp_path / "cache"
    first, second = tmp_path / "mnt1", tmp_path / "mnt2"
    first.mkdir()
    second.mkdir()
    assert silod_cli("mount", str(first), "--cache-dir", str(cache), "--job", f"j={dataset}").returncode == 0
    try:
        refused = silod_cli("mount", str(second), "--cache-dir", str(cache), "--job", f"j={dataset}")
        assert refused.returncode == 2
        assert f"--cache-dir {cache} is in use by another running silod mount or node" in refused.stderr
        assert not os.path.ismount(second)
        assert (first / "j" / "two.bin").read_bytes() == b"2" * 10  # the first one still serves
    finally:
        assert silod_cli("umount", str(first)).returncode == 0
    _wait_for_exit(first)
    taken_over = silod_cli("mount", str(second), "--cache-dir", str(cache), "--job", f"j={dataset}")
    try:
        assert taken_over.returncode == 0, taken_over.stderr
        assert (second / "j" / "two.bin").read_bytes() == b"2" * 10
    finally:
        silod_cli("umount", str(second))


def test_a_mount_on_a_live_silod_mount_is_refused_and_the_first_keeps_serving(tmp_path: Path, dataset: str) -> None:
    mountpoint = tmp_path / "a mount"  # a space: the kernel's mount table escapes it as \\040
    mountpoint.mkdir()
    first = silod_cli("mount", str(mountpoint), "--cache-dir", str(tmp_path / "c1"), "--job", f"j={dataset}")
    assert first.returncode == 0, first.stderr
    try:
        stacked = silod_cli("mount", str(mountpoint), "--cache-dir", str(tmp_path / "c2"), "--job", f"k={dataset}")
        assert stacked.returncode == 2
        assert f"mountpoint {mountpoint} is a live silod mount; unmount it first" in stacked.stderr
        assert (mountpoint / "j" / "two.bin").read_bytes() == b"2" * 10  # the first one still serves
        assert not (mountpoint / "k").exists()
    finally:
        assert silod_cli("umount", str(mountpoint)).returncode == 0
    _wait_for_exit(mountpoint)


def test_umount_of_something_not_mounted_says_so(tmp_path: Path) -> None:
    result = silod_cli("umount", str(tmp_path))
    assert result.returncode == 1
    assert f"silod umount: {tmp_path} is not a silod mount; nothing unmounted" in result.stderr


def test_umount_refuses_a_mount_of_another_file_system(tmp_path: Path) -> None:
    result = silod_cli("umount", "/proc")
    assert result.returncode == 1
    assert "silod umount: /proc is not a silod mount; nothing unmounted" in result.stderr
    assert Path("/proc/self").exists()


def _without_fuse(tmp_path: Path, how: str) -> list[str]:
    """A command prefix running `silod` in a mount namespace of its own where /dev/fuse is `how`: "unopenable" (an
    empty file bound read-only over it: EROFS, as root cannot be refused EACCES) or "not-fuse" (/dev/null bound
    over it: it opens, and the kernel refuses the mount)."""
    if how == "unopenable":
        empty = tmp_path / "no-fuse"
        empty.touch()
        setup = f"mount --bind {empty} /dev/fuse && mount -o remount,bind,ro /dev/fuse"
    else:
        setup = "mount --bind /dev/null /dev/fuse"
    return ["unshare", "-m", "sh", "-c", f'{setup} && exec "$@"', "sh", *SILOD]


def _run(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=60)


UNOPENABLE = "cannot open /dev/fuse: Read-only file system; FUSE needs it readable and writable by root"
NOT_FUSE = "the kernel refused the FUSE mount (fuse_session_mount failed): fuse: mount failed: Invalid argument"


@pytest.mark.skipif(os.geteuid() != 0, reason="binds over /dev/fuse in a mount namespace of its own")
@pytest.mark.parametrize(("how", "reason"), [("unopenable", UNOPENABLE), ("not-fuse", NOT_FUSE)])
@pytest.mark.parametrize("detached", [False, True], ids=["foreground", "detached"])
def test_a_mount_fuse_refuses_says_why_in_one_line_on_the_terminal_and_in_the_log(
    tmp_path: Path, dataset: str, how: str, reason: str, detached: bool
) -> None:
    mountpoint, cache = tmp_path / "mnt", tmp_path / "cache"
    mountpoint.mkdir()
    argv = ["mount", str(mountpoint), "--cache-dir", str(cache), "--job", f"j={dataset}"]
    result = _run(_without_fuse(tmp_path, how), *argv, *([] if detached else ["--foreground"]))
    assert result.returncode == 1, result.stderr
    said = [line for line in result.stderr.splitlines() if "INFO" not in line]  # the foreground's log lines
    assert said == [f"silod mount: {reason}" + (f"; see {cache / 'mount.log'}" if detached else "")], result.stderr
    if detached:
        log = (cache / "mount.log").read_text()
        assert f"ERROR fuseclient.daemon: mount failed: {reason}" in log and "Traceback" not in log, log
    assert not os.path.ismount(mountpoint)


@pytest.mark.skipif(os.geteuid() != 0, reason="binds over /dev/fuse in a mount namespace of its own")
def test_a_node_agent_without_fuse_says_why_before_it_calls_its_data_manager(tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    nobody = f"127.0.0.1:{free_port()}"  # no data manager: the agent stops before it would wait for one
    argv = ["node", "--datamgr", nobody, "--node-id", "n1", "--mountpoint", str(mountpoint)]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--cache-capacity", "1GiB", "--allow-other"]
    result = _run(_without_fuse(tmp_path, "unopenable"), *argv)
    assert result.returncode == 1, result.stderr
    assert result.stderr == f"silod node: {UNOPENABLE}; see {tmp_path / 'cache' / 'node.log'}\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="binds over /dev/fuse in a mount namespace of its own")
def test_the_demo_without_fuse_says_why_the_node_agent_did_not_mount_not_a_traceback(tmp_path: Path) -> None:
    result = _run(_without_fuse(tmp_path, "unopenable"), "demo", "--backend", "file", "--short")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"silod demo: the node agent did not mount: {UNOPENABLE}" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("where", ["under-a-file", "under-proc"])
def test_a_log_file_that_cannot_be_written_exits_2_naming_it_before_detaching(
    tmp_path: Path, dataset: str, where: str
) -> None:
    (tmp_path / "a-file").touch()
    log_file = tmp_path / "a-file" / "mount.log" if where == "under-a-file" else Path("/proc/silod-mount.log")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = ["--cache-dir", str(tmp_path / "cache"), "--job", f"j={dataset}", "--log-file", str(log_file)]
    result = silod_cli("mount", str(mountpoint), *argv)
    assert result.returncode == 2, result.stderr
    strerror = "Not a directory" if where == "under-a-file" else "No such file or directory"
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert result.stderr == (
        f"silod mount: cannot write the log {log_file}: {strerror}; choose a --log-file {user} can write, in a "
        "directory that exists\n"
    )
    assert not os.path.ismount(mountpoint) and not _daemons(mountpoint)


def test_a_cache_dir_whose_lock_file_cannot_be_opened_exits_2_naming_the_file(tmp_path: Path, dataset: str) -> None:
    cache = tmp_path / "cache"
    (cache / "silod.lock").mkdir(parents=True)  # what root cannot open, as a user cannot open root's lock file
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = silod_cli("mount", str(mountpoint), "--cache-dir", str(cache), "--job", f"j={dataset}")
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"silod mount: cannot use --cache-dir {cache}: {cache / 'silod.lock'}: Is a directory\n"


MiB = 1024 * 1024


def _files(root: Path, sizes: dict[str, int]) -> dict[str, bytes]:
    """Files of random bytes under `root`, by name, of the sizes given; their contents."""
    rng = random.Random(7)
    files = {name: rng.randbytes(size) for name, size in sizes.items()}
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def _read_in_threads(opened: dict[str, BinaryIO]) -> tuple[list[threading.Thread], dict[str, bytes | OSError]]:
    """A thread per open file reading it to the end, then closing it (started); what each read, or its error."""
    results: dict[str, bytes | OSError] = {}

    def read(name: str) -> None:
        with opened[name] as file:
            try:
                results[name] = file.read()
            except OSError as exc:
                results[name] = exc

    threads = [threading.Thread(target=read, args=(name,), daemon=True) for name in opened]
    for thread in threads:
        thread.start()
    return threads, results


def _terminate(mount: MountProcess) -> None:
    assert mount.process is not None
    mount.process.send_signal(signal.SIGTERM)


def test_files_being_read_when_the_daemon_gets_sigterm_are_read_to_their_end(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # Before, the request loop ended at the signal: the reads in flight got ECONNABORTED, the next ones ENOTCONN.
    files = _files(tmp_path / "data", {f"shard{i}.bin": 5 * MiB for i in range(4)})
    mount = mount_factory({"j": f"file://{tmp_path / 'data'}"}, "--io-rate", "j=10MB/s")  # 2 s to read them all
    threads, results = _read_in_threads({name: (mount.job_dir("j") / name).open("rb") for name in files})
    mount.wait_for_stats(lambda stats: stats["jobs"]["j"]["bytes_read"] > 0)
    _terminate(mount)
    for thread in threads:
        thread.join(timeout=60)
    assert results == files  # each whole, its bytes: the grace (5 s) is well over what was left to read
    assert mount.process is not None and mount.process.wait(timeout=60) == 0
    assert not has_silod_mount(mount.mountpoint)  # the table: ismount takes a dead FUSE mount for none
    assert len(mount.log_lines("received SIGTERM: unmounting")) == 1 and not mount.log_lines("files are still open")


def test_after_sigterm_new_opens_find_no_mount_open_files_read_on_and_a_read_waiting_past_the_grace_gets_eio(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    files = _files(tmp_path / "data", {"held.bin": 1000, "free.bin": 2000})
    uri = f"file://{tmp_path / 'data'}"
    mount = mount_factory({"held": uri, "free": uri}, "--io-rate", "held=0")  # held waits for remote IO for good
    free = (mount.job_dir("free") / "free.bin").open("rb")  # opened before the signal, read after it
    threads, results = _read_in_threads({"held.bin": (mount.job_dir("held") / "held.bin").open("rb")})
    polling.eventually(lambda: mount.log_lines("that need storage wait"), what="the read waiting for remote IO")

    _terminate(mount)
    polling.eventually(lambda: not os.path.ismount(mount.mountpoint), what="the mount detached")
    with pytest.raises(FileNotFoundError):  # the mountpoint shows the directory beneath
        (mount.job_dir("free") / "free.bin").open("rb")
    with free:  # but an open file reads on while the read waiting for remote IO holds the stop open
        assert free.read() == files["free.bin"]
    threads[0].join(timeout=60)
    failed = results["held.bin"]
    assert isinstance(failed, OSError) and failed.errno == errno.EIO  # before: ECONNABORTED
    assert mount.process is not None and mount.process.wait(timeout=60) == 0
    assert mount.log_lines("files are still open in ")


def test_a_mount_detached_before_its_sigterm_as_a_prestop_hook_does_stops_without_a_warning(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # The DaemonSet's preStop hook detaches the mount (`silod umount --lazy`) before the pod's SIGTERM: the daemon
    # tried to detach it again, and fusermount3's refusal made a WARNING at every stop of every node.
    files = _files(tmp_path / "data", {"a.bin": 1000})
    uri = f"file://{tmp_path / 'data'}"
    mount = mount_factory({"j": uri})
    held = (mount.job_dir("j") / "a.bin").open("rb")
    assert silod_cli("umount", str(mount.mountpoint), "--lazy").returncode == 0
    _terminate(mount)
    with held:  # it reads on through the stop's grace
        assert held.read() == files["a.bin"]
    assert mount.process is not None and mount.process.wait(timeout=60) == 0
    assert mount.log_lines("is detached already")
    assert not [line for line in mount.log_lines("") if " WARNING " in line]


def test_a_restarted_mount_counts_the_entries_it_restored_as_its_cached_items_not_its_empty_files(
    mount_factory: MountFactory, tmp_path: Path
) -> None:
    # Empty files read as cached from the start: a restart said "restored 0 items", then "2 items already cached",
    # and the statistics showed more cached items than had ever been admitted.
    files = _files(tmp_path / "data", {"a.bin": 100, "b.bin": 200, "c.bin": 300, "empty": 0, "void": 0})
    uri = f"file://{tmp_path / 'data'}"
    first = mount_factory({"j": uri}, "--cache-size", f"{uri}=1MiB")
    assert {name: (first.job_dir("j") / name).read_bytes() for name in files} == files
    cached = first.wait_for_stats(lambda stats: stats["datasets"][uri]["admitted"] == 3)["datasets"][uri]
    assert cached["cached_items"] == 3
    first.stop()

    again = mount_factory({"j": uri}, "--cache-size", f"{uri}=1MiB")
    assert again.log_lines("restored 3 items (600 bytes) from ")[0].endswith("; its 2 empty files need no entry")
    assert again.log_lines("3 items already cached")
    assert again.wait_for_stats(lambda stats: uri in stats["datasets"])["datasets"][uri]["cached_items"] == 3
