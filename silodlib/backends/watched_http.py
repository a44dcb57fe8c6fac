"""urllib3 connection pools whose connections put themselves under the deadline of the try that uses them
(`deadline.WATCHDOG`): while they open (a TLS handshake, a proxy's tunnel) and while they wait for each answer,
from its first byte.

An SDK hook sees an answer only once its status line and headers are in, so an answer whose headers trickle,
a byte within every `read_timeout`, would hold its try for good: a `stat` (a HEAD, only headers), and the
head of every read and listing page. A connection registers its socket with the calling thread's try as it
starts to wait for the answer (`getresponse`), which covers the head and then the body, read on the same
socket; and as soon as its TCP connection is made (`_new_conn`), since a handshake that trickles is bounded
only per byte by the connect timeout. Both SDKs send on urllib3 pools: botocore directly, the Azure SDK
through `requests`; each backend swaps its session's pool classes for these (`watched_pools`), which keeps
the SDK's own connection classes (botocore's, proxies' and SOCKS's) underneath.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from urllib3.connectionpool import HTTPConnectionPool

from silodlib.backends.deadline import WATCHDOG


class _WatchedConnection:
    """Mixed in before a urllib3 connection class: put the connection's socket under the calling thread's try (if
    any) once connected, before any handshake, and before waiting for each answer."""

    sock: Any  # None once closed, or once an answer that ends with the connection has taken the socket
    opened: _OpeningSocket | None = None  # the socket of the latest opening: a closed connection may open again

    def _new_conn(self) -> Any:
        sock = super()._new_conn()  # type: ignore[misc]  # the connection class mixed with
        self.opened = _OpeningSocket(self, sock.fileno())
        WATCHDOG.watch(self.opened)
        return sock

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        # The socket object itself: an answer that ends with the connection takes it over (the connection drops
        # it), and it keeps its descriptor until the answer is done with it.
        WATCHDOG.watch(self.sock)
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]  # the connection class mixed with


class _OpeningSocket:
    """The descriptor of a connection's socket, as the watchdog cuts it, while the connection holds that socket:
    from its TCP connection through a proxy's tunnel and a TLS handshake. Not the socket object: a handshake
    detaches the one urllib3 made from its descriptor, which moves, same number, to the TLS socket, and runs
    before that socket is given to the connection."""

    def __init__(self, connection: _WatchedConnection, descriptor: int) -> None:
        self._connection = connection
        self._descriptor = descriptor

    def fileno(self) -> int:
        if self._connection.sock is None or self._connection.opened is not self:
            raise ValueError("the connection no longer holds its socket: its descriptor may be another file's by now")
        return self._descriptor


def _watched_pool(pool: type[HTTPConnectionPool]) -> type[HTTPConnectionPool]:
    """`pool`, its connections watched; the same class for the same `pool`, and `pool` itself if already watched."""
    if issubclass(pool.ConnectionCls, _WatchedConnection):
        return pool
    with _LOCK:
        watched = _WATCHED_POOLS.get(pool)
        if watched is None:
            connection = type(f"Watched{pool.ConnectionCls.__name__}", (_WatchedConnection, pool.ConnectionCls), {})
            watched = _WATCHED_POOLS[pool] = type(f"Watched{pool.__name__}", (pool,), {"ConnectionCls": connection})
        return watched


_LOCK = threading.Lock()
_WATCHED_POOLS: dict[type[HTTPConnectionPool], type[HTTPConnectionPool]] = {}


def watched_pools(pools: Mapping[str, type[HTTPConnectionPool]]) -> dict[str, type[HTTPConnectionPool]]:
    """A pool manager's `pool_classes_by_scheme`, each pool class watched (a new mapping: urllib3's default one is
    shared by every pool manager of the process)."""
    return {scheme: _watched_pool(pool) for scheme, pool in pools.items()}
