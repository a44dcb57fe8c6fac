"""The data manager's operations: validate, change the state, persist, and push each node its slice.

All operations run on one asyncio event loop and never await between checking a request and committing it,
so no two changes interleave and a rejected call changes nothing. Every accepted change gets the next
revision, is durable before the call returns, and reaches watching nodes as one event per revision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from datamgr import convert
from datamgr.entities import (
    AlreadyExists,
    Dataset,
    FailedPrecondition,
    InvalidArgument,
    Job,
    Node,
    NotFound,
    ResourceExhausted,
    Worker,
)
from datamgr.listing import freeze_manifest
from datamgr.liveness import NodeLiveness
from datamgr.state import Change, ClusterState, diff_views
from datamgr.store import Commit, StateStore, StoreFull
from datamgr.validation import (
    check_address,
    check_bytes,
    check_chunk_size,
    check_dataset_uri,
    check_epochs,
    check_id,
    check_rate,
    check_worker_count,
)
from datamgr.watch import WatchHub
from silodlib.manifest import DEFAULT_CHUNK_SIZE, Manifest
from silodlib.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)

ManifestFreezer = Callable[[str, Mapping[str, str], int], Manifest]


class DataManager:
    """The single source of truth for datasets, jobs, nodes and their allocations.

    With `policy` set, allocations belong to that policy (the live controller runs it): the allocation calls
    refuse any other caller. `on_jobs_changed` hears, once each is durable, of every job registered or
    finished, with a short description; the controller runs a round on it.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        remote_io_limit: int | None = None,
        node_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        freeze: ManifestFreezer = freeze_manifest,
        policy: str | None = None,
        on_jobs_changed: Callable[[str], None] = lambda description: None,
    ) -> None:
        stored = store.load()
        self._store = store
        self._freeze = freeze
        self._on_jobs_changed = on_jobs_changed
        self.remote_io_limit = remote_io_limit
        self.policy = policy
        self.state = ClusterState(stored.revision, stored.datasets, stored.jobs, stored.nodes)
        self.hub = WatchHub()
        self.liveness = NodeLiveness(node_timeout, clock, self.state.nodes)
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    # ---- lookups that raise NOT_FOUND ----

    def _dataset(self, field: str, uri: str) -> Dataset:
        canonical = check_dataset_uri(field, uri)
        if canonical not in self.state.datasets:
            raise NotFound(f"{field}: dataset {canonical} is not registered")
        return self.state.datasets[canonical]

    def _job(self, job_id: str) -> Job:
        check_id("job_id", job_id)
        if job_id not in self.state.jobs:
            raise NotFound(f"job_id: job {job_id!r} is not registered")
        return self.state.jobs[job_id]

    def _node(self, field: str, node_id: str) -> Node:
        check_id(field, node_id)
        if node_id not in self.state.nodes:
            raise NotFound(f"{field}: node {node_id!r} is not registered")
        return self.state.nodes[node_id]

    # ---- the paper's two calls ----

    def _check_allocator(self, call: str, policy: str | None) -> None:
        """Only the policy that owns allocations may make them (anyone, when none does)."""
        if self.policy is not None and policy != self.policy:
            raise FailedPrecondition(
                f"{call}: the {self.policy} policy allocates cache and remote IO on this data manager "
                f"(--policy {self.policy}) and would undo a manual change at its next round; "
                "restart it with --policy external to allocate by hand"
            )

    async def allocate_cache_size(
        self, dataset_uri: str, cache_size_bytes: int, *, policy: str | None = None
    ) -> tuple[Dataset, int]:
        """Set a dataset's cache quota on every node that mounts it. `policy` names the caller when it is the
        live controller's policy."""
        self._check_allocator("AllocateCacheSize", policy)
        dataset = self._dataset("dataset_uri", dataset_uri)
        size = check_bytes("cache_size_bytes", cache_size_bytes)
        if size > dataset.size_bytes:
            raise FailedPrecondition(
                f"cache_size_bytes {size} is larger than dataset {dataset.uri} ({dataset.size_bytes} bytes)"
            )
        mounting = self.state.nodes_mounting(dataset.uri)
        for node_id in sorted(mounting):
            others = self.state.node_cache_allocated(node_id) - dataset.cache_quota_bytes
            capacity = self.state.nodes[node_id].cache_capacity_bytes
            if others + size > capacity:
                raise FailedPrecondition(
                    f"cache_size_bytes {size}: node {node_id!r} mounts {dataset.uri} and has room for "
                    f"{max(0, capacity - others)} bytes of quota ({format_size(capacity)} capacity, "
                    f"{format_size(others)} allocated to its other datasets)"
                )
        if size == dataset.cache_quota_bytes:
            return dataset, await self._settled()
        updated = replace(dataset, cache_quota_bytes=size)
        revision = await self._commit(
            Change(datasets_put=(updated,)), mounting, f"cache quota of {dataset.uri} = {format_size(size)}"
        )
        return updated, revision

    async def allocate_remote_io(
        self, job_id: str, io_bytes_per_sec: int, *, policy: str | None = None
    ) -> tuple[Job, int]:
        """Set a job's remote IO rate, split among its workers. `policy` as for `allocate_cache_size`."""
        self._check_allocator("AllocateRemoteIO", policy)
        job = self._job(job_id)
        rate = check_rate("io_bytes_per_sec", io_bytes_per_sec)
        if self.remote_io_limit is not None:
            left = self.remote_io_limit - (self.state.io_allocated_bytes_per_sec - job.io_bytes_per_sec)
            if rate > left:
                raise FailedPrecondition(
                    f"io_bytes_per_sec {rate} exceeds the remote IO limit of {self.remote_io_limit} bytes/s: "
                    f"{left} bytes/s ({format_rate(left)}) are left for job {job_id!r}"
                )
        if rate == job.io_bytes_per_sec:
            return job, await self._settled()
        updated = replace(job, io_bytes_per_sec=rate)
        revision = await self._commit(
            Change(jobs_put=(updated,)), job.node_ids, f"remote IO of job {job_id} = {format_rate(rate)}"
        )
        return updated, revision

    # ---- datasets ----

    async def register_dataset(
        self, uri: str, options: Mapping[str, str], chunk_size_bytes: int
    ) -> tuple[Dataset, bool, int]:
        canonical = check_dataset_uri("uri", uri)
        chunk = DEFAULT_CHUNK_SIZE if chunk_size_bytes == 0 else check_chunk_size("chunk_size_bytes", chunk_size_bytes)
        options = dict(options)
        existing = self._existing_dataset(canonical, options, chunk)
        if existing is not None:
            return existing, False, await self._settled()
        manifest = await asyncio.to_thread(self._freeze, canonical, options, chunk)
        existing = self._existing_dataset(canonical, options, chunk)  # registered while we listed?
        if existing is not None:
            return existing, False, await self._settled()
        dataset = Dataset(
            canonical,
            options,
            manifest.size_bytes,
            manifest.file_count,
            manifest.item_count,
            chunk,
            manifest.digest,
        )
        change = Change(datasets_put=(dataset,), manifest=(canonical, manifest.encode()))
        summary = f"{manifest.file_count} files, {manifest.item_count} items, {format_size(manifest.size_bytes)}"
        revision = await self._commit(change, (), f"registered dataset {canonical} ({summary})")
        return dataset, True, revision

    def _existing_dataset(self, uri: str, options: Mapping[str, str], chunk: int) -> Dataset | None:
        dataset = self.state.datasets.get(uri)
        if dataset is not None and not dataset.same_registration(options, chunk):
            raise AlreadyExists(
                f"uri: dataset {uri} is registered with other options or chunk size; unregister it first"
            )
        return dataset

    async def unregister_dataset(self, uri: str) -> int:
        dataset = self._dataset("uri", uri)
        users = sorted(self.state.jobs_of_dataset(dataset.uri))
        if users:
            raise FailedPrecondition(f"uri: dataset {dataset.uri} is in use by jobs {users}; finish them first")
        return await self._commit(Change(datasets_deleted=(dataset.uri,)), (), f"unregistered dataset {dataset.uri}")

    def manifest(self, dataset_uri: str) -> tuple[bytes, str]:
        dataset = self._dataset("dataset_uri", dataset_uri)
        return self._store.manifest(dataset.uri), dataset.manifest_digest

    # ---- jobs ----

    async def register_job(
        self,
        job_id: str,
        dataset_uri: str,
        ideal_bytes_per_sec: int,
        workers: Sequence[Worker],
        *,
        epochs: float = 0.0,
        irregular: bool = False,
    ) -> tuple[Job, bool, int]:
        """Register a job. Repeating a registration exactly is a no-op; changing any of its parameters (the
        dataset, f*, workers, epochs, irregular) is ALREADY_EXISTS, as for datasets and nodes."""
        check_id("job_id", job_id)
        dataset = self._dataset("dataset_uri", dataset_uri)
        ideal = check_rate("ideal_bytes_per_sec", ideal_bytes_per_sec, positive=True)
        job = Job(
            job_id,
            dataset.uri,
            ideal,
            self._checked_workers(workers),
            epochs=check_epochs("epochs", epochs),
            irregular=irregular,
        )
        existing = self.state.jobs.get(job_id)
        if existing is not None:
            differences = existing.registration_differences(job)
            if differences:
                registered = ", ".join(f"{name} {_parameter(existing, name)}" for name in differences)
                requested = ", ".join(f"{name} {_parameter(job, name)}" for name in differences)
                raise AlreadyExists(
                    f"job_id: job {job_id!r} is registered with {registered}, not {requested}; "
                    "finish it first to register it anew"
                )
            return existing, False, await self._settled()
        for node_id in job.node_ids:
            self._check_room_for(node_id, dataset)
        revision = await self._commit(Change(jobs_put=(job,)), job.node_ids, f"registered job {_describe(job)}")
        self._on_jobs_changed(f"registered job {job_id}")
        return job, True, revision

    def _checked_workers(self, workers: Sequence[Worker]) -> tuple[Worker, ...]:
        if not workers:
            raise InvalidArgument("workers must name at least one node")
        seen: set[str] = set()
        for i, worker in enumerate(workers):
            self._node(f"workers[{i}].node_id", worker.node_id)
            check_worker_count(f"workers[{i}].count", worker.count)
            if worker.node_id in seen:
                raise InvalidArgument(
                    f"workers[{i}].node_id {worker.node_id!r} is listed twice; give one entry with a count"
                )
            seen.add(worker.node_id)
        return tuple(workers)

    def _check_room_for(self, node_id: str, dataset: Dataset) -> None:
        if dataset.uri in self.state.datasets_on_node(node_id):
            return
        allocated = self.state.node_cache_allocated(node_id)
        capacity = self.state.nodes[node_id].cache_capacity_bytes
        if allocated + dataset.cache_quota_bytes > capacity:
            raise FailedPrecondition(
                f"workers: node {node_id!r} has room for {max(0, capacity - allocated)} bytes of quota but "
                f"dataset {dataset.uri} has a cache quota of {dataset.cache_quota_bytes} bytes"
            )

    async def finish_job(self, job_id: str) -> int:
        job = self._job(job_id)
        revision = await self._commit(Change(jobs_deleted=(job_id,)), job.node_ids, f"finished job {job_id}")
        self._on_jobs_changed(f"finished job {job_id}")
        return revision

    # ---- nodes ----

    async def register_node(self, node_id: str, address: str, cache_capacity_bytes: int) -> tuple[Node, bool, int]:
        node = Node(
            check_id("node_id", node_id),
            check_address("address", address),
            check_bytes("cache_capacity_bytes", cache_capacity_bytes),
        )
        existing = self.state.nodes.get(node_id)
        if existing is not None and existing != node:
            raise AlreadyExists(
                f"node_id: node {node_id!r} is registered with address {existing.address} and capacity "
                f"{existing.cache_capacity_bytes} bytes; unregister it first to change them"
            )
        self._note_contact(node_id)
        if existing is not None:
            return existing, False, await self._settled()
        summary = f"registered node {node_id} at {address} with {format_size(node.cache_capacity_bytes)} of cache"
        return node, True, await self._commit(Change(nodes_put=(node,)), (), summary)

    async def unregister_node(self, node_id: str) -> int:
        self._node("node_id", node_id)
        users = sorted(self.state.jobs_on_node(node_id))
        if users:
            raise FailedPrecondition(f"node_id: node {node_id!r} runs workers of jobs {users}; finish them first")
        revision = await self._commit(Change(nodes_deleted=(node_id,)), (), f"unregistered node {node_id}")
        self.liveness.forget(node_id)
        return revision

    async def watch(self, node_id: str, since_revision: int) -> AsyncIterator[pb.WatchEvent]:
        """The node's events after `since_revision`, or a snapshot if that is 0 or no longer in the log."""
        self._node("node_id", node_id)
        self._note_contact(node_id)
        with self.hub.subscribe(node_id) as subscription:
            # No await between subscribing and reading the log or state: nothing can slip in between.
            logged = self._store.events_since(node_id, since_revision) if since_revision else None
            if logged is None:
                snapshot = convert.snapshot_event(self.state.revision, self.state.node_view(node_id))
                await self._settled()  # never show a node state that is not yet on disk
                backlog = [snapshot]
            else:
                backlog = [pb.WatchEvent.FromString(payload) for payload in logged]
                if not backlog:  # nothing missed: say so, so the node knows it is connected and current
                    # At the durable revision: changes still being written arrive through the subscription.
                    backlog = [pb.WatchEvent(revision=self._durable_revision())]
            last = since_revision
            for event in backlog:
                last = event.revision
                yield event
            while True:
                event = await subscription.next()
                if event.revision > last:
                    last = event.revision
                    yield event

    def report_usage(self, node_id: str, datasets: Sequence[pb.DatasetUsage], jobs: Sequence[pb.JobUsage]) -> None:
        self._node("node_id", node_id)
        if self.liveness.report(node_id, datasets, jobs):
            log.info("node %s is available again", node_id, extra={"node_id": node_id})

    def _note_contact(self, node_id: str) -> None:
        if self.liveness.seen(node_id):
            log.info("node %s is available again", node_id, extra={"node_id": node_id})

    def expire_nodes(self) -> list[str]:
        """Mark nodes that stopped reporting unavailable (they stay registered)."""
        expired = self.liveness.expire()
        for node_id in expired:
            log.warning("node %s stopped reporting; marked unavailable", node_id, extra={"node_id": node_id})
        return expired

    # ---- queries ----

    def cluster_summary(self) -> pb.ClusterSummary:
        nodes = self.state.nodes
        return pb.ClusterSummary(
            revision=self.state.revision,
            dataset_count=len(self.state.datasets),
            job_count=len(self.state.jobs),
            node_count=len(nodes),
            nodes_available=sum(self.liveness.available(n) for n in nodes),
            remote_io_limit_bytes_per_sec=self.remote_io_limit or 0,
            remote_io_allocated_bytes_per_sec=self.state.io_allocated_bytes_per_sec,
            cache_capacity_bytes=sum(n.cache_capacity_bytes for n in nodes.values()),
            cache_allocated_bytes=sum(self.state.node_cache_allocated(n) for n in nodes),
        )

    def dataset_info(self, uri: str) -> pb.Dataset:
        dataset = self._dataset("uri", uri)
        return convert.dataset_message(
            dataset, self.state.jobs_of_dataset(dataset.uri), self.liveness.dataset_usage(dataset.uri)
        )

    def job_info(self, job_id: str) -> pb.Job:
        return convert.job_message(self._job(job_id), self.liveness.job_usage(job_id))

    def node_info(self, node_id: str) -> pb.Node:
        node = self._node("node_id", node_id)
        return convert.node_message(
            node,
            cache_allocated=self.state.node_cache_allocated(node_id),
            available=self.liveness.available(node_id),
            seconds_since_seen=self.liveness.seconds_since_seen(node_id),
            job_ids=self.state.jobs_on_node(node_id),
        )

    def list_datasets(self) -> list[pb.Dataset]:
        return [self.dataset_info(uri) for uri in sorted(self.state.datasets)]

    def list_jobs(self) -> list[pb.Job]:
        return [self.job_info(job_id) for job_id in sorted(self.state.jobs)]

    def list_nodes(self) -> list[pb.Node]:
        return [self.node_info(node_id) for node_id in sorted(self.state.nodes)]

    # ---- the one way state changes ----

    async def _commit(self, change: Change, affected_nodes: Collection[str], description: str) -> int:
        """Apply `change` as the next revision now, and return once it is durable.

        Changes are applied in memory at once, in call order, so the next call is validated against them;
        they are written in batches (group commit), so concurrent callers share one fsync. Watch events go
        out only after their batch is on disk.
        """
        touched_jobs = {job.job_id for job in change.jobs_put}.union(change.jobs_deleted)
        before = {node_id: self.state.node_view(node_id, touched_jobs) for node_id in affected_nodes}
        undo = self.state.apply(change)
        self.state.revision += 1
        events = {}
        for node_id, old_view in before.items():
            changes = diff_views(old_view, self.state.node_view(node_id, touched_jobs))
            if changes:
                events[node_id] = convert.watch_event(self.state.revision, changes)
        loop = asyncio.get_running_loop()
        pending = _Pending(self.state.revision, change, undo, events, description, loop.create_future())
        self._pending.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        await asyncio.shield(pending.durable)  # a caller that goes away must not cancel a shared commit
        return pending.revision

    def _durable_revision(self) -> int:
        return self._pending[0].revision - 1 if self._pending else self.state.revision

    async def _settled(self) -> int:
        """The current revision, once every change up to it is durable."""
        revision = self.state.revision
        if self._pending:
            await asyncio.shield(self._pending[-1].durable)
        return revision

    async def _flush(self) -> None:
        while self._pending:
            batch = list(self._pending)
            commits = [
                Commit(p.revision, p.change, [(n, e.SerializeToString()) for n, e in p.events.items()]) for p in batch
            ]
            try:
                await asyncio.to_thread(self._store.commit, commits)
            except Exception as exc:
                self._abandon_pending(exc)
                return
            del self._pending[: len(batch)]
            for p in batch:
                for node_id, event in p.events.items():
                    self.hub.publish(node_id, event)
                log.info("revision %d: %s", p.revision, p.description, extra=_log_fields(p.revision, p.change))
                p.durable.set_result(None)

    def _abandon_pending(self, exc: Exception) -> None:
        """A batch could not be written: undo it and everything applied after it, newest first, and fail
        all of their callers. None of these changes was acknowledged or sent to a node, so their revision
        numbers go to the next changes, as they would after a restart: the store's revision is the last
        durable one, and a node told it is current must never skip a change numbered as one it saw."""
        first, last = self._pending[0].revision, self._pending[-1].revision
        log.error("could not persist revisions %d-%d: %s", first, last, exc)
        for p in reversed(self._pending):
            self.state.apply(p.undo)
            p.durable.set_exception(_refusal(exc))
        self._pending.clear()
        self.state.revision = first - 1

    async def close(self) -> None:
        """Wait for pending changes to be written (call before closing the store)."""
        if self._flusher is not None:
            await asyncio.wait([self._flusher])


def _refusal(exc: Exception) -> Exception:
    """What a caller whose change could not be written is told. A full state disk is a refusal with its own
    status (RESOURCE_EXHAUSTED); any other failure is passed on as it is."""
    if isinstance(exc, StoreFull):
        return ResourceExhausted(
            "the data manager's state disk is full: nothing was changed; free space in its state dir and call again"
        )
    return exc


def _workers_text(workers: Sequence[Worker]) -> str:
    return ",".join(f"{w.node_id}:{w.count}" for w in workers)


def _parameter(job: Job, name: str) -> str:
    """One registered parameter of a job, written as a registration gives it."""
    return _workers_text(job.workers) if name == "workers" else str(getattr(job, name))


def _describe(job: Job) -> str:
    """A registered job for the change log: id, dataset, workers, and what it said about its training."""
    length = f"{job.epochs:g} epochs" if job.epochs else "length unknown"
    access = ", irregular access" if job.irregular else ""
    return f"{job.job_id} on {job.dataset_uri} with workers {_workers_text(job.workers)} ({length}{access})"


def _log_fields(revision: int, change: Change) -> dict[str, object]:
    """The ids a change touches, as structured log fields (comma-joined when it touches several)."""
    fields: dict[str, object] = {"revision": revision}
    for name, keys in (
        ("dataset_uri", [d.uri for d in change.datasets_put] + list(change.datasets_deleted)),
        ("job_id", [j.job_id for j in change.jobs_put] + list(change.jobs_deleted)),
        ("node_id", [n.node_id for n in change.nodes_put] + list(change.nodes_deleted)),
    ):
        if keys:
            fields[name] = ",".join(keys)
    return fields


@dataclass(slots=True)
class _Pending:
    """A change applied in memory and waiting for its batch to be durable."""

    revision: int
    change: Change
    undo: Change
    events: dict[str, pb.WatchEvent]
    description: str
    durable: asyncio.Future[None]
