"""The Prometheus endpoint both daemons serve their /metrics on."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app

from silodlib.listening import ListenAddress, bind_every_address, probe_listening, why_not_listening

METRICS_PATH = "/metrics"


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
    """A registry of its own (several daemons may share a process, as in tests) and the HTTP servers that
    expose it, one for each address its host stands for."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._servers: list[_MetricsServer] = []

    def serve(self, host: str, port: int) -> int:
        """Expose /metrics on `host` (of HOST:PORT: a name, an IPv4 address or an IPv6 one in brackets) at `port`
        (0: any free port), on every address the data manager's gRPC listener would bind for it
        (`listening_addresses`); returns the port. Raises MetricsPortError, nothing left bound."""
        app = _metrics_app(self.registry)

        def bind(address: ListenAddress, at: int) -> int:
            server = _MetricsServer(address, at, app)
            self._servers.append(server)
            threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
            return server.server_port

        try:
            return bind_every_address(host, port, bind)
        except OSError as exc:
            self.close()
            raise MetricsPortError(_cannot_serve(host, port, exc)) from None

    def close(self) -> None:
        """Stop serving and free the ports, at once: a daemon started again in the same process may bind them."""
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()


def _metrics_app(registry: CollectorRegistry) -> WSGIApplication:
    """The registry's metrics at /metrics, as prometheus_client's own app serves them, and nothing else. That app
    serves them on any path, which hides a scrape job's wrong `metrics_path`: here any other path is 404 naming
    /metrics (`/` too: a landing page would be one more answer to keep right). It answers HEAD with 405: here HEAD
    gets GET's headers. Its `name[]` filter keeps only series of names registered beforehand, which leaves out
    those silod reads from its state when scraped (all of a node's, most of the data manager's), and it answered 200
    with what was left, often nothing: here it is refused (400)."""
    metrics = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        answer = _route(environ, metrics)
        if environ["REQUEST_METHOD"] == "HEAD":
            return _headers_only(answer, environ, start_response)
        return answer(environ, start_response)

    return app


def _route(environ: WSGIEnvironment, metrics: WSGIApplication) -> WSGIApplication:
    if environ["PATH_INFO"] != METRICS_PATH:
        return _NOT_FOUND
    if "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
        return _NO_FILTER
    return metrics


def _text(status: str, text: str) -> WSGIApplication:
    """An app answering every request with `status` and `text`."""
    body = text.encode()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body]

    return app


_NOT_FOUND = _text("404 Not Found", f"silod serves its metrics at {METRICS_PATH}\n")
_NO_FILTER = _text(
    "400 Bad Request", "silod's /metrics takes no name[] filter: it serves all its metrics; filter them in Prometheus\n"
)


def _headers_only(answer: WSGIApplication, environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    """`answer`'s reply to the request as a GET, its length included, without its body."""
    replies: list[tuple[str, list[tuple[str, str]]]] = []

    def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        replies.append((status, headers))

    body = b"".join(answer({**environ, "REQUEST_METHOD": "GET"}, keep))
    (status, headers), *_ = replies
    start_response(status, [*headers, ("Content-Length", str(len(body)))])
    return []


class _QuietRequests(WSGIRequestHandler):
    """Writes no line per request to stderr (Prometheus scrapes every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _MetricsServer(ThreadingMixIn, WSGIServer):
    """One address's HTTP server, a thread per request so that a slow scrape holds up no other."""

    daemon_threads = True  # a scrape in progress does not hold up the daemon's exit

    def __init__(self, address: ListenAddress, port: int, app: WSGIApplication) -> None:
        self.address_family = address.family
        self._dual_stack = address.dual_stack
        super().__init__(address.at(port), _QuietRequests)
        self.set_app(app)

    def server_bind(self) -> None:
        if self._dual_stack:  # whatever the kernel's default (net.ipv6.bindv6only) says
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
