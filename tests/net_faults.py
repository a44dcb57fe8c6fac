"""A TCP connection that goes silent without closing: a half-open connection, as a NAT or firewall that drops
its state, a partitioned network or a peer whose host vanished leaves one. Neither end hears a FIN or a reset;
only keepalive or a timeout can find it.

`silenced_connections` has nftables drop every packet of a process's established connections to a loopback
port, both ways, while new connections pass: the kernel's own firewall, no proxy in the path.

`dropped_connections` is the other half: nftables drops every new connection's SYN to a loopback port, as a
firewall's drop rule or a host that is gone does, so a connect neither succeeds nor is refused; it only times out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator

from tests.storage_servers import missing_dependency


def connection_ports(pid: int, port: int) -> list[int]:
    """The local ports of `pid`'s established TCP connections to `port` (from `ss`)."""
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( dport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    # Recv-Q, Send-Q, local address, peer address, process: "[::ffff:127.0.0.1]:48482 ... users:(("silod",pid=1,..
    return sorted(int(line.split()[2].rsplit(":", 1)[1]) for line in listed.splitlines() if f"pid={pid}," in line)


@contextlib.contextmanager
def silenced_connections(pid: int, port: int) -> Iterator[list[int]]:
    """Drop every packet of `pid`'s established connections to loopback `port`, both ways, until the block ends;
    yields their local ports. Connections made meanwhile pass. A missing `nft` (Debian's nftables) or a kernel
    that refuses the table is a missing dependency."""
    ports = connection_ports(pid, port)
    assert ports, f"process {pid} has no established connection to port {port}"
    # On loopback both directions of a connection arrive through the input hook.
    drops = "".join(f"tcp sport {p} tcp dport {port} drop\ntcp sport {port} tcp dport {p} drop\n" for p in ports)
    with _dropping(f"silod_test_{os.getpid()}_{port}", drops):
        yield ports


@contextlib.contextmanager
def dropped_connections(port: int) -> Iterator[Callable[[], None]]:
    """Drop the SYN of every new connection to loopback `port` until the block ends, or until the function it yields
    is called: a connect to the port then neither succeeds nor is refused. Established connections pass. A missing
    `nft` or a kernel that refuses the table is a missing dependency."""
    with _dropping(
        f"silod_test_{os.getpid()}_syn_{port}", f"tcp dport {port} tcp flags & (syn | ack) == syn drop\n"
    ) as lift:
        yield lift


@contextlib.contextmanager
def _dropping(table: str, drops: str) -> Iterator[Callable[[], None]]:
    """nftables table `table` dropping the packets `drops` (rules, one a line) says on loopback's input, until the
    block ends or the function it yields is called."""
    hook = "type filter hook input priority 0; policy accept;"
    rules = f"table inet {table} {{\nchain input {{\n{hook}\n{drops}}}\n}}\n"
    try:
        added = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
    except FileNotFoundError:
        missing_dependency("nft is not installed (Debian package nftables; `make setup` installs it)")
    if added.returncode != 0:
        missing_dependency(f"cannot add an nftables table here: {added.stderr.strip()}")
    lifted = False

    def lift() -> None:
        nonlocal lifted
        if not lifted:
            lifted = True
            subprocess.run(["nft", "delete", "table", "inet", table], check=True)

    try:
        yield lift
    finally:
        lift()
