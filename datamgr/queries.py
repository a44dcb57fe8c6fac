"""What the data manager's read-only calls answer: its state and the nodes' soft state rendered as messages.

Kept apart from `manager` (which changes state) and from `convert` (which maps one entity to one message):
each function here gathers what a message needs from the state and from liveness, then renders it.
"""

from __future__ import annotations

from datamgr import convert
from datamgr.manager import DataManager
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
    )


def dataset_info(manager: DataManager, uri: str) -> pb.Dataset:
    dataset = manager.dataset("uri", uri)
    return convert.dataset_message(
        dataset, manager.state.jobs_of_dataset(dataset.uri), manager.liveness.dataset_usage(dataset.uri)
    )


def job_info(manager: DataManager, job_id: str) -> pb.Job:
    job = manager.job(job_id)
    schedule = convert.job_schedule(job, manager.history(job_id), manager.wall_clock())
    return convert.job_message(job, manager.liveness.job_usage(job_id), schedule)


def node_info(manager: DataManager, node_id: str) -> pb.Node:
    node = manager.node("node_id", node_id)
    return convert.node_message(
        node,
        cache_allocated=manager.state.node_cache_allocated(node_id),
        available=manager.liveness.available(node_id),
        seconds_since_seen=manager.liveness.seconds_since_seen(node_id),
        job_ids=manager.state.jobs_on_node(node_id),
    )


def list_datasets(manager: DataManager) -> list[pb.Dataset]:
    return [dataset_info(manager, uri) for uri in sorted(manager.state.datasets)]


def list_jobs(manager: DataManager) -> list[pb.Job]:
    return [job_info(manager, job_id) for job_id in sorted(manager.state.jobs)]


def list_nodes(manager: DataManager) -> list[pb.Node]:
    return [node_info(manager, node_id) for node_id in sorted(manager.state.nodes)]
