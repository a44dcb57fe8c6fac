"""Tiresias (NSDI '19): GPU jobs scheduled by attained service, without knowing their durations, with preemption.

A job's attained service is a = W x t: its GPUs times the time it has run since it was last promoted (GPU
time held, restores after a preemption included, as GPUs held are GPUs used). Discretized 2DAS keeps K
queues split by thresholds on a (`thresholds`, GPU-seconds; the paper's simulation default is one threshold of
1 GPU-hour, K = 2):

- A job enters Q1 on arrival and is demoted to the next queue when a crosses its queue's upper threshold. The
  policy asks to be woken at the moment a running job will cross it (`Decision.wake_at`), so a demotion takes
  effect when it happens, not at the next periodic round.
- With PROMOTEKNOB (`promote_knob`; infinite, the paper's default, turns it off) a job that has run before and
  has waited knob x t since its last promotion is promoted back to Q1, and both t and its waiting time restart.
- **2D-LAS** (`tiresias-las`): queues in order, and within a queue first-in first-out by the time a job that
  has run entered it (its start for a job still in Q1, its demotion or promotion after that), jobs that never
  ran behind them by submission. The paper orders a queue by start time so that a job skipped for lack of GPUs
  does not come back to preempt the job that started in its place: a job that never ran never preempts a
  running job of its own queue. A job just demoted lines up behind the jobs that reached its queue before it,
  so a demotion preempts it when they fit (the paper: arrivals, promotions and demotions trigger preemptions).
- **2D-Gittins** (`tiresias-gittins`): within queues 1..K-1, by descending Gittins index of a under the
  service distribution (`gittins.py`, quantum = the queue's upper threshold); the last queue FIFO as in LAS.
  Ties (and the whole order of equal indices) go to the job submitted first.
- Each round walks the ranked jobs, keeps every job whose GPUs fit and skips (preempting, if it runs) the
  rest: `placement.place_by_priority`.
- Placement (section 3.3): a job whose model's skew (`models.py`) exceeds `pack_limit` is consolidated on as
  few nodes as possible and waits until it can be; the others go where they fragment least. The paper sets
  PACKLIMIT with a classifier over its own measurements and prints no value; 0.5 separates the VGG family and
  AlexNet (61-77 %) from every other model of its Table 6 (4-15 %).

`continuous` drops the discretization (section 3.2.2, its Figure 7): priority is a itself under LAS (least
attained first) and the supremum Gittins index under Gittins, ties by submission, re-ranked at every round.

**SiloD-enhanced** (`tiresias-silod`): 2D-LAS whose attained service counts ideal GPU time, the GPU time the
work done would have taken at full speed (done bytes / f* x W), so a job starved of remote IO is not charged
for time it spent waiting on data; and storage by SiloD's greedy allocation in which a preempted job keeps
its dataset's cache quota while it waits, from the round that preempts it (`policies/held.py`), so that it
resumes at speed instead of refilling its cache over an epoch. (Plain `tiresias-las` under the silod cache
system already gets SiloD's greedy storage; this variant adds the two changes above, each a knob of every
Tiresias policy: `service = "ideal"` or `"gpu-time"`, `hold_cache = true` or `false`, so either can be measured
alone.)

State carried from round to round per job (`Decision.job_states`): its queue, when it entered it, and the
attained service and waiting time it had when it was last promoted (so both restart from there). A queue
recorded beyond the configured ones (the data manager restarted with fewer) is the last queue, entered when
the job entered the one recorded: it lines up there first-in first-out like every job that reached it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from datamgr.scheduler import perf
from datamgr.scheduler.gittins import ServiceDistribution
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.placement import gpus_per_node, place_by_priority, profile_based
from datamgr.scheduler.policies.held import hold_waiting_quotas
from datamgr.scheduler.policies.options import PolicyOptions, read_options, takes_keys
from datamgr.scheduler.policy import Decision, LazyNotes
from datamgr.scheduler.snapshot import JobState, Snapshot

HOUR = 3600.0
OPTION_KEYS = ("queues", "promote_knob", "pack_limit", "history", "service", "hold_cache")
DEMOTION_SLACK = 1e-6  # GPU-seconds: a job woken at its crossing has crossed, whatever float rounding says
# Wake-ups come at least this far apart (seconds): a crossing predicted from a rate that then changes cannot
# pull rounds ever closer together. Demotions and promotions land at most this late.
MIN_WAKE_SECONDS = 1.0
MIN_SPEED = 1e-3  # of f*: a job reading almost nothing is predicted to cross far off, not never


@dataclass(frozen=True, slots=True)
class TiresiasConfig:
    """Tiresias's knobs; the defaults are the paper's simulation settings (K = 2, 1 GPU-hour, no promotion)."""

    thresholds: tuple[float, ...] = (HOUR,)  # GPU-seconds between queues: K = len + 1
    promote_knob: float = math.inf
    pack_limit: float = 0.5
    continuous: bool = False
    history: ServiceDistribution | None = None  # for Gittins; None: `default_history()`
    ideal_service: bool = False  # attained service in ideal GPU time (work / f*), not GPU time held
    hold_cache: bool = False  # decide storage: SiloD's greedy, with waiting preempted jobs' cache held

    def __post_init__(self) -> None:
        if not self.continuous and not self.thresholds:
            raise ValueError("queues: give at least one threshold (K = 2 or more), or 'continuous'")
        if any(not b > a for a, b in zip((0.0, *self.thresholds), self.thresholds, strict=False)):
            raise ValueError(f"queues: thresholds must be positive and increasing, not {list(self.thresholds)}")
        if not self.promote_knob > 0:
            raise ValueError(f"promote_knob must be positive (inf turns promotion off), not {self.promote_knob!r}")
        if not 0 <= self.pack_limit <= 1:
            raise ValueError(f"pack_limit is a skew, between 0 and 1, not {self.pack_limit!r}")

    @classmethod
    def from_options(cls, options: PolicyOptions, silod: bool = False) -> TiresiasConfig:
        """The knobs a scenario or `--policy-option` sets: queues ("1h", "1h,2h" or "continuous"),
        promote_knob, pack_limit, history (GPU-time services, "4h,8h,12h", or a file of one per line), and the
        SiloD enhancements, service ("ideal" or "gpu-time") and hold_cache, on by default when `silod`."""
        read = read_options(options, OPTION_KEYS)
        queues = read.text("queues")
        continuous = queues is not None and queues.strip() == "continuous"
        thresholds = (HOUR,) if queues is None else () if continuous else read.durations("queues")
        history = read.durations_or_file("history")
        return cls(
            thresholds=thresholds,
            promote_knob=read.number("promote_knob", math.inf),
            pack_limit=read.number("pack_limit", 0.5),
            continuous=continuous,
            history=None if history is None else ServiceDistribution(history),
            ideal_service=read.choice("service", {"ideal": True, "gpu-time": False}, silod),
            hold_cache=read.choice("hold_cache", {"true": True, "false": False}, silod),
        )


class JobQueue(NamedTuple):
    """A job's place in the queues (its `policy_state`): queue index (0 = Q1), when it entered that queue, and
    its attained service and waiting time when it was last promoted."""

    queue: int
    entered: float
    service_base: float = 0.0
    waited_base: float = 0.0

    @classmethod
    def of(cls, job: JobState) -> JobQueue | None:
        """The place the job's state records; None for a job the policy has not seen yet, or whose state is
        not a place in the queues. The controller hands a policy only the states it wrote, but a state dir
        written before it recorded who wrote them may hold another policy's (HiveD's cells, say): such a
        job starts afresh in Q1, as after a switch, rather than failing every round."""
        state = job.policy_state
        if not all(key in state for key in cls._fields):
            return None
        return cls(int(state["queue"]), state["entered"], state["service_base"], state["waited_base"])

    def as_state(self) -> dict[str, float]:
        return {
            "queue": float(self.queue),
            "entered": self.entered,
            "service_base": self.service_base,
            "waited_base": self.waited_base,
        }


class Ranked(NamedTuple):
    """What a round knows of a job: its place in the queues (and the one its state recorded, None for a new
    job), attained service, and the key it is ranked by."""

    job: JobState
    place: JobQueue
    recorded: JobQueue | None
    attained: float
    key: tuple[float, ...]


class Tiresias:
    """Discretized 2D-LAS or 2D-Gittins over `TiresiasConfig`; decides compute only unless `hold_cache`."""

    def __init__(self, name: str, config: TiresiasConfig, gittins: bool) -> None:
        self.name = name
        self.config = config
        self.history = (config.history or default_history()) if gittins else None

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        now = snapshot.time
        ranked = sorted((self._rank(job, now) for job in snapshot.schedulable_jobs()), key=lambda r: r.key)
        by_id = {r.job.job_id: r for r in ranked}
        everything = snapshot.free_gpus({})
        place = profile_based(gpus_per_node(everything), self.config.pack_limit)
        placements = place_by_priority(everything, [r.job for r in ranked], place)
        states = {r.job.job_id: r.place.as_state() for r in ranked if r.place != r.recorded}
        notes = LazyNotes(by_id, _describe)
        decision = Decision(
            placements=placements, job_states=states, wake_at=self._wake_at(ranked, placements, now), notes=notes
        )
        if self.config.hold_cache and estimator.storage_aware:
            return hold_waiting_quotas(snapshot, decision, estimator)
        return decision

    def attained(self, job: JobState) -> float:
        """W x t over the job's life: GPU time held, or (SiloD-enhanced) the ideal GPU time of its work."""
        if self.config.ideal_service:
            return job.done_bytes / job.ideal_bytes_per_sec * job.gpus
        return job.attained_gpu_seconds

    def _rank(self, job: JobState, now: float) -> Ranked:
        recorded = JobQueue.of(job)
        place = recorded or JobQueue(0, job.submit_time)
        attained = self.attained(job) - place.service_base
        promotion = None if job.placement else self._promotion_in(job, place, attained, now)
        if promotion is not None and promotion <= 0:
            place = JobQueue(0, now, self.attained(job), _waited_since_first_start(job, now))
            attained = 0.0
        config = self.config
        if config.continuous:
            priority = -self.history.supremum(attained) if self.history is not None else attained
            return Ranked(job, place, recorded, attained, (priority, job.submit_time))
        last = len(config.thresholds)
        if place.queue > last:  # recorded under more queues than configured now: in the last, since it entered
            place = place._replace(queue=last)
        queue = max(place.queue, _queue_of(attained, config.thresholds))
        if queue != place.queue:
            place = place._replace(queue=queue, entered=now)
        if self.history is not None and queue < last:
            index = self.history.index(attained, config.thresholds[queue])
            return Ranked(job, place, recorded, attained, (queue, -index, job.submit_time))
        lined_up = math.inf if job.first_start_time is None else max(place.entered, job.first_start_time)
        return Ranked(job, place, recorded, attained, (queue, lined_up, job.submit_time))

    def _promotion_in(self, job: JobState, place: JobQueue, attained: float, now: float) -> float | None:
        """PROMOTEKNOB: the seconds until a job that has run, below Q1, has waited knob x t since its last
        promotion (0 or less: due now), or None where no promotion applies. For a job that waits."""
        if job.first_start_time is None or place.queue == 0 or math.isinf(self.config.promote_knob):
            return None
        waited = _waited_since_first_start(job, now) - place.waited_base
        return self.config.promote_knob * attained / job.gpus - waited

    def _wake_at(self, ranked: Sequence[Ranked], placements: Mapping[str, object], now: float) -> float | None:
        """The earliest demotion of a job that runs on, or promotion of one that waits (discretized only), and
        never sooner than `MIN_WAKE_SECONDS` from now."""
        config = self.config
        if config.continuous:
            return None
        soonest = math.inf
        for r in ranked:
            gpus = r.job.gpus
            if r.job.job_id in placements:
                if r.place.queue < len(config.thresholds):
                    service_per_second = gpus * self._speed(r.job)
                    soonest = min(soonest, now + (config.thresholds[r.place.queue] - r.attained) / service_per_second)
            else:
                promotion = self._promotion_in(r.job, r.place, r.attained, now)
                if promotion is not None:
                    soonest = min(soonest, now + promotion)
        if soonest == math.inf:
            return None
        return max(soonest, now + MIN_WAKE_SECONDS)

    def _speed(self, job: JobState) -> float:
        """The attained service a running job gains per second per GPU: 1 for GPU time held; under ideal GPU
        time, its current rate over f* (from the remote IO and hit ratio it runs with now; full speed when
        those are not known yet, the soonest it could cross). Woken at a crossing predicted from a rate that
        changes since, the policy predicts again: a job throttled by IO would otherwise be woken ever closer to
        its crossing, never at it."""
        if not self.config.ideal_service or job.epoch_hit_ratio is None or job.io_bytes_per_sec <= 0:
            return 1.0
        ideal = perf.ideal_rate(job, job.gpus)
        return max(perf.rate_at_hit_ratio(ideal, job.epoch_hit_ratio, job.io_bytes_per_sec) / ideal, MIN_SPEED)


def _queue_of(attained: float, thresholds: Sequence[float]) -> int:
    """The queue whose range holds `attained` GPU-seconds."""
    for queue, threshold in enumerate(thresholds):
        if attained < threshold - DEMOTION_SLACK:
            return queue
    return len(thresholds)


def _waited_since_first_start(job: JobState, now: float) -> float:
    """Time waited after the job first ran (promotion counts only that: a job that never ran is not starving,
    it is merely new)."""
    assert job.first_start_time is not None
    return job.queued_seconds(now) - (job.first_start_time - job.submit_time)


def _describe(ranked: Ranked) -> str:
    return f"queue {ranked.place.queue + 1}, attained {ranked.attained / HOUR:.3g} GPU-h"


def default_history() -> ServiceDistribution:
    """The service distribution of silod's trace generator (`generator.service_distribution`): what a site
    that simulates with its traces would have learnt from them."""
    from datamgr.scheduler.sim.generator import service_distribution

    services, weights = service_distribution()
    return ServiceDistribution(services, weights)


@takes_keys(*OPTION_KEYS)
def tiresias_las(options: PolicyOptions | None = None) -> Tiresias:
    return Tiresias("tiresias-las", TiresiasConfig.from_options(options or {}), gittins=False)


@takes_keys(*OPTION_KEYS)
def tiresias_gittins(options: PolicyOptions | None = None) -> Tiresias:
    return Tiresias("tiresias-gittins", TiresiasConfig.from_options(options or {}), gittins=True)


@takes_keys(*OPTION_KEYS)
def tiresias_silod(options: PolicyOptions | None = None) -> Tiresias:
    return Tiresias("tiresias-silod", TiresiasConfig.from_options(options or {}, silod=True), gittins=False)
