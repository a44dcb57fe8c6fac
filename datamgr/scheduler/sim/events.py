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
from typing import Any, NamedTuple


class EventKind(IntEnum):
    """What happens, in the order events of one instant run."""

    JOB = 0  # a running job reaches the end of a segment of its reads (epoch, stage, LRU window) or finishes
    ARRIVAL = 1  # a trace job is submitted
    ROUND = 2  # the policy decides (periodically, and after arrivals and finishes)
    SAMPLE = 3  # the timeline records the cluster


class Event(NamedTuple):
    """A scheduled happening. A named tuple rather than a frozen dataclass: a run schedules one at every job
    rate change, about a million in a simulated month, and a tuple is built at half the cost."""

    time: float
    kind: EventKind
    payload: Any = None  # the engine's; `Any`, as mypyc (setup.py) cannot build a named tuple with an `object` field


class EventQueue:
    """The clock and its future events, earliest first; popping one advances `now` to its time (never
    backwards)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()
        self._now = 0.0

    @property
    def now(self) -> float:
        return self._now

    def schedule(self, time: float, kind: EventKind, payload: object = None) -> None:
        """Add an event; one in the past is an error, as it would break the integration of rates over time."""
        if time < self._now:
            raise ValueError(f"cannot schedule a {kind.name} event at {time}, before the current time {self._now}")
        heapq.heappush(self._heap, (time, kind, next(self._seq), Event(time, kind, payload)))

    def pop(self) -> Event:
        """The earliest event, removed; the clock moves to its time. Raises IndexError when none is left."""
        event = heapq.heappop(self._heap)[3]
        self._now = event.time
        return event

    def peek_time(self) -> float | None:
        """When the next event happens, or None if none is scheduled."""
        return self._heap[0][0] if self._heap else None
