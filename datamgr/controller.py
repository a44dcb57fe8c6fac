"""The live controller: the data manager runs a scheduler policy, applies its storage decisions, and carries
out its compute decisions for the jobs it places.

`silod datamgr serve --policy NAME` runs `registry.build_scheduler(NAME, "silod")` when a job is registered
or finished, at least every `--round` seconds, at the time a decision asks to be woken (`wake_at`), and when
a suspending job's grace period ends, over a snapshot of the registered jobs and nodes. What a job's
registration says about its training reaches the policy too: its epochs as the work it has in all
(`JobState.total_bytes`), its irregular flag, which keeps it in a storage partition of its own, its class
and grace period (`JobState.job_class`, `grace_seconds`: FitGpp's trial-and-error and best-effort jobs), and
its tenant and priority (`JobState.tenant`, `priority`), with the tenants' virtual clusters and the cell
hierarchy (`Snapshot.tenants`, `cell_levels`: HiveD's). Registering or unregistering a tenant runs a round.

Compute. A job registered with its workers runs where it was registered: its placement is the cluster
scheduler's business, and a policy that would move or preempt it is only reported (`unapplied_placements`).
A job registered with GPUs instead is the policy's to place: the controller moves it as the decision says
(`PolicyAllocations.place`), which makes the placement its workers (the nodes mount its dataset for it) and
publishes the decision on WatchDecisions for the cluster's launcher to carry out. The state a policy hands
back per job (`Decision.job_states`) is kept in the job's history, persisted with it, and reaches the next
snapshot as `JobState.policy_state`, with the policy that wrote it (`JobHistory.policy_state_by`): a state dir
outlives a policy (`--policy` may change at any restart), and a state one policy wrote means nothing to
another, which is handed only its own (`lifecycle.policy_state_of`) and starts the other jobs afresh; the first
round after a switch clears the states it cannot read.

Grace periods, for any policy. A job registered with a grace period that a round preempts suspends: the
preemption is published at once (SUSPENDING, with the time its period ends), but it keeps holding the GPUs it
ran on, which the snapshot shows as `JobState.held` (not free for any placement, and the manager refuses one
that would take them or restart the job). When the period ends the controller releases them (the decision
becomes PREEMPTED) and runs a round, as a finish does; the release time is persisted with the job's history,
so a restart neither loses the hold nor ends it early.

Changes go through the manager's own calls, so they get the same validation, persistence and watch push as
AllocateCacheSize and AllocateRemoteIO. Within a round, preemptions go first, then storage decreases, then
starts and migrations, then storage increases, so every intermediate state keeps within the node GPUs and
capacities and the remote IO limit; the starts and migrations go in one change, so that jobs may trade GPUs.
A refused change is logged and tried again by the next round; nothing a round does stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Literal

from datamgr import lifecycle
from datamgr.defaults import DEFAULT_ROUND_SECONDS
from datamgr.entities import DataManagerError, Job
from datamgr.lifecycle import Move
from datamgr.liveness import JobUsage
from datamgr.manager import DataManager
from datamgr.scheduler import perf
from datamgr.scheduler.partition import ByRegularity
from datamgr.scheduler.perf import Estimator, VanillaPerf
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import Scheduler
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot
from datamgr.scheduler.tenancy import TenantShare
from datamgr.state import ClusterState
from silodlib.sharding import pass_share
from silodlib.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)

SETTLE_SECONDS = 0.1  # after a job change, how long to gather the rest of a burst before the round
FIRST_REPORT_POLL_SECONDS = 0.1  # how often a restarted controller looks whether its nodes have reported
TRIGGERS_SHOWN = 3  # a burst's trigger names this many changes, then counts the rest


class RoundRequests:
    """Why the next round should run, gathered until the controller takes them: a burst is one round."""

    def __init__(self) -> None:
        self._reasons: dict[str, None] = {}  # insertion-ordered, without repeats
        self._pending = asyncio.Event()

    def request(self, reason: str) -> None:
        self._reasons[reason] = None
        self._pending.set()

    async def wait(self, timeout: float) -> bool:
        """Whether a request is pending, waiting up to `timeout` seconds for one."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._pending.wait()
        return self._pending.is_set()

    def take(self) -> str:
        """The pending requests as one trigger description; none is pending afterwards."""
        reasons = list(self._reasons)
        self._reasons.clear()
        self._pending.clear()
        shown = ", ".join(reasons[:TRIGGERS_SHOWN])
        hidden = len(reasons) - TRIGGERS_SHOWN
        return f"{shown} and {hidden} more" if hidden > 0 else shown


def snapshot_of(manager: DataManager, remote_io_bytes_per_sec: int, now: float) -> Snapshot:
    """The data manager's jobs, datasets and nodes as a policy sees them at `now` (the manager's wall clock),
    sharing `remote_io_bytes_per_sec`.

    - A job's placement is its workers, counted as GPUs. `gpus` is their total for a job registered with its
      workers, and the GPUs it asked for for a job the policy places (its f* is for all of them).
      `done_bytes` is what it has read in all its runs (`DataManager.bytes_read`: what its history banked
      as it left nodes, and its current nodes' reports since). `total_bytes` is the epochs it registered
      times its dataset's size, or infinite if it registered none (a length-aware policy such as SJF then
      ranks it behind every job that said how long it trains), and `irregular`, `job_class` and
      `grace_seconds` are as registered. Its history (submit time, starts, waits, preemptions, attained
      service, policy state) is the one the data manager keeps for it (`JobHistory`); a job suspending
      through its grace period has an empty placement and `held`, the GPUs it still holds.
    - A node's GPUs are those it registered for the policy, or the workers registered on it if more (a node
      that registered none has no GPU free for the policy); an unavailable node's (its agent stopped
      reporting) are only those its jobs hold, so no job is placed on a node that may be gone.
    - A dataset's `cached_bytes` is the least that a node mounting it reported: like its quota, per node.
    - The cache capacity is the smallest cache of the nodes that run jobs or offer the policy GPUs. A quota is
      per dataset per node and a node holds the quotas of the datasets its jobs read, so quotas that add up to
      at most that smallest cache fit on every node where jobs run or the policy may start one. (The paper's
      cache is one pool for the cluster; a single number that is always safe for per-node caches is this one.
      Counting only the nodes that ran jobs, a decision to start one on a smaller node was refused for want of
      room for its dataset's quota, every round, while the policy kept that quota.)
    - The seed is the state's revision, so a randomized policy decides the same on the same state.
    - The tenants are the registered ones with their virtual clusters (cells by level name, cache, remote IO),
      and `cell_levels` the data manager's `--cell-levels`; a job's `tenant` and `priority` are as registered.
    """
    state = manager.state
    jobs = {job_id: _job_state(manager, job_id, now) for job_id in state.jobs}
    datasets = {
        uri: DatasetState(uri, d.size_bytes, d.cache_quota_bytes, _cached_bytes(manager, uri))
        for uri, d in state.datasets.items()
    }
    nodes = {
        node_id: NodeState(node_id, _gpus_offered(manager, node_id), node.cache_capacity_bytes)
        for node_id, node in state.nodes.items()
    }
    hosting = [node.cache_bytes for node_id, node in nodes.items() if node.gpus or state.jobs_on_node(node_id)]
    return Snapshot(
        time=now,
        nodes=nodes,
        remote_io_bytes_per_sec=remote_io_bytes_per_sec,
        datasets=datasets,
        jobs=jobs,
        seed=state.revision,
        cache_capacity_bytes=min(hosting, default=0),
        tenants=MappingProxyType(
            {
                name: TenantShare(MappingProxyType(dict(t.cells)), t.cache_bytes, float(t.io_bytes_per_sec))
                for name, t in sorted(state.tenants.items())
            }
        ),
        cell_levels=manager.cell_levels,
    )


def _job_state(manager: DataManager, job_id: str, now: float) -> JobState:
    job = manager.state.jobs[job_id]
    history = manager.history(job_id)
    dataset_bytes = manager.state.datasets[job.dataset_uri].size_bytes
    placement = lifecycle.placement_of(job)
    return JobState(
        job_id=job_id,
        submit_time=history.submit_time,
        gpus=job.gpus if job.placed_by_policy else sum(placement.values()),
        dataset_uri=job.dataset_uri,
        dataset_bytes=dataset_bytes,
        ideal_bytes_per_sec=job.ideal_bytes_per_sec,
        total_bytes=job.epochs * dataset_bytes if job.epochs > 0 else math.inf,
        done_bytes=manager.bytes_read(job_id),
        attained_gpu_seconds=lifecycle.attained_gpu_seconds(job, history, now),
        irregular=job.irregular,
        placement=MappingProxyType(placement),
        io_bytes_per_sec=job.io_bytes_per_sec,
        epoch_hit_ratio=_epoch_hit_ratio(manager.liveness.job_usage(job_id), dataset_bytes, placement),
        first_start_time=history.first_start_time,
        last_start_time=history.last_start_time,
        pending_since=history.pending_since,
        queued_seconds_before=history.queued_seconds_before,
        preemptions=history.preemptions,
        policy_state=MappingProxyType(dict(lifecycle.policy_state_of(history, manager.policy or ""))),
        held=MappingProxyType(dict(history.held) if history.suspending else {}),
        job_class=job.job_class,
        grace_seconds=job.grace_seconds,
        tenant=job.tenant,
        priority=job.priority,
    )


def states_to_persist(
    manager: DataManager, snapshot: Snapshot, job_states: Mapping[str, Mapping[str, float]]
) -> dict[str, Mapping[str, float]]:
    """The job states a round persists: those the decision handed back, and an empty one for each job of the
    snapshot whose kept state another policy wrote, so that the histories hold no state the running policy
    cannot read."""
    policy = manager.policy or ""
    kept = dict(job_states)
    for job_id in snapshot.jobs:
        history = manager.history(job_id) if job_id in manager.state.jobs else None
        if job_id not in kept and history is not None and lifecycle.written_by_another(history, policy):
            kept[job_id] = {}
    return kept


def _epoch_hit_ratio(usage: Sequence[JobUsage], dataset_bytes: int, workers: Mapping[str, int]) -> float | None:
    """The share of the rest of its epoch the job's cache serves, from its nodes' access bitsets: cached items
    not read yet this epoch over all items not read yet; the least over its nodes (each caches on its own).
    A node of a job whose `workers` span nodes reads its workers' share of the items each pass and reports
    its progress through that share, so the items it has not read are 1 - progress x share of them.
    None when no node has reported or an epoch has just ended (then the dataset's cached bytes stand in)."""
    total = sum(workers.values())
    ratios = [
        min(1.0, u.effective_cache_bytes / (_unread_share(u, workers, total) * dataset_bytes))
        for u in usage
        if u.epoch_progress < 1.0 and dataset_bytes > 0
    ]
    return min(ratios, default=None)


def _unread_share(usage: JobUsage, workers: Mapping[str, int], total_workers: int) -> float:
    """The share of all items the reporting node has not read this pass (it reads only its own share)."""
    return 1.0 - usage.epoch_progress * pass_share(workers.get(usage.node_id, 0), total_workers)


def _cached_bytes(manager: DataManager, uri: str) -> int:
    reported = {u.node_id: u.cached_bytes for u in manager.liveness.dataset_usage(uri)}
    return min((reported.get(node_id, 0) for node_id in manager.state.nodes_mounting(uri)), default=0)


def _gpus_offered(manager: DataManager, node_id: str) -> int:
    """The GPUs the snapshot shows for a node: all it has, or, while it is unavailable, those its jobs (running
    or suspending) hold, none free. Its jobs keep running there as far as the data manager knows (a silent agent
    may be only cut off), but a new placement there would go to a node that may be gone, for good: nothing would
    move it while the node stays silent (`DataManager._place` refuses one too)."""
    state = manager.state
    registered = state.node_workers_registered(node_id)
    gpus = max(state.nodes[node_id].gpus, registered)
    if manager.liveness.available(node_id):
        return gpus
    return min(gpus, registered + state.node_gpus_placed(node_id) + state.node_gpus_held(node_id))


Resource = Literal["cache", "io"]


@dataclass(frozen=True, slots=True)
class Step:
    """One allocation a round changes: a dataset's cache quota or a job's remote IO rate."""

    resource: Resource
    target: str  # dataset URI or job id
    current: int
    wanted: int

    @property
    def decreases(self) -> bool:
        return self.wanted < self.current

    def __str__(self) -> str:
        unit = format_size if self.resource == "cache" else format_rate
        return f"{self.resource} of {self.target} {unit(self.current)} -> {unit(self.wanted)}"


def plan(state: ClusterState, snapshot: Snapshot, decision: Decision) -> list[Step]:
    """The changes that turn `state` into the decision's storage allocation, decreases first.

    Every dataset and job the snapshot showed is covered, and one the decision leaves out gets nothing: a
    dataset no job reads keeps no quota that could block a later job registration. Datasets and jobs that
    appeared or went since the snapshot are left to the next round. Applying all decreases before any
    increase keeps every intermediate state within limits that both the current state and the decision
    respect, since each value then stays at most the larger of its current and wanted one.
    """
    cache, io = _storage(decision)
    steps = [
        Step("cache", uri, state.datasets[uri].cache_quota_bytes, cache.get(uri, 0))
        for uri in sorted(snapshot.datasets)
        if uri in state.datasets
    ]
    steps += [
        Step("io", job_id, state.jobs[job_id].io_bytes_per_sec, io.get(job_id, 0))
        for job_id in sorted(snapshot.jobs)
        if job_id in state.jobs
    ]
    return sorted((s for s in steps if s.wanted != s.current), key=lambda s: not s.decreases)


def _storage(decision: Decision) -> tuple[Mapping[str, int], Mapping[str, int]]:
    """The decision's cache quotas and remote IO rates; a decision without them would free everything."""
    if decision.cache_bytes is None or decision.io_bytes_per_sec is None:
        raise ValueError("the policy left storage undecided (a scheduler from registry.build_scheduler never does)")
    return decision.cache_bytes, decision.io_bytes_per_sec


@dataclass(frozen=True, slots=True)
class JobEstimate:
    """What the policy expected of one job: the estimator's inputs it chose and the throughput they give."""

    ideal_bytes_per_sec: float  # f* on the job's workers
    cache_bytes: int  # c, the dataset's quota per node
    dataset_bytes: int  # d
    io_bytes_per_sec: int  # b
    throughput_bytes_per_sec: float

    @property
    def hit_ratio(self) -> float:
        return perf.hit_ratio(self.cache_bytes, self.dataset_bytes)


def estimates(snapshot: Snapshot, decision: Decision, estimator: Estimator) -> dict[str, JobEstimate]:
    """Per running job of `snapshot`, the throughput `estimator` predicts under the decision's storage; for
    an irregular job, the vanilla estimate the policy ranked it by (its storage comes from a partition
    SiloDPerf does not govern, as SiloDPerf's model does not hold for it)."""
    cache, io = _storage(decision)
    by_regularity = ByRegularity(estimator, VanillaPerf())
    result: dict[str, JobEstimate] = {}
    for job in snapshot.running_jobs():
        c, b = cache.get(job.dataset_uri, 0), io.get(job.job_id, 0)
        rate = by_regularity.throughput(job, job.allocated_gpus, c, b)
        result[job.job_id] = JobEstimate(perf.ideal_rate(job, job.allocated_gpus), c, job.dataset_bytes, b, rate)
    return result


def compute_changes(jobs: Mapping[str, Job], snapshot: Snapshot, decision: Decision) -> tuple[list[Move], list[str]]:
    """The moves of the policy-placed jobs that carry out the decision's placements, stops first, and the
    jobs registered with their workers it would move or preempt (placed by the cluster scheduler, they stay
    where they are, and the storage the policy chose for them assumed otherwise). A decision that leaves
    compute undecided moves nothing."""
    if decision.placements is None:
        return [], []
    return lifecycle.compute_moves(jobs, snapshot.jobs, decision.placements)


@dataclass(frozen=True, slots=True)
class RoundReport:
    """One round: why it ran, what the policy expected, and what reached the data manager."""

    number: int
    trigger: str
    finished_at: float  # on the controller's clock
    revision: int  # of the state the policy saw
    cache_budget_bytes: int
    estimates: Mapping[str, JobEstimate]
    applied: tuple[Step | Move, ...]
    refused: tuple[tuple[Step | Move, str], ...]  # with the data manager's reason
    unapplied_placements: tuple[str, ...]
    notes: Mapping[str, str]
    error: str  # why the round stopped early ("" if it did not)
    wake_at: float | None = None  # when the policy asked for its next round (the manager's wall clock)
    released: tuple[str, ...] = ()  # suspending jobs whose GPUs the round released first (grace period over)
    jobs: frozenset[str] = frozenset()  # the jobs the policy saw


class Controller:
    """Runs a data manager's policy (`manager.policy`) round after round; never two rounds at once."""

    def __init__(
        self,
        manager: DataManager,
        scheduler: Scheduler,
        requests: RoundRequests,
        *,
        round_seconds: float = DEFAULT_ROUND_SECONDS,
        settle_seconds: float = SETTLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if manager.policy is None or manager.policy_allocations is None or manager.remote_io_limit is None:
            raise ValueError("a controller needs a data manager created with its policy and a remote IO limit")
        self.policy = manager.policy
        self._allocations = manager.policy_allocations
        self._remote_io_limit = manager.remote_io_limit
        self.round_seconds = round_seconds
        self._manager = manager
        self._scheduler = scheduler
        self._requests = requests
        self._settle_seconds = settle_seconds
        self._clock = clock
        self._last: RoundReport | None = None
        self._one_round = asyncio.Lock()

    async def run(self) -> None:
        """Rounds until cancelled: one at the start, once the nodes running jobs have reported their usage
        (`_await_first_reports`), then one per burst of requests, at the wake-up the last decision asked for,
        when the first grace period still running ends, or after `round_seconds` without any of those. A round
        cut short by cancellation leaves valid allocations that the next start redoes."""
        await self._await_first_reports()
        trigger = "start"
        while True:
            report = await self.run_round(trigger)
            timeout, timed = self.round_seconds, "timer"
            now = self._manager.wall_clock()
            release = self._manager.next_release()
            if release is not None and release <= now and report.error:
                release = None  # the round that was to release it failed: the next one retries, not at once
            for at, reason in ((report.wake_at, "wake-up"), (release, "grace period over")):
                if at is not None and at - now < timeout:
                    timeout, timed = max(0.0, at - now), reason
            if await self._requests.wait(timeout):
                await asyncio.sleep(self._settle_seconds)  # let the rest of a burst arrive
                trigger = self._requests.take()
            else:
                trigger = timed

    async def _await_first_reports(self) -> None:
        """Hold the first round of a restarted data manager until every node running jobs has reported its usage,
        or the start's grace (--node-timeout) is over: decided before, a round saw those nodes' caches as empty
        and moved remote IO to the jobs that read them, only for the next round to move it back. The allocations
        stored before the restart are served meanwhile."""
        waiting = self._manager.nodes_awaiting_first_report()
        if not waiting:
            return
        log.info(
            "first round waits for the usage reports of the nodes that run jobs (%s), at most the node timeout",
            ", ".join(waiting),
        )
        while self._manager.nodes_awaiting_first_report():
            await self._release_due()
            await asyncio.sleep(FIRST_REPORT_POLL_SECONDS)

    async def _release_due(self) -> None:
        """Release the suspending jobs whose grace period is over while the first round waits: a release needs no
        usage report, and held until that round, a grace period of a restarted data manager ended up to the node
        timeout late, its job shown SUSPENDING past its `suspended_until` and the GPUs it held idle. The release's
        change logs it (`grace.release_description`); `next_release` first, as it walks the histories unsorted."""
        release = self._manager.next_release()
        if release is not None and release <= self._manager.wall_clock():
            await self._allocations.release_due()

    async def run_round(self, trigger: str) -> RoundReport:
        """Decide on the current state and carry out the decision; log and keep the report."""
        async with self._one_round:
            number = (self._last.number if self._last else 0) + 1
            report, failure = await self._round(number, trigger)
            repeat = failure is None and _repeats(report, self._last)
            self._last = report
            _log_round(self.policy, report, failure, repeat)
            return report

    async def _round(self, number: int, trigger: str) -> tuple[RoundReport, Exception | None]:
        revision, cache_budget = self._manager.state.revision, 0
        released: list[str] = []
        expected: dict[str, JobEstimate] = {}
        notes: dict[str, str] = {}
        unplaced: list[str] = []
        applied: list[Step | Move] = []
        refused: list[tuple[Step | Move, str]] = []
        failure: Exception | None = None
        wake_at: float | None = None
        present: frozenset[str] = frozenset()
        try:
            released = await self._allocations.release_due()  # first, so that the GPUs they free are free for it
            snapshot = snapshot_of(self._manager, self._remote_io_limit, self._manager.wall_clock())
            revision, cache_budget, present = snapshot.seed, snapshot.cache_capacity_bytes, frozenset(snapshot.jobs)
            # Policies are pure functions of the immutable snapshot: a thread keeps the server answering.
            decision = await asyncio.to_thread(self._scheduler.decide, snapshot)
            if decision.wake_at is not None and snapshot.time < decision.wake_at < math.inf:
                wake_at = decision.wake_at  # one in the past would have the controller spin
            steps = plan(self._manager.state, snapshot, decision)
            moves, unplaced = compute_changes(self._manager.state.jobs, snapshot, decision)
            placed = snapshot.with_placements(_carried_out(snapshot, decision, unplaced))
            expected, notes = estimates(placed, decision, self._scheduler.estimator), dict(decision.notes)
            stops = [m for m in moves if m.stops]
            starts = [m for m in moves if not m.stops]
            decreases = [s for s in steps if s.decreases]
            increases = [s for s in steps if not s.decreases]
            await self._apply_each([*stops, *decreases], applied, refused)
            await self._place_together(starts, applied, refused)
            # A job whose start was refused would hold remote IO it cannot use until the next round.
            not_started = {change.job_id for change, _ in refused if isinstance(change, Move)}
            idle = [s for s in increases if s.resource == "io" and s.target in not_started]
            refused.extend((step, "its start was refused this round") for step in idle)
            await self._apply_each([s for s in increases if s not in idle], applied, refused)
            await self._allocations.hand_back(states_to_persist(self._manager, snapshot, decision.job_states))
        except Exception as exc:  # a plugin policy's bug or a failed commit must not stop the server
            failure = exc
        report = RoundReport(
            number=number,
            trigger=trigger,
            finished_at=self._clock(),
            revision=revision,
            cache_budget_bytes=cache_budget,
            estimates=expected,
            applied=tuple(applied),
            refused=tuple(refused),
            unapplied_placements=tuple(unplaced),
            notes=notes,
            error="" if failure is None else f"{type(failure).__name__}: {failure}",
            wake_at=wake_at,
            released=tuple(released),
            jobs=present,
        )
        return report, failure

    async def _apply_each(
        self, changes: Sequence[Step | Move], applied: list[Step | Move], refused: list[tuple[Step | Move, str]]
    ) -> None:
        """Apply the changes in order, each one applied or refused with the data manager's reason. A change to a job
        or dataset that went while the round ran (a job finished) is neither: it is left out, as the next round's
        snapshot leaves it out."""
        for change in changes:
            try:
                await self._apply(change)
            except DataManagerError as exc:
                if self._went(change):
                    log.debug("round change %s left out: %s went while the round ran", change, _target(change))
                else:
                    refused.append((change, str(exc)))
            else:
                applied.append(change)

    def _went(self, change: Step | Move) -> bool:
        state = self._manager.state
        return _target(change) not in (
            state.datasets if isinstance(change, Step) and change.resource == "cache" else state.jobs
        )

    async def _place_together(
        self, moves: Sequence[Move], applied: list[Step | Move], refused: list[tuple[Step | Move, str]]
    ) -> None:
        """Start and migrate jobs in one change, so that jobs trading GPUs can (one moves onto the GPUs another
        leaves as that one moves onto its own): one at a time, every order is refused. If the data manager
        refuses them together, each is tried alone, so that those that fit start and each refusal names its job
        (jobs trading GPUs then wait for a round whose moves are all possible)."""
        if len(moves) > 1:
            try:
                await self._allocations.place_all({move.job_id: move.wanted for move in moves})
            except DataManagerError:
                pass
            else:
                applied.extend(moves)
                return
        await self._apply_each(moves, applied, refused)

    async def _apply(self, change: Step | Move) -> None:
        if isinstance(change, Move):
            await self._allocations.place(change.job_id, change.wanted)
        elif change.resource == "cache":
            await self._allocations.cache_size(change.target, change.wanted)
        else:
            await self._allocations.remote_io(change.target, change.wanted)

    # ---- what `silod status` shows ----

    def status(self) -> pb.ControllerStatus:
        status = pb.ControllerStatus(policy=self.policy, round_seconds=self.round_seconds)
        last = self._last
        if last is not None:
            status.rounds = last.number
            status.last_round_trigger = last.trigger
            status.seconds_since_last_round = self._clock() - last.finished_at
            status.last_round_changes = len(last.applied)
            status.last_round_refusals.extend(f"{step}: {reason}" for step, reason in last.refused)
            status.last_round_error = last.error
            status.cache_budget_bytes = last.cache_budget_bytes
        return status

    def estimate(self, job_id: str) -> pb.JobEstimate | None:
        """What the last round expected of the job; None if it has not been through a round."""
        if self._last is None or job_id not in self._last.estimates:
            return None
        e = self._last.estimates[job_id]
        return pb.JobEstimate(
            ideal_bytes_per_sec=e.ideal_bytes_per_sec,
            cache_bytes=e.cache_bytes,
            dataset_bytes=e.dataset_bytes,
            io_bytes_per_sec=e.io_bytes_per_sec,
            throughput_bytes_per_sec=e.throughput_bytes_per_sec,
            round=self._last.number,
        )


def _target(change: Step | Move) -> str:
    """The job or dataset a change is to."""
    return change.job_id if isinstance(change, Move) else change.target


def _carried_out(snapshot: Snapshot, decision: Decision, unapplied: Sequence[str]) -> dict[str, Mapping[str, int]]:
    """The placements once the round is carried out: the decision's, but where jobs registered with their
    workers stay (`unapplied`)."""
    placements = dict(decision.placements or {})
    for job_id in unapplied:
        placements.pop(job_id, None)
        job = snapshot.jobs[job_id]
        if job.placement:
            placements[job_id] = job.placement
    return placements


def _repeats(report: RoundReport, last: RoundReport | None) -> bool:
    """Whether a round only repeats the one before: it saw the same jobs, changed and released nothing, had the same
    changes refused for the same reasons, and expects of every job what that round did. Such a round (a timer's, on
    a cluster at rest) says nothing its predecessor's line did not, and at one a minute with hundreds of jobs its
    lines would fill the log for nothing; a refusal that stands (a start the policy asks for on GPUs a job
    registered with its workers holds) logged its WARNING at every round, forever. A job registered that waits
    changes no estimate, and its round is no repeat: its line (its note, with `--log-json`) is where the operator
    looks for why it waits."""
    return (
        last is not None
        and report.jobs == last.jobs
        and not (report.applied or report.released or report.error)
        and _refusals(report) == _refusals(last)
        and report.estimates == last.estimates
        and report.unapplied_placements == last.unapplied_placements
    )


def _refusals(report: RoundReport) -> list[tuple[str, str]]:
    return [(str(change), reason) for change, reason in report.refused]


def _log_round(policy: str, report: RoundReport, failure: Exception | None, repeat: bool) -> None:
    """One line per round: INFO when everything applied, WARNING when something was refused, ERROR (with the
    traceback) when the round failed; DEBUG for a round that repeats the one before (`_repeats`)."""
    jobs = "; ".join(
        f"{job_id} f*={format_rate(e.ideal_bytes_per_sec)} c/d={e.hit_ratio:.2f} b={format_rate(e.io_bytes_per_sec)}"
        f" -> {format_rate(e.throughput_bytes_per_sec)}"
        for job_id, e in sorted(report.estimates.items())
    )
    changes = ", ".join(map(str, report.applied)) or "none"
    message = f"round {report.number} ({report.trigger}) by {policy}: {jobs or 'no job runs'} | changes: {changes}"
    if report.released:
        message += " | released after their grace period: " + ", ".join(report.released)
    if report.unapplied_placements:
        message += " | placements not applied (the cluster scheduler's): " + ", ".join(report.unapplied_placements)
    if report.refused:
        message += " | refused, retried next round: " + "; ".join(f"{s}: {reason}" for s, reason in report.refused)
    if report.error:
        message += f" | failed, retried next round: {report.error}"
    fields = {
        "policy": policy,
        "round": report.number,
        "trigger": report.trigger,
        "revision": report.revision,
        "cache_budget_bytes": report.cache_budget_bytes,
        "jobs": {job_id: {**asdict(e), "hit_ratio": e.hit_ratio} for job_id, e in sorted(report.estimates.items())},
        "applied": [str(step) for step in report.applied],
        "refused": [{"change": str(step), "reason": reason} for step, reason in report.refused],
        "unapplied_placements": list(report.unapplied_placements),
        "released": list(report.released),
        "notes": dict(report.notes),
        "error": report.error,
    }
    if failure is not None:
        level = logging.ERROR
    elif repeat:
        level = logging.DEBUG
    else:
        level = logging.WARNING if report.refused else logging.INFO
    log.log(level, "%s", message, extra=fields, exc_info=failure)
