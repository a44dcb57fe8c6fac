"""The co-location simulator: job groups progressing on machines, a policy regrouping them (Harmony's world).

Between events every job of a group that is not starting, resuming or migrating progresses at 1 / T_j
iterations per second, T_j the policy's `job_iteration_seconds` for the group's progressing jobs (for
Harmony's pipelined subtasks, T_g of Eq. 1 for all of them: one iteration of each per group iteration). The
jobs a move holds up stay in their group without progressing while the others go on ("the master simply
pauses the job and executes the other co-located jobs in the meanwhile"). Events: an arrival, a job's finish,
a job's end of profiling (its first `profile_iterations` iterations), and the end of a move; the policy is
asked at each of the first three, with every event due at the same instant in one round. Utilisation is
sampled at every change, so the timeline is exact, not interpolated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from datamgr.scheduler.colocation import Group, JobProfile
from datamgr.scheduler.colocation_storage import NO_STORAGE
from datamgr.scheduler.colocation_view import ColocationPolicy, GroupView, JobStatus, JobView, PlannedGroup, View
from datamgr.scheduler.sim.colocation_model import (
    ColocationCluster,
    ColocationJob,
    ColocationOutcome,
    ColocationResult,
    ColocationSample,
)
from datamgr.scheduler.sim.model import SimulationStalled

_EPSILON = 1e-9  # iterations (and seconds) below which a remainder counts as done: float noise


class InvalidPlan(ValueError):
    """A policy's plan that cannot run: an unknown or finished job, a job in two groups, an empty group, a group
    without machines, more machines than the cluster has, or a key no group holds. The message names it."""


@dataclass(slots=True)
class _Job:
    trace: ColocationJob
    status: JobStatus = JobStatus.NEW
    group: int | None = None
    done: float = 0.0  # iterations completed
    busy_until: float = 0.0  # a start, resume or migration holds it until then
    started: float | None = None
    migrations: int = 0
    pauses: int = 0
    overhead: float = 0.0
    profiled: bool = False

    @property
    def remaining(self) -> float:
        return self.trace.iterations - self.done


@dataclass(slots=True)
class _Group:
    key: int
    members: list[str]
    machines: int


Progress = Callable[[float, int, int], None]  # (simulated time, jobs finished, jobs in all)


def simulate_colocation(
    trace: Sequence[ColocationJob],
    cluster: ColocationCluster,
    policy: ColocationPolicy,
    progress: Progress | None = None,
) -> ColocationResult:
    """Runs every job of `trace` to its finish under `policy`. Raises `InvalidPlan` for a plan that cannot run
    and `SimulationStalled` when jobs are left that nothing will ever run."""
    return _Run(trace, cluster, policy, progress).run()


class _Run:
    def __init__(
        self,
        trace: Sequence[ColocationJob],
        cluster: ColocationCluster,
        policy: ColocationPolicy,
        progress: Progress | None,
    ) -> None:
        ids = [job.job_id for job in trace]
        if len(set(ids)) != len(ids):
            raise ValueError("the trace names a job more than once")
        self.cluster = cluster
        self.policy = policy
        self.progress = progress
        self.arrivals = sorted(trace, key=lambda job: (job.arrival, job.job_id))
        self.total = len(trace)
        self.jobs: dict[str, _Job] = {}
        self.groups: dict[int, _Group] = {}
        self.next_key = 0
        self.now = 0.0
        self.outcomes: list[ColocationOutcome] = []
        self.samples: list[ColocationSample] = []
        self.rounds = 0
        self.storage = NO_STORAGE

    def run(self) -> ColocationResult:
        arrived = self._arrive()
        self._round(arrived, (), ())
        while self.jobs or self.arrivals:
            rates = self._rates()
            step = self._next_event(rates)
            if step is None:
                raise SimulationStalled(
                    f"{len(self.jobs)} jobs are left at {self.now:.0f} s and the policy runs none of them"
                )
            self._advance(rates, step)
            arrived = self._arrive()
            profiled = self._newly_profiled()
            finished = self._finish()
            if self.jobs and (arrived or profiled or finished):
                self._round(arrived, profiled, finished)
            else:
                self._sample()
            if self.progress is not None:
                self.progress(self.now, len(self.outcomes), self.total)
        return ColocationResult(self.policy.name, self.outcomes, self.samples, self.rounds)

    # -- progress ------------------------------------------------------------------------------------------

    def _progressing(self, group: _Group) -> list[str]:
        return [job_id for job_id in group.members if self.jobs[job_id].busy_until <= self.now + _EPSILON]

    def _progress(self, group: _Group) -> list[tuple[ColocationJob, JobProfile, float]]:
        """Each progressing job of `group`: its trace entry, its profile with its remote loading under the
        current storage allocation, and the seconds its iterations take now."""
        members = self._progressing(group)
        if not members:
            return []
        traces = [self.jobs[job_id].trace for job_id in members]
        profiles = [replace(trace.profile, load_seconds=self._load_seconds(trace)) for trace in traces]
        times = self.policy.job_iteration_seconds(profiles, group.machines)
        return list(zip(traces, profiles, times, strict=True))

    def _load_seconds(self, trace: ColocationJob) -> float:
        if trace.read_bytes_per_iteration == 0:
            return 0.0
        return self.storage.load_seconds(trace.job_id, trace.need)

    def _rates(self) -> dict[str, float]:
        """Iterations per second of every progressing job."""
        return {
            trace.job_id: 1.0 / time
            for group in self.groups.values()
            for trace, _, time in self._progress(group)
            if math.isfinite(time)  # a job with no remote IO for data it must read does not progress
        }

    def _next_event(self, rates: dict[str, float]) -> float | None:
        """Seconds to the next event, or None when none will come."""
        times = [job.arrival - self.now for job in self.arrivals[:1]]
        times += [job.busy_until - self.now for job in self.jobs.values() if job.busy_until > self.now + _EPSILON]
        for job_id, rate in rates.items():
            job = self.jobs[job_id]
            times.append(job.remaining / rate)
            if job.status is JobStatus.PROFILING:
                times.append(max(0.0, self.cluster.profile_iterations - job.done) / rate)
        return max(0.0, min(times)) if times else None

    def _advance(self, rates: dict[str, float], seconds: float) -> None:
        for job_id, rate in rates.items():
            self.jobs[job_id].done += rate * seconds
        self.now += seconds

    # -- events --------------------------------------------------------------------------------------------

    def _arrive(self) -> tuple[str, ...]:
        arrived = []
        while self.arrivals and self.arrivals[0].arrival <= self.now + _EPSILON:
            job = self.arrivals.pop(0)
            self.now = max(self.now, job.arrival)
            profiled = self.cluster.profile_iterations == 0
            self.jobs[job.job_id] = _Job(job, JobStatus.PROFILED if profiled else JobStatus.NEW, profiled=profiled)
            arrived.append(job.job_id)
        return tuple(arrived)

    def _newly_profiled(self) -> tuple[str, ...]:
        done = []
        for job_id, job in self.jobs.items():
            if job.status is JobStatus.PROFILING and job.done >= self.cluster.profile_iterations - _EPSILON:
                job.status = JobStatus.RUNNING
                job.profiled = True
                done.append(job_id)
        return tuple(done)

    def _finish(self) -> tuple[tuple[JobProfile, int], ...]:
        finished = []
        for job_id, job in list(self.jobs.items()):
            if job.remaining <= _EPSILON * max(1.0, job.trace.iterations):
                assert job.group is not None and job.started is not None
                group = self.groups[job.group]
                group.members.remove(job_id)
                if not group.members:
                    del self.groups[job.group]
                del self.jobs[job_id]
                finished.append((job.trace.profile, job.group))
                self.outcomes.append(
                    ColocationOutcome(
                        job_id,
                        job.trace.app,
                        job.trace.dataset,
                        job.trace.arrival,
                        job.started,
                        self.now,
                        job.migrations,
                        job.pauses,
                        job.overhead,
                    )
                )
        return tuple(finished)

    # -- rounds --------------------------------------------------------------------------------------------

    def _round(
        self, arrived: tuple[str, ...], profiled: tuple[str, ...], finished: tuple[tuple[JobProfile, int], ...]
    ) -> None:
        loads = self._measured_loads()
        view = View(
            self.now,
            self.cluster.machines,
            {
                job_id: JobView(job.trace.profile, job.status, job.trace.arrival, job.group, loads[job_id])
                for job_id, job in self.jobs.items()
            },
            [GroupView(group.key, tuple(group.members), group.machines) for group in self.groups.values()],
            arrived,
            profiled,
            finished,
        )
        plan = list(self.policy.plan(view))
        self._check(plan)
        self._apply(plan)
        self._allocate_storage()
        self.rounds += 1
        self._sample()

    def _allocate_storage(self) -> None:
        """The policy's split of the cache and remote IO among the groups now running (all their members)."""
        models = [
            Group(tuple(self.jobs[job_id].trace.profile for job_id in group.members), group.machines)
            for group in self.groups.values()
        ]
        needs = {job_id: job.trace.need for job_id, job in self.jobs.items() if job.trace.read_bytes_per_iteration > 0}
        if not needs:
            self.storage = NO_STORAGE
            return
        self.storage = self.policy.allocate_storage(
            models, needs, self.cluster.cache_bytes, self.cluster.remote_io_bytes_per_sec
        )

    def _measured_loads(self) -> dict[str, float]:
        """What each job's remote loading would take now at the remote IO it could use (`JobView.load_seconds`):
        its share plus the egress nobody uses; waiting, at least an equal share among the jobs in groups and
        it. Not its share alone: a share capped at what its group needs makes its load exactly its group's
        iteration, which says nothing of the job. Without an egress limit nothing waits on loading."""
        total = self.cluster.remote_io_bytes_per_sec
        if math.isinf(total):
            return dict.fromkeys(self.jobs, 0.0)
        shares = self.storage.io_bytes_per_sec
        spare = total - sum(shares.values())
        equal = total / (sum(len(group.members) for group in self.groups.values()) + 1)
        loads = {}
        for job_id, job in self.jobs.items():
            remote = self.storage.remote_bytes(job.trace.need)
            rate = shares.get(job_id, 0.0) + spare if job.group is not None else 0.0
            loads[job_id] = remote / max(rate, spare, equal) if remote > 0 else 0.0
        return loads

    def _check(self, plan: Sequence[PlannedGroup]) -> None:
        seen: set[str] = set()
        keys: set[int] = set()
        for group in plan:
            if not group.job_ids:
                raise InvalidPlan(f"{self.policy.name}: a planned group has no jobs")
            if group.machines < 1:
                raise InvalidPlan(f"{self.policy.name}: group {group.job_ids} has {group.machines} machines")
            if group.key is not None:
                if group.key not in self.groups or group.key in keys:
                    raise InvalidPlan(f"{self.policy.name}: no running group has key {group.key} (or it is kept twice)")
                keys.add(group.key)
            for job_id in group.job_ids:
                if job_id not in self.jobs:
                    raise InvalidPlan(f"{self.policy.name}: job {job_id!r} is unknown or finished")
                if job_id in seen:
                    raise InvalidPlan(f"{self.policy.name}: job {job_id!r} is in two groups")
                seen.add(job_id)
        used = sum(group.machines for group in plan)
        if used > self.cluster.machines:
            raise InvalidPlan(f"{self.policy.name}: the plan uses {used} machines of {self.cluster.machines}")

    def _apply(self, plan: Sequence[PlannedGroup]) -> None:
        old = {key: group.machines for key, group in self.groups.items()}
        placed: set[str] = set()
        groups: dict[int, _Group] = {}
        for planned in plan:
            key = planned.key if planned.key is not None else self._new_key()
            groups[key] = _Group(key, list(planned.job_ids), planned.machines)
            for job_id in planned.job_ids:
                self._place(self.jobs[job_id], key, planned.machines, old)
                placed.add(job_id)
        for job_id, job in self.jobs.items():
            if job.group is not None and job_id not in placed:
                job.group = None
                job.busy_until = self.now
                job.pauses += 1
                job.status = JobStatus.PAUSED if job.profiled else JobStatus.NEW
        self.groups = groups

    def _place(self, job: _Job, key: int, machines: int, old: dict[int, int]) -> None:
        """Puts `job` in group `key` on `machines`, charging it what the move costs."""
        if job.group == key and old.get(key) == machines:
            return
        trace = job.trace
        if job.group is not None:
            cost = self.cluster.migration_seconds(trace, old[job.group], machines)
            job.migrations += 1
            job.busy_until = max(job.busy_until, self.now) + cost
        else:
            cost = (
                self.cluster.start_seconds(trace, machines)
                if job.started is None
                else self.cluster.resume_seconds(trace, machines)
            )
            job.busy_until = self.now + cost
        if job.started is None:
            job.started = self.now
        job.overhead += cost
        job.group = key
        if not job.profiled:
            job.status = JobStatus.PROFILING
        elif job.status is not JobStatus.RUNNING:
            job.status = JobStatus.RUNNING

    def _new_key(self) -> int:
        self.next_key += 1
        return self.next_key

    # -- samples -------------------------------------------------------------------------------------------

    def _sample(self) -> None:
        cpu = net = remote = 0.0
        running = 0
        for group in self.groups.values():
            progress = self._progress(group)
            running += len(progress)
            cpu += group.machines * min(1.0, sum(job.cpu_seconds(group.machines) / time for _, job, time in progress))
            net += group.machines * min(1.0, sum(job.net_seconds / time for _, job, time in progress))
            remote += sum(self.storage.remote_bytes(trace.need) / time for trace, _, time in progress)
        waiting = sum(1 for job in self.jobs.values() if job.group is None)
        sample = ColocationSample(
            self.now,
            cpu / self.cluster.machines,
            net / self.cluster.machines,
            running,
            len(self.groups),
            waiting,
            remote,
        )
        if self.samples and math.isclose(self.samples[-1].time, self.now, abs_tol=_EPSILON):
            self.samples[-1] = sample
        else:
            self.samples.append(sample)
