"""Serving a read of a job's file: from the local cache, or fetched from the backend under the job's throttle.

A read is split into the items it covers. A cached item is read from local disk with `pread` on the event loop
(a worker thread for reads that miss the page cache was measured slower on a fast disk: docs/benchmarks.md);
a missing one is fetched whole (uniform caching caches whole items), once however many readers want it at the
same time (single-flight: each job waits on its own throttle, and the first whose throttle grants the bytes
fetches them and is charged for them, so no job waits on another's rate), and offered to the cache, which admits
it only while the dataset is under its quota.

A fetch that fails answers, for a moment, the kernel's re-request of what it failed (`FailedFetch`): Linux asks
again for a page whose read failed, and asking storage again would double the load on a storage service that is
already failing.

A job whose remote IO rate is 0 has its reads that need the backend wait until the data manager grants it some: the
node's log says so once when they start waiting and once when they resume (`ZeroRateLog`), not once per read.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
import weakref
from dataclasses import dataclass, field

import trio

from fuseclient.backend_calls import BackendCall
from fuseclient.mounted import Flight, MountedDataset, MountedJob
from fuseclient.read_buffers import ReadBuffers
from fuseclient.throttle import ThrottleClosed
from silodlib.backends import Backend, BackendError, ChangedObject
from silodlib.logfields import log_ids

log = logging.getLogger(__name__)

# Seconds a failed fetch answers the re-requests of its item through the same open file: five times the latest the
# kernel's re-request came after the failure's reply (205 ms, 2 CPUs overloaded; 0.3 ms at the median:
# docs/fuseclient.md). Too short costs storage a request, as before; too long would fail a reader's own re-read of
# the same open without asking storage. A read through another open always asks.
RE_REQUEST_WINDOW = 1.0


@dataclass(frozen=True, slots=True)
class FailedFetch:
    """The backend's failure of an item, as a read through one open file got it, kept to answer the kernel's
    immediate re-request of that item through the same open (its read-ahead failed, then it asks for the page
    itself) without asking storage again: during an outage or a credentials expiry every failed `read(2)` would
    otherwise cost storage two requests. It answers only within `RE_REQUEST_WINDOW` of the failure and while the
    dataset reads through the backend that failed (credentials rotated with `silod dataset set-options` swap it)."""

    item: int
    error: BackendError  # a copy without traceback or cause, which would hold the failed read's frames
    backend: weakref.ref[Backend]  # weak: an open file must not keep a replaced backend and its connections
    at: float  # trio's clock

    def answers(self, item: int, backend: Backend, now: float) -> bool:
        """Whether a read of `item` through `backend` at `now` gets this failure rather than a fetch."""
        return item == self.item and self.backend() is backend and now - self.at < RE_REQUEST_WINDOW


@dataclass(slots=True)
class _Fetched:
    """An item an open file fetched from the backend, as that open knows it."""

    size: int
    held: bool = False  # its bytes went to the node's read buffers and this open has not let them go (the budget may)
    read: list[tuple[int, int]] = field(default_factory=list)  # byte ranges of it read through the open, merged

    def add_read(self, offset: int, length: int) -> bool:
        """Note that `length` bytes at `offset` were read through the open; True once all of the item has been."""
        start, stop = offset, offset + length
        merged = []
        for begin, end in self.read:
            if end < start or begin > stop:
                merged.append((begin, end))
            else:
                start, stop = min(start, begin), max(stop, end)
        merged.append((start, stop))
        self.read = sorted(merged)
        return self.read == [(0, self.size)]


class FetchedItems:
    """Items one open file fetched from the backend and may still read: the current one and the next.

    An item the cache did not admit (its quota is full) would otherwise be fetched again by each of the many kernel
    reads (128 KiB to 1 MiB each) that cover one 4 MiB chunk; holding its bytes for the open makes one missed item
    cost exactly one backend GET. The next chunk of a file read sequentially is fetched alongside the current one and
    waits here, so a reader of a large file sends its GETs two at a time, not one.

    Only bytes no other copy serves are held, and only while the open may read them: not an item the cache admitted
    (the cache serves it, from the page cache once read), and not once the open has read all of the item (the kernel
    keeps what it read in its page cache); every open's held bytes count against the node's `ReadBuffers`, which let
    the least recently read go when they must, so the memory they take no longer grows with the files held open. The
    items themselves are remembered whether held or not, to tell the reader's access to a chunk its read-ahead fetched
    (`OpenFile`) and to fetch ahead no chunk twice.
    """

    def __init__(self, buffers: ReadBuffers) -> None:
        self._buffers = buffers
        self._items: dict[int, _Fetched] = {}
        self.failed: FailedFetch | None = None  # the last fetch of this open that failed; one, so memory stays bounded

    def __contains__(self, item: int) -> bool:
        """Whether this open fetched `item` from the backend (and it is its current or next item)."""
        return item in self._items

    def read(self, item: int, offset: int, length: int) -> bytes | None:
        """`length` bytes at `offset` of `item` from the bytes held for this open, or None if none are held."""
        fetched = self._items.get(item)
        if fetched is None or not fetched.held:
            return None
        data = self._buffers.get(self, item)
        if data is None:
            return None
        if fetched.add_read(offset, length):
            self._let_go(item, fetched)
        return data[offset : offset + length]

    def keep(self, item: int, data: bytes, offset: int, length: int, *, cached: bool) -> None:
        """Keep `item`, fetched for a read of `length` bytes at `offset` of it, and the next one (fetched ahead, or
        still coming), and nothing else: a reader going backwards or jumping about must not hold every item it passed
        until it closes the file. `cached`: the cache admitted it, and its bytes are not held."""
        for other in [other for other in self._items if other not in (item, item + 1)]:
            self._let_go(other, self._items.pop(other))
        self._let_go(item, self._items.get(item))
        fetched = self._items[item] = _Fetched(len(data))
        if not cached and not fetched.add_read(offset, length):
            fetched.held = self._buffers.hold(self, item, data)

    def keep_ahead(self, item: int, data: bytes, *, cached: bool) -> None:
        """Keep `item`, fetched ahead of the reader; its bytes unless the cache admitted it."""
        self._let_go(item, self._items.get(item))
        fetched = self._items[item] = _Fetched(len(data))
        fetched.held = not cached and self._buffers.hold(self, item, data)

    def served_by_cache(self, item: int) -> None:
        """The cache served a read of `item`: let go of any bytes of it held for this open (the cache had no room for
        it when this open fetched it, and another open's fetch had it admitted since)."""
        self._let_go(item, self._items.get(item))

    def lost(self, item: int) -> bool:
        """Whether the node's read buffers let go of the bytes of `item` held for this open, which must now fetch it
        again; True once per such loss (the read that finds it refetches)."""
        fetched = self._items.get(item)
        if fetched is None or not fetched.held or (self, item) in self._buffers:
            return False
        fetched.held = False
        return True

    def release(self) -> None:
        """The open is closed: let go of every byte held for it."""
        for item, fetched in self._items.items():
            self._let_go(item, fetched)
        self._items.clear()

    def _let_go(self, item: int, fetched: _Fetched | None) -> None:
        if fetched is not None and fetched.held:
            self._buffers.drop(self, item)
            fetched.held = False

    def remember_failure(self, item: int, error: BackendError, backend: Backend, now: float) -> None:
        """Keep `backend`'s failure `error` of `item` (at `now`) to answer the kernel's re-request of it."""
        self.failed = FailedFetch(item, copy.copy(error), weakref.ref(backend), now)

    def recent_failure(self, item: int, backend: Backend, now: float) -> BackendError | None:
        """The failure a read of `item` through `backend` at `now` gets without a fetch (`FailedFetch`), if any: a
        fresh copy each time, so that no raise adds to another's traceback."""
        failed = self.failed
        return copy.copy(failed.error) if failed is not None and failed.answers(item, backend, now) else None


async def read(
    job: MountedJob,
    file_index: int,
    offset: int,
    size: int,
    fetched: FetchedItems | None = None,
    *,
    counted: bool = False,
) -> bytes:
    """Up to `size` bytes of the job's file `file_index` from `offset` (short at the end of the file); `counted`:
    the job's bytes read already hold this read (an open from the cache counted the file). Hits and misses are
    counted per access, not here: `MountedJob.record_access`."""
    manifest = job.dataset.manifest
    items = manifest.items_covering(file_index, offset, size)
    if not items:
        return b""
    end = min(offset + size, manifest.sizes[file_index])
    chunk = manifest.chunk_size
    first_item, last_item = manifest.first_items[file_index], manifest.first_items[file_index + 1] - 1
    parts = []
    for item in items:
        item_start = (item - first_item) * chunk
        start, stop = max(offset, item_start), min(end, item_start + chunk)
        parts.append(await _item_bytes(job, item, last_item, start - item_start, stop - start, fetched))
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if not counted:
        job.count_read(len(data))
    return data


async def _item_bytes(
    job: MountedJob,
    item: int,
    last_item: int,
    offset: int,
    length: int,
    fetched: FetchedItems | None,
) -> bytes:
    cache = job.dataset.cache
    if cache.contains(item):
        data = cache.read(item, offset, length)  # local disk: a pread, cheaper inline than a thread hop
        if data is not None:
            if fetched is not None:
                fetched.served_by_cache(item)
            return data
    if fetched is not None and (data := fetched.read(item, offset, length)) is not None:
        return data
    if fetched is None:
        return (await fetch_item(job, item))[offset : offset + length]
    if fetched.lost(item):
        job.refetched_items += 1
    whole = await _fetch_for_open_file(job, item, last_item, offset, fetched)
    fetched.keep(item, whole, offset, length, cached=cache.contains(item))
    return whole[offset : offset + length]


async def _fetch_for_open_file(job: MountedJob, item: int, last_item: int, offset: int, fetched: FetchedItems) -> bytes:
    """The bytes of `item` for a read at `offset` in it through the open file that keeps `fetched`; or the failure a
    read through that open got for the item a moment ago, raised again without asking storage (`FailedFetch`).
    The backend is taken as the read starts: a failure that ends after the dataset's backend was swapped is kept
    for the replaced one, and answers nothing."""
    backend = job.dataset.backend
    if (error := fetched.recent_failure(item, backend, trio.current_time())) is not None:
        raise error
    try:
        return await _fetch_with_next(job, item, last_item, offset, fetched)
    except BackendError as exc:
        if not isinstance(exc, NoRemoteIO):  # no storage failure: the job has left, and no read of it asks storage
            fetched.remember_failure(item, exc, backend, trio.current_time())
        raise


async def _fetch_with_next(job: MountedJob, item: int, last_item: int, offset: int, fetched: FetchedItems) -> bytes:
    """The bytes of `item`; a read starting on a chunk fetches the file's next chunk alongside, into `fetched`."""
    ahead = item + 1
    if offset == 0 and ahead <= last_item and not job.dataset.cache.contains(ahead) and ahead not in fetched:
        try:
            async with trio.open_nursery() as nursery:  # a sequential reader starting on a chunk: fetch the next too
                nursery.start_soon(_read_ahead, job, ahead, fetched)
                return await fetch_item(job, item)
        except BaseExceptionGroup as group:
            raise _sole(group) from None
    return await fetch_item(job, item)


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a nursery wrapped, or the group if it holds several. Trio wraps even one in a group, and
    the reader's own failure (a BackendError the FUSE layer answers with EIO) came out of the read-ahead nursery
    as a group, which the FUSE layer does not catch: the daemon, and every job's mount, went down with it."""
    return group.exceptions[0] if len(group.exceptions) == 1 else group


async def _read_ahead(job: MountedJob, item: int, fetched: FetchedItems) -> None:
    # On failure the reader fetches the item itself if it gets there, and sees the error then.
    with contextlib.suppress(BackendError):
        data = await fetch_item(job, item)
        fetched.keep_ahead(item, data, cached=job.dataset.cache.contains(item))


class NoRemoteIO(BackendError):
    """The job has left this node (its throttle is closed): no read of it may go to the backend any more."""


async def fetch_item(job: MountedJob, item: int) -> bytes:
    """The bytes of `item` from the backend, fetched once for all concurrent readers of it (single-flight): by
    the first of their jobs whose throttle grants the bytes (`Flight`)."""
    dataset = job.dataset
    while True:
        flight = dataset.inflight.get(item)
        if flight is None:
            flight = dataset.inflight[item] = Flight()
        if not flight.took_off and await _granted_first(job, dataset, item, flight):
            return await _lead_fetch(job, dataset, item, flight)
        await flight.done.wait()
        if flight.data is not None:
            return flight.data
        if isinstance(flight.error, trio.Cancelled):
            continue  # the reader that led the fetch went away: fetch anew
        if isinstance(flight.error, BackendError) and flight.backend is not dataset.backend:
            continue  # it failed through a backend swapped since (rotated credentials): fetch with the new one
        raise flight.error or ChangedObject(f"fetch of item {item} failed")


async def _granted_first(job: MountedJob, dataset: MountedDataset, item: int, flight: Flight) -> bool:
    """Wait on the job's throttle for the item's bytes until granted (True: the job takes the flight off) or
    until another job's grant takes it off first (False)."""
    length = dataset.manifest.item_size(item)
    wait = trio.CancelScope()
    flight.boarding.add(wait)
    try:
        with wait:
            if job.bucket is not None:
                await job.bucket.consume(length, ZeroRateLog(job))
                if flight.took_off:  # granted in the instant another job took it off, and resumed after it
                    job.bucket.give_back(length)
                    return False
            flight.take_off()
            return True
        return False  # another job took it off
    except ThrottleClosed:
        raise NoRemoteIO("it has left this node, so it has no remote IO to read with") from None
    finally:
        flight.boarding.discard(wait)
        if not flight.took_off and not flight.boarding and dataset.inflight.get(item) is flight:
            del dataset.inflight[item]  # every job waiting for it went away before any was granted


@dataclass(frozen=True, slots=True)
class ZeroRateLog:
    """The node's log lines for a job whose reads wait on a remote IO rate of 0 (`ZeroRateWatcher`): one as they
    start waiting, one as they resume. The scheduler chose the rate, so nothing is wrong with the node (INFO); but
    the job's reader just hangs in `read` meanwhile, and without these lines an operator looking at a stuck job has
    no clue why. Once per stretch at 0, however many reads wait: thousands of them must not flood the log."""

    job: MountedJob

    def held(self) -> None:
        log.info(
            "job %s: reads of %s that need storage wait: its remote IO rate is 0 B/s, and they resume once the data "
            "manager grants it some (cached items still read)",
            self.job.job_id,
            self.job.dataset.uri,
            extra=self._ids(),
        )

    def resumed(self, seconds: float) -> None:
        log.info(
            "job %s: reads of %s resume: remote IO granted after %.1f s at 0 B/s",
            self.job.job_id,
            self.job.dataset.uri,
            seconds,
            extra=self._ids(),
        )

    def _ids(self) -> dict[str, str]:
        return log_ids(job_id=self.job.job_id, dataset_uri=self.job.dataset.uri)


async def _lead_fetch(job: MountedJob, dataset: MountedDataset, item: int, flight: Flight) -> bytes:
    flight.backend = backend = dataset.backend
    try:
        data, seconds = await dataset.calls.run(
            functools.partial(_fetch_and_offer, dataset, backend, item), dataset.fetch_limiter
        )
        job.bytes_from_remote += len(data)  # the item's size: `_fetch_and_offer` checked it
        dataset.fetches += 1
        dataset.fetch_bytes += len(data)
        dataset.fetch_seconds += seconds
        flight.data = data
        return data
    except BaseException as exc:
        flight.error = exc
        raise
    finally:
        del dataset.inflight[item]
        flight.done.set()


def _fetch_and_offer(dataset: MountedDataset, backend: Backend, item: int, call: BackendCall) -> tuple[bytes, float]:
    """In a worker thread: read the item through `backend` (the dataset's as the fetch took off) and offer it to the
    cache (one thread hop for both), unless the stop abandoned the `call` meanwhile (`backend_calls`): the daemon is
    closing the cache. Returns the bytes and the seconds the backend read took."""
    file_index, offset, length = dataset.manifest.item_extent(item)
    key = dataset.manifest.paths[file_index]
    started = time.monotonic()
    data = backend.read(key, offset, length, dataset.manifest.versions[file_index])
    seconds = time.monotonic() - started
    if len(data) != length:
        raise ChangedObject(
            f"{backend.object_uri(key)}: expected {length} bytes at offset {offset}, got {len(data)}; "
            "the object changed after the dataset was registered"
        )
    if call.wanted():
        dataset.cache.admit(item, data)
    return data, seconds
