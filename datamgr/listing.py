"""Reaching a dataset's backend from the data manager, with backend failures in our own terms: listing it once at
registration to take its manifest, and reading it with new options before they replace its old ones."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from datamgr.entities import FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from silodlib.backends import (
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    InvalidBackendOption,
    NoSuchObject,
    open_backend,
)
from silodlib.logfields import log_ids
from silodlib.manifest import EmptyListing, Manifest, ManifestError, freeze_listing

log = logging.getLogger(__name__)


def freeze_manifest(uri: str, options: Mapping[str, str], chunk_size: int) -> Manifest:
    """List `uri` once and freeze the result (`freeze_listing`, as a standalone mount does). Blocking: call it
    from a worker thread.

    A listing without a file is refused: it is nearly always a wrong bucket, prefix or path (or keys uploaded
    with a leading '/'), and a dataset with no items could never be read anyway. Keys left out of a dataset that
    is kept are logged as one WARNING with their count.
    """
    started = time.monotonic()
    with _as_data_manager_errors(uri):
        backend = open_backend(uri, options)
        try:
            manifest = freeze_listing(uri, backend.list(), chunk_size)
        finally:
            backend.close()
    log.info(
        "listed %s: %d files, %d items, %d bytes in %.1f s",
        uri,
        manifest.file_count,
        manifest.item_count,
        manifest.size_bytes,
        time.monotonic() - started,
        extra=log_ids(dataset_uri=uri),
    )
    return manifest


def try_options(uri: str, options: Mapping[str, str], manifest: Manifest) -> None:
    """Refuse `options` unless the dataset at `uri` reads with them: open its backend with them and read the first
    byte of the first file of its frozen `manifest` that has one, as every node will read it (a stat of its first
    file where every file is empty, since a read of nothing asks storage nothing). No version is asked for: this
    tries the options, not the object. Failures are refused as for a registration (`_as_data_manager_errors`).
    Blocking: call it from a worker thread."""
    with _as_data_manager_errors(uri):
        backend = open_backend(uri, options)
    try:
        with _as_data_manager_errors(uri, lead="a read with the new options failed: "):
            _read_a_little(backend, manifest)
    finally:
        backend.close()


def _read_a_little(backend: Backend, manifest: Manifest) -> None:
    first = next((index for index, size in enumerate(manifest.sizes) if size), None)
    if first is None:
        backend.stat(manifest.paths[0])
    else:
        backend.read(manifest.paths[first], 0, 1)


@contextmanager
def _as_data_manager_errors(uri: str, lead: str = "") -> Iterator[None]:
    """Backend and manifest failures as the data manager's errors, each with its status code, and its message after
    `lead`."""
    try:
        yield
    except InvalidBackendOption as exc:
        raise InvalidArgument(f"{lead}options: {exc}") from None
    except EmptyListing as exc:  # its message starts with the URI: "URI lists no objects; ..."
        raise FailedPrecondition(f"{lead}uri {exc}") from None
    except (NoSuchObject, ManifestError) as exc:
        raise FailedPrecondition(lead + _naming(uri, exc)) from None
    except AccessDenied as exc:
        raise PermissionDenied(lead + _naming(uri, exc)) from None
    except BackendUnavailable as exc:
        raise Unavailable(lead + _naming(uri, exc)) from None
    except BackendError as exc:  # any other failure of the backend (a name the file system refuses, ...)
        raise FailedPrecondition(lead + _naming(uri, exc)) from None


def _naming(uri: str, exc: Exception) -> str:
    """`uri URI: what went wrong`, with the URI once: a backend's message starts with the object it was about,
    which is the dataset's URI itself when listing it failed, and one of its objects when reading one did."""
    message = str(exc)
    return f"uri {message}" if message.startswith((f"{uri}: ", f"{uri}/")) else f"uri {uri}: {message}"
