"""The simulator's clock: a heap of future events keyed (time, priority, seq), SimPy-style. Time is what
the queue says it is (`EventQueue.now`): it moves only by popping the next event.

Nothing outside the engine schedules events; policies never see the clock (a snapshot carries its time),
so no `simulate=True` flag runs through policy code. Events at the same instant run in `EventKind` order,
which is what makes a round see every arrival and finish of its instant, and a sample see the round's
outcome. Ties of kind run in the order they were scheduled (`seq`), so a run is reproducible.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Generic, TypeVar


class EventKind(IntEnum):
    """What happens, in the order events of one instant run."""

    JOB = 0  # a running job reaches the end of a segment of its reads (epoch, stage, LRU window) or finishes
    ARRIVAL = 1  # a trace job is submitted
    ROUND = 2  # the policy decides (periodically, and after arrivals and finishes)
    SAMPLE = 3  # the timeline records the cluster


P = TypeVar("P")  # what the engine attaches to an event


class EventQueue(Generic[P]):
    """The clock and its future events, earliest first; popping one advances `now` to its time (never
    backwards). An event is (time, kind) and a payload of the engine's, which is all `pop` hands back: the
    heap's tuples are the events, with no object built per event (a run schedules about a million)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, P | None]] = []
        self._seq = itertools.count()
        self._now = 0.0

    @property
    def now(self) -> float:
        return self._now

    def schedule(self, time: float, kind: EventKind, payload: P | None = None) -> None:
        """Add an event; one in the past is an error, as it would break the integration of rates over time."""
        if time < self._now:
            raise ValueError(f"cannot schedule a {kind.name} event at {time}, before the current time {self._now}")
        heapq.heappush(self._heap, (time, kind, next(self._seq), payload))

    def pop(self) -> P | None:
        """The earliest event's payload, the event removed and the clock moved to its time. Raises IndexError
        when none is left."""
        time, _, _, payload = heapq.heappop(self._heap)
        self._now = time
        return payload

    def peek_time(self) -> float | None:
        """When the next event happens, or None if none is scheduled."""
        return self._heap[0][0] if self._heap else None
