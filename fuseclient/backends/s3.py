"""S3 and S3-compatible object stores (MinIO, moto, Ceph RGW) through boto3.

Only ListObjectsV2, HeadObject and ranged GetObject are used, the subset every S3-compatible server
implements, and only read permissions are needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, ClassVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    SSLError,
)

from fuseclient.backends.base import (
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    InvalidBackendOption,
    NoSuchObject,
    ObjectInfo,
    datetime_to_ns,
    join_key,
    parse_bool_option,
    parse_url_option,
    relative_key,
    unquote_etag,
)
from fuseclient.backends.uri import DatasetURI

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
    ("true" for servers without virtual-host buckets), and either `access_key_id` + `secret_access_key`
    (+ `session_token`) or a `profile`; with neither, boto3's standard credential chain applies.

    A key ending in '/' (the S3 console's folder marker) is listed as an explicit folder.
    """

    scheme: ClassVar[str] = "s3"
    option_names: ClassVar[frozenset[str]] = frozenset(
        {"endpoint_url", "region", "path_style", "access_key_id", "secret_access_key", "session_token", "profile"}
    )
    secret_options: ClassVar[frozenset[str]] = frozenset({"secret_access_key", "session_token"})

    def __init__(self, uri: DatasetURI, options: Mapping[str, str]) -> None:
        super().__init__(uri, options)
        self._bucket = uri.location[0]
        self._client = _make_client(uri, options)

    def list(self) -> Iterator[ObjectInfo]:
        prefix = self.uri.prefix
        with self._translated_errors(str(self.uri)):
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=f"{prefix}/" if prefix else ""):
                for obj in page.get("Contents", []):
                    split = relative_key(prefix, obj["Key"])
                    if split is not None:
                        key, is_dir = split
                        mtime_ns = datetime_to_ns(obj["LastModified"])
                        yield ObjectInfo(key, obj["Size"], unquote_etag(obj["ETag"]), mtime_ns, is_dir)

    def stat(self, key: str) -> ObjectInfo:
        self._check_key(key)
        with self._translated_errors(self.object_uri(key)):
            head = self._client.head_object(Bucket=self._bucket, Key=join_key(self.uri.prefix, key))
        mtime_ns = datetime_to_ns(head["LastModified"])
        return ObjectInfo(key, head["ContentLength"], unquote_etag(head["ETag"]), mtime_ns)

    def read(self, key: str, offset: int, length: int) -> bytes:
        if not self._wants_bytes(key, offset, length):
            return b""
        with self._translated_errors(self.object_uri(key)):
            try:
                response = self._client.get_object(
                    Bucket=self._bucket,
                    Key=join_key(self.uri.prefix, key),
                    Range=f"bytes={offset}-{offset + length - 1}",
                )
            except ClientError as exc:
                if _status(exc) == 416:  # the range starts at or after the end of the object
                    return b""
                raise
            return response["Body"].read()

    def close(self) -> None:
        self._client.close()

    def _translate(self, exc: Exception, what: str) -> BackendError:
        cause = self._describe(exc)
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            status = _status(exc)
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
        if isinstance(exc, ConnectionError | HTTPClientError | IncompleteReadError):
            return BackendUnavailable(f"{what}: endpoint unreachable or connection lost ({cause})")
        return super()._translate(exc, what)


def _status(exc: ClientError) -> int:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


def _make_client(uri: DatasetURI, options: Mapping[str, str]) -> S3Client:
    """A thread-safe client for the options, validated; no request is made yet."""
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
    try:
        session = boto3.session.Session(
            aws_access_key_id=options.get("access_key_id"),
            aws_secret_access_key=options.get("secret_access_key"),
            aws_session_token=options.get("session_token"),
            region_name=options.get("region"),
            profile_name=options.get("profile"),
        )
    except ProfileNotFound:
        raise InvalidBackendOption(f"{uri}: option 'profile': no such AWS profile") from None
    # An unreachable endpoint must fail in seconds; the caller's retry wrapper decides about retrying.
    config = Config(
        connect_timeout=3,
        read_timeout=30,
        retries={"mode": "standard", "total_max_attempts": 2},
        max_pool_connections=32,
        s3={"addressing_style": "path" if path_style else "auto"},
        # Our requests are built here, never from user input; botocore re-validating each one costs ~20 % of
        # the FUSE client's CPU per small-file miss (bench/epoch_read.py).
        parameter_validation=False,
    )
    return session.client("s3", endpoint_url=endpoint_url, config=config)
