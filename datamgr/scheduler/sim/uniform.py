"""Uniform caching with quotas (SiloD, Quiver) and with private per-job copies (CoorDL), in expected values.

A cache space is a quota and the bytes cached in it: a dataset's shared cache, read by every job of the
dataset that has no private copy, or one job's private copy. The space follows the paper's uniform caching:
- Admission: every byte a reader fetches is admitted while the space is under quota; once full, nothing
  is evicted and further misses are not cached. A quota increase evicts nothing.
- Shrink: a quota below the cached bytes evicts at once, uniformly at random, down to the quota; every
  reader's hit ratio shrinks by the same factor (its effective items are evicted at the space's rate).
- Items: a space tracks its cached bytes per difficulty bin (`access.STAGES`), so curriculum readers see
  the bytes of their stage; fills of regular readers spread over the bins in proportion to each bin's
  uncached bytes (they fetch uniformly random uncached items), a curriculum reader's fills land in its bin.

Delayed effectiveness, per reader and per segment (a regular job's epoch, a curriculum job's pass):
- At the start of a segment every byte cached in the reader's region is effective: its hit ratio for the
  whole segment is `cached bytes of the region / region bytes` (the c/d of the paper, taken now).
- Bytes cached during the segment help the reader only from its next segment, whoever caches them: the
  reader's own fills are items it has just read (they cannot recur this epoch), and items another job
  sharing the space caches mid-segment are counted for this reader from its next segment too. This keeps
  each reader's rate constant between events; the price is that two jobs in overlapping first epochs of a
  shared dataset each fetch items the other has just cached, and the model admits both fetches as distinct
  items, so during such an overlap the shared cache fills up to twice as fast as it really would and each
  job's hit ratio is lower than it really is, until its next epoch.
- A job that moves to another space mid-segment (a private copy granted or withdrawn) finds that space's
  items randomly placed in its read order: hit ratio `cached bytes of the region / region bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from datamgr.scheduler.sim.access import STAGES, Region, region_of
from datamgr.scheduler.sim.caches import CacheTotals
from datamgr.scheduler.sim.jobs import JobRun, Segment


class _Space:
    """One uniformly cached set of a dataset's items under a quota, filled by its readers' fetches.

    Between changes of its readers' fetch rates it fills linearly until the quota, so its contents at any
    time follow from the last settled state without stepping through time.
    """

    __slots__ = (
        "bin_bytes",
        "bin_fetch",
        "cached",
        "dataset",
        "held",
        "quota",
        "readers",
        "recounted",
        "settled_at",
        "total_fetch",
        "whole_fetch",
    )

    def __init__(self, dataset: str, dataset_bytes: int, now: float) -> None:
        self.dataset = dataset
        self.bin_bytes = dataset_bytes / STAGES
        self.quota = 0.0
        self.cached = [0.0] * STAGES
        self.held = 0.0  # sum(cached)
        self.settled_at = now
        self.whole_fetch = 0.0  # bytes/s fetched by readers of the whole dataset
        self.bin_fetch = [0.0] * STAGES  # bytes/s fetched by curriculum readers, per bin
        self.total_fetch = 0.0
        self.readers: dict[str, _PlacedReader] = {}
        self.recounted = True  # the fetch rates are what `recount_fetches` would make them

    def filling(self, now: float) -> bool:
        """Whether the space has gained bytes since it was last settled."""
        return now > self.settled_at and self.total_fetch > 0.0 and self.held < self.quota

    def held_at(self, now: float) -> float:
        """Cached bytes at `now`, without changing the space."""
        if not self.filling(now):
            return self.held
        if self.total_fetch == self.whole_fetch:  # only whole-dataset readers: their fills spread over all bins
            free = STAGES * self.bin_bytes - self.held
            return self.held + min(self.quota - self.held, free, self.whole_fetch * (now - self.settled_at))
        return sum(self._filled(now))

    def settle(self, now: float) -> None:
        if self.filling(now):
            self._hold(self._filled(now))
        if now > self.settled_at:
            self.settled_at = now

    def _filled(self, now: float) -> list[float]:
        """Cached bytes per bin at `now` (no earlier than the last settle) of a filling space, without changing
        it.

        Worked out at every change of a reader's fetch rate and at every sample, over a space per running job
        under coordl or with unshared datasets: each bin's inflow is clamped as it is worked out."""
        elapsed = now - self.settled_at
        bin_bytes, whole = self.bin_bytes, self.whole_fetch
        uncached = [max(0.0, bin_bytes - c) for c in self.cached]
        free = sum(uncached)
        if free <= 0.0:
            return self.cached
        inflow = [  # no bin fills beyond its size
            min(u, (whole * u / free + f) * elapsed) for u, f in zip(uncached, self.bin_fetch, strict=True)
        ]
        total = sum(inflow)
        scale = (self.quota - self.held) / total if total > 0.0 else 0.0
        scale = min(1.0, scale)  # the quota stops admissions
        return [c + i * scale for c, i in zip(self.cached, inflow, strict=True)]

    def set_quota(self, quota: float, now: float) -> list[JobRun]:
        """A new quota (after `settle`); a shrink evicts uniformly at random at once. Returns the readers
        whose segment hit ratio it lowered."""
        self.quota = float(quota)
        if self.held <= self.quota:
            return []
        factor = self.quota / self.held
        self._hold([c * factor for c in self.cached])
        lowered = []
        for reader in self.readers.values():
            if reader.job.segment is not None:
                reader.job.segment.hit_ratio *= factor
                lowered.append(reader.job)
        return lowered

    def region_bytes(self, region: Region) -> float:
        return self.bin_bytes * region.bins

    def region_cached(self, region: Region) -> float:
        return sum(self.cached[region.first_bin : region.first_bin + region.bins])

    def add_fetch(self, region: Region, rate: float) -> None:
        self.replace_fetch(region, 0.0, rate)

    def replace_fetch(self, region: Region, old: float, new: float) -> None:
        """A reader of `region` fetching `new` bytes/s instead of `old`: `add_fetch(region, -old)` then
        `add_fetch(region, new)`, the same sums in one call (the engine changes a rate tens of times a round)."""
        if region.bins == STAGES:
            self.whole_fetch = max(0.0, max(0.0, self.whole_fetch - old) + new)
        else:
            bin_fetch = self.bin_fetch
            bin_fetch[region.first_bin] = max(0.0, max(0.0, bin_fetch[region.first_bin] - old) + new)
        self.total_fetch = self.whole_fetch + sum(self.bin_fetch)
        self.recounted = False

    def recount_fetches(self) -> None:
        """The fetch rates summed afresh from the readers' (in their order, as `add_fetch` would from zero), so
        incremental updates cannot drift. A space no fetch or reader changed since its last recount is
        skipped: the sums would come out the same."""
        if self.recounted:
            return
        self.recounted = True
        whole = 0.0
        bins = [0.0] * STAGES
        for reader in self.readers.values():
            region = reader.region
            if region.bins == STAGES:
                whole = max(0.0, whole + reader.fetch)
            else:
                bins[region.first_bin] = max(0.0, bins[region.first_bin] + reader.fetch)
        self.whole_fetch = whole
        self.bin_fetch = bins
        self.total_fetch = whole + sum(bins)

    def _hold(self, cached: list[float]) -> None:
        self.cached = cached
        self.held = sum(cached)


class _PlacedReader:
    """A job bound to the space it reads through, with the region and fetch rate it last reported."""

    __slots__ = ("fetch", "job", "region", "space")

    def __init__(self, job: JobRun, space: _Space) -> None:
        self.job = job
        self.space = space
        self.region = region_of(job)
        self.fetch = 0.0


class UniformCache:
    """Uniform caching over shared per-dataset quotas and private per-job copies (see the module doc)."""

    def __init__(self) -> None:
        self._shared: dict[str, _Space] = {}  # dataset -> its shared cache
        self._private: dict[str, _Space] = {}  # job -> its own copy
        self._readers: dict[str, _PlacedReader] = {}  # job -> where it reads; kept while it is preempted

    def allocate(
        self, now: float, cache_bytes: Mapping[str, int], job_cache_bytes: Mapping[str, int], running: Iterable[JobRun]
    ) -> list[JobRun]:
        """Bind each running job to its space (a private copy if the decision lists it in `job_cache_bytes`),
        then apply the quotas; a dataset or job the decision leaves out gets quota 0. Returns the jobs whose
        segment hit ratio changed: moved to another space, or in a space the new quota shrank.

        Only the spaces a reader moves between or whose quota changes are settled: the others fill on as
        they were, and `held_at` answers for them from their last settled state (a round leaves most spaces
        as they were, and there is one per running job under coordl or with unshared datasets)."""
        changed = [job for job in running if self._bind(job, job_cache_bytes, now)]
        for spaces, quotas in ((self._shared, cache_bytes), (self._private, job_cache_bytes)):
            for key, space in list(spaces.items()):
                quota = quotas.get(key, 0)
                if quota != space.quota:
                    space.settle(now)
                    changed += space.set_quota(quota, now)
                if not space.readers and space.quota == 0:  # nothing held, no one to hold it for
                    del spaces[key]
                else:
                    space.recount_fetches()
        return changed

    def begin_segment(self, job: JobRun, now: float) -> None:
        """A new pass over the job's region: everything cached there now is effective for the whole pass."""
        reader = self._readers[job.job_id]
        space = reader.space
        space.settle(now)
        self._withdraw(reader)
        reader.region = region_of(job)
        region_bytes = space.region_bytes(reader.region)
        cached = space.region_cached(reader.region)
        # Less than a byte missing is the rounding of summed float bins, not a miss: counted as one, it left a job
        # whose dataset is all cached, and which its policy therefore gave no remote IO, at b / (1 - hit) = 0 B/s.
        hit = 1.0 if region_bytes - cached < 1.0 else cached / region_bytes
        job.segment = Segment(hit, min(region_bytes, reader.region.bytes_to_stage_end))

    def fetching(self, job: JobRun, now: float) -> None:
        reader = self._readers[job.job_id]
        reader.space.settle(now)
        reader.space.replace_fetch(reader.region, reader.fetch, job.remote_rate)
        reader.fetch = job.remote_rate

    def release(self, job: JobRun, now: float) -> None:
        reader = self._readers.pop(job.job_id, None)
        if reader is None:
            return
        reader.space.settle(now)
        self._withdraw(reader)
        del reader.space.readers[job.job_id]
        self._private.pop(job.job_id, None)

    def cached_bytes(self, now: float) -> dict[str, float]:
        cached: dict[str, float] = {}
        for space in self._spaces():
            cached[space.dataset] = cached.get(space.dataset, 0.0) + space.held_at(now)
        return cached

    def quota_bytes(self) -> Mapping[str, int]:
        return {dataset: int(space.quota) for dataset, space in self._shared.items()}

    def totals(self, now: float) -> CacheTotals:
        cached = effective = 0.0
        for space in self._spaces():
            held = space.held_at(now)
            best = 0.0
            # Sampled every minute over every space (a coordl run has one per running job): `region_bytes` is
            # worked out in place rather than called.
            for reader in space.readers.values():
                segment = reader.job.segment
                if segment is not None and reader.job.gpus > 0:
                    hits = segment.hit_ratio * (space.bin_bytes * reader.region.bins)
                    best = max(best, hits)
            cached += held
            effective += min(best, held)
        return CacheTotals(cached, effective)

    def _spaces(self) -> list[_Space]:
        return [*self._shared.values(), *self._private.values()]

    def _bind(self, job: JobRun, job_cache_bytes: Mapping[str, int], now: float) -> bool:
        """Make `job` read through the space the decision gives it; True if that moved a job with a segment."""
        job_id = job.job_id
        if job_id in job_cache_bytes:
            space = self._private.get(job_id)
            if space is None:
                space = self._private[job_id] = _Space(job.trace.dataset, job.trace.dataset_bytes, now)
        else:
            space = self._shared.get(job.trace.dataset)
            if space is None:
                space = self._shared[job.trace.dataset] = _Space(job.trace.dataset, job.trace.dataset_bytes, now)
        reader = self._readers.get(job_id)
        if reader is not None and reader.space is space:
            return False
        moved = False
        if reader is None:
            reader = self._readers[job_id] = _PlacedReader(job, space)
        else:
            reader.space.settle(now)
            space.settle(now)
            fetch = reader.fetch
            self._withdraw(reader)
            del reader.space.readers[job_id]
            reader.space = space
            reader.fetch = fetch
            space.add_fetch(reader.region, fetch)
            if job.segment is not None:  # the new space's items lie at random in its remaining reads
                region_bytes = space.region_bytes(reader.region)
                job.segment.hit_ratio = min(1.0, space.region_cached(reader.region) / region_bytes)
                moved = True
        space.readers[job_id] = reader
        space.recounted = False
        return moved

    def _withdraw(self, reader: _PlacedReader) -> None:
        reader.space.add_fetch(reader.region, -reader.fetch)
        reader.fetch = 0.0
