"""Tenants' virtual clusters against the data manager's cell hierarchy (`silod datamgr serve --cell-levels`).

Pure: no I/O. A tenant's VC names cells by level name ({"node": 2}); the names must be levels of the hierarchy,
and once the nodes that offer GPUs are known, all the VCs together must fit them (HiveD's feasibility,
`datamgr.scheduler.hived.check_feasible`): a policy such as `hived` can keep every tenant's guarantee only then.

The hierarchy is the one the policy builds each round: the levels of `--cell-levels` (without it, a node is
one cell of its GPUs: levels `gpu` and `node`) over the nodes in id order, which must fill whole top-level
cells. Only nodes registered with GPUs count: a node without GPUs offers the policy no cell. While the nodes
do not make a whole hierarchy (none yet, or half a rack) the VCs cannot be checked against them; the level
names always can.

A node going (unregistered, or silent past the node timeout) can break the VCs' fit, whatever shape the nodes left
make: `guarantee_lost` says so by counting the whole cells they make as the policy builds them (half a rack is a few
node cells, no rack cell), so that the operator who removes the node, or whose node stopped reporting, hears which
tenants lost their guarantee then, not at the next start.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

from datamgr.entities import FailedPrecondition, InvalidArgument, Node, Tenant
from datamgr.scheduler.cells import CellHierarchy, FreeLists, parse_levels
from datamgr.scheduler.hived import Infeasible, check_feasible, infeasibility
from datamgr.scheduler.policies.hived import cell_hierarchy
from datamgr.validation import ID_RULE

DEFAULT_LEVEL_NAMES = ("gpu", "node")  # without --cell-levels: a node is one cell of its GPUs


def check_cell_levels(spec: str) -> tuple[tuple[str, int], ...]:
    """`--cell-levels` as (name, buddies) pairs, bottom up ("" stays empty: the default); a ValueError that says
    what is wrong (a part that is not NAME:BUDDIES, a name a VC could not give as ids are given, a repeated
    name, a lowest level that is not one GPU, no level called `node`)."""
    if not spec:
        return ()
    levels = parse_levels(spec)
    for name, _ in levels:
        if not re.fullmatch(ID_RULE, name):
            raise ValueError(f"cell level name {name!r} must match {ID_RULE}")
    CellHierarchy(levels, 1)  # checks the levels themselves, whatever the nodes
    return levels


def level_names(cell_levels: str) -> tuple[str, ...]:
    return tuple(name for name, _ in parse_levels(cell_levels)) if cell_levels else DEFAULT_LEVEL_NAMES


def gpu_nodes(nodes: Iterable[Node]) -> list[Node]:
    """The nodes that offer the policy GPUs, in id order: the node cells of the hierarchy, in path order."""
    return sorted((node for node in nodes if node.gpus > 0), key=lambda node: node.node_id)


def hierarchy_over(cell_levels: str, nodes: Iterable[Node]) -> CellHierarchy | None:
    """The cell hierarchy over the nodes that offer GPUs, as the policy builds it once they fill whole top-level
    cells; None while no node offers GPUs or they do not fill whole top-level cells. The policy then pads the
    last top cell with absent nodes (`policies.hived.cell_hierarchy`), whose GPUs no feasibility check may
    count, so VCs are checked only against whole cells."""
    offering = gpu_nodes(nodes)
    if not offering:
        return None
    levels = parse_levels(cell_levels) if cell_levels else (("gpu", 1), ("node", max(n.gpus for n in offering)))
    try:
        return CellHierarchy.over_nodes(levels, [node.node_id for node in offering])
    except ValueError:
        return None


def cell_gpus(cell_levels: str, nodes: Iterable[Node]) -> dict[str, int]:
    """The GPUs of one cell per level name; without `--cell-levels` a node cell's are the largest node's, unknown
    (left out) while no node offers GPUs."""
    if cell_levels:
        probe = CellHierarchy(parse_levels(cell_levels), 1)
        return {level.name: probe.gpus(number) for number, level in enumerate(probe.levels, start=1)}
    largest = max((node.gpus for node in nodes), default=0)
    return {"gpu": 1, "node": largest} if largest else {"gpu": 1}


class NodeLargerThanCell(FailedPrecondition):
    """A node with more GPUs than a node cell of --cell-levels: no restart of its agent changes that."""

    refusal = "node-larger-than-a-cell"


def check_node_gpus(node: Node, cell_levels: str, field: str = "gpus") -> None:
    """FAILED_PRECONDITION unless the node's GPUs fit a node cell of `--cell-levels` (any do without it: a node
    cell is then the largest node's). A node cell cannot hold more, so no hierarchy of these levels could hold
    the node, and every round of a policy that keeps cells (hived) would fail."""
    if not cell_levels:
        return
    per_node = cell_gpus(cell_levels, ())["node"]
    if node.gpus > per_node:
        raise NodeLargerThanCell(
            f"{field}: node {node.node_id!r} has {node.gpus} GPUs, more than the {per_node} of a node cell of "
            f"--cell-levels {cell_levels}"
        )


def vc_gpus(tenant: Tenant, gpus_per_cell: Mapping[str, int]) -> int:
    """The GPUs a tenant's cells hold; 0 while a level it names has no known size."""
    if any(level not in gpus_per_cell for level, count in tenant.cells.items() if count):
        return 0
    return sum(count * gpus_per_cell.get(level, 0) for level, count in tenant.cells.items())


def check_levels(tenant: Tenant, cell_levels: str, field: str = "cells") -> None:
    """INVALID_ARGUMENT unless every level the tenant's VC names is a level of the hierarchy."""
    names = level_names(cell_levels)
    unknown = sorted(set(tenant.cells) - set(names))
    if unknown:
        hierarchy = f"--cell-levels {cell_levels}" if cell_levels else "no --cell-levels: a node is one cell"
        raise InvalidArgument(
            f"{field}: the cell hierarchy has no level {', '.join(map(repr, unknown))}; its levels are "
            f"{', '.join(names)} ({hierarchy})"
        )


def check_vcs(tenants: Iterable[Tenant], cell_levels: str, nodes: Iterable[Node], field: str = "cells") -> None:
    """FAILED_PRECONDITION, naming the level that does not fit, unless the tenants' VCs together fit the nodes
    (HiveD's feasibility); nothing to check while the nodes make no whole hierarchy. The tenants' level names
    must have passed `check_levels`."""
    hierarchy = hierarchy_over(cell_levels, nodes)
    if hierarchy is None:
        return
    vcs = {t.name: {hierarchy.level(level): count for level, count in t.cells.items()} for t in tenants}
    try:
        check_feasible(hierarchy, vcs)
    except ValueError as exc:
        raise FailedPrecondition(f"{field}: {exc} ({_cluster_text(hierarchy)})") from None


def _cluster_text(hierarchy: CellHierarchy) -> str:
    """The nodes the VCs were checked against: `checked against 2 nodes of 2 GPUs` (`in 1 rack cells`)."""
    text = f"checked against {len(hierarchy.node_ids)} nodes of {hierarchy.gpus(hierarchy.node_level)} GPUs"
    if hierarchy.top != hierarchy.node_level:
        text += f" in {hierarchy.top_cells} {hierarchy.level_name(hierarchy.top)} cells"
    return text


def guarantee_lost(
    cell_levels: str, node_gpus: Mapping[str, int], vcs: Mapping[str, Mapping[str, int]], gone: Collection[str]
) -> Infeasible | None:
    """Why the VCs (tenant -> cells by level name) would not fit without the nodes `gone` when they fit the nodes
    (id -> GPUs) with them: the guarantee HiveD keeps now and would lose. None when they fit without those nodes too,
    or did not fit with them either (a node's going then breaks nothing that held: the start warned of it, or the
    nodes still register). The VCs' level names must have passed `check_levels`."""
    if not vcs or _shortfall(cell_levels, node_gpus, vcs) is not None:
        return None
    return _shortfall(cell_levels, {node: gpus for node, gpus in node_gpus.items() if node not in gone}, vcs)


def _shortfall(
    cell_levels: str, node_gpus: Mapping[str, int], vcs: Mapping[str, Mapping[str, int]]
) -> Infeasible | None:
    """Why the VCs do not fit the whole cells the nodes make, None if they do. Unlike `check_vcs`, which waits for
    the nodes to fill whole top-level cells, this counts the cells as the policy builds them whatever the nodes
    (`cell_hierarchy`: those that do not fill the last top cell padded with absent nodes), the GPUs a node lacks
    (its last ones, as the policy excludes them) and an absent node's left out, splitting the cells above them."""
    offering = tuple(sorted((node, gpus) for node, gpus in node_gpus.items() if gpus > 0))
    hierarchy = cell_hierarchy(cell_levels, offering)
    free = FreeLists.physical(hierarchy)
    present = dict(offering)
    for node_id in hierarchy.node_ids:
        for gpu in hierarchy.node_gpus(node_id)[present.get(node_id, 0) :]:  # an absent node has none
            free.take(gpu)
    numbered = {tenant: {hierarchy.level(level): count for level, count in vc.items()} for tenant, vc in vcs.items()}
    return infeasibility(hierarchy, numbered, free.counts())
