"""What a change must satisfy against the current state before the data manager commits it.

Each check reads the state and raises, naming the request field and the numbers that decide, or returns what
the change will use; none changes anything, so a refused call leaves the state as it was (the manager commits
only after every check of a call has passed, with no await in between).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from datamgr import lifecycle, lookups
from datamgr.change_text import placement_text, time_text, workers_text
from datamgr.entities import Dataset, FailedPrecondition, InvalidArgument, Job, JobHistory, Tenant, Worker
from datamgr.liveness import NodeLiveness
from datamgr.state import ClusterState
from datamgr.validation import check_gpus, check_worker_count
from silodlib.units import format_rate, format_size


def check_cache_quota(state: ClusterState, dataset: Dataset, size: int) -> None:
    """A dataset's quota must fit its size and, on every node that mounts it, what the node's other datasets
    leave of its cache."""
    if size > dataset.size_bytes:
        raise FailedPrecondition(
            f"cache_size_bytes {size} is larger than dataset {dataset.uri} ({dataset.size_bytes} bytes)"
        )
    for node_id in sorted(state.nodes_mounting(dataset.uri)):
        others = state.node_cache_allocated(node_id) - dataset.cache_quota_bytes
        capacity = state.nodes[node_id].cache_capacity_bytes
        if others + size > capacity:
            raise FailedPrecondition(
                f"cache_size_bytes {size}: node {node_id!r} mounts {dataset.uri} and has room for "
                f"{max(0, capacity - others)} bytes of quota ({format_size(capacity)} capacity, "
                f"{format_size(others)} allocated to its other datasets)"
            )


def check_remote_io(state: ClusterState, limit: int | None, job: Job, rate: int) -> None:
    """A job's remote IO must fit what the other jobs leave of the limit. Lowering a job's rate is never refused:
    after a restart with a lower limit, that is how the policy or the operator brings the allocations back
    under it."""
    if limit is None or rate <= job.io_bytes_per_sec:
        return
    left = limit - (state.io_allocated_bytes_per_sec - job.io_bytes_per_sec)
    if rate > left:
        beyond = (
            f"; the other jobs are allocated {-left} bytes/s ({format_rate(-left)}) beyond the limit, "
            "lowered since they were allocated: lower theirs first"
            if left < 0
            else ""
        )
        raise FailedPrecondition(
            f"io_bytes_per_sec {rate} exceeds the remote IO limit of {limit} bytes/s: "
            f"{max(0, left)} bytes/s ({format_rate(max(0, left))}) are left for job {job.job_id!r}{beyond}"
        )


def checked_demand(workers: Sequence[Worker], gpus: int, policy: str | None) -> tuple[Worker, ...]:
    """A job for the policy to place: its GPU demand, and no workers (it has run nowhere yet)."""
    if workers:
        raise InvalidArgument(
            f"gpus {gpus} and workers {workers_text(workers)} are both given: give workers for a job that "
            "runs where they are, or gpus for a job the policy places, not both"
        )
    check_gpus("gpus", gpus)
    if policy is None:
        raise FailedPrecondition(
            f"gpus {gpus}: no policy places jobs on this data manager (--policy external); register the job "
            "with its workers, or run the data manager with a policy (--policy sjf, ...)"
        )
    return ()


def checked_workers(state: ClusterState, workers: Sequence[Worker]) -> tuple[Worker, ...]:
    """A job's workers: at least one, each on a registered node named once, with a valid count."""
    if not workers:
        raise InvalidArgument("workers must name at least one node (or give gpus for the policy to place the job)")
    seen: set[str] = set()
    for i, worker in enumerate(workers):
        lookups.node(state, f"workers[{i}].node_id", worker.node_id)
        check_worker_count(f"workers[{i}].count", worker.count)
        if worker.node_id in seen:
            raise InvalidArgument(
                f"workers[{i}].node_id {worker.node_id!r} is listed twice; give one entry with a count"
            )
        seen.add(worker.node_id)
    return tuple(workers)


def check_room_for(state: ClusterState, node_id: str, datasets: Sequence[Dataset]) -> None:
    """Refuse `datasets` on a node without room for the cache quotas of those it does not hold yet."""
    new = [d for d in datasets if d.uri not in state.datasets_on_node(node_id)]
    if not new:
        return
    allocated = state.node_cache_allocated(node_id)
    capacity = state.nodes[node_id].cache_capacity_bytes
    quotas = sum(d.cache_quota_bytes for d in new)
    if allocated + quotas > capacity:
        which = (
            f"dataset {new[0].uri} has a cache quota of"
            if len(new) == 1
            else f"datasets {', '.join(d.uri for d in new)} have cache quotas of, in all,"
        )
        raise FailedPrecondition(
            f"workers: node {node_id!r} has room for {max(0, capacity - allocated)} bytes of quota but {which} "
            f"{quotas} bytes"
        )


def checked_placement(
    state: ClusterState, liveness: NodeLiveness, job: Job, history: JobHistory, placement: Mapping[str, int]
) -> dict[str, int]:
    """The placement's nodes with GPUs, once what one job's placement must satisfy alone is checked."""
    if not job.placed_by_policy:
        raise FailedPrecondition(
            f"job_id: job {job.job_id!r} was registered with its workers; where it runs is up to whoever registered it"
        )
    wanted = {node_id: gpus for node_id, gpus in placement.items() if gpus}
    if wanted and history.suspending:
        raise FailedPrecondition(
            f"placement of job {job.job_id!r}: it is suspending through its grace period until "
            f"{time_text(history.suspended_until)} and holds {placement_text(history.held)} until then; "
            "it can be placed once they are released"
        )
    if wanted and sum(wanted.values()) != job.gpus:
        raise InvalidArgument(
            f"placement of job {job.job_id!r}: {sum(wanted.values())} GPUs ({placement_text(wanted)}); it runs on "
            f"all the {job.gpus} it asks for or on none"
        )
    running = lifecycle.placement_of(job)
    for node_id, gpus in sorted(wanted.items()):
        lookups.node(state, "placement", node_id)
        if not liveness.available(node_id) and running.get(node_id) != gpus:
            raise FailedPrecondition(
                f"placement of job {job.job_id!r}: node {node_id!r} is unavailable (its agent has not reported for "
                f"{liveness.seconds_since_seen(node_id):.0f} s); no job is placed on it until it reports"
            )
    return wanted


def check_gpus_free(state: ClusterState, wanted: Mapping[str, Mapping[str, int]]) -> None:
    """Refuse placements that ask more of a node than its GPUs for the policy, less those that jobs outside
    `wanted` are placed on and those suspending jobs hold."""
    for node_id in sorted({node_id for nodes in wanted.values() for node_id in nodes}):
        placed_here = sorted(job_id for job_id, nodes in wanted.items() if node_id in nodes)
        asked = sum(wanted[job_id][node_id] for job_id in placed_here)
        held = state.node_gpus_held(node_id)
        free = state.node_gpus_for_policy(node_id) - state.node_gpus_placed(node_id, except_jobs=set(wanted)) - held
        if asked > free:
            suspending = f" ({held} held by suspending jobs)" if held else ""
            jobs = "job " if len(placed_here) == 1 else "jobs "
            raise FailedPrecondition(
                f"placement of {jobs}{', '.join(map(repr, placed_here))}: node {node_id!r} has {max(0, free)} "
                f"GPUs free for the policy{suspending}, not {asked}"
            )


def check_io_reservations(limit: int | None, tenant: Tenant, others: Sequence[Tenant]) -> None:
    """A tenant's remote IO must fit what the others leave of the limit. One that reserves none is never
    refused: the others' reservations can exceed a limit lowered at a restart, which is none of its doing."""
    if limit is None or not tenant.io_bytes_per_sec:
        return
    reserved = sum(t.io_bytes_per_sec for t in others)
    if reserved + tenant.io_bytes_per_sec > limit:
        raise FailedPrecondition(
            f"io_bytes_per_sec {tenant.io_bytes_per_sec}: the other tenants reserve {format_rate(reserved)} of "
            f"the remote IO limit of {format_rate(limit)}, so {format_rate(max(0, limit - reserved))} are left"
        )
