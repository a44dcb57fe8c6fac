"""When the GPUs that preempted jobs hold through their grace periods go back to the policy.

A job preempted with a grace period keeps its GPUs until the period ends (`JobHistory.suspended_until`, on the
data manager's wall clock); the live controller asks for the first end (`next_release`) and releases the jobs
due then. A period stamped by a clock ahead of this one (a restart after the system clock was stepped back)
would hold the GPUs for the length of the step: such periods are re-dated to a whole grace period from now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from datamgr.change_text import placement_text
from datamgr.entities import JobHistory
from datamgr.state import ClusterState


def ends_too_late(state: ClusterState, history: JobHistory, now: float) -> bool:
    """Whether the job's grace period ends more than its whole length from `now`."""
    job = state.jobs.get(history.job_id)
    until = history.suspended_until
    return job is not None and until is not None and until - now > job.grace_seconds


def next_release(state: ClusterState, now: float) -> float | None:
    """When the first grace period still running ends, or `now` if one is to be re-dated; None if no job
    suspends."""
    return min(
        (
            now if ends_too_late(state, h, now) else h.suspended_until
            for h in state.histories.values()
            if h.suspended_until is not None
        ),
        default=None,
    )


def due_and_redated(state: ClusterState, now: float) -> tuple[list[JobHistory], list[JobHistory]]:
    """The histories of the registered jobs whose grace period is over, and those re-dated to end a whole grace
    period from `now` (`ends_too_late`), in job order."""
    due, redated = [], []
    for job_id, h in sorted(state.histories.items()):
        if h.suspended_until is None or job_id not in state.jobs:
            continue
        if h.suspended_until <= now:
            due.append(h)
        elif ends_too_late(state, h, now):
            redated.append(replace(h, suspended_until=now + state.jobs[job_id].grace_seconds))
    return due, redated


def release_description(due: Sequence[JobHistory], redated: Sequence[JobHistory]) -> str:
    """The change log's line for one release."""
    changes = []
    if due:
        released = ", ".join(f"{h.job_id} ({placement_text(h.held)})" for h in due)
        changes.append(f"grace period over: released {released}")
    if redated:
        ids = ", ".join(h.job_id for h in redated)
        changes.append(f"grace period of {ids} re-dated to end a whole grace period from now")
    return "; ".join(changes)
