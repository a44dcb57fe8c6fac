"""Running the data manager: the gRPC server, the node-liveness sweep, the live controller when a policy is
configured, and a graceful stop on signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from datamgr import tenants
from datamgr.controller import Controller, RoundRequests
from datamgr.defaults import DEFAULT_LISTEN, DEFAULT_ROUND_SECONDS, EXTERNAL_POLICY
from datamgr.entities import DataManagerError
from datamgr.logs import GRPC_CORE_LOGGER, ClientGoneWrites
from datamgr.manager import DataManager
from datamgr.metrics import DataManagerMetrics
from datamgr.scheduler.registry import Scheduler, UnknownPolicy, accepts_options, build_scheduler, unknown_policy
from datamgr.security import ServerSecurity
from datamgr.servicer import DataManagerServicer
from datamgr.store import SQLiteStore
from datamgr.stored_options import warn_of_refused_options
from silodlib.grpc_channel import message_size_options
from silodlib.listening import host_and_port, is_loopback_host, probe_listening, why_not_listening
from silodlib.metrics_endpoint import MetricsPortError
from silodlib.units import format_rate
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 1.0
# Watch streams are long-lived and mostly idle: keepalive pings find dead peers behind NATs and proxies.
GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # ... and the wait for a ping's answer: grpcio waits 60 s whatever keepalive_timeout_ms says, so a peer whose
    # kernel still acknowledges (a frozen agent) kept its stream 80 s; TCP_USER_TIMEOUT finds a dead host sooner.
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC shares a port between servers by default (SO_REUSEPORT): a second data manager on the port would
    # start and answer clients at random from its own state. This one must own its port or not start.
    ("grpc.so_reuseport", 0),
    # Requests as large as answers: a node running tens of thousands of jobs reports usage for each. Answers and
    # events are checked against the same bound first (`servicer`), to be refused by name.
    *message_size_options(),
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
    metrics_port: int | None = None  # serve Prometheus /metrics on the --listen host (as gRPC binds it) here; 0: any
    policy: str = EXTERNAL_POLICY  # the policy the data manager runs (datamgr.controller); external: none
    round_seconds: float = DEFAULT_ROUND_SECONDS  # the longest time between two of the policy's rounds
    policy_options: tuple[tuple[str, str], ...] = ()  # knobs of the policy (`--policy-option KEY=VALUE`)
    # The GPUs' affinity hierarchy bottom up, NAME:BUDDIES (`--cell-levels gpu:1,pcie:2,node:4`), for tenants'
    # virtual clusters and the policies that keep them (hived); "": each node is one cell of its GPUs.
    cell_levels: str = ""


async def serve(
    config: ServerConfig,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve until `stop` is set or SIGTERM/SIGINT arrives. `on_ready` gets the bound port.

    Raises SecurityConfigError for bad security settings and ServeError for a listen address that is no HOST:PORT,
    a policy that cannot run or cell levels that are no hierarchy, before the state dir is touched; ServeError too
    for a state dir whose tenants name levels the cell levels lack, and for ports in use. A start refused after the
    state dir is opened leaves it as it was: a state dir of an older schema is upgraded only once every check has
    passed and the ports are bound (`SQLiteStore.keep_upgrade`)."""
    stop = stop or asyncio.Event()
    security = ServerSecurity.load(config.tls_cert, config.tls_key, config.tls_ca, config.auth_token_file)
    host, _ = _listen_address(config.listen)
    scheduler = _scheduler(config)
    _check_cell_levels(config.cell_levels)
    store = SQLiteStore(config.state_dir)
    try:
        manager, controller = _manager_and_controller(config, store, scheduler)
        _check_stored_nodes(manager)  # first: the tenants' VCs are checked against node cells that hold the nodes
        _check_stored_tenants(manager)
        _warn_if_remote_io_over_limit(manager)
        warn_of_refused_options(manager.state.datasets.values())
        metrics = None if config.metrics_port is None else DataManagerMetrics(manager)
        interceptors = [metrics.interceptor] if metrics else []  # first: refused calls are counted too
        server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors + security.interceptors())
        _quiet_client_gone_writes()
        pb_grpc.add_DataManagerServicer_to_server(DataManagerServicer(manager, controller), server)
        port = _bind(server, config.listen, security)
        if metrics is not None:  # before the server starts, so that a port in use stops it with nothing served
            try:
                metrics_port = metrics.serve(host, config.metrics_port or 0)
            except MetricsPortError as exc:
                raise ServeError(str(exc)) from None
        try:  # the start goes ahead: an upgrade of an older state dir is kept only now (a refused start leaves it)
            store.keep_upgrade()
        except BaseException:
            if metrics is not None:
                metrics.close()
            raise
        # The handlers go in before the "listening" line: a SIGTERM right after it (a supervisor, a test that waits
        # for the line) found none yet and killed the process instead of stopping it.
        with _stop_on_signals(stop):
            await server.start()
            log.info(
                "data manager listening on %s:%d (%s; state dir %s, revision %d)",
                host,
                port,
                security.describe(),
                config.state_dir,
                manager.state.revision,
            )
            if metrics is not None:
                log.info("metrics at http://%s:%d/metrics", host, metrics_port)
            if on_ready is not None:
                on_ready(port)
            tasks = [asyncio.create_task(_expire_nodes(manager, config.node_timeout))]
            if controller is not None:
                log.info(
                    "running the %s policy: a round per burst of job changes, and at least every %g s",
                    config.policy,
                    config.round_seconds,
                )
                tasks.append(asyncio.create_task(controller.run()))
            await stop.wait()
        log.info("data manager stopping")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        manager.end_watches()
        await server.stop(STOP_GRACE_SECONDS)
        await manager.close()
        if metrics is not None:
            metrics.close()
    finally:
        store.close()
    log.info("data manager stopped")


def _scheduler(config: ServerConfig) -> Scheduler | None:
    """The scheduler `--policy` names, or None for external; raises ServeError naming what is wrong (knobs or a round
    for no policy too: they would be dropped without a word, and the operator left believing them in force; the
    default round, typed or not, times nothing either way)."""
    if config.policy == EXTERNAL_POLICY:
        if config.policy_options:
            given = " ".join(f"--policy-option {key}={value}" for key, value in config.policy_options)
            raise ServeError(
                f"{given}: --policy-option needs --policy NAME, the policy whose knobs they are (the default, "
                f"--policy {EXTERNAL_POLICY}, runs none)"
            )
        if config.round_seconds != DEFAULT_ROUND_SECONDS:
            raise ServeError(
                f"--round {config.round_seconds:g}: --round needs --policy NAME, the policy whose rounds it times "
                f"(the default, --policy {EXTERNAL_POLICY}, runs none); a round from SILOD_ROUND or the config "
                "file's round counts too"
            )
        return None
    unknown = unknown_policy(config.policy, EXTERNAL_POLICY)
    if unknown is not None:
        raise ServeError(f"--policy {unknown}")
    if config.remote_io_limit is None:
        raise ServeError(
            f"--policy {config.policy} shares out the cluster's remote IO, so it needs --remote-io-limit "
            "(or use --policy external)"
        )
    if config.policy_options and not accepts_options(config.policy):
        raise ServeError(f"--policy-option: policy {config.policy} takes no options")
    try:
        return build_scheduler(config.policy, "silod", dict(config.policy_options) or None)
    except UnknownPolicy as exc:
        raise ServeError(f"--policy-option: {exc}") from None
    except Exception as exc:  # a plugin's import or constructor: whatever it raises, the server cannot run it
        raise ServeError(f"--policy {config.policy}: cannot load the policy: {type(exc).__name__}: {exc}") from exc


def _check_cell_levels(spec: str) -> None:
    try:
        tenants.check_cell_levels(spec)
    except ValueError as exc:
        raise ServeError(
            f"--cell-levels {spec!r}: {exc}; give the levels bottom up as NAME:BUDDIES, from one GPU to a node and "
            "above, e.g. gpu:1,pcie:2,socket:2,node:2"
        ) from None


def _quiet_client_gone_writes() -> None:
    """Install `ClientGoneWrites` on grpcio's logger, once per process (several servers may run in one)."""
    core = logging.getLogger(GRPC_CORE_LOGGER)
    if not any(isinstance(f, ClientGoneWrites) for f in core.filters):
        core.addFilter(ClientGoneWrites())


def _check_stored_tenants(manager: DataManager) -> None:
    """Refuse cell levels that lack a level a registered tenant's VC names (restart with the levels it was
    registered under, and unregister the tenant, to change them); warn when the VCs do not fit the nodes (a node
    unregistered since), which the policy then cannot promise to keep."""
    registered = list(manager.state.tenants.values())
    for tenant in registered:
        try:
            tenants.check_levels(tenant, manager.cell_levels, field=f"tenant {tenant.name}")
        except DataManagerError as exc:
            raise ServeError(f"--cell-levels: {exc}; unregister the tenant to change the levels") from None
    try:
        tenants.check_vcs(registered, manager.cell_levels, manager.state.nodes.values(), field="tenants")
    except DataManagerError as exc:
        log.warning(
            "%s: policies that keep virtual clusters (hived) run on, but without HiveD's guarantee that every VC's "
            "cells can be bound (its Theorem 1): a tenant's job may find no free cell until they fit again",
            exc,
        )


def _check_stored_nodes(manager: DataManager) -> None:
    """Refuse cell levels whose node cell is smaller than a registered node's GPUs (every round of hived would
    fail): restart with the levels the node was registered under, or unregister it to change them."""
    for node in sorted(manager.state.nodes.values(), key=lambda node: node.node_id):
        try:
            tenants.check_node_gpus(node, manager.cell_levels, field="nodes")
        except DataManagerError as exc:
            raise ServeError(f"--cell-levels: {exc}; unregister the node to change the levels") from None


def _warn_if_remote_io_over_limit(manager: DataManager) -> None:
    """Warn when the state dir holds more remote IO, allocated to jobs or reserved by tenants, than
    --remote-io-limit allows: a limit lowered at a restart. Not refused, as an operator lowers a limit on
    purpose; the policy (or `silod alloc io`) then lowers the allocations, and no call adds to them meanwhile."""
    limit = manager.remote_io_limit
    if limit is None:
        return
    allocated = manager.state.io_allocated_bytes_per_sec
    reserved = sum(tenant.io_bytes_per_sec for tenant in manager.state.tenants.values())
    if allocated > limit or reserved > limit:
        log.warning(
            "--remote-io-limit %s is below what the state dir holds: jobs are allocated %s of remote IO and "
            "tenants reserve %s; the policy (or silod alloc io) must lower the allocations, and silod tenant "
            "remove the reservations, to fit it (calls that add remote IO beyond it are refused)",
            format_rate(limit),
            format_rate(allocated),
            format_rate(reserved),
        )


def _manager_and_controller(
    config: ServerConfig, store: SQLiteStore, scheduler: Scheduler | None
) -> tuple[DataManager, Controller | None]:
    """The data manager, and with a scheduler the controller that owns its allocations and hears of every job
    registered or finished."""
    if scheduler is None:
        manager = DataManager(
            store,
            remote_io_limit=config.remote_io_limit,
            node_timeout=config.node_timeout,
            cell_levels=config.cell_levels,
        )
        return manager, None
    requests = RoundRequests()
    manager = DataManager(
        store,
        remote_io_limit=config.remote_io_limit,
        node_timeout=config.node_timeout,
        policy=config.policy,
        request_round=requests.request,
        cell_levels=config.cell_levels,
    )
    return manager, Controller(manager, scheduler, requests, round_seconds=config.round_seconds)


def _listen_address(listen: str) -> tuple[str, int]:
    try:
        return host_and_port(listen)
    except ValueError as exc:
        raise ServeError(f"--listen {exc}") from None


def _bind(server: grpc.aio.Server, listen: str, security: ServerSecurity) -> int:
    host, wanted_port = _listen_address(listen)
    if not is_loopback_host(host):
        for warning in security.exposure_warnings(listen):
            log.warning("%s", warning)
    try:
        if security.credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, security.credentials)
    except RuntimeError:
        raise ServeError(f"cannot listen on {listen}: {_why_unbindable(host, wanted_port)}") from None
    if port == 0:
        raise ServeError(f"cannot listen on {listen}: {_why_unbindable(host, wanted_port)}")
    return port


def _why_unbindable(host: str, port: int) -> str:
    """Why gRPC could not bind `host:port`, asked of the OS: gRPC's own message only says that it failed (and
    to turn its debug logging on)."""
    refused = probe_listening(host, port)
    if refused is None:
        return "gRPC could not bind it (GRPC_VERBOSITY=debug shows why)"
    return why_not_listening(refused, host)


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
