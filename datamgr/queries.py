"""What the data manager's read-only calls answer: its state and the nodes' soft state rendered as messages.

Kept apart from `manager` (which changes state) and from `convert` (which maps one entity to one message):
each function here gathers what a message needs from the state and from liveness, then renders it.
"""

from __future__ import annotations

from datamgr import convert, lifecycle, tenants
from datamgr.entities import LOW_PRIORITY, Job
from datamgr.manager import DataManager
from datamgr.scheduler.snapshot import OPPORTUNISTIC
from silodpb.v1 import datamgr_pb2 as pb


def cluster_summary(manager: DataManager) -> pb.ClusterSummary:
    state, nodes = manager.state, manager.state.nodes
    return pb.ClusterSummary(
        revision=state.revision,
        dataset_count=len(state.datasets),
        job_count=len(state.jobs),
        node_count=len(nodes),
        nodes_available=sum(manager.liveness.available(n) for n in nodes),
        remote_io_limit_bytes_per_sec=manager.remote_io_limit or 0,
        remote_io_allocated_bytes_per_sec=state.io_allocated_bytes_per_sec,
        cache_capacity_bytes=sum(n.cache_capacity_bytes for n in nodes.values()),
        cache_allocated_bytes=sum(state.node_cache_allocated(n) for n in nodes),
        cell_levels=manager.cell_levels,
        tenant_count=len(state.tenants),
    )


def dataset_info(manager: DataManager, uri: str) -> pb.Dataset:
    dataset = manager.dataset("uri", uri)
    return convert.dataset_message(
        dataset, manager.state.jobs_of_dataset(dataset.uri), manager.liveness.dataset_usage(dataset.uri)
    )


def job_info(manager: DataManager, job_id: str) -> pb.Job:
    job = manager.job(job_id)
    schedule = convert.job_schedule(job, manager.history(job_id), manager.wall_clock())
    return convert.job_message(job, manager.liveness.job_usage(job_id), schedule, manager.bytes_read(job_id))


def node_info(manager: DataManager, node_id: str) -> pb.Node:
    node = manager.node("node_id", node_id)
    return convert.node_message(
        node,
        cache_allocated=manager.state.node_cache_allocated(node_id),
        available=manager.liveness.available(node_id),
        seconds_since_seen=manager.liveness.seconds_since_seen(node_id),
        job_ids=manager.state.jobs_on_node(node_id),
        start_grace=manager.liveness.in_start_grace(node_id),
        agent=manager.node_agents.holder(node_id),
    )


def list_datasets(manager: DataManager) -> list[pb.Dataset]:
    return [dataset_info(manager, uri) for uri in sorted(manager.state.datasets)]


def list_jobs(manager: DataManager) -> list[pb.Job]:
    return [job_info(manager, job_id) for job_id in sorted(manager.state.jobs)]


def list_nodes(manager: DataManager) -> list[pb.Node]:
    return [node_info(manager, node_id) for node_id in sorted(manager.state.nodes)]


def list_tenants(manager: DataManager) -> list[pb.Tenant]:
    by_tenant: dict[str, list[str]] = {}
    for job_id, job in sorted(manager.state.jobs.items()):  # one pass, however many tenants
        if job.tenant:
            by_tenant.setdefault(job.tenant, []).append(job_id)
    return [_tenant_message(manager, name, by_tenant.get(name, [])) for name in sorted(manager.state.tenants)]


def tenant_info(manager: DataManager, name: str) -> pb.Tenant:
    return _tenant_message(manager, manager.tenant("name", name).name, manager.state.jobs_of_tenant(name))


def _tenant_message(manager: DataManager, name: str, job_ids: list[str]) -> pb.Tenant:
    """The tenant's VC with what its jobs (`job_ids`) use now: GPUs of its running regular and low-priority jobs,
    and its jobs waiting for the policy to place them."""
    tenant = manager.state.tenants[name]
    gpus_per_cell = tenants.cell_gpus(manager.cell_levels, manager.state.nodes.values())
    message = convert.tenant_message(tenant, tenants.vc_gpus(tenant, gpus_per_cell))
    for job_id in job_ids:
        job = manager.state.jobs[job_id]
        message.job_ids.append(job_id)
        held = sum(w.count for w in job.workers)
        if held and _preemptible(manager, job):
            message.low_priority_gpus += held
        elif held:
            message.regular_gpus += held
        elif job.placed_by_policy and lifecycle.phase(job, manager.history(job_id)) != lifecycle.Phase.SUSPENDING:
            message.jobs_queued += 1
    return message


def _preemptible(manager: DataManager, job: Job) -> bool:
    """Whether a running job runs preemptibly: registered low priority, or a regular job that the policy runs as
    a low-priority one because its tenant's VC is full (HiveD's overflow marks it in its policy state)."""
    state = lifecycle.policy_state_of(manager.history(job.job_id), manager.policy or "")
    return job.priority == LOW_PRIORITY or state.get(OPPORTUNISTIC) == 1.0
