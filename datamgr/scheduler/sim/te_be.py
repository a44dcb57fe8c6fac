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
- Lower bounds: execution times at least 3 minutes (the paper's trace counts only jobs that lasted more than
  180 s), GPs at least 0 (a GP of 0 is the paper's "rewind"), GPUs, CPUs and RAM at least 1 (GPU, CPU, GB).
- Demands, per node of 32 CPUs, 256 GB and 8 GPUs (4 CPUs and 32 GB a GPU): TE 1 GPU, 4 CPUs, 16 GB; BE
  2 GPUs, 8 CPUs, 32 GB (means), each truncated at a node's capacity (jobs are single-task, so on one node)
  and rounded to whole GPUs, CPUs and GB. Drawn independently, as the paper fits them separately.
- The load: kept at `load` by construction. The arrivals are worked out by running FIFO (strict, best fit,
  `fitgpp.best_fit`) on the cluster with each job's execution time: a job is submitted whenever the demand of
  the jobs present (running or queued) falls below `load` times the capacity, in the resource where it is
  highest. So under FIFO the cluster holds twice its capacity's worth of jobs throughout, and every policy
  replays the same arrival times.
- Data: each job reads its own 10 GB dataset at 10 MB/s per GPU, far below any limit the scenario sets, so
  storage never slows a job (FitGpp's world has no storage bottleneck); its work is its execution time at that
  rate.

`grace_scale` multiplies the GP distribution's mean, spread and truncation (the paper's Figure 7: "2.0" is
twice the mean, the deviation and the truncation of "1.0").
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

from datamgr.scheduler.fitgpp import Resources, best_fit
from datamgr.scheduler.sim.model import ClusterSpec, TraceJob

GB = 10**9
MB = 10**6
MINUTE = 60.0
DATASET_BYTES = 10 * GB
BYTES_PER_SEC_PER_GPU = 10 * MB


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


def _profile(minutes: float, high_minutes: float, gpus: float) -> ClassProfile:
    """A class with the given mean execution time and truncation, `gpus` GPUs on average, 4 CPUs and 32 GB of
    RAM a GPU of it on average (what the paper's node has per GPU), each spread as wide as its mean."""
    return ClassProfile(
        seconds=TruncatedNormal(minutes * MINUTE, minutes * MINUTE, 3 * MINUTE, high_minutes * MINUTE),
        gpus=TruncatedNormal(gpus, gpus, 1, 8),
        cpus=TruncatedNormal(4 * gpus, 4 * gpus, 1, 32),
        ram_bytes=TruncatedNormal(16 * gpus * GB, 16 * gpus * GB, GB, 256 * GB),
    )


TE_PROFILE = _profile(5, 30, 1)
BE_PROFILE = _profile(30, 24 * 60, 2)
GRACE = TruncatedNormal(3 * MINUTE, 3 * MINUTE, 0.0, 20 * MINUTE)


@dataclass(frozen=True, slots=True)
class TeBeConfig:
    """`jobs` jobs, a `te_share` of them TE, arriving so that FIFO keeps `load` times the capacity present."""

    jobs: int
    seed: int
    te_share: float = 0.3
    load: float = 2.0
    grace_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")
        if not 0.0 <= self.te_share <= 1.0:
            raise ValueError(f"te_share must be between 0 and 1, not {self.te_share}")
        for name in ("load", "grace_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


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
    drawn = [_draw(rng, config.te_share, grace) for _ in range(config.jobs)]
    arrivals = _fifo_arrivals(drawn, cluster, config.load)
    width = max(4, len(str(config.jobs - 1)))
    return [_job(f"job-{i:0{width}d}", job, arrival) for i, (job, arrival) in enumerate(zip(drawn, arrivals, strict=True))]


def _draw(rng: random.Random, te_share: float, grace: TruncatedNormal) -> _Drawn:
    te = rng.random() < te_share
    profile = TE_PROFILE if te else BE_PROFILE
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


def _job(job_id: str, job: _Drawn, arrival: float) -> TraceJob:
    gpus = int(job.demand.gpus)
    rate = BYTES_PER_SEC_PER_GPU * gpus
    return TraceJob(
        job_id=job_id,
        arrival=float(round(arrival)),
        gpus=gpus,
        model="te-job" if job.te else "be-job",
        ideal_bytes_per_sec=float(rate),
        dataset=f"data/{job_id}",
        dataset_bytes=DATASET_BYTES,
        epochs=float(f"{job.seconds * rate / DATASET_BYTES:.6g}"),
        job_class="te" if job.te else "be",
        cpus=job.demand.cpus,
        ram_bytes=int(job.demand.ram_bytes),
        grace_seconds=float(round(job.grace_seconds)),
    )
