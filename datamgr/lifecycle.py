"""A job's life under the policy that places it: its phase, how its history changes when it starts or stops,
and the decision a cluster's launcher follows (WatchDecisions).

Pure: no I/O, and the time is handed in (seconds since the Unix epoch, so that a history persisted before a
restart still adds up after it). The manager validates and commits what these functions compute; the
controller plans a round's compute changes with `compute_moves`.

A job registered with its workers (`Job.placed_by_policy` false) runs from its registration to its finish
where whoever registered it put it: its history says so and never changes but for its policy state. A job
registered with GPUs waits until the policy places it; each placement and preemption is one `move`. A job
preempted with a grace period (`Job.grace_seconds`) suspends: it keeps holding the GPUs it ran on until the
period ends (`released`), and no placement may take them or start it meanwhile, as in the simulator
(`datamgr.scheduler.sim.engine`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from datamgr.entities import Job, JobHistory, Worker

Placement = Mapping[str, int]  # node -> GPUs


class Phase(enum.Enum):
    """Where a job stands with the policy (the values are pb.JobPhase's)."""

    PENDING = 1  # submitted, never run
    RUNNING = 2  # holds GPUs
    PREEMPTED = 3  # ran, then lost its GPUs; waits to resume
    SUSPENDING = 4  # preempted, it still holds its GPUs through its grace period


def registered(job: Job, now: float) -> JobHistory:
    """The history of a job registered at `now`: waiting for the policy, or running where it was registered."""
    if job.placed_by_policy:
        return JobHistory(job.job_id, submit_time=now, pending_since=now)
    return JobHistory(job.job_id, submit_time=now, first_start_time=now, last_start_time=now)


def placement_of(job: Job) -> dict[str, int]:
    return {w.node_id: w.count for w in job.workers}


def phase(job: Job, history: JobHistory) -> Phase:
    if job.workers:
        return Phase.RUNNING
    if history.suspending:
        return Phase.SUSPENDING
    return Phase.PENDING if history.first_start_time is None else Phase.PREEMPTED


def attained_gpu_seconds(job: Job, history: JobHistory, now: float) -> float:
    """The GPU time the job has held up to `now` (Tiresias's attained service)."""
    held = sum(w.count for w in job.workers)
    since = history.last_start_time
    running = held * max(0.0, now - since) if held and since is not None else 0.0
    return history.attained_gpu_seconds_before + running


def queued_seconds(history: JobHistory, now: float) -> float:
    """The time the job has waited up to `now`: before it first ran and after each preemption."""
    waiting = 0.0 if history.pending_since is None else max(0.0, now - history.pending_since)
    return history.queued_seconds_before + waiting


def moved(
    job: Job, history: JobHistory, placement: Placement, now: float, read_on_nodes_left: int = 0
) -> tuple[Job, JobHistory]:
    """The job on `placement` from `now` (empty: stopped), and its history after the move.

    Starting ends its wait; stopping a running job is a preemption and banks the GPU time it held, and with a
    grace period it suspends, holding the GPUs it ran on until `now` + the period. A placement that changes
    while the job runs (a migration) changes neither: the job holds all its GPUs throughout. A suspending job
    is not started (the caller refuses it). Either way, `read_on_nodes_left`, what the nodes the job leaves
    reported of their run of it (`nodes_left`), is banked: a node that mounts the job again counts from 0."""
    workers = tuple(Worker(node_id, gpus) for node_id, gpus in sorted(placement.items()))
    was_running, runs = bool(job.workers), bool(workers)
    if read_on_nodes_left:
        history = replace(history, bytes_read_before=history.bytes_read_before + read_on_nodes_left)
    if runs and not was_running:
        waited = 0.0 if history.pending_since is None else max(0.0, now - history.pending_since)
        history = replace(
            history,
            first_start_time=now if history.first_start_time is None else history.first_start_time,
            last_start_time=now,
            pending_since=None,
            queued_seconds_before=history.queued_seconds_before + waited,
        )
    elif was_running and not runs:
        suspends = job.grace_seconds > 0
        history = replace(
            history,
            attained_gpu_seconds_before=attained_gpu_seconds(job, history, now),
            pending_since=now,
            preemptions=history.preemptions + 1,
            held=placement_of(job) if suspends else {},
            suspended_until=now + job.grace_seconds if suspends else None,
        )
    return replace(job, workers=workers), history


def nodes_left(job: Job, placement: Placement) -> list[str]:
    """The nodes the job runs on that `placement` leaves out: moving there, it stops reading on them."""
    return sorted(placement_of(job).keys() - _nodes_of(placement))


def nodes_joined(job: Job, placement: Placement) -> list[str]:
    """The nodes of `placement` the job does not run on yet: moving there, it starts reading on them."""
    return sorted(_nodes_of(placement) - placement_of(job).keys())


def _nodes_of(placement: Placement) -> set[str]:
    return {node_id for node_id, gpus in placement.items() if gpus}


def released(history: JobHistory) -> JobHistory:
    """The history of a suspending job whose grace period is over: it holds nothing and may be placed again."""
    return replace(history, held={}, suspended_until=None)


def with_policy_state(history: JobHistory, state: Mapping[str, float], policy: str) -> JobHistory | None:
    """The history with the state `policy` handed back (an empty state is no policy's); None when that is what
    it already holds."""
    new = {key: float(value) for key, value in state.items()}
    by = policy if new else ""
    if new == dict(history.policy_state) and by == history.policy_state_by:
        return None
    return replace(history, policy_state=new, policy_state_by=by)


def policy_state_of(history: JobHistory, policy: str) -> Mapping[str, float]:
    """The state `policy` handed back for the job, or nothing if another policy wrote the one kept. A state kept
    before its writer was (`policy_state_by` "") is taken as the running policy's, as it always was; if the
    policy changed with that upgrade, it must cope (Tiresias and HiveD ignore a state they cannot use)."""
    return {} if written_by_another(history, policy) else history.policy_state


def written_by_another(history: JobHistory, policy: str) -> bool:
    """Whether the job's kept state was handed back by another policy than `policy` (one kept before writers
    were is no other's)."""
    return history.policy_state_by not in ("", policy)


# ---- a round's compute changes ----


@dataclass(frozen=True, slots=True)
class Move:
    """One policy-placed job the round starts, stops or migrates."""

    job_id: str
    current: Mapping[str, int]
    wanted: Mapping[str, int]

    @property
    def stops(self) -> bool:
        return bool(self.current) and not self.wanted

    def __str__(self) -> str:
        def text(placement: Mapping[str, int]) -> str:
            return ",".join(f"{n}:{g}" for n, g in sorted(placement.items())) or "nothing"

        verb = "preempt" if self.stops else "start" if not self.current else "move"
        return f"{verb} {self.job_id} ({text(self.current)} -> {text(self.wanted)})"


def compute_moves(
    jobs: Mapping[str, Job], considered: Iterable[str], placements: Mapping[str, Placement]
) -> tuple[list[Move], list[str]]:
    """The moves that bring the policy-placed jobs of `considered` (those a round's snapshot showed that are
    still registered) to `placements` (a job left out: stopped), stops first so that the GPUs they free are
    free for the jobs placed after them; and the jobs registered with their workers that the policy would
    have moved or stopped (their placement is their launcher's, so they stay)."""
    moves: list[Move] = []
    unapplied: list[str] = []
    for job_id in sorted(considered):
        job = jobs.get(job_id)
        if job is None:
            continue
        current, wanted = placement_of(job), {n: g for n, g in placements.get(job_id, {}).items() if g}
        if current == wanted:
            continue
        if job.placed_by_policy:
            moves.append(Move(job_id, MappingProxyType(current), MappingProxyType(wanted)))
        else:
            unapplied.append(job_id)
    return sorted(moves, key=lambda m: not m.stops), unapplied


# ---- what WatchDecisions publishes ----


@dataclass(frozen=True, slots=True)
class DecisionView:
    """The decision for one policy-placed job as a launcher sees it; two equal views are one decision."""

    job_id: str
    phase: Phase
    placement: tuple[tuple[str, int], ...]  # (node, GPUs), by node
    gpus: int
    dataset_uri: str
    suspended_until: float | None = None  # while it suspends


def decision_view(job: Job, history: JobHistory) -> DecisionView | None:
    """The job's decision; None for a job registered with its workers (no policy decides where it runs)."""
    if not job.placed_by_policy:
        return None
    placement = tuple(sorted(placement_of(job).items()))
    return DecisionView(job.job_id, phase(job, history), placement, job.gpus, job.dataset_uri, history.suspended_until)


def changed_decisions(
    before: Mapping[str, DecisionView | None], after: Mapping[str, DecisionView | None]
) -> tuple[list[DecisionView], list[str]]:
    """What a change did to the decisions of the jobs it touched (`before` and `after` map the same ids): the
    new or changed decisions, stops first (the order a launcher applies them in), and the jobs that left."""
    changed = [view for job_id, view in after.items() if view is not None and before.get(job_id) != view]
    finished = [job_id for job_id, view in before.items() if view is not None and after.get(job_id) is None]
    return sorted(changed, key=lambda v: (v.phase == Phase.RUNNING, v.job_id)), sorted(finished)
