"""Gang placement of a job's GPUs on nodes: all of them or none.

Consolidation first (one node if any fits, the tightest such node so large holes stay free), else spread
over the nodes with the most free GPUs. Pure and deterministic: ties break by node id.
"""

from __future__ import annotations

from collections.abc import Mapping


def place_gang(free_gpus: Mapping[str, int], gpus: int) -> dict[str, int] | None:
    """GPUs per node for a job that needs `gpus`, or None if the free GPUs cannot hold it."""
    if gpus <= 0 or sum(max(0, n) for n in free_gpus.values()) < gpus:
        return None
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
