"""Channels to the data manager: optionally TLS (mutual, with a client certificate) and carrying a bearer token
on every call.

One module for the `silod` client commands and the node agent, so both reach a secured data manager the same
way and explain its refusals the same way. The files are checked when a command starts, so a wrong file is
reported by name rather than as a failed handshake later. Token and key never appear in a repr, a log line or
a message.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

TLS_CA_ENV = "SILOD_TLS_CA"
TLS_CERT_ENV = "SILOD_TLS_CERT"
TLS_KEY_ENV = "SILOD_TLS_KEY"
TOKEN_FILE_ENV = "SILOD_AUTH_TOKEN_FILE"
TOKEN_HEADER = "authorization"

_TLS_REASON = re.compile(r"OPENSSL_internal:([A-Z_]+)")


class SecurityConfigError(ValueError):
    """Security flags combined wrongly, or a TLS or token file missing, unreadable or malformed; the message
    names the flag and the file."""


def read_token(path: Path) -> str:
    """The bearer token in `path` (--auth-token-file), without surrounding whitespace (so a trailing newline
    does not count)."""
    token = _read(path, "--auth-token-file").decode("ascii", errors="replace").strip()
    if not token:
        raise SecurityConfigError(f"--auth-token-file {path} is empty")
    if not all("!" <= char <= "~" for char in token):  # what an HTTP/2 header value can carry unescaped
        raise SecurityConfigError(f"--auth-token-file {path}: the token must be printable ASCII without spaces")
    return token


def read_certificates(path: Path, flag: str) -> bytes:
    """One or more PEM certificates (a CA bundle or a certificate chain), checked by OpenSSL."""
    data = _read(path, flag)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise SecurityConfigError(f"{flag} {path} is not a PEM certificate file ({_reason(exc)})") from None
    return data


def read_key_pair(cert: Path, key: Path) -> tuple[bytes, bytes]:
    """(private key, certificate chain) from --tls-cert and --tls-key: PEM, the key unencrypted (gRPC cannot
    decrypt one) and the one the certificate is for."""
    chain = read_certificates(cert, "--tls-cert")
    private_key = _read(key, "--tls-key")

    def refuse_encrypted() -> bytes:
        raise SecurityConfigError(f"--tls-key {key} is encrypted; gRPC needs an unencrypted private key")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=refuse_encrypted)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise SecurityConfigError(f"--tls-key {key} is not the private key of --tls-cert {cert}") from None
        raise SecurityConfigError(f"--tls-key {key} is not a PEM private key") from None
    return private_key, chain


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not text"
    return str(exc).split(" (_ssl.c")[0]  # OpenSSL's reason without the source location


@dataclass(frozen=True, repr=False)
class ChannelSecurity:
    """What a client presents: the CA to verify the data manager with, a client certificate, a token."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    token: str | None = None

    def __repr__(self) -> str:  # says what is configured, never the key or the token
        client_cert, token = self.certificate_chain is not None, self.token is not None
        return f"ChannelSecurity(tls={self.tls}, client_cert={client_cert}, token={token})"

    @classmethod
    def load(
        cls,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        token: str | None = None,
    ) -> ChannelSecurity:
        """TLS when a CA or a client certificate is given (without a CA, the system's roots verify the data
        manager); raises SecurityConfigError naming the flag and file."""
        if (tls_cert is None) != (tls_key is None):
            raise SecurityConfigError("--tls-cert and --tls-key must be given together")
        private_key = chain = None
        if tls_cert is not None and tls_key is not None:
            private_key, chain = read_key_pair(tls_cert, tls_key)
        roots = read_certificates(tls_ca, "--tls-ca") if tls_ca is not None else None
        return cls(roots, chain, private_key, token)

    @property
    def tls(self) -> bool:
        return self.root_certificates is not None or self.certificate_chain is not None


def open_channel(address: str, security: ChannelSecurity, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel to `address`: TLS if `security` says so, and the token on every call if it has one."""
    if security.tls:
        credentials = grpc.ssl_channel_credentials(
            security.root_certificates, security.private_key, security.certificate_chain
        )
        channel = grpc.secure_channel(address, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    if security.token is None:
        return channel
    return grpc.intercept_channel(channel, _BearerToken(security.token))


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
