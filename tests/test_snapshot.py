"""What a policy sees: the snapshot's job orders, which it sorts once, follow every way a snapshot is derived."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from datamgr.scheduler.snapshot import JobState, NodeState, Snapshot

GB = 10**9


def job(job_id: str, submitted: float, on: dict[str, int] | None = None) -> JobState:
    return JobState(job_id, submitted, 1, "ds", 10 * GB, 1e8, 1e10, placement=MappingProxyType(dict(on or {})))


def snapshot(*jobs: JobState) -> Snapshot:
    nodes = {"n": NodeState("n", 4, 10 * GB)}
    return Snapshot(0.0, nodes, 1e9, {}, {j.job_id: j for j in jobs})


def ids(jobs: list[JobState]) -> list[str]:
    return [j.job_id for j in jobs]


def test_jobs_come_in_submission_order_with_ties_by_id_split_into_running_and_queued() -> None:
    snap = snapshot(job("c", 2.0, {"n": 1}), job("b", 1.0), job("a", 1.0, {"n": 1}), job("d", 0.5))
    assert ids(snap.jobs_by_submission()) == ["d", "a", "b", "c"]
    assert ids(snap.running_jobs()) == ["a", "c"]
    assert ids(snap.queued_jobs()) == ["d", "b"]


def test_jobs_handed_over_in_order_but_for_a_last_tie_are_still_sorted_by_id() -> None:
    # The snapshot sorts only jobs it finds out of order: one tie out of id order, at the end, must be found.
    tie_at_end = snapshot(job("a", 0.0), job("b", 1.0), job("d", 2.0), job("c", 2.0))
    assert ids(tie_at_end.jobs_by_submission()) == ["a", "b", "c", "d"]
    in_order = snapshot(job("a", 0.0), job("b", 1.0), job("c", 1.0))
    assert ids(in_order.jobs_by_submission()) == ["a", "b", "c"]


def test_derived_snapshots_order_their_own_jobs_not_the_original_ones() -> None:
    snap = snapshot(job("a", 0.0, {"n": 1}), job("b", 1.0), job("c", 2.0))
    placed = snap.with_placements({"b": {"n": 1}})
    assert ids(placed.running_jobs()) == ["b"] and ids(placed.queued_jobs()) == ["a", "c"]
    assert ids(snap.restricted(["c", "a"], 0, 0.0).jobs_by_submission()) == ["a", "c"]
    later = replace(snap, jobs={"z": job("z", -1.0), **snap.jobs})
    assert ids(later.jobs_by_submission()) == ["z", "a", "b", "c"]


def test_a_policy_cannot_reorder_the_snapshot_through_a_list_it_was_given() -> None:
    snap = snapshot(job("a", 0.0), job("b", 1.0))
    snap.jobs_by_submission().reverse()
    assert ids(snap.jobs_by_submission()) == ["a", "b"]
