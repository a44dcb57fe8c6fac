"""Running a mount: build the state, serve FUSE requests, log statistics, and unmount cleanly on signals."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import resource
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyfuse3
import trio

from fuseclient.access import AccessTracker
from fuseclient.cache import DatasetCache
from fuseclient.fs import SilodFS
from fuseclient.metrics import MountMetrics
from fuseclient.mounted import MountedDataset, MountedJob, MountState
from fuseclient.readahead import DEFAULT_READ_AHEAD, NotMounted, mount_device, set_read_ahead
from fuseclient.throttle import TokenBucket, default_burst
from fuseclient.tree import DatasetTree
from silodlib.backends import Backend, BackendError, RetryingBackend, open_backend
from silodlib.logfields import log_ids
from silodlib.manifest import DEFAULT_CHUNK_SIZE, Manifest, build_manifest

log = logging.getLogger(__name__)

FETCH_CONCURRENCY = 16  # backend reads in flight per dataset
STATS_FILE = "stats.json"
LOCK_FILE = "silod.lock"
ReadyCallback = Callable[[], None]


@dataclass(frozen=True)
class MountConfig:
    """A standalone mount: jobs and allocations given up front (the node agent feeds the same state live)."""

    mountpoint: Path
    cache_dir: Path
    jobs: Mapping[str, str]  # job id -> canonical dataset URI
    cache_sizes: Mapping[str, int] = field(default_factory=dict)  # dataset URI -> quota bytes (default 0)
    io_rates: Mapping[str, int] = field(default_factory=dict)  # job id -> bytes/s (default: unthrottled)
    backend_options: Mapping[str, str] = field(default_factory=dict)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    allow_other: bool = False
    read_ahead: int = DEFAULT_READ_AHEAD
    stats_interval: float | None = None
    metrics_port: int | None = None


class MountError(RuntimeError):
    """The mount cannot start as configured: a dataset cannot be listed (unreachable, denied, missing)."""


class CacheDirInUse(Exception):
    """Another live silod mount or node agent holds the cache directory."""


def lock_cache_dir(cache_dir: Path) -> int:
    """Take `cache_dir` for this process: an exclusive lock on CACHE_DIR/silod.lock, held as long as the
    returned descriptor is open in this process or a child it forks (the detached daemon).

    Two daemons on one cache directory would each count, admit, evict and restore entries behind the other's
    back (and one's startup would delete the other's admissions in progress as leftovers). The kernel drops
    the lock when its holder dies, kill -9 included, so a crash never leaves the directory claimed.
    """
    fd = os.open(cache_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CacheDirInUse(
            f"--cache-dir {cache_dir} is in use by another running silod mount or node; give each its own"
        ) from None
    return fd


def dataset_cache_dir(cache_dir: Path, uri: str) -> Path:
    """Each dataset's cache lives in its own directory, named by a hash of its URI."""
    return cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:24]


async def open_dataset(cache_root: Path, uri: str, backend: Backend, manifest: Manifest, quota: int) -> MountedDataset:
    """A dataset ready to serve: its cache opened (restoring complete entries from an earlier run)."""
    directory = dataset_cache_dir(cache_root, uri)
    cache = await trio.to_thread.run_sync(lambda: DatasetCache(directory, manifest, quota, dataset_uri=uri))
    log.info(
        "dataset %s: %d files, %d items, %d bytes; cache quota %d bytes, %d items already cached",
        uri,
        manifest.file_count,
        manifest.item_count,
        manifest.size_bytes,
        quota,
        cache.statistics().cached_items,
        extra=log_ids(dataset_uri=uri),
    )
    return MountedDataset(uri, manifest, DatasetTree(manifest), backend, cache, trio.CapacityLimiter(FETCH_CONCURRENCY))


def add_job(
    mount: MountState, job_id: str, dataset: MountedDataset, rate: int | None, share: float = 1.0
) -> MountedJob:
    """Add a job reading `dataset`, throttled at `rate` bytes/s (None: unthrottled), that reads `share` of the
    items each pass here (its workers on this node over all of its workers; `AccessTracker`)."""
    bucket = None if rate is None else TokenBucket(rate, default_burst(rate, dataset.manifest.largest_item))
    tracker = AccessTracker(dataset.manifest.item_count, share)
    job = MountedJob(job_id, mount.next_slot(), dataset, bucket, tracker)
    mount.add_job(job)
    return job


async def build_state(config: MountConfig) -> MountState:
    """The standalone mount's state: each dataset listed once, jobs with their fixed allocations. Raises
    `MountError` for a dataset that cannot be listed."""
    mount = MountState()
    for uri in sorted(set(config.jobs.values())):
        backend = RetryingBackend(open_backend(uri, config.backend_options))
        log.info("listing %s", uri, extra=log_ids(dataset_uri=uri))
        try:
            manifest = await trio.to_thread.run_sync(_list_manifest, backend, config.chunk_size)
        except BackendError as exc:
            raise MountError(f"cannot list the dataset: {exc}") from None
        quota = config.cache_sizes.get(uri, 0)
        mount.datasets[uri] = await open_dataset(config.cache_dir, uri, backend, manifest, quota)
    for job_id, uri in config.jobs.items():
        add_job(mount, job_id, mount.datasets[uri], config.io_rates.get(job_id))
    return mount


def stats_reporting(interval: float | None, cache_dir: Path) -> tuple[float, Path] | None:
    """Statistics every `interval` seconds into CACHE_DIR/stats.json, or none without an interval."""
    return (interval, cache_dir / STATS_FILE) if interval else None


def _list_manifest(backend: Backend, chunk_size: int) -> Manifest:
    return build_manifest(backend.list(), chunk_size)


async def serve(config: MountConfig, on_ready: ReadyCallback = lambda: None) -> None:
    """Mount standalone, serve until SIGTERM/SIGINT or an external unmount, then unmount and close."""
    mount = await build_state(config)
    await run_filesystem(
        config.mountpoint,
        mount,
        allow_other=config.allow_other,
        read_ahead=config.read_ahead,
        stats=stats_reporting(config.stats_interval, config.cache_dir),
        on_ready=on_ready,
        metrics_port=config.metrics_port,
    )


Task = Callable[[], Awaitable[None]]


async def run_filesystem(
    mountpoint: Path,
    mount: MountState,
    *,
    allow_other: bool = False,
    read_ahead: int = DEFAULT_READ_AHEAD,
    stats: tuple[float, Path] | None = None,
    tasks: Sequence[Task] = (),
    on_ready: ReadyCallback = lambda: None,
    metrics_port: int | None = None,
    reconnects: Callable[[], int] | None = None,
    node_id: str | None = None,
) -> None:
    """Serve `mount` at `mountpoint` with `tasks` running alongside, until a signal or an external unmount.

    `read_ahead` is the kernel's read-ahead window in bytes (0: the kernel's default; see `readahead`).
    `stats` is (interval, file) for periodic statistics; `metrics_port` serves Prometheus /metrics on all
    interfaces (node metrics hold no secrets, and Prometheus scrapes nodes from elsewhere), with `reconnects`
    counting the node agent's watch reconnects. `node_id` is the node a managed mount serves, a field of its
    log lines. The mount state may change while served (the node agent adds and removes jobs); every dataset
    still open at the end is closed.
    """
    ids = log_ids(node_id=node_id)
    raise_open_file_limit(ids)
    options = set(pyfuse3.default_options) | {"fsname=silod", "subtype=silod", "ro"}
    if allow_other:
        options.add("allow_other")
    prepare_mountpoint(mountpoint)
    metrics = None
    if metrics_port is not None:
        metrics = MountMetrics(mount, trio.lowlevel.current_trio_token(), reconnects)
        log.info("metrics at http://0.0.0.0:%d/metrics", metrics.serve("0.0.0.0", metrics_port), extra=ids)
    pyfuse3.init(SilodFS(mount), str(mountpoint), options)
    log.info("mounted %s with jobs %s", mountpoint, ", ".join(mount.jobs) or "(none yet)", extra=ids)
    unmounted_outside = False
    try:
        on_ready()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signal, nursery.cancel_scope, ids)
            if read_ahead:
                nursery.start_soon(_set_read_ahead, mountpoint, read_ahead, ids)
            if stats is not None:
                nursery.start_soon(_report_statistics, mount, *stats, node_id)
            for task in tasks:
                nursery.start_soon(task)
            await pyfuse3.main()
            unmounted_outside = True  # main returns only when the kernel says the mount is gone
            nursery.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=not unmounted_outside)
        if metrics is not None:
            metrics.close()
        for dataset in mount.datasets.values():
            dataset.cache.close()
            dataset.backend.close()
    log.info("unmounted %s", mountpoint, extra=ids)


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
    if _is_live_silod_mount(mountpoint):
        raise OSError(errno.EBUSY, f"is a live silod mount; unmount it first (silod umount {mountpoint})")


def _is_live_silod_mount(mountpoint: Path) -> bool:
    """Whether the kernel's mount table has a silod mount at `mountpoint`."""
    try:
        mount_device(Path(os.path.realpath(mountpoint)))
    except NotMounted:
        return False
    return True


async def _cancel_on_signal(scope: trio.CancelScope, ids: Mapping[str, str]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name, extra=ids)
            scope.cancel()
            return


async def _set_read_ahead(mountpoint: Path, size: int, ids: Mapping[str, str]) -> None:
    """Set the kernel's read-ahead once the mount answers; without root the kernel's default stays."""
    try:
        setting = await trio.to_thread.run_sync(set_read_ahead, mountpoint, size, abandon_on_cancel=True)
    except OSError as exc:
        log.info("kernel read-ahead on %s left at the kernel's default: %s", mountpoint, exc, extra=ids)
        return
    log.info("kernel read-ahead on %s: %d KiB (%s)", mountpoint, size // 1024, setting, extra=ids)


async def _report_statistics(mount: MountState, interval: float, stats_file: Path, node_id: str | None) -> None:
    """Every `interval` seconds: one log line per job, and all numbers as JSON in `stats_file`.

    A file left by an earlier daemon (killed, so it could not clean up) is removed first: until this daemon
    writes its own, no numbers are better than a dead process's. A file that cannot be written (a full or
    vanished disk, no file descriptor left) is warned about once and tried again every interval: statistics
    are never worth a mount its readers depend on."""
    stats_file.unlink(missing_ok=True)
    failing = False
    while True:
        await trio.sleep(interval)
        now = trio.current_time()
        jobs = list(mount.jobs.values())
        snapshot = {job.job_id: job.statistics(now) for job in jobs}
        for job in jobs:
            stats = snapshot[job.job_id]
            access = stats.access
            log.info(
                "job %s: epoch %d (%.0f%% read), epoch hit ratio %.2f, %.1f MB/s read, %d B from remote, "
                "effective cache %d items, remote demand %.1f MB/s",
                job.job_id,
                access.epoch,
                100 * access.progress,
                stats.epoch_hit_ratio,
                access.throughput_bytes_per_sec / 1e6,
                stats.bytes_from_remote,
                access.effective_cache_items,
                access.remote_demand_bytes_per_sec / 1e6,
                extra=log_ids(job_id=job.job_id, dataset_uri=job.dataset.uri, node_id=node_id),
            )
        caches = {uri: asdict(d.cache.statistics()) for uri, d in mount.datasets.items()}
        document = {
            "written_at": time.time(),  # for people: the wall clock, which NTP may step by any amount
            # For rates: two files of one daemon are this many seconds apart, whatever the wall clock did.
            "monotonic_seconds": now,
            "jobs": {job_id: asdict(stats) for job_id, stats in snapshot.items()},
            "datasets": caches,
        }
        try:
            _write_atomically(stats_file, json.dumps(document, indent=1))
        except OSError as exc:
            if not failing:
                log.warning("statistics not written to %s (trying every %g s): %s", stats_file, interval, exc)
            failing = True
            continue
        if failing:
            log.info("statistics written to %s again", stats_file)
        failing = False


def _write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old file or the new one, never a partial one."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def _log_to(log_file: Path) -> None:
    """Send this process's stdout and stderr (where its log handler writes) to the end of `log_file`."""
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
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


def run_detached(main: Callable[[ReadyCallback], None], log_file: Path) -> int:
    """Run `main(on_ready)` in a daemon process; return 0 once it calls `on_ready`, 1 if it dies first."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_write)
        signalled = os.read(ready_read, 1)
        os.close(ready_read)
        if signalled == b"1":
            return 0
        os.waitpid(pid, 0)
        return 1
    os.close(ready_read)
    os.setsid()
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    _log_to(log_file)
    signal.signal(signal.SIGHUP, lambda signum, frame: _reopen_log(log_file))

    def on_ready() -> None:
        os.write(ready_write, b"1")
        os.close(ready_write)

    try:
        main(on_ready)
    except BaseException:
        log.exception("mount failed")
        os._exit(1)
    os._exit(0)
