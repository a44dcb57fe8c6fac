"""Synthetic traces of trial-and-error (TE) and best-effort (BE) jobs, shaped as FitGpp's evaluation's.

FitGpp's section 4.2 fits separate normal distributions to its cluster's execution times, CPUs, RAM and GPUs
for TE and BE jobs and draws jobs from their truncated versions; it gives only some of their parameters:

- execution time: TE mean 5 minutes truncated at 30 minutes, BE mean 30 minutes truncated at 24 hours;
- grace period (GP): mean 3 minutes truncated at 20 minutes, for every job (a TE job is never preempted);
- 30 % of the jobs are TE; jobs arrive "at such a rate that the cluster load (the ratio of the total resource
  demand relative to the capacity) would be kept at 2.0 if they were scheduled by FIFO".

What the paper leaves open, and what is chosen here (its Figure 2, with the fitted distributions, is not in
the text we have):

- Spreads: every normal has its standard deviation equal to its mean (a coefficient of variation of 1), a
  neutral choice for the heavy-tailed quantities the paper fits. At that spread BE's 24-hour truncation never
  binds; it is kept for fidelity.
- Lower bounds: execution times at least `min_seconds`, by default 180 s: the paper names only the upper
  truncations, but the trace it fitted counts only jobs that lasted more than 180 s, so generated jobs are
  drawn from that population (`min_duration = "1s"` in a recipe gives the other reading, any positive time;
  docs/fitgpp.md shows both). GPs at least 0 (a GP of 0 is the paper's "rewind"); GPUs, CPUs and RAM at
  least 1 (GPU, CPU, GB).
- Demands: the paper gives none of their parameters, so both classes draw from the same distributions (only
  their execution times are known to differ): 2 GPUs, 8 CPUs and 64 GB of RAM on average, 4 CPUs and 32 GB a
  GPU as on the paper's nodes of 32 CPUs, 256 GB and 8 GPUs, each truncated at a node's capacity (jobs are
  single-task, so on one node) and rounded to whole GPUs, CPUs and GB. Drawn independently, as the paper fits
  them separately.
- The load: kept at `load` by construction. The arrivals are worked out by running FIFO (strict, best fit,
  `fitgpp.best_fit`) on the cluster with each job's execution time: a job is submitted whenever the demand of
  the jobs present (running or queued) falls below `load` times the capacity, in the resource where it is
  highest. So under FIFO the cluster holds twice its capacity's worth of jobs throughout, and every policy
  replays the same arrival times.
- Data (`workloads`): "uniform", as FitGpp's world has no storage bottleneck: each job reads its own 10 GB
  dataset at 10 MB/s per GPU, far below any limit a scenario sets. "figure-6", for the SiloD-enhanced
  variant: each job is one of the SiloD paper's eleven Figure 6 jobs, equally likely (`generator.WORKLOADS`,
  f* per GPU times its GPUs), on a private copy of its dataset (the paper's main experiments share none),
  drawn from a generator of its own so that classes, times and demands stay those of "uniform". A job's work
  is its execution time at its f*.

`grace_scale` multiplies the GP distribution's mean, spread and truncation (the paper's Figure 7: "2.0" is
twice the mean, the deviation and the truncation of "1.0").
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

from datamgr.scheduler.fitgpp import Resources, best_fit
from datamgr.scheduler.sim.generator import WORKLOADS, Workload
from datamgr.scheduler.sim.model import ClusterSpec, TraceJob

GB = 10**9
MB = 10**6
MINUTE = 60.0
UNIFORM = Workload("synthetic", 10 * MB, "data", 10 * GB, 1.0)  # "uniform": never slowed by storage
WORKLOADS_BY_NAME = ("uniform", "figure-6")


@dataclass(frozen=True, slots=True)
class TruncatedNormal:
    """A normal of `mean` and `sd` drawn until the value lies in [low, high]."""

    mean: float
    sd: float
    low: float
    high: float

    def draw(self, rng: random.Random) -> float:
        while True:
            value = rng.normalvariate(self.mean, self.sd)
            if self.low <= value <= self.high:
                return value


@dataclass(frozen=True, slots=True)
class ClassProfile:
    """The distributions one class's jobs are drawn from: seconds, GPUs, CPUs, bytes of RAM."""

    seconds: TruncatedNormal
    gpus: TruncatedNormal
    cpus: TruncatedNormal
    ram_bytes: TruncatedNormal


def _profile(minutes: float, high_minutes: float, min_seconds: float) -> ClassProfile:
    """A class with the given mean execution time and truncations, and the
    demands every class shares: 2 GPUs, 8 CPUs and 64 GB of RAM on average (4 CPUs and 32 GB a GPU, what the
    paper's node has per GPU), each spread as wide as its mean and truncated at a node's capacity."""
    return ClassProfile(
        seconds=TruncatedNormal(minutes * MINUTE, minutes * MINUTE, min_seconds, high_minutes * MINUTE),
        gpus=TruncatedNormal(2, 2, 1, 8),
        cpus=TruncatedNormal(8, 8, 1, 32),
        ram_bytes=TruncatedNormal(64 * GB, 64 * GB, GB, 256 * GB),
    )


TE_MINUTES = (5, 30)  # mean, truncation
BE_MINUTES = (30, 24 * 60)
GRACE = TruncatedNormal(3 * MINUTE, 3 * MINUTE, 0.0, 20 * MINUTE)


@dataclass(frozen=True, slots=True)
class TeBeConfig:
    """`jobs` jobs, a `te_share` of them TE, arriving so that FIFO keeps `load` times the capacity present."""

    jobs: int
    seed: int
    te_share: float = 0.3
    load: float = 2.0
    grace_scale: float = 1.0
    min_seconds: float = 180.0  # the shortest execution time drawn
    workloads: str = "uniform"  # or "figure-6": what each job reads, and how fast

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")
        if not 0.0 <= self.te_share <= 1.0:
            raise ValueError(f"te_share must be between 0 and 1, not {self.te_share}")
        for name in ("load", "grace_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        if self.workloads not in WORKLOADS_BY_NAME:
            raise ValueError(f"workloads must be one of {', '.join(WORKLOADS_BY_NAME)}, not {self.workloads!r}")
        if not 0 < self.min_seconds < TE_MINUTES[1] * MINUTE:
            raise ValueError(f"min_duration must be positive and below TE's truncation, not {self.min_seconds}s")


@dataclass(frozen=True, slots=True)
class _Drawn:
    te: bool
    seconds: float
    demand: Resources
    grace_seconds: float


def generate_te_be(config: TeBeConfig, cluster: ClusterSpec) -> list[TraceJob]:
    """The trace `config` describes on `cluster` (which must give CPUs and RAM per node), in arrival order."""
    if not cluster.cpus_per_node:
        raise ValueError("a TE/BE trace needs a cluster with CPUs and RAM per node (cpus_per_node, ram_per_node)")
    rng = random.Random(config.seed)
    grace = TruncatedNormal(*(config.grace_scale * value for value in (GRACE.mean, GRACE.sd, GRACE.low, GRACE.high)))
    profiles = (_profile(*TE_MINUTES, config.min_seconds), _profile(*BE_MINUTES, config.min_seconds))
    drawn = [_draw(rng, config.te_share, profiles, grace) for _ in range(config.jobs)]
    arrivals = _fifo_arrivals(drawn, cluster, config.load)
    picker = random.Random(f"{config.seed}:workloads")
    workloads = [
        UNIFORM if config.workloads == "uniform" else WORKLOADS[int(picker.random() * len(WORKLOADS))] for _ in drawn
    ]
    width = max(4, len(str(config.jobs - 1)))
    return [
        _job(f"job-{i:0{width}d}", job, arrival, workload)
        for i, (job, arrival, workload) in enumerate(zip(drawn, arrivals, workloads, strict=True))
    ]


def _draw(
    rng: random.Random, te_share: float, profiles: tuple[ClassProfile, ClassProfile], grace: TruncatedNormal
) -> _Drawn:
    te = rng.random() < te_share
    profile = profiles[0] if te else profiles[1]
    seconds = profile.seconds.draw(rng)
    demand = Resources(
        float(round(profile.cpus.draw(rng))),
        round(profile.ram_bytes.draw(rng) / GB) * GB,
        float(round(profile.gpus.draw(rng))),
    )
    return _Drawn(te, seconds, demand, grace.draw(rng))


def _fifo_arrivals(jobs: list[_Drawn], cluster: ClusterSpec, load: float) -> list[float]:
    """Submission times at which strict FIFO (best fit) keeps `load` times the cluster's capacity present:
    a job is submitted whenever the present jobs' demand, in its highest resource, is below that."""
    node = Resources(cluster.cpus_per_node, cluster.ram_bytes_per_node, cluster.gpus_per_node)
    total = Resources(node.cpus * cluster.nodes, node.ram_bytes * cluster.nodes, node.gpus * cluster.nodes)
    capacity = {f"n{i}": node for i in range(cluster.nodes)}
    free = dict(capacity)
    present = Resources(0.0, 0.0, 0.0)
    queue: deque[int] = deque()
    finishing: list[tuple[float, int, str]] = []  # (finish time, job, node)
    arrivals: list[float] = []
    now = 0.0
    while len(arrivals) < len(jobs):
        while len(arrivals) < len(jobs) and _load(present, total) < load:
            queue.append(len(arrivals))
            present = present.plus(jobs[len(arrivals)].demand)
            arrivals.append(now)
        while queue:
            where = best_fit(jobs[queue[0]].demand, free, capacity)
            if where is None:
                break
            index = queue.popleft()
            free[where] = free[where].minus(jobs[index].demand)
            heapq.heappush(finishing, (now + jobs[index].seconds, index, where))
        if not finishing:
            raise ValueError("a job of the trace fits on no node of the cluster")
        now, index, where = heapq.heappop(finishing)
        free[where] = free[where].plus(jobs[index].demand)
        present = present.minus(jobs[index].demand)
    return arrivals


def _load(present: Resources, total: Resources) -> float:
    return max(present.cpus / total.cpus, present.ram_bytes / total.ram_bytes, present.gpus / total.gpus)


def _job(job_id: str, job: _Drawn, arrival: float, workload: Workload) -> TraceJob:
    gpus = int(job.demand.gpus)
    rate = workload.bytes_per_sec_per_gpu * gpus
    return TraceJob(
        job_id=job_id,
        arrival=float(round(arrival)),
        gpus=gpus,
        model=workload.model,
        ideal_bytes_per_sec=float(rate),
        dataset=f"{workload.dataset}/{job_id}",
        dataset_bytes=workload.dataset_bytes,
        epochs=float(f"{job.seconds * rate / workload.dataset_bytes:.6g}"),
        job_class="te" if job.te else "be",
        cpus=job.demand.cpus,
        ram_bytes=int(job.demand.ram_bytes),
        grace_seconds=float(round(job.grace_seconds)),
    )
