"""The cluster's allocation state in memory, its indexes, and the per-node views pushed to nodes.

Pure: no I/O and no clock. The manager validates a request against this state, applies a `Change`, and
keeps the returned undo `Change` in case the store refuses to persist it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from datamgr.entities import Dataset, Job, JobHistory, Node, NodeJobView, NodeView, Tenant


@dataclass(frozen=True, slots=True)
class Change:
    """One accepted mutation, persisted atomically. A key is either put or deleted, never both."""

    datasets_put: tuple[Dataset, ...] = ()
    datasets_deleted: tuple[str, ...] = ()
    jobs_put: tuple[Job, ...] = ()
    jobs_deleted: tuple[str, ...] = ()
    nodes_put: tuple[Node, ...] = ()
    nodes_deleted: tuple[str, ...] = ()
    # The encoded manifest of a newly registered dataset; a deleted dataset's manifest goes with it.
    manifest: tuple[str, bytes] | None = None
    # Jobs' scheduling histories, keyed by job id: one is put with every job registered and deleted with it.
    histories_put: tuple[JobHistory, ...] = ()
    histories_deleted: tuple[str, ...] = ()
    tenants_put: tuple[Tenant, ...] = ()
    tenants_deleted: tuple[str, ...] = ()
    # The change retires a dataset's backend options (replaced or unregistered with it), which may be credentials: the
    # event log forgets every event before it, since those that set the dataset on a node carry them. A node further
    # behind resyncs from a snapshot, as one past the log's reach does.
    forgets_earlier_events: bool = False


@dataclass(frozen=True, slots=True)
class DatasetRemoved:
    uri: str


@dataclass(frozen=True, slots=True)
class JobRemoved:
    job_id: str


NodeChange = Dataset | NodeJobView | DatasetRemoved | JobRemoved
_Entity = TypeVar("_Entity", Dataset, Job, Node, JobHistory, Tenant)


class ClusterState:
    """Datasets, jobs, nodes and tenants at `revision`, indexed for the questions validation asks."""

    def __init__(
        self,
        revision: int = 0,
        datasets: Iterable[Dataset] = (),
        jobs: Iterable[Job] = (),
        nodes: Iterable[Node] = (),
        histories: Iterable[JobHistory] = (),
        tenants: Iterable[Tenant] = (),
    ) -> None:
        self.revision = revision
        self.datasets: dict[str, Dataset] = {}
        self.jobs: dict[str, Job] = {}
        self.nodes: dict[str, Node] = {}
        self.histories: dict[str, JobHistory] = {}
        self.tenants: dict[str, Tenant] = {}
        self.io_allocated_bytes_per_sec = 0
        self._jobs_by_node: defaultdict[str, set[str]] = defaultdict(set)
        self._jobs_by_dataset: defaultdict[str, set[str]] = defaultdict(set)
        self.apply(
            Change(
                datasets_put=tuple(datasets),
                jobs_put=tuple(jobs),
                nodes_put=tuple(nodes),
                histories_put=tuple(histories),
                tenants_put=tuple(tenants),
            )
        )

    # ---- queries ----

    def jobs_on_node(self, node_id: str) -> frozenset[str]:
        return frozenset(self._jobs_by_node.get(node_id, ()))

    def jobs_of_dataset(self, uri: str) -> frozenset[str]:
        return frozenset(self._jobs_by_dataset.get(uri, ()))

    def nodes_mounting(self, uri: str) -> frozenset[str]:
        """Nodes that run a worker of a job reading this dataset: the ones that enforce its quota."""
        return frozenset(node for job_id in self.jobs_of_dataset(uri) for node in self.jobs[job_id].node_ids)

    def jobs_of_tenant(self, name: str) -> list[str]:
        """The jobs that belong to a tenant, by id: a scan of the jobs, for the rare calls that ask of one tenant
        (unregistering it)."""
        return sorted(job_id for job_id, job in self.jobs.items() if job.tenant == name)

    def datasets_on_node(self, node_id: str) -> frozenset[str]:
        return frozenset(self.jobs[job_id].dataset_uri for job_id in self.jobs_on_node(node_id))

    def node_gpus_for_policy(self, node_id: str) -> int:
        """The GPUs of a node that the policy may place jobs on: its registered GPUs less the workers of jobs
        registered with their workers there (those hold GPUs the policy did not give out)."""
        return max(0, self.nodes[node_id].gpus - self.node_workers_registered(node_id))

    def node_workers_registered(self, node_id: str) -> int:
        """The workers on a node of jobs registered with their workers (not placed by the policy)."""
        return sum(
            w.count
            for job_id in self.jobs_on_node(node_id)
            if not self.jobs[job_id].placed_by_policy
            for w in self.jobs[job_id].workers
            if w.node_id == node_id
        )

    def node_gpus_placed(self, node_id: str, except_jobs: Collection[str] = ()) -> int:
        """The GPUs of a node that the policy has placed jobs on (but `except_jobs`)."""
        return sum(
            w.count
            for job_id in self.jobs_on_node(node_id)
            if job_id not in except_jobs and self.jobs[job_id].placed_by_policy
            for w in self.jobs[job_id].workers
            if w.node_id == node_id
        )

    def node_gpus_held(self, node_id: str) -> int:
        """The GPUs of a node that jobs suspending through their grace period still hold (`JobHistory.held`):
        taken, though no job is placed on them."""
        return sum(h.held.get(node_id, 0) for h in self.histories.values() if h.suspending)

    def suspending_on(self, node_id: str) -> frozenset[str]:
        """The jobs that hold GPUs of a node while they suspend."""
        return frozenset(job_id for job_id, h in self.histories.items() if h.suspending and node_id in h.held)

    def node_cache_allocated(self, node_id: str, datasets: Iterable[str] = ()) -> int:
        """Sum of the quotas a node must hold: its mounted datasets' plus any `datasets` it would gain."""
        uris = self.datasets_on_node(node_id) | set(datasets)
        return sum(self.datasets[uri].cache_quota_bytes for uri in uris)

    def node_view(self, node_id: str, only_jobs: Collection[str] | None = None) -> NodeView:
        """What `node_id` enforces. `only_jobs` narrows the job part to those ids (a change's diff needs
        no other jobs); the dataset part is always whole, since a dataset stays while any job reads it."""
        on_node = self._jobs_by_node.get(node_id, set())
        selected = on_node if only_jobs is None else on_node.intersection(only_jobs)
        jobs: dict[str, NodeJobView] = {}
        for job_id in sorted(selected):
            job = self.jobs[job_id]
            workers = sum(w.count for w in job.workers if w.node_id == node_id)
            jobs[job_id] = NodeJobView(job, workers, job.node_rates()[node_id])
        datasets = {uri: self.datasets[uri] for uri in sorted({self.jobs[j].dataset_uri for j in on_node})}
        return NodeView(datasets, jobs)

    # ---- mutation ----

    def apply(self, change: Change) -> Change:
        """Apply `change` in memory and return the change that undoes it."""
        undo_datasets = _restoring(self.datasets, [d.uri for d in change.datasets_put], change.datasets_deleted)
        undo_jobs = _restoring(self.jobs, [j.job_id for j in change.jobs_put], change.jobs_deleted)
        undo_nodes = _restoring(self.nodes, [n.node_id for n in change.nodes_put], change.nodes_deleted)
        undo_histories = _restoring(self.histories, [h.job_id for h in change.histories_put], change.histories_deleted)
        undo_tenants = _restoring(self.tenants, [t.name for t in change.tenants_put], change.tenants_deleted)
        undo = Change(*undo_datasets, *undo_jobs, *undo_nodes, None, *undo_histories, *undo_tenants)
        for name in change.tenants_deleted:
            del self.tenants[name]
        self.tenants.update((t.name, t) for t in change.tenants_put)
        for job_id in change.histories_deleted:
            del self.histories[job_id]
        self.histories.update((h.job_id, h) for h in change.histories_put)
        for job_id in change.jobs_deleted:
            self._unindex_job(self.jobs.pop(job_id))
        for uri in change.datasets_deleted:
            del self.datasets[uri]
        for node_id in change.nodes_deleted:
            del self.nodes[node_id]
        self.datasets.update((d.uri, d) for d in change.datasets_put)
        self.nodes.update((n.node_id, n) for n in change.nodes_put)
        for job in change.jobs_put:
            if job.job_id in self.jobs:
                self._unindex_job(self.jobs[job.job_id])
            self.jobs[job.job_id] = job
            self._index_job(job)
        return undo

    def _index_job(self, job: Job) -> None:
        for node_id in job.node_ids:
            self._jobs_by_node[node_id].add(job.job_id)
        self._jobs_by_dataset[job.dataset_uri].add(job.job_id)
        self.io_allocated_bytes_per_sec += job.io_bytes_per_sec

    def _unindex_job(self, job: Job) -> None:
        for node_id in job.node_ids:
            _discard(self._jobs_by_node, node_id, job.job_id)
        _discard(self._jobs_by_dataset, job.dataset_uri, job.job_id)
        self.io_allocated_bytes_per_sec -= job.io_bytes_per_sec


def _restoring(
    current: Mapping[str, _Entity], put_keys: Sequence[str], deleted_keys: Sequence[str]
) -> tuple[tuple[_Entity, ...], tuple[str, ...]]:
    """The puts and deletes that bring back `current` after `put_keys` are written and `deleted_keys` go."""
    puts = tuple(current[key] for key in (*deleted_keys, *put_keys) if key in current)
    deletes = tuple(key for key in put_keys if key not in current)
    return puts, deletes


def _discard(index: defaultdict[str, set[str]], key: str, value: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(value)
        if not members:
            del index[key]


def diff_views(before: NodeView, after: NodeView) -> list[NodeChange]:
    """The changes that turn a node's `before` view into `after`, in an order a node can apply
    one by one: datasets appear before the jobs that read them and disappear after them."""
    changes: list[NodeChange] = [
        dataset for uri, dataset in after.datasets.items() if before.datasets.get(uri) != dataset
    ]
    changes += [job for job_id, job in after.jobs.items() if before.jobs.get(job_id) != job]
    changes += [JobRemoved(job_id) for job_id in before.jobs if job_id not in after.jobs]
    changes += [DatasetRemoved(uri) for uri in before.datasets if uri not in after.datasets]
    return changes
