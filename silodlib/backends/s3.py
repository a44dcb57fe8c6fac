"""S3 and S3-compatible object stores (MinIO, moto, Ceph RGW) through boto3.

Only ListObjectsV2, HeadObject and ranged GetObject are used, the subset every S3-compatible server
implements, and only read permissions are needed.
"""

from __future__ import annotations

import os
import shlex
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, ClassVar, cast
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

import boto3
import botocore.session
import urllib3.exceptions
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    InvalidRegionError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    SSLError,
)
from botocore.httpsession import URLLib3Session
from botocore.loaders import Loader
from botocore.utils import (
    get_environ_proxies,
    is_valid_endpoint_url,
    is_valid_ipv6_endpoint_url,
    validate_region_name,
)
from urllib3.connectionpool import HTTPConnectionPool

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
    parse_bool_option,
    parse_url_option,
    relative_key,
    shown_sdk_text,
    shown_value,
    unquote_etag,
)
from silodlib.backends.deadline import ReadDeadline
from silodlib.backends.uri import DatasetURI
from silodlib.backends.watched_http import watched_pools

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
_DENIED = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AllAccessDisabled",
        "AccountProblem",
    }
)
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable"})


class S3Backend(Backend):
    """`s3://bucket/prefix`. Options: `endpoint_url` (non-AWS servers), `region`, `path_style`
    ("true" for servers without virtual-host buckets), `read_timeout` (seconds to wait for the next bytes of
    an answer; default 30), `min_read_rate` (a read's deadline, `deadline`; default 64KiB/s), and either
    `access_key_id` + `secret_access_key` (+ `session_token`) or a `profile`; with neither, boto3's standard
    credential chain applies.

    A key ending in '/' (the S3 console's folder marker) is listed as an explicit folder.
    """

    scheme: ClassVar[str] = "s3"
    option_names: ClassVar[frozenset[str]] = frozenset(
        {
            "endpoint_url",
            "region",
            "path_style",
            READ_TIMEOUT_OPTION,
            MIN_READ_RATE_OPTION,
            "access_key_id",
            "secret_access_key",
            "session_token",
            "profile",
        }
    )
    secret_options: ClassVar[frozenset[str]] = frozenset({"secret_access_key", "session_token"})
    url_options: ClassVar[frozenset[str]] = frozenset({"endpoint_url"})

    def __init__(self, uri: DatasetURI, options: Mapping[str, str]) -> None:
        super().__init__(uri, options)
        self._bucket = uri.location[0]
        self._deadline = ReadDeadline.from_options(uri, options)
        session, self._client = _make_client(uri, options, self._deadline.read_timeout)
        self._ranged_get = _RangedGet(session, self._client, self._bucket, self._deadline.read_timeout)

    @classmethod
    def open_waits_for(cls, uri: DatasetURI, options: Mapping[str, str]) -> str:
        """Where making the client looks for credentials beyond the options: a profile's `credential_process` (its
        program's file name), SSO login or role, or boto3's default chain, which ends at a container's credential
        endpoint and the instance metadata service. "" with keys, in the options or the environment."""
        if "access_key_id" in options or ("profile" not in options and os.environ.get("AWS_ACCESS_KEY_ID")):
            return ""
        try:
            session = botocore.session.Session(profile=options.get("profile"))
            name = session.profile or "default"
            profiles: Mapping[str, Mapping[str, str]] = session.full_config.get("profiles", {})
        except (BotoCoreError, OSError, ValueError):  # a config file it cannot read or parse: the open says why
            return ""
        return _credential_source(profiles, name, named="profile" in options)

    @classmethod
    def _check_option(cls, uri: DatasetURI, name: str, value: str) -> None:
        """Also what botocore refuses as it makes a client: a `region` that is no host label, an `endpoint_url`
        whose host is no DNS name or IP address (an '_' in it, as in docker-compose service names), and a
        `path_style` that is not a boolean."""
        super()._check_option(uri, name, value)
        if name == "region":
            _check_region(uri, value)
        elif name == "endpoint_url":
            _check_endpoint_host(uri, parse_url_option(uri, name, value))
        elif name == "path_style":
            parse_bool_option(uri, name, value)

    def list(self) -> Iterator[ObjectInfo]:
        prefix = self.uri.prefix
        with self._translated_errors(str(self.uri)):
            paginator = self._client.get_paginator("list_objects_v2")
            pages = iter(paginator.paginate(Bucket=self._bucket, Prefix=f"{prefix}/" if prefix else ""))
            for page in self._deadline.of_pages(str(self.uri), pages, _LIST_PAGE_BYTES):
                for obj in page.get("Contents", []):
                    split = relative_key(prefix, obj["Key"])
                    if split is not None:
                        key, is_dir = split
                        mtime_ns = datetime_to_ns(obj["LastModified"])
                        yield ObjectInfo(key, obj["Size"], unquote_etag(obj["ETag"]), mtime_ns, is_dir)

    def stat(self, key: str) -> ObjectInfo:
        self._check_key(key)
        object_uri = self.object_uri(key)
        with self._translated_errors(object_uri), self._deadline.of_head(object_uri):
            head = self._client.head_object(Bucket=self._bucket, Key=join_key(self.uri.prefix, key))
        mtime_ns = datetime_to_ns(head["LastModified"])
        return ObjectInfo(key, head["ContentLength"], unquote_etag(head["ETag"]), mtime_ns)

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        """See `Backend.read`; the version is the ETag, checked by the server (If-Match)."""
        if not self._wants_bytes(key, offset, length):
            return b""
        object_uri = self.object_uri(key)
        with self._translated_errors(object_uri), self._deadline.of_read(object_uri, length):
            try:
                return self._ranged_get(join_key(self.uri.prefix, key), offset, offset + length - 1, version)
            except _ErrorResponse as exc:
                if exc.status == 412 and version is not None:
                    raise changed_object(object_uri, version) from None
                raise

    def close(self) -> None:
        self._ranged_get.close()
        self._client.close()

    def _translate(self, exc: Exception, what: str) -> BackendError:
        cause = self._describe(exc)
        if isinstance(exc, ClientError | _ErrorResponse):
            code, status = (exc.code, exc.status) if isinstance(exc, _ErrorResponse) else _code_and_status(exc)
            if code == "NoSuchBucket":
                return NoSuchObject(f"{what}: bucket s3://{self._bucket} does not exist ({cause})")
            if status == 404 or code in _NOT_FOUND:
                return NoSuchObject(f"{what}: no such object ({cause})")
            if status == 403 or code in _DENIED:
                return AccessDenied(f"{what}: access denied ({cause})")
            if status >= 500 or status == 429 or code in _THROTTLED:
                return BackendUnavailable(f"{what}: storage unavailable or throttling ({cause})")
            return BackendError(f"{what}: request failed ({cause})")
        if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return AccessDenied(f"{what}: no usable credentials ({cause})")
        if isinstance(exc, SSLError):
            return BackendError(f"{what}: TLS failure ({cause})")
        if isinstance(exc, ConnectionError | HTTPClientError | IncompleteReadError | urllib3.exceptions.HTTPError):
            return BackendUnavailable(f"{what}: endpoint unreachable or connection lost ({cause})")
        return super()._translate(exc, what)


_REGION_RULE = (
    "a region name such as us-east-1 (at most 63 letters, digits and '-', not digits only, and neither starting nor "
    "ending with '-')"
)


def _check_region(uri: DatasetURI, region: str) -> None:
    """Refuse a `region` option botocore refuses (`validate_region_name`, its own check when a client is made)."""
    try:
        validate_region_name(region)
    except InvalidRegionError:
        raise InvalidBackendOption(
            f"{uri}: option 'region' must be {_REGION_RULE}, got {shown_value(region)}"
        ) from None


def _check_endpoint_host(uri: DatasetURI, endpoint_url: str) -> None:
    """Refuse an endpoint URL (as `parse_url_option` returns it) that botocore refuses when a client is made: one
    whose host is neither a DNS name nor an IP address."""
    if is_valid_endpoint_url(endpoint_url) or is_valid_ipv6_endpoint_url(endpoint_url):
        return
    host = urlsplit(endpoint_url).hostname or ""
    raise InvalidBackendOption(
        f"{uri}: option 'endpoint_url' has a host botocore refuses, {shown_value(host)}: a host must be an IP "
        "address or a DNS name (labels of letters, digits and '-', each at most 63 characters, 255 in all; no '_': "
        "name a docker-compose service without one, or give it such an alias)"
    )


def _code_and_status(exc: ClientError) -> tuple[str, int]:
    return exc.response.get("Error", {}).get("Code", ""), exc.response.get("ResponseMetadata", {}).get(
        "HTTPStatusCode", 0
    )


class _ErrorResponse(Exception):
    """An S3 error answer to a ranged GET: its HTTP status and the error code and message of its XML body."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            error = ElementTree.fromstring(body)
            code, message = error.findtext("Code") or "", error.findtext("Message") or ""
        except ElementTree.ParseError:
            code, message = "", ""
        super().__init__(f"{code or 'HTTP error'} ({status}): {message}".rstrip(": "))
        self.status = status
        self.code = code


class _RangedGet:
    """Ranged GetObject, signed by botocore's SigV4 signer and sent on botocore's HTTP session, but without
    the client's per-call machinery (parameter serialisation, endpoint rules, event hooks, response
    parsing).

    A cold epoch of small files is one GET per file, and that machinery was most of the FUSE client's CPU
    per file: `get_object` costs 1.5 ms of CPU per 110 KB object, this path 0.8 ms (docs/benchmarks.md).
    The bucket's base URL comes from botocore itself (a presigned URL: no request is made), so addressing
    style, region and endpoint rules stay botocore's; so do credentials (refreshed as they expire), TLS
    verification (`AWS_CA_BUNDLE`) and proxies from the environment. Thread-safe.
    """

    _PLACEHOLDER = "k"

    def __init__(self, session: botocore.session.Session, client: S3Client, bucket: str, read_timeout: float) -> None:
        self._session = session
        self._client = client
        self._bucket = bucket
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._route: _Route | None = None

    def __call__(self, key: str, first: int, last: int, etag: str | None = None) -> bytes:
        """Bytes `first`..`last` (inclusive) of `key`; b"" when `first` is at or past the end of the object.
        With `etag`, only of that version of the object (else the server answers 412)."""
        route = self._route or self._resolve()
        headers = {"Range": f"bytes={first}-{last}"}
        if etag is not None:
            headers["If-Match"] = f'"{etag}"'
        # stream_output: the body is read here in one call; botocore would read it in 64 KiB pieces and join
        # them, a second copy of every byte and most of this call's CPU for a 4 MiB item.
        request = AWSRequest("GET", route.base_url + quote(key, safe="/~"), headers=headers, stream_output=True)
        route.sign(request)
        response = route.http.send(request.prepare())
        if response.status_code == 206:
            body: bytes = response.raw.read()
            return body
        if response.status_code == 200:  # the server ignored the range, as HTTP allows: the whole object comes
            return _range_of_whole(response.raw, first, last)
        body = response.raw.read()
        if response.status_code == 416:  # the range starts at or after the end of the object
            return b""
        raise _ErrorResponse(response.status_code, body)

    def close(self) -> None:
        if self._route is not None:
            self._route.http.close()

    def _resolve(self) -> _Route:
        """Credentials, base URL and HTTP session, on first use: finding credentials may take lookups (instance
        metadata) that opening a backend must not wait for, and presigning needs credentials."""
        with self._lock:
            if self._route is None:
                credentials = self._session.get_credentials()
                if credentials is None:
                    raise NoCredentialsError()
                presigned = self._client.generate_presigned_url(
                    "get_object", Params={"Bucket": self._bucket, "Key": self._PLACEHOLDER}, ExpiresIn=60
                )
                base_url = presigned.split("?", 1)[0].removesuffix(self._PLACEHOLDER)
                ca_bundle = self._session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE")
                # botocore's stubs narrow these two; the session takes a CA bundle path and (connect, read) timeouts.
                http = URLLib3Session(
                    verify=cast(bool, ca_bundle or True),
                    proxies=get_environ_proxies(base_url),
                    timeout=cast(int, (_CONNECT_TIMEOUT, self._read_timeout)),
                    max_pool_connections=_MAX_CONNECTIONS,
                )
                _watch_connections(http)
                self._route = _Route(base_url, credentials, self._client.meta.region_name, http)
            return self._route


def _range_of_whole(answer: urllib3.BaseHTTPResponse, first: int, last: int) -> bytes:
    """Bytes `first`..`last` of an answer carrying the whole object, read no further than `last` and keeping only the
    range: the object may be far larger than the range. The connection is closed, its answer unfinished."""
    try:
        skipped = 0
        while skipped < first:
            piece = answer.read(min(first - skipped, _SKIP_PIECE_BYTES))
            if not piece:  # the object ends before the range starts
                return b""
            skipped += len(piece)
        return answer.read(last + 1 - first)
    finally:
        answer.close()


_SKIP_PIECE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Route:
    """Where and how `_RangedGet` sends: the bucket's base URL, the credentials and region it signs with, the
    connection pool."""

    base_url: str
    credentials: Credentials
    region: str
    http: URLLib3Session

    def sign(self, request: AWSRequest) -> None:
        """Sign with one snapshot of the credentials, as botocore's own signer does: credentials that refresh
        (an instance role, IRSA) may change between reading the key id, the secret and the token, and a request
        signed with some of each is refused."""
        S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3", self.region).add_auth(request)


# An unreachable endpoint must fail in seconds; the caller's retry wrapper decides about retrying.
_CONNECT_TIMEOUT = 3
_MAX_CONNECTIONS = 32
# The most one ListObjectsV2 answer holds, for its deadline: 1,000 keys (the service's page), each up to 1,024
# bytes URL-encoded (up to 3 times longer; botocore asks for EncodingType=url) with its ETag, size, date and
# storage class in XML: under 4 KiB an entry.
_LIST_PAGE_BYTES = 1000 * 4096


def _watch_connections(http: URLLib3Session) -> None:
    """Have `http` send on connections that put each answer under the calling try's deadline from its first byte
    (`watched_http`). botocore keeps its pool classes in one mapping per session, which its pool manager and the
    proxy managers it makes later share: swapped in place, before any request, they are used for every one."""
    pools: dict[str, type[HTTPConnectionPool]] = getattr(http, "_pool_classes_by_scheme")  # noqa: B009 -- private
    pools.update(watched_pools(pools))


def _send_listing_checked(http: URLLib3Session, request: AWSPreparedRequest, **_: object) -> AWSResponse:
    """botocore's `before-send` handler for ListObjectsV2: send `request` as the endpoint would, and refuse a body
    cut short (a connection lost, a server that closed early) as an error to retry. botocore has urllib3 accept
    short bodies; it retries a page of broken XML itself, but parses an empty body as an empty last page, which
    would register a dataset without its objects."""
    request.stream_output = True
    response = http.send(request)
    body = response.content
    expected = response.headers.get("content-length")
    if expected is not None and len(body) != int(expected):
        raise IncompleteReadError(actual_bytes=len(body), expected_bytes=int(expected))
    return response


@cache
def _shared_loader() -> Loader:
    """One botocore data loader for every client of the process, so that S3's service model is parsed once.

    A node agent opens a dataset's backend when a job on it arrives and closes it when the last one leaves; with a
    loader per session, each open parsed the model again (12 MB of Python objects, 0.36 s of CPU), and what it
    left was cyclic garbage that only a full collection freed (a soak of job churn: 23 MB of it alive at times,
    and a fragmented heap after). The loader only reads the model files botocore ships (and AWS_DATA_PATH's), the
    same for every session; it caches what it has read."""
    loader: Loader = botocore.session.Session().get_component("data_loader")
    return loader


def _make_client(
    uri: DatasetURI, options: Mapping[str, str], read_timeout: float
) -> tuple[botocore.session.Session, S3Client]:
    """A session and a thread-safe client for the options, validated; no request is made yet."""
    keys = {"access_key_id", "secret_access_key"} & options.keys()
    pair = "'access_key_id' and 'secret_access_key'"
    if len(keys) == 1:
        raise InvalidBackendOption(f"{uri}: options {pair} go together")
    if "session_token" in options and not keys:
        raise InvalidBackendOption(f"{uri}: option 'session_token' needs {pair}")
    if "profile" in options and keys:
        raise InvalidBackendOption(f"{uri}: option 'profile' excludes {pair}")
    endpoint_url = options.get("endpoint_url")
    if endpoint_url is not None:
        endpoint_url = parse_url_option(uri, "endpoint_url", endpoint_url)
    path_style = parse_bool_option(uri, "path_style", options.get("path_style", "false"))
    core = botocore.session.Session()
    core.register_component("data_loader", _shared_loader())
    config = Config(
        connect_timeout=_CONNECT_TIMEOUT,
        read_timeout=read_timeout,
        retries={"mode": "standard", "total_max_attempts": 2},
        max_pool_connections=_MAX_CONNECTIONS,
        s3={"addressing_style": "path" if path_style else "auto"},
        # Our requests are built here, never from user input: no need for botocore to re-validate each one.
        parameter_validation=False,
    )
    try:  # the profile is read by the session, or by the client with the session's loader shared
        session = boto3.session.Session(
            botocore_session=core,
            aws_access_key_id=options.get("access_key_id"),
            aws_secret_access_key=options.get("secret_access_key"),
            aws_session_token=options.get("session_token"),
            region_name=options.get("region"),
            profile_name=options.get("profile"),
        )
        client = session.client("s3", endpoint_url=endpoint_url, config=config)
    except ProfileNotFound:
        raise InvalidBackendOption(f"{uri}: option 'profile': no such AWS profile") from None
    except (BotoCoreError, ValueError) as exc:  # checked above, or given by a profile or the environment
        raise _client_refusal(uri, options, exc) from None
    # The endpoint's own HTTP session (proxies, TLS, timeouts and pool as configured), which botocore sends on.
    endpoint_session: URLLib3Session = getattr(client, "_endpoint").http_session  # noqa: B009 -- not in the stubs
    _watch_connections(endpoint_session)
    # The stubs type handlers as returning None; a before-send handler's answer is what botocore then uses.
    handler = cast("Callable[..., None]", partial(_send_listing_checked, endpoint_session))
    client.meta.events.register("before-send.s3.ListObjectsV2", handler)
    return core, client


def _client_refusal(uri: DatasetURI, options: Mapping[str, str], exc: Exception) -> InvalidBackendOption:
    """What botocore's refusal `exc` to make a client means, naming the option at fault. The options' own values
    are checked before (`_check_option`), so a value botocore refuses here came from the AWS config of the `profile`
    option or, without one, from the environment (AWS_DEFAULT_REGION, AWS_ENDPOINT_URL, the default profile); the
    option of the same name overrides it."""
    if isinstance(exc, InvalidRegionError):
        name, what, why = "region", "region", f"is not {_REGION_RULE}: {shown_value(str(exc.kwargs['region_name']))}"
    elif isinstance(exc, ValueError) and str(exc).startswith("Invalid endpoint"):
        name, what, why = "endpoint_url", "endpoint URL", f"has a host botocore refuses ({_sdk_text(exc)})"
    else:
        name, what, why = "profile", "configuration", f"is refused by botocore ({_sdk_text(exc)})"
    if name in options:  # a value the checks before let through (a botocore that checks more)
        return InvalidBackendOption(f"{uri}: option {name!r} {why}")
    if "profile" in options:
        return InvalidBackendOption(
            f"{uri}: option 'profile' names an AWS profile whose {what} {why}: fix the profile"
            + ("" if name == "profile" else f" or set option {name!r}")
        )
    return InvalidBackendOption(
        f"{uri}: the {what} the environment or the default AWS profile gives {why}: fix it"
        + ("" if name == "profile" else f" or set option {name!r}")
    )


def _credential_source(profiles: Mapping[str, Mapping[str, str]], name: str, *, named: bool) -> str:
    """Where AWS profile `name` (from the AWS config's `profiles`) gets its credentials, following the profiles whose
    role is assumed with another's credentials (`source_profile`); `named`: the dataset's options name the profile."""
    seen: set[str] = set()
    current = name
    while current not in seen:
        seen.add(current)
        section = profiles.get(current, {})
        process = section.get("credential_process")
        if process:
            return f"the credential_process {_program_name(process)!r} of AWS profile {current!r}"
        if "sso_session" in section or "sso_start_url" in section:
            return f"the SSO login of AWS profile {current!r}"
        if "role_arn" in section and section.get("source_profile"):
            current = section["source_profile"]
            continue
        if "role_arn" in section:
            return f"the role AWS profile {current!r} assumes"
        break
    if named or name in profiles:
        return f"the credentials of AWS profile {name!r}"
    return "boto3's default credential chain (a container's credential endpoint, the instance metadata service)"


def _program_name(command: str) -> str:
    """The file name of the program a `credential_process` runs, without its directory or arguments, which may hold
    a secret (a password given on its command line)."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: botocore fails to run it, but the name is still its first word
        words = command.split()
    return os.path.basename(words[0]) if words else ""


def _sdk_text(exc: Exception) -> str:
    """An SDK exception as a refusal shows it: its type and the first line of its text (`shown_sdk_text`)."""
    return f"{type(exc).__name__}: {shown_sdk_text(exc)}" if str(exc).strip() else type(exc).__name__
