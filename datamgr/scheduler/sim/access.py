"""How jobs walk through their datasets: the access patterns every cache model serves.

- A regular job reads its whole dataset once per epoch, in a fresh random order (DL training's shuffled,
  exactly-once epochs).
- An irregular job (curriculum learning) trains on its dataset's difficulty stages in turn, easiest first:
  the dataset's items fall into `STAGES` equal bins, the job spends an equal share of its training bytes on
  each, and within a stage it makes passes over that bin only, each in a fresh random order. Its reads are
  therefore not uniform over the dataset, and its hit ratio departs from c/d stage by stage: under uniform
  caching a quota smaller than the dataset fills with the early stages' items and then holds them (no
  eviction below quota), so the stages the quota covers hit (almost) always and the later stages find
  nothing cached. Over a lone job's life the hits add up to what a regular job would get (each cached byte
  serves every later pass over its bin), but they come early: SiloDPerf mispredicts its rate and its remote
  IO demand in every stage, and when IO is the bottleneck in the uncached stages it trains slower than a
  regular job with the same cache and IO (the pipeline cannot bank the early stages' spare IO). Bytes cached
  by regular jobs sharing the dataset are spread over all bins and help it at their density. This is why
  SiloD schedules irregular jobs' storage in a partition of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from datamgr.scheduler.sim.jobs import JobRun

STAGES = 4  # an irregular job's difficulty stages; the bins a dataset's items fall into


@dataclass(frozen=True, slots=True)
class Region:
    """What a job reads in its current pass: bins [first_bin, first_bin + bins) of its dataset's `STAGES`,
    and how many more bytes it reads before its curriculum moves to the next stage (inf for a regular job
    or the last stage)."""

    first_bin: int
    bins: int
    bytes_to_stage_end: float

    @property
    def fraction(self) -> float:
        """The share of the dataset the region covers."""
        return self.bins / STAGES


WHOLE_DATASET = Region(0, STAGES, math.inf)


def region_of(job: JobRun) -> Region:
    """The region a job reads from now: its whole dataset, or the bin of its current curriculum stage."""
    if not job.trace.irregular:
        return WHOLE_DATASET
    stage_bytes = job.trace.total_bytes / STAGES
    stage = min(STAGES - 1, int(job.done // stage_bytes)) if stage_bytes > 0 else STAGES - 1
    left = (stage + 1) * stage_bytes - job.done
    if stage < STAGES - 1 and left <= 1e-9 * stage_bytes:  # a stage boundary reached up to float rounding
        stage += 1
        left += stage_bytes
    return Region(stage, 1, math.inf if stage == STAGES - 1 else left)
