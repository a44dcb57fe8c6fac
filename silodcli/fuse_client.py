"""`silod mount`, `silod node` and `silod umount`: the FUSE client, standalone or following the data manager."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from datamgr.client import DATAMGR_ENV, DEFAULT_DATAMGR
from datamgr.entities import InvalidArgument
from datamgr.security import add_client_flags, client_flags
from datamgr.validation import check_chunk_size, check_dataset_uri, check_id
from fuseclient import agent, assembly, daemon, runtime
from fuseclient.readahead import DEFAULT_READ_AHEAD, check_read_ahead
from silodcli import config
from silodcli.args import (
    argument_type,
    gpus_arg,
    option_arg,
    option_env_arg,
    path_arg,
    port_arg,
    positive_seconds,
    rate_arg,
    size_arg,
)
from silodcli.config import ConfigurableParser
from silodlib.backends import InvalidBackendOption, NoSuchObject, open_backend
from silodlib.grpc_channel import ChannelSecurity, SecurityConfigError
from silodlib.manifest import DEFAULT_CHUNK_SIZE
from silodlib.units import parse_size

read_ahead_arg = argument_type(lambda text: check_read_ahead(parse_size(text)), "read-ahead")
READ_AHEAD_HELP = (
    "how far the kernel reads ahead in a file; its read requests to the daemon grow with it, up to 1MiB "
    "(default 1MiB; 0 keeps the kernel's 128KiB). Needs root, else the kernel's default stays"
)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"{text!r} must be NAME=VALUE")
    return key, value


def _uri_and_size(text: str) -> tuple[str, int]:
    uri, sep, size = text.rpartition("=")
    if not sep or not uri:
        raise argparse.ArgumentTypeError(f"{text!r} must be DATASET_URI=SIZE")
    return uri, size_arg(size)


def _job_and_rate(text: str) -> tuple[str, int]:
    job_id, rate = _pair(text)
    return job_id, rate_arg(rate)


def add_commands(sub: argparse._SubParsersAction[ConfigurableParser]) -> None:
    mount_p = sub.add_parser(
        "mount",
        help="mount datasets read-only, one directory per job, with a uniform cache and throttled remote reads",
        description="Serve MOUNTPOINT/JOB_ID/ as each job's dataset. Allocations are fixed here; "
        "`silod node` takes them from the data manager instead.",
    )
    mount_p.add_argument("mountpoint", type=path_arg, metavar="MOUNTPOINT")
    mount_p.add_argument("--cache-dir", type=path_arg, required=True, metavar="DIR", help="local disk for the cache")
    mount_p.add_argument("--job", type=_pair, action="append", required=True, metavar="JOB_ID=DATASET_URI")
    mount_p.add_argument(
        "--cache-size", type=_uri_and_size, action="append", default=[], metavar="URI=SIZE",
        help="a dataset's cache quota on this node, e.g. s3://b/train=500GiB (default 0: cache nothing)",
    )  # fmt: skip
    mount_p.add_argument(
        "--io-rate", type=_job_and_rate, action="append", default=[], metavar="JOB_ID=RATE",
        help="a job's remote IO rate, e.g. job1=200MB/s; 0 blocks uncached reads (default: unthrottled)",
    )  # fmt: skip
    mount_p.add_argument("--option", type=option_arg, action="append", default=[], metavar="KEY=VALUE")
    mount_p.add_argument("--option-env", type=option_env_arg, action="append", default=[], metavar="KEY=ENV_VAR")
    mount_p.add_argument("--chunk-size", type=size_arg, default=DEFAULT_CHUNK_SIZE, metavar="SIZE")
    mount_p.add_argument("--allow-other", action="store_true", help="let other users (containers) read the mount")
    mount_p.add_argument(
        "--kernel-read-ahead", type=read_ahead_arg, default=DEFAULT_READ_AHEAD, metavar="SIZE", help=READ_AHEAD_HELP
    )
    mount_p.add_argument("--foreground", action="store_true", help="stay attached instead of daemonizing")
    mount_p.add_argument("--stats-interval", type=positive_seconds, metavar="S", help="log per-job statistics")
    mount_p.add_argument("--metrics-port", type=port_arg, metavar="PORT", help="serve Prometheus /metrics (all hosts)")
    mount_p.add_argument("--log-file", type=path_arg, metavar="FILE", help="daemon log (default CACHE_DIR/mount.log)")
    mount_p.set_defaults(run=run_mount, default_log_level="INFO")

    node_p = sub.add_parser(
        "node",
        help="run the node agent: a mount kept in step with the data manager's allocations",
        description="Register this node, mount MOUNTPOINT and keep one directory per job with workers here, "
        "with the cache quotas and remote IO rates the data manager allocates.",
    )
    with config.settings(node_p, "node", with_globals=True):
        node_p.add_argument(
            "--datamgr",
            default=DEFAULT_DATAMGR,
            metavar="ADDR",
            help=f"data manager HOST:PORT (env {DATAMGR_ENV}; default %(default)s)",
        )
        node_p.add_argument("--node-id", required=True, metavar="ID")
        node_p.add_argument("--mountpoint", type=path_arg, required=True, metavar="M")
        node_p.add_argument("--cache-dir", type=path_arg, required=True, metavar="C")
        node_p.add_argument(
            "--cache-capacity",
            type=size_arg,
            metavar="SIZE",
            help="cache space to offer (default: the free space of C)",
        )
        node_p.add_argument(
            "--gpus",
            type=gpus_arg,
            default=0,
            metavar="N",
            help="GPUs the data manager's policy may place jobs on (jobs registered with --gpus; default 0: none)",
        )
        node_p.add_argument("--address", default="", metavar="HOST:PORT", help="shown in status (default: hostname)")
        node_p.add_argument(
            "--report-interval", type=positive_seconds, default=5.0, metavar="S", help="usage reports (default 5)"
        )
        node_p.add_argument("--allow-other", action="store_true", help="let other users (containers) read the mount")
        node_p.add_argument(
            "--kernel-read-ahead", type=read_ahead_arg, default=DEFAULT_READ_AHEAD, metavar="SIZE", help=READ_AHEAD_HELP
        )
        node_p.add_argument("--stats-interval", type=positive_seconds, metavar="S", help="log per-job statistics")
        node_p.add_argument(
            "--metrics-port", type=port_arg, metavar="PORT", help="serve Prometheus /metrics (all hosts)"
        )
        add_client_flags(node_p)
    node_p.add_argument("--foreground", action="store_true", help="stay attached instead of daemonizing")
    node_p.add_argument("--log-file", type=path_arg, metavar="FILE", help="daemon log (default C/node.log)")
    node_p.set_defaults(run=run_node, default_log_level="INFO")

    umount_p = sub.add_parser("umount", help="unmount a silod mount")
    umount_p.add_argument("mountpoint", type=path_arg, metavar="MOUNTPOINT")
    umount_p.add_argument("--lazy", action="store_true", help="detach now even if files are open in it")
    umount_p.set_defaults(run=run_umount)


def _check_mountpoint(field: str, path: Path) -> None:
    try:
        daemon.prepare_mountpoint(path)
    except OSError as exc:
        reason = "is not a directory" if isinstance(exc, (FileNotFoundError, NotADirectoryError)) else exc.strerror
        raise InvalidArgument(f"{field} {path} {reason}") from None


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
        stats_interval=args.stats_interval,
        metrics_port=args.metrics_port,
    )


def run_mount(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except InvalidArgument as exc:
        print(f"silod mount: {exc}", file=sys.stderr)
        return 2
    return _run_daemon(
        args, "mount", config.cache_dir, "mount.log", lambda ready: trio.run(runtime.serve, config, ready)
    )


def run_node(args: argparse.Namespace) -> int:
    try:
        _check_mountpoint("--mountpoint", args.mountpoint)
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
            stats_interval=args.stats_interval,
            metrics_port=args.metrics_port,
            security=security,
        )
    except (InvalidArgument, SecurityConfigError) as exc:
        print(f"silod node: {exc}", file=sys.stderr)
        return 2
    return _run_daemon(
        args, "node", config.cache_dir, "node.log", lambda ready: trio.run(agent.run_agent, config, ready)
    )


def _run_daemon(
    args: argparse.Namespace,
    command: str,
    cache_dir: Path,
    log_name: str,
    serve: Callable[[daemon.ReadyCallback], None],
) -> int:
    """Take the cache directory (exit 2 if another daemon has it), then serve in the foreground, or detach
    once the mount is live (exit 1, naming the log, if it is not). The lock's descriptor stays open for as
    long as this process, or the detached daemon it forks, serves."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        assembly.lock_cache_dir(cache_dir)  # never closed: the lock lasts as long as the serving process
    except assembly.CacheDirInUse as exc:
        print(f"silod {command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path under /proc, a file in the way, a read-only file system, no permission
        print(f"silod {command}: cannot use --cache-dir {cache_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    default_log = cache_dir / log_name
    if args.foreground:
        try:
            serve(lambda: None)
        except (agent.AgentError, assembly.MountError) as exc:
            print(f"silod {command}: {exc}", file=sys.stderr)
            return 1
        return 0
    log_file = args.log_file or default_log
    code = daemon.run_detached(serve, log_file)
    if code:
        print(f"silod {command}: the mount did not start; see {log_file}", file=sys.stderr)
    return code


def run_umount(args: argparse.Namespace) -> int:
    try:
        daemon.unmount(args.mountpoint, lazy=args.lazy)
    except OSError as exc:
        print(f"silod umount: {exc}", file=sys.stderr)
        return 1
    return 0
