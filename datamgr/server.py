"""Running the data manager: the gRPC server, the node-liveness sweep, and a graceful stop on signals."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from datamgr.manager import DataManager
from datamgr.metrics import DataManagerMetrics
from datamgr.security import ServerSecurity
from datamgr.servicer import DataManagerServicer
from datamgr.store import SQLiteStore
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:7420"
STOP_GRACE_SECONDS = 1.0
# Watch streams are long-lived and mostly idle: keepalive pings find dead peers behind NATs and proxies.
GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class ServeError(RuntimeError):
    """The server cannot start as configured (address in use, bad listen address)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str = DEFAULT_LISTEN
    state_dir: Path = Path("silod-state")
    remote_io_limit: int | None = None
    node_timeout: float = 30.0
    tls_cert: Path | None = None  # with tls_key: serve TLS
    tls_key: Path | None = None
    tls_ca: Path | None = None  # require client certificates signed by this CA
    auth_token_file: Path | None = None  # require this token for changes and streams (datamgr.security)
    metrics_port: int | None = None  # serve Prometheus /metrics on the --listen host at this port (0: any)


async def serve(
    config: ServerConfig,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve until `stop` is set or SIGTERM/SIGINT arrives. `on_ready` gets the bound port.

    Raises SecurityConfigError for bad security settings, before the state dir is touched."""
    stop = stop or asyncio.Event()
    security = ServerSecurity.load(config.tls_cert, config.tls_key, config.tls_ca, config.auth_token_file)
    store = SQLiteStore(config.state_dir)
    try:
        manager = DataManager(store, remote_io_limit=config.remote_io_limit, node_timeout=config.node_timeout)
        metrics = None if config.metrics_port is None else DataManagerMetrics(manager)
        interceptors = [metrics.interceptor] if metrics else []  # first: refused calls are counted too
        server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors + security.interceptors())
        pb_grpc.add_DataManagerServicer_to_server(DataManagerServicer(manager), server)
        port = _bind(server, config.listen, security)
        await server.start()
        host = config.listen.rsplit(":", 1)[0]
        log.info(
            "data manager listening on %s:%d (%s; state dir %s, revision %d)",
            host,
            port,
            security.describe(),
            config.state_dir,
            manager.state.revision,
        )
        if metrics is not None:
            metrics_port = metrics.serve(host, config.metrics_port or 0)
            log.info("metrics at http://%s:%d/metrics", host, metrics_port)
        if on_ready is not None:
            on_ready(port)
        sweep = asyncio.create_task(_expire_nodes(manager, config.node_timeout))
        with _stop_on_signals(stop):
            await stop.wait()
        log.info("data manager stopping")
        sweep.cancel()
        await server.stop(STOP_GRACE_SECONDS)
        await manager.close()
        if metrics is not None:
            metrics.close()
    finally:
        store.close()
    log.info("data manager stopped")


def _bind(server: grpc.aio.Server, listen: str, security: ServerSecurity) -> int:
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ServeError(f"--listen {listen!r} must be HOST:PORT, e.g. 127.0.0.1:7420")
    if not _is_loopback(host):
        for warning in security.exposure_warnings(listen):
            log.warning("%s", warning)
    try:
        if security.credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, security.credentials)
    except RuntimeError as exc:
        raise ServeError(f"cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise ServeError(f"cannot listen on {listen}: address in use or not available")
    return port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _expire_nodes(manager: DataManager, timeout: float) -> None:
    interval = min(1.0, timeout / 4)
    while True:
        await asyncio.sleep(interval)
        manager.expire_nodes()


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread (in-process tests)
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
