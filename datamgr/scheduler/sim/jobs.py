"""One simulated job: what it holds, how fast it reads, and everything it has read so far.

A running job reads its data in segments (an epoch, a curriculum stage's pass, an LRU window) during which
its hit ratio is constant; the cache model says what a segment's hit ratio and length are. Its rate is
SiloD's estimator evaluated at that actual hit ratio, `min(f*(gpus), io / (1 - hit))`: the pipeline runs at
the slower of compute and data loading, and remote IO only carries the misses, so the remote bytes it
pulls per second (`rate x (1 - hit)`) never exceed its IO allocation. Hits and misses are integrated
separately, so `hit_bytes + remote_bytes == done` holds up to float rounding, and always by construction
of the model (every byte read is either served by the cache or fetched).

Rates are constant between events, so progress is integrated exactly and lazily: a job is brought up to
date (`advance`) only when something about it changes or is observed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from datamgr.scheduler import perf
from datamgr.scheduler.models import model_skew
from datamgr.scheduler.sim.model import JobOutcome, TraceJob
from datamgr.scheduler.snapshot import JobState

_NOWHERE: Mapping[str, int] = MappingProxyType({})
_NO_STATE: Mapping[str, float] = MappingProxyType({})


@dataclass(slots=True, eq=False)
class Segment:
    """A stretch of a job's reads at one hit ratio: `bytes_left` more bytes, a share `hit_ratio` from cache."""

    hit_ratio: float
    bytes_left: float


class JobRun:
    """A trace job's state in the simulation, from arrival to finish.

    A job resumed after a preemption first restores its checkpoint for `resume_seconds` (the configured
    preemption cost): it holds its GPUs and reads nothing until `restored` is called. A preempted job with a
    grace period first suspends (`suspend`): stopped, reading nothing, it holds its GPUs until `released`.
    """

    __slots__ = (
        "_queued_state",
        "_trailing",
        "_unchanging",
        "base",
        "done",
        "equal_share_bytes",
        "equal_share_mark",
        "finish_pending",
        "finished_at",
        "gpu_seconds",
        "gpus",
        "held",
        "hit_bytes",
        "ideal",
        "io",
        "last_started_at",
        "overhead_seconds",
        "pending_since",
        "placement",
        "policy_state",
        "preemptions",
        "queued_before",
        "rate",
        "remote_bytes",
        "remote_rate",
        "restart_seconds",
        "restoring_until",
        "resume_seconds",
        "segment",
        "started_at",
        "trace",
        "updated_at",
        "version",
    )

    def __init__(self, trace: TraceJob, resume_seconds: float = 0.0) -> None:
        self.trace = trace
        self.resume_seconds = resume_seconds
        self.base = JobState(
            job_id=trace.job_id,
            submit_time=trace.arrival,
            gpus=trace.gpus,
            dataset_uri=trace.dataset,
            dataset_bytes=trace.dataset_bytes,
            ideal_bytes_per_sec=trace.ideal_bytes_per_sec,
            total_bytes=trace.total_bytes,
            irregular=trace.irregular,
            skew=model_skew(trace.model),
            job_class=trace.job_class,
            cpus=trace.cpus,
            ram_bytes=trace.ram_bytes,
            grace_seconds=trace.grace_seconds,
            tenant=trace.tenant,
            priority=trace.priority,
        )
        base = self.base
        # JobState's leading fields, which never change, in its field order (see `state`).
        self._unchanging = (
            base.job_id,
            base.submit_time,
            base.gpus,
            base.dataset_uri,
            base.dataset_bytes,
            base.ideal_bytes_per_sec,
            base.total_bytes,
        )
        self._trailing = (  # after `held`
            base.job_class,
            base.cpus,
            base.ram_bytes,
            base.grace_seconds,
            base.tenant,
            base.priority,
        )
        self.placement: Mapping[str, int] = _NOWHERE
        self.gpus = 0
        self.ideal = 0.0  # f* on the GPUs it holds
        self.io = 0.0
        self.done = 0.0
        self.hit_bytes = 0.0
        self.remote_bytes = 0.0
        self.gpu_seconds = 0.0
        self.segment: Segment | None = None  # None until the job first runs
        self.rate = 0.0
        self.remote_rate = 0.0
        self.updated_at = trace.arrival
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.last_started_at: float | None = None
        self.pending_since: float | None = trace.arrival  # None while it runs
        self.queued_before = 0.0  # seconds waited before `pending_since`
        self.preemptions = 0
        self.held: Mapping[str, int] = _NOWHERE  # what it holds while suspending after a preemption
        self.restart_seconds: list[float] = []  # from each preemption to the restart after it
        self.policy_state: Mapping[str, float] = _NO_STATE
        self.restoring_until = -math.inf  # while later than now, it restores a checkpoint and reads nothing
        self.overhead_seconds = 0.0  # spent restoring checkpoints
        self.version = 0  # bumped whenever its scheduled boundary event is superseded
        self.finish_pending = False  # its scheduled boundary event is its finish
        self.equal_share_mark = 0.0  # `measures.EqualShareWork`'s integral for its shape when it arrived
        self.equal_share_bytes = 0.0  # what an equal share of the cluster would have read over its stay
        self._queued_state: JobState | None = None

    @property
    def job_id(self) -> str:
        return self.trace.job_id

    @property
    def running(self) -> bool:
        return self.gpus > 0

    @property
    def shape(self) -> tuple[float, int, float]:
        """What its equal share of the cluster depends on: f* on all its GPUs, its GPUs, its dataset's size."""
        return (self.trace.ideal_bytes_per_sec, self.trace.gpus, float(self.trace.dataset_bytes))

    @property
    def remaining_bytes(self) -> float:
        return max(0.0, self.trace.total_bytes - self.done)

    def advance(self, now: float) -> None:
        """Integrate the current rates up to `now`."""
        elapsed = now - self.updated_at
        if elapsed > 0.0 and self.rate > 0.0 and self.segment is not None:
            consumed = self.rate * elapsed
            self.done += consumed
            self.remote_bytes += self.remote_rate * elapsed
            self.hit_bytes += (self.rate - self.remote_rate) * elapsed
            self.segment.bytes_left -= consumed
        if elapsed > 0.0:
            self.gpu_seconds += self.gpus * elapsed
        self.updated_at = now

    def place(self, placement: Mapping[str, int], io: float, now: float) -> bool:
        """Take a placement ({} to stop) and an IO allocation; True if either changed, so its rates may have."""
        if placement is self.placement or placement == self.placement:  # most rounds hand a job its own back
            if io == self.io or not placement:
                return False
            # Only the IO changed, as it does for many jobs each round under a baseline's fair-shared IO.
            self.advance(now)
            self.io = io
            self._queued_state = None
            return True
        self.advance(now)
        was_running = self.running
        self.placement = MappingProxyType(dict(placement)) if placement else _NOWHERE
        self.gpus = sum(placement.values())
        self.ideal = perf.ideal_rate(self.base, self.gpus)
        self.io = io if self.gpus else 0.0
        if self.gpus and not was_running:
            self._start(now)
        elif was_running and not self.gpus:
            self._stop(now)
        self._queued_state = None
        return True

    def _start(self, now: float) -> None:
        """It starts running: for the first time, or resumed after a preemption (then it restores first)."""
        if self.started_at is None:
            self.started_at = now
        elif self.resume_seconds > 0.0:
            self.restoring_until = now + self.resume_seconds
        self.last_started_at = now
        if self.pending_since is not None:
            if self.preemptions:
                self.restart_seconds.append(now - self.pending_since)
            self.queued_before += now - self.pending_since
        self.pending_since = None

    def _stop(self, now: float) -> None:
        """It is preempted: it keeps its progress and waits; a restore cut short counts as far as it got."""
        self.preemptions += 1
        self.pending_since = now
        if self.restoring_until > now:
            self.overhead_seconds += now - (self.restoring_until - self.resume_seconds)
            self.restoring_until = -math.inf

    def suspend(self, held: Mapping[str, int]) -> None:
        """Preempted (after `place({})`), it keeps holding `held` through its grace period, reading nothing."""
        self.held = held
        self._queued_state = None

    def released(self) -> None:
        """Its grace period is over: it holds nothing and may be placed again."""
        self.held = _NOWHERE
        self._queued_state = None

    @property
    def restoring(self) -> bool:
        return self.restoring_until > self.updated_at

    def restored(self) -> None:
        """Its checkpoint is back (at `restoring_until`, after `advance`): it reads from now on."""
        self.overhead_seconds += self.resume_seconds
        self.restoring_until = -math.inf

    def finish(self, now: float, equal_share_bytes: float) -> None:
        """Stop for good (after `advance`): the job releases everything and reads no more. `equal_share_bytes`
        is what an equal share of the cluster would have read over its stay (`measures.EqualShareWork`)."""
        self.finished_at = now
        self.equal_share_bytes = equal_share_bytes
        self.placement = _NOWHERE
        self.gpus = 0
        self.ideal = 0.0
        self.io = 0.0
        self.rate = 0.0
        self.remote_rate = 0.0
        self.version += 1

    def current_rates(self) -> tuple[float, float]:
        """(training rate, remote IO rate) in bytes/s under the current allocation and segment."""
        if not self.running or self.segment is None or self.restoring:
            return 0.0, 0.0
        hit = self.segment.hit_ratio
        rate = perf.rate_at_hit_ratio(self.ideal, hit, self.io)
        return rate, rate * (1.0 - hit)

    def time_to_boundary(self) -> tuple[float, bool]:
        """Seconds until the current segment ends or the job finishes, and whether it is the finish."""
        if self.rate <= 0.0 or self.segment is None:
            return math.inf, False
        remaining = self.remaining_bytes
        if remaining <= self.segment.bytes_left:
            return remaining / self.rate, True
        return self.segment.bytes_left / self.rate, False

    def state(self) -> JobState:
        """What a policy sees of the job now (after `advance`).

        A round builds one per running job (a queued job's stays the same until it runs again), so the
        fields go in by position, the unchanging ones from a tuple, straight into `tuple.__new__`: the named
        tuple's own constructor is interpreted Python that takes every field as an argument, three times
        slower. `test_a_jobs_state_carries_each_field_where_the_snapshot_expects_it` catches two fields
        swapped or one missing.
        """
        if self.gpus == 0 and self._queued_state is not None:
            return self._queued_state
        fields = (
            *self._unchanging,
            self.done,  # done_bytes
            self.gpu_seconds,  # attained_gpu_seconds
            self.base.irregular,
            self.placement,
            self.io,  # io_bytes_per_sec
            None if self.segment is None else self.segment.hit_ratio,  # epoch_hit_ratio
            self.started_at,  # first_start_time
            self.last_started_at,
            self.pending_since,
            self.queued_before,  # queued_seconds_before
            self.preemptions,
            self.policy_state,
            self.base.skew,
            self.held,
            *self._trailing,
        )
        state = tuple.__new__(JobState, fields)
        if self.gpus == 0:
            self._queued_state = state
        return state

    def hand_state(self, state: Mapping[str, float]) -> None:
        """Keep what the policy handed back for this job (`Decision.job_states`) for its next snapshot."""
        self.policy_state = MappingProxyType(dict(state))
        self._queued_state = None

    def outcome(self) -> JobOutcome:
        """The finished job's record."""
        if self.started_at is None or self.finished_at is None:
            raise ValueError(f"job {self.job_id!r} has not finished")
        return JobOutcome(
            job_id=self.job_id,
            arrival=self.trace.arrival,
            start=self.started_at,
            finish=self.finished_at,
            gpus=self.trace.gpus,
            dataset=self.trace.dataset,
            bytes_read=self.done,
            hit_bytes=self.hit_bytes,
            remote_bytes=self.remote_bytes,
            preemptions=self.preemptions,
            overhead_seconds=self.overhead_seconds,
            queued_seconds=self.queued_before,
            ideal_seconds=self.trace.total_bytes / self.trace.ideal_bytes_per_sec,
            restart_seconds=tuple(self.restart_seconds),
            equal_share_bytes=self.equal_share_bytes,
            tenant=self.trace.tenant,
            job_class=self.trace.job_class,
            priority=self.trace.priority,
        )
