"""How a cache serves a job's reads: the interface the engine drives and the model each cache system runs.

The access patterns the models serve are in `access.py`.

Models (`engine.cache_model_for`): `alluxio` runs one LRU pool over the whole cluster cache
(`lru.LruPool`); every other cache system runs uniform caching (`uniform.UniformCache`) with the
decision's shape choosing the space a job reads through: the dataset's shared quota
(`Decision.cache_bytes`, SiloD and Quiver) or, for a job listed in `Decision.job_cache_bytes`, a private
copy of its own (CoorDL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from datamgr.scheduler.sim.jobs import JobRun

LRU_CACHE_SYSTEMS = frozenset({"alluxio"})  # cache systems that manage one pool by LRU rather than by quotas


@dataclass(frozen=True, slots=True)
class CacheTotals:
    """The whole cache at one instant: bytes held, and bytes running jobs can hit in their current segment.

    Effective bytes, per cache space (a dataset's shared cache, a private copy, a dataset's chunks in an LRU
    pool): the largest `hit_ratio x region bytes` among its running readers, at most the bytes it holds;
    summed over spaces. It is the cache size that would give that job its current hit ratio under c/d, so
    the gap to `cached_bytes` is what delayed effectiveness (and LRU's evictions) cost.
    """

    cached_bytes: float
    effective_bytes: float


class CacheModel(Protocol):
    """A cache system's behaviour, as the engine drives it.

    The engine calls `allocate` after each policy round (with the decision's storage part and the jobs
    that run after it; it returns the jobs whose segment hit ratio it changed, as a quota shrink or a move
    to another cache space does, so the engine recomputes their rates and no others'), `begin_segment` when
    a running job starts reading or finishes a segment (the model sets `job.segment`), `fetching` whenever
    a job's segment or remote rate changes (so fills follow what is fetched), and `release` when a job
    finishes. The read-only queries never change the model's state, so sampling the timeline cannot change
    a run.
    """

    def allocate(
        self, now: float, cache_bytes: Mapping[str, int], job_cache_bytes: Mapping[str, int], running: Iterable[JobRun]
    ) -> list[JobRun]: ...

    def begin_segment(self, job: JobRun, now: float) -> None: ...

    def fetching(self, job: JobRun, now: float) -> None: ...

    def release(self, job: JobRun, now: float) -> None: ...

    def cached_bytes(self, now: float) -> dict[str, float]:
        """Bytes cached per dataset now, over all the spaces that hold its items."""
        ...

    def quota_bytes(self) -> Mapping[str, int]:
        """The shared cache quota per dataset ({} for a model without quotas)."""
        ...

    def totals(self, now: float) -> CacheTotals:
        """What the cache holds now, all told, for the timeline."""
        ...
