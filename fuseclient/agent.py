"""The node agent: keeps this node's mount in step with the data manager's allocations.

It registers the node (trying once before it mounts, so that a refusal stops it with the reason before
anything is served), follows its allocation watch stream and applies each revision to the live mount: a job
with workers here appears as `MOUNTPOINT/JOB_ID/`, a finished job's directory disappears (files it has open
keep working), quota and rate changes apply as they arrive. When the data manager is unreachable the
mount keeps enforcing the last allocations it received, and the agent reconnects with backoff, resuming from
the last revision it applied, named with the history the data manager's stream gave it: a data manager whose state
was restored from an older copy answers a revision of another history with a fresh snapshot. Usage is reported
every few seconds.

Each agent process sends a random agent id with its calls: while its watch stream is open the data manager counts
it as the node's agent and refuses another agent with the same --node-id (`datamgr.node_agents`). Refused at its
start, an agent stops, as for its other refusals; refused later (it lost its stream, and another agent took the
node meanwhile), it says so and keeps trying, to take the node back once the other agent's stream ends.

The gRPC client is the blocking one, in a worker thread: the mount runs on trio, which cannot share an event
loop with grpc's asyncio API. The thread fetches manifests and hands each revision to the trio loop, which
alone mutates the mount state. A revision never waits for a dataset's backend to open: the opens run in the
background (`NodeDatasets.run_opens`), so that one that hangs (a credential process waiting for a login) holds only
its own dataset's jobs, and the revisions after it and the usage reports go on.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import shutil
import socket
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import trio

from fuseclient.assembly import MountError, add_job, make_cache_dir_private
from fuseclient.daemon import ReadyCallback
from fuseclient.fs import forget_job_directory
from fuseclient.mounted import MountState
from fuseclient.node_datasets import NodeDatasets
from fuseclient.read_buffers import DEFAULT_READ_BUFFER_BYTES
from fuseclient.readahead import DEFAULT_READ_AHEAD
from fuseclient.runtime import METRICS_HOST, run_filesystem
from fuseclient.throttle import default_burst
from silodlib.backoff import EQUAL_JITTER, Backoff
from silodlib.credentials import ChannelSecurity
from silodlib.grpc_channel import explain_refusal, open_channel
from silodlib.logfields import log_ids, set_process_ids
from silodlib.manifest import Manifest
from silodlib.metrics_endpoint import MetricsPortError, refuse_busy_port
from silodlib.sharding import pass_share
from silodpb.v1 import datamgr_pb2 as pb
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CALL_TIMEOUT = 10.0
RECONNECT = Backoff(base_delay=0.2, max_delay=10.0, floor=EQUAL_JITTER)  # waits before registering or watching again
# A ping every 20 s, 10 s for its answer (`grpc.http2.ping_timeout_ms` too: grpcio otherwise waits 60 s for it).
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),
]
# The trailing metadata by which the data manager tags refusals that waiting would not change (its
# `DataManagerError.refusal`, documented in the proto at RegisterNodeRequest): another agent serves the node, or the
# node has more GPUs than a node cell holds.
REFUSAL_KEY = "silod-refusal"
SERVED_ELSEWHERE = "node-served-by-another-agent"


class AgentError(RuntimeError):
    """The agent cannot run as configured (e.g. the node is registered with other parameters)."""


class ManifestMismatch(Exception):
    """A fetched manifest does not hash to the digest the allocation names; fetched again on reconnect."""


def refusal_of(exc: grpc.RpcError) -> str:
    """The tag of a refusal the data manager tagged (REFUSAL_KEY); "" for any other error."""
    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return ""
    for item in exc.trailing_metadata() or ():
        if item.key == REFUSAL_KEY:
            value: str | bytes = item.value  # gRPC hands text metadata as str, though grpc-stubs types it bytes
            return value.decode() if isinstance(value, bytes) else value
    return ""


def served_elsewhere(exc: grpc.RpcError) -> bool:
    """Whether the data manager refused a call because another agent serves this node (the same --node-id)."""
    return refusal_of(exc) == SERVED_ELSEWHERE


@dataclass(frozen=True)
class AgentConfig:
    datamgr: str
    node_id: str
    mountpoint: Path
    cache_dir: Path
    cache_capacity: int | None = None  # None: the free space of the cache dir at first registration
    gpus: int = 0  # GPUs the data manager's policy may place jobs on (0: none)
    address: str = ""  # informational; default: this host's name
    report_interval: float = 5.0
    allow_other: bool = False
    read_ahead: int = DEFAULT_READ_AHEAD
    read_buffer: int = DEFAULT_READ_BUFFER_BYTES  # the node's budget for open files' bytes (`ReadBuffers`)
    stats_interval: float | None = None
    metrics_port: int | None = None
    security: ChannelSecurity = field(default_factory=ChannelSecurity)  # TLS and token; plaintext by default


class NodeAgent:
    """Follows the allocation stream into a `MountState`, and reports the mount's usage back."""

    def __init__(self, config: AgentConfig, mount: MountState, stub: pb_grpc.DataManagerStub) -> None:
        self._config = config
        self._mount = mount
        self._stub = stub
        self.agent_id = uuid.uuid4().hex  # this process, to the data manager: another with our node id is refused
        # By digest: filled by the watch thread before it hands an event over, pruned by `_apply` while the thread waits
        # for it, so that the two never touch it at once.
        self._manifests: dict[str, Manifest] = {}
        self._stop = threading.Event()
        self._call: grpc.CallIterator[pb.WatchEvent] | None = None
        self.revision = 0
        self.history = 0  # the history `revision` belongs to, as the stream that sent it named it (0: none named)
        self.reconnects = 0  # times the watch stream came back after an outage
        self._reached = False  # a call has succeeded: the address and security settings are right
        self._registered = False  # this run has registered the node (again after the data manager lost it)
        self._waiting = False  # "waiting for the data manager" is logged, not yet answered by a registration
        # Jobs whose dataset this node does not serve yet (its backend opening, or options it refused, a profile its
        # host lacks), as last sent: added once the dataset opens (`silod dataset set-options` fixing its options),
        # dropped when removed.
        self._unserved_jobs: dict[str, pb.NodeJob] = {}
        # Held while a revision applies, while the datasets that would not open are tried again and while an open that
        # ended is applied, so that none of them opens a dataset's cache directory beside another.
        self._changing = trio.Lock()
        self._datasets = NodeDatasets(
            mount,
            config.cache_dir,
            config.node_id,
            config.report_interval,
            self._dataset_opened,
            failed=self._dataset_failed,
            changing=self._changing,
        )
        self._watch_refused = False  # "another agent serves this node" is logged for the watch, not yet lifted
        self._report_refused = False  # and for the usage reports

    # ---- trio side ----

    async def register_before_mounting(self) -> None:
        """Try once to register the node, before anything is mounted.

        A refusal (the node registered with other parameters, a bad id, a token the data manager does not
        take) raises AgentError here, so the agent stops before it mounts or detaches and the reason reaches
        the terminal instead of a log after a start that looked fine. A data manager that does not answer is
        waited for while the mount serves (`_watch_forever`), as a node may start before its data manager."""
        await trio.to_thread.run_sync(functools.partial(self._register, wait=False))

    async def follow_allocations(self) -> None:
        token = trio.lowlevel.current_trio_token()
        try:
            await trio.to_thread.run_sync(self._watch_forever, token, abandon_on_cancel=True)
        finally:
            self._stop.set()
            if self._call is not None:
                self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves cancel() untyped

    async def open_datasets(self) -> None:
        """Open the datasets' backends that revisions and tries ask for, in the background (`NodeDatasets.run_opens`),
        until the agent stops."""
        await self._datasets.run_opens()

    async def _retry_datasets(self) -> None:
        """Try again, in the background, the datasets this node could not open, and the options last set of those it
        reads with their previous ones (`NodeDatasets.retry_unopened`), between revisions."""
        async with self._changing:
            self._datasets.retry_unopened()
            self._datasets.retry_stale_options()

    async def report_usage(self) -> None:
        """Report the mount's usage every `report_interval`, first trying again to open the datasets this node could
        not open and the caches of the datasets served uncached."""
        while True:
            await trio.sleep(self._config.report_interval)
            await self._retry_datasets()
            async with self._changing:  # a revision that removes or re-sends a dataset must not run meanwhile
                await self._datasets.reopen_caches()
            request = self._usage(trio.current_time())
            try:
                await trio.to_thread.run_sync(functools.partial(self._stub.ReportUsage, request, timeout=CALL_TIMEOUT))
            except grpc.RpcError as exc:
                if served_elsewhere(exc):
                    if not self._report_refused:
                        log.error(
                            "the data manager %s refuses this agent's usage reports: %s; trying again every %g s",
                            self._config.datamgr,
                            exc.details(),
                            self._config.report_interval,
                            extra=self._ids(),
                        )
                    self._report_refused = True
                else:  # the watch loop reports outages
                    log.debug("usage report not delivered: %s", exc.code(), extra=self._ids())
            else:
                if self._report_refused:
                    log.info(
                        "the data manager %s takes this agent's usage reports again",
                        self._config.datamgr,
                        extra=self._ids(),
                    )
                self._report_refused = False

    def _usage(self, now: float) -> pb.ReportUsageRequest:
        jobs = []
        for job in self._mount.jobs.values():
            stats = job.statistics(now)
            manifest = job.dataset.manifest
            jobs.append(
                pb.JobUsage(
                    job_id=job.job_id,
                    bytes_read=stats.bytes_read,
                    bytes_from_remote=stats.bytes_from_remote,
                    cache_hits=stats.cache_hits,
                    cache_misses=stats.cache_misses,
                    epoch=stats.access.epoch,
                    epoch_progress=stats.access.progress,
                    throughput_bytes_per_sec=stats.access.throughput_bytes_per_sec,
                    effective_cache_bytes=stats.access.effective_cache_items
                    * manifest.size_bytes
                    // manifest.item_count,
                    remote_demand_bytes_per_sec=stats.access.remote_demand_bytes_per_sec,
                    failed_reads=stats.failed_reads,
                    denied_reads=stats.denied_reads,
                )
            )
        return pb.ReportUsageRequest(
            node_id=self._config.node_id, datasets=self._datasets.usage(), jobs=jobs, agent_id=self.agent_id
        )

    async def _apply(self, event: pb.WatchEvent, *, opens_stream: bool) -> None:
        """Apply one revision: a snapshot replaces everything, changes apply in order. The first event of a stream
        names the history of its revisions (0 from a data manager that names none), which goes with them."""
        async with self._changing:
            await self._apply_changes(event)
            self._forget_unused_manifests()
            self.revision = event.revision
            if opens_stream:
                self.history = event.history

    def _forget_unused_manifests(self) -> None:
        """Keep the manifests of the datasets served or waiting to open, and no other: each is the dataset's whole
        listing (160 bytes a file), and an agent that kept every one it fetched grew by a listing each time a dataset
        was registered anew or a new one came and went (1.3 MB for 8,000 files)."""
        for digest in self._manifests.keys() - self._datasets.digests_in_use():
            del self._manifests[digest]

    async def _apply_changes(self, event: pb.WatchEvent) -> None:
        if event.HasField("snapshot"):
            if self.revision:
                log.info(
                    "the data manager %s sent a snapshot of its revision %d where this node was at revision %d: "
                    "following it",
                    self._config.datamgr,
                    event.revision,
                    self.revision,
                    extra=self._ids(),
                )
            await self._apply_snapshot(event.snapshot)
        for change in event.changes:
            kind = change.WhichOneof("change")
            if kind == "dataset_set":
                await self._datasets.set(change.dataset_set, self._manifests)
            elif kind == "job_set":
                self._set_job(change.job_set)
            elif kind == "job_removed":
                self._remove_job(change.job_removed)
            elif kind == "dataset_removed":
                await self._datasets.remove(change.dataset_removed)

    async def _apply_snapshot(self, snapshot: pb.AllocationSnapshot) -> None:
        """Serve what the snapshot says and nothing else. Its datasets' backends open in the background, side by
        side: one whose open hangs (a profile's `credential_process` waiting for a login) keeps only its own jobs'
        directories from appearing, and holds no revision after the snapshot. A job of no dataset the snapshot names
        waits, as one whose dataset failed."""
        for job_id in (set(self._mount.jobs) | set(self._unserved_jobs)) - {j.job_id for j in snapshot.jobs}:
            self._remove_job(job_id)
        for uri in self._datasets.uris() - {d.uri for d in snapshot.datasets}:
            await self._datasets.remove(uri)
        for dataset in snapshot.datasets:
            await self._datasets.set(dataset, self._manifests)
        for job in snapshot.jobs:
            self._set_job(job)
        await self._datasets.delete_unserved_caches()

    def _dataset_opened(self, uri: str) -> None:
        """Add the jobs that waited for the dataset to open: their directories appear."""
        for job in [job for job in self._unserved_jobs.values() if job.dataset_uri == uri]:
            self._set_job(job)

    def _dataset_failed(self, uri: str) -> None:
        """Say that the jobs which waited for the dataset's first open wait on: it failed."""
        for job in self._unserved_jobs.values():
            if job.dataset_uri == uri:
                self._log_unserved(job)

    def _set_job(self, wanted: pb.NodeJob) -> None:
        job = self._mount.jobs.get(wanted.job_id)
        rate = wanted.io_bytes_per_sec
        share = pass_share(wanted.workers, wanted.job_workers)  # job_workers 0: an older data manager
        if job is not None and job.dataset is not self._mount.datasets.get(wanted.dataset_uri):
            # The id now reads another dataset, or its dataset was registered anew (another manifest): a job
            # finished and registered again while this node missed it (a snapshot after a restore, a
            # reconnect). Its directory must show the dataset it reads now, never the old one's bytes.
            self._remove_job(wanted.job_id)
            job = None
        if job is None:
            dataset = self._mount.datasets.get(wanted.dataset_uri)
            ids = self._ids(job_id=wanted.job_id, dataset_uri=wanted.dataset_uri)
            if dataset is None:
                if wanted.job_id not in self._unserved_jobs:
                    if self._datasets.opening(wanted.dataset_uri):  # said once the open fails (`_dataset_failed`)
                        log.debug("job %s waits for %s to open", wanted.job_id, wanted.dataset_uri, extra=ids)
                    else:
                        self._log_unserved(wanted)
                self._unserved_jobs[wanted.job_id] = wanted
                return
            self._unserved_jobs.pop(wanted.job_id, None)
            add_job(self._mount, wanted.job_id, dataset, rate, share)
            log.info(
                "job %s: %s at %d bytes/s, %d of its %d workers here",
                wanted.job_id,
                wanted.dataset_uri,
                rate,
                wanted.workers,
                max(wanted.job_workers, wanted.workers),
                extra=ids,
            )
            return
        job.tracker.set_share(share)
        if job.bucket is not None and job.bucket.rate != rate:
            job.bucket.set_rate(rate, default_burst(rate, job.dataset.manifest.largest_item))
            log.info(
                "remote IO of job %s = %d bytes/s",
                wanted.job_id,
                rate,
                extra=self._ids(job_id=wanted.job_id, dataset_uri=job.dataset.uri),
            )

    def _log_unserved(self, job: pb.NodeJob) -> None:
        log.error(
            "job %s reads %s, which this node cannot serve: its directory appears once the dataset opens",
            job.job_id,
            job.dataset_uri,
            extra=self._ids(job_id=job.job_id, dataset_uri=job.dataset_uri),
        )

    def _remove_job(self, job_id: str) -> None:
        self._unserved_jobs.pop(job_id, None)
        if job_id in self._mount.jobs:
            self._mount.remove_job(job_id)
            forget_job_directory(job_id)
            log.info("job %s finished here; its directory is gone", job_id, extra=self._ids(job_id=job_id))

    # ---- watch thread ----

    def _watch_forever(self, token: trio.lowlevel.TrioToken) -> None:
        failures, outage = 0, False
        if not self._registered:
            self._register()
        while not self._stop.is_set():
            try:
                request = pb.WatchAllocationsRequest(
                    node_id=self._config.node_id,
                    since_revision=self.revision,
                    history=self.history,
                    agent_id=self.agent_id,
                )
                self._call = self._stub.WatchAllocations(request)
                for index, event in enumerate(self._call):
                    self._fetch_manifests(event)
                    trio.from_thread.run(
                        functools.partial(self._apply, event, opens_stream=index == 0), trio_token=token
                    )
                    if outage:
                        log.info(
                            "data manager %s is back; at revision %d",
                            self._config.datamgr,
                            self.revision,
                            extra=self._ids(),
                        )
                        outage = False
                        self.reconnects += 1
                    if self._watch_refused:
                        log.info(
                            "the data manager %s lets this agent serve node %s again; at revision %d",
                            self._config.datamgr,
                            self._config.node_id,
                            self.revision,
                            extra=self._ids(),
                        )
                        self._watch_refused = False
                    failures = 0
            except (grpc.RpcError, ManifestMismatch) as exc:
                if self._stop.is_set():
                    return
                if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.NOT_FOUND:
                    self.revision = 0  # the data manager lost this node: start over
                    self._registered = False
                    self._register(served=True)
                elif isinstance(exc, grpc.RpcError) and served_elsewhere(exc):
                    self._refused_while_serving(exc)
                elif not outage:
                    log.warning(
                        "lost the data manager %s (%s); enforcing the allocations of revision %d until it is back",
                        self._config.datamgr,
                        self._why(exc) if isinstance(exc, grpc.RpcError) else exc,
                        self.revision,
                        extra=self._ids(),
                    )
                    outage = True
            except (trio.RunFinishedError, trio.Cancelled):
                return
            failures += 1
            self._stop.wait(RECONNECT.delay(failures))

    def _register(self, *, wait: bool = True, served: bool = False) -> None:
        """Register this node. Raises AgentError if the data manager refuses; while it does not answer, waits
        with backoff (or, without `wait`, returns after the one try, leaving the node unregistered). An agent that
        has `served` the node is refused only once another agent serves it: it waits for that one to stop instead."""
        config = self._config
        capacity = config.cache_capacity
        if capacity is None:
            capacity = shutil.disk_usage(config.cache_dir).free
        request = pb.RegisterNodeRequest(
            node_id=config.node_id,
            address=config.address or socket.gethostname(),
            cache_capacity_bytes=capacity,
            gpus=config.gpus,
            agent_id=self.agent_id,
        )
        failures = 0
        while not self._stop.is_set():
            try:
                self._stub.RegisterNode(request, timeout=CALL_TIMEOUT)
                log.info(
                    "registered node %s with %d bytes of cache at %s (agent %s)",
                    config.node_id,
                    capacity,
                    config.datamgr,
                    self.agent_id,
                    extra=self._ids(),
                )
                self._now_registered()
                return
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.ALREADY_EXISTS and config.cache_capacity is None:
                    registered = self._registration()
                    if registered is not None:
                        self._refuse_other_than(registered)
                        log.info(
                            "node %s is already registered; using its registration (agent %s)",
                            config.node_id,
                            self.agent_id,
                            extra=self._ids(),
                        )
                        self._now_registered()
                        return
                elif served and served_elsewhere(exc):
                    self._refused_while_serving(exc)
                else:
                    self._raise_if_refused(exc)
                if not self._waiting and not served_elsewhere(exc):
                    log.warning(
                        "waiting for the data manager %s (%s)", config.datamgr, self._why(exc), extra=self._ids()
                    )
                    self._waiting = True
            if not wait:
                return
            failures += 1
            self._stop.wait(RECONNECT.delay(failures))

    def _registration(self) -> pb.Node | None:
        """The node's registration as the data manager holds it; None if it cannot be asked now (tried again)."""
        try:
            node: pb.Node = self._stub.GetNode(pb.GetNodeRequest(node_id=self._config.node_id), timeout=CALL_TIMEOUT)
        except grpc.RpcError:
            return None
        return node

    def _refuse_other_than(self, registered: pb.Node) -> None:
        """AgentError if this agent asks for another address or GPU count than the node is registered with. Only
        what it was given counts: without --cache-capacity its capacity is the disk's free space, which moves, so
        the registered one is kept; so are the registered address without --address and GPUs without --gpus."""
        config = self._config
        differences = []
        if config.address and config.address != registered.address:
            differences.append(f"address {registered.address}, not {config.address}")
        if config.gpus and config.gpus != registered.gpus:
            differences.append(f"{registered.gpus} GPUs, not {config.gpus}")
        if differences:
            raise self._registered_otherwise(f"it is registered with {' and '.join(differences)}")

    def _now_registered(self) -> None:
        self._reached = self._registered = True
        self._waiting = False

    def _raise_if_refused(self, exc: grpc.RpcError) -> None:
        """AgentError for a registration the data manager refuses, which waiting would not change."""
        node_id = self._config.node_id
        if refusal_of(exc):  # another agent serves the node, or no cell holds it: waiting would change neither
            raise AgentError(f"cannot register node {node_id}: {exc.details()}") from None
        if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
            raise self._registered_otherwise(exc.details() or "registered with other parameters") from None
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise AgentError(f"cannot register node {node_id}: {exc.details()}") from None
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:  # waiting would not bring a token
            raise AgentError(f"cannot register node {node_id}: {self._why(exc)}") from None

    def _refused_while_serving(self, exc: grpc.RpcError) -> None:
        """Log, once until it is lifted, that the data manager refuses this agent the node another agent serves now
        (this one lost its stream, to a partition say, and the other took over): this agent keeps enforcing what it
        last received and keeps trying, to take the node back once the other agent's stream ends."""
        if self._watch_refused:
            return
        self._watch_refused = True
        serving = (
            f"enforcing the allocations of revision {self.revision}" if self.revision else "serving no job meanwhile"
        )
        log.error(
            "the data manager %s refuses node %s to this agent (%s): %s; %s, and trying again until the other agent's "
            "stream ends",
            self._config.datamgr,
            self._config.node_id,
            self.agent_id,
            exc.details(),
            serving,
            extra=self._ids(),
        )

    def _registered_otherwise(self, how: str) -> AgentError:
        """The refusal of a node registered with other parameters than this agent asks for, and how to change them."""
        node_id = self._config.node_id
        return AgentError(
            f"cannot register node {node_id}: {how} (stop this agent, then `silod node remove {node_id}`, which is "
            "refused while jobs run there)"
        )

    def _ids(self, *, job_id: str | None = None, dataset_uri: str | None = None) -> dict[str, str]:
        """Log fields for an event on this node, about the job or dataset given."""
        return log_ids(job_id=job_id, dataset_uri=dataset_uri, node_id=self._config.node_id)

    def _why(self, exc: grpc.RpcError) -> str:
        """A failed call's status, with the reason the data manager gave when it answered one (its state disk
        full, say); or what to do about it when it failed for a TLS or token reason."""
        code: grpc.StatusCode = exc.code()
        refusal = explain_refusal(exc, self._config.datamgr, self._config.security, connected_before=self._reached)
        if refusal:
            return refusal
        details = exc.details()
        if not details or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return code.name  # not reached, or no answer in time: gRPC's own text says no more
        return f"{code.name}: {details}"

    def _fetch_manifests(self, event: pb.WatchEvent) -> None:
        datasets = list(event.snapshot.datasets) + [c.dataset_set for c in event.changes if c.HasField("dataset_set")]
        for dataset in datasets:
            if dataset.manifest_digest not in self._manifests:
                self._manifests[dataset.manifest_digest] = self._fetch_manifest(dataset.uri, dataset.manifest_digest)

    def _fetch_manifest(self, uri: str, digest: str) -> Manifest:
        request = pb.GetManifestRequest(dataset_uri=uri)
        data = b"".join(chunk.data for chunk in self._stub.GetManifest(request, timeout=10 * CALL_TIMEOUT))
        if hashlib.sha256(data).hexdigest() != digest:
            raise ManifestMismatch(f"the manifest received for {uri} does not match digest {digest}")
        return Manifest.decode(data)


async def run_agent(config: AgentConfig, on_ready: ReadyCallback = lambda: None) -> None:
    """Mount, follow the data manager, report usage; until a signal or an external unmount. Every line the process
    logs from here on names the node (`set_process_ids`)."""
    set_process_ids(node_id=config.node_id)
    make_cache_dir_private(config.cache_dir, config.node_id)
    mount = MountState(config.read_buffer)
    if config.metrics_port is not None:  # a port in use must stop the agent before it registers its node
        try:
            refuse_busy_port(METRICS_HOST, config.metrics_port)
        except MetricsPortError as exc:
            raise MountError(str(exc)) from None
    with open_channel(config.datamgr, config.security, CHANNEL_OPTIONS) as channel:
        agent = NodeAgent(config, mount, pb_grpc.DataManagerStub(channel))
        await agent.register_before_mounting()
        try:
            await run_filesystem(
                config,
                mount,
                tasks=[agent.follow_allocations, agent.report_usage, agent.open_datasets],
                on_ready=on_ready,
                reconnects=lambda: agent.reconnects,
                node_id=config.node_id,
            )
        except* AgentError as refused:  # refused once the data manager answered late: the reason, not a task group
            raise refused.exceptions[0] from None
