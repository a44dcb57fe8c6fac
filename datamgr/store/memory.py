"""A `StateStore` in memory: the same contract as `SQLiteStore` except that nothing outlives the process.

For tests of what sits above the store, which then need no state dir, and for throwaway data managers; the
store conformance suite (tests/test_store.py) runs every contract test over both. A batch is applied to
copies and swapped in at the end, so a failing batch leaves nothing behind, as a rolled-back transaction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from datamgr.entities import Dataset, Job, JobHistory, Node, Tenant
from datamgr.state import Change
from datamgr.store.base import DEFAULT_RETAINED_REVISIONS, Commit, StoredState, in_history, new_history


class MemoryStore:
    def __init__(self, *, retained_revisions: int = DEFAULT_RETAINED_REVISIONS) -> None:
        self._revision = 0
        self._datasets: dict[str, Dataset] = {}
        self._manifests: dict[str, bytes] = {}
        self._jobs: dict[str, Job] = {}
        self._nodes: dict[str, Node] = {}
        self._histories: dict[str, JobHistory] = {}
        self._tenants: dict[str, Tenant] = {}
        self._events: dict[str, deque[tuple[int, bytes]]] = {}
        self._event_floor = 0  # the log holds every event after this revision
        self._retained = retained_revisions
        self.history = new_history()  # nothing outlives the store: it has no earlier history

    def load(self) -> StoredState:
        return StoredState(
            self._revision,
            tuple(self._datasets[uri] for uri in sorted(self._datasets)),
            tuple(self._jobs[job_id] for job_id in sorted(self._jobs)),
            tuple(self._nodes[node_id] for node_id in sorted(self._nodes)),
            tuple(self._histories[job_id] for job_id in sorted(self._histories)),
            tuple(self._tenants[name] for name in sorted(self._tenants)),
        )

    def commit(self, commits: Sequence[Commit]) -> None:
        datasets, manifests, jobs, nodes, histories, tenants = (
            dict(self._datasets),
            dict(self._manifests),
            dict(self._jobs),
            dict(self._nodes),
            dict(self._histories),
            dict(self._tenants),
        )
        new_events: list[tuple[str, int, bytes]] = []
        forget_up_to = self._event_floor
        for commit in commits:
            if commit.change.forgets_earlier_events:
                forget_up_to = commit.revision - 1
            _apply(commit.change, datasets, manifests, jobs, nodes, histories, tenants)
            for node_id, payload in commit.events:
                if not isinstance(payload, bytes):
                    raise TypeError(f"revision {commit.revision}: an event for {node_id} is not bytes")
                new_events.append((node_id, commit.revision, payload))
        self._datasets, self._manifests, self._jobs, self._nodes = datasets, manifests, jobs, nodes
        self._histories, self._tenants = histories, tenants
        for node_id, revision, payload in new_events:
            self._events.setdefault(node_id, deque()).append((revision, payload))
        self._revision = commits[-1].revision
        self._forget_events(max(forget_up_to, self._revision - self._retained))

    def _forget_events(self, floor: int) -> None:
        """Drop the events up to revision `floor`: the log's reach, or a change that retires options
        (`Change.forgets_earlier_events`)."""
        if floor <= self._event_floor:
            return
        for log in self._events.values():
            while log and log[0][0] <= floor:
                log.popleft()
        self._event_floor = floor

    def events_since(self, node_id: str, revision: int, history: int = 0) -> list[bytes] | None:
        if not (self._event_floor <= revision <= self._revision and in_history(history, revision, self.history, {})):
            return None
        return [payload for at, payload in self._events.get(node_id, ()) if at > revision]

    def manifest(self, dataset_uri: str) -> bytes:
        return self._manifests[dataset_uri]

    def close(self) -> None:
        return None


def _apply(
    change: Change,
    datasets: dict[str, Dataset],
    manifests: dict[str, bytes],
    jobs: dict[str, Job],
    nodes: dict[str, Node],
    histories: dict[str, JobHistory],
    tenants: dict[str, Tenant],
) -> None:
    for job_id in change.jobs_deleted:
        jobs.pop(job_id, None)
    for uri in change.datasets_deleted:
        datasets.pop(uri, None)
        manifests.pop(uri, None)
    for node_id in change.nodes_deleted:
        nodes.pop(node_id, None)
    datasets.update((dataset.uri, dataset) for dataset in change.datasets_put)
    if change.manifest is not None:
        uri, data = change.manifest
        manifests[uri] = data
    jobs.update((job.job_id, job) for job in change.jobs_put)
    nodes.update((node.node_id, node) for node in change.nodes_put)
    for job_id in change.histories_deleted:
        histories.pop(job_id, None)
    histories.update((history.job_id, history) for history in change.histories_put)
    for name in change.tenants_deleted:
        tenants.pop(name, None)
    tenants.update((tenant.name, tenant) for tenant in change.tenants_put)
