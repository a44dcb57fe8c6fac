"""What one mount serves: its datasets (manifest, tree, backend, cache), jobs (throttle, access tracking), and the
node's budget for the fetched items its open files hold (`read_buffers.ReadBuffers`).

Jobs get stable slots (never reused while mounted) because a job's slot is part of every inode number the
kernel holds for that job's files.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from fuseclient.access import AccessStats, AccessTracker, RateMeter
from fuseclient.backend_calls import BackendCalls
from fuseclient.cache import DatasetCache, NoCache
from fuseclient.read_buffers import DEFAULT_READ_BUFFER_BYTES, ReadBuffers
from fuseclient.throttle import TokenBucket
from fuseclient.tree import DatasetTree
from silodlib.backends import Backend
from silodlib.manifest import Manifest


@dataclass(slots=True)
class Flight:
    """One backend fetch of an item, shared by every job that wants the item meanwhile.

    Each job waits for the item's bytes on its own throttle (its wait is `boarding`), so a job held at a low
    or zero rate holds up no other job's read of the item. The first job granted them takes the fetch off and
    is charged for it; the others' waits are cancelled, and they read its bytes without being charged.
    """

    boarding: set[trio.CancelScope] = field(default_factory=set)
    took_off: bool = False
    done: trio.Event = field(default_factory=trio.Event)
    data: bytes | None = None
    error: BaseException | None = None
    backend: Backend | None = None  # the one it reads through, taken as it takes off

    def take_off(self) -> None:
        """The fetch starts: the jobs still waiting on their throttles for it stop waiting."""
        self.took_off = True
        for wait in self.boarding:
            wait.cancel()


@dataclass(eq=False)
class MountedDataset:
    """One dataset on this node: shared by every job that reads it."""

    uri: str
    manifest: Manifest
    tree: DatasetTree
    backend: Backend
    cache: DatasetCache | NoCache  # NoCache while its cache directory cannot be opened: served uncached
    fetch_limiter: trio.CapacityLimiter
    calls: BackendCalls  # the mount's: its fetches run through them, and the stop abandons them (`runtime.Stop`)
    # The backend options it was last given: those `backend` was opened with, unless the node agent could not open
    # the ones the data manager replaced them with (logged; the old backend reads on). The agent compares them to
    # each update of the dataset, and replaces `backend` when they differ.
    options: Mapping[str, str]
    inflight: dict[int, Flight] = field(default_factory=dict)
    fetches: int = 0  # backend reads, their bytes and the seconds they took (for metrics)
    fetch_bytes: int = 0
    fetch_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """Item accesses of one finished epoch, split into hits and misses as `MountedJob.record_access` counts them."""

    epoch: int
    accessed_bytes: int
    hit_bytes: int

    @property
    def hit_ratio(self) -> float:
        return self.hit_bytes / self.accessed_bytes if self.accessed_bytes else 0.0


@dataclass(frozen=True, slots=True)
class Access:
    """An access `MountedJob.record_access` counted: what `deliver` or `take_back` needs to settle it."""

    item: int
    epoch: int
    hit: bool


@dataclass(frozen=True, slots=True)
class JobStats:
    """A job's counters on this node; the same numbers feed logs, metrics and usage reports."""

    job_id: str
    io_bytes_per_sec: float | None  # the throttle's rate; None: unthrottled
    bytes_read: int
    bytes_from_remote: int
    cache_hits: int  # accesses (an open's read of an item) the cache served: `MountedJob.record_access`
    cache_misses: int  # accesses whose bytes came from storage: fetched for the read, ahead of it, or under way
    access: AccessStats
    epoch_hit_ratio: float
    finished_epochs: tuple[EpochRecord, ...]
    failed_reads: int = 0  # reads the backend failed (EIO or EACCES to the reader)
    denied_reads: int = 0  # of them, those storage refused (access denied)
    refetched_items: int = 0  # items fetched again because the read buffers' budget let their bytes go (`ReadBuffers`)


@dataclass(eq=False)
class MountedJob:
    """One job's view of its dataset on this node, with its remote IO throttle and access bitset."""

    job_id: str
    slot: int
    dataset: MountedDataset
    bucket: TokenBucket | None  # None: not throttled
    tracker: AccessTracker
    meter: RateMeter = field(default_factory=RateMeter)
    bytes_read: int = 0
    bytes_from_remote: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    failed_reads: int = 0
    denied_reads: int = 0
    refetched_items: int = 0
    open_epochs: dict[int, EpochRecord] = field(default_factory=dict)  # epochs still counting, by number
    finished_epochs: list[EpochRecord] = field(default_factory=list)
    added_ns: int = field(default_factory=time.time_ns)  # when it came to this node: its empty folders' time
    # Whether each pending access that counted its item was a hit, by (epoch, item): an access joining it is too.
    _pending_hits: dict[tuple[int, int], bool] = field(default_factory=dict, init=False, repr=False)

    def record_access(self, item: int, *, read_ahead: bool = False, pending: bool = False) -> Access:
        """Count an access to `item` (one open's read of it) in the epoch it belongs to (`AccessTracker.count`; the
        old one for a straggler of an epoch boundary the loader's workers overlap), and as the job's cache hit or
        miss: a hit if the item is cached now, unless `read_ahead` says the reader's own read-ahead fetched it from
        the backend moments ago, or a fetch of it is still under way (it reached the cache first, but its bytes came
        from remote for this reader, and the hit ratio sizes remote IO). Counting both here, once per access, keeps
        the hit and miss counters and the epoch hit ratio one rule: counted per kernel request, a cold pass of
        chunked files read as mostly hits. `pending`: its reads have yet to deliver the item; settle it with
        `deliver` or `take_back`. A retry of a failed read, or an access joining a pending one to the item, adds no
        bytes to the epoch but is a hit or miss of its own (a joined access is the hit or miss the one it joined
        was). Epochs the tracker has closed move to `finished_epochs`."""
        hit = not read_ahead and item not in self.dataset.inflight and self.dataset.cache.contains(item)
        counted = self.tracker.count(item, pending=pending)
        key = (counted.epoch, item)
        if counted.new:
            self._add_to_epoch(counted.epoch, item, hit, 1)
            if pending:
                self._pending_hits[key] = hit
        else:
            hit = self._pending_hits.get(key, hit)
            if not pending:  # it delivered the item of any access it joined
                self._pending_hits.pop(key, None)
        self._move_finished_epochs()
        self.cache_hits += hit
        self.cache_misses += not hit
        return Access(item, counted.epoch, hit)

    def deliver(self, access: Access) -> None:
        """A pending access delivered its item: its pass may now be complete."""
        self.tracker.deliver(access.item, access.epoch)
        self._pending_hits.pop((access.epoch, access.item), None)
        self._move_finished_epochs()

    def take_back(self, access: Access) -> None:
        """A pending access whose reads failed delivered nothing: unless another access joined in it is still
        pending or delivered the item, its item is unread in its pass again, and its epoch no longer counts its
        bytes (unless that epoch has ended meanwhile). Either way the loader's retry of the item's file is
        expected: its reads of items the epoch has read count nothing (`AccessTracker.take_back`). Call it also
        for a delivered access a later read of which failed."""
        manifest = self.dataset.manifest
        file_index = manifest.file_of_item(access.item)
        file_items = range(manifest.first_items[file_index], manifest.first_items[file_index + 1])
        if self.tracker.take_back(access.item, access.epoch, file_items=file_items):
            self._pending_hits.pop((access.epoch, access.item), None)
            self._add_to_epoch(access.epoch, access.item, access.hit, -1)
            self._move_finished_epochs()

    def _add_to_epoch(self, epoch: int, item: int, hit: bool, sign: int) -> None:
        size = sign * self.dataset.manifest.item_size(item)
        counted = self.open_epochs.get(epoch, EpochRecord(epoch, 0, 0))
        self.open_epochs[epoch] = EpochRecord(epoch, counted.accessed_bytes + size, counted.hit_bytes + hit * size)

    def _move_finished_epochs(self) -> None:
        closed = self.tracker.closed_epochs
        if not self.open_epochs or min(self.open_epochs) > closed:
            return
        while self.open_epochs and min(self.open_epochs) <= closed:
            self.finished_epochs.append(self.open_epochs.pop(min(self.open_epochs)))
        self._pending_hits = {key: hit for key, hit in self._pending_hits.items() if key[0] > closed}

    def count_read(self, size: int) -> None:
        """Count `size` bytes read: in the job's bytes read and its throughput. A read's hit or miss is its
        access's (`record_access`). Called for each read the daemon serves (`readpath.read`), and for a whole file
        at its open when it is opened from the cache (`OpenFile`), whose reads the kernel may then serve from its
        page cache without asking the daemon."""
        self.bytes_read += size
        self.meter.add(size, trio.current_time())

    def count_failed_read(self, *, denied: bool) -> None:
        """Count a read the backend failed; `denied`: storage refused it (access denied). A job whose storage
        refuses every read otherwise looks like one that stopped reading (its accesses are taken back, so its epochs
        stand still)."""
        self.failed_reads += 1
        self.denied_reads += denied

    def statistics(self, now: float) -> JobStats:
        throughput = self.meter.rate(now)
        epoch = self.tracker.epoch
        current = self.open_epochs.get(epoch, EpochRecord(epoch, 0, 0))
        return JobStats(
            self.job_id,
            None if self.bucket is None else self.bucket.rate,
            self.bytes_read,
            self.bytes_from_remote,
            self.cache_hits,
            self.cache_misses,
            self.tracker.statistics(self.dataset.cache.cached, throughput),
            current.hit_ratio,
            tuple(self.finished_epochs),
            self.failed_reads,
            self.denied_reads,
            self.refetched_items,
        )


class MountState:
    """Jobs by id and by slot; datasets by URI; the read buffers of the files open in them, and the backend calls their
    reads wait for."""

    def __init__(self, read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES) -> None:
        self.read_buffers = ReadBuffers(read_buffer_bytes)
        self.backend_calls = BackendCalls()  # every dataset's, those removed while files still read them included
        self.datasets: dict[str, MountedDataset] = {}
        self.jobs: dict[str, MountedJob] = {}
        self.jobs_by_slot: dict[int, MountedJob] = {}
        self._next_slot = 0
        self.jobs_changed_ns = time.time_ns()  # the root's time: a job's directory last came or went

    def add_dataset(self, dataset: MountedDataset) -> None:
        self.datasets[dataset.uri] = dataset

    def remove_dataset(self, uri: str) -> MountedDataset | None:
        """Forget a dataset (None if it was not served); files still open keep reading through it."""
        return self.datasets.pop(uri, None)

    def next_slot(self) -> int:
        slot = self._next_slot
        self._next_slot += 1
        return slot

    def add_job(self, job: MountedJob) -> None:
        self.jobs[job.job_id] = job
        self.jobs_by_slot[job.slot] = job
        self.jobs_changed_ns = time.time_ns()

    def remove_job(self, job_id: str) -> MountedJob:
        """Forget a job. Files it has open keep reading what is cached (their handles hold the job), but its
        throttle is closed: the data manager no longer gives it remote IO, and its reads waiting for some (at
        a rate of 0, for good) end with an error rather than hold their readers, and the kernel pages they
        lock, until the agent stops."""
        job = self.jobs.pop(job_id)
        del self.jobs_by_slot[job.slot]
        self.jobs_changed_ns = time.time_ns()
        if job.bucket is not None:
            job.bucket.close()
        return job
