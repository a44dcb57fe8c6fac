"""Harmony's performance model of co-located jobs (its section IV-B2), pure.

A parameter-server job iterates COMP (CPU) then COMM (network: PULL and PUSH). Harmony co-locates a *job
group* on a set of m_g machines and pipelines the subtasks of its jobs so that one COMP and one COMM run at a
time, each on a different job. A job's COMP time shrinks with the group's degree of parallelism (DoP), its
COMM time does not (Eq. 2):

    T_cpu_j(m_g) = C_j / m_g          C_j: the job's CPU machine-seconds per iteration      Eq. 2

and the group's iteration, in which every job finishes one iteration, takes (Eq. 1)

    T_g = max(sum_j T_cpu_j, sum_j T_net_j, max_j T_itr_j)                                   Eq. 1

the first two terms the resource-bound cases (one resource busy all the time), the third the job-bound case
(one job's own iteration longer than the others' subtasks together). Utilisation per group (Eq. 3) is the
share of T_g each resource is busy; the cluster's (Eq. 4) is the machine-weighted average over groups.

**Data loading, the third resource (SiloD).** A job may also read its input each iteration: `load_seconds`,
the time its reads take from remote storage at the remote IO rate it is given (cache hits cost nothing). A
data loader prefetches the next iteration's input while the current one computes and communicates, so loading
is pipelined with the job's own subtasks: its own iteration is max(T_cpu + T_net, T_load). Each job loads at
its own rate (remote IO is allocated per job from the cluster's egress), so loads add no summed term to
Eq. 1; they enter through its job-bound term, which is how a starved loader holds up its whole group (the
group iterates in lockstep). With `load_seconds = 0` (Harmony's own jobs, whose input sits in memory) every
formula here is the paper's.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobProfile:
    """What Harmony profiles of a job (its T_cpu, T_net at some DoP, section IV-B1), normalised to DoP-free
    numbers: `cpu_machine_seconds` is T_cpu x DoP (Eq. 2's constant), `net_seconds` T_net, `load_seconds` the
    per-iteration input reads from remote storage (0 unless the SiloD variant models them)."""

    job_id: str
    cpu_machine_seconds: float
    net_seconds: float
    load_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.cpu_machine_seconds > 0:
            raise ValueError(
                f"job {self.job_id}: cpu_machine_seconds must be positive, not {self.cpu_machine_seconds!r}"
            )
        for name in ("net_seconds", "load_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"job {self.job_id}: {name} must be at least 0, not {getattr(self, name)!r}")

    def cpu_seconds(self, machines: float) -> float:
        """T_cpu at DoP `machines` (Eq. 2)."""
        return self.cpu_machine_seconds / machines

    def iteration_seconds(self, machines: float) -> float:
        """T_itr: the job's own iteration at DoP `machines`, COMP then COMM, input prefetched alongside."""
        return max(self.cpu_seconds(machines) + self.net_seconds, self.load_seconds)


@dataclass(frozen=True, slots=True)
class ResourceTimes:
    """A group's subtask times summed per resource, and its slowest job's own iteration (loading included),
    at one DoP."""

    cpu: float
    net: float
    longest_job: float

    @property
    def iteration(self) -> float:
        """T_g (Eq. 1)."""
        return max(self.cpu, self.net, self.longest_job)


def resource_times(jobs: Iterable[JobProfile], machines: float) -> ResourceTimes:
    """The sums Eq. 1 takes the maximum of, for `jobs` co-located on `machines`."""
    cpu = net = longest = 0.0
    for job in jobs:
        cpu += job.cpu_seconds(machines)
        net += job.net_seconds
        longest = max(longest, job.iteration_seconds(machines))
    return ResourceTimes(cpu, net, longest)


def group_iteration_seconds(jobs: Sequence[JobProfile], machines: float) -> float:
    """T_g: one iteration of every job of the group (Eq. 1). Raises ValueError for an empty group or no machine."""
    _check_group(jobs, machines)
    return resource_times(jobs, machines).iteration


@dataclass(frozen=True, slots=True)
class Utilisation:
    """U = [U_cpu, U_net] (Eq. 3, 4)."""

    cpu: float
    net: float

    def better_than(self, other: Utilisation) -> bool:
        """Harmony treats CPU utilisation as more important than the network's, "since CPU resources directly
        contribute to the job progress" (section IV-B2): higher CPU wins, the network breaks a tie (within
        1e-9, float noise)."""
        if abs(self.cpu - other.cpu) > 1e-9:
            return self.cpu > other.cpu
        return self.net > other.net + 1e-9

    def gain_over(self, other: Utilisation) -> float:
        """The relative improvement of CPU utilisation over `other` (the measure Harmony's 5 % thresholds
        compare): 0.05 is 5 % better. `other` with no CPU use counts any gain as infinite."""
        if other.cpu <= 0:
            return float("inf") if self.cpu > 0 else 0.0
        return self.cpu / other.cpu - 1.0


def group_utilisation(jobs: Sequence[JobProfile], machines: float) -> Utilisation:
    """U(g) (Eq. 3): the share of the group iteration each resource is busy."""
    _check_group(jobs, machines)
    times = resource_times(jobs, machines)
    iteration = times.iteration
    return Utilisation(times.cpu / iteration, times.net / iteration)


@dataclass(frozen=True, slots=True)
class Group:
    """A job group and the machines it runs on (m_g, at least 1)."""

    jobs: tuple[JobProfile, ...]
    machines: int

    def __post_init__(self) -> None:
        _check_group(self.jobs, self.machines)

    @property
    def iteration_seconds(self) -> float:
        return resource_times(self.jobs, self.machines).iteration

    @property
    def utilisation(self) -> Utilisation:
        return group_utilisation(self.jobs, self.machines)

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(job.job_id for job in self.jobs)


def cluster_utilisation(groups: Sequence[Group]) -> Utilisation:
    """U (Eq. 4): each group's U(g) weighted by its machines. No group: nothing is used."""
    machines = sum(group.machines for group in groups)
    if machines == 0:
        return Utilisation(0.0, 0.0)
    parts = [(group.machines, group.utilisation) for group in groups]
    return Utilisation(
        sum(m * u.cpu for m, u in parts) / machines,
        sum(m * u.net for m, u in parts) / machines,
    )


def compute_intensity(jobs: Sequence[JobProfile], machines: int) -> float:
    """How CPU-bound a group is at `machines`: its summed COMP time over its summed COMM (> 1: the CPU is its
    bottleneck, and another machine shortens its iteration, Eq. 1-2)."""
    return _intensity(sum(job.cpu_machine_seconds for job in jobs), _net(jobs), machines)


def _net(jobs: Sequence[JobProfile]) -> float:
    return sum(job.net_seconds for job in jobs)


def _intensity(cpu_machine_seconds: float, other: float, machines: int) -> float:
    return cpu_machine_seconds / machines / other if other > 0 else float("inf")


def assign_machines(job_groups: Sequence[Sequence[JobProfile]], machines: int) -> list[int]:
    """Harmony's machine distribution (Algorithm 1, L8): one machine to every group, then one at a time to the
    group that needs it most, the most computation-intensive at its current count, until all are given out.
    Ties go to the earlier group. Raises ValueError when there are fewer machines than groups."""
    if len(job_groups) > machines:
        raise ValueError(f"{len(job_groups)} job groups need at least as many machines, not {machines}")
    cpu = [sum(job.cpu_machine_seconds for job in jobs) for jobs in job_groups]
    other = [_net(jobs) for jobs in job_groups]
    counts = [1] * len(job_groups)
    heap = [(-_intensity(cpu[index], other[index], 1), index) for index in range(len(job_groups))]
    heapq.heapify(heap)
    for _ in range(machines - len(job_groups)):
        _, index = heapq.heappop(heap)
        counts[index] += 1
        heapq.heappush(heap, (-_intensity(cpu[index], other[index], counts[index]), index))
    return counts


def _check_group(jobs: Sequence[JobProfile], machines: float) -> None:
    if not jobs:
        raise ValueError("a job group needs at least one job")
    if not machines >= 1:
        raise ValueError(f"a job group needs at least one machine, not {machines!r}")
