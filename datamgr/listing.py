"""Taking a dataset's manifest from its backend at registration, with backend failures in our own terms."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from datamgr.entities import FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from silodlib.backends import (
    AccessDenied,
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


@contextmanager
def _as_data_manager_errors(uri: str) -> Iterator[None]:
    """Backend and manifest failures as the data manager's errors, each with its status code."""
    try:
        yield
    except InvalidBackendOption as exc:
        raise InvalidArgument(f"options: {exc}") from None
    except EmptyListing as exc:  # its message starts with the URI: "URI lists no objects; ..."
        raise FailedPrecondition(f"uri {exc}") from None
    except (NoSuchObject, ManifestError) as exc:
        raise FailedPrecondition(_naming(uri, exc)) from None
    except AccessDenied as exc:
        raise PermissionDenied(_naming(uri, exc)) from None
    except BackendUnavailable as exc:
        raise Unavailable(_naming(uri, exc)) from None
    except BackendError as exc:  # any other failure of the backend (a name the file system refuses, ...)
        raise FailedPrecondition(_naming(uri, exc)) from None


def _naming(uri: str, exc: Exception) -> str:
    """`uri URI: what went wrong`, with the URI once: a backend's message starts with the object it was about,
    which is the dataset's URI itself when listing it failed."""
    message = str(exc)
    return f"uri {message}" if message.startswith(f"{uri}: ") else f"uri {uri}: {message}"
