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
from pathlib import Path
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
    always. While `silent`, it reads each request and never answers it, as a hung sidecar or an overloaded proxy: the
    connection stays open, unanswered, until the client gives up on it (or, at the latest, `SILENCE_LIMIT` seconds
    later, or when the block of `running` ends). Resets its first `resets` connections as they are accepted (an RST:
    SO_LINGER 0). Records the path of each token request it answers in `asked`, and of each request it left unanswered
    in `unanswered`, and counts the connections it accepts in `connections`."""

    SILENCE_LIMIT = 30.0
    """Seconds a silent endpoint holds a request before it closes the connection unanswered: a client that waits
    longer than that (a token request under azure-core's default 300 s timeouts) sees the connection lost, not a
    timeout, rather than hanging its test."""

    def __init__(
        self, answer: Answer | None = None, *, resets: int = 0, tls: TlsFiles | None = None, silent: bool = False
    ) -> None:
        self.answer = answer
        self.silent = silent
        self.asked: list[str] = []
        self.unanswered: list[str] = []
        self.connections = 0
        self._resets = resets
        self._tls = tls
        self._stopping = threading.Event()
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
            self._stopping.set()  # ends the waits of unanswered requests
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)

    def _make_server(self) -> ThreadingHTTPServer:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if endpoint.silent:
                    self._never_answer()
                elif self.path.endswith("/.well-known/openid-configuration"):
                    base = f"https://{self.headers['Host']}/adfs"
                    configuration = {"issuer": base, "token_endpoint": f"{base}/oauth2/token"}
                    self._send(Answer(200, configuration | {"authorization_endpoint": f"{base}/oauth2/authorize"}))
                else:
                    self._token()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._token()

            def _token(self) -> None:
                if endpoint.silent:
                    self._never_answer()
                    return
                endpoint.asked.append(self.path)
                self._send(endpoint.answer or Answer(200, storage_token()))

            def _never_answer(self) -> None:
                """Hold the request unanswered until the client closes its connection (the end of file it sends
                then), the endpoint stops, or `SILENCE_LIMIT` passes; then close the connection."""
                endpoint.unanswered.append(self.path)
                self.close_connection = True
                self.connection.settimeout(0.1)
                limit = time.monotonic() + endpoint.SILENCE_LIMIT
                while not endpoint._stopping.is_set() and time.monotonic() < limit:
                    try:
                        if not self.connection.recv(1):
                            return  # the client gave up and closed
                    except TimeoutError:
                        continue
                    except OSError:
                        return

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


def workload_identity(address: str) -> dict[str, str]:
    """The environment of a workload identity (a Kubernetes service account federated with Azure AD) whose assertion
    goes to the authority at `address`, tenant "adfs" as for `authority_host`; its federated token file,
    AZURE_FEDERATED_TOKEN_FILE, is the test's to give (`federated_token_file`)."""
    return {
        "AZURE_TOKEN_CREDENTIALS": "workloadidentitycredential",
        "AZURE_TENANT_ID": "adfs",
        "AZURE_CLIENT_ID": "silod-test",
        "AZURE_AUTHORITY_HOST": f"https://{address}",
    }


def federated_token_file(directory: Path) -> dict[str, str]:
    """AZURE_FEDERATED_TOKEN_FILE naming a file in `directory` that holds an assertion (which the fake authority does
    not check), for `workload_identity`."""
    path = directory / "federated-token"
    path.write_text(f"federated-assertion-{os.urandom(8).hex()}")
    return {"AZURE_FEDERATED_TOKEN_FILE": str(path)}


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
WORKLOAD_IDENTITY = EndpointKind(workload_identity, "WorkloadIdentityCredential", tls=True)
"""The kind of a workload identity's authority: its environment needs a `federated_token_file` as well."""
