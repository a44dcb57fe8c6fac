"""The deadline of a backend read's try (silodlib/backends/deadline.py), on real sockets: a read blocked on an
answer is woken when its try's deadline passes, an answer of a try that ended in time is never touched, and the
`min_read_rate` option is validated by name; the connections the backends send on put themselves under it. The
mount-level behaviour against real servers is in test_backend_faults.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import urllib3
from urllib3.connectionpool import HTTPConnectionPool

from silodlib.backends import BackendUnavailable, InvalidBackendOption, open_backend
from silodlib.backends.deadline import WATCHDOG, ReadDeadline
from silodlib.backends.watched_http import watched_pools
from tests import polling

AZURE_KEY = "c2lsb2Qta2V5"  # any base64: no request is made
NEVER = 10.0  # seconds a test waits for what must not happen before it fails instead of hanging


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the reader's end, the silent server's end) of a real connected socket pair."""
    reader, server = socket.socketpair()
    reader.settimeout(NEVER)
    with reader, server:
        yield reader, server


def test_a_read_blocked_on_an_answer_wakes_when_its_try_passes_its_deadline(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    reader, _ = connection
    started = time.monotonic()
    with WATCHDOG.deadline(0.3) as attempt:
        WATCHDOG.watch(reader)
        assert reader.recv(16) == b""  # the server sent nothing: the cut, not the data, ended the wait
    assert attempt.expired
    assert time.monotonic() - started < NEVER


def test_an_answer_received_after_its_tries_deadline_passed_is_cut_at_once(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    reader, server = connection
    with WATCHDOG.deadline(0.05) as attempt:
        while not attempt.expired:  # an SDK's own re-send within a try that has no time left
            time.sleep(0.01)
        server.sendall(b"late")
        WATCHDOG.watch(reader)
        assert reader.recv(16) in (b"", b"late")  # what had arrived may still be read; then the end
        assert reader.recv(16) == b""


def test_an_answer_of_a_try_that_ended_in_time_is_never_cut(connection: tuple[socket.socket, socket.socket]) -> None:
    reader, server = connection
    with WATCHDOG.deadline(0.1) as attempt:
        WATCHDOG.watch(reader)
    time.sleep(0.3)  # well past the deadline the try no longer needs
    server.sendall(b"next request's answer")  # the connection, back in its pool, serves another try
    assert reader.recv(64) == b"next request's answer"
    assert not attempt.expired


def test_an_answer_outside_any_try_is_not_watched(connection: tuple[socket.socket, socket.socket]) -> None:
    reader, server = connection
    WATCHDOG.watch(reader)  # no try runs in this thread
    time.sleep(0.2)
    server.sendall(b"x")
    assert reader.recv(1) == b"x"


def test_tries_in_other_threads_keep_their_own_deadlines(connection: tuple[socket.socket, socket.socket]) -> None:
    reader, server = connection
    woken: list[bytes] = []

    def short_try() -> None:
        other, peer = socket.socketpair()
        other.settimeout(NEVER)
        with other, peer, WATCHDOG.deadline(0.1):
            WATCHDOG.watch(other)
            woken.append(other.recv(1))

    with WATCHDOG.deadline(NEVER):
        WATCHDOG.watch(reader)
        thread = threading.Thread(target=short_try)
        thread.start()
        thread.join(NEVER)
        server.sendall(b"y")
        assert reader.recv(1) == b"y"  # the other thread's cut did not touch this try's answer
    assert woken == [b""]


def test_a_try_cut_at_its_deadline_fails_as_transient_naming_the_rate_and_a_failure_in_time_passes_unchanged(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    reader, _ = connection
    deadline = ReadDeadline(read_timeout=0.2, min_read_rate=1000)
    with pytest.raises(BackendUnavailable) as cut, deadline.of_read("s3://b/p/k", 100):  # 0.2 + 0.1 s
        WATCHDOG.watch(reader)
        if not reader.recv(16):
            raise ConnectionError("connection lost")
    assert str(cut.value) == "s3://b/p/k: the answer came slower than min_read_rate 1.0 kB/s: cut after 0.3 s"

    with pytest.raises(ConnectionError), deadline.of_read("s3://b/p/k", 100):
        raise ConnectionError("refused")


def test_a_try_cut_at_its_deadline_fails_even_when_the_read_took_the_cut_for_the_answers_end(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    """An answer delimited by the end of its connection reads a cut as its end, with no error: the try must not
    return what came as if it were the whole answer."""
    reader, _ = connection
    deadline = ReadDeadline(read_timeout=0.2, min_read_rate=1000)
    with pytest.raises(BackendUnavailable, match="slower than min_read_rate"), deadline.of_read("s3://b/p/k", 100):
        WATCHDOG.watch(reader)
        assert reader.recv(16) == b""  # the cut: an end of file, taken as the end of the answer


def test_min_read_rate_0_sets_no_deadline(connection: tuple[socket.socket, socket.socket]) -> None:
    reader, server = connection
    with ReadDeadline(read_timeout=0.05, min_read_rate=0).of_read("s3://b/p/k", 1):
        WATCHDOG.watch(reader)
        time.sleep(0.3)
        server.sendall(b"z")
        assert reader.recv(1) == b"z"


def _options(uri: str, **options: str) -> dict[str, str]:
    return options | ({"account_key": AZURE_KEY} if uri.startswith("az") else {})


@pytest.mark.parametrize("uri", ["s3://bucket/data", "az://account/container/data"])
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("fast", "not a number with a unit"),
        ("64KB", "has no time unit: did you mean 64KB/s?"),
        ("-1KB/s", "is negative"),
        ("1.5", "not a whole number"),
        ("64kb/s", "unknown unit"),
        ("9" * 100, f"got {'9' * 40 + '...'!r}"),
    ],
)
def test_a_min_read_rate_that_is_not_a_rate_is_refused_naming_the_option(uri: str, value: str, why: str) -> None:
    with pytest.raises(InvalidBackendOption) as raised:
        open_backend(uri, _options(uri, min_read_rate=value))
    message = str(raised.value)
    assert message.startswith(f"{uri}: option 'min_read_rate' must be a rate such as 64KiB/s, or 0 for no deadline")
    assert why in message


@pytest.mark.parametrize("uri", ["s3://bucket/data", "az://account/container/data"])
@pytest.mark.parametrize("value", ["0", "1MiB/s", "100Mbps", "4096"])
def test_a_min_read_rate_is_accepted_by_both_remote_backends(uri: str, value: str) -> None:
    open_backend(uri, _options(uri, min_read_rate=value)).close()


def test_watched_pools_leave_urllib3s_shared_default_untouched_and_watch_each_pool_class_once() -> None:
    """urllib3's default `pool_classes_by_scheme` is one mapping shared by every pool manager of the process: the
    backends' watched pools must be new mappings, and watching again (a proxy manager requests caches) must not
    stack a second watch on the first."""
    default: dict[str, type[HTTPConnectionPool]] = dict(urllib3.poolmanager.pool_classes_by_scheme)

    watched = watched_pools(urllib3.poolmanager.pool_classes_by_scheme)

    assert urllib3.poolmanager.pool_classes_by_scheme == default
    for scheme, pool in default.items():
        assert issubclass(watched[scheme], pool) and watched[scheme] is not pool
        assert issubclass(watched[scheme].ConnectionCls, pool.ConnectionCls)
    assert watched_pools(watched) == watched == watched_pools(default)


def test_a_watched_connection_is_cut_at_its_deadline_while_it_waits_for_the_answers_headers() -> None:
    """A server that accepts the request and sends nothing: the connection's own socket timeout is far away, and
    only the try's deadline, which the connection put its socket under as it started to wait, ends the wait."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        pool = watched_pools(urllib3.poolmanager.pool_classes_by_scheme)["http"]("127.0.0.1", port, timeout=NEVER)
        started = time.monotonic()
        with pytest.raises(urllib3.exceptions.ProtocolError), WATCHDOG.deadline(0.3) as attempt:
            pool.urlopen("GET", "/", retries=False)
        assert attempt.expired and time.monotonic() - started < NEVER / 2
        pool.close()


class FakeTrickler:
    """A fake server for faults a real one cannot be made to produce here: it reads what the client sends first,
    then answers `opening` and after it a byte every 0.25 s, for ever, well within any per-byte timeout."""

    def __init__(self, opening: bytes, trickled: bytes) -> None:
        self._opening, self._trickled = opening, trickled
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.trickling = 0
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(client,), daemon=True).start()

    def _trickle(self, client: socket.socket) -> None:
        self.trickling += 1
        try:
            with client:
                client.recv(65536)
                client.sendall(self._opening)
                at = 0
                while not self._closed.wait(0.25):
                    client.sendall(self._trickled[at % len(self._trickled) :][:1])
                    at += 1
        except OSError:
            return  # the client hung up
        finally:
            self.trickling -= 1

    def close(self) -> None:
        self._closed.set()
        self._listener.close()


@pytest.fixture
def trickled_tls_handshake() -> Iterator[FakeTrickler]:
    """A TLS server whose handshake never ends: the header of a 16 KiB handshake record, then the record."""
    server = FakeTrickler(b"\x16\x03\x03\x40\x00", b"\x02")
    yield server
    server.close()


@pytest.fixture
def trickled_proxy_tunnel() -> Iterator[FakeTrickler]:
    """An HTTPS proxy whose answer to CONNECT never ends: its status line, then header lines."""
    server = FakeTrickler(b"", b"HTTP/1.1 200 Connection established\r\nx-padding: 0\r\n")
    yield server
    server.close()


def test_a_watched_connection_whose_tls_handshake_a_fake_server_trickles_is_cut_at_its_deadline(
    trickled_tls_handshake: FakeTrickler,
) -> None:
    """The handshake runs on the TLS socket, which holds the connection's descriptor before the connection has it:
    the cut must reach the descriptor. (Python bounds a handshake as a whole by the socket's timeout as well: the
    connect timeout, 3 s in both backends.)"""
    port = int(trickled_tls_handshake.url.rsplit(":", 1)[1])
    pool = watched_pools(urllib3.poolmanager.pool_classes_by_scheme)["https"]("127.0.0.1", port)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError), WATCHDOG.deadline(0.3) as attempt:
        pool.urlopen("GET", "/", retries=False, timeout=urllib3.Timeout(connect=NEVER, read=NEVER))
    assert attempt.expired and time.monotonic() - started < NEVER / 2
    pool.close()


@pytest.mark.parametrize("backend", ["s3", "az"])
def test_a_read_through_an_https_proxy_a_fake_trickling_its_tunnel_answer_fails_as_transient_at_the_deadline(
    trickled_proxy_tunnel: FakeTrickler, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An HTTPS endpoint is reached through a tunnel the proxy opens (CONNECT): its answer, headers only, comes
    before any answer of the storage's, on a connection still opening."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", trickled_proxy_tunnel.url)
    endpoint = "https://127.0.0.1:9"  # never reached: the proxy does not open the tunnel
    uri, options = {
        "s3": ("s3://bucket/data", {"endpoint_url": endpoint, "access_key_id": "k", "secret_access_key": "s"}),
        "az": ("az://account/container/data", {"account_url": f"{endpoint}/account", "account_key": AZURE_KEY}),
    }[backend]
    opened = open_backend(uri, {**options, "read_timeout": "1", "min_read_rate": "1MB/s"})  # a 1.001 s deadline

    outcome = polling.outcome_within(NEVER, lambda: opened.read("object", 0, 1000))
    opened.close()

    assert "hung" not in outcome, "the read was never cut"
    error = outcome.get("error")
    assert isinstance(error, BackendUnavailable) and "slower than min_read_rate 1.0 MB/s" in str(error), outcome
    polling.eventually(lambda: trickled_proxy_tunnel.trickling == 0, what="every trickled tunnel answer cut")
