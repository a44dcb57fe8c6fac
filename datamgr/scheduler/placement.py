"""Gang placement of a job's GPUs on nodes: all of them or none.

Consolidation first (one node if any fits, the tightest such node so large holes stay free), else spread
over the nodes with the most free GPUs. Pure and deterministic: ties break by node id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from datamgr.scheduler.snapshot import JobState


def place_gang(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int] | None:
    """GPUs per node for a job that needs `gpus`, or None if the free GPUs cannot hold it."""
    if gpus <= 0 or sum(max(0, n) for n in free_gpus.values()) < gpus:
        return None
    return _gang(free_gpus, gpus)


def _gang(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int]:
    """`place_gang` for `gpus` > 0 that the free GPUs are known to hold."""
    fitting = [node for node, free in free_gpus.items() if free >= gpus]
    if fitting:
        node = min(fitting, key=lambda n: (free_gpus[n], n))
        return {node: gpus}
    placement: dict[str, int] = {}
    needed = gpus
    for node in sorted(free_gpus, key=lambda n: (-free_gpus[n], n)):
        take = min(free_gpus[node], needed)
        if take > 0:
            placement[node] = take
            needed -= take
        if needed == 0:
            break
    return placement


def take(free_gpus: dict[str, int], placement: Mapping[str, int]) -> None:
    """Subtract a placement from the free GPUs in place."""
    for node, gpus in placement.items():
        free_gpus[node] -= gpus


def place_in_order(free_gpus: Mapping[str, int], jobs: Iterable[JobState]) -> dict[str, dict[str, int]]:
    """Gang placements for `jobs`, highest priority first, on `free_gpus`: what a preemptive policy runs.

    A job that holds GPUs keeps them where they are still free (a preemptive policy re-ranks every round,
    but moving a job that keeps running would only cost a restart). A job that does not fit is skipped, so
    later, smaller jobs can use the GPUs it leaves idle. Jobs left out are queued (or preempted).
    """
    free = dict(free_gpus)
    left = sum(max(0, n) for n in free.values())  # kept as jobs are placed: most of a long queue cannot fit
    placements: dict[str, dict[str, int]] = {}
    for job in jobs:
        if left == 0:
            break
        if not 0 < job.gpus <= left:
            continue
        placement = _still_free(free, job) or _gang(free, job.gpus)
        take(free, placement)
        left -= job.gpus
        placements[job.job_id] = placement
    return placements


def _still_free(free_gpus: Mapping[str, int], job: JobState) -> dict[str, int] | None:
    """The job's current placement, if it holds its whole gang there and those GPUs are still free."""
    held = job.placement
    if not held or sum(held.values()) != job.gpus:
        return None
    for node, gpus in held.items():
        if free_gpus.get(node, 0) < gpus:
            return None
    return dict(held)
