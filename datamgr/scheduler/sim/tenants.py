"""Tenants and their virtual clusters (HiveD's VCs, with SiloD's storage beside them), from TOML.

A cluster file (or a scenario's `[cluster]`) may describe how it is shared, as tables or as a file of them
next to it (`tenants = "vcs.toml"`; `silod sim --tenants FILE` replaces them for a run):

```toml
cell_levels = "gpu:1,pcie:2,socket:2,node:2,rack:4"   # bottom up, NAME:BUDDIES; the node level's GPUs = gpus_per_node

[tenants.prod-a]
cells = { node = 4 }      # cells of each level the tenant's VC reserves
cache = "2TB"             # optional: cache bytes reserved for its jobs (default 0)
remote_io = "400MB/s"     # optional: remote IO reserved for its jobs (default 0)
scheduler = "tiresias"    # optional: what orders its jobs inside its VC, fifo (default) or tiresias
```

Without `cell_levels` a node is one cell of `gpus_per_node` GPUs ("gpu:1,node:G"). The VCs must fit the
cluster (HiveD's feasibility, Eq. 2 with nothing allocated), and their cache and remote IO the cluster's; an
error names the tenant, the key or the level that does not fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from datamgr.scheduler.cells import CellHierarchy, parse_levels
from datamgr.scheduler.hived import check_feasible
from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.fields import SimInputError, check_keys, read_field
from datamgr.scheduler.tenancy import TENANT_SCHEDULERS, TenantShare

TENANT_KEYS = ("cells", "cache", "remote_io", "scheduler")


def default_levels(gpus_per_node: int) -> str:
    """A node as one cell of its GPUs: what a cluster that names no hierarchy has."""
    return f"gpu:1,node:{gpus_per_node}"


def hierarchy_for(cell_levels: str, node_ids: list[str]) -> CellHierarchy:
    """The cell hierarchy `cell_levels` describes over these nodes (whole top cells of them, in this order)."""
    return CellHierarchy.over_nodes(parse_levels(cell_levels), node_ids)


def tenants_from_table(table: object, where: str) -> dict[str, TenantShare]:
    """`{name: {cells = {...}, cache = ..., remote_io = ...}}` as tenant shares; errors name the tenant and key."""
    if not isinstance(table, dict):
        raise SimInputError(f"{where}: expected a table of tenants")
    tenants: dict[str, TenantShare] = {}
    for name, entry in table.items():
        here = f"{where}: tenant {name!r}"
        if not isinstance(entry, dict):
            raise SimInputError(f"{here}: expected a table with {', '.join(TENANT_KEYS)}")
        check_keys(entry, TENANT_KEYS, ("cells",), here)
        cells = entry["cells"]
        if not isinstance(cells, dict) or not cells:
            raise SimInputError(f"{here}: cells: expected a table of level name to number of cells: {{ node = 4 }}")
        counts = {level: read_field(fields.whole_number, n, f"{here}: cells: {level}") for level, n in cells.items()}
        scheduler = str(entry.get("scheduler", "fifo"))
        if scheduler not in TENANT_SCHEDULERS:
            raise SimInputError(f"{here}: scheduler: {scheduler!r} is not one of {', '.join(TENANT_SCHEDULERS)}")
        tenants[name] = TenantShare(
            scheduler=scheduler,
            cells=counts,
            cache_bytes=read_field(fields.size, entry.get("cache", 0), f"{here}: cache"),
            io_bytes_per_sec=float(read_field(fields.rate, entry.get("remote_io", 0), f"{here}: remote_io")),
        )
    return tenants


def load_tenants(path: Path) -> dict[str, TenantShare]:
    """A VC file: `[NAME]` tables of `cells`, `cache` and `remote_io`."""
    return tenants_from_table(fields.load_toml(path), str(path))


def check_tenants(
    tenants: Mapping[str, TenantShare],
    hierarchy: CellHierarchy,
    cache_bytes: int,
    io_bytes_per_sec: float,
    where: str,
) -> None:
    """SimInputError unless every VC names levels of `hierarchy`, the VCs fit it, and their storage fits the
    cluster's cache and remote IO."""
    vcs: dict[str, dict[int, int]] = {}
    for name, share in tenants.items():
        try:
            vcs[name] = {hierarchy.level(level): count for level, count in share.cells.items()}
        except ValueError as exc:
            raise SimInputError(f"{where}: tenant {name!r}: cells: {exc}") from None
    try:
        check_feasible(hierarchy, vcs)
    except ValueError as exc:
        raise SimInputError(f"{where}: {exc}") from None
    for noun, reserved, total in (
        ("cache", sum(share.cache_bytes for share in tenants.values()), cache_bytes),
        ("remote IO", sum(share.io_bytes_per_sec for share in tenants.values()), io_bytes_per_sec),
    ):
        if reserved > total:
            raise SimInputError(f"{where}: the tenants reserve {reserved:,.0f} of {noun}; the cluster has {total:,.0f}")
