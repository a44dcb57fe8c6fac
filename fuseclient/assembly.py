"""Assembling what a mount serves: its configuration, its cache directory (locked to one daemon), its datasets
(listed, their caches opened) and its jobs (throttled, tracked). The node agent builds the same state live."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import trio

from fuseclient import cache_disk
from fuseclient.access import AccessTracker
from fuseclient.backend_calls import BackendCalls
from fuseclient.cache import DatasetCache, NoCache
from fuseclient.mounted import MountedDataset, MountedJob, MountState
from fuseclient.read_buffers import DEFAULT_READ_BUFFER_BYTES
from fuseclient.readahead import DEFAULT_READ_AHEAD
from fuseclient.throttle import TokenBucket, default_burst
from fuseclient.tree import DatasetTree
from silodlib.backends import Backend, BackendError, RetryingBackend, open_backend
from silodlib.directories import failure_text, make_directory, ownership_advice
from silodlib.logfields import log_ids
from silodlib.manifest import DEFAULT_CHUNK_SIZE, EmptyListing, Manifest, ManifestError, freeze_listing
from silodlib.privacy import PRIVATE_DIRECTORY, PRIVATE_FILE, make_private

log = logging.getLogger(__name__)

FETCH_CONCURRENCY = 16  # backend reads in flight per dataset
LOCK_FILE = "silod.lock"


@dataclass(frozen=True)
class MountConfig:
    """A standalone mount: jobs and allocations given up front (the node agent feeds the same state live)."""

    mountpoint: Path
    cache_dir: Path
    jobs: Mapping[str, str]  # job id -> canonical dataset URI
    cache_sizes: Mapping[str, int] = field(default_factory=dict)  # dataset URI -> quota bytes (default 0)
    io_rates: Mapping[str, int] = field(default_factory=dict)  # job id -> bytes/s (default: unthrottled)
    backend_options: Mapping[str, str] = field(default_factory=dict)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    allow_other: bool = False
    read_ahead: int = DEFAULT_READ_AHEAD
    read_buffer: int = DEFAULT_READ_BUFFER_BYTES  # the node's budget for open files' bytes (`ReadBuffers`)
    stats_interval: float | None = None
    metrics_port: int | None = None


class MountError(RuntimeError):
    """The mount cannot start as configured: a dataset cannot be listed (unreachable, denied, missing), its listing
    cannot be served (no file in it, or keys a POSIX tree cannot show, as the data manager refuses them), or its
    cache cannot be opened (a full or failing cache disk)."""


class CacheDirInUse(Exception):
    """Another live silod mount or node agent holds the cache directory."""


def lock_cache_dir(cache_dir: Path) -> int:
    """Take `cache_dir` for this process: an exclusive lock on CACHE_DIR/silod.lock, held as long as the
    returned descriptor is open in this process or a child it forks (the detached daemon).

    Two daemons on one cache directory would each count, admit, evict and restore entries behind the other's
    back (and one's startup would delete the other's admissions in progress as leftovers). The kernel drops
    the lock when its holder dies, kill -9 included, so a crash never leaves the directory claimed.
    """
    fd = os.open(cache_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CacheDirInUse(
            f"--cache-dir {cache_dir} is in use by another running silod mount or node; give each its own"
        ) from None
    return fd


def cache_dir_refusal(cache_dir: Path, exc: OSError) -> str:
    """Why `cache_dir` cannot be used, `exc` being what making, locking or making private it or a file in it raised:
    the file (when not the cache dir itself) and the reason, and for a permission refused, what to do. A cache dir or
    lock file an earlier daemon run as another user (root) left is the usual cause."""
    said = failure_text(exc, named=cache_dir)
    if exc.errno in (errno.EACCES, errno.EPERM):
        said += f"; {ownership_advice(cache_dir, 'the cache dir', 'silod', 'silod')}"
    return f"cannot use --cache-dir {cache_dir}: {said}"


def make_cache_dir_private(cache_dir: Path, node_id: str | None = None) -> None:
    """Make `cache_dir` (if missing) and its lock file private to this user (`privacy`), logging what had to be made
    so (a field `node_id` for a node agent's); `MountError` if it cannot be. Called in the daemon, so that a detached
    one logs this to its log file.

    The cache dir is the daemon's by contract (docs/fuseclient.md): one `silod` made with the umask's 0755 (as an
    earlier silod did, and an operator's `mkdir` does) is made 0700. A shared directory given as the cache dir (the
    sticky bit, as /tmp has) is nobody's own and keeps its mode: the datasets' directories in it are private."""
    lock_file = cache_dir / LOCK_FILE
    ids = log_ids(node_id=node_id)
    try:
        make_directory(cache_dir, PRIVATE_DIRECTORY)
        mode = os.stat(cache_dir).st_mode
        shared = bool(mode & stat.S_ISVTX)
        was = {cache_dir: None if shared else make_private(cache_dir, mode)}
        with contextlib.suppress(FileNotFoundError):  # made by `lock_cache_dir`, which a caller may not have taken
            was[lock_file] = make_private(lock_file, os.stat(lock_file).st_mode)
    except OSError as exc:
        raise MountError(cache_dir_refusal(cache_dir, exc)) from None
    loose = ", ".join(f"{path} (was {bits:04o})" for path, bits in was.items() if bits is not None)
    if loose:
        log.info("made private to this user (0700 for directories, 0600 for files): %s", loose, extra=ids)
    if shared:
        log.info("cache dir %s is shared (its sticky bit is set): its mode is left as it is", cache_dir, extra=ids)


def dataset_cache_dir(cache_dir: Path, uri: str) -> Path:
    """Each dataset's cache lives in its own directory, named by a hash of its URI."""
    return cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:_DIRECTORY_NAME_LENGTH]


_DIRECTORY_NAME_LENGTH = 24


def unserved_cache_dirs(cache_dir: Path, uris: Iterable[str]) -> list[str]:
    """The directories in `cache_dir` that hold no cache of a dataset in `uris`: the caches of datasets dropped while
    no agent ran (a node agent deletes a cache when its dataset goes, but a dataset can go while the agent is down),
    and removals an agent did not finish (`cache_disk.remove_directory`). Only directories of this user with those
    names, so that nothing else kept there (the lock file, an operator's own files) is ever taken."""
    served = {dataset_cache_dir(cache_dir, uri).name for uri in uris}
    found = []
    with os.scandir(cache_dir) as entries:
        for entry in entries:
            name = cache_disk.removed_directory_of(entry.name) or entry.name
            if name == entry.name and name in served:
                continue
            if not (len(name) == _DIRECTORY_NAME_LENGTH and all(c in "0123456789abcdef" for c in name)):
                continue
            try:
                if _is_own_directory(entry.stat(follow_symlinks=False)):
                    found.append(entry.path)
            except FileNotFoundError:  # deleted since it was listed (a deletion thread's, another user's): gone
                continue
    return sorted(found)


def _is_own_directory(found: os.stat_result) -> bool:
    """Whether what `lstat` `found` is a directory of this user: what the node agent takes from its cache dir to
    delete, leaving anything else at a cache's name (a file, a link, another user's directory) as it is."""
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid()


def set_aside_unserved_caches(cache_dir: Path, uris: Iterable[str], failed: Callable[[OSError], None]) -> list[str]:
    """`unserved_cache_dirs`, each cache directory renamed aside first (`cache_disk.set_aside`), so that deleting it
    in the background takes nothing of a cache opened at its name meanwhile (the dataset sent again): the
    directories to delete. One that cannot be renamed is told to `failed` and left, never deleted in place."""
    taken = []
    for path in unserved_cache_dirs(cache_dir, uris):
        if cache_disk.removed_directory_of(os.path.basename(path)) is not None:
            taken.append(path)
        elif (aside := _set_aside(Path(path), failed)) is not None:
            taken.append(aside)
    return taken


def set_aside_cache_dir(cache_dir: Path, uri: str, failed: Callable[[OSError], None]) -> str | None:
    """The cache directory of dataset `uri`, renamed aside to be deleted as `set_aside_unserved_caches` renames those
    of the datasets no longer served: the new path, or None if there is no directory of this user at its name (one
    that cannot be looked at or renamed is told to `failed` and left). For a dataset served uncached (`NoCache`): no
    cache opened there to delete its directory as it goes (`DatasetCache.remove`), yet the directory may be there,
    made by the opening before the disk refused its cache.json, or left by an earlier run with its items."""
    directory = dataset_cache_dir(cache_dir, uri)
    try:
        found = os.lstat(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        failed(exc)
        return None
    return _set_aside(directory, failed) if _is_own_directory(found) else None


def _set_aside(directory: Path, failed: Callable[[OSError], None]) -> str | None:
    """`cache_disk.set_aside`, telling `failed` why a directory cannot be renamed: the new path, or None if the
    directory is gone or stays where it is."""
    try:
        aside = cache_disk.set_aside(directory)
    except OSError as exc:
        failed(exc)
        return None
    return None if aside is None else str(aside)


async def open_cache(cache_root: Path, uri: str, manifest: Manifest, quota: int) -> DatasetCache:
    """The dataset's cache, opened in a worker thread (restoring complete entries from an earlier run); OSError if
    its directory cannot be opened."""
    directory = dataset_cache_dir(cache_root, uri)
    return await trio.to_thread.run_sync(lambda: DatasetCache(directory, manifest, quota, dataset_uri=uri))


def uncached_dataset(
    uri: str, backend: Backend, manifest: Manifest, quota: int, options: Mapping[str, str], *, calls: BackendCalls
) -> MountedDataset:
    """A dataset served from its backend alone, while its cache directory cannot be opened (`NoCache`); its fetches
    run through `calls`, the mount's."""
    return _mounted(uri, manifest, backend, NoCache(manifest, quota), options, calls)


def _mounted(
    uri: str,
    manifest: Manifest,
    backend: Backend,
    cache: DatasetCache | NoCache,
    options: Mapping[str, str],
    calls: BackendCalls,
) -> MountedDataset:
    limiter = trio.CapacityLimiter(FETCH_CONCURRENCY)
    return MountedDataset(uri, manifest, DatasetTree(manifest), backend, cache, limiter, calls, dict(options))


async def open_dataset(
    cache_root: Path,
    uri: str,
    backend: Backend,
    manifest: Manifest,
    quota: int,
    options: Mapping[str, str],
    *,
    calls: BackendCalls,
) -> MountedDataset:
    """A dataset ready to serve, read through `backend`, opened with `options`: its cache opened (restoring complete
    entries from an earlier run). Its fetches run through `calls`, the mount's (`MountState.backend_calls`)."""
    cache = await open_cache(cache_root, uri, manifest, quota)
    log.info(
        "dataset %s: %d files, %d items, %d bytes; cache quota %d bytes, %d items already cached",
        uri,
        manifest.file_count,
        manifest.item_count,
        manifest.size_bytes,
        quota,
        cache.statistics().cached_items,
        extra=log_ids(dataset_uri=uri),
    )
    return _mounted(uri, manifest, backend, cache, options, calls)


def add_job(
    mount: MountState, job_id: str, dataset: MountedDataset, rate: int | None, share: float = 1.0
) -> MountedJob:
    """Add a job reading `dataset`, throttled at `rate` bytes/s (None: unthrottled), that reads `share` of the
    items each pass here (its workers on this node over all of its workers; `AccessTracker`)."""
    bucket = None if rate is None else TokenBucket(rate, default_burst(rate, dataset.manifest.largest_item))
    tracker = AccessTracker(dataset.manifest.item_count, share)
    job = MountedJob(job_id, mount.next_slot(), dataset, bucket, tracker)
    mount.add_job(job)
    return job


async def build_state(config: MountConfig) -> MountState:
    """The standalone mount's state: each dataset listed once, jobs with their fixed allocations. Raises
    `MountError` for a dataset that cannot be listed, whose listing the data manager would refuse to register
    (`freeze_listing`), or whose cache cannot be opened, and for a cache dir it cannot make private
    (`make_cache_dir_private`)."""
    make_cache_dir_private(config.cache_dir)
    mount = MountState(config.read_buffer)
    for uri in sorted(set(config.jobs.values())):
        backend = RetryingBackend(open_backend(uri, config.backend_options))
        log.info("listing %s", uri, extra=log_ids(dataset_uri=uri))
        try:
            manifest = await trio.to_thread.run_sync(freeze_listing, uri, backend.list(), config.chunk_size)
        except BackendError as exc:
            raise MountError(f"cannot list the dataset: {exc}") from None
        except EmptyListing as exc:  # its message starts with the URI
            raise MountError(f"cannot serve the dataset: {exc}") from None
        except ManifestError as exc:
            raise MountError(f"cannot serve the dataset: {uri}: {exc}") from None
        quota = config.cache_sizes.get(uri, 0)
        try:
            dataset = await open_dataset(
                config.cache_dir, uri, backend, manifest, quota, config.backend_options, calls=mount.backend_calls
            )
            mount.add_dataset(dataset)
        except OSError as exc:
            where = dataset_cache_dir(config.cache_dir, uri)
            raise MountError(f"cannot open the cache of dataset {uri} in {where}: {exc.strerror or exc}") from None
    for job_id, uri in config.jobs.items():
        add_job(mount, job_id, mount.datasets[uri], config.io_rates.get(job_id))
    return mount
