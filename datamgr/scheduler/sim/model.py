"""The simulator's inputs and outputs as plain values: a trace of jobs, a cluster, and what happened.

Parsing files into these (trace.py, cluster.py) and running them (engine.py) are separate modules; the
values here are what they exchange. Sizes are bytes, rates bytes/s, times seconds from the trace start.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from datamgr.scheduler.cells import MAX_CELL_GPUS
from datamgr.scheduler.snapshot import NodeState
from datamgr.scheduler.tenancy import TenantShare
from datamgr.validation import MAX_GRACE_SECONDS

# How far from the trace start a run may reach: an arrival, a job's run even at its ideal rate, or the time the
# remote IO limit needs to bring in what the jobs read. The simulator steps through every round and sample interval
# up to the last finish and keeps each sample, so a trace past it is a unit mistake (a Unix timestamp for an
# arrival, a rate without its unit), which would run for hours and fill memory rather than fail. Cluster traces span
# months. `engine.check_inputs` holds traces to it, and the generator its knobs.
HORIZON_YEARS = 10
YEAR_SECONDS = 365 * 86_400
HORIZON_SECONDS = HORIZON_YEARS * YEAR_SECONDS

# The largest cluster the simulator takes. A run's cost grows with the nodes, whatever the trace (each round walks
# every node's state: a one-job trace took 1.8 s and 110 MB on 100,000 nodes, 10 s and 390 MB on a million, and
# 10^11 nodes never started), and under HiveD with the GPUs (a cell each: 1.2 GB on 10^7 GPUs). The shipped
# scenarios have at most 84 nodes, and even a cluster of 100,000 GPUs is 12,500 nodes of 8; the GPU bound is the most
# one cell holds (`cells.MAX_CELL_GPUS`), so a whole node, or the whole cluster, is always a cell HiveD can make.
MAX_NODES = 100_000
MAX_GPUS = MAX_CELL_GPUS

# A preempted job pays its grace period (holding its GPUs, suspending) and then the preemption's cost (restoring
# its checkpoint) at every preemption, and the simulator samples every simulated minute through both: one
# preemption costing a year took 13 s and 430 MB, and one costing 10^12 s never ended. Both are minutes in the
# papers (FitGpp's grace periods: a mean of 3, at most 20; Tiresias measured about 60 s per preempt-and-resume),
# so both stop at a day: the bound the data manager puts on a live job's grace period.
MAX_PREEMPTION_SECONDS = MAX_GRACE_SECONDS

# The shortest time between two policy rounds a run takes: the live data manager's shortest `--round`
# (`silodcli.args.MIN_INTERVAL_SECONDS`). A round of a nanosecond would run a policy a billion times a simulated
# second, hours of rounds for a trace of minutes.
MIN_ROUND_SECONDS = 0.1


class SimulationStalled(RuntimeError):
    """Jobs are left, none can make progress and nothing is due to arrive: the run would never end.

    One of the outcomes a run can have, so it lives with the others here rather than in the engine that
    raises it (which, compiled by mypyc, could define a RuntimeError subclass only as a non-native class,
    with a dependency on mypy_extensions at run time)."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `ideal_bytes_per_sec` is f* on all `gpus`; the job trains for `epochs` passes
    over its dataset (fractional: BERT's 0.07). Jobs naming the same `dataset` share it. `tenant` and
    `job_class` are free-form labels ("" when the trace gives none) for the report to break its numbers down
    by; a policy that tells classes apart (FitGpp) reads `job_class` "te" as trial-and-error, any other as
    best-effort. `cpus` and `ram_bytes` are what it holds besides GPUs (0: not modelled; a job that asks for
    either runs on one node), and `grace_seconds` how long it keeps its resources, suspending, once preempted
    (FitGpp's grace period; 0: it stops at once). `priority` "low" marks a preemptible job that runs only on
    resources no tenant's guarantee needs (HiveD's low-priority jobs); "" or "high" is a regular job."""

    job_id: str
    arrival: float
    gpus: int
    model: str
    ideal_bytes_per_sec: float
    dataset: str
    dataset_bytes: int
    epochs: float
    irregular: bool = False
    tenant: str = ""
    job_class: str = ""
    cpus: float = 0.0
    ram_bytes: int = 0
    grace_seconds: float = 0.0
    priority: str = ""

    @property
    def total_bytes(self) -> float:
        return self.epochs * self.dataset_bytes


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Identical nodes and the remote IO limit they share; CPUs and RAM per node only where jobs ask for them
    (0: not modelled, so no job may ask). `cell_levels` is the GPUs' affinity hierarchy ("gpu:1,pcie:2,
    socket:2,node:2,rack:4"; "": a node is one cell) and `tenants` the tenants' VCs, for HiveD."""

    nodes: int
    gpus_per_node: int
    cache_bytes_per_node: int
    remote_io_bytes_per_sec: float
    cpus_per_node: float = 0.0
    ram_bytes_per_node: int = 0
    cell_levels: str = ""
    tenants: Mapping[str, TenantShare] = field(default_factory=dict)  # a dict: a cluster is pickled to workers

    def node_states(self) -> dict[str, NodeState]:
        width = len(str(self.nodes - 1))
        return {
            f"node-{i:0{width}d}": NodeState(
                f"node-{i:0{width}d}",
                self.gpus_per_node,
                self.cache_bytes_per_node,
                self.cpus_per_node,
                self.ram_bytes_per_node,
            )
            for i in range(self.nodes)
        }

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def total_cache_bytes(self) -> int:
        return self.nodes * self.cache_bytes_per_node


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How to simulate: a policy round at every arrival and finish and at most `round_seconds` after the
    last one, a timeline sample every `sample_seconds`, caches modelled in `chunk_bytes` units where items
    matter (LRU), with at most `max_chunks_per_dataset` chunks per dataset (bigger datasets get bigger chunks,
    so the LRU model's cost is bounded). `time_limit` (seconds from the trace start) cuts the run short;
    None runs every job to its finish. `preemption_seconds` is what a preemption costs: a preempted job, when it
    resumes, holds its GPUs that long without progress while its checkpoint is saved and restored (Tiresias
    measured about 60 s per preempt-and-resume; 0, the default, is the paper simulators' assumption)."""

    round_seconds: float = 300.0
    sample_seconds: float = 60.0
    chunk_bytes: int = 64 * 2**20
    seed: int = 0
    max_chunks_per_dataset: int = 128
    time_limit: float | None = None
    preemption_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in ("round_seconds", "sample_seconds", "chunk_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)!r}")
        if not self.round_seconds >= MIN_ROUND_SECONDS:
            raise ValueError(f"round_seconds must be at least {MIN_ROUND_SECONDS:g}, not {self.round_seconds!r}")
        if self.max_chunks_per_dataset < 4:
            raise ValueError(f"max_chunks_per_dataset must be at least 4, not {self.max_chunks_per_dataset}")
        if not 0 <= self.preemption_seconds <= MAX_PREEMPTION_SECONDS:
            raise ValueError(
                f"preemption_seconds must be from 0 to a day ({MAX_PREEMPTION_SECONDS:,.0f} s), "
                f"not {self.preemption_seconds!r}"
            )
        if self.time_limit is not None and not self.time_limit >= 0:
            raise ValueError(f"time_limit must be a time of at least 0 seconds, not {self.time_limit!r}")


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job's life in the simulation; `bytes_read == hit_bytes + remote_bytes` always. `start` is the first
    time the job ran; `tenant` and `job_class` are its trace's labels, carried for the report's breakdowns."""

    job_id: str
    arrival: float
    start: float
    finish: float
    gpus: int
    dataset: str
    bytes_read: float
    hit_bytes: float
    remote_bytes: float
    preemptions: int = 0
    equal_share_bytes: float = 0.0  # what an equal share of the cluster would have read over its stay
    tenant: str = ""
    job_class: str = ""
    priority: str = ""
    overhead_seconds: float = 0.0  # spent restoring checkpoints after preemptions, holding GPUs
    queued_seconds: float = 0.0  # waiting in all: before it first ran and after each preemption
    ideal_seconds: float = 0.0  # its work at full speed on all its GPUs: its training time with nothing in its way
    # From each preemption to the restart that followed it (FitGpp's re-scheduling interval), grace period included.
    restart_seconds: tuple[float, ...] = ()

    @property
    def jct(self) -> float:
        return self.finish - self.arrival

    @property
    def slowdown(self) -> float:
        """FitGpp's slowdown rate (its Eq. 5): 1 + time waiting / time executing, where a preempted job's grace
        period counts as waiting and a checkpoint restore as executing."""
        executing = self.jct - self.queued_seconds
        return 1.0 + self.queued_seconds / executing if executing > 0 else math.inf

    @property
    def fairness(self) -> float:
        """Gavel's ratio over the job's stay: what it read over what an equal share of the cluster would have
        read from its arrival to its finish (NaN if that is 0)."""
        return self.bytes_read / self.equal_share_bytes if self.equal_share_bytes > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at one instant of the timeline."""

    time: float
    throughput_bytes_per_sec: float  # sum over running jobs
    remote_io_bytes_per_sec: float
    busy_gpus: int
    running_jobs: int
    queued_jobs: int
    cached_bytes: int
    effective_cached_bytes: int  # cached bytes the jobs reading them can hit this epoch
    fairness_min: float  # min over running jobs of rate / rate under an equal share (Gavel's ratio)
    fairness_mean: float
    # What the running jobs would read at full speed, all of it from remote storage without a cache: f* on the
    # GPUs each holds, summed (the IO demand of the paper's Figure 2).
    demand_bytes_per_sec: float = 0.0
    # GPUs held by running regular jobs: those the policy does not run preemptibly (HiveD's policy state
    # `opportunistic` 1 marks a low-priority one); `busy_gpus` under a policy that marks none.
    regular_busy_gpus: int = 0
    # Nodes on which a running regular job uses any GPU: the nodes not available for a whole-node regular job
    # (HiveD's fragmentation level, counted over regular jobs only, is this over the cluster's nodes).
    fragmented_nodes: int = 0


class RemoteIoLedger:
    """The cluster's total remote IO rate over time, exactly as the simulation ran it: piecewise constant,
    `rates[i]` bytes/s from `times[i]` until `times[i + 1]` (the last until `end`).

    Every change of any job's remote rate is recorded, so the ledger accounts for every remote byte (its
    total equals the jobs' `remote_bytes` summed) and answers for any interval, not only at samples.
    """

    __slots__ = ("_rates", "_times", "end")

    def __init__(self) -> None:
        self._times = array("d")
        self._rates = array("d")
        self.end = 0.0

    def record(self, time: float, rate: float) -> None:
        """The total rate from `time` on (replacing one recorded at the same time)."""
        if self._times and self._times[-1] == time:
            self._rates[-1] = rate
            if len(self._rates) > 1 and self._rates[-2] == rate:
                self._times.pop()
                self._rates.pop()
        elif not self._rates or self._rates[-1] != rate:
            self._times.append(time)
            self._rates.append(rate)
        self.end = max(self.end, time)

    def spans(self) -> list[tuple[float, float, float]]:
        """(start, end, bytes/s) of each constant-rate stretch."""
        ends = [*self._times[1:], self.end]
        return [(start, end, rate) for start, end, rate in zip(self._times, ends, self._rates, strict=True)]

    def bytes_between(self, start: float, end: float) -> float:
        """Remote bytes fetched cluster-wide in [start, end]."""
        return sum(rate * max(0.0, min(end, hi) - max(start, lo)) for lo, hi, rate in self.spans())

    def peak(self) -> float:
        """The highest total rate at any time."""
        return max(self._rates, default=0.0)


@dataclass(frozen=True, slots=True)
class Usage:
    """What the running jobs held, integrated exactly over the run, from the trace start to `end` (where the run
    stopped: the last finish, or the time limit, unfinished jobs included): the counts each timeline sample shows
    (`Sample.busy_gpus`, `regular_busy_gpus`, `fragmented_nodes`), times the time they held. They change only
    when placements or policy states do, at rounds and finishes, and the engine integrates them there, so unlike
    the samples' means these miss nothing between two samples (a Gavel round ending on a sample instant, a job
    of seconds); the summary's GPU utilisation, fragmentation and IO-bound share are these over the time."""

    end: float = 0.0
    gpu_seconds: float = 0.0  # GPUs held by running jobs (suspending ones are not running), times seconds
    regular_gpu_seconds: float = 0.0  # the same for running regular jobs
    fragmented_node_seconds: float = 0.0  # nodes on which a running regular job uses any GPU, times seconds
    running_seconds: float = 0.0  # time with at least one job running
    # Of that time, the time in which the running jobs' demand with no cache (f* on the GPUs each holds, summed)
    # exceeded the remote IO limit (the paper's Figure 2).
    io_bound_seconds: float = 0.0


# Where an unfinished job stood when a time limit stopped the run (`UnfinishedJob.state`).
RUNNING = "running"  # placed: training, or restoring its checkpoint
WAITING = "waiting"  # arrived, not running: queued for its first start, or preempted (suspending included)
NOT_ARRIVED = "not arrived"  # it arrives after the time limit


class UnfinishedJob(NamedTuple):
    """A trace job a time limit stopped the run before it finished, and where it stood then: the report counts
    it, and measures the run from the first arrival whether that job finished or not."""

    job_id: str
    arrival: float
    state: str  # RUNNING, WAITING or NOT_ARRIVED


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    cache_system: str
    jobs: list[JobOutcome]  # finished jobs, in finishing order
    samples: list[Sample] = field(default_factory=list)
    unfinished_jobs: list[UnfinishedJob] = field(default_factory=list)  # in trace order; only with a time limit
    remote_io: RemoteIoLedger = field(default_factory=RemoteIoLedger)
    usage: Usage = Usage()

    @property
    def unfinished(self) -> list[str]:
        """The ids of the jobs not finished when the run was cut off."""
        return [job.job_id for job in self.unfinished_jobs]
