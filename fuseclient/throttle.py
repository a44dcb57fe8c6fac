"""Per-job token buckets: the remote IO allocation b of the SiloD paper, enforced on every backend fetch.

A job's (per-node, per-worker) remote IO share arrives from the data manager as bytes per second; the read path
awaits `TokenBucket.consume(item_size)` before fetching an uncached item. Whatever the schedule of requests, the
bytes granted by time t after the bucket was made (or last given a positive rate) stay within
`burst + rate * t` when no request exceeds the burst, and within `rate * t + max(burst, largest request)`
otherwise: this is invariant 3 of the design.

Everything runs on trio's clock, so tests drive buckets with `trio.testing.MockClock` instead of sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import trio

DEFAULT_BURST_SECONDS = 0.1


class ThrottleClosed(Exception):
    """The bucket was closed: its job has left the node, and nothing will grant it bytes again."""


def default_burst(rate: float, item_size: int) -> int:
    """A burst of a tenth of a second at `rate`, but never less than one item (so any item can be fetched).

    A small burst keeps the short-term rate close to the allocation, which is what the scheduler planned with.
    """
    _check_rate(rate)
    if item_size < 0:
        raise ValueError(f"item_size must be >= 0, got {item_size}")
    return max(1, item_size, int(rate * DEFAULT_BURST_SECONDS))


class ZeroRateWatcher(Protocol):
    """Told when a bucket starts and stops holding its requests at a rate of 0, once per stretch at 0 however many
    requests wait or retry in it: a job held at 0 otherwise just hangs in `read`, and the node's log says nothing."""

    def held(self) -> None:
        """A request is held by a rate of 0: the first since the bucket last granted one."""

    def resumed(self, seconds: float) -> None:
        """A request was granted after the bucket had held its requests at a rate of 0 for `seconds`."""


@dataclass(frozen=True, slots=True)
class ThrottleStats:
    """A bucket's configuration and counters; the same numbers feed logs, metrics and the status command."""

    rate_bytes_per_sec: float
    burst_bytes: int
    granted_bytes: int
    """Total bytes ever granted."""
    waited_seconds: float
    """Total time consumers have spent in `consume`, summed over consumers, including those still waiting."""
    waiting: int
    """Consumers in `consume` right now, not yet granted."""


class TokenBucket:
    """Grants bytes at `rate` per second with bursts of up to `burst` bytes, first come first served.

    Tokens accrue continuously at `rate` up to `burst`; the bucket starts full. A request for n bytes waits
    until the bucket holds min(n, burst) tokens and then takes n, so a request larger than the burst is
    granted from a full bucket and leaves it in debt (the bound then becomes rate * t + max(burst, n)).
    Requests are served strictly in arrival order, so a large request is not starved by a stream of small ones.

    A rate of 0 means the job may not read uncached data: requests wait until a positive rate is set. Tokens
    held then are kept, so reads resume at once when the rate comes back. A stretch at 0 begins when a request is
    first held by it and ends when one is next granted; the request that begins or ends it tells its own
    `ZeroRateWatcher`, so each stretch is told once however many requests wait in it. A closed bucket (its job
    gone) fails every request, waiting or new, with `ThrottleClosed`: without it a request at a rate of 0 would
    wait for good.

    Must be created, reconfigured and consumed inside one trio run: it reads `trio.current_time()`.
    """

    def __init__(self, rate: float, burst: int) -> None:
        _check_rate(rate)
        _check_burst(burst)
        self._rate = float(rate)
        self._burst = burst
        self._tokens = float(burst)
        self._updated = trio.current_time()
        # trio's Lock is fair (FIFO hand-off), and the holder is the only consumer that may take tokens.
        self._turn = trio.Lock()
        self._changed = trio.Event()
        self._closed = False
        self._granted = 0
        self._waiting = 0
        self._waited_done = 0.0
        self._waiting_since_sum = 0.0
        self._held_since: float | None = None  # when a rate of 0 first held a request, until one is granted

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> int:
        return self._burst

    def set_rate(self, rate: float, burst: int | None = None) -> None:
        """Change the rate (and optionally the burst) with immediate effect, also for consumers already waiting.

        Tokens accrued so far at the old rate are kept, capped at the new burst. A waiting consumer recomputes
        its wake-up time, so a lowered rate delays it and a raised rate releases it sooner.
        """
        _check_rate(rate)
        if burst is not None:
            _check_burst(burst)
        self._accrue(trio.current_time())
        self._rate = float(rate)
        if burst is not None:
            self._burst = burst
        self._changed.set()
        self._changed = trio.Event()

    def close(self) -> None:
        """Fail every request from now on, those already waiting included, with `ThrottleClosed`."""
        self._closed = True
        self._changed.set()
        self._changed = trio.Event()

    def give_back(self, nbytes: int) -> None:
        """Return `nbytes` granted to a request that fetched nothing after all (another job fetched the item
        first), as if it had never been granted: up to the burst, and no longer counted as granted."""
        if not 0 <= nbytes <= self._granted:
            raise ValueError(f"cannot give back {nbytes} bytes of the {self._granted} granted")
        self._accrue(trio.current_time())
        self._tokens = min(self._burst, self._tokens + nbytes)
        self._granted -= nbytes

    async def consume(self, nbytes: int, watcher: ZeroRateWatcher | None = None) -> None:
        """Return once `nbytes` may be fetched, after every earlier caller has been served.

        Cancellable at any point: a cancelled request takes no tokens and leaves its place in line, and a stretch
        at a rate of 0 it was held in goes on (so readers that give up and retry are not told of it again).
        A request for 0 bytes fetches nothing and is granted without queueing. Raises `ThrottleClosed` once the
        bucket is closed. `watcher` hears when this request begins or ends a stretch at a rate of 0.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if self._closed:
            raise ThrottleClosed("the bucket is closed")
        if nbytes == 0:
            await trio.lowlevel.checkpoint()
            return
        started = trio.current_time()
        self._waiting += 1
        self._waiting_since_sum += started
        try:
            async with self._turn:
                await self._wait_for_tokens(nbytes, watcher)
                self._tokens -= nbytes
                self._granted += nbytes
                self._end_hold(watcher)
        finally:
            self._waiting -= 1
            self._waiting_since_sum -= started
            self._waited_done += trio.current_time() - started

    def statistics(self) -> ThrottleStats:
        now = trio.current_time()
        waited = self._waited_done + self._waiting * now - self._waiting_since_sum
        return ThrottleStats(self._rate, self._burst, self._granted, max(0.0, waited), self._waiting)

    async def _wait_for_tokens(self, nbytes: int, watcher: ZeroRateWatcher | None) -> None:
        """Wait, holding the turn, until the bucket holds min(nbytes, burst) tokens at a positive rate."""
        while True:
            if self._closed:
                raise ThrottleClosed("the bucket is closed")
            now = trio.current_time()
            self._accrue(now)
            needed = min(nbytes, self._burst)
            if self._rate > 0 and self._tokens >= needed:
                return
            changed = self._changed
            if self._rate == 0:
                self._begin_hold(now, watcher)
                await changed.wait()
                continue
            with trio.move_on_at(now + (needed - self._tokens) / self._rate) as timer:
                await changed.wait()
            if timer.cancelled_caught and not changed.is_set():
                # The tokens are due now; floating-point rounding must not send us around for a zero-length nap.
                self._accrue(trio.current_time())
                self._tokens = max(self._tokens, needed)
                return

    def _begin_hold(self, now: float, watcher: ZeroRateWatcher | None) -> None:
        """A request is held by a rate of 0: the first of a stretch at 0 tells its watcher."""
        if self._held_since is None:
            self._held_since = now
            if watcher is not None:
                watcher.held()

    def _end_hold(self, watcher: ZeroRateWatcher | None) -> None:
        """A request was granted: if it ends a stretch at a rate of 0, it tells its watcher how long that lasted."""
        if self._held_since is not None:
            seconds = trio.current_time() - self._held_since
            self._held_since = None
            if watcher is not None:
                watcher.resumed(seconds)

    def _accrue(self, now: float) -> None:
        self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._rate)
        self._updated = now


def _check_rate(rate: float) -> None:
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"rate must be a finite number of bytes per second >= 0, got {rate}")


def _check_burst(burst: int) -> None:
    if burst < 1:
        raise ValueError(f"burst must be >= 1 byte, got {burst}")
