"""Per-job access bitsets: epochs, progress, effective cache and remote IO demand.

DL training reads every item of its dataset once per epoch in a fresh random order. A bitset of the items a job
has read in its current epoch, combined with the node's bitset of cached items, gives what the scheduler needs
from the data plane (SiloD, uniform caching): how far the job is through its epoch, how much of the cache it can
still benefit from this epoch (the effective cache), and its instantaneous remote IO demand: the fraction of the
rest of the epoch that will miss the cache, times the job's throughput. Over a whole epoch that is the paper's
b = f* x (1 - c/d), with c/d counted in items (equal to the byte ratio when items are of one size).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import trio
from bitarray import bitarray
from bitarray.util import count_and, zeros

_BUCKETS_PER_WINDOW = 50


@dataclass(frozen=True, slots=True)
class AccessStats:
    """A job's position in its epochs and its cache use; the same numbers feed logs, metrics and status."""

    epoch: int
    """1 during the first pass over the dataset, 2 during the second, ..."""
    completed_epochs: int
    items_read: int
    """Distinct items read in the current epoch."""
    item_count: int
    progress: float
    """items_read over the items a pass reads on this node (all of them, or the node's share)."""
    effective_cache_items: int
    """Cached items not yet read in this epoch: the cache hits still to come."""
    remote_demand_bytes_per_sec: float
    """Throughput times the fraction of the rest of this epoch that is not cached."""
    throughput_bytes_per_sec: float


# A repeat with more than this share of the epoch unread starts the next epoch at once: no data loader keeps
# a quarter of a dataset in flight, so the job is on a new pass (it restarted, or reads a subset per epoch).
OVERLAP_MAX_UNREAD_SHARE = 0.25
# The shortest overlap: accesses without a straggler before it closes, however early its last straggler came.
MIN_OVERLAP_ACCESSES = 64


@dataclass(frozen=True, slots=True)
class Counted:
    """How `AccessTracker.count` counted an access."""

    epoch: int
    """The epoch it counts in (the old one for a straggler of an overlap); settle a pending access with it."""
    new: bool
    """It counted its item in `epoch`, whose bytes it adds to; False for a retry of a failed read of the item's
    file and for an access joining a pending one to the item (the item counts once)."""


class AccessTracker:
    """The items one job has read in its current epoch, and its epoch count.

    An epoch ends when every item has been read, or when the job is on its next pass without having read
    them all (it restarted, or reads a subset per epoch): an item already read in the epoch is read again.

    Data loaders read with many workers at once, so where one shuffle turns into the next (a step-based
    sampler drawing shuffle after shuffle, or the next epoch's first batches prefetched) the last items of
    one pass and the first of the next arrive interleaved. Ending the epoch at the first repeat would count
    the old pass's stragglers in the new one, where their own reads later repeat and end it early again: a
    mount counted 101 epochs for 14 passes that way. So a repeat while at most `OVERLAP_MAX_UNREAD_SHARE` of
    the epoch is unread opens an *overlap*: items not yet read in the epoch are its stragglers and count in
    it; repeats count in the next pass. The overlap closes, the epoch ends and the next pass's reads carry
    over, when the epoch has read every item (no access to one pending), when an item repeats within the next
    pass too, or when as many accesses have passed since the last straggler as the overlap had lasted until it
    (at least `MIN_OVERLAP_ACCESSES`): stragglers are the reads in flight when the shuffle turned, so they
    arrive within a span set by the loader's concurrency, which this measures rather than assumes.

    A job whose workers span nodes reads on each node only that node's `share` of the items per pass (PyTorch's
    DistributedSampler deals each rank 1/world_size of them, another random part each pass): there a pass is
    complete, and progress counted, at that share of the items.

    Statistics describe the pass in progress: during an overlap, the next one (the old pass has only its
    stragglers left, already in flight). Call `count` (or `record`) once per access to an item, not once per
    read(2).

    An access is known at the open, but whether it delivers the item only once the open's reads return: a pass
    whose reads all failed (storage refused them, the network was down) delivered nothing and is no epoch. So an
    access may be counted `pending`: it counts in its pass as any other (it is read, progress counts it), but
    the pass does not complete while one of its accesses is pending, and the access is then either delivered
    (`deliver`) or, its reads having failed, taken back (`take_back`): the item is unread in its pass again, and
    the job's retry of it counts there as its first access, even where the next pass has read the item during
    an overlap (not the next pass repeating). An epoch that ends otherwise (the job is on its next pass) ends
    with its pending accesses as they are.

    Two kinds of access read an item again in its pass without being the next pass: they neither end the epoch
    nor open an overlap, and count nothing new (`Counted.new` is False: the epoch counts the item's bytes once).

    - A *retry*. A loader retries a failed read by opening the file again and reading it from the start, so the
      chunks of a large file that the failed open had delivered are read again in the same pass: as repeats with
      most of the pass unread, they ended the epoch (4 passes of 8 chunked files with one outage: 4.75 epochs).
      So a failed access (`take_back`, whether or not it undoes anything) marks each item of its file in its
      epoch, and the next access to a marked item that the epoch has read is the retry (it uses the mark up; an
      access to a marked item the epoch has not read counts as usual, and clears the mark). Marks are per item and
      used up, not per file for the rest of the epoch, so that the next pass reading the file is a repeat again;
      they go with their epoch.
    - A *join*. Opens of an item at the same time (a loader's threads reading one file) are accesses to one
      delivery, not passes: each open after the first was a repeat, and 8 opens of a file whose reads storage
      refused counted 8 epochs. So an access to an item whose access is pending joins it where a repeat would not
      be the next pass's read: during an overlap, an item whose access in the next pass is pending; an item
      marked for a retry; and while more than `OVERLAP_MAX_UNREAD_SHARE` of the epoch is unread (where a repeat
      would end the epoch). The item is delivered when any joined access delivers it, and taken back only when
      all of them failed. Near the end of a pass, a repeat of an item still pending is the next pass's read of an
      item whose read in the old pass has not returned (a loader's workers overlap the passes, and the kernel sends
      the release of an open it served from its page cache after close() returns): it opens an overlap as before.

    A retry that runs past the end of its pass while the next pass reads the same file can still end the next
    epoch early: the tracker sees items, not which pass an open belongs to.
    """

    def __init__(self, item_count: int, share: float = 1.0) -> None:
        if item_count < 1:
            raise ValueError(f"item_count must be >= 1, got {item_count}")
        self._read = zeros(item_count)  # the epoch's items read
        self._items_read = 0
        self._next = zeros(item_count)  # during an overlap, the next pass's items read
        self._next_read = 0
        # Items whose access is pending, with how many accesses joined in it: the epoch's, and during an
        # overlap the next pass's.
        self._pending: dict[int, int] = {}
        self._next_pending: dict[int, int] = {}
        # Items whose next access is a failed read's retry (their file's read failed): the epoch's, the next pass's.
        self._retry = zeros(item_count)
        self._next_retry = zeros(item_count)
        self._closed_epochs = 0
        self._accesses = 0
        self._overlap_start: int | None = None  # access count at the repeat that opened the overlap
        self._last_straggler = 0
        self._expected = self._items_per_pass(share)

    def set_share(self, share: float) -> None:
        """Expect this node to read `share` (in (0, 1]) of the items each pass: its workers over the job's."""
        self._expected = self._items_per_pass(share)

    def _items_per_pass(self, share: float) -> int:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        return max(1, round(share * len(self._read)))

    @property
    def closed_epochs(self) -> int:
        """Epochs that have ended; the access counts `record` returns for them are final."""
        return self._closed_epochs

    @property
    def epoch(self) -> int:
        """The pass in progress: 1 during the first pass over the dataset, 2 during the second, ..."""
        return self._closed_epochs + (2 if self._overlapping else 1)

    @property
    def read(self) -> bitarray:
        """The items read in the pass in progress; the tracker's own bitset, so do not modify it."""
        return self._next if self._overlapping else self._read

    @property
    def _overlapping(self) -> bool:
        return self._overlap_start is not None

    def record(self, item: int, *, pending: bool = False) -> int:
        """`count`'s epoch, for a caller that keeps no byte counts."""
        return self.count(item, pending=pending).epoch

    def count(self, item: int, *, pending: bool = False) -> Counted:
        """Note an access to `item`: the epoch it counts in (the old one for a straggler of an overlap), and whether
        it counted the item there anew (not a retry nor a join). `pending`: the access has yet to deliver the item;
        `deliver` or `take_back` it with that epoch. O(1), except that ending an epoch clears two bitsets
        (item_count / 8 bytes each)."""
        if not 0 <= item < len(self._read):
            raise IndexError(f"item {item} is outside 0..{len(self._read) - 1}")
        epoch = self._closed_epochs + 1
        if self._overlapping:
            if item in self._next_pending:
                return self._join(self._next_pending, item, epoch + 1, pending)
            if self._next[item] and self._next_retry[item]:
                self._next_retry[item] = 0
                return Counted(epoch + 1, new=False)
        if self._read[item] and self._retry[item]:
            self._retry[item] = 0
            if item in self._pending:
                return self._join(self._pending, item, epoch, pending)
            return Counted(epoch, new=False)
        if item in self._pending and not self._overlapping and self._repeat_ends_epoch():
            return self._join(self._pending, item, epoch, pending)
        self._accesses += 1
        if self._overlapping and self._next[item] and not self._retry[item]:
            self._end_epoch()  # the next pass repeats too: the old one is over (not a retry of the old one's)
        if not self._overlapping:
            if not self._read[item]:
                return self._count_in_epoch(item, pending)
            if self._repeat_ends_epoch():
                self._end_epoch()
                return self._count_in_epoch(item, pending)
            self._overlap_start = self._last_straggler = self._accesses
            return self._count_in_next(item, pending)
        if not self._read[item]:
            self._last_straggler = self._accesses
            return self._count_in_epoch(item, pending)
        counted = self._count_in_next(item, pending)
        if self._stragglers_done():
            self._end_epoch()
        return counted

    def deliver(self, item: int, epoch: int) -> None:
        """A pending access to `item` counted in `epoch` delivered the item; it may complete the pass."""
        live = self._live(epoch)
        if live is not None:
            live[0].pop(item, None)
            self._end_if_complete()

    def take_back(self, item: int, epoch: int, *, file_items: range | None = None) -> bool:
        """An access to `item` counted in `epoch` failed: its reads did not deliver the item. Returns whether that
        undid the item's access: it was pending and every access joined in it has failed (False also once its
        epoch has ended, or the item was delivered). While that epoch lasts, the next access to each of
        `file_items` (the items of the file `item` is a chunk of; default `item` alone) that the epoch has read
        is the loader's retry of the file. O(1), but for marking `file_items` (len(file_items) / 8 bytes)."""
        live = self._live(epoch)
        if live is None:
            return False
        pending, retry = live
        marked = range(item, item + 1) if file_items is None else file_items
        if item not in marked:
            raise ValueError(f"item {item} is not one of file_items {marked}")
        retry[marked.start : marked.stop] = 1
        joined = pending.get(item, 0)
        if joined != 1:
            if joined:
                pending[item] = joined - 1
            return False
        del pending[item]
        if epoch == self._closed_epochs + 1:
            self._read[item] = 0
            self._items_read -= 1
            self._end_if_complete()  # with a share, the rest may be a whole pass
        else:
            self._next[item] = 0
            self._next_read -= 1
        return True

    def _live(self, epoch: int) -> tuple[dict[int, int], bitarray] | None:
        """The pending accesses and the retry marks of `epoch`; None for an epoch that has ended (or not begun)."""
        if epoch == self._closed_epochs + 1:
            return self._pending, self._retry
        if epoch == self._closed_epochs + 2 and self._overlapping:
            return self._next_pending, self._next_retry
        return None

    def statistics(self, cached: bitarray, throughput_bytes_per_sec: float) -> AccessStats:
        """The job's pass in progress, its progress and cache use, given the node's cached-items bitset for
        its dataset.

        Costs a few passes over the bitsets in C (about a millisecond at ImageNet's 1.28 M items), no Python
        loop over items.
        """
        read = self.read
        item_count = len(read)
        if len(cached) != item_count:
            raise ValueError(f"cached has {len(cached)} bits, expected item_count {item_count}")
        if throughput_bytes_per_sec < 0:
            raise ValueError(f"throughput_bytes_per_sec must be >= 0, got {throughput_bytes_per_sec}")
        items_read = self._next_read if self._overlapping else self._items_read
        effective = cached.count() - count_and(cached, read)
        # Over every item unread, not only this node's share: which of them its next reads are is random. Zero
        # only while the last accesses of a pass are pending (the record that completes one starts the next):
        # nothing is left to ask the backend for.
        unread = item_count - items_read
        uncached_share = (unread - effective) / unread if unread else 0.0
        return AccessStats(
            epoch=self.epoch,
            completed_epochs=self.epoch - 1,
            items_read=items_read,
            item_count=item_count,
            progress=min(1.0, items_read / self._expected),
            effective_cache_items=effective,
            remote_demand_bytes_per_sec=throughput_bytes_per_sec * uncached_share,
            throughput_bytes_per_sec=throughput_bytes_per_sec,
        )

    def _stragglers_done(self) -> bool:
        """Whether an overlap has gone on without a straggler for as long as it took to its last one."""
        assert self._overlap_start is not None
        quiet = self._accesses - self._last_straggler
        return quiet > max(MIN_OVERLAP_ACCESSES, self._last_straggler - self._overlap_start)

    def _repeat_ends_epoch(self) -> bool:
        """Whether so much of the epoch is unread that a repeat is the job's next pass, not an overlap."""
        return self._expected - self._items_read > OVERLAP_MAX_UNREAD_SHARE * self._expected

    def _join(self, pending: dict[int, int], item: int, epoch: int, still_pending: bool) -> Counted:
        """Join an access to `item` to the one pending in `epoch`: one more to settle, or, if it delivered the
        item already, the item delivered."""
        if still_pending:
            pending[item] += 1
        else:
            del pending[item]
            self._end_if_complete()
        return Counted(epoch, new=False)

    def _count_in_epoch(self, item: int, pending: bool) -> Counted:
        epoch = self._closed_epochs + 1
        self._read[item] = 1
        self._items_read += 1
        self._retry[item] = 0
        if pending:
            self._pending[item] = 1
        self._end_if_complete()
        return Counted(epoch, new=True)

    def _count_in_next(self, item: int, pending: bool) -> Counted:
        self._next[item] = 1
        self._next_read += 1
        self._next_retry[item] = 0
        if pending:
            self._next_pending[item] = 1
        return Counted(self._closed_epochs + 2, new=True)

    def _end_if_complete(self) -> None:
        """End the epoch if it has read the pass's items and every access to them delivered its item."""
        if self._items_read >= self._expected and not self._pending:
            self._end_epoch()

    def _end_epoch(self) -> None:
        """Close the epoch; the next pass's reads during an overlap (and their pending accesses and retry marks)
        become the new epoch's."""
        self._closed_epochs += 1
        self._read, self._next = self._next, self._read
        self._items_read, self._next_read = self._next_read, 0
        self._pending, self._next_pending = self._next_pending, {}
        self._retry, self._next_retry = self._next_retry, self._retry
        self._next.setall(0)
        self._next_retry.setall(0)
        self._overlap_start = None
        self._end_if_complete()  # the overlap read a whole pass again: a pass of its own


class RateMeter:
    """Bytes per second over a sliding window, on trio's clock (or an explicit `now`).

    Counts are kept in buckets of a fiftieth of the window, so memory stays bounded whatever the traffic: the
    window is the current bucket and the 49 before it, and the rate is their bytes over the time they span up to
    `now`. Before that much time has passed since the first sample, the rate is over the time elapsed since then
    (at least one bucket), so a young meter neither under-reports nor divides by almost zero.
    Times passed in must not decrease.
    """

    def __init__(self, window_seconds: float = 5.0) -> None:
        if not math.isfinite(window_seconds) or window_seconds <= 0:
            raise ValueError(f"window_seconds must be a positive number, got {window_seconds}")
        self._window = window_seconds
        self._bucket_seconds = window_seconds / _BUCKETS_PER_WINDOW
        self._buckets: deque[list[int]] = deque()  # [bucket index, bytes], oldest first
        self._first_sample: float | None = None

    def add(self, nbytes: int, now: float | None = None) -> None:
        """Count `nbytes` transferred at `now` (default: trio's current time)."""
        if now is None:
            now = trio.current_time()
        if self._first_sample is None:
            self._first_sample = now
        index = math.floor(now / self._bucket_seconds)
        if self._buckets and self._buckets[-1][0] == index:
            self._buckets[-1][1] += nbytes
        else:
            self._buckets.append([index, nbytes])
        self._expire(index)

    def rate(self, now: float | None = None) -> float:
        """Bytes per second over the window ending at `now` (default: trio's current time); 0 before any sample."""
        if now is None:
            now = trio.current_time()
        if self._first_sample is None:
            return 0.0
        index = math.floor(now / self._bucket_seconds)
        self._expire(index)
        window_start = (index - _BUCKETS_PER_WINDOW + 1) * self._bucket_seconds
        span = max(now - max(window_start, self._first_sample), self._bucket_seconds)
        return sum(nbytes for _, nbytes in self._buckets) / span

    def _expire(self, current_index: int) -> None:
        while self._buckets and self._buckets[0][0] <= current_index - _BUCKETS_PER_WINDOW:
            self._buckets.popleft()
