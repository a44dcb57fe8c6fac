"""The datasets a node agent serves, as the data manager sets them: opened with their backend options, cached,
their backends swapped when the options are rotated, and tried again while they would not open.

A dataset whose options open no backend on this node (a profile its host lacks, an option its silod refuses, a
directory it cannot reach) is kept as the data manager last sent it (`Unopened`) and tried again at every usage
report; one whose rotated options open none reads on with its previous backend (`StaleOptions`), tried again the
same way. Each is in the usage reports with why (`usage`), and each failure is logged once per cause. A dataset
whose cache directory cannot be opened is served uncached and its cache tried again (`reopen_caches`).

Everything here runs on the mount's trio loop, which alone changes the mount state; the agent serializes a
revision being applied with the tries and the caches' reopening (its lock), so that two caches never open one
dataset's directory (a reopen's restore, scanning the directory with the old manifest while a revision opened the
dataset anew, deleted the new cache's items).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import trio

from fuseclient import cache_disk
from fuseclient.assembly import (
    open_cache,
    open_dataset,
    set_aside_cache_dir,
    set_aside_unserved_caches,
    uncached_dataset,
)
from fuseclient.cache import NoCache
from fuseclient.mounted import MountedDataset, MountState
from silodlib.backends import Backend, BackendError, RetryingBackend, open_backend, option_changes
from silodlib.logfields import log_ids
from silodlib.manifest import Manifest
from silodlib.scrub import scrub
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)


class Unopened(NamedTuple):
    """A dataset this node could not open: as the data manager last sent it, its manifest, and why (one scrubbed
    line)."""

    wanted: pb.NodeDataset
    manifest: Manifest
    reason: str


class StaleOptions(NamedTuple):
    """A dataset read with its previous backend: the options last set open none here. Which options changed
    (`option_changes`: names, never values), and why they open none (one scrubbed line)."""

    changes: str
    reason: str


class NodeDatasets:
    """The datasets of a node's mount (`MountState.datasets`), and those it could not open. `opened(uri)` is called
    once a dataset opens, for the jobs that wait for it."""

    def __init__(
        self,
        mount: MountState,
        cache_dir: Path,
        node_id: str,
        retry_interval: float,
        opened: Callable[[str], None],
    ) -> None:
        self._mount = mount
        self._cache_dir = cache_dir
        self._node_id = node_id
        self._retry_interval = retry_interval  # how often `retry` and `reopen_caches` are called, for the log
        self._opened = opened
        self._unopened: dict[str, Unopened] = {}
        self._stale_options: dict[str, StaleOptions] = {}
        self._reopening: set[str] = set()  # datasets whose cache a `_reopen_cache` is opening now

    def uris(self) -> set[str]:
        """The datasets this node serves or could not open: those a snapshot that leaves them out removes."""
        return set(self._mount.datasets) | set(self._unopened)

    def unopened_uris(self) -> list[str]:
        return list(self._unopened)

    def digests_in_use(self) -> set[str]:
        """The manifests of the datasets served or waiting to open."""
        used = {dataset.manifest.digest for dataset in self._mount.datasets.values()}
        used.update(entry.wanted.manifest_digest for entry in self._unopened.values())
        return used

    async def set(self, wanted: pb.NodeDataset, manifests: Mapping[str, Manifest]) -> None:
        """Serve the dataset as the data manager sets it: its quota and options changed in place when its manifest
        is the one served, else (re)opened with its manifest from `manifests` (by digest)."""
        current = self._mount.datasets.get(wanted.uri)
        options = dict(wanted.options)
        if current is not None and current.manifest.digest == wanted.manifest_digest:
            if current.options != options:
                await self._replace_backend(current, options)
            await self._set_quota(current, wanted.cache_quota_bytes)
            return
        if current is not None:
            await self.remove(wanted.uri)
        await self._open(wanted, manifests[wanted.manifest_digest])

    async def _open(self, wanted: pb.NodeDataset, manifest: Manifest) -> None:
        options = dict(wanted.options)
        unopened = self._unopened.get(wanted.uri)
        backend = await self._open_backend(
            wanted.uri, options, f"cannot serve dataset {wanted.uri}", "" if unopened is None else unopened.reason
        )
        if isinstance(backend, str):
            self._unopened[wanted.uri] = Unopened(wanted, manifest, backend)
            return
        calls = self._mount.backend_calls
        try:
            dataset = await open_dataset(
                self._cache_dir, wanted.uri, backend, manifest, wanted.cache_quota_bytes, options, calls=calls
            )
        except OSError as exc:
            log.error(
                "cannot open the cache of dataset %s (%s): serving it from its backend, uncached, and trying to open "
                "the cache again every %g s",
                wanted.uri,
                exc,
                self._retry_interval,
                extra=self._ids(wanted.uri),
            )
            dataset = uncached_dataset(wanted.uri, backend, manifest, wanted.cache_quota_bytes, options, calls=calls)
        self._mount.add_dataset(dataset)
        self._unopened.pop(wanted.uri, None)  # only now: a report meanwhile must still say it is not open
        self._opened(wanted.uri)

    async def retry_unopened(self, uri: str) -> None:
        """Try again to open a dataset this node could not, as the data manager last sent it: what kept it shut may
        be on the node (a profile added to its host's AWS config, a share mounted since), and the data manager sends
        it again only when it changes. Quietly while the reason stays the same. Nothing if it opened or went since."""
        entry = self._unopened.get(uri)
        if entry is not None:
            await self._open(entry.wanted, entry.manifest)

    async def retry_stale_options(self) -> None:
        """Try again the options last set of the datasets read with their previous ones (`retry_unopened`)."""
        for uri, stale in list(self._stale_options.items()):
            dataset = self._mount.datasets.get(uri)
            if dataset is not None:
                await self._swap_backend(dataset, stale.changes)

    async def remove(self, uri: str) -> None:
        """Free the disk a dataset no job here reads any more: its cache, with its directory (that of one served
        uncached too). Files still open keep reading through its backend, which is released with the last of them.
        One this node could not open is no longer reported."""
        self._unopened.pop(uri, None)
        self._stale_options.pop(uri, None)
        dataset = self._mount.remove_dataset(uri)
        if dataset is None:
            return
        if isinstance(dataset.cache, NoCache):
            await self._delete_uncached_cache_dir(uri)
            return
        dropped = await trio.to_thread.run_sync(dataset.cache.remove)
        log.info(
            "dataset %s is no longer served here: its cache of %d items is being deleted, with its directory",
            uri,
            dropped,
            extra=self._ids(uri),
        )

    async def _delete_uncached_cache_dir(self, uri: str) -> None:
        """Delete, in the background, the cache directory of a dataset that was served uncached, if it has one
        (`set_aside_cache_dir`): as a cached dataset's goes with it, rather than at the sweep after the next snapshot
        (`delete_unserved_caches`), which may be days away."""
        ids = self._ids(uri)
        failed = _warning_once_per_errno(ids)
        aside = await trio.to_thread.run_sync(set_aside_cache_dir, self._cache_dir, uri, failed)
        if aside is None:
            log.info("dataset %s is no longer served here (it was served uncached)", uri, extra=ids)
            return
        log.info(
            "dataset %s is no longer served here (it was served uncached): its cache directory is being deleted",
            uri,
            extra=ids,
        )
        _delete_in_background([aside], failed, f"dataset {uri}: done deleting its cache directory", ids)

    async def delete_unserved_caches(self) -> None:
        """Delete, in the background, the cache directories of the datasets this node no longer serves
        (`set_aside_unserved_caches`): called after a snapshot, which sets every dataset the node serves, so that a
        dataset dropped while the agent was down does not keep its cache's disk space for good."""
        ids = log_ids(node_id=self._node_id)
        failed = _warning_once_per_errno(ids)
        stale = await trio.to_thread.run_sync(set_aside_unserved_caches, self._cache_dir, self.uris(), failed)
        if not stale:
            return
        log.info(
            "deleting %d directories in the cache dir %s that no dataset served here uses: caches of datasets dropped "
            "while this agent was down, or deletions it did not finish",
            len(stale),
            self._cache_dir,
            extra=ids,
        )
        _delete_in_background(
            stale, failed, f"done deleting {len(stale)} unused cache directories in {self._cache_dir}", ids
        )

    def usage(self) -> list[pb.DatasetUsage]:
        """Each dataset's part of a usage report: what it caches, or why it does not open or reads with its previous
        options (`DatasetUsage.open_error`, `options_error`)."""
        reports = []
        for uri, dataset in self._mount.datasets.items():
            cache = dataset.cache.statistics()
            stale = self._stale_options.get(uri)
            reports.append(
                pb.DatasetUsage(
                    dataset_uri=uri,
                    cached_bytes=cache.used_bytes,
                    cached_items=cache.cached_items,
                    options_error="" if stale is None else stale.reason,
                )
            )
        reports += [pb.DatasetUsage(dataset_uri=uri, open_error=u.reason) for uri, u in self._unopened.items()]
        return reports

    async def reopen_caches(self) -> None:
        """Try again to open the caches of the datasets served uncached. A method of its own so that the reporting
        loop keeps no dataset alive while it sleeps (its loop variable kept the last one, with its backend and
        cache, long after its last job had left)."""
        for dataset in list(self._mount.datasets.values()):
            if isinstance(dataset.cache, NoCache):
                await self._reopen_cache(dataset)

    async def _set_quota(self, dataset: MountedDataset, quota: int) -> None:
        if isinstance(dataset.cache, NoCache):
            dataset.cache.set_quota(quota)
            await self._reopen_cache(dataset)
        elif dataset.cache.quota_bytes != quota:  # the cache logs nothing of it: this is the change's one line
            evicted = await trio.to_thread.run_sync(dataset.cache.set_quota, quota)
            log.info(
                "cache quota of %s = %d bytes (%d items evicted)",
                dataset.uri,
                quota,
                evicted,
                extra=self._ids(dataset.uri),
            )

    async def _replace_backend(self, dataset: MountedDataset, options: dict[str, str]) -> None:
        """Read `dataset` with the options the data manager replaced its old ones with (rotated credentials), from
        now on. Its cache, its jobs' access tracking and their open files stay: they hold the dataset, whose every
        fetch takes its backend as it starts. Reads under way end on the old backend, which is released with the
        last of them, as a removed dataset's is. Options this node cannot open a backend with (one its silod does
        not know, a profile its host lacks) leave the old backend reading, with one error line, reported and tried
        again at each report (`StaleOptions`) until they open or the data manager changes them again."""
        changes = option_changes(dataset.options, options)
        dataset.options = options
        self._stale_options.pop(dataset.uri, None)  # other options: their failure is logged anew
        await self._swap_backend(dataset, changes)

    async def _swap_backend(self, dataset: MountedDataset, changes: str) -> None:
        """Open a backend with the dataset's options (`changes` from its previous ones) and read through it from now
        on; or, where they open none, keep the one it has, logging why unless the last try logged the same."""
        stale = self._stale_options.get(dataset.uri)
        failure = f"dataset {dataset.uri} reads on with its old options, not the new ones ({changes})"
        backend = await self._open_backend(dataset.uri, dataset.options, failure, "" if stale is None else stale.reason)
        if isinstance(backend, str):
            self._stale_options[dataset.uri] = StaleOptions(changes, backend)
            return
        self._stale_options.pop(dataset.uri, None)
        dataset.backend = backend
        log.info(
            "dataset %s: reading with its new options (%s) from now on, its cache kept",
            dataset.uri,
            changes,
            extra=self._ids(dataset.uri),
        )

    async def _open_backend(self, uri: str, options: Mapping[str, str], failure: str, logged: str) -> Backend | str:
        """The dataset's backend, retrying transient failures; or, where the options open none (an option this silod
        does not know, a bad value, a profile this host lacks, a directory it cannot reach), the reason, logged
        after `failure` unless it is `logged`, the reason an earlier try logged: the data manager sends an unopened
        dataset again at each change of its quota and at each reconnect, and one ERROR per cause is what an operator
        needs. The reason is one line, scrubbed as the log line is (`silodlib.scrub`), since the usage reports carry
        it to the data manager, past this process's log handler. Opened in a worker thread: making an SDK's client
        reads the host's profiles and may run a profile's `credential_process` or ask the instance metadata service,
        and the mount's loop, which every file system request waits on, must not wait on those. Left to itself when
        the agent stops: a credential process may wait for good (an SSO login for a browser that never comes)."""
        try:
            return RetryingBackend(await trio.to_thread.run_sync(open_backend, uri, options, abandon_on_cancel=True))
        except (BackendError, ValueError) as exc:
            reason = " ".join(scrub(str(exc)).splitlines())
            level = logging.DEBUG if reason == logged else logging.ERROR
            log.log(level, "%s: %s", failure, reason, extra=self._ids(uri))
            return reason

    async def _reopen_cache(self, dataset: MountedDataset) -> None:
        """Give a dataset served uncached (`NoCache`) its cache once its directory opens; quietly try again later
        if it still cannot be opened (its first failure was logged). One try at a time per dataset, until the cache
        is in place: the report loop and a change of the dataset may both ask, and two caches must never open one
        directory."""
        if dataset.uri in self._reopening:
            return
        self._reopening.add(dataset.uri)
        evicted = 0
        try:
            cache = await open_cache(self._cache_dir, dataset.uri, dataset.manifest, dataset.cache.quota_bytes)
            if self._mount.datasets.get(dataset.uri) is not dataset:  # removed or replaced while the cache opened
                cache.close()
                return
            if cache.quota_bytes != dataset.cache.quota_bytes:  # the quota changed while the cache opened
                evicted = await trio.to_thread.run_sync(cache.set_quota, dataset.cache.quota_bytes)
                if self._mount.datasets.get(dataset.uri) is not dataset:  # and the dataset went meanwhile
                    cache.close()
                    return
            dataset.cache = cache
        except OSError:
            return
        finally:
            self._reopening.discard(dataset.uri)
        log.info(
            "cache of dataset %s opened: caching it again (quota %d bytes%s)",
            dataset.uri,
            cache.quota_bytes,
            f", {evicted} items evicted to fit it" if evicted else "",
            extra=self._ids(dataset.uri),
        )

    def _ids(self, uri: str) -> dict[str, str]:
        return log_ids(dataset_uri=uri, node_id=self._node_id)


def _delete_in_background(
    directories: list[str], failed: Callable[[OSError], None], done: str, ids: Mapping[str, str]
) -> None:
    """Delete cache directories renamed aside (`cache_disk.set_aside`) in a thread of their own, which tells `failed`
    what it cannot delete and logs `done`, so that no revision waits for them: a cache of a million items takes
    minutes to delete."""
    delete = functools.partial(cache_disk.delete_entry, failed=failed)
    cache_disk.delete_in_background([(path, True) for path in directories], delete, done, ids)


def _warning_once_per_errno(ids: Mapping[str, str]) -> Callable[[OSError], None]:
    """What tells of an unused cache directory that cannot be renamed aside, or of a file of one that cannot be
    deleted: a WARNING for the first of each errno (a directory an operator made read-only fails for every file in
    it), called from one thread at a time (the sweep's, then the deleting one's)."""
    warned: set[int] = set()

    def failed(exc: OSError) -> None:
        if exc.errno not in warned:
            warned.add(exc.errno or 0)
            log.warning("cannot delete an unused cache directory: %s", exc, extra=ids)

    return failed
