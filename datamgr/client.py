"""A blocking client of the data manager for the CLI, scripts and tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from datamgr.defaults import DATAMGR_ENV, DEFAULT_DATAMGR
from silodlib.credentials import ChannelSecurity
from silodlib.grpc_channel import explain_message_size, explain_refusal, open_channel
from silodpb.v1 import datamgr_pb2 as pb
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc

DEFAULT_TIMEOUT = 30.0
# The page size `list_jobs` asks for: the data manager answers its largest pages to any larger one (AIP-158).
LARGEST_PAGE = 2**31 - 1

_Response = TypeVar("_Response")


class ClientError(Exception):
    """A call the data manager rejected, or could not be reached for; the message is for operators."""

    def __init__(self, message: str, code: grpc.StatusCode, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.unreachable = unreachable


def default_address() -> str:
    return os.environ.get(DATAMGR_ENV) or DEFAULT_DATAMGR


class DataManagerClient:
    """One channel to the data manager; every call raises `ClientError` instead of `grpc.RpcError`.

    With `tls_ca` (or a client certificate) the channel is TLS; `tls_cert` and `tls_key` are the client
    certificate a mutual-TLS data manager requires; `token` goes with every call. A bad file raises
    `SecurityConfigError` here, naming it.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        token: str | None = None,
    ) -> None:
        self.address = address
        self._timeout = timeout
        self._security = ChannelSecurity.load(tls_ca, tls_cert, tls_key, token)
        self._channel = open_channel(address, self._security)
        self.stub = pb_grpc.DataManagerStub(self._channel)

    def __enter__(self) -> DataManagerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def call(self, method: Callable[..., _Response], request: Any) -> _Response:
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise _client_error(exc, self.address, self._security) from None

    def allocate_cache_size(self, dataset_uri: str, size: int) -> pb.AllocateCacheSizeResponse:
        request = pb.AllocateCacheSizeRequest(dataset_uri=dataset_uri, cache_size_bytes=size)
        return self.call(self.stub.AllocateCacheSize, request)

    def allocate_remote_io(self, job_id: str, rate: int) -> pb.AllocateRemoteIOResponse:
        request = pb.AllocateRemoteIORequest(job_id=job_id, io_bytes_per_sec=rate)
        return self.call(self.stub.AllocateRemoteIO, request)

    def register_dataset(
        self, uri: str, options: dict[str, str] | None = None, chunk_size: int = 0
    ) -> pb.RegisterDatasetResponse:
        request = pb.RegisterDatasetRequest(uri=uri, options=options or {}, chunk_size_bytes=chunk_size)
        return self.call(self.stub.RegisterDataset, request)

    def update_dataset_options(
        self, uri: str, options: dict[str, str], removed: list[str] | None = None
    ) -> pb.UpdateDatasetOptionsResponse:
        """Set `options` on a registered dataset and remove the keys `removed`, keeping the others."""
        request = pb.UpdateDatasetOptionsRequest(uri=uri, options=options, remove_options=removed or [])
        return self.call(self.stub.UpdateDatasetOptions, request)

    def register_job(
        self,
        job_id: str,
        dataset_uri: str,
        ideal_rate: int,
        workers: list[tuple[str, int]],
        *,
        epochs: float = 0.0,
        irregular: bool = False,
        gpus: int = 0,
        job_class: pb.JobClass.ValueType = pb.JOB_CLASS_UNSPECIFIED,
        grace_seconds: float = 0.0,
        tenant: str = "",
        priority: pb.JobPriority.ValueType = pb.JOB_PRIORITY_UNSPECIFIED,
    ) -> pb.RegisterJobResponse:
        """`epochs`: how long the job trains, in passes over its dataset (0: unknown); `irregular`: its access
        is not uniform once per epoch; `gpus` (with no `workers`): the policy places it on that many GPUs;
        `job_class` (unspecified: best-effort) and `grace_seconds` (how long it keeps its GPUs once preempted)
        are for policies such as FitGpp, `tenant` (a registered one; "": none) and `priority` (unspecified:
        high) for policies such as HiveD."""
        request = pb.RegisterJobRequest(
            job_id=job_id,
            dataset_uri=dataset_uri,
            ideal_bytes_per_sec=ideal_rate,
            workers=[pb.Worker(node_id=n, count=c) for n, c in workers],
            epochs=epochs,
            irregular=irregular,
            gpus=gpus,
            job_class=job_class,
            grace_seconds=grace_seconds,
            tenant=tenant,
            priority=priority,
        )
        return self.call(self.stub.RegisterJob, request)

    def register_tenant(
        self, name: str, cells: dict[str, int], cache_bytes: int = 0, io_bytes_per_sec: int = 0
    ) -> pb.RegisterTenantResponse:
        """A tenant and its virtual cluster: cells by level name ({"node": 2}), cache and remote IO reserved."""
        request = pb.RegisterTenantRequest(
            name=name, cells=cells, cache_bytes=cache_bytes, io_bytes_per_sec=io_bytes_per_sec
        )
        return self.call(self.stub.RegisterTenant, request)

    def list_jobs(self) -> list[pb.Job]:
        """Every job, in id order, a page at a time: in one answer, the jobs of a large cluster pass the limit on a
        message. A data manager from before pages answers them all on the first page."""
        jobs: list[pb.Job] = []
        token = ""
        while True:
            page = self.call(self.stub.ListJobs, pb.ListJobsRequest(page_size=LARGEST_PAGE, page_token=token))
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    def register_node(self, node_id: str, address: str, capacity: int, gpus: int = 0) -> pb.RegisterNodeResponse:
        request = pb.RegisterNodeRequest(node_id=node_id, address=address, cache_capacity_bytes=capacity, gpus=gpus)
        return self.call(self.stub.RegisterNode, request)

    def unregister_node(self, node_id: str, *, force: bool = False) -> pb.UnregisterNodeResponse:
        """Unregister a node no job uses whose agent is gone. One the tenants' virtual clusters need (they fit the
        nodes with it, not without) is refused (FAILED_PRECONDITION naming them) unless `force`, which removes it
        anyway, their guarantee lost until a node takes its place. One still live is refused whatever `force`
        (FAILED_PRECONDITION): its agent reported within the data manager's --node-timeout (a running agent would
        register the node again), or the data manager started that recently and has not heard from it since."""
        return self.call(self.stub.UnregisterNode, pb.UnregisterNodeRequest(node_id=node_id, force=force))


GRPC_UNKNOWN_METHOD = "Method not found!"  # grpcio's details for a method the server does not serve


def _client_error(exc: grpc.RpcError, address: str, security: ChannelSecurity) -> ClientError:
    code: grpc.StatusCode = exc.code()
    details: str = exc.details() or ""
    refusal = explain_refusal(exc, address, security)
    if refusal is not None:  # a refused token is a rejection (exit 1); a failed handshake, unreachable (exit 3)
        return ClientError(refusal, code, unreachable=code == grpc.StatusCode.UNAVAILABLE)
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        return ClientError(
            f"cannot reach the data manager at {address} (set --datamgr or {DATAMGR_ENV})",
            code,
            unreachable=True,
        )
    if code == grpc.StatusCode.UNAVAILABLE and _unresolvable(details):
        return ClientError(
            f"cannot reach the data manager at {address}: the name does not resolve (set --datamgr HOST:PORT or "
            f"{DATAMGR_ENV})",
            code,
            unreachable=True,
        )
    too_large = explain_message_size(exc)
    if too_large is not None:
        return ClientError(f"a call to the data manager at {address} failed: {too_large}", code)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClientError(f"the data manager at {address} did not answer in time", code)
    if code == grpc.StatusCode.UNIMPLEMENTED and details == GRPC_UNKNOWN_METHOD:
        return ClientError(
            f"the data manager at {address} does not know this command's call: it is older than this silod; upgrade "
            "it, or use a silod of its version",
            code,
        )
    return ClientError(f"{code.name}: {details}", code)


def _unresolvable(details: str) -> bool:
    """gRPC's words for an address whose host name does not resolve (a typo in --datamgr, most often)."""
    lowered = details.lower()
    return lowered.startswith("errors resolving") or "dns resolution failed" in lowered
