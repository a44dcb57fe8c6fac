"""Serving a mount: the FUSE request loop with its side tasks (signals, kernel read-ahead, statistics, metrics,
the node agent's), until a signal or an external unmount, then a clean close.

A signal stops the daemon cleanly (`Stop`): the mount is detached from the file tree at once, so that no new open
reaches it, while files already open read on, for a short grace, before the request loop ends. Ending it at the
signal answered every read under way with ECONNABORTED: a loader reading a file through it got an error for a read
the daemon was about to serve.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import pyfuse3
import trio

from fuseclient.assembly import MountConfig, MountError, build_state
from fuseclient.daemon import (
    ReadyCallback,
    has_silod_mount,
    prepare_mountpoint,
    raise_open_file_limit,
    return_freed_buffers,
    unmount,
)
from fuseclient.fs import SilodFS
from fuseclient.fuse_refusals import fuse_refusal, kernel_refusal, may_mount_directly
from fuseclient.metrics import MountMetrics
from fuseclient.mounted import MountState
from fuseclient.readahead import set_read_ahead
from fuseclient.readpath import RE_REQUEST_WINDOW
from silodlib.logfields import log_ids
from silodlib.metrics_endpoint import MetricsPortError
from silodlib.privacy import PRIVATE_FILE

log = logging.getLogger(__name__)

STATS_FILE = "stats.json"
METRICS_HOST = "0.0.0.0"  # all interfaces: node metrics hold no secrets, and Prometheus scrapes from elsewhere

# Seconds a stopping daemon lets the files open in its mount read on (`Stop`). A read served by a healthy store takes
# well under a second (a 4 MiB chunk at 100 MB/s: 40 ms), so 5 s finishes the files a loader is reading at rates down
# to a few MB/s each; and it stays far inside the time service managers give a stop before SIGKILL, which would leave
# a dead mount (Kubernetes' default grace period is 30 s, systemd's TimeoutStopSec 90 s). Reads that would wait
# longer (for remote IO at 0 B/s, say, or inside a backend call storage does not answer) fail then rather than hold the
# stop for as long as they wait.
STOP_GRACE = 5.0


class ServeSettings(Protocol):
    """How a mount is served, as both a standalone mount (`MountConfig`) and a node agent (`AgentConfig`) say."""

    @property
    def mountpoint(self) -> Path: ...
    @property
    def cache_dir(self) -> Path: ...  # statistics go to CACHE_DIR/stats.json
    @property
    def allow_other(self) -> bool: ...
    @property
    def read_ahead(self) -> int: ...  # the kernel's read-ahead window in bytes (0: its default; `readahead`)
    @property
    def stats_interval(self) -> float | None: ...  # None: no periodic statistics
    @property
    def metrics_port(self) -> int | None: ...  # None: no /metrics


def check_fuse(mountpoint: Path, allow_other: bool) -> None:
    """MountError, naming the cause and the fix, if FUSE would refuse to mount at `mountpoint` for this process
    (`fuse_refusal`: /dev/fuse it cannot open, and for a user other than root a mountpoint it cannot write or
    --allow-other without `user_allow_other`). A daemon checks before it lists datasets or registers its node, so
    that such a refusal costs nothing and changes nothing."""
    refusal = fuse_refusal(mountpoint, allow_other, uid=os.getuid(), direct=may_mount_directly())
    if refusal is not None:
        raise MountError(refusal)


async def serve(config: MountConfig, on_ready: ReadyCallback = lambda: None) -> None:
    """Mount standalone, serve until SIGTERM/SIGINT or an external unmount, then unmount and close."""
    await run_filesystem(config, await build_state(config), on_ready=on_ready)


Task = Callable[[], Awaitable[None]]


async def run_filesystem(
    settings: ServeSettings,
    mount: MountState,
    *,
    tasks: Sequence[Task] = (),
    on_ready: ReadyCallback = lambda: None,
    reconnects: Callable[[], int] | None = None,
    node_id: str | None = None,
) -> None:
    """Serve `mount` as `settings` say, with `tasks` running alongside, until a signal or an external unmount.

    /metrics, when asked for, is served on all interfaces (node metrics hold no secrets, and Prometheus
    scrapes nodes from elsewhere), with `reconnects` counting the node agent's watch reconnects. `node_id` is
    the node a managed mount serves, a field of its log lines. The mount state may change while served (the
    node agent adds and removes jobs); every dataset still open at the end is closed. A mount FUSE refuses raises
    MountError with the reason in one line (`check_fuse`, else libfuse's own line), nothing mounted.
    """
    mountpoint, read_ahead, metrics_port = settings.mountpoint, settings.read_ahead, settings.metrics_port
    ids = log_ids(node_id=node_id)
    raise_open_file_limit(ids)
    return_freed_buffers(ids)
    options = set(pyfuse3.default_options) | {"fsname=silod", "subtype=silod", "ro"}
    if settings.allow_other:
        options.add("allow_other")
    prepare_mountpoint(mountpoint)
    check_fuse(mountpoint, settings.allow_other)
    _remove_earlier_statistics(settings.cache_dir / STATS_FILE, ids)
    metrics = None
    if metrics_port is not None:
        metrics = MountMetrics(mount, trio.lowlevel.current_trio_token(), reconnects)
        try:
            port = metrics.serve(METRICS_HOST, metrics_port)
            log.info("metrics at http://%s:%d/metrics", METRICS_HOST, port, extra=ids)
        except MetricsPortError as exc:  # before mounting: the daemon stops with the reason, nothing mounted
            raise MountError(str(exc)) from None
    refused = kernel_refusal(lambda: pyfuse3.init(SilodFS(mount), str(mountpoint), options))
    if refused is not None:  # a refusal `check_fuse` does not foresee: libfuse's own line says why
        if metrics is not None:
            metrics.close()
        raise MountError(refused)
    log.info("mounted %s with jobs %s", mountpoint, ", ".join(mount.jobs) or "(none yet)", extra=ids)
    stop = Stop(mountpoint, mount, ids)
    released = False  # whether the kernel let go of the mount: unmounted from outside, or detached and done with
    try:
        on_ready()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop.on_signal)
            if read_ahead:
                nursery.start_soon(_set_read_ahead, mountpoint, read_ahead, ids)
            if settings.stats_interval:
                stats_file = settings.cache_dir / STATS_FILE
                nursery.start_soon(_report_statistics, mount, settings.stats_interval, stats_file, node_id)
            for task in tasks:
                nursery.start_soon(task)
            await pyfuse3.main()
            released = not stop.ended_loop  # the loop ends by itself only once the kernel has let go of the mount
            nursery.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=not (released or stop.detached))  # never a detached path: another mount may be there
        if metrics is not None:
            metrics.close()
        for dataset in mount.datasets.values():
            dataset.cache.close()
            dataset.backend.close()
    log.info("unmounted %s", mountpoint, extra=ids)


class Stop:
    """The stop of a mount on SIGTERM or SIGINT: no new work, the files being read read to the end, then the end.

    The mount is detached at once (a lazy unmount): the kernel takes it out of the file tree, so that no new open
    or lookup reaches it (the mountpoint shows the directory beneath, as after any unmount), but keeps it for the
    files already open, whose reads the daemon goes on serving: a loader reads its file to the end, not only the
    request in flight. Once the last of them is closed the kernel lets go of the mount, and the request loop ends.

    Files still open `STOP_GRACE` seconds after the signal no longer hold the stop. The jobs' throttles are closed, so
    that the reads waiting for remote IO (at 0 B/s, or behind others at a low rate) fail with EIO, the error of any
    failed read; and the backend calls still under way are abandoned (`backend_calls`), so that the reads waiting
    inside one (a storage node that hangs, its connection open and no answer, holds it until its `read_timeout`, and
    a thread cannot be interrupted) fail with EIO too, the daemon ending without waiting for their threads. The loop
    serves on for `RE_REQUEST_WINDOW` more, in which the kernel asks again for the pages whose reads failed (the same
    EIO) and their readers close their files, and then ends once the requests it is serving are answered: at once,
    as none waits for storage any more. Requests the kernel sends after the loop ended get ENOTCONN, or ECONNABORTED
    if they were queued as it ended, as from any mount whose daemon has gone.

    A mount that cannot be detached (fusermount3 fails) is served whole until the grace is over, its loop ended, and
    unmounted as it is closed."""

    def __init__(self, mountpoint: Path, mount: MountState, ids: Mapping[str, str]) -> None:
        self._mountpoint = mountpoint
        self._mount = mount
        self._ids = ids
        self.detached = False  # the mount is out of the file tree: closing it must not unmount its path again
        self.ended_loop = False  # the grace ran out and this ended the request loop

    async def on_signal(self) -> None:
        """Stop at the first SIGTERM or SIGINT; cancelled as the request loop ends. The signals stay caught until then:
        a second one must not kill the daemon midway (SIGTERM's default action), leaving a dead mount."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                log.info(
                    "received %s: unmounting; files open in it read on for up to %g s",
                    name,
                    STOP_GRACE,
                    extra=self._ids,
                )
                await self._detach()
                await trio.sleep(STOP_GRACE)
                self._fail_reads_still_waiting()
                await trio.sleep(RE_REQUEST_WINDOW)
                self.ended_loop = True
                pyfuse3.terminate()
                return

    async def _detach(self) -> None:
        """Detach the mount, unless something did already: a pod's preStop hook (`silod umount --lazy`, deploy/)
        detaches it before the signal, so that new opens find no mount at once; fusermount3 then refused with
        "Invalid argument", a WARNING at every stop of every node. Looked up in a worker thread, as is the detach:
        the lookup of a live mount's root asks this daemon's own request loop, which must be free to answer."""
        if not await trio.to_thread.run_sync(has_silod_mount, self._mountpoint):
            log.info("%s is detached already (by a preStop hook, say)", self._mountpoint, extra=self._ids)
            self.detached = True
            return
        try:
            await trio.to_thread.run_sync(functools.partial(unmount, self._mountpoint, lazy=True))
        except OSError as exc:
            log.warning(
                "cannot detach %s (%s): serving it until the grace is over", self._mountpoint, exc, extra=self._ids
            )
            return
        self.detached = True

    def _fail_reads_still_waiting(self) -> None:
        """Fail the reads that wait for remote IO or inside a backend call, and every later read that needs storage."""
        log.info(
            "files are still open in %s %g s after the signal: failing their reads that wait for remote IO, and ending",
            self._mountpoint,
            STOP_GRACE,
            extra=self._ids,
        )
        for job in self._mount.jobs.values():
            if job.bucket is not None:
                job.bucket.close()
        abandoned, unstarted = self._mount.backend_calls.abandon()
        if abandoned or unstarted:  # a storage node that hangs, or one too slow for the grace: worth an operator's look
            log.warning(
                "abandoned %d backend call%s that storage had not answered %g s after the signal%s: their reads fail "
                "with EIO, and the daemon ends without waiting for them",
                abandoned,
                "" if abandoned == 1 else "s",
                STOP_GRACE,
                f" (and {unstarted} waiting for a thread to make one)" if unstarted else "",
                extra=self._ids,
            )


async def _set_read_ahead(mountpoint: Path, size: int, ids: Mapping[str, str]) -> None:
    """Set the kernel's read-ahead once the mount answers; without root the kernel's default stays."""
    try:
        setting = await trio.to_thread.run_sync(set_read_ahead, mountpoint, size, abandon_on_cancel=True)
    except OSError as exc:
        log.info("kernel read-ahead on %s left at the kernel's default: %s", mountpoint, exc, extra=ids)
        return
    log.info("kernel read-ahead on %s: %d KiB (%s)", mountpoint, size // 1024, setting, extra=ids)


def _remove_earlier_statistics(stats_file: Path, ids: dict[str, str]) -> None:
    """Remove the statistics file an earlier daemon on this cache dir left (it writes until it stops, and a killed
    one cannot clean up), whether or not this one writes any: no numbers are better than a dead process's. The
    cache dir is this daemon's (its lock), so the file is no live daemon's."""
    try:
        stats_file.unlink(missing_ok=True)
    except OSError as exc:  # a read-only or failing cache disk: the mount serves all the same
        log.warning("cannot remove the statistics an earlier daemon left in %s: %s", stats_file, exc, extra=ids)


async def _report_statistics(mount: MountState, interval: float, stats_file: Path, node_id: str | None) -> None:
    """Every `interval` seconds: one log line per job, and all numbers as JSON in `stats_file`.

    A file left by an earlier daemon is removed at the start (`_remove_earlier_statistics`). A file that cannot
    be written (a full or
    vanished disk, no file descriptor left) is warned about once and tried again every interval: statistics
    are never worth a mount its readers depend on.

    The file is written through a descriptor of its directory, not its path: a cache dir deleted and made again
    (by an operator, or by another daemon given the same cache dir, whose lock went with the files) or a cache
    disk unmounted under the daemon gets nothing from it, as the cache itself writes nothing there."""
    try:
        directory = os.open(stats_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("statistics not written to %s: cannot open its directory: %s", stats_file, exc)
        return
    try:
        await _write_statistics_every(mount, interval, directory, stats_file, node_id)
    finally:
        os.close(directory)


async def _write_statistics_every(
    mount: MountState, interval: float, directory: int, stats_file: Path, node_id: str | None
) -> None:
    failing = False
    while True:
        await trio.sleep(interval)
        text = _statistics_text(mount, trio.current_time(), node_id)
        try:
            _write_atomically(directory, stats_file.name, text)
        except OSError as exc:
            if not failing:
                log.warning("statistics not written to %s (trying every %g s): %s", stats_file, interval, exc)
            failing = True
            continue
        if failing:
            log.info("statistics written to %s again", stats_file)
        failing = False


def _statistics_text(mount: MountState, now: float, node_id: str | None) -> str:
    """Log one line per job and return the statistics file's text. A function of its own so that the loop that
    writes the file every few seconds keeps no job or dataset alive between writes (its loop variables did: a
    finished job's dataset, its backend and its cache stayed in memory until another job was served)."""
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
    return json.dumps(document, indent=1)


def _write_atomically(directory: int, name: str, text: str) -> None:
    """Replace the file `name` in the directory open as `directory` with `text`, so that a reader sees the old
    file or the new one, never a partial one."""
    temporary = f"{name}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE, dir_fd=directory)
    with open(fd, "w") as file:
        os.fchmod(fd, PRIVATE_FILE)  # a temporary file an earlier silod left keeps its mode through O_TRUNC
        file.write(text)
    os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
