"""The co-location simulator's inputs and outputs as plain values (Harmony's world: PS jobs on CPU machines).

A job iterates until it converges: `iterations` of COMP (`cpu_machine_seconds` per iteration, spread over its
group's machines, Harmony's Eq. 2) and COMM (`net_seconds`). What moving it costs follows from its sizes:
its model is checkpointed and restored, its input reloaded (Harmony's section IV-B4), each spread over the
machines it runs on, at `machine_bytes_per_sec` per machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from datamgr.scheduler.colocation import JobProfile
from datamgr.scheduler.colocation_storage import DataNeed


@dataclass(frozen=True, slots=True)
class ColocationJob:
    """One job of a co-location trace: `app` and `dataset` are labels for the report."""

    job_id: str
    arrival: float
    app: str
    dataset: str
    cpu_machine_seconds: float
    net_seconds: float
    iterations: float
    model_bytes: int
    input_bytes: int
    read_bytes_per_iteration: int = 0  # from remote storage, through the cache (the SiloD variant); 0: none

    def __post_init__(self) -> None:
        if not self.iterations > 0:
            raise ValueError(f"job {self.job_id}: iterations must be positive, not {self.iterations!r}")
        if not self.arrival >= 0:
            raise ValueError(f"job {self.job_id}: arrival must be at least 0, not {self.arrival!r}")
        if self.model_bytes < 0 or self.input_bytes < 0 or self.read_bytes_per_iteration < 0:
            raise ValueError(
                f"job {self.job_id}: model_bytes, input_bytes and read_bytes_per_iteration must be at least 0"
            )
        JobProfile(self.job_id, self.cpu_machine_seconds, self.net_seconds)  # refuses impossible times

    @property
    def profile(self) -> JobProfile:
        return JobProfile(self.job_id, self.cpu_machine_seconds, self.net_seconds)

    @property
    def need(self) -> DataNeed:
        """What it reads from remote storage: its input is its dataset."""
        return DataNeed(self.read_bytes_per_iteration, self.dataset, self.input_bytes)


@dataclass(frozen=True, slots=True)
class ColocationCluster:
    """`machines` identical machines. `machine_bytes_per_sec` is what one machine moves a checkpoint or input
    at (the paper's m4.2xlarge: 1.1 Gbps); `profile_iterations` how many iterations profiling a new job takes.
    For jobs that read remote data (the SiloD variant): `remote_io_bytes_per_sec`, the egress limit the whole
    cluster shares (infinite: not modelled), and `cache_bytes`, the cache all machines hold together."""

    machines: int
    machine_bytes_per_sec: float = 1.1e9 / 8
    profile_iterations: int = 2
    remote_io_bytes_per_sec: float = math.inf
    cache_bytes: int = 0

    def __post_init__(self) -> None:
        if self.machines < 1:
            raise ValueError(f"machines must be at least 1, not {self.machines}")
        if not self.machine_bytes_per_sec > 0:
            raise ValueError(f"machine_bytes_per_sec must be positive, not {self.machine_bytes_per_sec!r}")
        if self.profile_iterations < 0:
            raise ValueError(f"profile_iterations must be at least 0, not {self.profile_iterations}")
        if not self.remote_io_bytes_per_sec > 0:
            raise ValueError(f"remote_io_bytes_per_sec must be positive, not {self.remote_io_bytes_per_sec!r}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be at least 0, not {self.cache_bytes}")

    def start_seconds(self, job: ColocationJob, machines: int) -> float:
        """A job's first start: its input loaded, spread over its machines (none for a job that streams its
        input from remote storage each iteration)."""
        return _loaded_input(job) / (machines * self.machine_bytes_per_sec)

    def resume_seconds(self, job: ColocationJob, machines: int) -> float:
        """A paused job resumed: its model restored from the checkpoint and its input reloaded."""
        return (job.model_bytes + _loaded_input(job)) / (machines * self.machine_bytes_per_sec)

    def migration_seconds(self, job: ColocationJob, old_machines: int, new_machines: int) -> float:
        """A running job moved (to another group, or its group to another number of machines): checkpointed
        where it was, then resumed where it goes."""
        checkpoint = job.model_bytes / (old_machines * self.machine_bytes_per_sec)
        return checkpoint + self.resume_seconds(job, new_machines)


def _loaded_input(job: ColocationJob) -> int:
    """The input a job holds in memory: all of it (Harmony's jobs), or none when it streams it."""
    return 0 if job.read_bytes_per_iteration else job.input_bytes


@dataclass(frozen=True, slots=True)
class ColocationOutcome:
    """One job's life: `start` its first run; `migrations` and `pauses` count its moves; `overhead_seconds` the
    time it spent starting, resuming and migrating (in its group, not progressing)."""

    job_id: str
    app: str
    dataset: str
    arrival: float
    start: float
    finish: float
    migrations: int = 0
    pauses: int = 0
    overhead_seconds: float = 0.0

    @property
    def jct(self) -> float:
        return self.finish - self.arrival


@dataclass(frozen=True, slots=True)
class ColocationSample:
    """The cluster from `time` until the next sample: Eq. 4's utilisation over all machines (idle ones count
    0), the jobs progressing, the groups, and the jobs waiting."""

    time: float
    cpu: float
    net: float
    running_jobs: int
    groups: int
    waiting_jobs: int
    remote_io_bytes_per_sec: float = 0.0  # what the progressing jobs read from remote storage


@dataclass(frozen=True, slots=True)
class ColocationResult:
    policy: str
    jobs: list[ColocationOutcome]  # in finishing order
    samples: list[ColocationSample] = field(default_factory=list)
    rounds: int = 0
