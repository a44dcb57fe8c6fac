"""Addresses as HOST:PORT (and whether one is loopback), and why a server cannot listen where it was told to, in
words an operator can act on: the data manager's gRPC port and both daemons' /metrics share it."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket

# A host name or IPv4 address: letters, digits, `.`, `-` and `_` ("datamgr.example.internal", "0.0.0.0").
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")
_FORM = "HOST:PORT (no scheme; an IPv6 host in brackets, [::1]:7420)"


def host_and_port(address: str, lowest_port: int = 0) -> tuple[str, int]:
    """The host and port of HOST:PORT (an IPv6 host in brackets, `[::1]:7420`, returned with them), the port from
    `lowest_port` (0, any free port, is for a server to listen on) to 65535. Raises ValueError naming the address
    and the form: gRPC would take a malformed one (no port, port 99999, `http://`, `127.0.0.1:7420:9`) and fail
    only later, saying it cannot connect (the name does not resolve) or bind."""
    host, sep, port = address.rpartition(":")
    if "://" in address or (sep and not _is_host(host)):
        raise ValueError(f"{address!r} must be {_FORM}{_bare_ipv6_hint(address)}")
    if not sep or not port.isdigit() or not lowest_port <= int(port) <= 65535:
        raise ValueError(f"{address!r} must be HOST:PORT with a PORT from {lowest_port} to 65535, e.g. 127.0.0.1:7420")
    return host, int(port)


def _is_host(host: str) -> bool:
    """Whether `host` is a host name, an IPv4 address or an IPv6 address in brackets (with a zone, `%eth0`)."""
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.ip_address(host[1:-1]).version == 6
        except ValueError:
            return False
    return _HOST_NAME.fullmatch(host) is not None


def _bare_ipv6_hint(address: str) -> str:
    """What to write instead of an IPv6 address without brackets (`::1:7420`, `::1`), or "" if it is none."""
    host, _, port = address.rpartition(":")
    for bare, rest in ((host, f":{port}"), (address, ":PORT")):
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            continue
        return f": {bare} is an IPv6 address without brackets; write [{bare}]{rest}"
    return ""


def is_loopback_host(host: str) -> bool:
    """Whether `host` (of HOST:PORT, an IPv6 one in brackets) names this machine's loopback: `localhost`, 127.0.0.0/8
    or ::1. Any other name may reach the network, whatever it resolves to now."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
