"""Registered entities by the name a request gives, or NOT_FOUND naming the request field that asked.

The request field in every message (`workers[2].node_id: node 'n9' is not registered`) is what lets an operator
find the wrong value in a call with many.
"""

from __future__ import annotations

from datamgr.entities import Dataset, Job, Node, NotFound, Tenant
from datamgr.state import ClusterState
from datamgr.validation import check_dataset_uri, check_id


def dataset(state: ClusterState, field: str, uri: str) -> Dataset:
    canonical = check_dataset_uri(field, uri)
    if canonical not in state.datasets:
        raise NotFound(f"{field}: dataset {canonical} is not registered")
    return state.datasets[canonical]


def job(state: ClusterState, job_id: str) -> Job:
    check_id("job_id", job_id)
    if job_id not in state.jobs:
        raise NotFound(f"job_id: job {job_id!r} is not registered")
    return state.jobs[job_id]


def tenant(state: ClusterState, field: str, name: str) -> Tenant:
    check_id(field, name)
    if name not in state.tenants:
        raise NotFound(f"{field}: tenant {name!r} is not registered (silod tenant add {name} ...)")
    return state.tenants[name]


def node(state: ClusterState, field: str, node_id: str) -> Node:
    check_id(field, node_id)
    if node_id not in state.nodes:
        raise NotFound(f"{field}: node {node_id!r} is not registered")
    return state.nodes[node_id]
