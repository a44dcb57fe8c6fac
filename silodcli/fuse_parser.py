"""The command line of `silod mount`, `silod node` and `silod umount` (`fuse_client` and `umount` run them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from datamgr.defaults import DATAMGR_ENV, DEFAULT_DATAMGR
from fuseclient.read_buffers import DEFAULT_READ_BUFFER_BYTES, check_read_buffer
from fuseclient.readahead import DEFAULT_READ_AHEAD, check_read_ahead
from silodcli import config
from silodcli.args import (
    ActionAfterItsOptions,
    AppendOptionOnce,
    argument_type,
    datamgr_address_arg,
    gpus_arg,
    interval_seconds,
    option_arg,
    option_env_arg,
    path_arg,
    port_arg,
    rate_arg,
    size_arg,
)
from silodcli.config import ConfigurableParser
from silodcli.deferred import Deferred
from silodcli.security_flags import add_client_flags
from silodlib.manifest import DEFAULT_CHUNK_SIZE
from silodlib.units import parse_size

read_ahead_arg = argument_type(lambda text: check_read_ahead(parse_size(text)), "read-ahead")
read_buffer_arg = argument_type(lambda text: check_read_buffer(parse_size(text)), "read-buffer")
READ_BUFFER_HELP = (
    "bytes of uncached items that open files hold for their next reads, all together (default 256MiB, at least "
    "8MiB); past it the least recently read go, to be fetched again if read again"
)
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


def add_commands(
    sub: argparse._SubParsersAction[ConfigurableParser], client_command: Callable[[ConfigurableParser, str], None]
) -> None:
    """`silod mount`, `silod node` (with `silod node remove`, made a client command by `client_command`) and
    `silod umount`."""
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
    mount_p.add_argument("--option", type=option_arg, action=AppendOptionOnce, default=[], metavar="KEY=VALUE")
    mount_p.add_argument(
        "--option-env", type=option_env_arg, action=AppendOptionOnce, default=[], metavar="KEY=ENV_VAR"
    )
    mount_p.add_argument("--chunk-size", type=size_arg, default=DEFAULT_CHUNK_SIZE, metavar="SIZE")
    mount_p.add_argument("--allow-other", action="store_true", help="let other users (containers) read the mount")
    mount_p.add_argument(
        "--kernel-read-ahead", type=read_ahead_arg, default=DEFAULT_READ_AHEAD, metavar="SIZE", help=READ_AHEAD_HELP
    )
    mount_p.add_argument(
        "--read-buffer", type=read_buffer_arg, default=DEFAULT_READ_BUFFER_BYTES, metavar="SIZE", help=READ_BUFFER_HELP
    )
    mount_p.add_argument("--foreground", action="store_true", help="stay attached instead of daemonizing")
    mount_p.add_argument("--stats-interval", type=interval_seconds, metavar="S", help="log per-job statistics")
    mount_p.add_argument("--metrics-port", type=port_arg, metavar="PORT", help="serve Prometheus /metrics (all hosts)")
    mount_p.add_argument("--log-file", type=path_arg, metavar="FILE", help="daemon log (default CACHE_DIR/mount.log)")
    mount_p.set_defaults(run=Deferred("silodcli.fuse_client:run_mount"), default_log_level="INFO")

    node_p = sub.add_parser(
        "node",
        usage="%(prog)s --node-id ID --mountpoint M --cache-dir C [options]\n"
        "       %(prog)s remove NODE_ID [--datamgr ADDR]",
        help="run the node agent: a mount kept in step with the data manager's allocations",
        description="Register this node, mount MOUNTPOINT and keep one directory per job with workers here, "
        "with the cache quotas and remote IO rates the data manager allocates.",
    )
    with config.settings(node_p, "node", with_globals=True):
        node_p.add_argument(
            "--datamgr",
            type=datamgr_address_arg,
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
            "--report-interval", type=interval_seconds, default=5.0, metavar="S", help="usage reports (default 5)"
        )
        node_p.add_argument("--allow-other", action="store_true", help="let other users (containers) read the mount")
        node_p.add_argument(
            "--kernel-read-ahead", type=read_ahead_arg, default=DEFAULT_READ_AHEAD, metavar="SIZE", help=READ_AHEAD_HELP
        )
        node_p.add_argument(
            "--read-buffer",
            type=read_buffer_arg,
            default=DEFAULT_READ_BUFFER_BYTES,
            metavar="SIZE",
            help=READ_BUFFER_HELP,
        )
        node_p.add_argument("--stats-interval", type=interval_seconds, metavar="S", help="log per-job statistics")
        node_p.add_argument(
            "--metrics-port", type=port_arg, metavar="PORT", help="serve Prometheus /metrics (all hosts)"
        )
        add_client_flags(node_p)
    node_p.add_argument("--foreground", action="store_true", help="stay attached instead of daemonizing")
    node_p.add_argument("--log-file", type=path_arg, metavar="FILE", help="daemon log (default C/node.log)")
    node_p.set_defaults(run=Deferred("silodcli.fuse_client:run_node"), default_log_level="INFO")
    actions = node_p.add_subparsers(
        action=ActionAfterItsOptions,
        dest="node_action",
        metavar="ACTION",
        help="instead of running the agent:",
        prog=node_p.prog,  # not derived from node's two-line usage
    )
    remove_p = actions.add_parser(
        "remove",
        help="unregister a node whose agent is stopped for good or is to register again with other parameters",
        description="Unregister NODE_ID. The data manager refuses it while workers of unfinished jobs run there or "
        "a suspending job holds GPUs on it, then while the tenants' virtual clusters need its cells (they fit the "
        "nodes with it, not without: shrink them or register a node in its place first, or give --force), then while "
        "its agent still reports, --force or not (stop it, and wait until the data manager marks the node "
        "unavailable, its --node-timeout after the last report: a running agent would register it again).",
    )
    remove_p.add_argument("node_id", metavar="NODE_ID")
    remove_p.add_argument(
        "--force",
        action="store_true",
        help="remove it even if the tenants' virtual clusters then no longer fit the nodes (their guarantee is "
        "lost until a node takes its place: to register it again with another --cache-capacity, say); it does not "
        "remove a node in use or one whose agent still reports",
    )
    client_command(remove_p, "node_remove")
    remove_p.set_defaults(default_log_level="WARNING")

    umount_p = sub.add_parser("umount", help="unmount a silod mount")
    umount_p.add_argument("mountpoint", type=path_arg, metavar="MOUNTPOINT")
    umount_p.add_argument("--lazy", action="store_true", help="detach now even if files are open in it")
    umount_p.set_defaults(run=Deferred("silodcli.umount:run_umount"))
