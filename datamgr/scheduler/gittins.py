"""The Gittins index of a job's attained service under a known distribution of job service (Tiresias, §3.2.2).

    G(a) = sup over D > 0 of  P(S - a <= D | S > a) / E[min(S - a, D) | S > a]

where S is a job's total service (GPU-seconds, drawn from the distribution), a the service it has attained
and D the service quantum: the chance that the job finishes within the next D, per unit of service it is
expected to use trying. A higher index means a higher priority.

Discretized 2D-Gittins fixes the quantum per queue: for a job in queue i it is that queue's upper threshold
(the paper: "for jobs in Q_i, D_i equals Q_i^hi"; read literally, so the window is [a, a + Q_i^hi], not the
service left before demotion). Without discretization the supremum is taken; over an empirical distribution
it is reached where a + D is one of the observed services, since between them the numerator stays put and the
denominator grows.

The distribution is a weighted sample (`ServiceDistribution`), kept sorted with prefix sums so a fixed-quantum
index costs two bisections. A job that has attained more than any observed service has index 0: nothing in
the history says when it ends.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from itertools import accumulate


class ServiceDistribution:
    """Observed job services (GPU-seconds) with weights (their probabilities, up to a common factor)."""

    __slots__ = ("_mass", "_services", "_weighted")

    def __init__(self, services: Sequence[float], weights: Sequence[float] | None = None) -> None:
        if weights is None:
            weights = [1.0] * len(services)
        if len(weights) != len(services):
            raise ValueError(f"{len(services)} services but {len(weights)} weights")
        pairs = sorted(zip(services, weights, strict=True))
        if not pairs:
            raise ValueError("a service distribution needs at least one observed service")
        for service, weight in pairs:
            if not (service > 0 and math.isfinite(service)):
                raise ValueError(f"a job's service must be a positive number of GPU-seconds, not {service!r}")
            if not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"a service's weight must be positive, not {weight!r}")
        self._services = [service for service, _ in pairs]
        # _mass[k], _weighted[k]: the weight and the weighted service of the k smallest services.
        self._mass = [0.0, *accumulate(weight for _, weight in pairs)]
        self._weighted = [0.0, *accumulate(service * weight for service, weight in pairs)]

    @property
    def services(self) -> tuple[float, ...]:
        return tuple(self._services)

    def index(self, attained: float, quantum: float) -> float:
        """G at `attained` for one quantum D = `quantum` (discretized 2D-Gittins)."""
        first = bisect.bisect_right(self._services, attained)  # the services above `attained` start here
        if first == len(self._services):
            return 0.0
        end = bisect.bisect_right(self._services, attained + quantum)
        return self._ratio(attained, first, end, quantum)

    def supremum(self, attained: float) -> float:
        """G at `attained`, the supremum over every quantum (2D-Gittins without discretization)."""
        first = bisect.bisect_right(self._services, attained)
        best = 0.0
        for end in range(first + 1, len(self._services) + 1):
            best = max(best, self._ratio(attained, first, end, self._services[end - 1] - attained))
        return best

    def _ratio(self, attained: float, first: int, end: int, quantum: float) -> float:
        """P(done within the quantum) / E[service used in it], both given S > attained, where the services
        [first, end) end within the quantum and the rest outlast it."""
        finishing = self._mass[end] - self._mass[first]
        if finishing <= 0.0:
            return 0.0
        used_by_finishing = self._weighted[end] - self._weighted[first] - attained * finishing
        used_by_rest = (self._mass[-1] - self._mass[end]) * quantum
        return finishing / (used_by_finishing + used_by_rest)  # the common 1 / P(S > a) cancels
