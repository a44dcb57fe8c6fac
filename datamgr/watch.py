"""Fan-out of watch events to the streams that are open right now: per-node allocation events
(WatchAllocations, keyed by node id) and the policy's compute decisions (WatchDecisions, one key).

Only live delivery happens here; the durable change log in the store is what a reconnecting node resumes
from, and the current state what a reconnecting launcher starts from. A stream that falls too far behind is
ended rather than buffered without bound: its client reconnects and catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

DEFAULT_BACKLOG = 10_000
E = TypeVar("E")


class WatchOverflow(Exception):
    """The stream's consumer fell more than the backlog behind; it must resume from its last revision."""


class WatchClosed(Exception):
    """The hub was closed (the data manager is stopping): the stream ends, and its client reconnects later."""


class Subscription(Generic[E]):
    """One open watch stream's queue of events."""

    def __init__(self, backlog: int) -> None:
        self._queue: asyncio.Queue[E | None] = asyncio.Queue(maxsize=backlog)  # None: closed
        self._overflowed = False
        self._closed = False

    def offer(self, event: E) -> None:
        """Queue `event`; once the queue has been full, queue nothing more: the stream must end where the first event
        it dropped would have been, or a reader that frees room would get later events past a hole (and a node that
        resumes from the last it applied would never get the ones in it)."""
        if self._overflowed:
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._overflowed = True

    def close(self) -> None:
        """End the stream: `next` raises WatchClosed once the events already queued are taken."""
        self._closed = True
        with contextlib.suppress(asyncio.QueueFull):  # a full queue is drained first, then found closed
            self._queue.put_nowait(None)

    async def next(self) -> E:
        if self._queue.empty():
            if self._overflowed:
                raise WatchOverflow
            if self._closed:
                raise WatchClosed
        event = await self._queue.get()
        if event is None:
            raise WatchClosed
        return event


class _Revisioned(Protocol):
    @property
    def revision(self) -> int: ...


R = TypeVar("R", bound=_Revisioned)


async def events_after(subscription: Subscription[R], revision: int) -> AsyncIterator[R]:
    """The subscription's events past `revision`, in order: those the backlog or snapshot a stream opened with
    already covered are skipped."""
    while True:
        event = await subscription.next()
        if event.revision > revision:
            revision = event.revision
            yield event


class WatchHub(Generic[E]):
    """Open subscriptions by key (a node id)."""

    def __init__(self, backlog: int = DEFAULT_BACKLOG) -> None:
        self._backlog = backlog
        self._subscribers: defaultdict[str, set[Subscription[E]]] = defaultdict(set)
        self._closed = False

    @contextmanager
    def subscribe(self, node_id: str) -> Iterator[Subscription[E]]:
        subscription: Subscription[E] = Subscription(self._backlog)
        if self._closed:
            subscription.close()
        self._subscribers[node_id].add(subscription)
        try:
            yield subscription
        finally:
            self._subscribers[node_id].discard(subscription)
            if not self._subscribers[node_id]:
                del self._subscribers[node_id]

    def publish(self, node_id: str, event: E) -> None:
        for subscription in self._subscribers.get(node_id, ()):
            subscription.offer(event)

    def close(self) -> None:
        """End every open stream, and every one opened from now on (WatchClosed)."""
        self._closed = True
        for subscriptions in self._subscribers.values():
            for subscription in subscriptions:
                subscription.close()

    def watcher_count(self, node_id: str) -> int:
        return len(self._subscribers.get(node_id, ()))
