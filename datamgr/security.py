"""Securing the data manager's gRPC: TLS and mutual TLS on the server, a bearer token for every call that
changes state or hands out dataset options (the `silod` commands' flags for both ends are
`silodcli.security_flags`).

Read-only queries need no token: they show nothing secret (they redact credential options), and `silod
status` should work for anyone who can reach the port. The streams meant for nodes do need it: the watch
stream carries datasets' backend options unredacted, because nodes need them to read the data, and a manifest
names every file of a dataset.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from silodlib.credentials import SecurityConfigError, read_certificates, read_key_pair, read_token
from silodlib.grpc_channel import TOKEN_HEADER
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["DataManager"]
# Deny by default: a method added to the service later needs the token until it is listed here.
TOKEN_FREE_METHODS = frozenset(
    f"/{SERVICE.full_name}/{name}"
    for name in (
        "GetClusterSummary",
        "GetDataset",
        "GetJob",
        "GetNode",
        "ListDatasets",
        "ListJobs",
        "ListNodes",
        "ListTenants",
    )
)

_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only
_HANDLER_OF_KIND: dict[tuple[bool, bool], Callable[..., _Handler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


@dataclass(frozen=True, repr=False)
class ServerSecurity:
    """The server's side: TLS credentials (None: plaintext), whether client certificates are required, and
    the token."""

    credentials: grpc.ServerCredentials | None = None
    mutual_tls: bool = False
    token: str | None = None

    @classmethod
    def load(
        cls,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        tls_ca: Path | None = None,
        token_file: Path | None = None,
    ) -> ServerSecurity:
        """Raises SecurityConfigError naming the flags or the file."""
        if (tls_cert is None) != (tls_key is None):
            raise SecurityConfigError("--tls-cert and --tls-key must be given together")
        if tls_ca is not None and tls_cert is None:
            raise SecurityConfigError("--tls-ca (require client certificates) needs --tls-cert and --tls-key")
        credentials = None
        if tls_cert is not None and tls_key is not None:
            key, chain = read_key_pair(tls_cert, tls_key)
            client_ca = read_certificates(tls_ca, "--tls-ca") if tls_ca is not None else None
            credentials = grpc.ssl_server_credentials(
                [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
            )
        token = read_token(token_file) if token_file is not None else None
        return cls(credentials, tls_ca is not None, token)

    def describe(self) -> str:
        tls = "mutual TLS" if self.mutual_tls else "TLS" if self.credentials else "plaintext"
        return f"{tls}, {'token required for changes and streams' if self.token else 'no token'}"

    def interceptors(self) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
        return [TokenCheck(self.token)] if self.token is not None else []

    def exposure_warnings(self, listen: str) -> list[str]:
        """Why listening on a non-loopback `listen` address is unsafe with this configuration, if it is."""
        warnings = []
        if self.credentials is None:
            warnings.append(
                f"listening on {listen} without TLS: calls, including dataset credentials and tokens, cross the "
                "network in plaintext (set --tls-cert and --tls-key)"
            )
        if self.token is None and not self.mutual_tls:
            warnings.append(
                f"listening on {listen} without --auth-token-file: anyone who can reach it can change allocations "
                "and read dataset credentials from the watch stream"
            )
        return warnings


class TokenCheck(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic in the stubs only
    """Refuses, with UNAUTHENTICATED, every call outside TOKEN_FREE_METHODS that does not carry
    `authorization: Bearer TOKEN`. One interceptor for the whole service rather than a check per method, so
    no method can be forgotten. A refused call never reaches the servicer, nor is its request parsed."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def __repr__(self) -> str:
        return "TokenCheck(<redacted>)"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in TOKEN_FREE_METHODS:
            return handler
        problem = self._problem(handler_call_details.invocation_metadata)
        return handler if problem is None else _refusal(handler, method, problem)

    def _problem(self, metadata: Any) -> str | None:
        """Why the call's metadata does not authorize it (never quoting what it presented), or None."""
        presented = [value for key, value in metadata or () if key == TOKEN_HEADER and isinstance(value, str)]
        if not presented:
            return "no token"
        for value in presented:
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token):
                return None
        return "wrong token"


def _refusal(handler: _Handler, method: str, problem: str) -> _Handler:
    """A handler of the same kind as `handler` that logs the refusal once and fails the call."""
    name = method.rsplit("/", 1)[-1]

    async def refuse(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        log.warning("refused %s from %s: %s", method, context.peer(), problem)
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{name} requires a token: send 'authorization: Bearer <token>' with the token of the data "
            "manager's --auth-token-file",
        )

    make = _HANDLER_OF_KIND[(handler.request_streaming, handler.response_streaming)]
    return make(refuse, response_serializer=handler.response_serializer)
