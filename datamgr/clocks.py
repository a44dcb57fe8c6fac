"""The data manager's wall clock: read from the system once, then moved on by the monotonic clock.

Jobs' histories are stamped with wall-clock times (`lifecycle`), because they outlive the process: a restarted
data manager resumes a grace period or a queue wait where it was. But policies act on their differences: when a
grace period is over, how much GPU time a job has attained (Tiresias), the submission order (FIFO), how long a
job has been present (Gavel). Stamped straight from the system clock, a step of it (an NTP step, a VM resumed
from suspend, an operator setting the date) moved them all: a day's step back held a preempted job's GPUs for a
day and let a later job jump the queue; a day's step forward charged a running job a day of GPU time and cut a
grace period short (its checkpoint lost). So within a process the data manager's clock advances with
CLOCK_MONOTONIC, which no step moves and which NTP slews at the same rate as the wall clock; it is read from the
system's wall clock at the start. After a step, its times differ from the system's by the step until the next
start (log lines are stamped by the system clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class SteadyWallClock:
    """Seconds since the epoch: the system's wall clock when made, advanced since by the monotonic clock."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._start = monotonic()
        self._anchor = wall()

    def __call__(self) -> float:
        return self._anchor + (self._monotonic() - self._start)
