"""Storage backends by URI scheme: `open_backend("s3://bucket/prefix", options)` and friends.

Options are plain strings (they come from the CLI, the data manager's database and the wire), checked
by the backend: unknown keys and bad values raise `InvalidBackendOption` naming the option. Values of a
scheme's `secret_options` must only ever be shown through `redact_options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fuseclient.backends.azure import AzureBackend
from fuseclient.backends.base import (
    REDACTED,
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    ChangedObject,
    InvalidBackendOption,
    NoSuchObject,
    ObjectInfo,
)
from fuseclient.backends.local import LocalBackend
from fuseclient.backends.retry import RetryingBackend, RetryPolicy, call_with_retries
from fuseclient.backends.s3 import S3Backend
from fuseclient.backends.uri import DatasetURI, InvalidDatasetURI, parse_dataset_uri

__all__ = [
    "BACKENDS",
    "REDACTED",
    "AccessDenied",
    "AzureBackend",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "ChangedObject",
    "DatasetURI",
    "InvalidBackendOption",
    "InvalidDatasetURI",
    "LocalBackend",
    "NoSuchObject",
    "ObjectInfo",
    "RetryPolicy",
    "RetryingBackend",
    "S3Backend",
    "call_with_retries",
    "open_backend",
    "parse_dataset_uri",
    "redact_options",
]

BACKENDS: Mapping[str, type[Backend]] = MappingProxyType(
    {cls.scheme: cls for cls in (S3Backend, AzureBackend, LocalBackend)}
)


def open_backend(uri: DatasetURI | str, options: Mapping[str, str] | None = None) -> Backend:
    """The backend for `uri` (parsed if a string), configured by `options`.

    Raises `InvalidDatasetURI`, `InvalidBackendOption` (unknown key, bad value), and for file:// URIs
    `NoSuchObject` if the directory does not exist. Remote backends make no request until first used.
    """
    if isinstance(uri, str):
        uri = parse_dataset_uri(uri)
    return BACKENDS[uri.scheme](uri, options or {})


def redact_options(scheme: str, options: Mapping[str, str]) -> dict[str, str]:
    """A copy of `options` safe to log or display: values of the scheme's secret options replaced."""
    secret = BACKENDS[scheme].secret_options
    return {name: REDACTED if name in secret else value for name, value in options.items()}
