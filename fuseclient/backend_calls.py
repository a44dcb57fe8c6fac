"""The read path's backend calls, each in a worker thread, and their abandonment as the daemon stops.

A backend call (the GET of an item) blocks a worker thread that cannot be interrupted. A storage node that hangs,
its connection open and no answer coming (a frozen process, a stalled disk behind it), holds the call until the
backend's `read_timeout` cuts its try, and then its retries: minutes with long timeouts. A stopping daemon waited for
it, past the grace any service manager gives a stop (Kubernetes SIGKILLs after 30 s by default, leaving a dead
mount). So the stop, at the end of its grace (`runtime.Stop`), abandons the calls still under way: their reads fail
at once with EIO, as any failed read, and the daemon ends without waiting for their threads (trio's worker threads
are daemon threads, which the process's exit does not join). A call made after that fails at once the same way.

An abandoned thread that gets its answer later drops it: it offers nothing to the cache, which the daemon is
closing, and its result reaches no one (`BackendCall.wanted`). The cache's own promises cover an admission that
had begun as the call was abandoned: a write cut short by the process's end leaves a temporary file, which the next
start deletes, never a partial entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from silodlib.backends import BackendError

T = TypeVar("T")


class Abandoned(BackendError):
    """The daemon is stopping, and no longer waits for this backend call: storage had not answered it by the end of
    the stop's grace. Its read fails with EIO."""


class BackendCall:
    """One backend call under way, as its worker thread sees it."""

    __slots__ = ("_abandoned", "_scope", "started")

    def __init__(self, scope: trio.CancelScope) -> None:
        self._scope = scope
        self._abandoned = False  # set by the loop's thread, read by the worker's: one flag, no lock to order
        self.started = False  # a worker thread runs it (it no longer waits for one)

    def wanted(self) -> bool:
        """In the worker thread, before it hands anything on (the cache's admission): whether the daemon still
        waits for the result. False once the call is abandoned. (An admission begun just before is not stopped:
        the cache's temporary files cover a write the process's end cuts short.)"""
        return not self._abandoned

    def _abandon(self) -> None:
        self._abandoned = True
        self._scope.cancel()


class BackendCalls:
    """The backend calls of one mount's read path: run each in a worker thread; abandon all at once as the daemon
    stops. On the mount's trio loop, but for `BackendCall.wanted`."""

    def __init__(self) -> None:
        self._calls: set[BackendCall] = set()
        self._closed = False

    async def run(self, work: Callable[[BackendCall], T], limiter: trio.CapacityLimiter) -> T:
        """`work(call)` in a worker thread under `limiter`; raises `Abandoned` if `abandon` ends the wait for it. A
        cancellation from outside waits for the thread, as a thread's call always did: only the stop abandons one."""
        if self._closed:
            raise Abandoned(_STOPPING)
        scope = trio.CancelScope(shield=True)  # shielded from the caller's cancellation; `abandon` cancels it
        call = BackendCall(scope)

        def in_thread() -> T:
            call.started = True
            return work(call)

        self._calls.add(call)
        try:
            with scope:
                return await trio.to_thread.run_sync(in_thread, limiter=limiter, abandon_on_cancel=True)
        finally:
            self._calls.discard(call)
        raise Abandoned(_STOPPING)  # reached only when `abandon` cancelled the scope

    def abandon(self) -> tuple[int, int]:
        """Stop waiting for every call under way, and fail every later one at once: the daemon is stopping. Returns
        how many calls were abandoned inside the backend (their threads run on until it answers or times out), and
        how many were still waiting for a thread (`limiter`), which never reach storage."""
        self._closed = True
        calls, self._calls = self._calls, set()
        for call in calls:
            call._abandon()
        started = sum(call.started for call in calls)
        return started, len(calls) - started


_STOPPING = "the daemon is stopping, and storage had not answered this read by the end of the stop's grace"
