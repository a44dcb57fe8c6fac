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
from bitarray.util import count_and

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
    """items_read / item_count."""
    effective_cache_items: int
    """Cached items not yet read in this epoch: the cache hits still to come."""
    remote_demand_bytes_per_sec: float
    """Throughput times the fraction of the rest of this epoch that is not cached."""
    throughput_bytes_per_sec: float


class AccessTracker:
    """The items one job has read in its current epoch, and its epoch count.

    An epoch ends when every item has been read, or early when an item already read in it is read again (a
    job that restarted, or one that does not read every item per epoch); the repeated item is then the first
    item of the next epoch. So call `record` once per access to an item, not once per read(2) on it.
    """

    def __init__(self, item_count: int) -> None:
        if item_count < 1:
            raise ValueError(f"item_count must be >= 1, got {item_count}")
        self._read = bitarray(item_count)
        self._read.setall(0)
        self._items_read = 0
        self._completed_epochs = 0

    @property
    def epoch(self) -> int:
        """1 during the first pass over the dataset, 2 during the second, ..."""
        return self._completed_epochs + 1

    @property
    def read(self) -> bitarray:
        """The items read in the current epoch; the tracker's own bitset, so do not modify it."""
        return self._read

    def record(self, item: int) -> None:
        """Note an access to `item`. O(1), except that ending an epoch clears the bitset (item_count / 8 bytes)."""
        read = self._read
        if not 0 <= item < len(read):
            raise IndexError(f"item {item} is outside 0..{len(read) - 1}")
        if read[item]:
            self._end_epoch()
        read[item] = 1
        self._items_read += 1
        if self._items_read == len(read):
            self._end_epoch()

    def statistics(self, cached: bitarray, throughput_bytes_per_sec: float) -> AccessStats:
        """The job's epoch, progress and cache use, given the node's cached-items bitset for its dataset.

        Costs a few passes over the bitsets in C (about a millisecond at ImageNet's 1.28 M items), no Python
        loop over items.
        """
        item_count = len(self._read)
        if len(cached) != item_count:
            raise ValueError(f"cached has {len(cached)} bits, expected item_count {item_count}")
        if throughput_bytes_per_sec < 0:
            raise ValueError(f"throughput_bytes_per_sec must be >= 0, got {throughput_bytes_per_sec}")
        effective = cached.count() - count_and(cached, self._read)
        # Never zero: the record that reads the last item of an epoch starts the next one.
        unread = item_count - self._items_read
        return AccessStats(
            epoch=self.epoch,
            completed_epochs=self._completed_epochs,
            items_read=self._items_read,
            item_count=item_count,
            progress=self._items_read / item_count,
            effective_cache_items=effective,
            remote_demand_bytes_per_sec=throughput_bytes_per_sec * (unread - effective) / unread,
            throughput_bytes_per_sec=throughput_bytes_per_sec,
        )

    def _end_epoch(self) -> None:
        self._completed_epochs += 1
        self._read.setall(0)
        self._items_read = 0


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
