"""Harmony's evaluation workload (its section V-B), generated: 4 applications x 2 datasets x 10 settings.

What the paper gives: 100 m4.2xlarge machines (8 vCPUs, 1.1 Gbps); the applications and datasets of its
Table I with their input and model sizes; 80 jobs submitted at once (section V-C), or with Poisson arrivals of
mean gap up to 8 minutes (section V-D); jobs run to convergence. Its Figure 9 shows how the jobs' iteration
times and computation-to-communication ratios spread at DoP 16, but not as numbers, and the paper gives no
job's length. silod therefore draws, per job (seeded, documented in docs/harmony.md):

- the iteration time at DoP 16, log-uniform between 2 and 60 seconds (ML iterations of seconds to a minute);
- the share of it spent computing at DoP 16, uniform between 0.2 and 0.8 (the paper's Figures 2 and 4 show
  jobs alone using from about a fifth to four fifths of the CPU or the network);
- its length, the time it would train alone at DoP 16, log-uniform between 1 and 6 hours;

and takes the input and model sizes of its (application, dataset) from Table I, which set what starting,
pausing and migrating it cost. MLR and Lasso share the two synthetic datasets, as Table I lists them.

For the SiloD variant (`epoch_iterations` > 0) each job reads its input from remote storage instead of keeping
it in memory: an epoch, a pass over the input, takes `epoch_iterations` iterations, so each iteration reads
input / epoch_iterations bytes. The paper keeps its input in memory and says nothing of this: it is silod's
scenario, not Harmony's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from datamgr.scheduler.sim.colocation_model import ColocationJob

GB = 10**9

# (application, dataset, input bytes, model bytes): Table I.
TABLE_I: tuple[tuple[str, str, int, int], ...] = (
    ("nmf", "netflix64x", int(45.6 * GB), int(1.0 * GB)),
    ("nmf", "netflix128x", int(91.2 * GB), int(5.0 * GB)),
    ("lda", "pubmed", int(4.3 * GB), int(2.1 * GB)),
    ("lda", "nytimes", int(0.6 * GB), int(1.1 * GB)),
    ("mlr", "synthetic78", int(78.4 * GB), int(12.0 * GB)),
    ("mlr", "synthetic155", int(155.0 * GB), int(24.0 * GB)),
    ("lasso", "synthetic78", int(78.4 * GB), int(12.0 * GB)),
    ("lasso", "synthetic155", int(155.0 * GB), int(24.0 * GB)),
)
SETTINGS = 10  # hyper-parameter settings per (application, dataset)
PROFILE_DOP = 16  # the DoP of the paper's Figure 9


@dataclass(frozen=True, slots=True)
class HarmonyWorkloadConfig:
    """`mean_gap_seconds` 0 submits every job at once; otherwise arrivals are Poisson with that mean gap."""

    seed: int = 1
    mean_gap_seconds: float = 0.0
    iteration_range: tuple[float, float] = (2.0, 60.0)
    compute_share_range: tuple[float, float] = (0.2, 0.8)
    length_range: tuple[float, float] = (3600.0, 6 * 3600.0)
    epoch_iterations: int = 0  # > 0: each iteration reads input / epoch_iterations from remote storage

    def __post_init__(self) -> None:
        if not self.mean_gap_seconds >= 0:
            raise ValueError(f"mean_gap_seconds must be at least 0, not {self.mean_gap_seconds!r}")
        for name in ("iteration_range", "length_range"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} must be two positive numbers, low first, not {(low, high)!r}")
        low, high = self.compute_share_range
        if not 0 < low <= high < 1:
            raise ValueError(f"compute_share_range must lie strictly between 0 and 1, not {(low, high)!r}")
        if self.epoch_iterations < 0:
            raise ValueError(f"epoch_iterations must be at least 0, not {self.epoch_iterations}")


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def generate_harmony_workload(config: HarmonyWorkloadConfig) -> list[ColocationJob]:
    """The 80 jobs, in a shuffled submission order (the paper does not give one), named app-dataset-setting."""
    rng = random.Random(config.seed)
    jobs = []
    for app, dataset, input_bytes, model_bytes in TABLE_I:
        for setting in range(SETTINGS):
            iteration = _log_uniform(rng, *config.iteration_range)
            share = rng.uniform(*config.compute_share_range)
            length = _log_uniform(rng, *config.length_range)
            jobs.append(
                ColocationJob(
                    job_id=f"{app}-{dataset}-{setting}",
                    arrival=0.0,
                    app=app,
                    dataset=dataset,
                    cpu_machine_seconds=iteration * share * PROFILE_DOP,
                    net_seconds=iteration * (1 - share),
                    iterations=length / iteration,
                    model_bytes=model_bytes,
                    input_bytes=input_bytes,
                    read_bytes_per_iteration=input_bytes // config.epoch_iterations if config.epoch_iterations else 0,
                )
            )
    rng.shuffle(jobs)
    if config.mean_gap_seconds == 0:
        return jobs
    arrival = 0.0
    timed = []
    for job in jobs:
        timed.append(_with_arrival(job, arrival))
        arrival += rng.expovariate(1.0 / config.mean_gap_seconds)
    return timed


def _with_arrival(job: ColocationJob, arrival: float) -> ColocationJob:
    return replace(job, arrival=arrival)
