"""`silod datamgr serve`: the data manager, until SIGTERM or SIGINT; `silod datamgr backup` and `restore`: a
copy of its state, and that copy made its state again."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable

from datamgr.logs import log_fatal
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
        log_fatal(f"silod: {exc}")
        return EXIT_USAGE
    return 0


def run_backup(args: argparse.Namespace) -> int:
    def backup() -> str:
        revision = back_up(args.state_dir, args.file)
        return f"backed up state dir {args.state_dir} at revision {revision} to {args.file}"

    return _on_state_dir(backup, f"cannot write the backup {args.file}")


def run_restore(args: argparse.Namespace) -> int:
    def restore_file() -> str:
        revision, kept = restore(args.state_dir, args.file)
        replaced = f"; the database it replaces is kept as {kept}" if kept else ""
        return f"restored state dir {args.state_dir} to revision {revision} from {args.file}{replaced}"

    return _on_state_dir(restore_file, f"cannot restore into state dir {args.state_dir}")


def _on_state_dir(command: Callable[[], str], failing: str) -> int:
    """Run a command on a state dir and print its line; exit 2 with the refusal (or `failing` and the OS's
    reason) if it is refused."""
    try:
        line = command()
    except StateDirError as exc:
        print(f"silod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        file = f"{exc.filename}: " if exc.filename and str(exc.filename) not in failing else ""  # which file refused
        print(f"silod: {failing}: {file}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(line)
    return 0
