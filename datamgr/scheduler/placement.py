"""Gang placement of a job's GPUs on nodes: all of them or none.

Consolidation first (one node if any fits, the tightest such node so large holes stay free), else spread
over the nodes with the most free GPUs. Pure and deterministic: ties break by node id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from datamgr.scheduler.snapshot import JobState


def place_gang(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int] | None:
    """GPUs per node for a job that needs `gpus`, or None if the free GPUs cannot hold it."""
    if gpus <= 0 or sum(max(0, n) for n in free_gpus.values()) < gpus:
        return None
    return _gang(free_gpus, gpus)


def _gang(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int]:
    """`place_gang` for `gpus` > 0 that the free GPUs are known to hold."""
    return _on_one_node(free_gpus, gpus) or _fill(free_gpus, sorted(free_gpus, key=lambda n: (-free_gpus[n], n)), gpus)


def _on_one_node(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int] | None:
    """All `gpus` on the tightest node that has them (so large holes stay free), or None if none has."""
    fitting = [node for node, free in free_gpus.items() if free >= gpus]
    return {min(fitting, key=lambda n: (free_gpus[n], n)): gpus} if fitting else None


def place_consolidated(free_gpus: Mapping[str, int], gpus: int, gpus_per_node: int) -> dict[str, int] | None:
    """GPUs per node on as few nodes as a job of `gpus` can use (`ceil(gpus / gpus_per_node)`), or None.

    YARN-CS's constraint (Tiresias section 2.2), and Tiresias's placement of skewed models: a 16-GPU job on
    4-GPU nodes needs four completely free nodes and waits until it has them, however many GPUs are free
    elsewhere. Within the constraint the fullest fitting nodes are taken, so large holes stay whole.
    """
    if gpus <= 0 or gpus_per_node <= 0:
        return None
    nodes_needed = -(-gpus // gpus_per_node)
    if nodes_needed == 1:
        return _on_one_node(free_gpus, gpus)
    roomiest = sorted(free_gpus, key=lambda n: (-free_gpus[n], n))[:nodes_needed]
    if sum(max(0, free_gpus[n]) for n in roomiest) < gpus:
        return None
    return _fill(free_gpus, roomiest, gpus)


def place_least_fragmenting(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int] | None:
    """GPUs per node that leave the free GPUs as whole as possible, or None if they cannot hold the job.

    Tiresias places a job its profiler finds unskewed "to decrease fragmentation": on one node if any fits
    (the tightest), else from the smallest holes up, so the nodes left free stay free for consolidated jobs.
    """
    if gpus <= 0 or sum(max(0, n) for n in free_gpus.values()) < gpus:
        return None
    return _on_one_node(free_gpus, gpus) or _fill(free_gpus, sorted(free_gpus, key=lambda n: (free_gpus[n], n)), gpus)


def _fill(free_gpus: Mapping[str, int], nodes: Iterable[str], gpus: int) -> dict[str, int]:
    """Take the free GPUs of `nodes` in order until `gpus` are taken (the nodes are known to hold them)."""
    placement: dict[str, int] = {}
    needed = gpus
    for node in nodes:
        got = min(max(0, free_gpus[node]), needed)
        if got > 0:
            placement[node] = got
            needed -= got
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


Placer = Callable[[Mapping[str, int], JobState], dict[str, int] | None]


def place_by_priority(
    free_gpus: Mapping[str, int], ranked: Sequence[JobState], place: Placer
) -> dict[str, dict[str, int]]:
    """Placements for `ranked` (highest priority first) on the cluster's GPUs, `free_gpus` with nothing placed:
    Tiresias's round (its Pseudocode 2), for any policy that ranks jobs and preempts.

    1. Walk the ranking and keep every job whose GPUs still fit in the count left; skip the rest (so smaller
       jobs behind a large one that does not fit can run).
    2. A kept job that is running stays where it is; a kept job that waits is placed by `place` (a placement
       rule: consolidated, least fragmenting) in the GPUs left, in rank order. One that the rule cannot place
       there (the GPUs are free but scattered) waits.
    3. A running job that was skipped is preempted only if a job placed in step 2 took its GPUs: otherwise it
       keeps running where it is, since stopping it would free GPUs that nobody uses.

    A running job never moves: a move is a preemption and a restart, which a round must not do in passing.
    """
    selected: list[JobState] = []
    left = sum(max(0, n) for n in free_gpus.values())
    for job in ranked:
        if 0 < job.gpus <= left:
            selected.append(job)
            left -= job.gpus
    placements: dict[str, dict[str, int]] = {}
    free = dict(free_gpus)
    for job in selected:
        if job.placement:
            placements[job.job_id] = dict(job.placement)
            take(free, job.placement)
    for job in selected:
        if not job.placement:
            placement = place(free, job)
            if placement is not None:
                placements[job.job_id] = placement
                take(free, placement)
    for job in ranked:
        kept = None if job.job_id in placements else _still_free(free, job)
        if kept is not None:
            placements[job.job_id] = kept
            take(free, kept)
    return placements


def profile_based(gpus_per_node: int, pack_limit: float) -> Placer:
    """Tiresias's placement (section 3.3): consolidated (`place_consolidated`) for a job whose model's skew
    exceeds `pack_limit`, least fragmenting for the rest. SRTF and SRSF use it too, as in the paper."""

    def place(free_gpus: Mapping[str, int], job: JobState) -> dict[str, int] | None:
        if job.skew > pack_limit:
            return place_consolidated(free_gpus, job.gpus, gpus_per_node)
        return place_least_fragmenting(free_gpus, job.gpus)

    return place


def gpus_per_node(free_gpus: Mapping[str, int]) -> int:
    """The most GPUs a node has (`free_gpus` with nothing placed): what "as few nodes as possible" counts in."""
    return max(free_gpus.values(), default=0)
