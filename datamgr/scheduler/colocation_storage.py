"""Cache and remote IO for co-located jobs that read their input from remote storage (the SiloD variant), pure.

Harmony's jobs keep their input in memory; silod's read it each iteration from remote storage through a
shared cache. A job reads `read_bytes` per iteration from a dataset of `dataset_bytes`; with `c` bytes of that
dataset cached uniformly, a share c/d of its reads hit (SiloD's uniform caching) and the rest, r_j bytes per
iteration, come from remote storage at the rate b_j the job is given, so its loading takes

    T_load_j = r_j / b_j = read_j (1 - c_D / d_D) / b_j

prefetched alongside its COMP and COMM (colocation.py: its own iteration is max(T_cpu + T_net, T_load)). At
its group's iteration without loading, T_g0 (Eq. 1), a job reads at most f*_j = read_j / T_g0 (SiloD's f*),
and needs r_j / T_g0 of remote IO to keep up. A group iterates in lockstep, so the job whose loading is slowest
sets the pace of all of them.

Two allocations, both for the whole cluster at once:

- `fair_storage`, what a storage-oblivious scheduler gets: the cache split equally among the datasets being
  read (an equal share capped at the dataset's size, the rest shared again), and remote IO shared max-min
  fairly among the jobs up to each one's need (work-conserving, as flows share a link). A group's fast
  loaders then hold IO they cannot turn into progress while its slowest one holds the group up.
- `silod_storage`, SiloD's: the cache goes first to the datasets that save the most remote IO per cached
  byte, sum_{j reads D} f*_j / d_D (SiloD's cache efficiency: the marginal gain of its estimator
  min(f*, b / (1 - c/d)) where IO is the bottleneck), each up to its size. Remote IO is then shared max-min
  fairly as SiloD shares it (its Algorithm 2), but among whole groups, each up to its need R_g / T_g0
  (R_g = sum r_j), and within a group in proportion to r_j so that its jobs' loads take equally long: the
  group progresses as one, so IO a fast loader holds beyond its slowest sibling's pace is wasted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from datamgr.scheduler.colocation import Group, resource_times
from datamgr.scheduler.perf import cache_efficiencies
from datamgr.scheduler.sharing import fill_in_order, water_fill


@dataclass(frozen=True, slots=True)
class DataNeed:
    """What one job reads: `read_bytes` per iteration of `dataset` (`dataset_bytes` in all)."""

    read_bytes: float
    dataset: str
    dataset_bytes: int


@dataclass(frozen=True, slots=True)
class StorageShare:
    """Cache bytes per dataset and remote IO bytes/s per job."""

    cache_bytes: Mapping[str, int]
    io_bytes_per_sec: Mapping[str, float]

    def hit_ratio(self, need: DataNeed) -> float:
        if need.dataset_bytes <= 0:
            return 1.0
        return min(1.0, self.cache_bytes.get(need.dataset, 0) / need.dataset_bytes)

    def remote_bytes(self, need: DataNeed) -> float:
        """r_j: what one iteration reads from remote storage."""
        return need.read_bytes * (1.0 - self.hit_ratio(need))

    def load_seconds(self, job_id: str, need: DataNeed) -> float:
        """T_load_j (module docstring): 0 when it reads nothing remote, infinite when it must and has no IO."""
        remote = self.remote_bytes(need)
        if remote <= 0:
            return 0.0
        rate = self.io_bytes_per_sec.get(job_id, 0.0)
        return remote / rate if rate > 0 else math.inf


NO_STORAGE = StorageShare({}, {})


def full_speed_rates(groups: Sequence[Group], needs: Mapping[str, DataNeed]) -> dict[str, float]:
    """f*_j: each job's read rate if loading never held it up (its read bytes over its group's T_g0)."""
    rates: dict[str, float] = {}
    for group in groups:
        iteration = resource_times(group.jobs, group.machines).iteration
        for job_id in group.job_ids:
            need = needs.get(job_id)
            if need is not None and need.read_bytes > 0:
                rates[job_id] = need.read_bytes / iteration
    return rates


def fair_storage(
    groups: Sequence[Group], needs: Mapping[str, DataNeed], cache_bytes: int, io_bytes_per_sec: float
) -> StorageShare:
    """The storage-oblivious allocation (module docstring)."""
    rates = full_speed_rates(groups, needs)
    cache = water_fill(_dataset_sizes(rates, needs), cache_bytes)
    demands = _io_demands(rates, needs, cache)
    io = {job: math.inf for job in demands} if math.isinf(io_bytes_per_sec) else water_fill(demands, io_bytes_per_sec)
    return StorageShare(cache, io)


def silod_storage(
    groups: Sequence[Group], needs: Mapping[str, DataNeed], cache_bytes: int, io_bytes_per_sec: float
) -> StorageShare:
    """SiloD's allocation (module docstring): cache by efficiency, then remote IO to groups by progress per byte."""
    rates = full_speed_rates(groups, needs)
    sizes = _dataset_sizes(rates, needs)
    efficiency = cache_efficiencies(((needs[job_id].dataset, rate) for job_id, rate in rates.items()), sizes)
    cache = fill_in_order({name: sizes[name] for name in sorted(sizes, key=lambda n: (-efficiency[n], n))}, cache_bytes)
    demands = _io_demands(rates, needs, cache)
    if math.isinf(io_bytes_per_sec):
        return StorageShare(cache, {job: math.inf for job in demands})
    return StorageShare(cache, _io_by_group(groups, demands, io_bytes_per_sec))


def _io_by_group(groups: Sequence[Group], demands: Mapping[str, float], total: float) -> dict[str, float]:
    """Remote IO shared max-min fairly among groups up to each group's need, split by need within a group."""
    members = {
        str(index): [job_id for job_id in group.job_ids if demands.get(job_id, 0.0) > 0]
        for index, group in enumerate(groups)
    }
    needs = {index: sum(demands[job_id] for job_id in jobs) for index, jobs in members.items()}
    shares = water_fill({index: need for index, need in needs.items() if need > 0}, total)
    io: dict[str, float] = dict.fromkeys(demands, 0.0)
    for index, share in shares.items():
        for job_id in members[index]:
            io[job_id] = share * demands[job_id] / needs[index]
    return io


class ObliviousStorage:
    """The storage side of a co-location policy that allocates none itself: `fair_storage`."""

    def allocate_storage(
        self, groups: Sequence[Group], needs: Mapping[str, DataNeed], cache_bytes: int, io_bytes_per_sec: float
    ) -> StorageShare:
        return fair_storage(groups, needs, cache_bytes, io_bytes_per_sec)


def _dataset_sizes(rates: Mapping[str, float], needs: Mapping[str, DataNeed]) -> dict[str, int]:
    return {needs[job_id].dataset: needs[job_id].dataset_bytes for job_id in rates}


def _io_demands(
    rates: Mapping[str, float], needs: Mapping[str, DataNeed], cache: Mapping[str, int]
) -> dict[str, float]:
    """Each reading job's remote IO need at full speed: f*_j times its miss ratio."""
    share = StorageShare(cache, {})
    return {job_id: rate * (1.0 - share.hit_ratio(needs[job_id])) for job_id, rate in rates.items()}
