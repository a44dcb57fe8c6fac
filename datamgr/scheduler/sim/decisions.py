"""What the simulator requires of a policy's decision, and the decision log's record of one.

A decision the cluster could not carry out (GPUs a node does not have, more cache than the capacity, remote
IO beyond the limit, a job that is not there) is a policy bug: the run stops with `InvalidDecision` naming the
scheduler, the time and the rule, rather than simulating something impossible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from datamgr.scheduler.policy import Decision, Placements
from datamgr.scheduler.snapshot import JobState, Snapshot


class InvalidDecision(ValueError):
    """A decision that breaks a resource limit or names what does not exist."""


def check_decision(decision: Decision, snapshot: Snapshot, scheduler: str) -> None:
    """Raise `InvalidDecision` unless the cluster of `snapshot` can carry `decision` out."""
    where = f"scheduler {scheduler} at t={snapshot.time:g}s"
    _check_placements(decision.placements or {}, snapshot, where)
    cache = decision.cache_bytes or {}
    private = decision.job_cache_bytes
    for owner, amount in [*cache.items(), *private.items()]:
        if amount < 0:
            raise InvalidDecision(f"{where}: gave {owner!r} a negative cache of {amount} bytes")
    for job_id in private:
        if job_id not in snapshot.jobs:
            raise InvalidDecision(f"{where}: gave a private cache to job {job_id!r}, which is not waiting or running")
    allocated = sum(cache.values()) + sum(private.values())
    if allocated > snapshot.cache_capacity_bytes:
        raise InvalidDecision(
            f"{where}: allocated {allocated} bytes of cache, more than the capacity {snapshot.cache_capacity_bytes}"
        )
    io = decision.io_bytes_per_sec or {}
    for job_id, rate in io.items():
        if rate < 0:
            raise InvalidDecision(f"{where}: gave job {job_id!r} a negative remote IO of {rate} bytes/s")
    if sum(io.values()) > snapshot.remote_io_bytes_per_sec:
        raise InvalidDecision(
            f"{where}: allocated {sum(io.values())} bytes/s of remote IO, more than the limit "
            f"{snapshot.remote_io_bytes_per_sec:g}"
        )


def _check_placements(placements: Placements, snapshot: Snapshot, where: str) -> None:
    """Checked every round over every running job: the snapshot's mappings are read once, a job's GPUs are
    added up in the same loop that checks them. What suspending jobs hold counts as taken, and so does what the
    jobs this decision preempts will hold through their grace periods: their GPUs are not free this round."""
    jobs, nodes = snapshot.jobs, snapshot.nodes
    used: dict[str, int] = {}
    host: dict[str, tuple[float, int]] = {}  # node -> CPUs and RAM taken, where jobs ask for them
    graced: dict[str, list[str]] = {}  # node -> the jobs this decision preempts that keep GPUs there
    for suspending in snapshot.suspending_jobs():
        for node_id, gpus in suspending.held.items():
            used[node_id] = used.get(node_id, 0) + gpus
            _take_host(suspending, node_id, host)
    if placements:
        for stopping in snapshot.running_jobs():
            if stopping.grace_seconds > 0 and not placements.get(stopping.job_id):
                for node_id, gpus in stopping.placement.items():
                    used[node_id] = used.get(node_id, 0) + gpus
                    _take_host(stopping, node_id, host)
                    graced.setdefault(node_id, []).append(stopping.job_id)
    for job_id, placement in placements.items():
        job = jobs.get(job_id)
        if job is None:
            raise InvalidDecision(f"{where}: placed job {job_id!r}, which is not waiting or running")
        if job.held and placement:
            raise InvalidDecision(f"{where}: placed job {job_id!r}, which is still suspending (its grace period)")
        held = 0
        for node_id, gpus in placement.items():
            if node_id not in nodes:
                raise InvalidDecision(f"{where}: placed job {job_id!r} on node {node_id!r}, which does not exist")
            if gpus <= 0:
                raise InvalidDecision(f"{where}: placed job {job_id!r} on {gpus} GPUs of node {node_id!r}")
            used[node_id] = used.get(node_id, 0) + gpus
            held += gpus
        if held and held != job.gpus:
            raise InvalidDecision(
                f"{where}: gave job {job_id!r} {held} GPUs; a job runs on all the {job.gpus} it asks for or on none"
            )
        if (job.cpus or job.ram_bytes) and placement:
            if len(placement) > 1:
                raise InvalidDecision(
                    f"{where}: spread job {job_id!r}, which asks for CPUs and RAM, over several nodes"
                )
            _take_host(job, next(iter(placement)), host)
    for node_id, gpus in used.items():
        if gpus > snapshot.nodes[node_id].gpus:
            raise InvalidDecision(
                f"{where}: placed {gpus} GPUs on node {node_id!r}, which has {snapshot.nodes[node_id].gpus}"
                + _held_through_grace(graced.get(node_id, []))
            )
    for node_id, (cpus, ram) in host.items():
        node = snapshot.nodes[node_id]
        if cpus > node.cpus or ram > node.ram_bytes:
            raise InvalidDecision(
                f"{where}: placed jobs needing {cpus:g} CPUs and {ram} bytes of RAM on node {node_id!r}, which has "
                f"{node.cpus:g} and {node.ram_bytes} (a policy that ignores CPUs and RAM cannot run this trace; "
                "fitgpp, lrtp, rand and fitgpp-fifo account for them)"
            )


def _held_through_grace(job_ids: list[str]) -> str:
    """What a refusal adds when jobs the decision preempts hold GPUs of the node through their grace periods."""
    if not job_ids:
        return ""
    return (
        f", counting those that {', '.join(map(repr, sorted(job_ids)))}, preempted by this decision, hold through "
        "grace periods (a policy that ignores grace periods cannot run this trace; fitgpp, lrtp, rand and "
        "fitgpp-fifo wait for them)"
    )


def _take_host(job: JobState, node_id: str, host: dict[str, tuple[float, int]]) -> None:
    """Count the CPUs and RAM `job` asks for, if any, as taken on `node_id`."""
    if job.cpus or job.ram_bytes:
        cpus, ram = host.get(node_id, (0.0, 0))
        host[node_id] = (cpus + job.cpus, ram + job.ram_bytes)


def decision_record(
    time: float,
    decision: Decision,
    placements: Placements,
    cached_bytes: Mapping[str, float],
    io_bytes_per_sec: Mapping[str, float],
) -> str:
    """One JSON line for the decision log: the round's time, every running job's placement (node -> GPUs)
    and remote IO (bytes/s), the cache quotas it set (per dataset, and per job for private copies), the
    bytes cached per dataset once applied, and the policy's notes. Keys are sorted, so equal runs log equal
    lines."""
    record = {
        "time": time,
        "placements": {job_id: dict(placement) for job_id, placement in placements.items()},
        "io_bytes_per_sec": dict(io_bytes_per_sec),
        "cache_quota_bytes": dict(decision.cache_bytes or {}),
        "job_cache_bytes": dict(decision.job_cache_bytes),
        "cached_bytes": {dataset: round(cached) for dataset, cached in cached_bytes.items()},
        "notes": dict(decision.notes),
    }
    return json.dumps(record, sort_keys=True)
