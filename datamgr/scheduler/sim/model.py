"""The simulator's inputs and outputs as plain values: a trace of jobs, a cluster, and what happened.

Parsing files into these (trace.py, cluster.py) and running them (engine.py) are separate modules; the
values here are what they exchange. Sizes are bytes, rates bytes/s, times seconds from the trace start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datamgr.scheduler.snapshot import NodeState


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `ideal_bytes_per_sec` is f* on all `gpus`; the job trains for `epochs` passes
    over its dataset (fractional: BERT's 0.07). Jobs naming the same `dataset` share it."""

    job_id: str
    arrival: float
    gpus: int
    model: str
    ideal_bytes_per_sec: float
    dataset: str
    dataset_bytes: int
    epochs: float
    irregular: bool = False

    @property
    def total_bytes(self) -> float:
        return self.epochs * self.dataset_bytes


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Identical nodes and the remote IO limit they share."""

    nodes: int
    gpus_per_node: int
    cache_bytes_per_node: int
    remote_io_bytes_per_sec: float

    def node_states(self) -> dict[str, NodeState]:
        width = len(str(self.nodes - 1))
        return {
            f"node-{i:0{width}d}": NodeState(f"node-{i:0{width}d}", self.gpus_per_node, self.cache_bytes_per_node)
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
    """How to simulate: a policy round every `round_seconds` (and on arrivals and finishes), a timeline
    sample every `sample_seconds`, caches modelled in `chunk_bytes` units where items matter (LRU)."""

    round_seconds: float = 300.0
    sample_seconds: float = 60.0
    chunk_bytes: int = 64 * 2**20
    seed: int = 0


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job's life in the simulation; `bytes_read == hit_bytes + remote_bytes` always."""

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

    @property
    def jct(self) -> float:
        return self.finish - self.arrival


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


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    cache_system: str
    jobs: list[JobOutcome]
    samples: list[Sample] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # job ids still running when the run was cut off
