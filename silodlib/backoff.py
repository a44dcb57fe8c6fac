"""Exponential backoff with jitter: how long to wait before trying again, for everything that retries.

After the n-th failure in a row the wait is drawn uniformly from [`floor` x cap, cap], where the cap is
min(`max_delay`, `base_delay` x 2^(n-1)). The randomness keeps the many nodes that lost the same endpoint at
the same moment from coming back in lockstep: full jitter (`floor` 0, what storage retries use) spreads them
most; keeping half of the cap (`floor` 0.5, what the node agent's reconnects use) guarantees a pause while
still spreading them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_DEFAULT_RNG = random.Random()


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
