"""`silod mount` and `silod node`: the FUSE client, standalone or following the data manager (their command line
is `fuse_parser`'s; `silod umount` is `umount`'s)."""

from __future__ import annotations

import argparse
import errno
import os
from collections.abc import Callable
from pathlib import Path

import trio

from datamgr.entities import InvalidArgument
from datamgr.logs import log_fatal
from datamgr.validation import check_chunk_size, check_dataset_uri, check_id
from fuseclient import agent, assembly, daemon, runtime
from silodcli.security_flags import client_flags
from silodlib.backends import InvalidBackendOption, NoSuchObject, open_backend
from silodlib.credentials import ChannelSecurity, SecurityConfigError
from silodlib.directories import make_directory, user_name
from silodlib.privacy import PRIVATE_DIRECTORY


def _check_mountpoint(field: str, path: Path) -> None:
    try:
        daemon.prepare_mountpoint(path)
    except OSError as exc:
        raise InvalidArgument(_mountpoint_refusal(field, path, exc, os.getuid(), daemon.mount_owner(path))) from None


def _check_cache_dir_outside(cache_field: str, cache_dir: Path, mount_field: str, mountpoint: Path) -> None:
    """Refuse a cache dir that is the mountpoint or inside it (after symlinks): the mount hides it from the daemon
    that caches there, whose cache then fails as if its disk had gone, and the free space it offers (`silod node`
    registers it) is that of the file system the mount hides."""
    cache, mount = cache_dir.resolve(), mountpoint.resolve()
    if cache == mount:
        where = f"is {mount_field} {mountpoint}"
    elif cache.is_relative_to(mount):
        where = f"is inside {mount_field} {mountpoint}"
    else:
        return
    raise InvalidArgument(f"{cache_field} {cache_dir} {where}: the mount would hide it; give a directory outside it")


def _mountpoint_refusal(field: str, path: Path, exc: OSError, uid: int, owner: int | None) -> str:
    """Why `path` cannot be a mountpoint, `exc` being what preparing it raised for user `uid`, and `owner` whoever
    mounted the silod mount the kernel's table shows there (None: none). A FUSE mount, live or dead, refuses every
    user but its owner (and, for a live one with --allow-other, those allowed in), root included."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return f"{field} {path} is not a directory"
    if exc.errno == errno.EBUSY:
        return f"{field} {path} {exc.strerror}"  # "is a live silod mount; unmount it first (...)"
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return f"{field} {path} cannot be checked (listing it: {exc.strerror})"
    if owner is not None and owner != uid:
        name = user_name(owner)
        return (
            f"{field} {path} cannot be checked (listing it: {exc.strerror}): it is a silod mount of {name}'s, live or "
            f"dead, which only {name} can unmount: as {name}, run silod umount {path} (or fusermount3 -u {path})"
        )
    return (
        f"{field} {path} cannot be checked (listing it: {exc.strerror}): give {user_name(uid)} read access "
        f"to it; if it is another user's mount, live or dead, that user can unmount it (fusermount3 -u {path})"
    )


def _check_backend(uri: str, options: dict[str, str]) -> None:
    """Refuse options the dataset's backend does not take, or a local dataset directory that is not there,
    before the daemon starts: opening a backend checks both and makes no request."""
    try:
        open_backend(uri, options).close()
    except (InvalidBackendOption, NoSuchObject) as exc:
        raise InvalidArgument(
            f"--job DATASET_URI {exc}" if isinstance(exc, NoSuchObject) else f"--option {exc}"
        ) from None


def _config(args: argparse.Namespace) -> assembly.MountConfig:
    """Cross-check the arguments; raises InvalidArgument naming the offending one."""
    _check_mountpoint("mountpoint", args.mountpoint)
    _check_cache_dir_outside("--cache-dir", args.cache_dir, "MOUNTPOINT", args.mountpoint)
    jobs: dict[str, str] = {}
    for job_id, uri in args.job:
        if job_id in jobs:
            raise InvalidArgument(f"--job {job_id} is given twice")
        jobs[check_id("--job JOB_ID", job_id)] = check_dataset_uri("--job DATASET_URI", uri)
    cache_sizes = {check_dataset_uri("--cache-size", uri): size for uri, size in args.cache_size}
    unread = sorted(cache_sizes.keys() - set(jobs.values()))
    if unread:
        raise InvalidArgument(f"--cache-size names {unread[0]}, which no --job reads")
    io_rates = dict(args.io_rate)
    unknown = sorted(io_rates.keys() - jobs.keys())
    if unknown:
        raise InvalidArgument(f"--io-rate names job {unknown[0]!r}, which is not a --job")
    backend_options = dict(args.option + args.option_env)
    for uri in sorted(set(jobs.values())):
        _check_backend(uri, backend_options)
    return assembly.MountConfig(
        mountpoint=args.mountpoint.resolve(),
        cache_dir=args.cache_dir.resolve(),
        jobs=jobs,
        cache_sizes=cache_sizes,
        io_rates=io_rates,
        backend_options=backend_options,
        chunk_size=check_chunk_size("--chunk-size", args.chunk_size),
        allow_other=args.allow_other,
        read_ahead=args.kernel_read_ahead,
        read_buffer=args.read_buffer,
        stats_interval=args.stats_interval,
        metrics_port=args.metrics_port,
    )


def run_mount(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except InvalidArgument as exc:
        log_fatal(f"silod mount: {exc}")
        return 2
    return _run_daemon(args, "mount", config, "mount.log", lambda ready: trio.run(runtime.serve, config, ready))


def run_node(args: argparse.Namespace) -> int:
    try:
        _check_mountpoint("--mountpoint", args.mountpoint)
        _check_cache_dir_outside("--cache-dir", args.cache_dir, "--mountpoint", args.mountpoint)
        security = ChannelSecurity.load(*client_flags(args))  # read before detaching: errors reach the terminal
        config = agent.AgentConfig(
            datamgr=args.datamgr,
            node_id=check_id("--node-id", args.node_id),
            mountpoint=args.mountpoint.resolve(),
            cache_dir=args.cache_dir.resolve(),
            cache_capacity=args.cache_capacity,
            gpus=args.gpus,
            address=args.address,
            report_interval=args.report_interval,
            allow_other=args.allow_other,
            read_ahead=args.kernel_read_ahead,
            read_buffer=args.read_buffer,
            stats_interval=args.stats_interval,
            metrics_port=args.metrics_port,
            security=security,
        )
    except (InvalidArgument, SecurityConfigError) as exc:
        log_fatal(f"silod node: {exc}")
        return 2
    return _run_daemon(args, "node", config, "node.log", lambda ready: trio.run(agent.run_agent, config, ready))


# What a daemon that cannot start as configured raises, with a message that says why (no traceback needed).
_EXPECTED_FAILURES = (agent.AgentError, assembly.MountError)


def _run_daemon(
    args: argparse.Namespace,
    command: str,
    settings: runtime.ServeSettings,
    log_name: str,
    serve: Callable[[daemon.ReadyCallback], None],
) -> int:
    """Take the cache directory (exit 2 if another daemon has it, or it cannot be used) and open the log (exit 2 if
    it cannot be written), then serve in the foreground, or detach once the mount is live (exit 1, naming the log,
    if it is not). The lock's descriptor stays open for as long as this process, or the detached daemon it forks,
    serves. A mount FUSE would refuse is refused first thing in the daemon, before any dataset is listed or any
    node registered."""
    cache_dir = settings.cache_dir
    try:
        make_directory(cache_dir, PRIVATE_DIRECTORY)  # the daemon logs a cache dir it has to make private
        assembly.lock_cache_dir(cache_dir)  # never closed: the lock lasts as long as the serving process
    except assembly.CacheDirInUse as exc:
        log_fatal(f"silod {command}: {exc}")
        return 2
    except OSError as exc:  # a path under /proc, a file in the way, a read-only file system, no permission
        log_fatal(f"silod {command}: {assembly.cache_dir_refusal(cache_dir, exc)}")
        return 2

    def checked_serve(ready: daemon.ReadyCallback) -> None:
        runtime.check_fuse(settings.mountpoint, settings.allow_other)
        serve(ready)

    if args.foreground:
        try:
            checked_serve(lambda: None)
        except _EXPECTED_FAILURES as exc:
            log_fatal(f"silod {command}: {exc}")
            return 1
        return 0
    log_file = args.log_file or cache_dir / log_name
    try:
        log_fd = daemon.open_log(log_file)
    except OSError as exc:  # before detaching: the child would die of it, and name a log it never wrote
        log_fatal(f"silod {command}: {_log_refusal(log_file, exc)}")
        return 2
    failure = daemon.run_detached(checked_serve, log_file, log_fd, _EXPECTED_FAILURES)
    if failure is None:
        return 0
    log_fatal(f"silod {command}: {failure or 'the mount did not start'}; see {log_file}")
    return 1


def _log_refusal(log_file: Path, exc: OSError) -> str:
    """Why the daemon cannot log to `log_file` (`--log-file`, or CACHE_DIR/mount.log or node.log), and what to do."""
    said = exc.strerror or str(exc)
    user = user_name(os.geteuid())
    if exc.errno in (errno.EACCES, errno.EPERM) and os.path.lexists(log_file):
        fix = f"give the file to {user} (chown {user} {log_file}), or choose another --log-file"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        fix = f"choose a --log-file in a directory {user} can write"
    else:
        fix = f"choose a --log-file {user} can write, in a directory that exists"
    return f"cannot write the log {log_file}: {said}; {fix}"
