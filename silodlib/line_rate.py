"""One kind of log line at a rate a log can take: the first at once, then at most one per interval, counting
those left out between. Storage retries (`silodlib.backends.retry`) and failed reads (`fuseclient.failure_log`)
come by the hundred a second in an outage, and each of their lines was once written every time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class LineRate:
    """When a line of one kind was last logged, and how many were left out since."""

    interval: float  # seconds between two lines
    logged_at: float | None = None
    left_out: int = 0

    def due(self, now: float) -> int | None:
        """Whether a line is due at `now`: if so, how many were left out since the last (and it counts as logged
        now); if not, None, and this one counts as left out."""
        if self.logged_at is not None and now - self.logged_at < self.interval:
            self.left_out += 1
            return None
        left_out, self.left_out, self.logged_at = self.left_out, 0, now
        return left_out
