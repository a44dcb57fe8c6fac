"""Azure Blob Storage (and Azurite) through azure-storage-blob."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

import azure.identity
import requests
from azure.core import MatchConditions
from azure.core.credentials import (
    AccessToken,
    AccessTokenInfo,
    AzureNamedKeyCredential,
    AzureSasCredential,
    SupportsTokenInfo,
    TokenCredential,
    TokenRequestOptions,
)
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline import PipelineRequest, PipelineResponse
from azure.core.pipeline.transport import RequestsTransport
from azure.core.pipeline.transport._bigger_block_size_http_adapters import BiggerBlockSizeHTTPAdapter
from azure.identity import CredentialUnavailableError, DefaultAzureCredential
from azure.storage.blob import BlobProperties, BlobServiceClient, LinearRetry
from azure.storage.blob._shared.constants import DATA_BLOCK_SIZE
from requests.adapters import HTTPAdapter
from urllib3.exceptions import NewConnectionError, ProtocolError

from silodlib.backends.azure_options import check_base64, check_connection_string, check_host
from silodlib.backends.base import (
    MIN_READ_RATE_OPTION,
    READ_TIMEOUT_OPTION,
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    InvalidBackendOption,
    NoSuchObject,
    ObjectInfo,
    changed_object,
    datetime_to_ns,
    join_key,
    parse_url_option,
    relative_key,
    shown_sdk_text,
    unquote_etag,
)
from silodlib.backends.deadline import ReadDeadline
from silodlib.backends.uri import DatasetURI
from silodlib.backends.watched_http import watched_pools
from silodlib.scrub import register_secret, scrub

_CREDENTIAL_OPTIONS = ("connection_string", "account_key", "sas_token")
# The most one blob's entry in a List Blobs answer holds, for the deadline of a page: its name (up to 1,024
# characters, XML-escaped), its properties and its metadata (`include=metadata`; up to 8 KiB, but a few
# hundred bytes in practice, `hdi_isfolder` on hierarchical accounts).
_LISTED_BLOB_BYTES = 4096

# Secrets azure-identity takes from the environment, which its errors can show (a header value `requests` refuses is
# printed whole): registered with the scrubber like a secret option when DefaultAzureCredential is used.
_ENVIRONMENT_SECRETS = (
    "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PASSWORD", "AZURE_PASSWORD", "IDENTITY_HEADER", "MSI_SECRET",
)  # fmt: skip
_AD_CREDENTIAL_ADVICE = (
    "give this process a credential DefaultAzureCredential finds (environment variables AZURE_TENANT_ID, "
    "AZURE_CLIENT_ID and AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH; a workload identity's "
    "AZURE_FEDERATED_TOKEN_FILE; a managed identity, AZURE_CLIENT_ID naming a user-assigned one) with read access "
    "to the container, or give option 'account_key', 'sas_token' or 'connection_string'"
)
# What a failure of the network itself is, under whatever azure-core and `requests` wrap it in: refused, reset or
# aborted (ConnectionError), timed out, no connection made (urllib3: a refusal, an unreachable network, a name that
# does not resolve), a connection broken mid-answer. Not azure-core's ServiceRequestError or ServiceResponseError as
# such: they also wrap a request `requests` refuses to send (a header value it rejects), which no retry mends.
_NETWORK_FAULTS = (ConnectionError, TimeoutError, NewConnectionError, ProtocolError)
# A wait that ran out: for a connection or an answer, as `requests` reports it (azure-core wraps it in one of its own
# timeouts) or as azure-core's retry policy reports a retry given up because the request's time is spent (which has
# no cause). Each is also a failure of the network.
_TIMEOUTS = (requests.exceptions.Timeout, ServiceRequestTimeoutError, ServiceResponseTimeoutError)
# How the credentials' token requests retry in their own pipelines (azure-core's `RetryPolicy`; by default 3 retries
# of a failed connection, 0, 1.6 and 3.2 s apart, and 3 to 5 of an answer asking to try again, up to 24 s or as long
# as its Retry-After says): one retry, at once, of a failed connection (a reset, a refused connect), so that a single
# blip is still ridden out inside a try, and none of an answer (`_TOKEN_RETRY_ANSWERS`), which fails the try as
# transient for silod's retry wrapper to retry on its own schedule. Nested in silod's 5 tries, and the storage
# pipeline's retry of a failed token request (`_StorageRetry`), the SDK's retries made an endpoint that refuses
# connections fail a `silod mount` in about 60 s instead of 6-12 s. MSAL answers a token request repeated within
# the Retry-After of a 429 or 5xx (by default 5 s) from its cache, so silod's tries do not add to a throttled
# endpoint's load.
_TOKEN_REQUEST_RETRIES: dict[str, Any] = {"retry_total": 1, "retry_status": 0}
# Seconds to make a connection, the storage requests' and the token requests' alike: an endpoint that drops packets
# (a firewall's drop rule, a host that is gone) fails a try in seconds, not azure-core's default 300 s (in which
# Linux gives up on its own after about 130 s of unanswered SYNs).
_CONNECT_TIMEOUT = 3.0
# A token endpoint's answers that ask to be tried again, a failure silod retries as transient: 5xx, 429 (throttling:
# the instance metadata endpoint throttles a VM's requests), 408, and the instance metadata endpoint's 404 and 410
# while it is being updated (Azure's "How to use managed identities for Azure resources on an Azure VM to acquire an
# access token", error handling), which azure-identity's own retries of that endpoint took as such. An identity the
# endpoint refuses (400, 401, 403) is access denied.
_TOKEN_RETRY_ANSWERS = frozenset({404, 408, 410, 429, *range(500, 600)})
_T = TypeVar("_T")


class AzureBackend(Backend):
    """`az://account/container/prefix`. Options: `account_url` (default
    `https://{account}.blob.core.windows.net`; Azurite's is `http://host:port/{account}`), `read_timeout`
    (seconds to wait for the next bytes of an answer, an Azure AD token endpoint's too; default 30),
    `min_read_rate` (a read's deadline, `deadline`; default 64KiB/s) and at most one of `connection_string`
    (which also gives the endpoint), `account_key`, `sas_token`; with none of them, `DefaultAzureCredential`
    (environment, managed identity, Azure CLI, ...).

    Explicit folders are blobs whose name ends in '/' and, on hierarchical-namespace accounts, blobs
    with metadata `hdi_isfolder=true`.
    """

    scheme: ClassVar[str] = "az"
    option_names: ClassVar[frozenset[str]] = frozenset(
        {"account_url", READ_TIMEOUT_OPTION, MIN_READ_RATE_OPTION, *_CREDENTIAL_OPTIONS}
    )
    secret_options: ClassVar[frozenset[str]] = frozenset(_CREDENTIAL_OPTIONS)
    url_options: ClassVar[frozenset[str]] = frozenset({"account_url"})
    list_page_size: ClassVar[int] = 5000
    """Blobs per List Blobs request; 5000 is the service maximum."""

    def __init__(self, uri: DatasetURI, options: Mapping[str, str]) -> None:
        super().__init__(uri, options)
        self._deadline = ReadDeadline.from_options(uri, options)
        self._credential: DefaultAzureCredential | None = None
        self._sas_expiry = sas_expiry(options.get("sas_token", ""))
        self._service = self._make_service_client(options)
        self._container = self._service.get_container_client(uri.location[1])

    @classmethod
    def _check_option(cls, uri: DatasetURI, name: str, value: str) -> None:
        """Also what the SDK refuses as it makes a client or signs a request: an `account_key` that is not base64,
        a `connection_string` that is not `Name=value` pairs naming an endpoint or an account (the SDK's own parse),
        or whose AccountKey is not base64; and an endpoint its HTTP client cannot connect to, which the SDK takes
        and fails on at the first request: an `account_url` whose host `requests` refuses, a `connection_string`
        whose BlobEndpoint, DefaultEndpointsProtocol, AccountName or EndpointSuffix makes no http(s) URL of a host
        (`azure_options`). The messages never show a secret option's credentials."""
        super()._check_option(uri, name, value)
        if name == "account_key":
            check_base64(uri, "option 'account_key'", value)
        elif name == "connection_string":
            check_connection_string(uri, value)
        elif name == "account_url":
            check_host(uri, "option 'account_url'", urlsplit(value.strip()))

    def list(self) -> Iterator[ObjectInfo]:
        prefix = self.uri.prefix
        with self._translated_errors(str(self.uri)):
            blobs = self._container.list_blobs(
                name_starts_with=f"{prefix}/" if prefix else None,
                include=["metadata"],
                results_per_page=self.list_page_size,
            )
            page_bytes = self.list_page_size * _LISTED_BLOB_BYTES
            for page in self._deadline.of_pages(str(self.uri), blobs.by_page(), page_bytes):
                for blob in page:
                    split = relative_key(prefix, blob.name)
                    if split is not None:
                        yield _object_info(split[0], blob, is_dir=split[1])

    def stat(self, key: str) -> ObjectInfo:
        self._check_key(key)
        blob = self._container.get_blob_client(join_key(self.uri.prefix, key))
        object_uri = self.object_uri(key)
        with self._translated_errors(object_uri), self._deadline.of_head(object_uri):
            return _object_info(key, blob.get_blob_properties(), is_dir=False)

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        """See `Backend.read`; the version is the ETag, checked by the service (If-Match)."""
        if not self._wants_bytes(key, offset, length):
            return b""
        blob = join_key(self.uri.prefix, key)
        # retry_total=0: the SDK's pipeline does not retry a read by itself, so every retry of a read is the
        # shared wrapper's, jittered, counted and logged like every other backend's. (The SDK's downloader still
        # re-sends a GET whose body fails, up to 3 tries 1 s apart; nothing turns that off.)
        options: dict[str, Any] = {"retry_total": 0}
        if version is not None:  # (an `etag` without `match_condition` would reach the HTTP layer and fail)
            options |= {"etag": f'"{version}"', "match_condition": MatchConditions.IfNotModified}
        object_uri = self.object_uri(key)
        with self._translated_errors(object_uri), self._deadline.of_read(object_uri, length):
            try:
                data: bytes = self._container.download_blob(blob, offset, length, **options).readall()
                return data
            except HttpResponseError as exc:
                if exc.status_code == 416:  # the range starts at or after the end of the blob
                    return b""
                if exc.status_code == 412 and version is not None:
                    raise changed_object(object_uri, version) from None
                raise

    def close(self) -> None:
        self._service.close()
        if self._credential is not None:
            self._credential.close()

    def _translate(self, exc: Exception, what: str) -> BackendError:
        status = exc.status_code if isinstance(exc, HttpResponseError) else None
        inner = exc.inner_exception if isinstance(exc, HttpResponseError) else None
        if status is None and isinstance(inner, Exception) and inner is not exc:
            # The SDK's downloader gives up on a body that keeps failing (a read timeout, a lost connection) by
            # wrapping the last failure in an HttpResponseError without a status: that failure is what happened.
            return self._translate(inner, what)
        cause = self._describe(exc)
        if isinstance(exc, ClientAuthenticationError) and self._credential is not None:
            token_failure = self._token_failure(exc, what)
            if token_failure is not None:
                return token_failure
        if isinstance(exc, ClientAuthenticationError) or status == 403:
            # The SDK's text begins alike for a key, a SAS or a permission refused; its error code tells them apart.
            code = getattr(exc, "error_code", None)
            expired = self._sas_expiry is not None and datetime.now(UTC) >= self._sas_expiry
            why = f"; the sas_token option expired at {self._sas_expiry:%Y-%m-%d %H:%M:%S} UTC" if expired else ""
            return AccessDenied(f"{what}: access denied ({code + ': ' if code else ''}{cause}){why}")
        if isinstance(exc, IncompleteReadError):
            return BackendUnavailable(f"{what}: connection lost during download ({cause})")
        if isinstance(exc, requests.exceptions.ChunkedEncodingError | requests.exceptions.ConnectionError):
            # The SDK reads the body of an answer it parses whole (a listing page) through `requests` and lets that
            # library's errors through unwrapped: a page cut short.
            return BackendUnavailable(f"{what}: connection lost while reading the answer ({cause})")
        if getattr(exc, "error_code", None) == "ContainerNotFound":
            account, container = self.uri.location
            return NoSuchObject(f"{what}: container az://{account}/{container} does not exist ({cause})")
        if status == 404:
            return NoSuchObject(f"{what}: no such blob ({cause})")
        if status is not None and (status >= 500 or status in (408, 429)):
            return BackendUnavailable(f"{what}: storage unavailable or throttling ({cause})")
        if isinstance(exc, ServiceRequestError | ServiceResponseError):
            return BackendUnavailable(f"{what}: endpoint unreachable or connection lost ({cause})")
        if status is not None:
            return BackendError(f"{what}: request failed ({cause})")
        return super()._translate(exc, what)

    def _token_failure(self, exc: ClientAuthenticationError, what: str) -> BackendError | None:
        """What a failed token request is: transient where its endpoint failed on the network or answered that it
        is unavailable or throttling (`_TOKEN_RETRY_ANSWERS`), else access denied. None where `exc` carries an answer
        but no such one of a token endpoint: a refusal by the storage service, or an identity refused in an error
        that shows the endpoint's answer, access denied as the storage service's refusals are."""
        answer = _token_endpoint_answer(exc)
        if exc.response is not None and answer is None:
            return None
        attempt = self._token_attempt(exc)
        if any(isinstance(link, _TIMEOUTS) for link in _linked(exc)):
            # Which wait it was is not told reliably: a TLS handshake that stalls is a "read" timeout to urllib3.
            return BackendUnavailable(
                f"{what}: Azure AD token endpoint timed out (a connection gets {_CONNECT_TIMEOUT:g} s, an answer "
                f"{self._deadline.read_timeout:g} s: option {READ_TIMEOUT_OPTION}; no Azure AD token: {attempt})"
            )
        if _caused_by_network(exc):
            return BackendUnavailable(
                f"{what}: Azure AD token endpoint unreachable or connection lost (no Azure AD token: {attempt})"
            )
        if answer is not None:
            return BackendUnavailable(
                f"{what}: Azure AD token endpoint unavailable or throttling (HTTP {answer}; no Azure AD token: "
                f"{attempt})"
            )
        return AccessDenied(f"{what}: access denied (no Azure AD token: {attempt}; {_AD_CREDENTIAL_ADVICE})")

    def _token_attempt(self, exc: ClientAuthenticationError) -> str:
        """Which credential gave no token, and why, on one line. DefaultAzureCredential's error lists each credential
        it tried, one per line after a tab, and stops at the first that failed rather than found nothing to use: that
        one, when it stopped early, is the cause; else the first, the environment's (what a server process is given),
        is the one to fix. A credential that had given a token before fails alone, its own text naming it. Scrubbed,
        as every message is."""
        tried = [line.strip() for line in str(exc).splitlines() if line.startswith("\t")]
        chain = getattr(self._credential, "credentials", ())
        attempt = tried[-1] if 0 < len(tried) < len(chain) else tried[0] if tried else str(exc).strip()
        first_line = (scrub(attempt).splitlines() or [""])[0][:300].rstrip(".")
        lead = "DefaultAzureCredential tried " if tried else ""  # else its text names it
        return f"{lead}{first_line}"

    def _ad_credential(self) -> DefaultAzureCredential:
        """DefaultAzureCredential, its secrets from the environment registered with the scrubber and azure-identity's
        log lines made DEBUG (`_log_identity_at_debug`); a configuration of it the environment gives that
        azure-identity refuses (a file that cannot be read, an AZURE_TOKEN_CREDENTIALS or AZURE_TENANT_ID it does not
        take) is `InvalidBackendOption`, as boto3's refusal of the environment is."""
        for name in _ENVIRONMENT_SECRETS:
            register_secret(os.environ.get(name, ""))
        _log_identity_at_debug()
        try:
            return _CausedDefaultAzureCredential(self._deadline.read_timeout)
        except (ValueError, OSError) as exc:
            path = getattr(exc, "filename", None)
            named = [name for name, value in sorted(os.environ.items()) if name.startswith("AZURE_") and value == path]
            variables = " and ".join(named) if path is not None and named else "its AZURE_* variables"
            raise InvalidBackendOption(
                f"{self.uri}: DefaultAzureCredential (no option 'account_key', 'sas_token' or 'connection_string' is "
                f"given) refuses the Azure AD configuration of this process's environment ({self._describe(exc)}): "
                f"fix {variables}, or give one of those options"
            ) from None

    def _make_service_client(self, options: Mapping[str, str]) -> BlobServiceClient:
        """A thread-safe client for the validated options; no request is made yet."""
        uri = self.uri
        given = [name for name in _CREDENTIAL_OPTIONS if name in options]
        if len(given) > 1:
            raise InvalidBackendOption(f"{uri}: options {' and '.join(map(repr, given))} exclude each other")
        # An unreachable endpoint must fail in seconds; the caller's retry wrapper decides about retrying.
        settings: dict[str, Any] = {
            "retry_policy": _StorageRetry(backoff=1, retry_total=1, random_jitter_range=1),
            "transport": _WatchedTransport(
                connection_timeout=_CONNECT_TIMEOUT,
                read_timeout=self._deadline.read_timeout,
                connection_data_block_size=DATA_BLOCK_SIZE,  # what the SDK gives a transport it makes itself
            ),
        }
        if "connection_string" in options:
            if "account_url" in options:
                raise InvalidBackendOption(f"{uri}: option 'account_url' excludes 'connection_string'")
            try:
                return BlobServiceClient.from_connection_string(options["connection_string"], **settings)
            except ValueError:  # checked before (`azure_options.check_connection_string`): an SDK that checks more
                raise InvalidBackendOption(f"{uri}: option 'connection_string' is malformed") from None
        account = uri.location[0]
        account_url = parse_url_option(
            uri, "account_url", options.get("account_url", f"https://{account}.blob.core.windows.net")
        )
        credential: AzureNamedKeyCredential | AzureSasCredential | DefaultAzureCredential
        if "account_key" in options:
            credential = AzureNamedKeyCredential(account, options["account_key"])
        elif "sas_token" in options:
            credential = AzureSasCredential(options["sas_token"].lstrip("?"))
        elif account_url.startswith("https://"):
            credential = self._credential = self._ad_credential()
        else:
            raise InvalidBackendOption(
                f"{uri}: option 'account_url' must be https:// for Azure AD credentials; "
                "plain http needs 'account_key', 'sas_token' or 'connection_string'"
            )
        try:
            return BlobServiceClient(account_url, credential=credential, **settings)
        except ValueError as exc:  # the URL is checked before (`parse_url_option`): an SDK that checks more
            raise InvalidBackendOption(
                f"{uri}: option 'account_url' is refused by the Azure SDK: {shown_sdk_text(exc)}"
            ) from None


class _StorageRetry(LinearRetry):
    """The storage pipeline's one retry of a failed request, 1 +- 1 s after it, but not of a failed token request,
    which the credential's own pipeline has retried as far as silod lets it (`_TOKEN_REQUEST_RETRIES`): retried here,
    each of silod's tries asked a failing token endpoint twice over, and a throttled one's cached answer (MSAL's)
    came back the second time anyway. (A token failure is the one ClientAuthenticationError the pipeline raises
    before the storage service answers; the service's refusals come back as answers.)"""

    def increment(
        self,
        settings: dict[str, Any],
        request: PipelineRequest[Any],
        response: PipelineResponse[Any, Any] | None = None,
        error: AzureError | None = None,
    ) -> bool:
        if isinstance(error, ClientAuthenticationError):
            return False
        return super().increment(settings, request, response, error)


class _WatchedTransport(RequestsTransport):  # type: ignore[misc]  # azure-core is untyped here (pyproject.toml)
    """The SDK's own transport, whose `requests` session sends on connections that put every answer under the
    deadline of the try that asked for it (`deadline`) from its first byte (`watched_http`): the answers the SDK
    reads whole (listings, properties) as well as the downloads it streams, its downloader's re-sends included."""

    def _init_session(self, session: requests.Session) -> None:
        super()._init_session(session)
        for prefix, adapter in list(session.adapters.items()):  # the SDK's, configured as the SDK does: no retries
            session.mount(prefix, _WatchedAdapter(max_retries=cast(HTTPAdapter, adapter).max_retries))


class _WatchedAdapter(BiggerBlockSizeHTTPAdapter):
    """The SDK's `requests` adapter, its pools watched, direct or through a proxy (SOCKS included)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = watched_pools(self.poolmanager.pool_classes_by_scheme)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = watched_pools(manager.pool_classes_by_scheme)  # unchanged once watched
        return manager


class _ChainedCredential(TokenCredential, SupportsTokenInfo, Protocol):
    """What each credential of DefaultAzureCredential's chain is: both kinds of token source, and a context manager."""


class _CausedDefaultAzureCredential(DefaultAzureCredential):
    """DefaultAzureCredential whose error, when a credential of its chain failed (rather than found nothing to use),
    has that credential's exception as its cause. The chain raises an error of its own holding only the text of each
    attempt, in which whether the network failed (a retry may get the token) or the identity was refused (access
    denied) is lost. Once a credential has given a token, DefaultAzureCredential asks that one alone, and its failure
    comes with its own causes. Where the token endpoint answered that it is unavailable or throttling, the cause is
    that answer (`_TokenEndpointAnswered`), which azure-identity's errors do not show.

    Its credentials' token requests retry as `_TOKEN_REQUEST_RETRIES` says, and wait as the storage requests do, not
    azure-core's default 300 s for a connection and 300 s for each next bytes of an answer: `_CONNECT_TIMEOUT` for a
    connection and `read_timeout` (the backend's option) for the next bytes of an answer. A failed token request is
    retried only while less than `read_timeout` (and at least `_CONNECT_TIMEOUT`) has passed since it was sent
    (azure-core's `RetryPolicy` timeout): a refused or reset connection at once, but not a request whose answer never
    came, which would cost the try a second `read_timeout`. The settings reach every credential of the chain that
    makes HTTP requests, since azure-identity builds each one's pipeline and transport from them: a managed
    identity's (IDENTITY_ENDPOINT, the instance metadata endpoint), a workload identity's and a service principal's
    (the authority)."""

    def __init__(self, read_timeout: float) -> None:
        # `kept`: the failure of a credential in this thread's request; `answer`: the HTTP status of the last answer a
        # token endpoint gave it, seen by every credential's pipeline (its hook runs in the thread that asks).
        self._failure = threading.local()
        super().__init__(
            raw_response_hook=self._answered,
            connection_timeout=_CONNECT_TIMEOUT,
            read_timeout=read_timeout,
            timeout=max(read_timeout, _CONNECT_TIMEOUT),
            **_TOKEN_REQUEST_RETRIES,
        )
        self.credentials = tuple(
            _KeptFailure(cast(_ChainedCredential, credential), self._failure) for credential in self.credentials
        )

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return self._caused(functools.partial(super().get_token, *scopes, **kwargs))

    def get_token_info(self, *scopes: str, options: TokenRequestOptions | None = None) -> AccessTokenInfo:
        return self._caused(functools.partial(super().get_token_info, *scopes, options=options))

    def _caused(self, request: Callable[[], _T]) -> _T:
        self._failure.kept = None
        try:
            return request()
        except ClientAuthenticationError as exc:
            failure: Exception | None = self._failure.kept
            if failure is None or failure is exc:
                raise
            raise exc from failure
        finally:
            self._failure.kept = None

    def _answered(self, response: PipelineResponse[Any, Any]) -> None:
        self._failure.answer = response.http_response.status_code


class _KeptFailure:
    """A credential of `_CausedDefaultAzureCredential`'s chain that keeps the exception it fails with in the thread's
    `failure.kept` before raising it on: the last answer of its token endpoint where that asked to try again
    (`_TokenEndpointAnswered`) and the failure was not the network's, else the exception itself, but not one saying
    the credential has nothing to use (`CredentialUnavailableError`): the chain goes on to the next credential then,
    so its error is not that one's. azure-identity reports a managed identity endpoint's 503 or 429 so, as "not found
    in environment" or "no response from the IMDS endpoint"; and MSAL answers a request repeated within a throttled
    answer's Retry-After from its cache, without asking the endpoint: that answer is this credential's last one. It
    reports a network failure of the instance metadata endpoint's token request so too, even where it knows the
    endpoint is there (`_metadata_endpoint_known`): that one is kept, as the failure it is."""

    def __init__(self, credential: _ChainedCredential, failure: threading.local) -> None:
        self._credential = credential
        self._failure = failure
        # The name the chain's error gives the credential (its class's, or its own for one azure-identity could not
        # make), which silod's messages show.
        self._credential_name: str = getattr(credential, "_credential_name", type(credential).__name__)
        self._answer: int | None = None  # the HTTP status of its token endpoint's last answer

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return self._kept(functools.partial(self._credential.get_token, *scopes, **kwargs))

    def get_token_info(self, *scopes: str, options: TokenRequestOptions | None = None) -> AccessTokenInfo:
        return self._kept(functools.partial(self._credential.get_token_info, *scopes, options=options))

    def __enter__(self) -> _KeptFailure:
        self._credential.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self._credential.__exit__(*args)

    def close(self) -> None:
        self._credential.close()

    def _kept(self, request: Callable[[], _T]) -> _T:
        self._failure.answer = None
        try:
            return request()
        except Exception as exc:
            answer: int | None = self._failure.answer if self._failure.answer is not None else self._answer
            if answer is not None and answer in _TOKEN_RETRY_ANSWERS and not _caused_by_network(exc):
                self._failure.kept = _TokenEndpointAnswered(self._credential_name, answer)
            elif not isinstance(exc, CredentialUnavailableError) or (
                _caused_by_network(exc) and _metadata_endpoint_known(self._credential)
            ):
                self._failure.kept = exc
            raise
        finally:
            if self._failure.answer is not None:
                self._answer = self._failure.answer


def _metadata_endpoint_known(credential: _ChainedCredential) -> bool:
    """Whether `credential` is a managed identity's that asks the instance metadata endpoint for tokens and knows that
    endpoint is there: AZURE_POD_IDENTITY_AUTHORITY_HOST names it, or it answered the probe azure-identity sends it
    (one try, 1 s to connect) before the first token request in a chain. A network failure of its token request then
    is the endpoint failing, not a host without one; a failed probe (a host off Azure) is still nothing to use. (What
    azure-identity keeps in ManagedIdentityCredential's `_credential`, an ImdsCredential's `_endpoint_available`.)"""
    inner = getattr(credential, "_credential", None)
    return getattr(inner, "_endpoint_available", None) is True


class _TokenEndpointAnswered(Exception):
    """The cause of a failed token request whose endpoint answered that it is unavailable or throttling."""

    def __init__(self, credential_name: str, status: int) -> None:
        super().__init__(f"the token endpoint of {credential_name} answered HTTP {status}")
        self.status = status


def _token_endpoint_answer(exc: BaseException) -> int | None:
    """The status of the answer asking to try again that made a token request fail (`_TokenEndpointAnswered`), if
    one did."""
    return next((link.status for link in _linked(exc) if isinstance(link, _TokenEndpointAnswered)), None)


def _caused_by_network(exc: BaseException) -> bool:
    """Whether `exc` was raised for a failure of the network (`_NETWORK_FAULTS`, `_TIMEOUTS`)."""
    return any(isinstance(link, _NETWORK_FAULTS + _TIMEOUTS) for link in _linked(exc))


def _linked(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what led to it, each once: where a traceback shows it (`__cause__`, else `__context__` unless
    suppressed) and the exception azure-core wraps (`inner_exception`)."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        context = None if current.__suppress_context__ else current.__context__
        linked = (current.__cause__, context, getattr(current, "inner_exception", None))
        pending.extend(link for link in linked if isinstance(link, BaseException))


class _DebugLevel(logging.Filter):
    """Makes azure-identity's records below ERROR DEBUG records, passed on only where DEBUG is on. Each failed token
    request logged a WARNING of a dozen lines (every credential tried, a guide's link) beside silod's one line that
    says what failed and what to set (`AzureBackend._token_attempt`) and its INFO line for each retry: a wall of text
    per retried read. At DEBUG the detail is all there. An ERROR stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)  # its level was checked as it was


_DEBUG_LEVEL = _DebugLevel()


@functools.cache
def _log_identity_at_debug() -> None:
    """Put `_DebugLevel` on the logger of each of azure-identity's modules, once per process. A logger's filter sees
    only the records made by that logger, not by those below it, and azure-identity logs through one per module,
    `getLogger(__name__)`, some of them imported only as a credential is made: the logger of a module not imported
    yet is made here, and is the one it gets. (A handler's filter would see them all, but the handlers are the
    command's, `datamgr.logs`.)"""
    package = Path(azure.identity.__file__).parent
    for path in package.rglob("*.py"):
        module = ".".join((azure.identity.__name__, *path.relative_to(package).with_suffix("").parts))
        logging.getLogger(module.removesuffix(".__init__")).addFilter(_DEBUG_LEVEL)


def _object_info(key: str, blob: BlobProperties, is_dir: bool) -> ObjectInfo:
    is_dir = is_dir or (blob.metadata or {}).get("hdi_isfolder", "").lower() == "true"
    return ObjectInfo(key, blob.size, unquote_etag(blob.etag), datetime_to_ns(blob.last_modified), is_dir)


def sas_expiry(token: str) -> datetime | None:
    """When a SAS token stops working (its `se` field, ISO 8601 UTC); None without a token or without a readable
    expiry (the service then says what is wrong)."""
    values = parse_qs(token.lstrip("?")).get("se")
    if not values:
        return None
    try:
        expiry = datetime.fromisoformat(values[0].replace("Z", "+00:00"))
    except ValueError:
        return None
    return expiry if expiry.tzinfo is not None else expiry.replace(tzinfo=UTC)
