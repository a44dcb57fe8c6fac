"""A fake Azure AD token endpoint on loopback, for the failures of a token request a real one cannot be made to give on
cue (an answer of 503 or 429, a reset connection): a managed identity's (IDENTITY_ENDPOINT, or the instance metadata
endpoint at AZURE_POD_IDENTITY_AUTHORITY_HOST) and, over TLS, an authority's (AZURE_AUTHORITY_HOST, tenant "adfs",
whose configuration the credential asks of the authority itself). Tests that use it say "fake" in their names."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.tls import TlsFiles

STORAGE_AUDIENCE = "https://storage.azure.com"


@dataclass(frozen=True)
class Answer:
    """An HTTP answer to a token request: its status, its JSON body and its headers."""

    status: int
    body: Mapping[str, str]
    headers: Mapping[str, str] = field(default_factory=dict)


def storage_token(lifetime: int = 3600) -> dict[str, str]:
    """A token answer each kind of endpoint's credential takes (the managed identity's `expires_on`, the authority's
    `expires_in`) for a token Azurite takes with `--oauth basic`, which checks a JWT's audience, issuer and lifetime
    but not its signature."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "aud": STORAGE_AUDIENCE,
        "iss": "https://sts.windows.net/00000000-0000-0000-0000-000000000000/",
    }
    claims |= {"iat": now, "nbf": now - 60, "exp": now + lifetime, "oid": os.urandom(8).hex()}
    jwt = ".".join(_base64url({"alg": "none", "typ": "JWT"}, claims)) + ".unsigned"
    return {
        "access_token": jwt,
        "expires_in": str(lifetime),
        "expires_on": str(now + lifetime),
        "resource": STORAGE_AUDIENCE,
        "token_type": "Bearer",
    }


def _base64url(*parts: dict[str, Any]) -> Iterator[str]:
    for part in parts:
        yield base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()


class TokenEndpoint:
    """Answers each token request (a GET of a managed identity, a POST to an authority) with `answer` while one is
    set, else with a fresh `storage_token()`; an authority's configuration (a GET of `.well-known/openid-configuration`)
    always. Resets its first `resets` connections as they are accepted (an RST: SO_LINGER 0). Records the path of
    each token request in `asked` and counts the connections it accepts in `connections`."""

    def __init__(self, answer: Answer | None = None, *, resets: int = 0, tls: TlsFiles | None = None) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.connections = 0
        self._resets = resets
        self._tls = tls
        self._server = self._make_server()

    @property
    def address(self) -> str:
        """host:port"""
        return f"127.0.0.1:{self._server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[TokenEndpoint]:
        """Serve until the block ends; its port is closed then."""
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)

    def _make_server(self) -> ThreadingHTTPServer:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.endswith("/.well-known/openid-configuration"):
                    base = f"https://{self.headers['Host']}/adfs"
                    configuration = {"issuer": base, "token_endpoint": f"{base}/oauth2/token"}
                    self._send(Answer(200, configuration | {"authorization_endpoint": f"{base}/oauth2/authorize"}))
                else:
                    self._token()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._token()

            def _token(self) -> None:
                endpoint.asked.append(self.path)
                self._send(endpoint.answer or Answer(200, storage_token()))

            def _send(self, answer: Answer) -> None:
                body = json.dumps(dict(answer.body)).encode()
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Nothing on stderr."""

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request: Any, client_address: Any) -> bool:
                endpoint.connections += 1  # (the one thread that accepts)
                if endpoint.connections > endpoint._resets:
                    return True
                request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False  # closed unanswered: reset

        server = Server(("127.0.0.1", 0), Handler)
        if self._tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self._tls.server_cert, self._tls.server_key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        return server


def identity_endpoint(address: str) -> dict[str, str]:
    """The environment of a managed identity (App Service, Functions, Container Apps) whose token endpoint is at
    `address` (host:port)."""
    return {
        "AZURE_TOKEN_CREDENTIALS": "managedidentitycredential",
        "IDENTITY_ENDPOINT": f"http://{address}/msi",
        "IDENTITY_HEADER": f"identity-header-{os.urandom(8).hex()}",
    }


def metadata_endpoint(address: str) -> dict[str, str]:
    """The environment of a VM's managed identity whose instance metadata endpoint is at `address` (host:port)."""
    return {
        "AZURE_TOKEN_CREDENTIALS": "managedidentitycredential",
        "AZURE_POD_IDENTITY_AUTHORITY_HOST": f"http://{address}",
    }


def authority_host(address: str) -> dict[str, str]:
    """The environment of a service principal whose secret goes to the authority at `address` (AZURE_AUTHORITY_HOST).
    Its tenant is "adfs", whose configuration the credential asks of that authority: for any other tenant it would
    first ask login.microsoftonline.com about the authority, and no test may reach beyond loopback."""
    return {
        "AZURE_TOKEN_CREDENTIALS": "environmentcredential",
        "AZURE_TENANT_ID": "adfs",
        "AZURE_CLIENT_ID": "silod-test",
        "AZURE_CLIENT_SECRET": f"client-secret-{os.urandom(8).hex()}",
        "AZURE_AUTHORITY_HOST": f"https://{address}",
    }


@dataclass(frozen=True)
class EndpointKind:
    """A kind of token endpoint: the environment that points DefaultAzureCredential at one at an address, the name of
    the credential that asks it, and whether it is on https (an authority)."""

    environment: Callable[[str], dict[str, str]]
    credential: str
    tls: bool = False


ENDPOINT_KINDS = {
    "identity-endpoint": EndpointKind(identity_endpoint, "ManagedIdentityCredential"),
    "metadata-endpoint": EndpointKind(metadata_endpoint, "ManagedIdentityCredential"),
    "authority": EndpointKind(authority_host, "EnvironmentCredential", tls=True),
}
