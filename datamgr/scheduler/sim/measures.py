"""Per-sample measures of the cluster: Gavel's fairness ratio.

A job's fairness ratio is its current training rate over the rate SiloDPerf predicts for it under an equal
share of the cluster among the N jobs present (arrived and unfinished, running or queued):
    equal = SiloDPerf(f*(job) x min(1, (G / N) / job GPUs),  c = C / N,  d,  b = B / N)
with G the cluster's GPUs, C its cache bytes and B its remote IO limit; the GPU share is fractional and
capped at the job's demand, the cache share is worth at most the whole dataset (c/d is clamped at 1). A ratio
of 1 means the job does as well as it would on its equal share, as in Gavel's max-min objective (the
paper's Eq. 9). Only running jobs are measured (a queued job's ratio would be 0 whatever the cluster does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from datamgr.scheduler import perf
from datamgr.scheduler.sim.model import ClusterSpec


@dataclass(frozen=True, slots=True)
class EqualShare:
    """One job's share of the cluster when `jobs` jobs split it equally."""

    gpus: float
    cache_bytes: float
    io_bytes_per_sec: float

    @classmethod
    def of(cls, cluster: ClusterSpec, jobs: int) -> EqualShare:
        if jobs < 1:
            raise ValueError(f"an equal share needs at least one job, not {jobs}")
        return cls(cluster.total_gpus / jobs, cluster.total_cache_bytes / jobs, cluster.remote_io_bytes_per_sec / jobs)

    def rate(self, ideal_bytes_per_sec: float, gpus: int, dataset_bytes: float) -> float:
        """SiloDPerf of a job (f* on all its `gpus`) on this share."""
        ideal = ideal_bytes_per_sec * min(1.0, self.gpus / gpus)
        return perf.silod_perf(ideal, self.cache_bytes, dataset_bytes, self.io_bytes_per_sec)


class EqualShareRates:
    """`EqualShare.of(cluster, jobs).rate(...)`, remembered per job shape while the number of jobs stays the
    same: the timeline samples fairness every minute over every running job, and the equal share changes
    only when a job arrives or finishes (and most jobs share a shape: f*, GPUs and dataset size)."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self._cluster = cluster
        self._jobs = 0
        self._share: EqualShare | None = None
        self._rates: dict[tuple[float, int, float], float] = {}

    def rate(self, jobs: int, ideal_bytes_per_sec: float, gpus: int, dataset_bytes: float) -> float:
        """SiloDPerf of a job (f* on all its `gpus`) on its equal share among `jobs` jobs."""
        if jobs != self._jobs or self._share is None:
            self._jobs, self._share, self._rates = jobs, EqualShare.of(self._cluster, jobs), {}
        key = (ideal_bytes_per_sec, gpus, dataset_bytes)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = self._share.rate(ideal_bytes_per_sec, gpus, dataset_bytes)
        return rate


@dataclass(frozen=True, slots=True)
class Fairness:
    minimum: float
    mean: float


def fairness(ratios: Iterable[float], jobs_waiting: bool) -> Fairness:
    """Min and mean of the running jobs' ratios. With none running: 0 if jobs wait (none gets anything),
    1 if the cluster is empty (no one is treated unfairly)."""
    values = list(ratios)
    if not values:
        empty = 0.0 if jobs_waiting else 1.0
        return Fairness(empty, empty)
    return Fairness(min(values), sum(values) / len(values))


Shape = tuple[float, int, float]  # (f* on all its GPUs, GPUs, dataset bytes): what a job's equal share depends on


class EqualShareWork:
    """What a job of each shape present would have read so far on an equal share of the cluster, integrated
    over time as the number of present jobs changes.

    A job's lifetime fairness ratio is the bytes it read over the bytes its equal share would have read
    between its arrival and its finish (`at_arrival` and `since`): Gavel's ratio over the job's whole stay,
    the time it waited in a queue included, when its rate there was 0. The per-sample ratio measures only
    running jobs, against a share that shrinks as a queue grows, so a cluster that queues looks fairer by it;
    this one charges the wait to the job that waited. Only the shapes of present jobs are integrated, a
    handful in a generated trace, so a change of the job count costs one step per shape.
    """

    def __init__(self, cluster: ClusterSpec) -> None:
        self._rates = EqualShareRates(cluster)
        self._work: dict[Shape, float] = {}
        self._holders: dict[Shape, int] = {}
        self._jobs = 0
        self._at = 0.0

    def arrive(self, shape: Shape, now: float) -> float:
        """A job of `shape` arrives at `now`; returns the integral's value for it to subtract at its finish."""
        self._advance(now)
        self._work.setdefault(shape, 0.0)
        self._holders[shape] = self._holders.get(shape, 0) + 1
        self._jobs += 1
        return self._work[shape]

    def finish(self, shape: Shape, now: float, at_arrival: float) -> float:
        """A job of `shape` that arrived when the integral stood at `at_arrival` finishes at `now`; returns the
        bytes its equal share would have read over its stay."""
        self._advance(now)
        work = self._work[shape] - at_arrival
        self._jobs -= 1
        self._holders[shape] -= 1
        if not self._holders[shape]:
            del self._holders[shape], self._work[shape]
        return work

    def _advance(self, now: float) -> None:
        elapsed = now - self._at
        self._at = now
        if elapsed > 0.0 and self._jobs:
            for shape in self._work:
                self._work[shape] += self._rates.rate(self._jobs, *shape) * elapsed
