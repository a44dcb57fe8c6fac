"""The data manager's operations: validate, change the state, persist, and push each node its slice.

All operations run on one asyncio event loop and never await between checking a request and committing it,
so no two changes interleave and a rejected call changes nothing. Every accepted change gets the next
revision, is durable before the call returns, and reaches watching nodes as one event per revision.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import replace

from datamgr import admission, convert, grace, lifecycle, lookups, tenants
from datamgr.change_text import describe_job, job_parameter, placement_text, time_text, vc_text, vcs_of
from datamgr.clocks import SteadyWallClock
from datamgr.entities import (
    BEST_EFFORT,
    HIGH_PRIORITY,
    AlreadyExists,
    Dataset,
    FailedPrecondition,
    Job,
    JobHistory,
    Node,
    StateDiskUnreadable,
    Tenant,
    Worker,
)
from datamgr.journal import GroupCommitJournal, JournalEntry
from datamgr.listing import freeze_manifest, try_options
from datamgr.liveness import DatasetUsage, JobUsage, NodeLiveness
from datamgr.node_agents import NodeAgents
from datamgr.scheduler.hived import Infeasible
from datamgr.state import Change, ClusterState, diff_views
from datamgr.store import StateStore, StoreUnreadable
from datamgr.validation import (
    check_address,
    check_bytes,
    check_cells,
    check_chunk_size,
    check_dataset_uri,
    check_epochs,
    check_gpus,
    check_grace_seconds,
    check_id,
    check_job_class,
    check_option_update,
    check_priority,
    check_rate,
)
from datamgr.watch import WatchHub, events_after
from silodlib.backends import option_changes
from silodlib.manifest import DEFAULT_CHUNK_SIZE, Manifest
from silodlib.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)

ManifestFreezer = Callable[[str, Mapping[str, str], int], Manifest]
DECISIONS = "decisions"  # the one key of the decisions hub


class DataManager:
    """The single source of truth for datasets, jobs, nodes and their allocations.

    With `policy` set, allocations belong to that policy (the live controller runs it): the allocation calls
    refuse every caller, and the controller allocates through `policy_allocations`. `request_round` hears,
    once each is durable, of every job registered or finished, every tenant registered or unregistered (which
    changes what a policy that keeps tenants' VCs may do), and every node registered or available again (GPUs
    and cache the policy may use now), with a short description; the controller runs a round on it.

    Jobs registered with GPUs instead of workers are the policy's to place (`PolicyAllocations.place`); each
    change to their decisions reaches WatchDecisions (`watch_decisions`) once durable. One preempted with a
    grace period keeps its GPUs until the period ends, when the policy's controller releases them
    (`PolicyAllocations.release_due`, `next_release`). Every job has a scheduling history (`JobHistory`, kept
    in `state.histories`), timed by `wall_clock` so that it survives a restart (by default the system's wall clock
    at the start, moved on by the monotonic clock: `clocks.SteadyWallClock`); `clock` times node liveness only.

    Tenants share the cluster, each with its virtual cluster (`Tenant`), checked against `cell_levels`, the
    GPUs' affinity hierarchy (`silod datamgr serve --cell-levels`; "": a node is one cell of its GPUs) and the
    nodes (`datamgr.tenants`); jobs may belong to one, with a priority.
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
        request_round: Callable[[str], None] = lambda description: None,
        wall_clock: Callable[[], float] | None = None,
        cell_levels: str = "",
    ) -> None:
        stored = store.load()
        self._store = store
        self._freeze = freeze
        self._request_round = request_round
        self.remote_io_limit = remote_io_limit
        self.policy = policy
        self.wall_clock = SteadyWallClock() if wall_clock is None else wall_clock  # no clock step moves it (`clocks`)
        self.cell_levels = cell_levels
        self.state = ClusterState(
            stored.revision, stored.datasets, stored.jobs, stored.nodes, stored.histories, stored.tenants
        )
        self._latest_submit = max((h.submit_time for h in self.state.histories.values()), default=-math.inf)
        self.hub: WatchHub[pb.WatchEvent] = WatchHub()
        self.decision_hub: WatchHub[pb.DecisionEvent] = WatchHub()
        self.node_timeout = node_timeout  # a node silent this many seconds is unavailable (`liveness`)
        self.liveness = NodeLiveness(node_timeout, clock, self.state.nodes)
        self.node_agents = NodeAgents(self.wall_clock)  # which agent process serves each node (`node_agents`)
        self._journal = GroupCommitJournal(store, self.hub.publish, self._roll_back)
        # The right to allocate while the policy owns allocations: handed to the live controller alone.
        self.policy_allocations = None if policy is None else PolicyAllocations(self)

    # ---- lookups that raise NOT_FOUND, naming the request field that asked ----

    def dataset(self, field: str, uri: str) -> Dataset:
        return lookups.dataset(self.state, field, uri)

    def job(self, job_id: str) -> Job:
        return lookups.job(self.state, job_id)

    def tenant(self, field: str, name: str) -> Tenant:
        return lookups.tenant(self.state, field, name)

    def history(self, job_id: str) -> JobHistory:
        """A registered job's scheduling history (every job has one; a state that lacks it, which no store
        returns, gets one that starts now rather than a crash)."""
        history = self.state.histories.get(job_id)
        return history if history is not None else lifecycle.registered(self.state.jobs[job_id], self.wall_clock())

    def bytes_read(self, job_id: str) -> int:
        """What a registered job has read in all its runs: what its history banked as it left nodes (preempted,
        suspended, migrated), and what the nodes it runs on now have reported of their run of it. So its progress
        survives a preemption, a resumption elsewhere and a restart, while each node's agent counts afresh each
        time it mounts the job. A node's reads after the job left it (its report in flight, its agent yet to hear
        of the change) are another run's: at most a report interval of them is lost, none counted twice."""
        job = self.state.jobs[job_id]
        current = sum(self.liveness.run_bytes(node_id, job_id) for node_id in lifecycle.placement_of(job))
        return self.history(job_id).bytes_read_before + current

    def node(self, field: str, node_id: str) -> Node:
        return lookups.node(self.state, field, node_id)

    # ---- the paper's two calls ----

    def _check_allocator(self, call: str) -> None:
        """By hand (through these calls) only when no policy owns allocations; the policy allocates through
        `policy_allocations`."""
        if self.policy is not None:
            raise FailedPrecondition(
                f"{call}: the {self.policy} policy allocates cache and remote IO on this data manager "
                f"(--policy {self.policy}) and would undo a manual change at its next round; "
                "restart it with --policy external to allocate by hand"
            )

    async def allocate_cache_size(self, dataset_uri: str, cache_size_bytes: int) -> tuple[Dataset, int]:
        """Set a dataset's cache quota on every node that mounts it (refused while a policy owns allocations)."""
        self._check_allocator("AllocateCacheSize")
        return await self._allocate_cache_size(dataset_uri, cache_size_bytes)

    async def allocate_remote_io(self, job_id: str, io_bytes_per_sec: int) -> tuple[Job, int]:
        """Set a job's remote IO rate, split among its workers (refused while a policy owns allocations)."""
        self._check_allocator("AllocateRemoteIO")
        return await self._allocate_remote_io(job_id, io_bytes_per_sec)

    async def _allocate_cache_size(self, dataset_uri: str, cache_size_bytes: int) -> tuple[Dataset, int]:
        dataset = self.dataset("dataset_uri", dataset_uri)
        size = check_bytes("cache_size_bytes", cache_size_bytes)
        admission.check_cache_quota(self.state, dataset, size)
        mounting = self.state.nodes_mounting(dataset.uri)
        if size == dataset.cache_quota_bytes:
            return dataset, await self._settled()
        updated = replace(dataset, cache_quota_bytes=size)
        revision = await self._commit(
            Change(datasets_put=(updated,)), mounting, f"cache quota of {dataset.uri} = {format_size(size)}"
        )
        return updated, revision

    async def _allocate_remote_io(self, job_id: str, io_bytes_per_sec: int) -> tuple[Job, int]:
        job = self.job(job_id)
        rate = check_rate("io_bytes_per_sec", io_bytes_per_sec)
        admission.check_remote_io(self.state, self.remote_io_limit, job, rate)
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
        existing = self._existing_dataset(canonical, options, chunk_size_bytes)
        if existing is not None:
            return existing, False, await self._settled()
        manifest = await asyncio.to_thread(self._freeze, canonical, options, chunk)
        existing = self._existing_dataset(canonical, options, chunk_size_bytes)  # registered while we listed?
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

    def _existing_dataset(self, uri: str, options: Mapping[str, str], chunk_size_bytes: int) -> Dataset | None:
        """The dataset registered at `uri`, None if none is; ALREADY_EXISTS if it is registered otherwise than asked
        (a chunk size of 0, none asked for, matches the one registered)."""
        dataset = self.state.datasets.get(uri)
        differences = [] if dataset is None else dataset.registration_differences(options, chunk_size_bytes)
        if differences:
            raise AlreadyExists(
                f"uri: dataset {uri} is registered {'; '.join(differences)}; unregister it first to change them"
            )
        return dataset

    async def unregister_dataset(self, uri: str) -> int:
        dataset = self.dataset("uri", uri)
        users = sorted(self.state.jobs_of_dataset(dataset.uri))
        if users:
            raise FailedPrecondition(f"uri: dataset {dataset.uri} is in use by jobs {users}; finish them first")
        change = Change(datasets_deleted=(dataset.uri,), forgets_earlier_events=bool(dataset.options))
        return await self._commit(change, (), f"unregistered dataset {dataset.uri}")

    async def update_dataset_options(
        self, uri: str, options: Mapping[str, str], removed: Sequence[str]
    ) -> tuple[Dataset, bool, int]:
        """Replace a dataset's backend options in place (`check_option_update`: `options` set, `removed` gone), for
        credentials that expire or are rotated under running jobs: its manifest stays, and so does every node's
        cache of it. Refused, changing nothing, unless the backend reads the dataset with the new options
        (`try_options`). Nodes that mount it get it again with them, as a dataset_set of the same manifest digest."""
        dataset = self.dataset("uri", uri)
        wanted = check_option_update(dataset.options, options, removed)
        if wanted == dataset.options:
            return dataset, False, await self._settled()
        data, _ = self.manifest(dataset.uri)
        await asyncio.to_thread(lambda: try_options(dataset.uri, wanted, Manifest.decode(data)))
        current = self.state.datasets.get(dataset.uri)
        if current is None or (current.manifest_digest, current.options) != (dataset.manifest_digest, dataset.options):
            raise FailedPrecondition(
                f"uri: dataset {dataset.uri} was unregistered or its options changed while the new ones were tried; "
                "try again"
            )
        updated = replace(current, options=wanted)
        description = f"options of dataset {dataset.uri}: {option_changes(dataset.options, wanted)}"
        revision = await self._commit(
            Change(datasets_put=(updated,), forgets_earlier_events=True),
            self.state.nodes_mounting(dataset.uri),
            description,
        )
        return updated, True, revision

    def manifest(self, dataset_uri: str) -> tuple[bytes, str]:
        dataset = self.dataset("dataset_uri", dataset_uri)
        try:
            return self._store.manifest(dataset.uri), dataset.manifest_digest
        except StoreUnreadable as exc:  # only the disk holds manifests
            raise StateDiskUnreadable(
                f"the data manager cannot read the manifest of {dataset.uri} from its state disk: {exc}; "
                "repair the disk (calls that need no manifest are still served)"
            ) from None

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
        gpus: int = 0,
        job_class: str = BEST_EFFORT,
        grace_seconds: float = 0.0,
        tenant: str = "",
        priority: str = HIGH_PRIORITY,
    ) -> tuple[Job, bool, int]:
        """Register a job. Repeating a registration exactly is a no-op; changing any of its parameters (the
        dataset, f*, workers or GPUs, epochs, irregular, class, grace period, tenant, priority) is
        ALREADY_EXISTS, as for datasets and nodes.

        With `workers`, the job runs there from now on; with `gpus` instead, it waits for the policy to place
        it, which only a data manager that runs a policy does. `job_class` ("te" or "be") and `grace_seconds`
        are for the policy (FitGpp's trial-and-error and best-effort jobs, and how long a preempted job keeps
        its GPUs), as are `tenant` (a registered tenant, "" for none) and `priority` ("high" or "low": HiveD's
        regular and preemptible jobs)."""
        check_id("job_id", job_id)
        dataset = self.dataset("dataset_uri", dataset_uri)
        ideal = check_rate("ideal_bytes_per_sec", ideal_bytes_per_sec, positive=True)
        workers = (
            admission.checked_workers(self.state, workers)
            if not gpus
            else admission.checked_demand(workers, gpus, self.policy)
        )
        job = Job(
            job_id,
            dataset.uri,
            ideal,
            workers,
            epochs=check_epochs("epochs", epochs),
            irregular=irregular,
            gpus=gpus,
            job_class=check_job_class("job_class", job_class),
            grace_seconds=check_grace_seconds("grace_seconds", grace_seconds),
            tenant=self.tenant("tenant", tenant).name if tenant else "",
            priority=check_priority("priority", priority),
        )
        existing = self.state.jobs.get(job_id)
        if existing is not None:
            differences = existing.registration_differences(job)
            if differences:
                registered = ", ".join(f"{name} {job_parameter(existing, name)}" for name in differences)
                requested = ", ".join(f"{name} {job_parameter(job, name)}" for name in differences)
                raise AlreadyExists(
                    f"job_id: job {job_id!r} is registered with {registered}, not {requested}; "
                    "finish it first to register it anew"
                )
            return existing, False, await self._settled()
        for node_id in job.node_ids:
            admission.check_room_for(self.state, node_id, [dataset])
        # Submitted no earlier than any job before it: the submission order is the registration order, even
        # after a restart with the system clock stepped back (FIFO ranks by submit time).
        submitted = max(self.wall_clock(), self._latest_submit)
        self._latest_submit = submitted
        change = Change(jobs_put=(job,), histories_put=(lifecycle.registered(job, submitted),))
        revision = await self._commit(change, job.node_ids, f"registered job {describe_job(job)}")
        self._request_round(f"registered job {job_id}")
        return job, True, revision

    async def finish_job(self, job_id: str) -> int:
        job = self.job(job_id)
        change = Change(jobs_deleted=(job_id,), histories_deleted=(job_id,) if job_id in self.state.histories else ())
        revision = await self._commit(change, job.node_ids, f"finished job {job_id}")
        self.liveness.forget_job(job_id)
        self._request_round(f"finished job {job_id}")
        return revision

    async def _place(self, job_id: str, placement: Mapping[str, int]) -> int:
        """Run a job the policy places on `placement` (node -> GPUs; empty: stop it) from now on (`_place_all`)."""
        return await self._place_all({job_id: placement})

    async def _place_all(self, placements: Mapping[str, Mapping[str, int]]) -> int:
        """Run the jobs the policy places on their placements (node -> GPUs; empty: stop it) from now on, in one
        change. A node's free GPUs are counted without those of the jobs placed here, so jobs may trade GPUs in
        one call (one moves onto the GPUs another leaves as that one moves onto its), which one at a time would
        refuse in every order.

        Refused as a whole, naming what is wrong, for a job registered with its workers, a node that is not
        registered, unavailable (unless the job runs there already) or has not that many GPUs free for the
        policy, a placement that is not all of a job's GPUs, or a node without room for the cache quotas of the
        datasets new to it. A stop is never refused."""
        wanted = {
            job_id: admission.checked_placement(
                self.state, self.liveness, self.job(job_id), self.history(job_id), placement
            )
            for job_id, placement in placements.items()
        }
        admission.check_gpus_free(self.state, wanted)
        for node_id in sorted({node_id for nodes in wanted.values() for node_id in nodes}):
            uris = {self.state.jobs[job_id].dataset_uri for job_id, nodes in wanted.items() if node_id in nodes}
            admission.check_room_for(self.state, node_id, [self.state.datasets[uri] for uri in sorted(uris)])
        now = self.wall_clock()
        jobs_put: list[Job] = []
        histories_put: list[JobHistory] = []
        nodes: set[str] = set()
        summaries: list[str] = []
        for job_id, placement in wanted.items():
            job = self.state.jobs[job_id]
            if placement == lifecycle.placement_of(job):
                continue
            read_there = sum(self.liveness.run_bytes(n, job_id) for n in lifecycle.nodes_left(job, placement))
            updated, history = lifecycle.moved(job, self.history(job_id), placement, now, read_there)
            for node_id in lifecycle.nodes_joined(job, placement):
                self.liveness.start_run(node_id, job_id)
            jobs_put.append(updated)
            histories_put.append(history)
            nodes.update(job.node_ids, placement)
            verb = "preempted" if not placement else "placed"
            where = f" on {placement_text(placement)}" if placement else ""
            if history.suspending:
                where = f", suspending on {placement_text(history.held)} until {time_text(history.suspended_until)}"
            summaries.append(f"{verb} job {job_id}{where}")
        if not jobs_put:
            return await self._settled()
        change = Change(jobs_put=tuple(jobs_put), histories_put=tuple(histories_put))
        return await self._commit(change, sorted(nodes), "; ".join(summaries))

    def next_release(self) -> float | None:
        """When the first grace period still running ends (the wall clock), or now if one is to be re-dated
        (`grace.ends_too_late`); None if no job suspends."""
        return grace.next_release(self.state, self.wall_clock())

    async def _release_due(self) -> list[str]:
        """Release the GPUs of every suspending job whose grace period is over, and re-date to a whole grace
        period from now those that end later than that (`grace.ends_too_late`), in one change; the jobs released
        (none: nothing was released). Their decisions become PREEMPTED on WatchDecisions."""
        due, redated = grace.due_and_redated(self.state, self.wall_clock())
        if not due and not redated:
            return []
        if redated:
            log.warning(
                "the grace periods of jobs %s ended more than their whole length from now, as stamped by a clock "
                "ahead of this one (the system clock stepped back across a restart): each now ends its grace "
                "period from now",
                ", ".join(h.job_id for h in redated),
            )
        released = tuple(lifecycle.released(h) for h in due)
        await self._commit(Change(histories_put=(*released, *redated)), (), grace.release_description(due, redated))
        return [h.job_id for h in due]

    async def _hand_back(self, states: Mapping[str, Mapping[str, float]]) -> int | None:
        """Keep what the policy handed back per job (`Decision.job_states`) for its next snapshot, in one
        change; jobs no longer registered are skipped (they finished during the round). None: nothing changed."""
        histories = []
        for job_id, state in sorted(states.items()):
            if job_id in self.state.jobs:
                updated = lifecycle.with_policy_state(self.history(job_id), state, self.policy or "")
                if updated is not None:
                    histories.append(updated)
        if not histories:
            return None
        names = ", ".join(h.job_id for h in histories)
        return await self._commit(Change(histories_put=tuple(histories)), (), f"policy state of {names}")

    # ---- tenants ----

    async def register_tenant(
        self, name: str, cells: Mapping[str, int], cache_bytes: int = 0, io_bytes_per_sec: int = 0
    ) -> tuple[Tenant, bool, int]:
        """Register a tenant and its virtual cluster. Repeating a registration exactly is a no-op; another VC
        for a registered name is ALREADY_EXISTS (unregister it first, once its jobs have finished).

        The VC's level names must be the hierarchy's (INVALID_ARGUMENT); with the nodes known, all the VCs must
        fit them, and all the tenants' remote IO the limit (FAILED_PRECONDITION naming the level or the limit).
        Cache is not checked against the nodes' (a quota is per node, and nodes come and go)."""
        tenant = Tenant(
            check_id("name", name),
            check_cells("cells", cells),
            check_bytes("cache_bytes", cache_bytes),
            check_rate("io_bytes_per_sec", io_bytes_per_sec),
        )
        existing = self.state.tenants.get(name)
        if existing is not None:
            if not existing.same_registration(tenant):
                raise AlreadyExists(
                    f"name: tenant {name!r} is registered with {vc_text(existing)}, not {vc_text(tenant)}; "
                    "unregister it first (once its jobs have finished) to change its virtual cluster"
                )
            return existing, False, await self._settled()
        tenants.check_levels(tenant, self.cell_levels)
        others = [t for t in self.state.tenants.values() if t.name != name]
        tenants.check_vcs([*others, tenant], self.cell_levels, self.state.nodes.values())
        admission.check_io_reservations(self.remote_io_limit, tenant, others)
        change = Change(tenants_put=(tenant,))
        revision = await self._commit(change, (), f"registered tenant {name} ({vc_text(tenant)})")
        self._request_round(f"registered tenant {name}")
        return tenant, True, revision

    async def unregister_tenant(self, name: str) -> int:
        """Unregister a tenant; refused while it has jobs (registered jobs are unfinished ones)."""
        self.tenant("name", name)
        jobs = self.state.jobs_of_tenant(name)
        if jobs:
            raise FailedPrecondition(f"name: tenant {name!r} has unfinished jobs {jobs}; finish them first")
        revision = await self._commit(Change(tenants_deleted=(name,)), (), f"unregistered tenant {name}")
        self._request_round(f"unregistered tenant {name}")
        return revision

    # ---- nodes ----

    async def register_node(
        self,
        node_id: str,
        address: str,
        cache_capacity_bytes: int,
        gpus: int = 0,
        agent_id: str = "",
        peer: str = "",
    ) -> tuple[Node, bool, int]:
        """Register a node; `gpus` are those the policy may place jobs on (0: none), at most a node cell's of the
        cell levels (FAILED_PRECONDITION: no cell hierarchy could hold more). Refused (`NodeServedElsewhere`) for an
        `agent_id` other than that of the agent serving the node (`node_agents`; "": an agent older than agent ids),
        calling from gRPC `peer`."""
        node = Node(
            check_id("node_id", node_id),
            check_address("address", address),
            check_bytes("cache_capacity_bytes", cache_capacity_bytes),
            check_gpus("gpus", gpus, allow_zero=True),
        )
        self.node_agents.check(node_id, agent_id, peer)
        tenants.check_node_gpus(node, self.cell_levels)
        existing = self.state.nodes.get(node_id)
        if existing is not None and existing != node:
            raise AlreadyExists(
                f"node_id: node {node_id!r} is registered with address {existing.address}, capacity "
                f"{existing.cache_capacity_bytes} bytes and {existing.gpus} GPUs; unregister it first to change them"
            )
        self._note_contact(node_id)
        if existing is not None:
            return existing, False, await self._settled()
        summary = f"registered node {node_id} at {address} with {format_size(node.cache_capacity_bytes)} of cache"
        revision = await self._commit(Change(nodes_put=(node,)), (), summary)
        self._request_round(f"registered node {node_id}")
        return node, True, revision

    async def unregister_node(self, node_id: str, *, force: bool = False) -> int:
        """Unregister a node no job uses (FAILED_PRECONDITION naming the jobs otherwise, whatever `force`). One the
        tenants' VCs need (they fit the registered nodes with it, not without) is FAILED_PRECONDITION too, naming
        the tenants, the level and the ways on, unless `force`: the node may be gone for good or about to register
        again with another capacity, and only its operator knows; then this logs a WARNING naming the VCs and the
        level they no longer fit at. Last, a node still live is FAILED_PRECONDITION, whatever `force`
        (`_refuse_while_live`). These checks are here, not in a client, so that every client of the API keeps them;
        the VCs' comes before liveness so that an operator hears of them before stopping the node's agent (which
        already costs the VCs the node)."""
        self.node("node_id", node_id)
        users = sorted(self.state.jobs_on_node(node_id))
        if users:
            raise FailedPrecondition(f"node_id: node {node_id!r} runs workers of jobs {users}; finish them first")
        suspending = sorted(self.state.suspending_on(node_id))
        if suspending:
            raise FailedPrecondition(
                f"node_id: node {node_id!r} holds GPUs for jobs {suspending} through their grace period; "
                "wait for it to end, or finish them first"
            )
        lost = self._guarantee_lost(self.state.nodes, (node_id,))
        if lost is not None and not force:
            raise FailedPrecondition(
                f"node_id: without node {node_id!r} {lost.reason}, so {vcs_of(lost.tenants)} could no longer be "
                "guaranteed. Register a node in its place first, or shrink the VCs (silod tenant remove NAME once its "
                "jobs have finished, then silod tenant add NAME with fewer cells); or remove the node anyway with "
                "--force (UnregisterNode's force: to register it again with other parameters, say; the VCs fit again "
                "once it is back)"
            )
        self._refuse_while_live(node_id)
        revision = await self._commit(Change(nodes_deleted=(node_id,)), (), f"unregistered node {node_id}")
        self.liveness.forget(node_id)
        if lost is not None:
            log.warning(
                "node %s is unregistered by force, and without it %s: %s can no longer be guaranteed, and a job may "
                "find no free cell; register a node in its place, or shrink the VCs",
                node_id,
                lost.reason,
                vcs_of(lost.tenants),
                extra={"node_id": node_id},
            )
        return revision

    def _refuse_while_live(self, node_id: str) -> None:
        """FAILED_PRECONDITION while the node counts as live (`GetNode`'s `available`), whatever `force`: its agent
        may still run, and a running agent goes on serving a node this data manager no longer knows, and registers it
        again, with its own flags, the next time its watch reconnects; a removal it undoes is no removal, and the one
        meant by `force`, to register the node again with other flags, needs the agent stopped anyway. The data
        manager cannot tell a stopped agent from a running one until `node_timeout` has passed without a word from
        it (a node registered by a client that never reports is live until then too). Right after a start, a node
        not heard from since is live by the start's grace alone (`start_grace`): the refusal says so, rather than
        that its agent reported."""
        if not self.liveness.available(node_id):
            return
        since = self.liveness.seconds_since_seen(node_id)
        if self.liveness.in_start_grace(node_id):
            raise FailedPrecondition(
                f"node_id: the data manager restarted {since:.0f} s ago and counts node {node_id} as live for its "
                f"--node-timeout after a start ({self.node_timeout:g} s) although its agent has not reported since: "
                "remove the node once `silod status` shows it unavailable (stop its agent first if it runs: a running "
                "agent registers its node again)"
            )
        raise FailedPrecondition(
            f"node_id: node {node_id}'s agent reported {since:.0f} s ago: stop it first (a running agent registers "
            "its node again), then remove the node once the data manager marks it unavailable, --node-timeout after "
            f"its last report ({self.node_timeout:g} s; `silod status` shows it)"
        )

    async def watch(
        self, node_id: str, since_revision: int, history: int = 0, agent_id: str = "", peer: str = ""
    ) -> AsyncIterator[pb.WatchEvent]:
        """The node's events after `since_revision` of `history`, or a snapshot if that is 0, no longer in the log,
        or a revision of another history of the state (`StateStore.history`: a state dir restored or copied back,
        where the same number names other changes). The first event names this data manager's history, which the
        node sends back when it resumes (0, from a node that predates histories: the revision alone decides).

        While the stream is open, agent `agent_id` (at gRPC `peer`) serves the node: another agent's stream,
        registration or usage report for it is refused (`NodeServedElsewhere`), as this stream is if another agent
        serves the node now."""
        self.node("node_id", node_id)
        with self.node_agents.streaming(node_id, agent_id, peer), self.hub.subscribe(node_id) as subscription:
            self._note_contact(node_id)
            # No await between subscribing and reading the log or state: nothing can slip in between.
            logged = self._logged_events(node_id, since_revision, history) if since_revision else None
            if logged is None:
                snapshot = convert.snapshot_event(self.state.revision, self.state.node_view(node_id))
                await self._settled()  # never show a node state that is not yet on disk
                backlog = [snapshot]
            else:
                backlog = [pb.WatchEvent.FromString(payload) for payload in logged]
                if not backlog:  # nothing missed: say so, so the node knows it is connected and current
                    # At the durable revision: changes still being written arrive through the subscription.
                    backlog = [pb.WatchEvent(revision=self._durable_revision())]
            backlog[0].history = self._store.history
            last = since_revision
            for event in backlog:
                last = event.revision
                yield event
            async for event in events_after(subscription, last):
                yield event

    def _logged_events(self, node_id: str, since_revision: int, history: int) -> list[bytes] | None:
        """The node's events after `since_revision` of `history` from the log; None (a snapshot, taken from memory)
        if the log does not hold them, or if the disk fails the read: the node resyncs instead of waiting on it."""
        try:
            return self._store.events_since(node_id, since_revision, history)
        except StoreUnreadable as exc:
            log.warning(
                "node %s resumes from revision %d with a snapshot: the event log cannot be read (%s)",
                node_id,
                since_revision,
                exc,
                extra={"node_id": node_id},
            )
            return None

    async def watch_decisions(self) -> AsyncGenerator[pb.DecisionEvent, None]:
        """The policy's decisions for the jobs it places: all of them first, then each revision's changes."""
        if self.policy is None:
            raise FailedPrecondition(
                "WatchDecisions: no policy places jobs on this data manager (--policy external), so there are no "
                "decisions to follow; run it with a policy (--policy sjf, ...)"
            )
        with self.decision_hub.subscribe(DECISIONS) as subscription:
            # No await between subscribing and reading the state: nothing can slip in between.
            views = [self._decision_view(job_id) for job_id in sorted(self.state.jobs)]
            snapshot = convert.decision_event(self.state.revision, [v for v in views if v is not None], [], True)
            last = await self._settled()  # never show a decision that is not yet on disk
            yield snapshot
            async for event in events_after(subscription, last):
                yield event

    def _decision_view(self, job_id: str) -> lifecycle.DecisionView | None:
        job = self.state.jobs.get(job_id)
        return None if job is None else lifecycle.decision_view(job, self.history(job_id))

    def report_usage(
        self,
        node_id: str,
        datasets: Sequence[DatasetUsage],
        jobs: Sequence[JobUsage],
        agent_id: str = "",
        peer: str = "",
    ) -> None:
        """Keep the node's latest usage; refused (`NodeServedElsewhere`) from an agent other than the one serving it
        (the reporting one calls from gRPC `peer`)."""
        self.node("node_id", node_id)
        self.node_agents.check(node_id, agent_id, peer)
        if self.liveness.report(node_id, datasets, jobs, self.state.jobs):
            self._back(node_id)

    def nodes_awaiting_first_report(self) -> list[str]:
        """The nodes that run jobs and have not reported their usage since the start, while the start's grace lasts
        (`NodeLiveness.awaiting_first_report`): a policy deciding before they report would see their caches empty
        and their jobs where they stood when the usage was last heard of, the round before the restart at best."""
        return [
            node_id
            for node_id in sorted(self.state.nodes)
            if self.state.jobs_on_node(node_id) and self.liveness.awaiting_first_report(node_id)
        ]

    def _note_contact(self, node_id: str) -> None:
        if self.liveness.seen(node_id):
            self._back(node_id)

    def _back(self, node_id: str) -> None:
        log.info("node %s is available again", node_id, extra={"node_id": node_id})
        if self._guarantee_lost(self._available_nodes(), (node_id,)) is not None:
            log.info(
                "with node %s back, the tenants' VCs fit the available nodes again", node_id, extra={"node_id": node_id}
            )
        self._request_round(f"node {node_id} is available again")

    def expire_nodes(self) -> list[str]:
        """Mark nodes that stopped reporting unavailable (they stay registered). Nothing can refuse a node its
        silence, so when the tenants' VCs fitted with these nodes and do not without them, say once which VCs
        HiveD cannot guarantee until they return."""
        expired = self.liveness.expire()
        for node_id in expired:
            log.warning("node %s stopped reporting; marked unavailable", node_id, extra={"node_id": node_id})
        lost = self._guarantee_lost([*self._available_nodes(), *expired], expired) if expired else None
        if lost is not None:
            log.warning(
                "without %s, which stopped reporting, %s: %s cannot be guaranteed until %s, and a job may find no "
                "free cell meanwhile",
                ("node " if len(expired) == 1 else "nodes ") + ", ".join(expired),
                lost.reason,
                vcs_of(lost.tenants),
                "it returns" if len(expired) == 1 else "they return",
            )
        return expired

    def _available_nodes(self) -> list[str]:
        return [node_id for node_id in self.state.nodes if self.liveness.available(node_id)]

    def _guarantee_lost(self, node_ids: Collection[str], gone: Collection[str]) -> Infeasible | None:
        """Why the tenants' VCs would not fit the registered nodes `node_ids` without those `gone`, if they fit them
        with those (`tenants.guarantee_lost`)."""
        node_gpus = {node_id: self.state.nodes[node_id].gpus for node_id in node_ids if node_id in self.state.nodes}
        vcs = {name: tenant.cells for name, tenant in self.state.tenants.items()}
        return tenants.guarantee_lost(self.cell_levels, node_gpus, vcs, gone)

    # ---- the one way state changes ----

    async def _commit(self, change: Change, affected_nodes: Collection[str], description: str) -> int:
        """Apply `change` as the next revision now, and return once it is durable (`journal`).

        Changes are applied in memory at once, in call order, so the next call is validated against them;
        the journal writes them in batches and sends their watch events once they are on disk.
        """
        touched_jobs = {job.job_id for job in change.jobs_put}.union(change.jobs_deleted)
        before = {node_id: self.state.node_view(node_id, touched_jobs) for node_id in affected_nodes}
        decided = touched_jobs.union(h.job_id for h in change.histories_put)
        decided_before = {job_id: self._decision_view(job_id) for job_id in decided}
        undo = self.state.apply(change)
        self.state.revision += 1
        events = {}
        for node_id, old_view in before.items():
            changes = diff_views(old_view, self.state.node_view(node_id, touched_jobs))
            if changes:
                events[node_id] = convert.watch_event(self.state.revision, changes)
        revision = self.state.revision
        changed, finished = lifecycle.changed_decisions(
            decided_before, {job_id: self._decision_view(job_id) for job_id in decided}
        )
        on_durable = None
        if changed or finished:
            decisions = convert.decision_event(revision, changed, finished, False)
            on_durable = functools.partial(self.decision_hub.publish, DECISIONS, decisions)
        await self._journal.write(JournalEntry(revision, change, undo, events, description, on_durable=on_durable))
        return revision

    def _durable_revision(self) -> int:
        pending = self._journal.oldest_pending()
        return self.state.revision if pending is None else pending - 1

    async def _settled(self) -> int:
        """The current revision, once every change up to it is durable."""
        revision = self.state.revision
        await self._journal.settled()
        return revision

    def _roll_back(self, entries: Sequence[JournalEntry]) -> None:
        """Undo changes the journal could not write, newest first. None of them was acknowledged or sent to a
        node, so their revision numbers go to the next changes, as they would after a restart: the store's
        revision is the last durable one, and a node told it is current must never skip a change numbered as
        one it saw."""
        for entry in entries:
            self.state.apply(entry.undo)
        self.state.revision = entries[-1].revision - 1

    def end_watches(self) -> None:
        """End every watch stream, and refuse new ones (WatchClosed): the server is stopping, and streams it
        would otherwise cancel at the end of its grace period end now, each with a status that says why."""
        self.hub.close()
        self.decision_hub.close()

    async def close(self) -> None:
        """Wait for pending changes to be written (call before closing the store)."""
        await self._journal.close()


class PolicyAllocations:
    """The capability to allocate cache and remote IO on a data manager whose allocations a policy owns: the
    same checks and commits as `allocate_cache_size` and `allocate_remote_io`, minus the refusal. Only the
    manager creates it (`DataManager.policy_allocations`), so no caller can claim to be the policy."""

    __slots__ = ("_manager",)

    def __init__(self, manager: DataManager) -> None:
        self._manager = manager

    async def cache_size(self, dataset_uri: str, cache_size_bytes: int) -> tuple[Dataset, int]:
        return await self._manager._allocate_cache_size(dataset_uri, cache_size_bytes)

    async def remote_io(self, job_id: str, io_bytes_per_sec: int) -> tuple[Job, int]:
        return await self._manager._allocate_remote_io(job_id, io_bytes_per_sec)

    async def place(self, job_id: str, placement: Mapping[str, int]) -> int:
        return await self._manager._place(job_id, placement)

    async def place_all(self, placements: Mapping[str, Mapping[str, int]]) -> int:
        return await self._manager._place_all(placements)

    async def hand_back(self, states: Mapping[str, Mapping[str, float]]) -> int | None:
        return await self._manager._hand_back(states)

    async def release_due(self) -> list[str]:
        return await self._manager._release_due()
