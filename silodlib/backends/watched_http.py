"""urllib3 connection pools whose connections put every answer under the deadline of the try that waits for it
(`deadline.WATCHDOG`), from the moment its request is sent.

An SDK hook sees an answer only once its status line and headers are in, so an answer whose headers trickle,
a byte within every `read_timeout`, would hold its try for good: a `stat` (a HEAD, only headers), and the
head of every read and listing page. A connection registers its socket with the calling thread's try as it
starts to wait for the answer (`getresponse`), which covers the head and then the body, read on the same
socket. Both SDKs send on urllib3 pools: botocore directly, the Azure SDK through `requests`; each backend
swaps its session's pool classes for these (`watched_pools`), which keeps the SDK's own connection classes
(botocore's, proxies' and SOCKS's) underneath.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from urllib3.connectionpool import HTTPConnectionPool

from silodlib.backends.deadline import WATCHDOG


class _WatchedConnection:
    """Mixed in before a urllib3 connection class: register the socket with the calling thread's try (if any)
    before waiting for the answer."""

    sock: Any  # a socket, or a TLS one over it: anything with `fileno()`, as the watchdog needs

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        WATCHDOG.watch(self.sock)
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]  # the connection class mixed with


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
