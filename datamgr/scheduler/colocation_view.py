"""What a co-location policy sees and decides (Harmony's world: job groups on machines, elastic DoP), pure.

silod's GPU policies place jobs on GPUs (`policy.Decision`); Harmony instead decides which jobs share a set of
machines and how many machines each set gets, and the jobs' speed follows from that (colocation.py). A
`ColocationPolicy` gets a `View` at every arrival, finish and end of a job's profiling, and returns the groups
that should run; a running job it leaves out is paused, a waiting one it names starts. A group it keeps under
the same `key` on the same number of machines stays where it is; any other change costs the jobs it moves
their checkpoint and reload time (the simulator's `CostModel`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from datamgr.scheduler.colocation import Group, JobProfile
from datamgr.scheduler.colocation_storage import DataNeed, StorageShare


class JobStatus(enum.Enum):
    """Harmony's job states (its section III): waiting to be profiled, profiling, profiled (known, waiting),
    running in a group, paused (ran before, waiting)."""

    NEW = "new"
    PROFILING = "profiling"
    PROFILED = "profiled"
    RUNNING = "running"
    PAUSED = "paused"

    @property
    def waiting(self) -> bool:
        """Profiled, and in no group: what Harmony may start or add."""
        return self in (JobStatus.PROFILED, JobStatus.PAUSED)


@dataclass(frozen=True, slots=True)
class JobView:
    """One unfinished job: its profile, where it stands, its group's key (None outside a group) and its
    arrival (the order Harmony considers waiting jobs in). `load_seconds` is its remote loading per iteration
    as measured now (in a group: under the current cache and IO; waiting: at an equal share of the remote IO
    with one more job running), 0 where nothing is read remotely: a storage-aware policy profiles it as its
    third resource, an oblivious one does not see it."""

    profile: JobProfile
    status: JobStatus
    arrival: float
    group: int | None = None
    load_seconds: float = 0.0

    @property
    def job_id(self) -> str:
        return self.profile.job_id


@dataclass(frozen=True, slots=True)
class GroupView:
    """A running group: its key, members (in the order they joined) and machines."""

    key: int
    job_ids: tuple[str, ...]
    machines: int


@dataclass(frozen=True, slots=True)
class View:
    """The cluster at a scheduling round: `machines` in all, the unfinished jobs by id, the running groups,
    and what triggered the round (jobs that arrived, finished profiling, or finished; a finished job's
    profile and the key of the group it left are kept in `finished`)."""

    time: float
    machines: int
    jobs: Mapping[str, JobView]
    groups: Sequence[GroupView]
    arrived: tuple[str, ...] = ()
    profiled: tuple[str, ...] = ()
    finished: tuple[tuple[JobProfile, int], ...] = ()

    def waiting(self) -> list[JobView]:
        """Profiled jobs in no group, by arrival (then id)."""
        return sorted((job for job in self.jobs.values() if job.status.waiting), key=lambda j: (j.arrival, j.job_id))

    def idle_machines(self) -> int:
        return self.machines - sum(group.machines for group in self.groups)


@dataclass(frozen=True, slots=True)
class PlannedGroup:
    """A group to run: `key` an existing group's to keep it in place (None: a new group), its members and
    machines."""

    key: int | None
    job_ids: tuple[str, ...]
    machines: int


class ColocationPolicy(Protocol):
    """A co-location policy: `plan` is pure and deterministic; `job_iteration_seconds` is how long an iteration
    of each job of a group takes under it, in the group's order (Harmony's pipelined subtasks: T_g of Eq. 1
    for every job; naive co-location: each job at its own pace, slowed by contention); `allocate_storage`
    splits the cache and remote IO among the running groups (`colocation_storage`: a fair share unless the
    policy is storage-aware)."""

    @property
    def name(self) -> str: ...

    def plan(self, view: View) -> Sequence[PlannedGroup]: ...

    def job_iteration_seconds(self, jobs: Sequence[JobProfile], machines: int) -> list[float]: ...

    def allocate_storage(
        self, groups: Sequence[Group], needs: Mapping[str, DataNeed], cache_bytes: int, io_bytes_per_sec: float
    ) -> StorageShare: ...
