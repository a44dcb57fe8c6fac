"""The Prometheus endpoint both daemons serve their /metrics on."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from silodlib.listening import probe_listening, why_not_listening


class MetricsPortError(Exception):
    """/metrics cannot be served where asked; the message says where and why."""


def refuse_busy_port(host: str, port: int) -> None:
    """MetricsPortError, as `MetricsEndpoint.serve` would raise it, if `host:port` cannot be bound now: for a
    daemon that must know before it does what it cannot take back (a node agent registering its node). Another
    program may still take the port before `serve`, which then fails as before. Port 0 (any free port) passes."""
    if port:
        busy = probe_listening(host, port)
        if busy is not None:
            raise MetricsPortError(_cannot_serve(host, port, busy))


def _cannot_serve(host: str, port: int, exc: OSError) -> str:
    return f"--metrics-port {port}: cannot serve /metrics on {host}: {why_not_listening(exc, host)}"


class MetricsEndpoint:
    """A registry of its own (several daemons may share a process, as in tests) and the HTTP server that
    exposes it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._http: Any = None

    def serve(self, host: str, port: int) -> int:
        """Expose /metrics on host:port (0: any free port); returns the port. Raises MetricsPortError."""
        try:
            self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MetricsPortError(_cannot_serve(host, port, exc)) from None
        return int(self._http.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
