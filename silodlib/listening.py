"""Why a server cannot listen where it was told to, in words an operator can act on: the data manager's gRPC
port and both daemons' /metrics share it."""

from __future__ import annotations

import errno
import socket


def why_not_listening(exc: OSError, host: str) -> str:
    """What `exc`, raised binding a listening socket on `host`, means."""
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another program, or another silod daemon, listens there)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    return exc.strerror or str(exc)


def probe_listening(host: str, port: int) -> OSError | None:
    """The error binding `host:port` with a plain socket gives, or None if it can be bound now: for a server
    (gRPC's) whose own message says only that binding failed."""
    try:
        with socket.create_server((host.strip("[]"), port)):
            return None
    except OSError as exc:
        return exc
