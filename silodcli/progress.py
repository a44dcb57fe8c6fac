"""A progress line on a terminal for long simulations (`silod sim`, `compare`, `sweep`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from datamgr.scheduler.sim.fields import format_duration


class ProgressLine:
    """A progress line on a terminal for long runs: simulated time reached, jobs done, wall time elapsed.

    Nothing until the run has taken `delay` seconds, then redrawn in place at most every `delay` seconds; on
    `close`, the final numbers and a newline. Nothing at all when `stream` (stderr by default) is not a
    terminal: a log file or a CI job would gain a line a second that nobody reads. Called by the engine as
    `progress(sim_time, finished_jobs, total_jobs)`."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        delay: float = 1.0,
    ) -> None:
        self._label = label
        self._stream = stream or sys.stderr  # looked up now: a test may have replaced it
        self._live = self._stream.isatty()
        self._clock = clock
        self._delay = delay
        self._started = self._last = clock()
        self._latest = (0.0, 0, 0)
        self._width = 0  # of the line drawn last, which a shorter one must cover

    def __call__(self, sim_time: float, finished: int, total: int) -> None:
        if not self._live:
            return
        self._latest = (sim_time, finished, total)
        now = self._clock()
        if now - self._last >= self._delay:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        sim_time, finished, total = self._latest
        line = (
            f"{self._label}: {format_duration(sim_time)} simulated, {finished}/{total} jobs done, "
            f"{now - self._started:.0f} s elapsed"
        )
        self._stream.write("\r" + line.ljust(self._width))
        self._stream.flush()
        self._width = len(line)

    def close(self) -> None:
        if self._width:
            self._draw(self._clock())
            self._stream.write("\n")
            self._stream.flush()
