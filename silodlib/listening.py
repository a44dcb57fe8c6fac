"""Addresses as HOST:PORT (and whether one is loopback), the addresses a server binds for a HOST, and why a server
cannot listen where it was told to, in words an operator can act on: the data manager's gRPC port and both daemons'
/metrics share it."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


# A host that stands for every address of the machine. gRPC binds one socket taking IPv6 and IPv4 for either.
_WILDCARDS = frozenset({"0.0.0.0", "::"})
# Binding failures that mean the machine lacks the address or its family (::1 where IPv6 is off): an address of
# several a host stands for is passed over on them, as gRPC's listener passes it over.
_LACKED = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """One socket address a server binds for a host; `dual_stack`: an IPv6 wildcard that takes IPv4 too."""

    family: socket.AddressFamily
    sockaddr: tuple[Any, ...]  # getaddrinfo's: (host, port), or for IPv6 (host, port, flow info, scope id)
    dual_stack: bool = False

    def at(self, port: int) -> tuple[Any, ...]:
        """The socket address at `port`."""
        return (self.sockaddr[0], port, *self.sockaddr[2:])


def listening_addresses(host: str) -> list[ListenAddress]:
    """The addresses a server told to listen on `host` (of HOST:PORT, an IPv6 one in brackets) binds, as the data
    manager's gRPC listener binds them, so that /metrics is served wherever gRPC is: for 0.0.0.0 or [::], one
    socket taking IPv6 and IPv4 where the machine has IPv6 (IPv4's wildcard where not); for `localhost`, ::1 and
    127.0.0.1 whatever the hosts file says (RFC 6761); for any other name or address, each address it resolves
    to. Raises OSError (socket.gaierror) for a name that does not resolve."""
    bare = host.removeprefix("[").removesuffix("]")
    if bare in _WILDCARDS:
        if socket.has_dualstack_ipv6():
            return [ListenAddress(socket.AF_INET6, ("::", 0, 0, 0), dual_stack=True)]
        return [ListenAddress(socket.AF_INET, ("0.0.0.0", 0))]
    names = ("::1", "127.0.0.1") if bare == "localhost" else (bare,)
    resolved = (
        ListenAddress(family, sockaddr)
        for name in names
        for family, _, _, _, sockaddr in socket.getaddrinfo(name, 0, type=socket.SOCK_STREAM)
    )
    return list(dict.fromkeys(resolved))


def bind_every_address(host: str, port: int, bind: Callable[[ListenAddress, int], int]) -> int:
    """Call `bind(address, port)` for each of `listening_addresses(host)`, all at one port: `port`, or for 0 the
    port the first `bind` returns (the one it bound). An address the machine lacks is passed over if another is
    bound; any other failure raises, and what was bound is the caller's to undo. Returns the port. Raises OSError."""
    addresses = listening_addresses(host)
    lacked: list[OSError] = []
    for address in addresses:
        try:
            port = bind(address, port)
        except OSError as exc:
            if exc.errno not in _LACKED:
                raise
            lacked.append(exc)
    if len(lacked) == len(addresses):
        raise lacked[0]
    return port


def probe_listening(host: str, port: int) -> OSError | None:
    """The error binding `host:port` as a server does (`bind_every_address`) gives, or None if it can be bound now:
    for a server (gRPC's) whose own message says only that binding failed, and to refuse a port before a start
    that cannot be taken back."""
    with contextlib.ExitStack() as bound:

        def bind(address: ListenAddress, at: int) -> int:
            server = socket.create_server(address.at(at), family=address.family, dualstack_ipv6=address.dual_stack)
            return int(bound.enter_context(server).getsockname()[1])

        try:
            bind_every_address(host, port, bind)
        except OSError as exc:
            return exc
    return None
