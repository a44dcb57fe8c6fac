"""Prometheus metrics of the data manager: RPCs by method and status code, and the cluster state.

State is read when scraped, so nothing is bookkept on the request path beyond the RPC counters; the scrape
runs on the HTTP server's thread and only reads.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from datamgr.manager import DataManager
from silodlib.metrics_endpoint import MetricsEndpoint

_Handler = Any  # grpc.RpcMethodHandler, generic in the stubs only


class DataManagerMetrics(MetricsEndpoint):
    """The registry of one data manager, its RPC interceptor, and its HTTP endpoint."""

    def __init__(self, manager: DataManager) -> None:
        super().__init__()
        self.requests = Counter(
            "silod_rpc_requests", "RPCs handled, by method and status code", ["method", "code"], registry=self.registry
        )
        self.latency = Histogram(
            "silod_rpc_duration_seconds",
            "Time to answer a unary RPC, by method",
            ["method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(manager))
        self.interceptor = _RpcMetrics(self)


def _code_name(context: grpc.aio.ServicerContext[Any, Any], unset: str) -> str:
    """The status the call ended with; `unset` where the handler set none (it returned, raised, or was cancelled)."""
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else unset


class _RpcMetrics(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic in the stubs only
    """Counts every call by method and final status code; times unary calls (streams live for hours)."""

    def __init__(self, metrics: DataManagerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        requests, latency = self._metrics.requests, self._metrics.latency
        if handler.unary_unary is not None:
            behavior = handler.unary_unary

            async def unary(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> object:
                started, outcome = time.perf_counter(), "UNKNOWN"
                try:
                    response = await behavior(request, context)
                    outcome = "OK"
                    return response
                finally:
                    latency.labels(method).observe(time.perf_counter() - started)
                    requests.labels(method, _code_name(context, outcome)).inc()

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            stream_behavior = handler.unary_stream

            async def stream(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[object]:
                outcome = "UNKNOWN"
                try:
                    messages = stream_behavior(request, context)
                    if inspect.isawaitable(messages):  # a coroutine that writes with `context.write`, or refuses
                        await messages
                    else:
                        async for message in messages:
                            yield message
                    outcome = "OK"
                except (asyncio.CancelledError, GeneratorExit):
                    outcome = "CANCELLED"  # the client went away (an agent stopping): no error of the server's
                    raise
                finally:
                    requests.labels(method, _code_name(context, outcome)).inc()

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


class _StateCollector(Collector):
    """The allocation state as gauges, read at scrape time."""

    def __init__(self, manager: DataManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        manager, state = self._manager, self._manager.state
        nodes = list(state.nodes)
        datasets = list(state.datasets.values())
        jobs = list(state.jobs.values())
        yield GaugeMetricFamily("silod_revision", "Revision of the allocation state", value=state.revision)
        yield GaugeMetricFamily("silod_nodes", "Registered nodes", value=len(nodes))
        available = sum(manager.liveness.available(n) for n in nodes)
        yield GaugeMetricFamily("silod_nodes_available", "Nodes reporting within --node-timeout", value=available)
        yield GaugeMetricFamily(
            "silod_watch_streams",
            "Open allocation watch streams",
            value=sum(manager.hub.watcher_count(n) for n in nodes),
        )
        yield GaugeMetricFamily(
            "silod_remote_io_limit_bytes_per_second", "--remote-io-limit (0: none)", value=manager.remote_io_limit or 0
        )
        yield GaugeMetricFamily(
            "silod_remote_io_allocated_bytes_per_second",
            "Sum of the jobs' remote IO allocations",
            value=state.io_allocated_bytes_per_sec,
        )
        quota = GaugeMetricFamily(
            "silod_dataset_cache_quota_bytes", "A dataset's cache quota per node", labels=["dataset"]
        )
        size = GaugeMetricFamily("silod_dataset_size_bytes", "A dataset's size", labels=["dataset"])
        for dataset in datasets:
            quota.add_metric([dataset.uri], dataset.cache_quota_bytes)
            size.add_metric([dataset.uri], dataset.size_bytes)
        # Not `silod_job_remote_io_bytes_per_second`, the node's series of each node's share of it: a sum by job over
        # both daemons' series counted every job twice. Labelled `job_id`, as the node's are: Prometheus keeps `job`
        # for the scrape job's name.
        rate = GaugeMetricFamily(
            "silod_job_remote_io_allocated_bytes_per_second",
            "A job's remote IO allocation, over all its nodes",
            labels=["job_id"],
        )
        for job in jobs:
            rate.add_metric([job.job_id], job.io_bytes_per_sec)
        yield from (quota, size, rate)
