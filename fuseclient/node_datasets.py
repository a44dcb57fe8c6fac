"""The datasets a node agent serves, as the data manager sets them: opened with their backend options, cached,
their backends swapped when the options are rotated, and tried again while they would not open.

Backends open in the background (`run_opens`), each in a worker thread of its own: making an SDK's client may run a
profile's `credential_process` or ask a metadata or token endpoint, which may never answer (a process waiting for an
SSO login). A revision only starts the open, so that one which hangs holds nothing but its own dataset and its thread:
later revisions, the usage reports and the other datasets' opens go on, however many opens hang. Until it ends the
dataset counts as not open (`Unopened`, with no reason yet) or, for rotated options, as read with its previous
backend; past `SLOW_OPEN` the agent says so once, in a WARNING and in the dataset's usage report, naming what the open
waits for (`open_waits_for`). An open that ends applies to the dataset as the data manager sends it then: one dropped
or given other options meanwhile discards it (`_Open`).

A dataset whose options open no backend on this node (a profile its host lacks, an option its silod refuses, a
directory it cannot reach) is kept as the data manager last sent it (`Unopened`) and tried again at every usage
report; one whose rotated options open none reads on with its previous backend (`StaleOptions`), tried again the
same way. Each is in the usage reports with why (`usage`), and each failure is logged once per cause. A dataset
whose cache directory cannot be opened is served uncached and its cache tried again (`reopen_caches`).

Everything here runs on the mount's trio loop, which alone changes the mount state. The agent's lock (`changing`)
serializes a revision being applied with the tries, the caches' reopening and the ends of the background opens. Two
caches must never open one dataset's directory at once (a reopen's restore, scanning the directory with the old
manifest while a revision opened the dataset anew, deleted the new cache's items), and nothing may rename it aside
while one opens there: a cache opens only while its dataset's directory is claimed (`_claims`). A dataset's first
open restores its cache outside the lock, so that a large cache's restore (a scan of its directory, an eviction if
the quota shrank) holds neither the other datasets' opens nor the revisions; it then serves the dataset as the data
manager sends it by then, or, dropped meanwhile, deletes the cache it restored (`remove` leaves that to it).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

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
from silodlib.backends import Backend, BackendError, RetryingBackend, open_backend, open_waits_for, option_changes
from silodlib.logfields import log_ids
from silodlib.manifest import Manifest
from silodlib.scrub import scrub
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Seconds a backend's open may take before the agent says, once, that it is stuck, and on what (a WARNING and the
# dataset's usage report). A healthy open takes a second or two: making the client reads the host's profiles, and
# finding credentials runs a `credential_process` or asks a service once (botocore asks the instance metadata service
# with a 1 s timeout, a container's credential endpoint with 2 s and 3 tries; a role is assumed in one STS call). 30 s
# is many times that, so the warning means that something waits for what may never come (a credential process
# waiting for a login in a browser, an endpoint that never answers) and not a busy host; and it comes within a minute,
# at the first usage report after it (every 5 s by default), for an operator looking at a job that does not start.
SLOW_OPEN = 30.0


class Unopened(NamedTuple):
    """A dataset this node does not serve yet: as the data manager last sent it, its manifest, and why it could not
    open it (one scrubbed line; "" while its first open is under way)."""

    wanted: pb.NodeDataset
    manifest: Manifest
    reason: str


class StaleOptions(NamedTuple):
    """A dataset read with its previous backend: the options last set open none here. Which options changed
    (`option_changes`: names, never values), and why they open none (one scrubbed line)."""

    changes: str
    reason: str


@dataclass(eq=False)
class _Open:
    """A backend open under way in the background: of a dataset not served yet (`changes` None), or of the options
    last set of one served (`changes`: which options changed, `option_changes`). It is the dataset's open while
    `NodeDatasets._opens` holds it; another replaces it there when the dataset's options change, and it is dropped
    from there with the dataset, so that its result, when it comes, is discarded."""

    uri: str
    options: dict[str, str]
    changes: str | None
    logged: str  # the reason an earlier try logged: the same one is not logged again
    started: float  # trio's clock
    waits_for: str | None = None  # what it may wait for (`open_waits_for`, "": nothing known), once looked up
    stuck: str = ""  # past SLOW_OPEN: what the usage report says of it (one scrubbed line)
    dropped: bool = False  # its dataset was dropped meanwhile (`remove`): a cache it opens is deleted


class NodeDatasets:
    """The datasets of a node's mount (`MountState.datasets`), and those it does not serve yet: being opened, or that
    it could not open. `opened(uri)` is called once a dataset opens, for the jobs that wait for it; `failed(uri)` once
    its first open fails, for the jobs that waited for that one. Backends open only while `run_opens` runs."""

    def __init__(
        self,
        mount: MountState,
        cache_dir: Path,
        node_id: str,
        retry_interval: float,
        opened: Callable[[str], None],
        *,
        failed: Callable[[str], None] = lambda uri: None,
        changing: trio.Lock | None = None,
    ) -> None:
        self._mount = mount
        self._cache_dir = cache_dir
        self._node_id = node_id
        self._retry_interval = retry_interval  # how often `retry` and `reopen_caches` are called, for the log
        self._opened = opened
        self._failed = failed
        self._changing = trio.Lock() if changing is None else changing  # the agent's: see the module's docstring
        self._unopened: dict[str, Unopened] = {}
        self._stale_options: dict[str, StaleOptions] = {}
        self._opens: dict[str, _Open] = {}  # each dataset's open under way, if any
        self._to_open, self._opens_to_run = trio.open_memory_channel[_Open](math.inf)
        self._threads_held = 0  # opens' threads that have not returned: of opens under way, discarded or abandoned
        # The datasets whose cache directory a cache is opening on now (a first open's restore, `_reopen_cache`): no
        # other cache opens there, and nothing renames it aside, until the event is set.
        self._claims: dict[str, trio.Event] = {}

    def uris(self) -> set[str]:
        """The datasets this node serves, is opening or could not open: those a snapshot that leaves them out
        removes."""
        return set(self._mount.datasets) | set(self._unopened)

    def opening(self, uri: str) -> bool:
        """Whether the dataset is not served yet and no open of it has failed: its first open is under way."""
        entry = self._unopened.get(uri)
        return entry is not None and not entry.reason

    def digests_in_use(self) -> set[str]:
        """The manifests of the datasets served or waiting to open."""
        used = {dataset.manifest.digest for dataset in self._mount.datasets.values()}
        used.update(entry.wanted.manifest_digest for entry in self._unopened.values())
        return used

    async def set(self, wanted: pb.NodeDataset, manifests: Mapping[str, Manifest]) -> None:
        """Serve the dataset as the data manager sets it: its quota and options changed in place when its manifest
        is the one served, else (re)opened with its manifest from `manifests` (by digest). Backends open in the
        background: this waits for none."""
        current = self._mount.datasets.get(wanted.uri)
        options = dict(wanted.options)
        if current is not None and current.manifest.digest == wanted.manifest_digest:
            if current.options != options:
                self._replace_backend(current, options)
            await self._set_quota(current, wanted.cache_quota_bytes)
            return
        if current is not None:
            await self.remove(wanted.uri)
        self._want(wanted, manifests[wanted.manifest_digest])

    def _want(self, wanted: pb.NodeDataset, manifest: Manifest) -> None:
        """Open a dataset not served, as sent now: an open of it with these options already under way serves it so
        when it ends; else another starts (tried again with the same options, a dataset that failed: the data manager
        sends it again at each change of its quota and at each reconnect)."""
        entry = self._unopened.get(wanted.uri)
        reason = "" if entry is None else entry.reason
        self._unopened[wanted.uri] = Unopened(wanted, manifest, reason)
        under_way = self._opens.get(wanted.uri)
        if under_way is None or under_way.options != dict(wanted.options):
            self._start_open(wanted.uri, dict(wanted.options), None, reason)

    def retry_unopened(self) -> None:
        """Try again to open the datasets this node could not, as the data manager last sent them: what kept one shut
        may be on the node (a profile added to its host's AWS config, a share mounted since), and the data manager
        sends it again only when it changes. Quietly while the reason stays the same; not while an open of it is
        under way."""
        for uri, entry in self._unopened.items():
            if uri not in self._opens:
                self._start_open(uri, dict(entry.wanted.options), None, entry.reason)

    def retry_stale_options(self) -> None:
        """Try again the options last set of the datasets read with their previous ones (`retry_unopened`)."""
        for uri, stale in self._stale_options.items():
            dataset = self._mount.datasets.get(uri)
            if dataset is not None and uri not in self._opens:
                self._start_open(uri, dict(dataset.options), stale.changes, stale.reason)

    async def run_opens(self) -> None:
        """Run the backend opens that `set` and the tries start, side by side, each in the background, until
        cancelled: the agent stops, and waits for none of them (their threads end by themselves)."""
        async with trio.open_nursery() as nursery:
            async for attempt in self._opens_to_run:
                nursery.start_soon(self._run_open, attempt)

    def _start_open(self, uri: str, options: dict[str, str], changes: str | None, logged: str) -> None:
        """Open the dataset's backend with `options` in the background, in place of any open of it under way."""
        attempt = _Open(uri, options, changes, logged, trio.current_time())
        self._opens[uri] = attempt
        self._to_open.send_nowait(attempt)

    async def _run_open(self, attempt: _Open) -> None:
        """Open the backend, saying once if it takes longer than SLOW_OPEN; then, under the agent's lock, apply it to
        the dataset as the data manager sends the dataset now (`_finish_open`), once no cache opens on its directory.
        A dataset's first open claims the directory there and opens the cache outside the lock (`_open_cached`),
        then, under it again, serves the dataset as sent by then (`_serve`)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tell_if_stuck, attempt)
            attempt.waits_for = await self._in_own_thread(open_waits_for, attempt.uri, attempt.options)
            result = await self._open_backend(attempt.uri, attempt.options)
            nursery.cancel_scope.cancel()
        while True:
            async with self._changing:
                claim = self._claims.get(attempt.uri)
                if claim is None:
                    entry = await self._finish_open(attempt, result)
                    break
            await claim.wait()
        if entry is None or isinstance(result, str):
            return
        try:
            while entry is not None:
                dataset = await self._open_cached(entry, result, attempt.options)
                try:
                    async with self._changing:
                        entry = await self._serve(attempt, entry, dataset)
                except BaseException:  # the agent stops: a cache not served is closed
                    if self._mount.datasets.get(attempt.uri) is not dataset:
                        dataset.cache.close()
                    raise
        finally:
            self._claims.pop(attempt.uri).set()

    async def _in_own_thread(
        self, function: Callable[[str, Mapping[str, str]], _T], uri: str, options: Mapping[str, str]
    ) -> _T:
        """`function(uri, options)` in a worker thread of its own, outside trio's default limiter and any shared one:
        a call that never returns (a credential process waiting for a login) holds that thread alone, never a slot
        that another dataset's open, or the agent's other work in threads (its usage reports, its caches' deletion,
        the stop's detach of the mount), waits for. Counted in `_threads_held` until it returns; left to itself when
        the agent stops."""
        self._threads_held += 1
        try:
            return await trio.to_thread.run_sync(
                function, uri, options, limiter=trio.CapacityLimiter(1), abandon_on_cancel=True
            )
        finally:
            self._threads_held -= 1

    async def _tell_if_stuck(self, attempt: _Open) -> None:
        """Past SLOW_OPEN, say once that the open has not returned and what it waits for: a WARNING, and the reason
        the usage reports give (`open_error`, or `options_error` for rotated options) until it ends."""
        await trio.sleep(SLOW_OPEN)
        if self._opens.get(attempt.uri) is not attempt:  # dropped or replaced: nothing waits for it any more
            return
        waits = f"waiting for {attempt.waits_for}" if attempt.waits_for else "waiting inside its storage SDK"
        subject = "its backend" if attempt.changes is None else "a backend with them"
        attempt.stuck = " ".join(scrub(f"{subject} has not opened in {SLOW_OPEN:g} s: {waits}").splitlines())
        if attempt.changes is None:
            meanwhile = "its jobs here wait for it; the node's other datasets, revisions and usage reports go on"
        else:
            meanwhile = f"it reads on with its previous options meanwhile (the new ones: {attempt.changes})"
        held = self._threads_held
        threads = f"backend opens holding a thread each on this node until they return: {held}"
        log.warning(
            "dataset %s: %s; %s (%s)", attempt.uri, attempt.stuck, meanwhile, threads, extra=self._ids(attempt.uri)
        )

    async def _finish_open(self, attempt: _Open, result: Backend | str) -> Unopened | None:
        """Apply an open that ended, a backend or why none (`_open_backend`), to the dataset as the data manager
        sends it now: read through it from now on (rotated options), or kept unopened with why; discarded if the
        dataset was dropped or given other options meanwhile, which must not be served with these. A dataset to
        serve with it is returned, its directory claimed (`_claims`) and the attempt kept as its open until its
        cache has opened (`_serve`): no other open of it starts meanwhile."""
        uri, took = attempt.uri, trio.current_time() - attempt.started
        if self._opens.get(uri) is not attempt:
            if isinstance(result, str):
                log.debug(
                    "dataset %s: an open no longer wanted failed after %.0f s: %s",
                    uri,
                    took,
                    result,
                    extra=self._ids(uri),
                )
                return None
            result.close()
            log.info(
                "dataset %s: its backend opened after %.0f s, with options the data manager has replaced or for a "
                "dataset it no longer sends here: closed unused",
                uri,
                took,
                extra=self._ids(uri),
            )
            return None
        if attempt.stuck and not isinstance(result, str):
            log.info("dataset %s: its backend opened after %.0f s", uri, took, extra=self._ids(uri))
        if attempt.changes is None and not isinstance(result, str):
            self._claims[uri] = trio.Event()
            return self._unopened[uri]
        del self._opens[uri]
        dataset = self._mount.datasets.get(uri)
        if attempt.changes is None:
            self._keep_unopened(self._unopened[uri], attempt, str(result))
        elif dataset is not None:
            self._swap_backend(dataset, attempt, result)
        return None

    def _keep_unopened(self, entry: Unopened, attempt: _Open, reason: str) -> None:
        """Keep a dataset whose backend did not open unopened, with why."""
        uri = entry.wanted.uri
        self._log_failure(f"cannot serve dataset {uri}", reason, attempt.logged, uri)
        self._unopened[uri] = entry._replace(reason=reason)
        if not entry.reason:
            self._failed(uri)

    async def _open_cached(self, entry: Unopened, backend: Backend, options: dict[str, str]) -> MountedDataset:
        """The dataset as sent in `entry`, read through `backend`, its cache opened (restoring it: a scan of its
        directory, an eviction if the quota shrank); served uncached if its directory cannot be opened. Called with
        the directory claimed (`_claims`), outside the agent's lock."""
        uri, wanted, manifest, calls = entry.wanted.uri, entry.wanted, entry.manifest, self._mount.backend_calls
        try:
            return await open_dataset(
                self._cache_dir, uri, backend, manifest, wanted.cache_quota_bytes, options, calls=calls
            )
        except OSError as exc:
            log.error(
                "cannot open the cache of dataset %s (%s): serving it from its backend, uncached, and trying to open "
                "the cache again every %g s",
                uri,
                exc,
                self._retry_interval,
                extra=self._ids(uri),
            )
            return uncached_dataset(uri, backend, manifest, wanted.cache_quota_bytes, options, calls=calls)

    async def _serve(self, attempt: _Open, entry: Unopened, dataset: MountedDataset) -> Unopened | None:
        """Serve `dataset`, opened with its cache as sent in `entry` (`_open_cached`), as the data manager sends it
        now: with its quota as set since. One dropped meanwhile has the cache deleted, with its directory, as a
        served dataset's removal does (sent again since, another open of it opens it anew); one given other options
        meanwhile has it closed, for the open with them to restore it again. One sent with another manifest meanwhile
        is returned, for its cache to open anew with it, the directory still claimed."""
        uri = attempt.uri
        now = self._unopened.get(uri)
        if now is None or attempt.dropped:  # dropped, and maybe sent again since: for another open to open anew
            dataset.backend.close()
            await self._drop_cache(dataset, f"dataset {uri} was dropped while its cache opened")
            return None
        if self._opens.get(uri) is not attempt:
            dataset.backend.close()
            dataset.cache.close()
            log.info(
                "dataset %s: its cache opened as the data manager sent it other options: closed, for the open with "
                "them",
                uri,
                extra=self._ids(uri),
            )
            return None
        if now.manifest.digest != entry.manifest.digest:
            dataset.cache.close()
            log.info(
                "dataset %s: its cache opened as the data manager sent it another manifest: opening it again with it",
                uri,
                extra=self._ids(uri),
            )
            return now
        await self._set_quota(dataset, now.wanted.cache_quota_bytes)
        self._mount.add_dataset(dataset)
        self._unopened.pop(uri, None)  # only now: a report meanwhile must still say it is not open
        del self._opens[uri]  # only now: no other open of it starts while its cache opens
        self._opened(uri)
        return None

    async def remove(self, uri: str) -> None:
        """Free the disk a dataset no job here reads any more: its cache, with its directory (that of one served
        uncached too). Files still open keep reading through its backend, which is released with the last of them.
        One not served yet (its open under way, or failed) is no longer reported, and its cache directory, which an
        earlier run may have filled, is deleted as well: an open of it under way is discarded when it ends, and opens
        no cache; one whose cache is opening (`_claims`) is left to that open, which deletes it as it ends."""
        unopened = self._unopened.pop(uri, None)
        self._stale_options.pop(uri, None)
        under_way = self._opens.pop(uri, None)
        if under_way is not None:
            under_way.dropped = True
        dataset = self._mount.remove_dataset(uri)
        if dataset is None:
            if unopened is not None and uri in self._claims:
                log.info(
                    "dataset %s is no longer wanted here: its cache, opening now, is deleted as it opens",
                    uri,
                    extra=self._ids(uri),
                )
            elif unopened is not None:
                why = "the open of its backend under way is discarded as it ends" if under_way else "it never opened"
                await self._delete_cache_dir(uri, f"dataset {uri} is no longer wanted here: {why}")
            return
        await self._drop_cache(dataset, f"dataset {uri} is no longer served here")

    async def _drop_cache(self, dataset: MountedDataset, dropped: str) -> None:
        """Delete the cache of a dataset no longer served, with its directory (that of one served uncached too),
        logging `dropped` and that."""
        if isinstance(dataset.cache, NoCache):
            await self._delete_cache_dir(dataset.uri, f"{dropped} (it was served uncached)")
            return
        deleted = await trio.to_thread.run_sync(dataset.cache.remove)
        log.info(
            "%s: its cache of %d items is being deleted, with its directory",
            dropped,
            deleted,
            extra=self._ids(dataset.uri),
        )

    async def _delete_cache_dir(self, uri: str, dropped: str) -> None:
        """Delete, in the background, the cache directory of a dataset dropped with no cache open on it (served
        uncached, or not served yet), if it has one (`set_aside_cache_dir`), logging `dropped` and that: as a cached
        dataset's goes with it, rather than at the sweep after the next snapshot (`delete_unserved_caches`), which may
        be days away while the data manager counts its space free."""
        ids = self._ids(uri)
        failed = _warning_once_per_errno(ids)
        aside = await trio.to_thread.run_sync(set_aside_cache_dir, self._cache_dir, uri, failed)
        if aside is None:
            log.info("%s", dropped, extra=ids)
            return
        log.info("%s: its cache directory is being deleted", dropped, extra=ids)
        _delete_in_background([aside], failed, f"dataset {uri}: done deleting its cache directory", ids)

    async def delete_unserved_caches(self) -> None:
        """Delete, in the background, the cache directories of the datasets this node no longer serves
        (`set_aside_unserved_caches`): called after a snapshot, which sets every dataset the node serves, so that a
        dataset dropped while the agent was down does not keep its cache's disk space for good. A directory a cache
        is opening on (`_claims`) is left to that open."""
        ids = log_ids(node_id=self._node_id)
        failed = _warning_once_per_errno(ids)
        keep = self.uris() | set(self._claims)
        stale = await trio.to_thread.run_sync(set_aside_unserved_caches, self._cache_dir, keep, failed)
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
        options (`DatasetUsage.open_error`, `options_error`): an open stuck past SLOW_OPEN, else the last try's
        failure. A dataset whose first open is under way, and not stuck yet, is left out, as older agents left out
        every dataset they did not serve."""
        reports = []
        for uri, dataset in self._mount.datasets.items():
            cache = dataset.cache.statistics()
            stale = self._stale_options.get(uri)
            reports.append(
                pb.DatasetUsage(
                    dataset_uri=uri,
                    cached_bytes=cache.used_bytes,
                    cached_items=cache.cached_items,
                    options_error=self._stuck(uri) or ("" if stale is None else stale.reason),
                )
            )
        for uri, entry in self._unopened.items():
            reason = self._stuck(uri) or entry.reason
            if reason:
                reports.append(pb.DatasetUsage(dataset_uri=uri, open_error=reason))
        return reports

    def _stuck(self, uri: str) -> str:
        """Why the dataset's open under way is reported as stuck; "" if none is, or not yet."""
        attempt = self._opens.get(uri)
        return "" if attempt is None else attempt.stuck

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

    def _replace_backend(self, dataset: MountedDataset, options: dict[str, str]) -> None:
        """Read `dataset` with the options the data manager replaced its old ones with (rotated credentials), from
        once a backend with them opens, in the background (`_swap_backend`); the old one reads meanwhile."""
        changes = option_changes(dataset.options, options)
        dataset.options = options
        self._stale_options.pop(dataset.uri, None)  # other options: their failure is logged anew
        self._start_open(dataset.uri, options, changes, "")

    def _swap_backend(self, dataset: MountedDataset, attempt: _Open, result: Backend | str) -> None:
        """Read `dataset` through the backend its options last set opened, from now on. Its cache, its jobs' access
        tracking and their open files stay: they hold the dataset, whose every fetch takes its backend as it starts.
        Reads under way end on the old backend, which is released with the last of them, as a removed dataset's is.
        Options this node cannot open a backend with (one its silod does not know, a profile its host lacks) leave
        the old backend reading, with one error line, reported and tried again at each report (`StaleOptions`) until
        they open or the data manager changes them again."""
        changes = attempt.changes or ""
        if isinstance(result, str):
            failure = f"dataset {dataset.uri} reads on with its old options, not the new ones ({changes})"
            self._log_failure(failure, result, attempt.logged, dataset.uri)
            self._stale_options[dataset.uri] = StaleOptions(changes, result)
            return
        self._stale_options.pop(dataset.uri, None)
        dataset.backend = result
        log.info(
            "dataset %s: reading with its new options (%s) from now on, its cache kept",
            dataset.uri,
            changes,
            extra=self._ids(dataset.uri),
        )

    async def _open_backend(self, uri: str, options: Mapping[str, str]) -> Backend | str:
        """The dataset's backend, retrying transient failures; or, where the options open none (an option this silod
        does not know, a bad value, a profile this host lacks, a directory it cannot reach), the reason: one line,
        scrubbed as the log line is (`silodlib.scrub`), since the usage reports carry it to the data manager, past
        this process's log handler. Opened in a worker thread: making an SDK's client reads the host's profiles and
        may run a profile's `credential_process` or ask the instance metadata service, and the mount's loop, which
        every file system request waits on, must not wait on those. Left to itself when the agent stops: a
        credential process may wait for good (an SSO login for a browser that never comes)."""
        try:
            backend = await self._in_own_thread(open_backend, uri, options)
        except (BackendError, ValueError) as exc:
            return " ".join(scrub(str(exc)).splitlines())
        return RetryingBackend(backend)

    def _log_failure(self, failure: str, reason: str, logged: str, uri: str) -> None:
        """Log why an open failed, after `failure`, unless it is `logged`, the reason an earlier try logged: the data
        manager sends an unopened dataset again at each change of its quota and at each reconnect, and the agent tries
        it at each report; one ERROR per cause is what an operator needs."""
        level = logging.DEBUG if reason == logged else logging.ERROR
        log.log(level, "%s: %s", failure, reason, extra=self._ids(uri))

    async def _reopen_cache(self, dataset: MountedDataset) -> None:
        """Give a dataset served uncached (`NoCache`) its cache once its directory opens; quietly try again later
        if it still cannot be opened (its first failure was logged). Not while another cache opens on its directory
        (`_claims`), which it claims until the cache is in place: the report loop and a change of the dataset may
        both ask, and two caches must never open one directory."""
        if dataset.uri in self._claims:
            return
        claim = self._claims[dataset.uri] = trio.Event()
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
            del self._claims[dataset.uri]
            claim.set()
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
