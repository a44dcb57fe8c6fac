"""Channels to the data manager: optionally TLS (mutual, with a client certificate), carrying a bearer token on
every call, and taking messages up to the size the data manager may send (`MAX_MESSAGE_BYTES`).

One module for the `silod` client commands and the node agent, so both reach a secured data manager the same
way and explain its refusals the same way. What they present (`credentials.ChannelSecurity`) is read and
checked apart from gRPC; the token never appears in a repr, a log line or a message.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from silodlib.credentials import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TOKEN_FILE_ENV, ChannelSecurity
from silodlib.listening import host_and_port, is_loopback_host
from silodlib.units import format_size

log = logging.getLogger(__name__)

TOKEN_HEADER = "authorization"

# The largest message the data manager and silod's channels send or take, answers, stream events and requests alike.
# gRPC's default, 4 MiB on receipt, broke `silod status` at some 8,700 jobs with 128-character ids (ListJobs answers
# about 500 bytes a job); sixteen times it holds every message of a cluster of tens of thousands of jobs with room to
# spare (docs/datamgr.md, "Message sizes"). One bound for both ends, so that the data manager refuses an answer over
# it by name before a client's gRPC would, in its own words.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_TLS_REASON = re.compile(r"OPENSSL_internal:([A-Z_]+)")
# gRPC's words for a message over a limit, as the end that refused it (CLIENT or SERVER) put them.
_TOO_LARGE = re.compile(r"(CLIENT|SERVER): (Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")


def message_size_options() -> list[tuple[str, int]]:
    """gRPC channel and server options for MAX_MESSAGE_BYTES, sent and received."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


def open_channel(address: str, security: ChannelSecurity, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel to `address` that sends and takes messages up to MAX_MESSAGE_BYTES, with `options` besides:
    TLS if `security` says so, and the token on every call if it has one. A token about to go to another machine
    without TLS is warned about, once per address and process."""
    if security.token is not None and not security.tls:
        _warn_plaintext_token(address)
    options = [*message_size_options(), *options]
    if security.tls:
        credentials = grpc.ssl_channel_credentials(
            security.root_certificates, security.private_key, security.certificate_chain
        )
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if security.token is None:
        return channel
    return grpc.intercept_channel(channel, _BearerToken(security.token))


_warned_plaintext: set[str] = set()
_warned_lock = threading.Lock()


def _warn_plaintext_token(address: str) -> None:
    """Warn that the token (and, to a node agent, the datasets' credentials the data manager sends back) crosses the
    network in plaintext to `address`, unless it is this machine's loopback: anyone on the path can read it, and a
    server in the data manager's place is not told apart (TLS verifies it). The data manager warns of its side at
    its start; this is the client's."""
    try:
        host = host_and_port(address)[0]
    except ValueError:
        return  # not HOST:PORT (a gRPC target such as unix:PATH): gRPC's own resolution, which names no network host
    if is_loopback_host(host):
        return
    with _warned_lock:
        if address in _warned_plaintext:
            return
        _warned_plaintext.add(address)
    log.warning(
        "the token goes to the data manager at %s in plaintext, as does every call's content: set --tls-ca (or %s) "
        "to the CA of its certificate once it serves TLS (docs/datamgr.md, Security)",
        address,
        TLS_CA_ENV,
    )


def explain_refusal(
    exc: grpc.RpcError, address: str, security: ChannelSecurity, *, connected_before: bool = False
) -> str | None:
    """What an operator should do about a call that failed for a security reason (a token refused, a TLS
    handshake that failed), or None if it failed for another one. `connected_before`: calls with these
    settings have succeeded, so a connection closed now is the data manager going away (a crash, a restart),
    not a TLS setting to fix."""
    code: grpc.StatusCode = exc.code()
    details = (exc.details() or "").lower()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if security.token is None:
            return f"the data manager at {address} requires a token: set --auth-token-file or {TOKEN_FILE_ENV}"
        return f"the data manager at {address} refused the token: check --auth-token-file or {TOKEN_FILE_ENV}"
    if code != grpc.StatusCode.UNAVAILABLE:
        return None
    if "handshake" in details:
        match = _TLS_REASON.search(exc.details() or "")
        reason = f" ({match.group(1)})" if match else ""
        return (
            f"TLS handshake with {address} failed{reason}: check --tls-ca or {TLS_CA_ENV} "
            "(the CA that signed the data manager's certificate) and that the data manager serves TLS"
        )
    if "socket closed" in details and not connected_before:  # the server hung up while setting up the connection
        if security.tls:
            return (
                f"the data manager at {address} closed the connection during the TLS handshake: if it requires "
                f"client certificates, set --tls-cert and --tls-key (or {TLS_CERT_ENV} and {TLS_KEY_ENV})"
            )
        return f"the data manager at {address} closed the connection: if it serves TLS, set --tls-ca or {TLS_CA_ENV}"
    return None


def explain_message_size(exc: grpc.RpcError) -> str | None:
    """What a call that failed on a limit on one message's size sent or got, and whose limit it passed; None if it
    failed for another reason. gRPC says only "Received message larger than max", under RESOURCE_EXHAUSTED, the code
    that the data manager's full state disk has too."""
    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    match = _TOO_LARGE.search(exc.details() or "")
    if match is None:
        return None
    side, verb, size, limit = match.groups()
    what = "the answer" if (side == "CLIENT") == (verb == "Received") else "the request"
    whose = "this client's" if side == "CLIENT" else "the data manager's"
    return (
        f"{what} is {int(size):,} bytes, over {whose} limit of {format_size(int(limit))} on one gRPC message "
        '(docs/datamgr.md, "Message sizes")'
    )


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds `authorization: Bearer TOKEN` to every call, streams included. Metadata rather than call
    credentials, because gRPC sends call credentials over TLS only and a token alone is valid on loopback."""

    def __init__(self, token: str) -> None:
        self._header = (TOKEN_HEADER, f"Bearer {token}")

    def __repr__(self) -> str:
        return "_BearerToken(<redacted>)"

    def _with_token(self, details: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), self._header],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], grpc.CallFuture[Any]],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> grpc.CallFuture[Any]:
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], grpc.CallIterator[Any]],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> grpc.CallIterator[Any]:
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], grpc.CallFuture[Any]],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> grpc.CallFuture[Any]:
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], grpc.CallIterator[Any]],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> grpc.CallIterator[Any]:
        return continuation(self._with_token(client_call_details), request_iterator)
