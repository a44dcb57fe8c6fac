"""gRPC transport for the data manager: messages in, manager calls, messages or status codes out."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message

from datamgr import convert, queries
from datamgr.controller import Controller
from datamgr.defaults import EXTERNAL_POLICY
from datamgr.entities import (
    REFUSAL_KEY,
    AlreadyExists,
    DataManagerError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    StateDiskUnreadable,
    StateDiskUnwritable,
    Unavailable,
    Worker,
)
from datamgr.manager import DataManager
from datamgr.watch import WatchClosed, WatchOverflow
from silodlib.grpc_channel import MAX_MESSAGE_BYTES
from silodlib.units import format_size
from silodpb.v1 import datamgr_pb2 as pb
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STATUS_OF: dict[type[DataManagerError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    # Not UNAVAILABLE: that tells clients to retry with backoff, and no retry succeeds until space is freed.
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # gRPC's rule for a call that must not be retried "until the system state has been explicitly fixed".
    StateDiskUnwritable: grpc.StatusCode.FAILED_PRECONDITION,
    StateDiskUnreadable: grpc.StatusCode.FAILED_PRECONDITION,
}
MANIFEST_CHUNK_BYTES = 1024 * 1024
STOPPING = "the data manager is stopping; reconnect once it is back"
# What a client can do about an answer over MAX_MESSAGE_BYTES, for the calls where it can do something.
TOO_LARGE_HINTS = {"ListJobs": "; ask for the jobs a page at a time (page_size)"}

_Request = TypeVar("_Request")
_Response = TypeVar("_Response", bound=Message)
_Handler = Callable[[Any, _Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[_Response]]


# gRPC refuses trailers over 16 KiB and a client shows the message on one line: longer ones are cut.
MAX_ERROR_CHARS = 2000


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: DataManagerError) -> NoReturn:
    message = str(error)
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}... ({len(message) - MAX_ERROR_CHARS:,} more characters)"
    # A node agent tells these refusals from the other FAILED_PRECONDITIONs by their metadata, not their words.
    trailing = ((REFUSAL_KEY, error.refusal),) if error.refusal else ()
    status = next(STATUS_OF[kind] for kind in type(error).__mro__ if kind in STATUS_OF)  # a subclass: its base's
    await context.abort(status, message, trailing_metadata=trailing)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


async def _refuse_if_too_large(
    context: grpc.aio.ServicerContext[Any, Any], message: Message, call: str, what: str
) -> None:
    """End `call` with RESOURCE_EXHAUSTED naming `what` it was to send, its size and the limit, and say so in the log,
    when `message` is over MAX_MESSAGE_BYTES. gRPC would refuse to send it all the same, with only "Sent message
    larger than max" for a reason, under the status code that this data manager's full disk has."""
    size = message.ByteSize()
    if size <= MAX_MESSAGE_BYTES:
        return
    reason = (
        f"{call}: {what} is {size:,} bytes, over the limit of {format_size(MAX_MESSAGE_BYTES)} on one gRPC message "
        f'(docs/datamgr.md, "Message sizes"){TOO_LARGE_HINTS.get(call, "")}'
    )
    log.warning("refused to send it: %s", reason)
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)


def _unary(handler: _Handler[_Request, _Response]) -> _Handler[_Request, _Response]:
    """Turn a rejected call into the status code of its error class, and an answer too large to send into a
    refusal that says so."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: _Request, context: grpc.aio.ServicerContext[Any, Any]) -> _Response:
        try:
            response = await handler(self, request, context)
        except DataManagerError as error:
            await _abort(context, error)
        await _refuse_if_too_large(context, response, handler.__name__, "the answer")
        return response

    return wrapper


class DataManagerServicer(pb_grpc.DataManagerServicer):
    """Service `silod.v1.DataManager` over a `DataManager`, and the `Controller` that runs its policy, if any."""

    def __init__(self, manager: DataManager, controller: Controller | None = None) -> None:
        self._manager = manager
        self._controller = controller

    def _job(self, job_id: str) -> pb.Job:
        """The job as queries show it, with what the policy expected of it in its last round when a policy runs."""
        job = queries.job_info(self._manager, job_id)
        estimate = self._controller.estimate(job_id) if self._controller else None
        if estimate is not None:
            job.estimate.CopyFrom(estimate)
        return job

    @_unary
    async def AllocateCacheSize(
        self, request: pb.AllocateCacheSizeRequest, context: Any
    ) -> pb.AllocateCacheSizeResponse:
        dataset, revision = await self._manager.allocate_cache_size(request.dataset_uri, request.cache_size_bytes)
        return pb.AllocateCacheSizeResponse(
            dataset_uri=dataset.uri, cache_size_bytes=dataset.cache_quota_bytes, revision=revision
        )

    @_unary
    async def AllocateRemoteIO(self, request: pb.AllocateRemoteIORequest, context: Any) -> pb.AllocateRemoteIOResponse:
        job, revision = await self._manager.allocate_remote_io(request.job_id, request.io_bytes_per_sec)
        return pb.AllocateRemoteIOResponse(
            job_id=job.job_id,
            io_bytes_per_sec=job.io_bytes_per_sec,
            node_rates=convert.node_rates(job),
            revision=revision,
        )

    @_unary
    async def RegisterDataset(self, request: pb.RegisterDatasetRequest, context: Any) -> pb.RegisterDatasetResponse:
        dataset, created, revision = await self._manager.register_dataset(
            request.uri, request.options, request.chunk_size_bytes
        )
        return pb.RegisterDatasetResponse(
            dataset=queries.dataset_info(self._manager, dataset.uri), created=created, revision=revision
        )

    @_unary
    async def UnregisterDataset(
        self, request: pb.UnregisterDatasetRequest, context: Any
    ) -> pb.UnregisterDatasetResponse:
        return pb.UnregisterDatasetResponse(revision=await self._manager.unregister_dataset(request.uri))

    @_unary
    async def UpdateDatasetOptions(
        self, request: pb.UpdateDatasetOptionsRequest, context: Any
    ) -> pb.UpdateDatasetOptionsResponse:
        dataset, changed, revision = await self._manager.update_dataset_options(
            request.uri, request.options, request.remove_options
        )
        return pb.UpdateDatasetOptionsResponse(
            dataset=queries.dataset_info(self._manager, dataset.uri), changed=changed, revision=revision
        )

    async def GetManifest(
        self, request: pb.GetManifestRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ManifestChunk]:
        try:
            data, digest = self._manager.manifest(request.dataset_uri)
        except DataManagerError as error:
            await _abort(context, error)
        for offset in range(0, len(data), MANIFEST_CHUNK_BYTES):
            chunk = data[offset : offset + MANIFEST_CHUNK_BYTES]
            yield pb.ManifestChunk(data=chunk, total_bytes=len(data), digest=digest)

    @_unary
    async def RegisterJob(self, request: pb.RegisterJobRequest, context: Any) -> pb.RegisterJobResponse:
        workers = [Worker(w.node_id, w.count) for w in request.workers]
        job, created, revision = await self._manager.register_job(
            request.job_id,
            request.dataset_uri,
            request.ideal_bytes_per_sec,
            workers,
            epochs=request.epochs,
            irregular=request.irregular,
            gpus=request.gpus,
            job_class=convert.job_class(request.job_class),
            grace_seconds=request.grace_seconds,
            tenant=request.tenant,
            priority=convert.priority(request.priority),
        )
        return pb.RegisterJobResponse(job=self._job(job.job_id), created=created, revision=revision)

    @_unary
    async def FinishJob(self, request: pb.FinishJobRequest, context: Any) -> pb.FinishJobResponse:
        return pb.FinishJobResponse(revision=await self._manager.finish_job(request.job_id))

    @_unary
    async def RegisterTenant(self, request: pb.RegisterTenantRequest, context: Any) -> pb.RegisterTenantResponse:
        tenant, created, revision = await self._manager.register_tenant(
            request.name, request.cells, request.cache_bytes, request.io_bytes_per_sec
        )
        return pb.RegisterTenantResponse(
            tenant=queries.tenant_info(self._manager, tenant.name), created=created, revision=revision
        )

    @_unary
    async def UnregisterTenant(self, request: pb.UnregisterTenantRequest, context: Any) -> pb.UnregisterTenantResponse:
        return pb.UnregisterTenantResponse(revision=await self._manager.unregister_tenant(request.name))

    @_unary
    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Any) -> pb.RegisterNodeResponse:
        node, created, revision = await self._manager.register_node(
            request.node_id,
            request.address,
            request.cache_capacity_bytes,
            request.gpus,
            request.agent_id,
            context.peer(),
        )
        return pb.RegisterNodeResponse(
            node=queries.node_info(self._manager, node.node_id), created=created, revision=revision
        )

    @_unary
    async def UnregisterNode(self, request: pb.UnregisterNodeRequest, context: Any) -> pb.UnregisterNodeResponse:
        revision = await self._manager.unregister_node(request.node_id, force=request.force)
        return pb.UnregisterNodeResponse(revision=revision)

    async def WatchAllocations(
        self, request: pb.WatchAllocationsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.WatchEvent]:
        try:
            events = self._manager.watch(
                request.node_id, request.since_revision, request.history, request.agent_id, context.peer()
            )
            async for event in events:
                kind = "snapshot" if event.HasField("snapshot") else "changes"
                what = f"the {kind} of revision {event.revision} for node {request.node_id}"
                await _refuse_if_too_large(context, event, "WatchAllocations", what)
                yield event
        except DataManagerError as error:
            await _abort(context, error)
        except WatchOverflow:
            await context.abort(
                grpc.StatusCode.ABORTED, "watch stream fell behind; reconnect with the last applied revision"
            )
        except WatchClosed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)

    async def WatchDecisions(
        self, request: pb.WatchDecisionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.DecisionEvent]:
        try:
            async for event in self._manager.watch_decisions():
                kind = "snapshot" if event.snapshot else "changes"
                await _refuse_if_too_large(context, event, "WatchDecisions", f"the {kind} of revision {event.revision}")
                yield event
        except DataManagerError as error:
            await _abort(context, error)
        except WatchOverflow:
            await context.abort(grpc.StatusCode.ABORTED, "decision stream fell behind; reconnect for a fresh snapshot")
        except WatchClosed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)

    @_unary
    async def ReportUsage(self, request: pb.ReportUsageRequest, context: Any) -> pb.ReportUsageResponse:
        datasets = [convert.dataset_usage(usage) for usage in request.datasets]
        jobs = [convert.job_usage(usage) for usage in request.jobs]
        self._manager.report_usage(request.node_id, datasets, jobs, request.agent_id, context.peer())
        return pb.ReportUsageResponse()

    @_unary
    async def GetClusterSummary(self, request: pb.GetClusterSummaryRequest, context: Any) -> pb.ClusterSummary:
        summary = queries.cluster_summary(self._manager)
        if self._controller is None:
            summary.controller.policy = EXTERNAL_POLICY
        else:
            summary.controller.CopyFrom(self._controller.status())
        return summary

    @_unary
    async def GetDataset(self, request: pb.GetDatasetRequest, context: Any) -> pb.Dataset:
        return queries.dataset_info(self._manager, request.uri)

    @_unary
    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return self._job(request.job_id)

    @_unary
    async def GetNode(self, request: pb.GetNodeRequest, context: Any) -> pb.Node:
        return queries.node_info(self._manager, request.node_id)

    @_unary
    async def ListDatasets(self, request: pb.ListDatasetsRequest, context: Any) -> pb.ListDatasetsResponse:
        return pb.ListDatasetsResponse(datasets=queries.list_datasets(self._manager))

    @_unary
    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        wanted = queries.page(request.page_size, request.page_token)
        jobs, next_token = queries.page_of(sorted(self._manager.state.jobs), wanted, self._job)
        return pb.ListJobsResponse(jobs=jobs, next_page_token=next_token)

    @_unary
    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=queries.list_nodes(self._manager))

    @_unary
    async def ListTenants(self, request: pb.ListTenantsRequest, context: Any) -> pb.ListTenantsResponse:
        return pb.ListTenantsResponse(tenants=queries.list_tenants(self._manager))
