"""The Azure backend's endpoints and Azure AD credential, checked before any request: a connection string's
BlobEndpoint, DefaultEndpointsProtocol, AccountName and EndpointSuffix, and an `account_url`'s host, refused as the
option's when the SDK's HTTP client could not connect to what they make (they used to fail at the first request, as
a transient failure); DefaultAzureCredential's environment refused naming what to fix, a missing credential named
with what to set, and the secrets it takes from the environment scrubbed. No request reaches a storage service.

And how a failed token request is told: a token endpoint (a managed identity's, the authority's) that refuses or
resets connections fails a read as transient, retried, the first token and a renewed one alike, while a refused
identity stays access denied; azure-identity's dozen lines per failure are logged at DEBUG, silod's one line saying
what failed. Token endpoints are loopback ports: closed, resetting every connection, or a fake endpoint where its
answers matter (the test says so)."""

from __future__ import annotations

import base64
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from datamgr.devservers import free_port
from silodlib.backends import (
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    InvalidBackendOption,
    RetryingBackend,
    RetryPolicy,
    open_backend,
    parse_dataset_uri,
)
from silodlib.backends.azure import AzureBackend
from silodlib.scrub import REDACTED, scrub
from tests.tls import make_tls_files
from tests.token_endpoints import (
    ENDPOINT_KINDS,
    Answer,
    EndpointKind,
    TokenEndpoint,
    authority_host,
    identity_endpoint,
)

URI = "az://devstoreaccount1/cont/train"
# Secrets that must never show in a refusal: a valid account key (base64) and a SAS signature.
KEY = base64.b64encode(b"silod-azure-options-key-" + os.urandom(16)).decode()
SAS_SIG = "NeverShownSasSignature" + os.urandom(8).hex()
SAS = f"sv=2024-05-04&sr=c&sp=rl&sig={SAS_SIG}"
ACCOUNT = f"AccountName=devstoreaccount1;AccountKey={KEY}"
PUBLIC_SUFFIX = "EndpointSuffix=core.windows.net"

BLOB_ENDPOINT = "the BlobEndpoint of option 'connection_string'"
MADE_ENDPOINT = "the endpoint option 'connection_string' makes of its AccountName and EndpointSuffix"
HOST_REFUSED = "has a host the Azure SDK's HTTP client refuses"

# (connection string, what the refusal says): each was taken by `dataset add` and failed at the first request.
REFUSED_CONNECTION_STRINGS = {
    "endpoint-not-a-url": (f"BlobEndpoint=not a url;{ACCOUNT}", f"{BLOB_ENDPOINT} {HOST_REFUSED}: 'not a url'"),
    "endpoint-ftp": (
        f"BlobEndpoint=ftp://x;{ACCOUNT}",
        f"{BLOB_ENDPOINT} must be an http:// or https:// URL, not 'ftp'",
    ),
    "endpoint-host-space": (
        f"BlobEndpoint=http://ho st:10000/devstoreaccount1;{ACCOUNT}",
        f"{BLOB_ENDPOINT} {HOST_REFUSED}: 'ho st:10000'",
    ),
    "endpoint-with-sas": (f"BlobEndpoint=not a url;SharedAccessSignature={SAS}", f"{BLOB_ENDPOINT} {HOST_REFUSED}"),
    "endpoint-empty": (f"BlobEndpoint=;{ACCOUNT}", f"{BLOB_ENDPOINT} is empty"),
    "endpoint-leading-space": (f"BlobEndpoint= http://127.0.0.1:1/a;{ACCOUNT}", f"{BLOB_ENDPOINT} has a space at its"),
    "endpoint-port": (
        f"BlobEndpoint=http://127.0.0.1:99999/devstoreaccount1;{ACCOUNT}",
        f"{BLOB_ENDPOINT} has a port that is not a number from 0 to 65535: '99999'",
    ),
    "endpoint-userinfo": (
        f"BlobEndpoint=http://user:{SAS_SIG}@127.0.0.1:10000/devstoreaccount1;{ACCOUNT}",
        f"{BLOB_ENDPOINT} must not hold a user name or password",
    ),
    "endpoint-http-without-slashes": (f"BlobEndpoint=http:/h/a;{ACCOUNT}", f"{BLOB_ENDPOINT} must be an http://"),
    "endpoint-name-spaced": (
        f"{ACCOUNT}; BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1",
        "option 'connection_string' has a space around the name of its BlobEndpoint setting (after a ';'?)",
    ),
    "protocol-ftp": (
        f"DefaultEndpointsProtocol=ftp;{ACCOUNT};{PUBLIC_SUFFIX}",
        "the DefaultEndpointsProtocol of option 'connection_string' must be http or https, got 'ftp'",
    ),
    "suffix-space": (
        f"DefaultEndpointsProtocol=https;{ACCOUNT};EndpointSuffix=core windows.net",
        f"{MADE_ENDPOINT} {HOST_REFUSED}: 'devstoreaccount1.blob.core windows.net'",
    ),
    "suffix-path": (f"{ACCOUNT};EndpointSuffix=core.windows.net/x", f"{MADE_ENDPOINT} is not a host name"),
    "suffix-empty": (f"{ACCOUNT};EndpointSuffix=", "the EndpointSuffix of option 'connection_string' is empty"),
    "account-name-space": (f"AccountName=dev store;AccountKey={KEY}", f"{MADE_ENDPOINT} {HOST_REFUSED}"),
}

# Connection strings as the Azure portal, Storage Explorer and Azurite give them, and forms the SDK takes: still taken.
ACCEPTED_CONNECTION_STRINGS = {
    "portal": f"DefaultEndpointsProtocol=https;{ACCOUNT};{PUBLIC_SUFFIX}",
    "account-only": ACCOUNT,
    "other-cloud": f"{ACCOUNT};EndpointSuffix=core.chinacloudapi.cn",
    "azurite": f"DefaultEndpointsProtocol=http;{ACCOUNT};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;",
    "sas-with-other-services": (
        "BlobEndpoint=https://acct.blob.core.windows.net/;QueueEndpoint=https://acct.queue.core.windows.net/;"
        f"SharedAccessSignature={SAS}"
    ),
    "endpoint-without-scheme": f"BlobEndpoint=acct.blob.core.windows.net;{ACCOUNT}",  # the SDK puts https:// first
    "endpoint-ipv6-upper-case-scheme": f"BlobEndpoint=HTTP://[::1]:10000/devstoreaccount1;{ACCOUNT}",
    "endpoint-with-sas-query": f"BlobEndpoint=https://acct.blob.core.windows.net/?{SAS}",  # the SDK's SAS
    "development-storage": "UseDevelopmentStorage=true",
}

AD_ACCOUNT_URL = {"account_url": "https://127.0.0.1:1/devstoreaccount1"}  # https: DefaultAzureCredential is used


@pytest.mark.parametrize(
    ("value", "fragment"), REFUSED_CONNECTION_STRINGS.values(), ids=list(REFUSED_CONNECTION_STRINGS)
)
def test_a_connection_string_endpoint_the_client_cannot_connect_to_is_refused_naming_the_part_not_a_secret(
    value: str, fragment: str
) -> None:
    refusals = AzureBackend.option_refusals(parse_dataset_uri(URI), {"connection_string": value})
    assert list(refusals) == ["connection_string"], refusals
    message = str(refusals["connection_string"])
    assert message.startswith(f"{URI}: ") and fragment in message, message
    assert KEY not in message and SAS_SIG not in message, message
    with pytest.raises(InvalidBackendOption) as raised:
        open_backend(URI, {"connection_string": value})
    assert str(raised.value) == message


@pytest.mark.parametrize("value", ACCEPTED_CONNECTION_STRINGS.values(), ids=list(ACCEPTED_CONNECTION_STRINGS))
def test_connection_strings_the_sdk_connects_with_are_still_taken(value: str) -> None:
    assert not AzureBackend.option_refusals(parse_dataset_uri(URI), {"connection_string": value})
    open_backend(URI, {"connection_string": value}).close()


@pytest.mark.parametrize(
    ("url", "host"),
    [("http://ho st:10000/devstoreaccount1", "'ho st:10000'"), ("https://*.blob.core.windows.net", "'*.blob.core")],
    ids=["space", "wildcard"],
)
def test_an_account_url_whose_host_the_client_refuses_is_refused_naming_it(url: str, host: str) -> None:
    with pytest.raises(InvalidBackendOption) as raised:
        open_backend(URI, {"account_url": url, "account_key": KEY})
    assert f"option 'account_url' {HOST_REFUSED}: {host}" in str(raised.value), raised.value


@pytest.fixture
def azure_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No Azure AD configuration from the environment, and DefaultAzureCredential kept to the credentials a test names
    (`AZURE_TOKEN_CREDENTIALS`), so that no managed identity endpoint, CLI or token cache of the host is tried."""
    for name in list(os.environ):
        if name.startswith(("AZURE_", "IDENTITY_", "MSI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "environmentcredential")
    return monkeypatch


def test_a_missing_azure_ad_credential_is_access_denied_naming_what_to_set(
    azure_environment: pytest.MonkeyPatch,
) -> None:
    """It was "DefaultAzureCredential failed to retrieve a token from the included credentials.", the first line
    of the SDK's error, whose other lines say what it tried."""
    backend = open_backend(URI, AD_ACCOUNT_URL)
    try:
        with pytest.raises(AccessDenied) as raised:
            list(backend.list())
    finally:
        backend.close()
    message = str(raised.value)
    assert message.startswith(f"{URI}: access denied (no Azure AD token: DefaultAzureCredential tried "), message
    assert "EnvironmentCredential authentication unavailable" in message, message
    for named in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE"):
        assert named in message, (named, message)
    assert "option 'account_key', 'sas_token' or 'connection_string'" in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("environment", "fragment"),
    [
        ({"AZURE_TOKEN_CREDENTIALS": "bogus"}, "Invalid value for AZURE_TOKEN_CREDENTIALS: bogus"),
        (
            {"AZURE_TENANT_ID": "t", "AZURE_CLIENT_ID": "c", "AZURE_CLIENT_CERTIFICATE_PATH": "/nonexistent/c.pem"},
            "(FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/c.pem'): fix "
            "AZURE_CLIENT_CERTIFICATE_PATH, or",
        ),
    ],
    ids=["token-credentials", "certificate-path"],
)
def test_an_azure_ad_environment_azure_identity_refuses_is_an_option_refusal_naming_it(
    azure_environment: pytest.MonkeyPatch, environment: dict[str, str], fragment: str
) -> None:
    """These escaped `open_backend` as the SDK's ValueError or FileNotFoundError: a traceback from `silod mount`."""
    for name, value in environment.items():
        azure_environment.setenv(name, value)
    with pytest.raises(InvalidBackendOption) as raised:
        open_backend(URI, AD_ACCOUNT_URL)
    message = str(raised.value)
    assert message.startswith(f"{URI}: DefaultAzureCredential (no option 'account_key', 'sas_token' or "), message
    assert "refuses the Azure AD configuration of this process's environment" in message and fragment in message


def test_the_secrets_azure_identity_takes_from_the_environment_are_scrubbed_once_it_is_used(
    azure_environment: pytest.MonkeyPatch,
) -> None:
    """azure-identity's errors can show them (a managed identity's IDENTITY_HEADER that `requests` refuses as a header
    value is printed whole, in its WARNING log line and in the error)."""
    secrets = {name: f"{name.lower()}-{os.urandom(8).hex()}" for name in ("AZURE_CLIENT_SECRET", "IDENTITY_HEADER")}
    for name, value in secrets.items():
        azure_environment.setenv(name, value + "\n")
    open_backend(URI, AD_ACCOUNT_URL).close()
    for value in secrets.values():
        assert scrub(f"header value: {value!r}; {value}") == f"header value: '{REDACTED}'; {REDACTED}"


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port nothing listens on: every connection to it is refused."""
    yield free_port()


@contextmanager
def resetting_port() -> Iterator[int]:
    """A loopback port whose every connection is reset as it is accepted (an RST, no FIN: SO_LINGER 0), as a
    firewall's reject rule or an endpoint's crashing proxy does."""
    listener = socket.create_server(("127.0.0.1", 0))

    def reset_each() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # shut down: the block ended
                return
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

    thread = threading.Thread(target=reset_each, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        listener.close()
        thread.join(timeout=10)


@contextmanager
def fake_token_endpoint(status: int, answer: dict[str, str]) -> Iterator[tuple[str, list[str]]]:
    """A fake managed identity token endpoint on loopback, answering every token request with `status` and `answer`
    as JSON; yields its address (host:port) and the paths asked. Its port is closed once the block ends."""
    with TokenEndpoint(Answer(status, answer)).running() as endpoint:
        yield endpoint.address, endpoint.asked


@pytest.mark.parametrize(
    ("environment", "listener"),
    [(identity_endpoint, refusing_port), (authority_host, resetting_port)],
    ids=["identity-endpoint-refusing", "authority-host-resetting"],
)
def test_a_token_endpoint_refusing_or_resetting_connections_fails_a_read_as_transient_and_it_is_retried(
    azure_environment: pytest.MonkeyPatch,
    environment: Callable[[str], dict[str, str]],
    listener: Callable[[], AbstractContextManager[int]],
) -> None:
    """It was access denied, never retried: a network fault while the first token was fetched failed the read for
    good, as a missing credential does."""
    sleeps: list[float] = []
    with listener() as port:
        for name, value in environment(f"127.0.0.1:{port}").items():
            azure_environment.setenv(name, value)
        backend = RetryingBackend(
            open_backend(URI, AD_ACCOUNT_URL), RetryPolicy(attempts=2, base_delay=0), sleep=sleeps.append
        )
        try:
            with pytest.raises(BackendUnavailable) as raised:
                backend.read("a.bin", 0, 10)
        finally:
            backend.close()
    message = str(raised.value)
    assert message.startswith(
        f"{URI}/a.bin: Azure AD token endpoint unreachable or connection lost (no Azure AD token: "
        "DefaultAzureCredential tried "
    ), message
    # A refusal, or a reset as the connection is made, names the endpoint (urllib3's words); a reset once the request
    # was sent is the connection aborted (requests' words), which a busy machine makes of the resetting listener.
    assert f"host='127.0.0.1', port={port}" in message or "Connection reset by peer" in message, message
    assert "\n" not in message, message
    assert len(sleeps) == 1  # tried twice, as the policy says, like any transient failure


def test_a_token_renewal_failing_on_the_network_fails_a_read_as_transient_fake_token_endpoint(
    azure_environment: pytest.MonkeyPatch,
) -> None:
    """Once a credential has given a token, DefaultAzureCredential asks it alone for the next. The instance metadata
    endpoint's credential reports a refused connection then as "no response from the IMDS endpoint", which was access
    denied: after a network fault at a renewal, every read failed for good. The fake endpoint (IMDS at the URL
    AZURE_POD_IDENTITY_AUTHORITY_HOST gives) hands out one token due for renewal (60 s left: the SDK renews a token in
    the five minutes before it expires) and then stops."""
    token = {"access_token": f"token-{os.urandom(8).hex()}", "expires_in": "60", "token_type": "Bearer"}
    token |= {"expires_on": str(int(time.time()) + 60), "resource": "https://storage.azure.com"}
    azure_environment.setenv("AZURE_TOKEN_CREDENTIALS", "managedidentitycredential")
    with fake_token_endpoint(200, token) as (address, asked):
        azure_environment.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://{address}")
        backend = open_backend(URI, AD_ACCOUNT_URL)
        with pytest.raises(BackendUnavailable) as with_token:  # the token got, the storage endpoint is a closed port
            backend.read("a.bin", 0, 10)
    try:
        with pytest.raises(BackendUnavailable) as renewal:
            backend.read("a.bin", 0, 10)
    finally:
        backend.close()
    assert len(asked) == 1 and "Azure AD" not in str(with_token.value), (asked, with_token.value)
    assert str(renewal.value) == (
        f"{URI}/a.bin: Azure AD token endpoint unreachable or connection lost (no Azure AD token: "
        "ManagedIdentityCredential authentication unavailable, no response from the IMDS endpoint)"
    )


@contextmanager
def token_endpoint(
    kind: EndpointKind, environment: pytest.MonkeyPatch, tmp_path: Path, answer: Answer | None = None, resets: int = 0
) -> Iterator[TokenEndpoint]:
    """A fake token endpoint of `kind` answering `answer` (`TokenEndpoint`), this process's environment pointing
    DefaultAzureCredential at it (trusting its certificate where it is an authority, on https)."""
    tls = make_tls_files(tmp_path / "token-endpoint-tls") if kind.tls else None
    with TokenEndpoint(answer, resets=resets, tls=tls).running() as endpoint:
        for name, value in kind.environment(endpoint.address).items():
            environment.setenv(name, value)
        if tls is not None:
            environment.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
        yield endpoint


def failed_read(expected: type[BackendError], backend: Backend) -> str:
    """The message of the `expected` failure of a read of a.bin, `backend` closed after it."""
    try:
        with pytest.raises(expected) as raised:
            backend.read("a.bin", 0, 10)
    finally:
        backend.close()
    return str(raised.value)


BUSY_ANSWERS = {  # as the instance metadata endpoint answers them (Retry-After on a 429, as Azure AD's)
    "503": Answer(503, {"error": "service_unavailable", "error_description": "IMDS is temporarily unavailable"}),
    "429": Answer(429, {"error": "too_many_requests", "error_description": "Too many requests"}, {"Retry-After": "1"}),
}


@pytest.mark.parametrize("kind", ENDPOINT_KINDS.values(), ids=list(ENDPOINT_KINDS))
@pytest.mark.parametrize("answer", BUSY_ANSWERS.values(), ids=list(BUSY_ANSWERS))
def test_a_token_endpoint_answering_503_or_429_fails_a_try_as_transient_asked_once_fake_token_endpoint(
    azure_environment: pytest.MonkeyPatch, tmp_path: Path, kind: EndpointKind, answer: Answer
) -> None:
    """A token endpoint that is unavailable or throttling (Azure's instance metadata endpoint answers 429 to a VM that
    asks too often) failed a read as access denied: EACCES for readers, a mount refused as if the identity were, and
    never retried. It is transient now, for silod's retry wrapper to retry (tests/test_azure_token_endpoint.py reads
    through it once the endpoint recovers). The credential's pipeline no longer retries the answer inside the try
    (4 requests to a managed identity's endpoint, 6 over 24 s to the instance metadata endpoint), so one try asks
    once."""
    with token_endpoint(kind, azure_environment, tmp_path, answer) as endpoint:
        message = failed_read(BackendUnavailable, open_backend(URI, AD_ACCOUNT_URL))
    assert message.startswith(
        f"{URI}/a.bin: Azure AD token endpoint unavailable or throttling (HTTP {answer.status}; no Azure AD token: "
        f"DefaultAzureCredential tried {kind.credential}: "
    ), message
    assert "\n" not in message and len(endpoint.asked) == 1, (message, endpoint.asked)


@pytest.mark.parametrize("kind", ENDPOINT_KINDS.values(), ids=list(ENDPOINT_KINDS))
@pytest.mark.parametrize("status", [400, 401, 403])
def test_a_token_endpoint_refusing_the_identity_is_still_access_denied_fake_token_endpoint(
    azure_environment: pytest.MonkeyPatch, tmp_path: Path, kind: EndpointKind, status: int
) -> None:
    """A refusal is no network fault and no unavailable endpoint: no retry mends it. A managed identity endpoint
    answers 400 for an identity it does not have; an authority 400 or 401 for a client it does not know or a secret
    that is wrong."""
    refusal = Answer(status, {"error": "invalid_request", "error_description": "Identity not found"})
    with token_endpoint(kind, azure_environment, tmp_path, refusal) as endpoint:
        message = failed_read(AccessDenied, open_backend(URI, AD_ACCOUNT_URL))
    assert endpoint.asked and message.startswith(
        f"{URI}/a.bin: access denied (no Azure AD token: DefaultAzureCredential tried {kind.credential}: "
    ), message


def test_a_failed_token_request_is_retried_once_at_once_not_nested_in_each_silod_try_fake_token_endpoint(
    azure_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A token endpoint that refuses or resets connections cost each of silod's tries 8 connections over about 10 s:
    the storage pipeline retried the failed token request once, and the credential's pipeline tried each 4 times, 0,
    1.6 and 3.2 s apart; a `silod mount` failed after about 60 s rather than silod's 6-12 s of waits. Now the
    credential's pipeline retries a failed connection once, at once, and the storage pipeline not at all: 2
    connections a try. The endpoint resets every connection."""
    sleeps: list[float] = []
    kind = ENDPOINT_KINDS["identity-endpoint"]
    with token_endpoint(kind, azure_environment, tmp_path, resets=sys.maxsize) as endpoint:
        backend = RetryingBackend(
            open_backend(URI, AD_ACCOUNT_URL), RetryPolicy(attempts=2, base_delay=0), sleep=sleeps.append
        )
        message = failed_read(BackendUnavailable, backend)
    assert message.startswith(f"{URI}/a.bin: Azure AD token endpoint unreachable or connection lost"), message
    assert (endpoint.connections, len(sleeps)) == (4, 1)


def test_a_token_endpoint_resetting_one_connection_gives_the_token_within_the_try_fake_token_endpoint(
    azure_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What the credential's pipeline keeps of its retries: a single failed connection is retried at once, inside the
    try, as before, costing silod no retry. The token comes on the second connection, and the read fails only at the
    storage endpoint, a closed port."""
    kind = ENDPOINT_KINDS["identity-endpoint"]
    with token_endpoint(kind, azure_environment, tmp_path, resets=1) as endpoint:
        message = failed_read(BackendUnavailable, open_backend(URI, AD_ACCOUNT_URL))
    assert "Azure AD" not in message and endpoint.connections == 2 and len(endpoint.asked) == 1, message


def test_a_failed_token_request_logs_azure_identitys_detail_at_debug_not_as_a_warning_of_a_dozen_lines(
    azure_environment: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """azure-identity logged each failed token request as a WARNING of a dozen lines (every credential tried, a
    guide's link) beside silod's own line, which names what failed and what to set: a wall of text per retried read
    in a node agent's log. Below DEBUG (the `azure` loggers at WARNING, as `silod` sets them) none of it shows; at
    DEBUG all of it does, as DEBUG. Another library's warning, and an error of azure-identity's, keep their level."""

    def identity_records(azure_level: int) -> list[logging.LogRecord]:
        caplog.clear()
        caplog.set_level(azure_level, logger="azure")
        backend = open_backend(URI, AD_ACCOUNT_URL)
        try:
            with pytest.raises(AccessDenied):
                backend.read("a.bin", 0, 10)
        finally:
            backend.close()
        return [record for record in caplog.records if record.name.startswith("azure.identity")]

    assert not identity_records(logging.WARNING)
    detail = identity_records(logging.DEBUG)
    assert {record.levelname for record in detail} == {"DEBUG"}, detail
    assert any("failed to retrieve a token from the included credentials" in record.message for record in detail)
    caplog.clear()
    logging.getLogger("azure.core.pipeline").warning("another library's warning")
    logging.getLogger("azure.identity._credentials.chained").error("an error of azure-identity's")
    assert [(record.name, record.levelname) for record in caplog.records] == [
        ("azure.core.pipeline", "WARNING"),
        ("azure.identity._credentials.chained", "ERROR"),
    ]
