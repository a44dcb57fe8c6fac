"""Faults a real storage server does not produce on demand, injected by a proxy in front of it; and an Azurite
that a test can kill and restart.

`FaultProxy` is a loopback HTTP/1.1 proxy in front of a real server (moto, Azurite): it forwards every request and
answer byte for byte, except the GETs of an object a test picks (or of a bucket or container: its listing),
which it can answer "busy" (503 with the service's own error document: S3's SlowDown, Azure's ServerBusy)
without bothering the server, forward the server's answer for only up to a point and then stall, as a storage
node that hangs mid-body does, or trickle the answer's body (as it comes on the wire, chunked framing
included) a byte at a time. It records every request it saw, so a test counts how often an object was asked
for. It understands just enough HTTP to know where one request or answer ends (Content-Length, chunked, or
until the connection closes).

`RestartableAzurite` is Azurite's blob service on a port that stays the same across a SIGKILL and a restart,
with its data directory kept, as a storage server that crashes and comes back.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from datamgr.devservers import AzuriteServer, azure_client, azurite_argv, azurite_server, dying_with_parent, free_port
from tests import polling

# The error documents the services send when they shed load (S3 "SlowDown", Azure Blob "ServerBusy").
S3_SLOW_DOWN = (
    "SlowDown",
    b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>",
)
AZURE_SERVER_BUSY = (
    "ServerBusy",
    b"<?xml version='1.0' encoding='utf-8'?>\n<Error><Code>ServerBusy</Code>"
    b"<Message>The server is currently unable to receive requests. Please retry your request.</Message></Error>",
)


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """One request the proxy received: its method, its path without the query, and the fault it got, if any."""

    method: str
    path: str
    fault: str | None


@dataclass(slots=True)
class _Rule:
    """Spoil the next `remaining` requests (GETs; also HEADs for a trickle from the head) of the object whose path
    ends in `/name`."""

    name: str
    fault: str  # "busy", "stall", "cut", "trickle" or "whole" (the Range header dropped)
    remaining: int
    stall_after: int = 0  # a stall or a cut: the body's bytes forwarded first
    trickle_every: float = 0.0
    until_close: bool = False  # a trickle: the body delimited by the end of the connection, not by its framing
    from_head: bool = False  # a trickle: from the answer's first byte (its status line and headers), not its body
    busy_answer: tuple[str, bytes] = S3_SLOW_DOWN

    def spoils(self, method: str, path: str) -> bool:
        """Whether this rule spoils a request of `method` for `path`, if it has uses left."""
        methods = ("GET", "HEAD") if self.from_head else ("GET",)
        return self.remaining > 0 and method in methods and path.endswith("/" + self.name)


@dataclass(slots=True)
class _Head:
    """A request or status line, then the headers (names lower-cased), exactly as received."""

    raw: bytes
    first_line: str
    headers: dict[str, str] = field(default_factory=dict)


class FaultProxy:
    """A loopback proxy to `upstream` (host, port); use as a context manager, or `close()` it.

    `busy` and `stall` arm faults for the next GETs of one object; every other request passes through untouched.
    Closing ends every stall and connection at once, so a client stuck on a stalled answer is released.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._seen: list[SeenRequest] = []
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._stalling = 0
        self._trickling = 0
        acceptor = threading.Thread(target=self._accept, name="fault-proxy-accept", daemon=True)
        acceptor.start()
        self._threads.append(acceptor)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def busy(self, name: str, count: int, answer: tuple[str, bytes] = S3_SLOW_DOWN) -> None:
        """Answer the next `count` GETs of `name` with 503 and `answer` (error code, body); the server never sees
        them."""
        with self._lock:
            self._rules.append(_Rule(name, "busy", count, busy_answer=answer))

    def stall(self, name: str, count: int, after_bytes: int) -> None:
        """Forward the server's headers and the first `after_bytes` bytes of the body of the next `count` answers
        to GETs of `name`, then send nothing more until the client hangs up or the proxy closes."""
        with self._lock:
            self._rules.append(_Rule(name, "stall", count, stall_after=after_bytes))

    def cut(self, name: str, count: int, after_bytes: int) -> None:
        """Forward the server's headers and the first `after_bytes` bytes of the body (as on the wire, chunked
        framing included) of the next `count` answers to GETs of `name`, then close the connection: a server that
        dies mid-answer, an answer shorter than its framing says."""
        with self._lock:
            self._rules.append(_Rule(name, "cut", count, stall_after=after_bytes))

    def whole(self, name: str, count: int) -> None:
        """Drop the Range header from the next `count` GETs of `name`, so that the server answers 200 with the whole
        object, as a server or proxy that ignores ranges may (HTTP allows it)."""
        with self._lock:
            self._rules.append(_Rule(name, "whole", count))

    def trickle(
        self, name: str, count: int, every: float, *, until_close: bool = False, from_head: bool = False
    ) -> None:
        """Forward the server's headers of the next `count` answers to GETs of `name`, then their body one byte every
        `every` seconds: the client never waits as long as a read timeout longer than `every` for its next byte,
        yet the body takes (size x `every`) seconds, as from a server or middlebox that trickles. `until_close`:
        without its length or chunked framing, delimited by the end of the connection (as HTTP/1.0 allows), so
        that a client cut off mid-body sees no error from the framing, only an end. `from_head`: the whole answer
        trickles, its status line and headers first, and the next `count` HEADs of `name` count too: a client
        waits for headers that never end."""
        rule = _Rule(name, "trickle", count, trickle_every=every, until_close=until_close, from_head=from_head)
        with self._lock:
            self._rules.append(rule)

    def heal(self) -> None:
        """Disarm every fault not yet used: from now on, every request passes through."""
        with self._lock:
            self._rules.clear()

    def gets(self, name: str) -> list[SeenRequest]:
        """The GETs of the object `name` received so far, in order."""
        return self.requests(name, "GET")

    def requests(self, name: str, method: str) -> list[SeenRequest]:
        """The requests of `method` for the object `name` received so far, in order."""
        with self._lock:
            return [r for r in self._seen if r.method == method and r.path.endswith("/" + name)]

    def stalls_in_progress(self) -> int:
        """How many answers are stalled right now, the client still connected."""
        with self._lock:
            return self._stalling

    def trickles_in_progress(self) -> int:
        """How many answers are trickling right now, the client still connected."""
        with self._lock:
            return self._trickling

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            _shut(sock)
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- serving ----

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._sockets.add(client)
                thread = threading.Thread(target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True)
                self._threads.append(thread)
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        """One client connection: its requests in turn, each forwarded or spoiled, on one upstream connection."""
        upstream: socket.socket | None = None
        try:
            from_client = client.makefile("rb")
            from_upstream: BinaryIO | None = None
            while not self._closed.is_set():
                request = _read_head(from_client)
                if request is None:
                    return
                method, target = request.first_line.split(" ", 2)[:2]
                body = _read_whole_body(from_client, request.headers)
                rule = self._take_rule(method, target.split("?", 1)[0])
                if rule is not None and rule.fault == "busy":
                    code, document = rule.busy_answer
                    client.sendall(_busy_answer(code, document))
                    continue
                if upstream is not None and _closed_by_peer(upstream):  # as a real proxy, reconnect, not fail
                    _shut(upstream)
                    with self._lock:
                        self._sockets.discard(upstream)
                    upstream = None
                if upstream is None:
                    upstream = socket.create_connection(self._upstream)
                    with self._lock:
                        self._sockets.add(upstream)
                    from_upstream = upstream.makefile("rb")
                assert from_upstream is not None
                head = request.raw
                if rule is not None and rule.fault == "whole":
                    head, rule = _without_range(request), None  # and the answer passes through
                upstream.sendall(head + body)
                answer = _read_head(from_upstream)
                if answer is None:
                    return
                status = int(answer.first_line.split(" ", 2)[1])
                if rule is not None and rule.fault == "trickle":
                    body = b"".join(_wire_body(from_upstream, answer.headers, method, status))
                    head = answer.raw
                    if rule.until_close:
                        head, body = _delimited_by_close(answer), _payload(body, answer.headers)
                    if rule.from_head:
                        head, body = b"", head + body
                    client.sendall(head)
                    self._trickle(client, body, rule.trickle_every)
                    return
                if rule is not None:  # a stall or a cut
                    client.sendall(answer.raw)
                    wire_body = b"".join(_wire_body(from_upstream, answer.headers, method, status))
                    client.sendall(wire_body[: rule.stall_after])
                    if rule.fault == "stall":
                        self._stall_until_hang_up(client)
                    return
                client.sendall(answer.raw)
                if not _forward_body(from_upstream, client, answer.headers, method, status):
                    return
                if answer.headers.get("connection", "").lower() == "close":
                    return
        except OSError:
            return  # a side hung up, or the proxy is closing
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    _shut(sock)
                    with self._lock:
                        self._sockets.discard(sock)

    def _take_rule(self, method: str, path: str) -> _Rule | None:
        """Record the request and the fault it gets: the first armed rule for its object, if any."""
        with self._lock:
            chosen = None
            for rule in self._rules:
                if rule.spoils(method, path):
                    rule.remaining -= 1
                    chosen = rule
                    break
            self._seen.append(SeenRequest(method, path, chosen.fault if chosen else None))
            return chosen

    def _stall_until_hang_up(self, client: socket.socket) -> None:
        with self._lock:
            self._stalling += 1
        try:
            while client.recv(4096):  # nothing more is sent; wait for the client to give up (EOF) or close()
                pass
        finally:
            with self._lock:
                self._stalling -= 1

    def _trickle(self, client: socket.socket, body: bytes, every: float) -> None:
        """Send `body` a byte every `every` seconds, until it is sent, the client hangs up or the proxy closes."""
        with self._lock:
            self._trickling += 1
        try:
            for at in range(len(body)):
                client.sendall(body[at : at + 1])
                if self._closed.wait(every):
                    return
        finally:
            with self._lock:
                self._trickling -= 1


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed an idle kept-alive connection (Azurite does after 5 s): it reads as an end of file."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


def _shut(sock: socket.socket) -> None:
    """Wake anything blocked on `sock` and close it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _read_head(reader: BinaryIO) -> _Head | None:
    """A request or status line and its headers; None at a clean end of the connection."""
    first = reader.readline(65536)
    if not first:
        return None
    raw = [first]
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(65536)
        if not line:
            raise ConnectionError("connection closed inside a message head")
        raw.append(line)
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return _Head(b"".join(raw), first.decode("latin-1").strip(), headers)


def _without_range(request: _Head) -> bytes:
    """`request`'s head without its Range header."""
    return b"".join(line for line in request.raw.splitlines(keepends=True) if not line.lower().startswith(b"range:"))


def _read_whole_body(reader: BinaryIO, headers: dict[str, str]) -> bytes:
    """A request's body (Content-Length framed; the clients here send no chunked requests through the proxy)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ConnectionError("chunked request bodies are not supported by the fault proxy")
    return reader.read(int(headers.get("content-length", "0")))


def _forward_body(reader: BinaryIO, client: socket.socket, headers: dict[str, str], method: str, status: int) -> bool:
    """Copy an answer's body to the client; False when the body ran to the end of the connection."""
    for piece in _wire_body(reader, headers, method, status):
        client.sendall(piece)
    return not _ends_with_connection(headers, method, status)


def _wire_body(reader: BinaryIO, headers: dict[str, str], method: str, status: int) -> Iterator[bytes]:
    """An answer's body as it comes on the wire (chunked framing included), in pieces, up to its end."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = reader.readline(65536)
            yield size_line
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            yield reader.read(size + 2)  # the chunk and its CRLF
            if size == 0:  # trailers, if any, end with an empty line (already sent if there were none)
                return
    if "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining:
            piece = reader.read(min(remaining, 1 << 16))
            if not piece:
                raise ConnectionError("upstream closed inside a body")
            yield piece
            remaining -= len(piece)
        return
    while piece := reader.read(1 << 16):
        yield piece


def _delimited_by_close(answer: _Head) -> bytes:
    """`answer`'s head without its body's framing (Content-Length, Transfer-Encoding), and `Connection: close`."""
    lines = answer.raw.split(b"\r\n")
    framing = (b"content-length:", b"transfer-encoding:", b"connection:")
    kept = [line for line in lines[1:] if line and not line.lower().startswith(framing)]
    return b"\r\n".join([lines[0], *kept, b"Connection: close", b"", b""])


def _payload(wire_body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes a body carries: `wire_body` without its chunked framing, if it has one."""
    if "chunked" not in headers.get("transfer-encoding", "").lower():
        return wire_body
    payload: list[bytes] = []
    at = 0
    while True:
        end = wire_body.index(b"\r\n", at)
        size = int(wire_body[at:end].split(b";", 1)[0].strip(), 16)
        if size == 0:
            return b"".join(payload)
        payload.append(wire_body[end + 2 : end + 2 + size])
        at = end + 2 + size + 2


def _ends_with_connection(headers: dict[str, str], method: str, status: int) -> bool:
    """Whether an answer's body is delimited by the end of the connection (neither chunked nor of a length)."""
    bodiless = method == "HEAD" or status in (204, 304) or 100 <= status < 200
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    return not (bodiless or chunked or "content-length" in headers)


def _busy_answer(code: str, document: bytes) -> bytes:
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(document)}\r\n"
        f"x-ms-error-code: {code}\r\n"
        "\r\n"
    )
    return head.encode() + document


class RestartableAzurite:
    """Azurite's blob service in `workdir` on one fixed free port: `kill()` (SIGKILL, as a crash) and `start()`
    again keep the port and the data directory, so clients that knew the server find it where it was.

    Azurite saves its metadata every few seconds, so `persist()` restarts it gently once after the test's
    uploads: what a crash may lose is then only what changed after that (reads change nothing).
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.server: AzuriteServer = azurite_server(self.port)
        self._process: subprocess.Popen[bytes] | None = None
        self._starts = 0

    def start(self) -> RestartableAzurite:
        """Start the server and return once it answers a real request."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._starts += 1
        log = (self.workdir / f"server-{self._starts}.log").open("wb")
        with log:
            self._process = subprocess.Popen(
                dying_with_parent(azurite_argv(self.workdir, self.port)),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        process = self._process

        def answers() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"Azurite exited with {process.returncode}; see {log.name}")
            azure_client(self.server).get_service_properties()
            return True

        polling.eventually(answers, what="Azurite answering", timeout=30, interval=0.1, ignore=_not_yet_up)
        return self

    def kill(self) -> None:
        """SIGKILL: connections reset mid-answer, nothing saved."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()

    def persist(self) -> None:
        """Stop the server gently (SIGTERM: Azurite saves its metadata) and start it again."""
        assert self._process is not None
        self._process.terminate()
        self._process.wait(timeout=30)
        self.start()

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    @classmethod
    def running(cls, workdir: Path) -> Iterator[RestartableAzurite]:
        """A started server, stopped when the generator is closed (for a fixture)."""
        azurite = cls(workdir)
        try:
            yield azurite.start()
        finally:
            azurite.stop()


def _not_yet_up(exc: Exception) -> bool:
    return not isinstance(exc, AssertionError)
