"""`silod datamgr serve`: the data manager, until SIGTERM or SIGINT; `silod datamgr backup` and `restore`: a
copy of its state, and that copy made its state again."""

from __future__ import annotations

import argparse
import asyncio
import sys

from datamgr.server import ServeError, ServerConfig, serve
from datamgr.store.backup import back_up, restore
from datamgr.store.sqlite import StateDirError
from silodcli.exits import EXIT_USAGE
from silodlib.credentials import SecurityConfigError


def run_serve(args: argparse.Namespace) -> int:
    config = ServerConfig(
        args.listen,
        args.state_dir,
        args.remote_io_limit,
        args.node_timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        auth_token_file=args.auth_token_file,
        metrics_port=args.metrics_port,
        policy=args.policy,
        round_seconds=args.round_seconds,
        policy_options=tuple(args.policy_options),
        cell_levels=args.cell_levels,
    )
    try:
        asyncio.run(serve(config))
    except (ServeError, StateDirError, SecurityConfigError) as exc:
        print(f"silod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def run_backup(args: argparse.Namespace) -> int:
    try:
        revision = back_up(args.state_dir, args.out)
    except StateDirError as exc:
        print(f"silod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"silod: cannot write the backup {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"backed up state dir {args.state_dir} at revision {revision} to {args.out}")
    return 0


def run_restore(args: argparse.Namespace) -> int:
    try:
        revision, kept = restore(args.state_dir, args.backup)
    except StateDirError as exc:
        print(f"silod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"silod: cannot restore into state dir {args.state_dir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    replaced = f"; the database it replaces is kept as {kept}" if kept else ""
    print(f"restored state dir {args.state_dir} to revision {revision} from {args.backup}{replaced}")
    return 0
