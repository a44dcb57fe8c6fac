"""Reads with an Azure AD token from an endpoint that answers 503 or 429 for a while: silod retries them, on its own
schedule, until the endpoint gives a token, and the read gets the blob. Azurite serves the blobs over https, taking
bearer tokens with its basic checks (`--oauth basic`: audience, issuer, lifetime); the token endpoint is a fake on
loopback (tests/token_endpoints.py), which a real one cannot be made to answer 503 or 429 on cue.

The waits between tries are real and at least 1 s: MSAL answers a token request repeated within a 429 or 5xx's
Retry-After (1 s here) from its cache, without asking the endpoint, as it would in production."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.storage.blob import BlobServiceClient

from datamgr.devservers import AZURITE_ACCOUNT, AZURITE_KEY, azurite_argv, free_port, running_server
from silodlib.backends import RetryingBackend, RetryPolicy, open_backend
from tests.net_faults import dropped_connections
from tests.storage_servers import missing_dependency
from tests.tls import TlsFiles, make_tls_files
from tests.token_endpoints import (
    ENDPOINT_KINDS,
    WORKLOAD_IDENTITY,
    Answer,
    EndpointKind,
    TokenEndpoint,
    federated_token_file,
)

URI = f"az://{AZURITE_ACCOUNT}/cont/train"
CONTENT = b"silod blob read with an Azure AD token"


@dataclass(frozen=True)
class OAuthAzurite:
    account_url: str
    tls: TlsFiles  # its CA signs Azurite's certificate and the fake authority's


@pytest.fixture(scope="module")
def oauth_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthAzurite]:
    """Azurite's blob service over https on a free loopback port, taking Azure AD tokens, with the blob train/a.bin
    in container cont."""
    workdir = tmp_path_factory.mktemp("azurite-oauth")
    tls = make_tls_files(workdir / "tls")
    port = free_port()
    try:
        argv = azurite_argv(workdir, port)
    except FileNotFoundError as exc:
        missing_dependency(str(exc))
    argv += ["--cert", str(tls.server_cert), "--key", str(tls.server_key), "--oauth", "basic"]
    account_url = f"https://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    admin = BlobServiceClient(
        account_url,
        credential=AzureNamedKeyCredential(AZURITE_ACCOUNT, AZURITE_KEY),
        connection_verify=str(tls.ca),
        retry_total=0,
    )
    try:
        with running_server("Azurite over https", argv, workdir, ready=admin.get_service_properties):
            admin.create_container("cont").upload_blob("train/a.bin", CONTENT)
            yield OAuthAzurite(account_url, tls)
    finally:
        admin.close()


BUSY_ANSWERS = {
    "503": Answer(503, {"error": "service_unavailable"}, {"Retry-After": "1"}),
    "429": Answer(429, {"error": "too_many_requests"}, {"Retry-After": "1"}),
}


def _point_at(
    endpoint: TokenEndpoint, kind: EndpointKind, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tls: TlsFiles
) -> None:
    """This process's environment pointing DefaultAzureCredential at `endpoint`, a token endpoint of `kind`, and no
    other Azure AD configuration; Azurite's and a fake authority's certificate (`tls`) trusted."""
    for name in list(os.environ):
        if name.startswith(("AZURE_", "IDENTITY_", "MSI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    environment = kind.environment(endpoint.address)
    if kind is WORKLOAD_IDENTITY:
        environment |= federated_token_file(tmp_path)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)


def _retry_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "silodlib.backends.retry"]


def _read_retrying(
    options: dict[str, str], policy: RetryPolicy, wait: Callable[[float], None], rng: random.Random | None = None
) -> bytes:
    """The test blob read through silod's retry wrapper, waiting with `wait`."""
    retried = RetryingBackend(open_backend(URI, options), policy, sleep=wait, rng=rng)
    try:
        return retried.read("a.bin", 0, len(CONTENT))
    finally:
        retried.close()


@pytest.mark.parametrize("kind", ENDPOINT_KINDS.values(), ids=list(ENDPOINT_KINDS))
@pytest.mark.parametrize("answer", BUSY_ANSWERS.values(), ids=list(BUSY_ANSWERS))
def test_a_token_endpoint_answering_503_or_429_is_retried_until_it_recovers_and_the_read_gets_the_blob_fake(
    oauth_azurite: OAuthAzurite,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    kind: EndpointKind,
    answer: Answer,
) -> None:
    """It was access denied, never retried: the SDK's own retries of the answer (4 requests to a managed identity's
    endpoint, 6 over 24 s to the instance metadata endpoint) met the same answer, and the read failed with EACCES as
    if the identity were refused. The endpoint answers `answer` until silod's first wait, then gives tokens."""
    waits: list[float] = []
    endpoint = TokenEndpoint(answer, tls=oauth_azurite.tls if kind.tls else None)
    _point_at(endpoint, kind, monkeypatch, tmp_path, oauth_azurite.tls)

    def wait(seconds: float) -> None:
        waits.append(seconds)
        endpoint.answer = None  # recovered
        time.sleep(seconds)  # past the Retry-After: MSAL asks the endpoint again

    policy = RetryPolicy(attempts=5, base_delay=2.0, max_delay=2.0)  # waits of 1-2 s
    caplog.set_level(logging.INFO, logger="silodlib.backends.retry")
    with endpoint.running():
        data = _read_retrying({"account_url": oauth_azurite.account_url}, policy, wait, random.Random(7))
    assert data == CONTENT
    assert len(waits) == 1 and len(endpoint.asked) == 2, (waits, endpoint.asked)  # one request a try
    retries = _retry_messages(caplog)
    assert len(retries) == 1 and (
        f"read {URI}/a.bin [0, +{len(CONTENT)}] failed on attempt 1 of 5, retrying in " in retries[0]
    ), retries
    assert f"Azure AD token endpoint unavailable or throttling (HTTP {answer.status}; " in retries[0], retries


TOKEN_READ_TIMEOUT = "3"  # seconds: the backend's read_timeout, which token requests wait for an answer


# Every kind of token endpoint a credential of DefaultAzureCredential's chain asks over HTTP.
TIMING_OUT_KINDS = ENDPOINT_KINDS | {"workload-identity": WORKLOAD_IDENTITY}


@pytest.mark.parametrize("kind", TIMING_OUT_KINDS.values(), ids=list(TIMING_OUT_KINDS))
def test_a_token_endpoint_that_never_answers_fails_a_try_as_timed_out_and_the_read_gets_the_blob_once_it_answers_fake(
    oauth_azurite: OAuthAzurite,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    kind: EndpointKind,
) -> None:
    """A token endpoint that takes a request and never answers (a hung managed identity sidecar, an overloaded
    metadata proxy) held a try for 600 s: azure-core's default 300 s read timeout, twice over with the credential's
    retry; then the try was named too slow for min_read_rate. Token requests wait for an answer as long as the
    backend's read_timeout now, and are not retried after that wait: the try fails as the token endpoint timing out,
    transient, after one unanswered request, and the next try gets the token and the blob. The endpoint is silent
    until silod's first wait."""
    waits: list[float] = []
    endpoint = TokenEndpoint(tls=oauth_azurite.tls if kind.tls else None, silent=True)
    _point_at(endpoint, kind, monkeypatch, tmp_path, oauth_azurite.tls)

    def wait(seconds: float) -> None:
        waits.append(seconds)
        endpoint.silent = False  # answers again

    caplog.set_level(logging.INFO, logger="silodlib.backends.retry")
    with endpoint.running():
        options = {"account_url": oauth_azurite.account_url, "read_timeout": TOKEN_READ_TIMEOUT}
        data = _read_retrying(options, RetryPolicy(attempts=2), wait)
    assert data == CONTENT
    assert len(waits) == 1 and len(endpoint.unanswered) == 1, (waits, endpoint.unanswered)
    retries = _retry_messages(caplog)
    assert (
        len(retries) == 1
        and (
            f"{URI}/a.bin: Azure AD token endpoint timed out (a connection gets 3 s, an answer {TOKEN_READ_TIMEOUT} s: "
            f"option read_timeout; no Azure AD token: DefaultAzureCredential tried {kind.credential}: "
        )
        in retries[0]
    ), retries


@pytest.mark.parametrize("kind", TIMING_OUT_KINDS.values(), ids=list(TIMING_OUT_KINDS))
def test_a_token_endpoint_dropping_packets_fails_a_try_as_timed_out_and_the_read_gets_the_blob_once_they_pass_fake(
    oauth_azurite: OAuthAzurite,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    kind: EndpointKind,
) -> None:
    """A token endpoint whose packets are dropped (a firewall's drop rule, a host that is gone) held a try for about
    260 s: azure-core's default 300 s to connect, cut short only by Linux giving up on unanswered SYNs after about
    130 s, twice over; the instance metadata endpoint's credential gave up after 2 s twice, and the read was access
    denied, for good. A token request's connection gets 3 s now, as a storage request's, and the try fails as the
    token endpoint timing out, transient; the next try, once the packets pass, gets the token and the blob."""
    waits: list[float] = []
    endpoint = TokenEndpoint(tls=oauth_azurite.tls if kind.tls else None)
    _point_at(endpoint, kind, monkeypatch, tmp_path, oauth_azurite.tls)
    caplog.set_level(logging.INFO, logger="silodlib.backends.retry")
    with endpoint.running(), dropped_connections(int(endpoint.address.rsplit(":", 1)[1])) as lift:

        def wait(seconds: float) -> None:
            waits.append(seconds)
            lift()  # the packets pass again

        data = _read_retrying({"account_url": oauth_azurite.account_url}, RetryPolicy(attempts=2), wait)
    assert data == CONTENT
    assert len(waits) == 1 and endpoint.connections >= 1, (waits, endpoint.connections)
    retries = _retry_messages(caplog)
    assert (
        len(retries) == 1
        and (
            f"{URI}/a.bin: Azure AD token endpoint timed out (a connection gets 3 s, an answer 30 s: option "
            f"read_timeout; no Azure AD token: DefaultAzureCredential tried {kind.credential}: "
        )
        in retries[0]
    ), retries
