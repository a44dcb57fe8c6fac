"""The security flags of the `silod` commands: the data manager's TLS and token files, and what a client
presents to it (`silodlib.credentials`), each flag falling back to its environment variable.

Apart from `datamgr.security` so that building the command line loads neither gRPC nor the server.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import NamedTuple

from silodlib.credentials import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TOKEN_FILE_ENV, read_token


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (see docs/datamgr.md)")
    group.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve TLS with this PEM certificate chain")
    group.add_argument("--tls-key", type=Path, metavar="FILE", help="the unencrypted PEM private key of --tls-cert")
    group.add_argument(
        "--tls-ca", type=Path, metavar="FILE", help="require client certificates signed by this CA (mutual TLS)"
    )
    group.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="require the token in FILE for changes and for the watch and manifest streams",
    )


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every command that talks to the data manager. No defaults here: the environment is read
    after parsing, so a flag wins over its variable and `--help` shows no paths."""
    parser.set_defaults(grpc_client=True)  # `main` quiets gRPC's own INFO lines for it
    group = parser.add_argument_group("security (see docs/datamgr.md)")
    group.add_argument(
        "--tls-ca", type=Path, metavar="FILE", help=f"use TLS; verify the data manager with this CA (env {TLS_CA_ENV})"
    )
    group.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help=f"client certificate for mutual TLS (env {TLS_CERT_ENV})"
    )
    group.add_argument("--tls-key", type=Path, metavar="FILE", help=f"its private key (env {TLS_KEY_ENV})")
    group.add_argument(
        "--auth-token-file", type=Path, metavar="FILE", help=f"send the token in FILE (env {TOKEN_FILE_ENV})"
    )


class ClientFlags(NamedTuple):
    """The client's security settings after flags and environment are combined, the token read."""

    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None
    token: str | None


def client_flags(args: argparse.Namespace) -> ClientFlags:
    """Each flag, else its environment variable (an empty one counts as unset). Raises SecurityConfigError."""

    def flag_or_env(value: Path | None, variable: str) -> Path | None:
        return value if value is not None else Path(os.environ[variable]) if os.environ.get(variable) else None

    token_file = flag_or_env(args.auth_token_file, TOKEN_FILE_ENV)
    return ClientFlags(
        flag_or_env(args.tls_ca, TLS_CA_ENV),
        flag_or_env(args.tls_cert, TLS_CERT_ENV),
        flag_or_env(args.tls_key, TLS_KEY_ENV),
        read_token(token_file) if token_file is not None else None,
    )
