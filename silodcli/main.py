"""`silod`: one command with subcommands for the data manager, its clients and the demo.

Exit codes: 0 success, 1 the data manager rejected the call (or standard output could not be written), 2 bad
command line, 3 data manager unreachable, 130 interrupted (Ctrl-C) where the command does not end on it by design,
141 standard output's reader went away (`silod status | head -1`).
Building the command line loads only what parsing needs; what a command runs loads when it runs (`deferred`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from datamgr.defaults import DATAMGR_ENV, DEFAULT_DATAMGR, DEFAULT_LISTEN, DEFAULT_ROUND_SECONDS, EXTERNAL_POLICY
from datamgr.logs import setup_logging
from silodcli import config, fuse_parser
from silodcli.args import (
    AppendKeyOnce,
    AppendOptionOnce,
    backup_file_arg,
    cell_levels_arg,
    cells_arg,
    check_policy_name,
    chunk_size_arg,
    datamgr_address_arg,
    egress_cap_arg,
    epochs_arg,
    grace_arg,
    interval_seconds,
    job_class_arg,
    job_gpus_arg,
    key_value,
    listen_address,
    option_arg,
    option_env_arg,
    option_key_arg,
    path_arg,
    port_arg,
    priority_arg,
    rate_arg,
    size_arg,
    worker_arg,
)
from silodcli.config import ConfigError, ConfigurableParser
from silodcli.deferred import Deferred
from silodcli.exits import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from silodcli.security_flags import add_client_flags, add_server_flags
from silodcli.sim_parser import add_sim_parser
from silodcli.stdout import StdoutError, checked_stdout, discard_stdout


def _client_command(parser: ConfigurableParser, command: str) -> None:
    """Make `parser` a client command running `command`, a function of `silodcli.commands`."""
    with config.settings(parser, "client"):
        parser.add_argument(
            "--datamgr",
            type=datamgr_address_arg,
            default=DEFAULT_DATAMGR,
            metavar="ADDR",
            help=f"data manager HOST:PORT (env {DATAMGR_ENV}; default %(default)s)",
        )
        add_client_flags(parser)
    parser.set_defaults(
        run=Deferred("silodcli.commands:run_client_command"),
        client_command=Deferred(f"silodcli.commands:{command}"),
    )


def build_parser() -> ConfigurableParser:
    """The whole command line; `config.apply` then sets its defaults from the environment and config file."""
    parser = ConfigurableParser(
        prog="silod",
        description="Cache and remote IO as scheduler resources for DL training clusters (SiloD).",
        epilog="Sizes accept 500GiB, 1.5TB, 4096; rates accept 200MB/s, 1.5GiB/s, 1Gbps. "
        "Settings also come from SILOD_* variables and the config file: see docs/cli.md.",
    )
    parser.add_argument(
        config.CONFIG_FLAG, type=path_arg, metavar="FILE", help=f"TOML settings file (env {config.CONFIG_ENV})"
    )
    with config.settings(parser):
        parser.add_argument(
            "--log-level",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            help="default: INFO for the data manager, node and mount, WARNING for everything else",
        )
        parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    datamgr = sub.add_parser("datamgr", help="run the data manager").add_subparsers(dest="action", required=True)
    serve_p = datamgr.add_parser("serve", help="serve the gRPC data manager until SIGTERM/SIGINT")
    with config.settings(serve_p, "datamgr", with_globals=True):
        listen = serve_p.add_argument(
            "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help="default %(default)s"
        )  # checked where the data manager starts, naming it; from a variable or the file, as they are read
        config.check_setting(listen, listen_address)
        serve_p.add_argument("--state-dir", type=path_arg, required=True, metavar="DIR", help="where state is kept")
        serve_p.add_argument(
            "--remote-io-limit",
            type=egress_cap_arg,
            metavar="RATE",
            help="cluster egress cap, e.g. 1GB/s (default: none)",
        )
        serve_p.add_argument(
            "--node-timeout",
            type=interval_seconds,
            default=30.0,
            metavar="S",
            help="seconds without a report before a node is marked unavailable (default %(default)s)",
        )
        serve_p.add_argument(
            "--metrics-port", type=port_arg, metavar="PORT", help="serve Prometheus /metrics on the --listen host"
        )
        policy = serve_p.add_argument(
            "--policy",
            default=EXTERNAL_POLICY,
            metavar="NAME",
            help="run this scheduler policy (e.g. greedy; needs --remote-io-limit) and apply its cache and remote "
            "IO decisions, refusing manual allocations; external (the default) leaves allocation to outside "
            "callers such as silod alloc. An unknown name lists the known ones",
        )
        config.check_setting(policy, check_policy_name)
        serve_p.add_argument(
            "--round",
            dest="round_seconds",
            type=interval_seconds,
            default=DEFAULT_ROUND_SECONDS,
            metavar="SECONDS",
            help="with --policy (refused without one): the longest time between two rounds; job changes start one "
            "at once (default %(default)g)",
        )
        serve_p.add_argument(
            "--cell-levels",
            type=cell_levels_arg,
            default="",
            metavar="LEVELS",
            help="the GPUs' affinity hierarchy bottom up as NAME:BUDDIES, from one GPU to a node and above, e.g. "
            "gpu:1,pcie:2,socket:2,node:2 (a node of 8 GPUs): the levels tenants' virtual clusters reserve cells "
            "of (silod tenant add --cells node=2) and the hived policy places jobs in. Nodes with GPUs fill the "
            "node cells in node-id order (default: each node is one cell of its GPUs, levels gpu and node)",
        )
        add_server_flags(serve_p)
    serve_p.add_argument(
        "--policy-option",
        dest="policy_options",
        type=key_value,
        action=AppendKeyOnce,
        default=[],
        metavar="KEY=VALUE",
        help="a knob of the --policy, for a policy that takes knobs (tiresias-las: queues=1h, promote_knob=4, ...; "
        "see docs/scheduler.md); repeat for more, each key once. Command line only",
    )
    serve_p.set_defaults(run=Deferred("silodcli.serve:run_serve"), default_log_level="INFO")
    for action, about, file_type, file_help in (
        ("backup", "copy the state database to a new file, consistently, while the data manager runs or not",
         backup_file_arg, "the copy: the path of a new file, never replaced (not a directory)"),
        ("restore", "make a backup the state database of a stopped data manager's state dir, keeping the one it "
         "replaces", path_arg, "a copy silod datamgr backup made (the file, not a directory)"),
    ):  # fmt: skip
        state_p = datamgr.add_parser(action, help=about)
        with config.settings(state_p, "datamgr"):
            state_p.add_argument("--state-dir", type=path_arg, required=True, metavar="DIR", help="the state dir")
        state_p.add_argument("file", type=file_type, metavar="FILE", help=file_help)
        state_p.set_defaults(run=Deferred(f"silodcli.serve:run_{action}"))

    alloc = sub.add_parser("alloc", help="set allocations (the paper's two calls)").add_subparsers(
        dest="action", required=True
    )
    cache_p = alloc.add_parser("cache", help="AllocateCacheSize: a dataset's cache quota per node")
    cache_p.add_argument("dataset_uri", metavar="DATASET_URI")
    cache_p.add_argument("size", type=size_arg, metavar="SIZE", help="e.g. 500GiB")
    _client_command(cache_p, "alloc_cache")
    io_p = alloc.add_parser("io", help="AllocateRemoteIO: a job's remote IO rate")
    io_p.add_argument("job_id", metavar="JOB_ID")
    io_p.add_argument("rate", type=rate_arg, metavar="RATE", help="e.g. 200MB/s")
    _client_command(io_p, "alloc_io")

    dataset = sub.add_parser("dataset", help="register, update and inspect datasets").add_subparsers(
        dest="action", required=True
    )
    add_p = dataset.add_parser("add", help="list a dataset once and freeze its manifest")
    add_p.add_argument("uri", metavar="URI", help="s3://bucket/prefix, az://account/container/prefix, file:///path")
    add_p.add_argument(
        "--chunk-size", type=chunk_size_arg, metavar="SIZE", help="item size for large files, 64KiB to 1GiB (4MiB)"
    )
    _add_backend_option_flags(add_p)
    _client_command(add_p, "dataset_add")
    options_p = dataset.add_parser(
        "set-options",
        help="replace a registered dataset's backend options in place (rotated credentials), keeping its manifest "
        "and the nodes' caches; refused unless the dataset reads with the new options",
    )
    options_p.add_argument("uri", metavar="URI")
    _add_backend_option_flags(options_p, "a backend option to set (or replace)")
    options_p.add_argument(
        "--remove-option",
        type=option_key_arg,
        action="append",
        default=[],
        metavar="KEY",
        help="a backend option to remove (the others are kept)",
    )
    _client_command(options_p, "dataset_set_options")
    remove_p = dataset.add_parser("remove", help="unregister a dataset no job uses")
    remove_p.add_argument("uri", metavar="URI")
    _client_command(remove_p, "dataset_remove")
    show_p = dataset.add_parser("show", help="one dataset with its per-node cache usage")
    show_p.add_argument("uri", metavar="URI")
    show_p.add_argument("--json", action="store_true")
    _client_command(show_p, "dataset_show")

    job = sub.add_parser("job", help="register, finish and inspect jobs").add_subparsers(dest="action", required=True)
    job_add = job.add_parser(
        "add", help="register a job and where its workers run, or the GPUs it asks the policy to place it on"
    )
    job_add.add_argument("job_id", metavar="JOB_ID")
    job_add.add_argument("--dataset", required=True, metavar="URI")
    job_add.add_argument("--ideal-rate", type=rate_arg, required=True, metavar="RATE", help="f*, e.g. 114MB/s")
    where = job_add.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--worker",
        type=worker_arg,
        action="append",
        metavar="NODE_ID[:COUNT]",
        help="where the job's workers run (repeat per node); the job runs there until it finishes",
    )
    where.add_argument(
        "--gpus",
        type=job_gpus_arg,
        metavar="N",
        help="instead of --worker: submit the job pending, for the data manager's policy to place on N GPUs "
        "(a launcher follows the decisions: docs/deploy.md)",
    )
    job_add.add_argument(
        "--epochs",
        type=epochs_arg,
        default=0.0,
        metavar="N",
        help="how long the job trains, in passes over its dataset (fractions allowed, e.g. 0.07); policies such "
        "as sjf rank jobs by the work they have left (default: unknown)",
    )
    job_add.add_argument(
        "--irregular",
        action="store_true",
        help="the job does not read its dataset uniformly once per epoch (curriculum learning, weighted "
        "sampling): the policy gives it storage apart from the jobs its performance model describes",
    )
    job_add.add_argument(
        "--class",
        dest="job_class",
        type=job_class_arg,
        default="be",
        metavar="te|be",
        help="trial-and-error (te: short, latency-sensitive) or best-effort (be, the default): policies such as "
        "fitgpp preempt best-effort jobs for trial-and-error ones",
    )
    job_add.add_argument(
        "--grace-period",
        dest="grace_seconds",
        type=grace_arg,
        default=0.0,
        metavar="DURATION",
        help='how long the job keeps its GPUs once the policy preempts it, to checkpoint and stop ("90s", "3m", '
        '"1h"; at most a day; default 0: they go to other jobs at once)',
    )
    job_add.add_argument(
        "--tenant",
        default="",
        metavar="NAME",
        help="the registered tenant (silod tenant add) whose virtual cluster the job runs in, for policies such "
        "as hived (default: none; under hived such a job runs only as a low-priority one)",
    )
    job_add.add_argument(
        "--priority",
        type=priority_arg,
        default="high",
        metavar="high|low",
        help="high (the default: a regular job, guaranteed by its tenant's virtual cluster) or low (preemptible: "
        "it runs on GPUs no tenant's regular job needs, and is preempted when one does)",
    )
    _client_command(job_add, "job_add")
    finish_p = job.add_parser("finish", help="remove a finished job and its allocation")
    finish_p.add_argument("job_id", metavar="JOB_ID")
    _client_command(finish_p, "job_finish")
    job_show = job.add_parser("show", help="one job with its per-node rates and usage")
    job_show.add_argument("job_id", metavar="JOB_ID")
    job_show.add_argument("--json", action="store_true")
    _client_command(job_show, "job_show")

    _add_tenant_commands(sub)

    status_p = sub.add_parser("status", help="datasets, jobs, nodes and tenants")
    status_p.add_argument("--json", action="store_true", help="machine-readable output")
    status_p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=interval_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    _client_command(status_p, "status")

    fuse_parser.add_commands(sub, _client_command)
    add_sim_parser(sub)

    demo_p = sub.add_parser(
        "demo", help="the whole system on embedded defaults: storage, data manager, node agent, two jobs"
    )
    demo_p.add_argument(
        "--backend",
        choices=["azurite", "s3", "file"],
        default=os.environ.get("DEMO_BACKEND") or "azurite",
        help="where the demo datasets live (env DEMO_BACKEND; default %(default)s)",
    )
    demo_p.add_argument(
        "--short",
        action="store_true",
        default=bool(os.environ.get("DEMO_SHORT")),
        help="smaller datasets (env DEMO_SHORT)",
    )
    demo_p.set_defaults(run=Deferred("silodcli.demo:run"))
    return parser


def _add_tenant_commands(sub: argparse._SubParsersAction[ConfigurableParser]) -> None:
    tenant = sub.add_parser("tenant", help="register, list and remove tenants and their virtual clusters")
    actions = tenant.add_subparsers(dest="action", required=True)
    add_p = actions.add_parser(
        "add",
        help="register a tenant and its virtual cluster: the cells it is guaranteed, and the cache and remote IO "
        "reserved for its jobs",
    )
    add_p.add_argument("name", metavar="NAME")
    vc = add_p.add_mutually_exclusive_group(required=True)
    vc.add_argument(
        "--vc",
        type=path_arg,
        metavar="FILE",
        help='a TOML file with cells = { node = 2 } and optionally cache = "2TB", remote_io = "400MB/s" (or a '
        "file of [NAME] tables, as silod sim --tenants takes: the table of this tenant's NAME)",
    )
    vc.add_argument(
        "--cells",
        type=cells_arg,
        metavar="LEVEL=COUNT[,...]",
        help="the cells the VC reserves per level of the data manager's --cell-levels, e.g. node=2,gpu=1",
    )
    add_p.add_argument(
        "--cache", type=size_arg, metavar="SIZE", help="cache reserved for its jobs, e.g. 2TB (default: the file's, 0)"
    )
    add_p.add_argument(
        "--remote-io",
        type=rate_arg,
        metavar="RATE",
        help="remote IO reserved for its jobs, e.g. 400MB/s (default: the file's, 0)",
    )
    _client_command(add_p, "tenant_add")
    list_p = actions.add_parser("list", help="the tenants, their virtual clusters and what their jobs use")
    list_p.add_argument("--json", action="store_true")
    _client_command(list_p, "tenant_list")
    remove_p = actions.add_parser("remove", help="unregister a tenant that has no unfinished job")
    remove_p.add_argument("name", metavar="NAME")
    _client_command(remove_p, "tenant_remove")


def _add_backend_option_flags(parser: ConfigurableParser, what: str = "a backend option") -> None:
    """--option and --option-env, a dataset's backend options, each key once; `what` says what one is to the
    command."""
    parser.add_argument(
        "--option",
        type=option_arg,
        action=AppendOptionOnce,
        default=[],
        metavar="KEY=VALUE",
        help=f"{what}; each key once",
    )
    parser.add_argument(
        "--option-env",
        type=option_env_arg,
        action=AppendOptionOnce,
        default=[],
        metavar="KEY=ENV_VAR",
        help=f"{what}, its value read from an environment variable (use it for keys and tokens)",
    )


def parse_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """The command line over the environment over the config file. Raises ConfigError; exits 2 on a bad
    command line."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    config.apply(parser, argv, environ)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the command line; every command's output, `--help` included, checked (`_run`). Ctrl-C that a command
    does not take as its way to end (`status --watch` does) ends it with one line, not a traceback, and exit 130;
    the line adds what the interrupt's message says of the command's outputs (`sim_outputs`)."""
    try:
        with checked_stdout():
            return _run(argv, environ)
    except StdoutError as exc:
        discard_stdout()
        if isinstance(exc.error, BrokenPipeError):  # the reader has all it wants: end quietly, as `yes | head` does
            return EXIT_BROKEN_PIPE
        print(f"silod: cannot write standard output: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        print(f"silod: interrupted; {exc}" if str(exc) else "silod: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(argv: Sequence[str] | None, environ: Mapping[str, str] | None) -> int:
    try:
        args = parse_args(argv, environ)
    except ConfigError as exc:
        print(f"silod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "grpc_client", False):
        # gRPC's C core writes INFO lines to stderr ("Handshake failed with error SSL_ERROR_SSL ..."), each before
        # the one line in which the command says what failed and what to do. Read once, when grpc is first
        # imported, which the command has not done yet; GRPC_VERBOSITY set by the user wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    prefix = config.COMMAND_DEFAULT_PREFIX
    setup_logging(
        args.log_level or getattr(args, f"{prefix}log_level", "WARNING"),
        json_lines=args.log_json or getattr(args, f"{prefix}log_json", False),
    )
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
