"""The Azure backend's endpoints and Azure AD credential, checked before any request: a connection string's
BlobEndpoint, DefaultEndpointsProtocol, AccountName and EndpointSuffix, and an `account_url`'s host, refused as the
option's when the SDK's HTTP client could not connect to what they make (they used to fail at the first request, as
a transient failure); DefaultAzureCredential's environment refused naming what to fix, a missing credential named
with what to set, and the secrets it takes from the environment scrubbed. No request is made."""

from __future__ import annotations

import base64
import os

import pytest

from silodlib.backends import AccessDenied, InvalidBackendOption, open_backend, parse_dataset_uri
from silodlib.backends.azure import AzureBackend
from silodlib.scrub import REDACTED, scrub

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
