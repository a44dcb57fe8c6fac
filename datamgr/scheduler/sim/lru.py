"""Alluxio's cache: one pool of the whole cluster cache shared by every job and evicted least recently used,
modelled chunk by chunk (no c/d formula: the hit ratio is whatever LRU makes of the jobs' read orders).

Chunks: each dataset is cut into `STAGES x k` equal chunks of at least `SimConfig.chunk_bytes`, with at
most `SimConfig.max_chunks_per_dataset` chunks (so big datasets get bigger chunks: cost stays bounded).
Each pass a job makes over its region (an epoch over the whole dataset, or a curriculum stage's bin) is a
fresh permutation of the region's chunks drawn from a generator seeded by the run's seed and the job's id.

Windows: a pass is read in `WINDOWS_PER_PASS` windows of consecutive chunks of the permutation. When a job
starts a window, its chunks are looked up in the pool in order (a hit moves the chunk to the most recently
used end; a miss inserts it there and evicts least recently used chunks, of any dataset, until the pool
fits), and the window's hit ratio is its share of hits; the job then reads the window at that ratio. Jobs
start windows in event-time order, so the accesses of all jobs interleave in time at window granularity.
A quota in the decision does not apply: the pool is the whole cache (Alluxio's decision sets none).

Under shuffled epochs the chunks LRU keeps are the ones just read, which the job will not need again until
its next epoch: with a pool of half a dataset, a lone job's steady hit ratio is well below the 0.5 that
uniform caching gives.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import numpy as np

from datamgr.scheduler.sim.access import STAGES, Region, region_of
from datamgr.scheduler.sim.caches import CacheTotals
from datamgr.scheduler.sim.jobs import JobRun, Segment
from datamgr.scheduler.sim.model import SimConfig

WINDOWS_PER_PASS = 4


class _Chunking:
    """How one dataset is cut into chunks, and how many of them the pool holds."""

    __slots__ = ("chunk_bytes", "dataset", "dataset_bytes", "index", "per_bin", "pool_bytes", "readers", "resident")

    def __init__(self, dataset: str, index: int, dataset_bytes: int, chunk_bytes: int, max_chunks: int) -> None:
        self.dataset = dataset
        self.index = index
        self.dataset_bytes = dataset_bytes
        wanted = math.ceil(dataset_bytes / (chunk_bytes * STAGES))
        self.per_bin = max(1, min(wanted, max_chunks // STAGES))
        self.chunk_bytes = dataset_bytes / (STAGES * self.per_bin)  # what a job reads per chunk
        self.pool_bytes = max(1, math.floor(self.chunk_bytes))  # what a chunk takes in the pool (whole bytes)
        self.resident = 0  # chunks in the pool
        self.readers = 0  # unfinished jobs that read it

    def region_chunks(self, region: Region) -> range:
        return range(region.first_bin * self.per_bin, (region.first_bin + region.bins) * self.per_bin)


class _PassWalk:
    """A job's walk through its current pass: the permutation, how far it has got, and its window size."""

    __slots__ = ("chunking", "job", "order", "position", "region", "rng", "window")

    def __init__(self, job: JobRun, chunking: _Chunking, seed: int) -> None:
        self.job = job
        self.chunking = chunking
        self.rng = np.random.default_rng([seed, zlib.crc32(job.job_id.encode())])
        self.order: list[int] = []
        self.position = 0
        self.region = region_of(job)
        self.window = 1

    def next_window(self) -> list[int]:
        """The chunks of the job's next window, starting a fresh pass when the last one is done or the job's
        curriculum moved to another stage."""
        region = region_of(self.job)
        if self.position >= len(self.order) or (region.first_bin, region.bins) != (
            self.region.first_bin,
            self.region.bins,
        ):
            chunks = self.chunking.region_chunks(region)
            self.order = (self.rng.permutation(len(chunks)) + chunks.start).tolist()
            self.position = 0
            self.window = math.ceil(len(chunks) / WINDOWS_PER_PASS)
        self.region = region
        window = self.order[self.position : self.position + self.window]
        self.position += len(window)
        return window


class LruPool:
    """One LRU pool of `capacity_bytes` shared by every job (see the module doc)."""

    def __init__(self, capacity_bytes: int, config: SimConfig) -> None:
        self._capacity = capacity_bytes
        self._chunk_bytes = config.chunk_bytes
        self._max_chunks = config.max_chunks_per_dataset
        self._seed = config.seed
        self._pool: OrderedDict[int, int] = OrderedDict()  # chunk key -> pool bytes, least recently used first
        self._used = 0
        self._datasets: dict[str, _Chunking] = {}  # datasets with chunks in the pool or jobs reading them
        self._by_index: dict[int, _Chunking] = {}  # the same, by the index their chunk keys carry
        self._indices = itertools.count()
        self._readers: dict[str, _PassWalk] = {}

    def allocate(
        self, now: float, cache_bytes: Mapping[str, int], job_cache_bytes: Mapping[str, int], running: Iterable[JobRun]
    ) -> list[JobRun]:
        """Nothing to apply: the pool is the whole cache, whatever quotas a decision names."""
        return []

    def begin_segment(self, job: JobRun, now: float) -> None:
        reader = self._readers.get(job.job_id)
        if reader is None:
            reader = self._readers[job.job_id] = _PassWalk(job, self._chunking(job), self._seed)
        window = reader.next_window()
        hits = self._touch(reader.chunking, window)
        read = len(window) * reader.chunking.chunk_bytes
        job.segment = Segment(hits / len(window), min(read, reader.region.bytes_to_stage_end))

    def fetching(self, job: JobRun, now: float) -> None:
        """Nothing to track: what a window fetches was admitted when the window was looked up."""

    def release(self, job: JobRun, now: float) -> None:
        reader = self._readers.pop(job.job_id, None)
        if reader is not None:
            reader.chunking.readers -= 1
            self._forget_if_unused(reader.chunking)

    def cached_bytes(self, now: float) -> dict[str, float]:
        return {dataset: float(c.resident * c.pool_bytes) for dataset, c in self._datasets.items()}

    def quota_bytes(self) -> Mapping[str, int]:
        return {}

    def totals(self, now: float) -> CacheTotals:
        best: dict[str, float] = {}
        for reader in self._readers.values():
            job = reader.job
            if job.running and job.segment is not None:
                region_bytes = reader.region.fraction * reader.chunking.dataset_bytes
                dataset = job.trace.dataset
                best[dataset] = max(best.get(dataset, 0.0), job.segment.hit_ratio * region_bytes)
        chunkings = self._datasets
        effective = sum(min(bytes_, chunkings[d].resident * chunkings[d].pool_bytes) for d, bytes_ in best.items())
        return CacheTotals(float(self._used), effective)

    def _chunking(self, job: JobRun) -> _Chunking:
        chunking = self._datasets.get(job.trace.dataset)
        if chunking is None:
            index = next(self._indices)
            chunking = _Chunking(job.trace.dataset, index, job.trace.dataset_bytes, self._chunk_bytes, self._max_chunks)
            self._datasets[job.trace.dataset] = self._by_index[index] = chunking
        chunking.readers += 1
        return chunking

    def _forget_if_unused(self, chunking: _Chunking) -> None:
        """Drop a dataset nothing refers to any more, so per-sample work follows the live datasets only."""
        if chunking.resident == 0 and chunking.readers == 0:
            del self._datasets[chunking.dataset]
            del self._by_index[chunking.index]

    def _touch(self, chunking: _Chunking, chunks: list[int]) -> int:
        """Look `chunks` up in order, as one job reads them; returns how many were hits."""
        pool = self._pool
        base = chunking.index << 32
        size = chunking.pool_bytes
        hits = 0
        for chunk in chunks:
            key = base | chunk
            if key in pool:
                pool.move_to_end(key)
                hits += 1
                continue
            pool[key] = size
            self._used += size
            chunking.resident += 1
            while self._used > self._capacity:
                evicted, evicted_size = pool.popitem(last=False)
                self._used -= evicted_size
                owner = self._by_index[evicted >> 32]
                owner.resident -= 1
                self._forget_if_unused(owner)
        return hits
