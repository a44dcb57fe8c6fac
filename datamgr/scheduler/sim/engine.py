"""The trace-driven simulator: a scheduler's policy run on a modelled cluster, event by event.

`simulate` replays a trace on a cluster with a `Scheduler` (`registry.build_scheduler`), the same policy
objects the live controller runs; policies see only snapshots, never the simulator.

Events (`events.EventQueue`, keyed (time, priority, seq)): arrivals; policy rounds, at every instant a job
arrives or finishes and at most `config.round_seconds` after the last round (the timer restarts at every
round, as the live controller's does), or, for a round-based policy (`Scheduler.round_seconds`, Gavel), on
its own period only; job boundaries, where a running job ends a segment of its reads (an epoch or a
curriculum pass under uniform caching, a window under LRU) or finishes; and timeline samples every
`config.sample_seconds`. A running job left out of a round's placements is preempted: it stops, keeps its
progress (and its place in its epoch), and counts a preemption; a placement that changes but stays
non-empty is not a preemption. When a preempted job resumes it first restores its checkpoint for
`config.preemption_seconds`, holding its GPUs and reading nothing (the whole preempt-and-resume cost is paid
at the resume: Tiresias measured the pair, and charging it there frees the preempted GPUs at once for the job
that preempted it). A preempted job with a grace period (FitGpp's) suspends first: stopped and reading nothing,
it holds its GPUs (and CPUs and RAM) until the period ends, then releases them, which triggers a round as a
finish does; until then no decision may place it. A decision's `job_states` reach the named jobs' next
snapshots (`JobState.policy_state`), and its `wake_at` schedules a round then, however quiet the cluster is
(each decision's wake-up replaces the one before: a policy asks for its next round, not for every round it
once predicted).

Between events every rate is constant, so progress integrates exactly. A running job's rate is
`min(f*(job, gpus), io / (1 - hit))` with `hit` its segment's hit ratio from the cache model (`caches`), not
from its allocation; hits + remote bytes = bytes read, and a job's remote rate, `rate x (1 - hit)`, never
exceeds its IO allocation, whose sum the decision check holds to the cluster limit. The next event is the
earliest of arrivals, rounds, samples and each running job's segment end or finish; a job's boundary is
rescheduled only when its rate or segment changes, and jobs are brought up to date lazily, so a boundary
costs work for that job and its cache space only.

Each sample also counts what the running regular jobs hold (a regular job: one its policy does not mark as
run preemptibly, `policy_state["opportunistic"] == 1`, as HiveD's policies mark their low-priority jobs): their
GPUs and the nodes where they use any GPU (`_RegularUse`, kept up to date as placements and policy states
change, so a sample costs nothing per running job). The same counts, with whether jobs run and whether their
demand with no cache exceeds the remote IO limit, are integrated over time exactly (`_UsageMeter`): they change
only at rounds and finishes, which bring the integral up to date.

Results: one `JobOutcome` per finished job, the samples, the jobs a `config.time_limit` left unfinished (and
where each stood then: running, waiting or not yet arrived), the remote IO ledger (the cluster's total
remote rate at every change) and the integrated usage (`model.Usage`). The same inputs and seed give the same
result: randomness comes only from the seed (the LRU model's read orders) and ties break by event sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple, TextIO

from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import Scheduler
from datamgr.scheduler.sim.caches import LRU_CACHE_SYSTEMS, CacheModel
from datamgr.scheduler.sim.decisions import check_decision, decision_record
from datamgr.scheduler.sim.events import EventKind, EventQueue
from datamgr.scheduler.sim.jobs import JobRun
from datamgr.scheduler.sim.lru import LruPool
from datamgr.scheduler.sim.measures import EqualShareRates, EqualShareWork, Fairness, fairness
from datamgr.scheduler.sim.model import (
    HORIZON_SECONDS,
    HORIZON_YEARS,
    MAX_GPUS,
    MAX_NODES,
    NOT_ARRIVED,
    RUNNING,
    WAITING,
    YEAR_SECONDS,
    ClusterSpec,
    JobOutcome,
    RemoteIoLedger,
    Sample,
    SimConfig,
    SimResult,
    SimulationStalled,
    TraceJob,
    UnfinishedJob,
    Usage,
)
from datamgr.scheduler.sim.uniform import UniformCache
from datamgr.scheduler.snapshot import OPPORTUNISTIC, DatasetState, JobState, Snapshot
from datamgr.validation import MAX_GRACE_SECONDS
from silodlib.units import format_rate, format_size

Progress = Callable[[float, int, int], None]


def simulate(
    trace: Sequence[TraceJob],
    cluster: ClusterSpec,
    scheduler: Scheduler,
    config: SimConfig = SimConfig(),  # noqa: B008 - immutable
    *,
    decision_log: TextIO | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Run `trace` on `cluster` under `scheduler` and report what happened.

    `decision_log` receives one JSON line per policy round (see `decisions.decision_record`); `progress` is
    called as `progress(sim_time, finished_jobs, total_jobs)` at each job finish and at the end. Raises
    ValueError for a trace or cluster the run cannot use, `decisions.InvalidDecision` if the policy breaks
    a resource limit, and `SimulationStalled` if jobs are left that can never progress (no time limit set).
    """
    check_inputs(trace, cluster)
    return _Run(trace, cluster, scheduler, config, decision_log, progress).run()


REMOTE_IO_UNIT_HINT = "check the unit of remote_io (a bare number is bytes/s)"


def check_inputs(trace: Sequence[TraceJob], cluster: ClusterSpec, remote_io_hint: str = REMOTE_IO_UNIT_HINT) -> None:
    """Raise ValueError naming the job and the rule for a trace the cluster cannot run, or one the simulator would
    take hours or all memory to: past its horizon (`model.HORIZON_YEARS`), on more than `model.MAX_NODES` nodes or
    `model.MAX_GPUS` GPUs, with a grace period of more than a day. `remote_io_hint` ends the message of a remote IO
    limit too slow to bring the datasets in within the horizon: what to check where the limit came from (the
    cluster file's `remote_io`, or a scale of it the caller applied)."""
    if cluster.nodes < 1 or cluster.gpus_per_node < 1:
        raise ValueError(f"the cluster needs at least one node with a GPU, not {cluster}")
    if cluster.nodes > MAX_NODES or cluster.total_gpus > MAX_GPUS:
        raise ValueError(
            f"the cluster has {cluster.nodes:,} nodes and {cluster.total_gpus:,} GPUs; the simulator takes at most "
            f"{MAX_NODES:,} nodes and {MAX_GPUS:,} GPUs"
        )
    if cluster.cache_bytes_per_node < 0 or not cluster.remote_io_bytes_per_sec > 0:
        raise ValueError(f"the cluster needs a cache of at least 0 bytes and a positive remote IO limit: {cluster}")
    sizes: dict[str, int] = {}
    seen: set[str] = set()
    for job in trace:
        where = f"trace job {job.job_id!r}"
        if job.job_id in seen:
            raise ValueError(f"{where}: the id is used twice")
        seen.add(job.job_id)
        if not 1 <= job.gpus <= cluster.total_gpus:
            raise ValueError(f"{where}: needs {job.gpus} GPUs; the cluster has {cluster.total_gpus}")
        _check_host_demand(job, cluster, where)
        if cluster.tenants and job.tenant and job.tenant not in cluster.tenants:
            names = ", ".join(sorted(cluster.tenants))
            raise ValueError(f"{where}: tenant {job.tenant!r} has no VC; the cluster's tenants are {names}")
        if not job.arrival >= 0:
            raise ValueError(f"{where}: arrival {job.arrival!r} is before the trace start")
        for name in ("ideal_bytes_per_sec", "dataset_bytes", "epochs"):
            if not getattr(job, name) > 0:
                raise ValueError(f"{where}: {name} must be positive, not {getattr(job, name)!r}")
        _check_within_horizon(job, where)
        known = sizes.setdefault(job.dataset, job.dataset_bytes)
        if known != job.dataset_bytes:
            raise ValueError(
                f"{where}: dataset {job.dataset!r} is {job.dataset_bytes} bytes, an earlier job says {known}"
            )
    _check_egress_within_horizon(trace, cluster, remote_io_hint)


def _check_within_horizon(job: TraceJob, where: str) -> None:
    past = f"past the simulator's horizon of {HORIZON_YEARS} years"
    if job.arrival > HORIZON_SECONDS:
        raise ValueError(
            f"{where}: arrival {job.arrival:.10g} s is {job.arrival / YEAR_SECONDS:.3g} years after the trace start, "
            f"{past}: arrivals count from the trace start (a timestamp is not one: subtract the first arrival)"
        )
    ideal_seconds = job.epochs * job.dataset_bytes / job.ideal_bytes_per_sec
    if ideal_seconds > HORIZON_SECONDS:
        raise ValueError(
            f"{where}: it would run {ideal_seconds / YEAR_SECONDS:.3g} years even at its ideal rate "
            f"({job.epochs:g} epochs of {format_size(job.dataset_bytes)} at {format_rate(job.ideal_bytes_per_sec)}), "
            f"{past}: check the units of its ideal_rate and dataset_size (an ideal_rate of 114 is 114 bytes/s)"
        )


def _check_egress_within_horizon(trace: Sequence[TraceJob], cluster: ClusterSpec, hint: str) -> None:
    """Every byte a job reads comes from remote storage once, at least: each dataset's bytes its jobs read (an epoch
    reads each once), whatever the caches, through the remote IO limit. That time bounds the run from below."""
    read_once: dict[str, float] = {}
    for job in trace:
        read_once[job.dataset] = max(read_once.get(job.dataset, 0.0), min(job.epochs, 1.0) * job.dataset_bytes)
    needed = sum(read_once.values())
    seconds = needed / cluster.remote_io_bytes_per_sec
    if seconds > HORIZON_SECONDS:
        raise ValueError(
            f"the trace's jobs read at least {format_size(needed)} from remote storage, {seconds / YEAR_SECONDS:.3g} "
            f"years at the cluster's remote IO limit of {format_rate(cluster.remote_io_bytes_per_sec)}, past the "
            f"simulator's horizon of {HORIZON_YEARS} years: {hint}"
        )


def _check_host_demand(job: TraceJob, cluster: ClusterSpec, where: str) -> None:
    """A job asking for CPUs or RAM runs on one node, which must have them (and a GP is from 0 to a day)."""
    if not 0 <= job.grace_seconds <= MAX_GRACE_SECONDS:
        raise ValueError(
            f"{where}: grace period {job.grace_seconds!r} s must be from 0 to a day ({MAX_GRACE_SECONDS:,.0f} s), "
            "as the data manager takes a job's"
        )
    if not (job.cpus or job.ram_bytes):
        return
    if not cluster.cpus_per_node:
        raise ValueError(f"{where}: asks for CPUs and RAM, but the cluster gives none per node (cpus_per_node)")
    for name, asked, has in (
        ("GPUs", job.gpus, cluster.gpus_per_node),
        ("CPUs", job.cpus, cluster.cpus_per_node),
        ("bytes of RAM", job.ram_bytes, cluster.ram_bytes_per_node),
    ):
        if asked > has:
            raise ValueError(f"{where}: runs on one node and needs {asked:g} {name}; a node has {has:g}")


def cache_model_for(cache_system: str, cluster: ClusterSpec, config: SimConfig) -> CacheModel:
    """The model of `cache_system`'s caching (see `caches`): LRU over the whole cluster cache, or uniform
    caching with quotas and private copies as each decision shapes them."""
    if cache_system in LRU_CACHE_SYSTEMS:
        return LruPool(cluster.total_cache_bytes, config)
    return UniformCache()


_NOWHERE: Mapping[str, int] = MappingProxyType({})


class _RegularUse:
    """The GPUs and nodes the running regular jobs hold, kept up to date job by job (`update`) rather than
    recounted at each sample. A regular job is a running job its policy does not mark as run preemptibly
    (`policy_state[OPPORTUNISTIC] == 1.0`, HiveD's low-priority jobs), so under a policy that marks none every
    running job is regular. A node is fragmented while a regular job uses any of its GPUs: it is not available
    for a whole-node regular job (HiveD's fragmentation level counts over regular jobs only, as low-priority
    jobs do not affect its scheduling decisions)."""

    __slots__ = ("busy_gpus", "counted", "jobs_on_node")

    def __init__(self) -> None:
        self.busy_gpus = 0
        self.counted: dict[str, Mapping[str, int]] = {}  # regular running job -> the placement counted for it
        self.jobs_on_node: dict[str, int] = {}  # node -> regular running jobs using any of its GPUs

    @property
    def fragmented_nodes(self) -> int:
        return len(self.jobs_on_node)

    def update(self, job: JobRun) -> None:
        """Count `job` as it stands now: its placement if it runs as a regular job, nothing otherwise."""
        regular = job.gpus > 0 and job.policy_state.get(OPPORTUNISTIC, 0.0) != 1.0
        placement = job.placement if regular else _NOWHERE
        counted = self.counted.get(job.job_id, _NOWHERE)
        if placement is counted:  # a job's placement is replaced, never changed in place
            return
        on_node = self.jobs_on_node
        for node, gpus in counted.items():
            self.busy_gpus -= gpus
            if on_node[node] == 1:
                del on_node[node]
            else:
                on_node[node] -= 1
        for node, gpus in placement.items():
            self.busy_gpus += gpus
            on_node[node] = on_node.get(node, 0) + 1
        if regular:
            self.counted[job.job_id] = placement
        else:
            self.counted.pop(job.job_id, None)


class _UsageMeter:
    """`model.Usage` as the run goes: each count held since the last change, times the time since. `change` is
    called wherever a count may have changed (a round, a finish), never per sample or per job."""

    __slots__ = (
        "at",
        "fragmented",
        "fragmented_node_seconds",
        "gpu_seconds",
        "gpus",
        "io_bound",
        "io_bound_seconds",
        "regular_gpu_seconds",
        "regular_gpus",
        "running",
        "running_seconds",
    )

    def __init__(self) -> None:
        self.at = 0.0
        self.gpus = 0
        self.regular_gpus = 0
        self.fragmented = 0
        self.running = False
        self.io_bound = False
        self.gpu_seconds = 0.0
        self.regular_gpu_seconds = 0.0
        self.fragmented_node_seconds = 0.0
        self.running_seconds = 0.0
        self.io_bound_seconds = 0.0

    def change(self, now: float, gpus: int, regular_gpus: int, fragmented: int, running: bool, io_bound: bool) -> None:
        """The counts from `now` on."""
        self._advance(now)
        self.gpus, self.regular_gpus, self.fragmented = gpus, regular_gpus, fragmented
        self.running, self.io_bound = running, io_bound

    def usage(self, end: float) -> Usage:
        """The integrals from the start to `end` (no earlier than the last change)."""
        self._advance(end)
        return Usage(
            end=end,
            gpu_seconds=self.gpu_seconds,
            regular_gpu_seconds=self.regular_gpu_seconds,
            fragmented_node_seconds=self.fragmented_node_seconds,
            running_seconds=self.running_seconds,
            io_bound_seconds=self.io_bound_seconds,
        )

    def _advance(self, now: float) -> None:
        elapsed = now - self.at
        if elapsed > 0.0:
            self.gpu_seconds += self.gpus * elapsed
            self.regular_gpu_seconds += self.regular_gpus * elapsed
            self.fragmented_node_seconds += self.fragmented * elapsed
            if self.running:
                self.running_seconds += elapsed
                if self.io_bound:
                    self.io_bound_seconds += elapsed
            self.at = now


@dataclass(frozen=True, slots=True)
class _Arrival:
    job: JobRun


class _Boundary(NamedTuple):  # scheduled at every rate change: a tuple is cheaper to build than a dataclass
    job: JobRun
    version: int  # stale once the job's version moves on


class _Released(NamedTuple):
    job: JobRun  # its grace period is over (a suspending job can be neither placed nor finished: never stale)


class _Restored(NamedTuple):
    job: JobRun
    until: float  # the restore it ends; stale if the job was preempted and resumed since


@dataclass(frozen=True, slots=True)
class _Round:
    timer: int  # the round timer's generation this round was set by; 0: triggered by an arrival or finish


@dataclass(frozen=True, slots=True)
class _Wake:
    generation: int  # the policy's wake-up this is; stale once a later decision asked for another (or none)


class _Run:
    """One simulation's state; `run` drives it to the end."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        cluster: ClusterSpec,
        scheduler: Scheduler,
        config: SimConfig,
        decision_log: TextIO | None,
        progress: Progress | None,
    ) -> None:
        self.cluster = cluster
        self.scheduler = scheduler
        self.config = config
        self.decision_log = decision_log
        self.progress = progress
        self.queue: EventQueue[_Arrival | _Boundary | _Released | _Restored | _Round | _Wake] = EventQueue()
        self.cache = cache_model_for(scheduler.cache_system, cluster, config)
        self.nodes = cluster.node_states()
        self.jobs = [JobRun(job, config.preemption_seconds) for job in trace]
        self.present: dict[str, JobRun] = {}  # arrived, not finished
        self.running: dict[str, JobRun] = {}
        self.suspending = 0  # preempted jobs holding their resources through a grace period
        self.arrivals_left = len(self.jobs)
        self.finished: list[JobOutcome] = []
        self.samples: list[Sample] = []
        self.ledger = RemoteIoLedger()
        self.throughput = 0.0  # bytes/s read by all running jobs
        self.remote = 0.0  # bytes/s fetched by all running jobs
        self.busy_gpus = 0
        self.regular = _RegularUse()
        self.usage = _UsageMeter()
        self.demand = 0.0  # bytes/s the running jobs would read at full speed (f* on the GPUs they hold)
        self.rates_changed = True  # since the last sample's fairness
        self.last_fairness = fairness([], jobs_waiting=False)
        self.equal_share_rates = EqualShareRates(cluster)
        self.equal_share_work = EqualShareWork(cluster)
        self.last_round = -math.inf
        self.round_requested_at = -math.inf
        self.timer = 0  # the generation of the pending timed round; an earlier one's event is stale
        # A round-based policy (Gavel) decides on its own grid only; arrivals and finishes wait for it.
        self.fixed_round = scheduler.round_seconds
        self.dataset_states: dict[str, DatasetState] = {}  # the last snapshot's, reused while unchanged
        self.wake = 0  # the generation of the policy's pending wake-up; an earlier one's event is stale

    @property
    def now(self) -> float:
        return self.queue.now

    def run(self) -> SimResult:
        for job in sorted(self.jobs, key=lambda j: j.trace.arrival):
            self.queue.schedule(job.trace.arrival, EventKind.ARRIVAL, _Arrival(job))
        self.queue.schedule(0.0, EventKind.ROUND, _Round(timer=0))
        self.queue.schedule(0.0, EventKind.SAMPLE)
        self.ledger.record(0.0, 0.0)
        limit = self.config.time_limit
        while len(self.finished) < len(self.jobs):
            upcoming = self.queue.peek_time()
            if upcoming is None or (limit is not None and upcoming > limit):
                break
            match self.queue.pop():
                case _Boundary(job, version) if version == job.version:
                    self._boundary(job)
                case _Arrival(job):
                    self._arrive(job)
                case _Restored(job, until) if until == job.restoring_until:
                    job.advance(self.now)
                    job.restored()
                    self._update_rates(job, segment_changed=False)
                    self.ledger.record(self.now, self.remote)
                case _Released(job):
                    job.released()
                    self.suspending -= 1
                    self._request_round()
                case _Round(timer) if timer in (0, self.timer):
                    self._round(timed=timer > 0)
                case _Wake(generation) if generation == self.wake:
                    self._round(timed=False)
                case None:  # a timeline sample
                    self._sample()
        end = self.now if limit is None or len(self.finished) == len(self.jobs) else limit
        for job in self.running.values():
            job.advance(end)
        self.ledger.end = end
        if self.progress is not None:
            self.progress(end, len(self.finished), len(self.jobs))
        return SimResult(
            policy=self.scheduler.policy.name,
            cache_system=self.scheduler.cache_system,
            jobs=self.finished,
            samples=self.samples,
            unfinished_jobs=[self._unfinished(job) for job in self.jobs if job.finished_at is None],
            remote_io=self.ledger,
            usage=self.usage.usage(end),
        )

    def _unfinished(self, job: JobRun) -> UnfinishedJob:
        """Where a job stood when the run stopped before it finished."""
        state = RUNNING if job.job_id in self.running else WAITING if job.job_id in self.present else NOT_ARRIVED
        return UnfinishedJob(job.job_id, job.trace.arrival, state)

    def _arrive(self, job: JobRun) -> None:
        self.arrivals_left -= 1
        self.present[job.job_id] = job
        job.equal_share_mark = self.equal_share_work.arrive(job.shape, self.now)
        self.rates_changed = True
        self._request_round()

    def _boundary(self, job: JobRun) -> None:
        now = self.now
        job.advance(now)
        if job.finish_pending:
            self._finish(job)
            return
        assert job.segment is not None  # a job with a scheduled boundary is reading a segment
        job.segment.bytes_left = 0.0  # reached, up to float rounding
        self.cache.begin_segment(job, now)
        self._update_rates(job, segment_changed=True)
        self.ledger.record(now, self.remote)

    def _finish(self, job: JobRun) -> None:
        now = self.now
        self.throughput -= job.rate
        self.remote -= job.remote_rate
        self.busy_gpus -= job.gpus
        self.demand -= job.ideal
        self.rates_changed = True
        job.finish(now, self.equal_share_work.finish(job.shape, now, job.equal_share_mark))
        del self.running[job.job_id]
        del self.present[job.job_id]
        self.regular.update(job)
        self.cache.release(job, now)
        self.finished.append(job.outcome())
        self.ledger.record(now, self.remote)
        self._usage_changed()
        if self.progress is not None:
            self.progress(now, len(self.finished), len(self.jobs))
        self._request_round()

    def _request_round(self) -> None:
        if self.fixed_round is None and self.round_requested_at != self.now:
            self.round_requested_at = self.now
            self.queue.schedule(self.now, EventKind.ROUND, _Round(timer=0))

    def _round(self, timed: bool) -> None:
        now = self.now
        if now == self.last_round:  # several triggers at one instant decide once
            return
        self.last_round = now
        self.timer += 1  # whatever set it, the next round is due at most `round_seconds` from now
        period = self.config.round_seconds if self.fixed_round is None else self.fixed_round
        self.queue.schedule(now + period, EventKind.ROUND, _Round(timer=self.timer))
        for job in self.running.values():
            job.advance(now)
        snapshot = self._snapshot()
        decision = self.scheduler.decide(snapshot)
        check_decision(decision, snapshot, self.scheduler.name)
        placements = decision.placements
        if placements is None:
            placements = {job_id: job.placement for job_id, job in self.running.items()}
        io = decision.io_bytes_per_sec or {}
        stopped = [job for job_id, job in self.running.items() if not placements.get(job_id)]
        for job in stopped:
            held = job.placement
            job.place({}, 0.0, now)
            del self.running[job.job_id]
            self.regular.update(job)
            if job.trace.grace_seconds > 0.0:
                job.suspend(held)
                self.suspending += 1
                self.queue.schedule(now + job.trace.grace_seconds, EventKind.JOB, _Released(job))
        changed: set[str] = set()  # running jobs whose rates may have changed; the others' provably have not
        for job_id, placement in placements.items():
            if placement:
                job = self.present[job_id]
                if job.place(placement, float(io.get(job_id, 0)), now):
                    changed.add(job_id)
                    if job.restoring_until > now:
                        self.queue.schedule(job.restoring_until, EventKind.JOB, _Restored(job, job.restoring_until))
                    self.regular.update(job)
                self.running[job_id] = job
        self._carry_policy_state(decision)
        storage = decision.cache_bytes or {}
        changed.update(
            job.job_id for job in self.cache.allocate(now, storage, decision.job_cache_bytes, self.running.values())
        )
        for job in self.running.values():
            starting = job.segment is None
            if starting:
                self.cache.begin_segment(job, now)
            if starting or job.job_id in changed:
                self._update_rates(job, segment_changed=starting)
        for job in stopped:
            self._update_rates(job, segment_changed=False)
        self.throughput = math.fsum(job.rate for job in self.running.values())  # shed incremental float drift
        self.remote = math.fsum(job.remote_rate for job in self.running.values())
        self.busy_gpus = sum(job.gpus for job in self.running.values())
        self.demand = math.fsum(job.ideal for job in self.running.values())
        self.ledger.record(now, self.remote)
        self._usage_changed()
        if self.decision_log is not None:
            io_used = {job_id: job.io for job_id, job in self.running.items()}
            line = decision_record(now, decision, placements, self.cache.cached_bytes(now), io_used)
            self.decision_log.write(line + "\n")
        if timed and self._stalled():
            raise SimulationStalled(
                f"scheduler {self.scheduler.name} at t={now:g}s: {len(self.present)} jobs are left, none is making "
                "progress and none is due to arrive; set a time limit to cut such a run short"
            )

    def _usage_changed(self) -> None:
        """What the running jobs hold from now on, for the usage integrals (after a round or a finish)."""
        regular = self.regular
        io_bound = self.demand > self.cluster.remote_io_bytes_per_sec
        self.usage.change(
            self.now, self.busy_gpus, regular.busy_gpus, regular.fragmented_nodes, bool(self.running), io_bound
        )

    def _carry_policy_state(self, decision: Decision) -> None:
        """Keep the state the policy handed back for each job, and wake it when it asked to be."""
        for job_id, state in decision.job_states.items():
            job = self.present.get(job_id)
            if job is not None:
                job.hand_state(state)
                self.regular.update(job)  # a running job may have turned regular or preemptible
        self.wake += 1  # the latest decision's wake-up replaces any earlier one
        wake_at = decision.wake_at
        if wake_at is not None and self.now < wake_at < math.inf:
            self.queue.schedule(wake_at, EventKind.ROUND, _Wake(self.wake))

    def _stalled(self) -> bool:
        idle = self.throughput <= 0.0 and not self.arrivals_left
        restoring = any(job.restoring_until > self.now for job in self.running.values())
        waiting = restoring or self.suspending > 0  # a restore's or a grace period's end is still to come
        return idle and not waiting and bool(self.present) and self.config.time_limit is None

    def _update_rates(self, job: JobRun, segment_changed: bool) -> None:
        """Recompute a job's rates after its allocation or segment changed (it must be up to date)."""
        rate, remote = job.current_rates()
        self.throughput += rate - job.rate
        self.remote += remote - job.remote_rate
        rate_changed = rate != job.rate
        fetch_changed = remote != job.remote_rate
        job.rate, job.remote_rate = rate, remote
        self.rates_changed = self.rates_changed or rate_changed
        if job.segment is not None and (fetch_changed or segment_changed):
            self.cache.fetching(job, self.now)
        if rate_changed or segment_changed:
            job.version += 1
            seconds, finishing = job.time_to_boundary()
            job.finish_pending = finishing
            if seconds < math.inf:
                self.queue.schedule(self.now + seconds, EventKind.JOB, _Boundary(job, job.version))

    def _snapshot(self) -> Snapshot:
        jobs: dict[str, JobState] = {job_id: job.state() for job_id, job in self.present.items()}
        cached = self.cache.cached_bytes(self.now)
        quotas = self.cache.quota_bytes()
        previous = self.dataset_states
        datasets: dict[str, DatasetState] = {}
        for job in self.present.values():
            dataset = job.trace.dataset
            if dataset in datasets:
                continue
            quota, held = quotas.get(dataset, 0), int(cached.get(dataset, 0.0))
            state = previous.get(dataset)
            if state is None or state.cache_quota_bytes != quota or state.cached_bytes != held:
                state = DatasetState(dataset, job.trace.dataset_bytes, quota, held)
            datasets[dataset] = state
        self.dataset_states = datasets
        return Snapshot(
            time=self.now,
            nodes=self.nodes,
            remote_io_bytes_per_sec=self.cluster.remote_io_bytes_per_sec,
            datasets=datasets,
            jobs=jobs,
            seed=self.config.seed,
            tenants=self.cluster.tenants,
            cell_levels=self.cluster.cell_levels,
        )

    def _sample(self) -> None:
        now = self.now
        self.queue.schedule(now + self.config.sample_seconds, EventKind.SAMPLE)
        fair = self._fairness()
        cache = self.cache.totals(now)
        self.samples.append(
            Sample(
                time=now,
                throughput_bytes_per_sec=self.throughput,
                remote_io_bytes_per_sec=self.remote,
                busy_gpus=self.busy_gpus,
                running_jobs=len(self.running),
                queued_jobs=len(self.present) - len(self.running),
                cached_bytes=round(cache.cached_bytes),
                effective_cached_bytes=round(cache.effective_bytes),
                fairness_min=fair.minimum,
                fairness_mean=fair.mean,
                demand_bytes_per_sec=self.demand,
                regular_busy_gpus=self.regular.busy_gpus,
                fragmented_nodes=self.regular.fragmented_nodes,
            )
        )

    def _fairness(self) -> Fairness:
        """The running jobs' fairness ratios (`measures`), recomputed only when a rate or the job count changed."""
        if self.rates_changed:
            ratios: list[float] = []
            if self.present:
                present, equal = len(self.present), self.equal_share_rates
                ratios = [
                    job.rate
                    / equal.rate(present, job.trace.ideal_bytes_per_sec, job.trace.gpus, job.trace.dataset_bytes)
                    for job in self.running.values()
                ]
            self.last_fairness = fairness(ratios, jobs_waiting=bool(self.present))
            self.rates_changed = False
        return self.last_fairness
