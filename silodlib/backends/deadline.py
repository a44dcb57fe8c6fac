"""A deadline for each try of a backend read (and of each page of a listing, and each stat), kept by cutting the
connection of an answer that comes too slowly.

A backend's `read_timeout` bounds the wait for each next byte of an answer, so a server (or a middlebox) that
trickles, a byte every few seconds, never trips it: a 4 MiB read could take weeks, holding one of the
dataset's fetch slots, and a few such reads hang every read of the dataset. So a try of a read of n bytes gets
`read_timeout + n / min_read_rate` seconds in all: the idea of the AWS CRT's minimum-throughput monitor, kept
as one deadline per try. Past it, the `Watchdog` shuts down the socket of every answer the try received; the
blocked read wakes with its connection lost, and the try fails as transient (`BackendUnavailable`), to be
retried on another connection. A page of a listing is one request whose whole answer the SDK reads before
handing it over; each page gets `read_timeout + page_bytes / min_read_rate`, where `page_bytes` is the most
one page's answer can hold (`of_pages`), so a listing that trickles fails and is retried instead of hanging a
dataset's registration. A stat (a HEAD) is only headers: it gets `read_timeout` plus the most headers hold
(`of_head`).

The deadline holds from an answer's first byte, headers included: the connections the backends send on
(`watched_http`) register their socket with the calling thread's try (`Watchdog.watch`) as they open (a proxy's
tunnel, a TLS handshake) and as they start to wait for each answer, in the thread that then reads it. A cut is
made only while the try is still running. In the instant between a body read to its end, which hands the
connection back to its pool, and the end of the try, another thread could take that connection; a cut then costs
that thread's try a transient failure and a retry, never a wrong byte.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

from silodlib.backends.base import BackendUnavailable, min_read_rate_option, read_timeout_option
from silodlib.backends.uri import DatasetURI
from silodlib.units import format_rate

T = TypeVar("T")


class Socket(Protocol):
    """A connection's socket (a TLS socket over it, or its descriptor while it opens): what a cut shuts down."""

    def fileno(self) -> int: ...


@dataclass(eq=False, slots=True)
class _Try:
    """One try under a deadline: the sockets its answers arrive on, whether it still runs, whether its deadline
    passed, whether any of its sockets was cut for it."""

    at: float  # time.monotonic()
    sockets: list[Socket] = field(default_factory=list)
    running: bool = True
    expired: bool = False
    cut: bool = False


class Watchdog:
    """One thread that cuts the answers of tries whose deadline has passed. Thread-safe; one per process.

    It keeps the running tries only (a few per dataset: its fetches in flight) and sleeps until the earliest of
    their deadlines, or without a timeout while none runs, so a try costs a set insertion and removal."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread does not survive a fork; start another

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._running: set[_Try] = set()
        self._sleeping_until = math.inf  # when the thread wakes next by itself
        self._thread: threading.Thread | None = None
        self._current = threading.local()

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[_Try]:
        """Run the block as one try of at most `seconds`: sockets `watch`ed in it are cut once they pass. The
        yielded try's `expired` says whether the deadline passed (and its sockets were cut)."""
        attempt = _Try(time.monotonic() + seconds)
        with self._lock:
            self._running.add(attempt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="silod-read-deadlines", daemon=True)
                self._thread.start()
            elif attempt.at < self._sleeping_until:
                self._wake.notify()
        outer = getattr(self._current, "attempt", None)
        self._current.attempt = attempt
        try:
            yield attempt
        finally:
            self._current.attempt = outer
            with self._lock:
                attempt.running = False
                attempt.sockets.clear()
                self._running.discard(attempt)

    def watch(self, sock: Socket) -> None:
        """Put a connection's socket under the calling thread's current deadline, if it has one; cut it at once if
        that deadline has passed (an SDK's own retry within a try that has no time left)."""
        attempt: _Try | None = getattr(self._current, "attempt", None)
        if attempt is None:
            return
        with self._lock:
            if attempt.expired:
                attempt.cut = True
                _cut(sock)
            elif attempt.running:
                attempt.sockets.append(sock)

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                for attempt in [a for a in self._running if a.at <= now]:
                    attempt.expired = True
                    attempt.cut = bool(attempt.sockets)
                    for sock in attempt.sockets:
                        _cut(sock)
                    attempt.sockets.clear()
                    self._running.discard(attempt)  # an expired try's later sockets are cut by `watch`
                self._sleeping_until = min((a.at for a in self._running), default=math.inf)
                self._wake.wait(None if self._sleeping_until == math.inf else self._sleeping_until - now)


def _cut(watched: Socket) -> None:
    """Shut down the socket both ways, which wakes a read blocked on it (with an end of file or an error). Through a
    duplicate of its descriptor, so the connection's own socket object stays as it is."""
    try:
        duplicate = os.dup(watched.fileno())
    except (OSError, ValueError):  # already closed: its try is over
        return
    try:
        sock = socket.socket(fileno=duplicate)
    except OSError:  # not a socket after all
        os.close(duplicate)
        return
    with sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()

# The most an answer's status line and headers hold, for the deadline of a HEAD: S3 caps an object's user metadata at
# 2 KiB and Azure a blob's at 8 KiB; the standard headers add a few hundred bytes.
ANSWER_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class ReadDeadline:
    """The deadline of each try of a backend's reads: `read_timeout + length / min_read_rate` seconds; none when
    `min_read_rate` is 0."""

    read_timeout: float
    min_read_rate: int  # bytes/s

    @classmethod
    def from_options(cls, uri: DatasetURI, options: Mapping[str, str]) -> ReadDeadline:
        """The deadline a backend's `read_timeout` and `min_read_rate` options give (validated)."""
        return cls(read_timeout_option(uri, options), min_read_rate_option(uri, options))

    @contextlib.contextmanager
    def of_read(self, what: str, length: int) -> Iterator[None]:
        """Run the block as one try of reading `length` bytes of `what` (a URI); raise `BackendUnavailable`
        naming the rate if the deadline passed and cut it short, whether or not the block noticed the cut. A try that
        ran past its deadline without an answer to cut (it waited on something unwatched: an Azure AD token request,
        which has its own timeouts) fails or succeeds as the block did: its failure is the one to name."""
        if not self.min_read_rate:
            yield
            return
        seconds = self.read_timeout + length / self.min_read_rate
        with WATCHDOG.deadline(seconds) as attempt:
            try:
                yield
            except Exception:
                if attempt.cut:
                    raise self._too_slow(what, seconds) from None
                raise
            # Cut, yet no error: an answer delimited by the end of its connection reads the cut as its end, and an
            # SDK takes what came as the whole answer (a listing page with fewer objects, say).
            if attempt.cut:
                raise self._too_slow(what, seconds)

    def of_head(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Run the block as one try of a request answered by headers alone (a HEAD) of `what` (a URI)."""
        return self.of_read(what, ANSWER_HEAD_BYTES)

    def _too_slow(self, what: str, seconds: float) -> BackendUnavailable:
        return BackendUnavailable(
            f"{what}: the answer came slower than min_read_rate {format_rate(self.min_read_rate)}: "
            f"cut after {seconds:.3g} s"
        )

    def of_pages(self, what: str, pages: Iterator[T], page_bytes: int) -> Iterator[T]:
        """The pages of a listing of `what`, each fetched (`next(pages)`, one request) as one try of reading
        `page_bytes`, the most one page's answer can hold: a listing that trickles is cut like a read."""
        while True:
            with self.of_read(what, page_bytes):
                page = next(pages, _END)
            if page is _END:
                return
            yield cast(T, page)


_END = object()  # `of_pages`: no page left
