"""Exponential backoff with jitter: how long to wait before trying again, for everything that retries.

After the n-th failure in a row the wait is drawn uniformly from [`floor` x cap, cap], where the cap is
min(`max_delay`, `base_delay` x 2^(n-1)). The randomness keeps the many nodes that lost the same endpoint at
the same moment from coming back in lockstep. Full jitter (`floor` 0) spreads them most, but its waits can all
come out near 0: a run of tries against an endpoint that refuses connections (which fails at once) may then be
over within a fraction of its caps. Keeping half of the cap (`floor` 0.5, "equal jitter", what storage retries
and the node agent's reconnects use) guarantees that a run of failures waits at least half its caps in all,
while still spreading the nodes over the other half.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_DEFAULT_RNG = random.Random()

EQUAL_JITTER = 0.5  # the floor that keeps half of each cap


@dataclass(frozen=True, slots=True)
class Backoff:
    base_delay: float
    max_delay: float
    floor: float = 0.0  # the least share of the cap a wait takes

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("backoff delays must be >= 0 seconds")
        if not 0.0 <= self.floor <= 1.0:
            raise ValueError(f"a backoff's floor is a share of its cap, from 0 to 1, not {self.floor}")

    def cap(self, failures: int) -> float:
        """The longest wait after `failures` (1 or more) failures in a row."""
        return min(self.max_delay, self.base_delay * 2.0 ** min(failures - 1, 64))

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """A wait after `failures` failures in a row, drawn from `rng` (default: a shared generator)."""
        cap = self.cap(failures)
        return (rng or _DEFAULT_RNG).uniform(self.floor * cap, cap)

    def total(self, failures: int) -> tuple[float, float]:
        """The least and the most the waits after failures 1 to `failures` in a row add up to, whatever is drawn."""
        caps = sum(self.cap(n) for n in range(1, failures + 1))
        return self.floor * caps, caps
