"""Model values to wire messages. Query responses redact secret backend options; the watch stream, which
carries what a node needs to read the dataset, does not."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

from datamgr import lifecycle
from datamgr.entities import (
    BEST_EFFORT,
    HIGH_PRIORITY,
    LOW_PRIORITY,
    TRIAL_AND_ERROR,
    Dataset,
    InvalidArgument,
    Job,
    JobHistory,
    Node,
    NodeJobView,
    NodeView,
    Tenant,
)
from datamgr.liveness import DatasetUsage, JobUsage
from datamgr.node_agents import Holder
from datamgr.state import DatasetRemoved, JobRemoved, NodeChange
from silodlib.backends import redact_options
from silodlib.backends.uri import parse_dataset_uri
from silodpb.v1 import datamgr_pb2 as pb

JOB_CLASS_MESSAGES = {BEST_EFFORT: pb.JOB_CLASS_BEST_EFFORT, TRIAL_AND_ERROR: pb.JOB_CLASS_TRIAL_AND_ERROR}
PRIORITY_MESSAGES = {HIGH_PRIORITY: pb.JOB_PRIORITY_HIGH, LOW_PRIORITY: pb.JOB_PRIORITY_LOW}


def job_class(message: pb.JobClass.ValueType) -> str:
    """A request's job class as the data manager keeps it (UNSPECIFIED: best-effort, what older clients mean);
    INVALID_ARGUMENT for a number no class has."""
    return _enum_name(message, JOB_CLASS_MESSAGES, pb.JobClass, BEST_EFFORT, "job_class", "a job class")


def priority(message: pb.JobPriority.ValueType) -> str:
    """A request's priority as the data manager keeps it (UNSPECIFIED: high, what older clients mean);
    INVALID_ARGUMENT for a number no priority has."""
    return _enum_name(message, PRIORITY_MESSAGES, pb.JobPriority, HIGH_PRIORITY, "priority", "a job priority")


def _enum_name(message: int, names: Mapping[str, int], enum: Any, unspecified: str, field: str, noun: str) -> str:
    """The name `names` gives the wire enum value `message`; `unspecified` for 0 (the enum's UNSPECIFIED, which
    older clients send); INVALID_ARGUMENT naming `field` and listing the values it takes for anything else."""
    if message == 0:
        return unspecified
    for name, value in names.items():
        if value == message:
            return name
    known = " or ".join(f"{enum.Name(value)} ({value})" for value in names.values())
    raise InvalidArgument(f"{field} {message} is not {noun}: {known}")


def node_dataset(dataset: Dataset) -> pb.NodeDataset:
    return pb.NodeDataset(
        uri=dataset.uri,
        options=dict(dataset.options),
        cache_quota_bytes=dataset.cache_quota_bytes,
        size_bytes=dataset.size_bytes,
        item_count=dataset.item_count,
        chunk_size_bytes=dataset.chunk_size_bytes,
        manifest_digest=dataset.manifest_digest,
    )


def node_job(view: NodeJobView) -> pb.NodeJob:
    return pb.NodeJob(
        job_id=view.job.job_id,
        dataset_uri=view.job.dataset_uri,
        io_bytes_per_sec=view.io_bytes_per_sec,
        workers=view.workers,
        job_io_bytes_per_sec=view.job.io_bytes_per_sec,
        ideal_bytes_per_sec=view.job.ideal_bytes_per_sec,
        job_workers=sum(w.count for w in view.job.workers),
    )


def _allocation_change(change: NodeChange) -> pb.AllocationChange:
    match change:
        case Dataset():
            return pb.AllocationChange(dataset_set=node_dataset(change))
        case NodeJobView():
            return pb.AllocationChange(job_set=node_job(change))
        case DatasetRemoved(uri=uri):
            return pb.AllocationChange(dataset_removed=uri)
        case JobRemoved(job_id=job_id):
            return pb.AllocationChange(job_removed=job_id)


def watch_event(revision: int, changes: Sequence[NodeChange]) -> pb.WatchEvent:
    return pb.WatchEvent(revision=revision, changes=[_allocation_change(c) for c in changes])


def snapshot_event(revision: int, view: NodeView) -> pb.WatchEvent:
    snapshot = pb.AllocationSnapshot(
        datasets=[node_dataset(d) for d in view.datasets.values()],
        jobs=[node_job(j) for j in view.jobs.values()],
    )
    return pb.WatchEvent(revision=revision, snapshot=snapshot)


def dataset_message(dataset: Dataset, job_ids: Iterable[str], usage: Iterable[DatasetUsage]) -> pb.Dataset:
    scheme = parse_dataset_uri(dataset.uri).scheme
    return pb.Dataset(
        uri=dataset.uri,
        options=redact_options(scheme, dataset.options),
        size_bytes=dataset.size_bytes,
        file_count=dataset.file_count,
        item_count=dataset.item_count,
        chunk_size_bytes=dataset.chunk_size_bytes,
        cache_quota_bytes=dataset.cache_quota_bytes,
        manifest_digest=dataset.manifest_digest,
        job_ids=sorted(job_ids),
        usage=[pb.DatasetUsage(**asdict(u)) for u in usage],
    )


def node_rates(job: Job) -> list[pb.NodeRate]:
    return [pb.NodeRate(node_id=n, io_bytes_per_sec=r) for n, r in job.node_rates().items()]


def job_schedule(job: Job, history: JobHistory, now: float) -> pb.JobSchedule:
    """A job's history as `silod status` shows it, with its attained service and time queued up to `now`."""
    return pb.JobSchedule(
        phase=pb.JobPhase.ValueType(lifecycle.phase(job, history).value),
        submit_time=history.submit_time,
        first_start_time=history.first_start_time or 0.0,
        last_start_time=history.last_start_time or 0.0,
        attained_gpu_seconds=lifecycle.attained_gpu_seconds(job, history, now),
        queued_seconds=lifecycle.queued_seconds(history, now),
        preemptions=history.preemptions,
        policy_state=dict(history.policy_state),
        suspended_until=history.suspended_until or 0.0,
        held=[pb.Worker(node_id=node_id, count=gpus) for node_id, gpus in sorted(history.held.items())],
    )


def job_decision(view: lifecycle.DecisionView, revision: int) -> pb.JobDecision:
    return pb.JobDecision(
        job_id=view.job_id,
        phase=pb.JobPhase.ValueType(view.phase.value),
        placement=[pb.Worker(node_id=node_id, count=gpus) for node_id, gpus in view.placement],
        gpus=view.gpus,
        dataset_uri=view.dataset_uri,
        revision=revision,
        suspended_until=view.suspended_until or 0.0,
    )


def decision_event(
    revision: int, views: Sequence[lifecycle.DecisionView], finished: Sequence[str], snapshot: bool
) -> pb.DecisionEvent:
    return pb.DecisionEvent(
        revision=revision,
        snapshot=snapshot,
        jobs=[job_decision(view, revision) for view in views],
        jobs_finished=list(finished),
    )


def job_message(
    job: Job, usage: Iterable[JobUsage], schedule: pb.JobSchedule | None = None, bytes_read: int | None = None
) -> pb.Job:
    """The job as queries show it; `bytes_read`, what it has read in all its runs (`DataManager.bytes_read`)."""
    return pb.Job(
        job_id=job.job_id,
        dataset_uri=job.dataset_uri,
        ideal_bytes_per_sec=job.ideal_bytes_per_sec,
        workers=[pb.Worker(node_id=w.node_id, count=w.count) for w in job.workers],
        io_bytes_per_sec=job.io_bytes_per_sec,
        node_rates=node_rates(job),
        usage=[pb.JobUsage(**asdict(u)) for u in usage],
        epochs=job.epochs,
        irregular=job.irregular,
        gpus=job.gpus,
        schedule=schedule,
        job_class=JOB_CLASS_MESSAGES[job.job_class],
        grace_seconds=job.grace_seconds,
        tenant=job.tenant,
        priority=PRIORITY_MESSAGES[job.priority],
        bytes_read=bytes_read,
    )


def tenant_message(tenant: Tenant, vc_gpus: int) -> pb.Tenant:
    """A tenant's registration; the query fills in what its jobs use."""
    return pb.Tenant(
        name=tenant.name,
        cells=dict(tenant.cells),
        cache_bytes=tenant.cache_bytes,
        io_bytes_per_sec=tenant.io_bytes_per_sec,
        vc_gpus=vc_gpus,
    )


def node_message(
    node: Node,
    *,
    cache_allocated: int,
    available: bool,
    seconds_since_seen: float,
    job_ids: Iterable[str],
    start_grace: bool,
    agent: Holder | None,
) -> pb.Node:
    message = pb.Node(
        node_id=node.node_id,
        address=node.address,
        cache_capacity_bytes=node.cache_capacity_bytes,
        cache_allocated_bytes=cache_allocated,
        available=available,
        seconds_since_seen=seconds_since_seen,
        start_grace=start_grace,
        job_ids=sorted(job_ids),
        gpus=node.gpus,
    )
    if agent is not None:
        message.agent.CopyFrom(pb.ServingAgent(agent_id=agent.agent_id, peer=agent.peer, since=agent.since))
    return message


def dataset_usage(message: pb.DatasetUsage) -> DatasetUsage:
    """A node's report of a dataset as a plain value."""
    return DatasetUsage(**_reported_fields(DatasetUsage, message))


def job_usage(message: pb.JobUsage) -> JobUsage:
    """A node's report of a job as a plain value."""
    return JobUsage(**_reported_fields(JobUsage, message))


def _reported_fields(value: type[DatasetUsage | JobUsage], message: Any) -> dict[str, Any]:
    """Every field of a usage value as the message carries it, but `node_id`: a node does not name itself in
    its report; the reporting node's id is filled in when the usage is queried (`NodeLiveness`)."""
    return {f.name: getattr(message, f.name) for f in fields(value) if f.name != "node_id"}
