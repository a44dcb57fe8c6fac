"""Storage backends by URI scheme: `open_backend("s3://bucket/prefix", options)` and friends.

Options are plain strings (they come from the CLI, the data manager's database and the wire), checked
by the backend: unknown keys and bad values raise `InvalidBackendOption` naming the option. Values of a
scheme's `secret_options` must only ever be shown through `redact_options`.

A scheme's module, and with it its SDK (boto3, azure), is imported on first use, so that code which never
opens a backend (the control-plane commands, the simulator) never pays for importing the SDKs.
"""

from __future__ import annotations

from collections.abc import Mapping

from silodlib.backends.base import (
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    ChangedObject,
    InvalidBackendOption,
    NoSuchObject,
    ObjectInfo,
    shown_option_value,
)
from silodlib.backends.local import LocalBackend
from silodlib.backends.retry import RetryingBackend, RetryPolicy, call_with_retries
from silodlib.backends.uri import DatasetURI, InvalidDatasetURI, parse_dataset_uri
from silodlib.imports import import_named
from silodlib.scrub import REDACTED

__all__ = [
    "REDACTED",
    "SCHEMES",
    "AccessDenied",
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
    "backend_class",
    "call_with_retries",
    "open_backend",
    "open_waits_for",
    "option_changes",
    "parse_dataset_uri",
    "redact_options",
]

# scheme -> "module:class" of its backend, imported by `backend_class` when first needed.
SCHEMES: Mapping[str, str] = {
    "s3": "silodlib.backends.s3:S3Backend",
    "az": "silodlib.backends.azure:AzureBackend",
    "file": "silodlib.backends.local:LocalBackend",
}


def backend_class(scheme: str) -> type[Backend]:
    """The backend class of a URI scheme (one `parse_dataset_uri` accepts), importing its module."""
    found: type[Backend] = import_named(SCHEMES[scheme])
    return found


def open_backend(uri: DatasetURI | str, options: Mapping[str, str] | None = None) -> Backend:
    """The backend for `uri` (parsed if a string), configured by `options`.

    Raises `InvalidDatasetURI`, `InvalidBackendOption` (unknown key, bad value), and for file:// URIs
    `NoSuchObject` if the directory does not exist. Remote backends make no request until first used.
    """
    if isinstance(uri, str):
        uri = parse_dataset_uri(uri)
    return backend_class(uri.scheme)(uri, options or {})


def open_waits_for(uri: str, options: Mapping[str, str]) -> str:
    """What opening `uri`'s backend with `options` may wait for off this process (`Backend.open_waits_for`): a hint
    for an operator told that the open has not returned, never a secret; "" where nothing is known or the URI does not
    parse (the open says why)."""
    try:
        parsed = parse_dataset_uri(uri)
    except InvalidDatasetURI:
        return ""
    return backend_class(parsed.scheme).open_waits_for(parsed, options)


def redact_options(scheme: str, options: Mapping[str, str]) -> dict[str, str]:
    """A copy of `options` safe to log or display: values of the scheme's secret options replaced, and the others
    as `shown_option_value` shows them (a URL's password masked, control characters escaped: what a dataset
    registered by an older silod may hold)."""
    secret = backend_class(scheme).secret_options
    return {name: REDACTED if name in secret else shown_option_value(value) for name, value in options.items()}


def option_changes(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """What replacing options `before` with `after` changes, by key alone, safe to log or display whatever the
    scheme: "account_key removed, sas_token set"."""
    changes = []
    for name in sorted(before.keys() | after.keys()):
        if name not in after:
            changes.append(f"{name} removed")
        elif name not in before:
            changes.append(f"{name} set")
        elif before[name] != after[name]:
            changes.append(f"{name} replaced")
    return ", ".join(changes) or "none changed"
