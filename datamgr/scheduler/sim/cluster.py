"""Cluster files: the simulated cluster as a TOML file of four required keys and two optional ones.

```toml
nodes = 2                 # identical machines
gpus_per_node = 4
cache_per_node = "1TB"    # local cache each node contributes (a size: "1TB", "500GiB", bytes)
remote_io = "200MB/s"     # the egress limit all jobs share (a rate: "200MB/s", "1Gbps", bytes/s)
cpus_per_node = 32        # optional: CPUs and RAM per node, for traces whose jobs ask for them (FitGpp's)
ram_per_node = "256GB"
cell_levels = "gpu:1,pcie:2,socket:2,node:2,rack:4"  # optional: the GPUs' affinity hierarchy (HiveD's cells)
tenants = "vcs.toml"      # optional: the tenants' VCs, a file next to this one or [tenants.NAME] tables
```

The four are required and no other key is accepted, so a typo cannot silently leave a default in place.
CPUs and RAM go together: a cluster without them runs only jobs that ask for neither. `sim/tenants.py`
describes the cell levels and the tenants' tables. At most `model.MAX_NODES` nodes and `model.MAX_GPUS` GPUs in
all: a run's cost grows with them whatever the trace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.fields import SimInputError, check_keys, read_field
from datamgr.scheduler.sim.model import MAX_GPUS, MAX_NODES, ClusterSpec
from datamgr.scheduler.sim.tenants import check_tenants, default_levels, hierarchy_for, load_tenants, tenants_from_table
from datamgr.scheduler.tenancy import TenantShare
from silodlib.units import MAX_VALUE

KEYS = ("nodes", "gpus_per_node", "cache_per_node", "remote_io")
HOST_KEYS = ("cpus_per_node", "ram_per_node")
SHARING_KEYS = ("cell_levels", "tenants")
_WHY_BOUNDED = "a run's cost grows with the cluster's size, whatever the trace"
_NODES = fields.at_most(fields.positive_int, MAX_NODES, f"{MAX_NODES:,}: {_WHY_BOUNDED}")
_GPUS_PER_NODE = fields.at_most(fields.positive_int, MAX_GPUS, f"{MAX_GPUS:,}, the most GPUs the simulator takes")


def cluster_from_table(table: Mapping[str, object], where: str, directory: Path) -> ClusterSpec:
    """The cluster a TOML table describes; `where` (the file, or the file and section) prefixes errors, and
    a tenants file is read from `directory`."""
    check_keys(table, (*KEYS, *HOST_KEYS, *SHARING_KEYS), KEYS, where)
    host = [key for key in HOST_KEYS if key in table]
    if len(host) == 1:
        other = HOST_KEYS[1 - HOST_KEYS.index(host[0])]
        raise SimInputError(f"{where}: {host[0]} is given without {other}; give both or neither")
    nodes = read_field(_NODES, table["nodes"], f"{where}: nodes")
    gpus_per_node = read_field(_GPUS_PER_NODE, table["gpus_per_node"], f"{where}: gpus_per_node")
    if nodes * gpus_per_node > MAX_GPUS:
        raise SimInputError(
            f"{where}: nodes x gpus_per_node: {nodes:,} x {gpus_per_node:,} GPUs must be at most {MAX_GPUS:,} GPUs in "
            f"all: {_WHY_BOUNDED}"
        )
    spec = ClusterSpec(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cache_bytes_per_node=read_field(fields.size, table["cache_per_node"], f"{where}: cache_per_node"),
        remote_io_bytes_per_sec=read_field(fields.positive(fields.rate), table["remote_io"], f"{where}: remote_io"),
        cpus_per_node=read_field(fields.positive_number, table["cpus_per_node"], f"{where}: cpus_per_node")
        if host
        else 0.0,
        ram_bytes_per_node=read_field(fields.positive(fields.size), table["ram_per_node"], f"{where}: ram_per_node")
        if host
        else 0,
        cell_levels=_cell_levels(table, where),
    )
    if "tenants" not in table and not spec.cell_levels:
        return spec
    raw = table.get("tenants", {})
    tenants = load_tenants(directory / raw) if isinstance(raw, str) else tenants_from_table(raw, f"{where}: tenants")
    return with_tenants(spec, tenants, where)


def _cell_levels(table: Mapping[str, object], where: str) -> str:
    return read_field(fields.text, table["cell_levels"], f"{where}: cell_levels") if "cell_levels" in table else ""


def with_tenants(cluster: ClusterSpec, tenants: Mapping[str, TenantShare], where: str) -> ClusterSpec:
    """The cluster shared by `tenants`, once their VCs are known to fit it (SimInputError naming what does
    not, prefixed by `where`)."""
    levels = cluster.cell_levels or default_levels(cluster.gpus_per_node)
    try:
        hierarchy = hierarchy_for(levels, sorted(cluster.node_states()))
    except ValueError as exc:
        raise SimInputError(f"{where}: cell_levels: {exc}") from None
    node_gpus = hierarchy.gpus(hierarchy.node_level)
    if node_gpus != cluster.gpus_per_node:
        raise SimInputError(
            f"{where}: cell_levels: a node cell holds {node_gpus} GPUs, but gpus_per_node is {cluster.gpus_per_node}"
        )
    check_tenants(tenants, hierarchy, cluster.total_cache_bytes, cluster.remote_io_bytes_per_sec, where)
    return replace(cluster, tenants=dict(tenants))


def load_cluster(path: Path) -> ClusterSpec:
    """The cluster file at `path`; raises `SimInputError` naming the file, the key and the rule."""
    return cluster_from_table(fields.load_toml(path), str(path), path.parent)


def with_remote_io_scale(cluster: ClusterSpec, scale: float) -> ClusterSpec:
    """The same cluster with its remote IO limit multiplied by `scale`: the what-if knob for faster or slower
    egress (cloud storage bandwidth grows far slower than GPU speed). A scale that takes the limit out of what a
    rate can be (under 1 byte/s, past `MAX_VALUE`), or below what the cluster's tenants reserve, is a SimInputError
    that says so without naming where the scale came from: the caller prefixes its option (`--remote-io-scale`)."""
    if not scale > 0:
        raise SimInputError(f"the remote IO scale must be positive, not {scale!r}")
    base = cluster.remote_io_bytes_per_sec
    limit = base * scale
    shown = f"{limit:,.0f}" if 1 <= limit <= MAX_VALUE else f"{limit:.3g}" if math.isfinite(limit) else "past 1e+308"
    becomes = f"the cluster's remote IO limit of {base:,.0f} bytes/s x {scale:g} is {shown} bytes/s"
    if limit < 1:
        raise SimInputError(f"{becomes}, less than the smallest limit silod takes, 1 byte/s")
    if not limit <= MAX_VALUE:
        raise SimInputError(f"{becomes}, larger than the largest rate silod takes ({MAX_VALUE:,} bytes/s)")
    reserved = sum(share.io_bytes_per_sec for share in cluster.tenants.values())
    if reserved > limit:
        raise SimInputError(f"{becomes}, less than the {reserved:,.0f} bytes/s its tenants reserve")
    return replace(cluster, remote_io_bytes_per_sec=limit)
