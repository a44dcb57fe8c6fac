"""SiloD's greedy storage allocation (the paper's Algorithm 2).

Cache: datasets in descending cache efficiency (the sum of f*/d over the jobs that read them), each given up
to its size while capacity lasts; under uniform caching a dataset's hit ratio is c/d, so a byte of cache is
worth most where f*/d is highest. Remote IO: shared max-min fairly up to what each job needs, f* (1 - c/d)
with c the cache it can hit now (a quota not yet filled, or filled this epoch, does not help yet: "delayed
effectiveness"); what is left is shared out so that no job gets more than it can use (f*).

Pure: no I/O, deterministic. `greedy` is the function over plain demands (the demo calls it directly);
`GreedyStorage` is the same allocation as a storage-only policy over a snapshot's running jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from datamgr.scheduler import perf
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policy import Decision, LazyNotes
from datamgr.scheduler.sharing import fill_in_order, fill_needs_then_caps
from datamgr.scheduler.snapshot import Snapshot


class JobDemand:
    """A job as the greedy policy weighs it: its dataset, f* (the rate it consumes data at when IO is not the
    bottleneck) and the cached bytes of its dataset it can hit now whatever the quota
    (`Snapshot.cache_within_reach`; None: the whole quota, the steady state).

    A plain class, compiled to a native one: `GreedyStorage` builds one per running job every round, and a
    named tuple's or a frozen dataclass's constructor runs as interpreted Python (186 of these took 32 us,
    best of 7 on a cluster400 snapshot). Treat it as immutable."""

    __slots__ = ("cache_within_reach", "dataset_uri", "ideal_bytes_per_sec", "job_id")

    def __init__(
        self, job_id: str, dataset_uri: str, ideal_bytes_per_sec: float, cache_within_reach: float | None = None
    ) -> None:
        self.job_id = job_id
        self.dataset_uri = dataset_uri
        self.ideal_bytes_per_sec = ideal_bytes_per_sec
        self.cache_within_reach = cache_within_reach


@dataclass(frozen=True, slots=True)
class Allocation:
    cache_bytes: Mapping[str, int]  # per dataset
    io_bytes_per_sec: Mapping[str, int]  # per job
    cache_efficiency: Mapping[str, float]  # per dataset: the order the cache was given in


def cache_efficiency(jobs: Sequence[JobDemand], dataset_sizes: Mapping[str, int]) -> dict[str, float]:
    """Sum of f*/d over each dataset's jobs: the throughput one byte of its cache buys."""
    return perf.cache_efficiencies(((j.dataset_uri, j.ideal_bytes_per_sec) for j in jobs), dataset_sizes)


def greedy(
    jobs: Sequence[JobDemand], dataset_sizes: Mapping[str, int], cache_capacity: int, io_limit: float
) -> Allocation:
    """Cache by Algorithm 2; remote IO first max-min fair up to what each job needs with the cache it can hit
    now (its quota, or less while the cache fills: `JobDemand.cache_within_reach`), then the rest shared up
    to f*, which is harmless (a job only pulls what it misses) and covers a cache that is not yet effective."""
    efficiency = cache_efficiency(jobs, dataset_sizes)
    by_efficiency = sorted(dataset_sizes, key=lambda uri: (-efficiency[uri], uri))
    cache = fill_in_order({uri: dataset_sizes[uri] for uri in by_efficiency}, cache_capacity)
    needs: dict[str, float] = {}
    caps: dict[str, float] = {}
    for job in jobs:
        quota = cache[job.dataset_uri]
        hit = quota if job.cache_within_reach is None else min(quota, job.cache_within_reach)
        needs[job.job_id] = perf.remote_demand(job.ideal_bytes_per_sec, hit, dataset_sizes[job.dataset_uri])
        caps[job.job_id] = job.ideal_bytes_per_sec
    return Allocation(cache, fill_needs_then_caps(needs, caps, io_limit), efficiency)


class GreedyStorage:
    """Algorithm 2 as a storage-only policy: compute is left to the cluster scheduler (FIFO in the paper)."""

    name = "greedy"
    storage_only = True  # never decides placements (`registry.FilledIn` relies on it)

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        running = snapshot.running_jobs()
        demands = [
            JobDemand(j.job_id, j.dataset_uri, perf.ideal_rate(j, j.allocated_gpus), snapshot.cache_within_reach(j))
            for j in running
        ]
        sizes = {j.dataset_uri: j.dataset_bytes for j in running}
        plan = greedy(demands, sizes, snapshot.cache_capacity_bytes, snapshot.remote_io_bytes_per_sec)
        notes = LazyNotes(plan.cache_efficiency, _describe)
        return Decision(cache_bytes=plan.cache_bytes, io_bytes_per_sec=plan.io_bytes_per_sec, notes=notes)


def _describe(efficiency: float) -> str:
    return f"cache efficiency {efficiency:.3g}/s"
