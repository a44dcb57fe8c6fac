"""FitGpp and its baselines as policies: FIFO in which trial-and-error (TE) jobs preempt best-effort (BE) ones.

FitGpp (Yabuuchi et al.) builds on FIFO. A TE job (`job_class` "te") goes ahead of every BE job; when no node
has room for it, running BE jobs are preempted, chosen by a rule (`VictimRule`): FitGpp's Eq. 4, LRTP or RAND
(`datamgr/scheduler/fitgpp.py`). A victim keeps its resources through its grace period (the driver holds them
while the job suspends, `JobState.held`) and then goes back to the head of the BE queue. `fitgpp-fifo` is the
paper's non-preemptive FIFO baseline: one queue in submission order, classes alike.

Each round, in this order:

1. TE jobs, in submission order. One that fits now starts (best fit, `fitgpp.best_fit`). One that fits in
   what will be free once the suspending jobs release (less what earlier TE jobs wait for) waits for that
   and claims it. Otherwise the rule picks victims among the running single-node BE jobs, judged against
   that same eventual room (the paper's N, the node's unallocated resources, counts a suspending job's
   resources as coming free). A victim with no grace period frees its resources at once, so the TE job can
   start in the same round; otherwise the TE job claims them and starts at the round their release
   triggers. A TE job nothing can make room for waits, and holds the BE queue behind it (FIFO).
2. BE jobs: those preempted before (the paper puts them "back on the top of the queue") and then the rest,
   each group in submission order; strict FIFO, stopping at the first that does not fit, since FitGpp's
   argument is about the head-of-line blocking a large requeued job causes. A BE job starts only in room no
   waiting TE job has claimed.

Where the papers are silent: the node a job starts on is the best fit (least room left by Eq. 1's size);
requeued jobs keep their submission order among themselves; a job that asks for more GPUs than one node has
(never in FitGpp's traces, whose jobs are single-task) is placed as a gang across nodes, is never a victim,
and as a TE job does not preempt. Decisions come at arrivals, finishes and releases, and at most a round
(the `fitgpp-synthetic` scenario's one simulated minute, the paper's) after the last.

FitGpp-SiloD (`fitgpp-silod`) adds what SiloD brings. Remote IO is a fourth element of the demand: a TE job
needs b = f* (1 - c/d), about f* since a new job's cache helps only from its next epoch, and Eq. 4 accepts a
victim only if, once it is gone, SiloD's max-min IO sharing gives the TE job that much (`_IoView`), so the TE
job runs at f*; when no victim can (one victim rarely frees enough in a cluster far beyond its egress), the
choice is vanilla FitGpp's. It also decides storage: SiloD's greedy allocation, with the cache quota of a
preempted BE job held, from the round that preempts it, while it suspends and waits (`policies/held.py`), so
it resumes at the speed it left.

Knobs (`[policy]` or `--policy-option`): `s`, the weight of the grace period in Eq. 3 (default 4.0),
`preemption_limit`, P (default 1; "inf" for none), which bounds every rule, and `wait_for_release` (default
true; false judges room by what is unallocated now, so a round preempts again while a victim suspends).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from datamgr.scheduler import perf
from datamgr.scheduler.fitgpp import (
    Resources,
    RunningBe,
    best_fit,
    best_victim,
    fitgpp_victims,
    lrtp_victims,
    rand_victims,
)
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import place_gang
from datamgr.scheduler.policies.held import hold_waiting_quotas
from datamgr.scheduler.policies.options import PolicyOptions, read_options, takes_keys
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.snapshot import JobState, NodeState, Snapshot

TE_CLASS = "te"
VICTIM_RULES = ("fitgpp", "lrtp", "rand")
SCORED_KEYS = ("s", "preemption_limit", "wait_for_release")  # FitGpp's knobs
LIMIT_KEYS = ("preemption_limit", "wait_for_release")  # LRTP's and RAND's: they score nothing


def is_trial_and_error(job: JobState) -> bool:
    """Whether the job is a TE job: its class reads "te" (any case); every other job is best-effort."""
    return job.job_class.lower() == TE_CLASS


def demand(job: JobState) -> Resources:
    return Resources(job.cpus, job.ram_bytes, job.gpus)


def capacity(node: NodeState) -> Resources:
    """A node's resources; CPUs and RAM the driver does not model are unlimited (and weigh nothing in Eq. 1)."""
    return Resources(node.cpus or math.inf, node.ram_bytes or math.inf, node.gpus)


@dataclass(frozen=True)
class FitGppConfig:
    s: float = 4.0  # the weight of the grace period in the score (Eq. 3); the paper's default
    preemption_limit: float = 1.0  # P: no job is preempted more often; the paper's default
    # A TE job waits for the room suspending victims will free rather than preempt again (silod's reading);
    # false: every round judges room by what is unallocated now, as Eq. 2's N literally is, and preempts again.
    wait_for_release: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.s < math.inf:  # an infinite weight makes every score infinite or NaN: no ranking
            raise ValueError(f"option s: {self.s!r} must be a finite number, at least 0")
        limit = self.preemption_limit
        if not (limit >= 1 and (limit == math.inf or limit == int(limit))):  # a count of preemptions
            raise ValueError(f"option preemption_limit: {limit!r} must be a whole number, at least 1 (or inf)")

    @classmethod
    def from_options(cls, options: PolicyOptions, scored: bool) -> FitGppConfig:
        """The knobs in `options`; `s` only for a rule that scores (`scored`), P for all."""
        reader = read_options(options, SCORED_KEYS if scored else LIMIT_KEYS)
        return cls(
            reader.number("s", cls.s),
            reader.number("preemption_limit", cls.preemption_limit),
            reader.choice("wait_for_release", {"true": True, "false": False}, cls.wait_for_release),
        )


class _Room:
    """Resources per node: `free` now, and `eventual`, once the suspending jobs release, less what waiting TE
    jobs have claimed. A job may start only where both have room."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.capacity = {node_id: capacity(node) for node_id, node in snapshot.nodes.items()}
        self.free = dict(self.capacity)
        for job in snapshot.running_jobs():
            self._add(self.free, job, job.placement, -1)
        self.eventual = dict(self.free)
        for job in snapshot.suspending_jobs():
            self._add(self.free, job, job.held, -1)

    @staticmethod
    def _add(room: dict[str, Resources], job: JobState, placement: Mapping[str, int], sign: int) -> None:
        """Add (`sign` 1) or take (-1) the job's demand on each node of `placement`; CPUs and RAM count on the
        one node of a job that asks for them."""
        for node_id, gpus in placement.items():
            share = Resources(job.cpus, job.ram_bytes, gpus) if len(placement) == 1 else Resources(0, 0, gpus)
            room[node_id] = room[node_id].plus(share) if sign > 0 else room[node_id].minus(share)

    def usable(self) -> dict[str, Resources]:
        return {node_id: free.meet(self.eventual[node_id]) for node_id, free in self.free.items()}

    def start(self, job: JobState) -> dict[str, int] | None:
        """Where the job starts now, taking the room; None if it does not fit."""
        usable = self.usable()
        node = best_fit(demand(job), usable, self.capacity)
        if node is not None:
            placement = {node: job.gpus}
        elif job.cpus or job.ram_bytes:
            return None
        else:
            gang = place_gang({node_id: int(room.gpus) for node_id, room in usable.items()}, job.gpus)
            if gang is None:
                return None
            placement = gang
        self._add(self.free, job, placement, -1)
        self._add(self.eventual, job, placement, -1)
        return placement

    def claim(self, job: JobState) -> bool:
        """Reserve room that suspending jobs will release for the job; False if there is none."""
        node = best_fit(demand(job), self.eventual, self.capacity)
        if node is None:
            return False
        self._add(self.eventual, job, {node: job.gpus}, -1)
        return True

    def preempt(self, job: JobState) -> None:
        """The job is a victim: its resources come free at once without a grace period, else when it ends."""
        self._add(self.eventual, job, job.placement, 1)
        if job.grace_seconds <= 0:
            self._add(self.free, job, job.placement, 1)


@dataclass(frozen=True)
class TeBeScheduler:
    """FIFO with TE jobs first and BE victims chosen by `rule` (one of `VICTIM_RULES`); `rule` None is the
    paper's non-preemptive FIFO, classes alike."""

    name: str
    rule: str | None
    config: FitGppConfig = FitGppConfig()
    io_aware: bool = False  # FitGpp-SiloD: weigh remote IO in the victim rule and decide storage

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        decision = self._compute(snapshot)
        if not self.io_aware:
            return decision
        return hold_waiting_quotas(snapshot, decision, estimator)

    def _compute(self, snapshot: Snapshot) -> Decision:
        room = _Room(snapshot)
        placements: dict[str, Mapping[str, int]] = {job.job_id: job.placement for job in snapshot.running_jobs()}
        notes: dict[str, str] = {}
        queued = snapshot.queued_jobs()
        if self.rule is None:
            self._start_in_order(queued, room, placements)
            return Decision(placements=placements)
        blocked = False
        for job in (job for job in queued if is_trial_and_error(job)):
            placement = room.start(job)
            if placement is not None:
                placements[job.job_id] = placement
            elif not (self.config.wait_for_release and room.claim(job)):
                blocked = self._preempt_for(job, snapshot, room, placements, notes) or blocked
        if not blocked:
            best_effort = [job for job in queued if not is_trial_and_error(job)]
            requeued = [job for job in best_effort if job.preemptions > 0]
            self._start_in_order([*requeued, *(job for job in best_effort if job.preemptions == 0)], room, placements)
        return Decision(placements=placements, notes=notes)

    @staticmethod
    def _start_in_order(jobs: list[JobState], room: _Room, placements: dict[str, Mapping[str, int]]) -> None:
        for job in jobs:
            placement = room.start(job)
            if placement is None:
                return
            placements[job.job_id] = placement

    def _preempt_for(
        self,
        te_job: JobState,
        snapshot: Snapshot,
        room: _Room,
        placements: dict[str, Mapping[str, int]],
        notes: dict[str, str],
    ) -> bool:
        """Preempt victims for `te_job` and start it or claim their room; True if it is left blocking."""
        running = [
            _as_running_be(job)
            for job in snapshot.running_jobs()
            if job.job_id in placements and not is_trial_and_error(job) and len(job.placement) == 1
        ]
        victims = self._victims(te_job, running, room, snapshot, placements)
        if not victims:
            return True
        for victim_id in victims:
            victim = snapshot.jobs[victim_id]
            del placements[victim_id]
            room.preempt(victim)
            notes[victim_id] = f"preempted by {self.rule} for TE job {te_job.job_id}"
        placement = room.start(te_job)
        if placement is not None:
            placements[te_job.job_id] = placement
            return False
        return not (self.config.wait_for_release and room.claim(te_job))

    def _victims(
        self,
        te_job: JobState,
        running: list[RunningBe],
        room: _Room,
        snapshot: Snapshot,
        placements: Mapping[str, Mapping[str, int]],
    ) -> list[str]:
        limit = self.config.preemption_limit
        wanted = demand(te_job)
        rng = random.Random(f"{snapshot.seed}:{snapshot.time}:{te_job.job_id}")
        unallocated = room.eventual if self.config.wait_for_release else room.free
        if self.rule == "fitgpp":
            if self.io_aware:
                io = _IoView(snapshot, placements, te_job)
                chosen = best_victim(
                    wanted._replace(io=io.te_need),
                    [job._replace(demand=job.demand._replace(io=io.use(job.job_id))) for job in running],
                    {node: left._replace(io=io.room) for node, left in unallocated.items()},
                    {node: full._replace(io=snapshot.remote_io_bytes_per_sec) for node, full in room.capacity.items()},
                    s=self.config.s,
                    limit=limit,
                )
                if chosen is not None:
                    return [chosen]
            return fitgpp_victims(wanted, running, unallocated, room.capacity, s=self.config.s, limit=limit, rng=rng)
        eligible = [job for job in running if job.preemptions < limit]
        if self.rule == "lrtp":
            return lrtp_victims(wanted, eligible, unallocated)
        return rand_victims(wanted, eligible, unallocated, rng=rng)


class _IoView:
    """Remote IO as FitGpp-SiloD weighs it for one TE job. SiloD's storage shares IO max-min fairly up to each
    job's need b = f* (1 - c/d), so the TE job runs at f* exactly when the water level reaches its need x, that
    is when x plus every other running job's min(need, x) fits in the limit. So a running job uses min(need,
    x) of what the TE job could have (`use`), the cluster has `room` left of it, and a victim gives back its
    use. A new TE job's c is about 0 (the cache helps only from its next epoch), as the snapshot says."""

    def __init__(self, snapshot: Snapshot, placements: Mapping[str, Mapping[str, int]], te_job: JobState) -> None:
        self.te_need = _remote_need(snapshot, te_job)
        self._uses = {
            job_id: min(_remote_need(snapshot, snapshot.jobs[job_id]), self.te_need)
            for job_id, placement in placements.items()
            if placement
        }
        self.room = snapshot.remote_io_bytes_per_sec - sum(self._uses.values())

    def use(self, job_id: str) -> float:
        return self._uses.get(job_id, 0.0)


def _remote_need(snapshot: Snapshot, job: JobState) -> float:
    """b = f* (1 - c/d) on all its GPUs, c the cache it can hit now under its dataset's quota."""
    dataset = snapshot.datasets.get(job.dataset_uri)
    quota = 0 if dataset is None else dataset.cache_quota_bytes
    return perf.remote_demand(job.ideal_bytes_per_sec, snapshot.usable_cache_bytes(job, quota), job.dataset_bytes)


def _as_running_be(job: JobState) -> RunningBe:
    (node,) = job.placement
    remaining = job.remaining_bytes / job.ideal_bytes_per_sec if job.ideal_bytes_per_sec > 0 else math.inf
    return RunningBe(job.job_id, node, demand(job), job.grace_seconds, job.preemptions, remaining)


@takes_keys(*SCORED_KEYS)
def fitgpp(options: PolicyOptions | None = None) -> TeBeScheduler:
    return TeBeScheduler("fitgpp", "fitgpp", FitGppConfig.from_options(options or {}, scored=True))


@takes_keys(*LIMIT_KEYS)
def lrtp(options: PolicyOptions | None = None) -> TeBeScheduler:
    return TeBeScheduler("lrtp", "lrtp", FitGppConfig.from_options(options or {}, scored=False))


@takes_keys(*LIMIT_KEYS)
def rand(options: PolicyOptions | None = None) -> TeBeScheduler:
    return TeBeScheduler("rand", "rand", FitGppConfig.from_options(options or {}, scored=False))


@takes_keys(*SCORED_KEYS)
def fitgpp_silod(options: PolicyOptions | None = None) -> TeBeScheduler:
    return TeBeScheduler("fitgpp-silod", "fitgpp", FitGppConfig.from_options(options or {}, scored=True), io_aware=True)


def fitgpp_fifo() -> TeBeScheduler:
    return TeBeScheduler("fitgpp-fifo", None)
