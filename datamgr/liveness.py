"""Which nodes are reporting, and the usage they last reported.

This is soft state, kept in memory only: nodes report every few seconds, so a restarted data manager learns
it again within one report interval. Every known node starts with a full timeout of grace.

A node that reports a dataset it cannot open (`DatasetUsage.open_error`), or reads with its previous options because
it cannot open the ones last set (`options_error`), is logged here, as a WARNING when the failure first arrives and
at INFO once a report no longer carries it: the node's agent logs why, but without this the data manager would show
the node's jobs running while they wait, or reading with credentials that may be about to expire.

A node's agent counts what a job read there from when it mounted the job, and starts again from 0 when it mounts it
anew (the job resumed there after a preemption) or restarts. So each node's reads of a job are also added up here,
report by report (`read`): what its count grew by since the node's previous report, or all of it when that report
did not carry the job or carried a larger count (a new count). The data manager marks where each run of a job on a
node begins (`start_run`) and banks what the run read (`run_bytes`) when the job leaves the node
(`DataManager.bytes_read`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field, replace

from silodlib.logfields import log_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DatasetUsage:
    """What one node last reported of a dataset's cache; `node_id` is filled in by `NodeLiveness`."""

    dataset_uri: str
    cached_bytes: int = 0
    cached_items: int = 0
    open_error: str = ""  # why the node cannot open the dataset, its jobs there waiting; "": it serves it
    options_error: str = ""  # why it reads with its previous options, not the ones last set; "": with those
    node_id: str = ""


@dataclass(frozen=True, slots=True)
class JobUsage:
    """What one node last reported of a job: its reads, its place in its epochs and the cache it can still hit
    (`fuseclient.access`); `node_id` is filled in by `NodeLiveness`."""

    job_id: str
    bytes_read: int = 0
    bytes_from_remote: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    epoch: int = 0
    epoch_progress: float = 0.0
    throughput_bytes_per_sec: float = 0.0
    effective_cache_bytes: int = 0
    remote_demand_bytes_per_sec: float = 0.0
    failed_reads: int = 0  # reads the backend failed, of which `denied_reads` storage refused (access denied)
    denied_reads: int = 0
    node_id: str = ""


@dataclass(slots=True)
class _NodeRecord:
    last_seen: float
    available: bool = True
    heard: bool = False  # contact since the start: until then `last_seen` is the start, the grace's beginning
    datasets: Sequence[DatasetUsage] = ()
    jobs: Sequence[JobUsage] = ()
    read: dict[str, int] = field(default_factory=dict)  # job -> its reads here added up since the start (`_grown`)
    run_from: dict[str, int] = field(default_factory=dict)  # job -> `read` when its current run here began


class NodeLiveness:
    """Last contact and last usage report per node; a node silent for `timeout` seconds is unavailable."""

    def __init__(self, timeout: float, clock: Callable[[], float], node_ids: Iterable[str] = ()) -> None:
        self._timeout = timeout
        self._clock = clock
        self._started = clock()
        self._nodes = {node_id: _NodeRecord(self._started) for node_id in node_ids}
        self._unreported = set(self._nodes)  # registered at the start, no usage report from them since

    def seen(self, node_id: str) -> bool:
        """Record contact; True if the node was unavailable and is back."""
        record = self._nodes.setdefault(node_id, _NodeRecord(self._clock()))
        record.last_seen = self._clock()
        record.heard = True
        returned = not record.available
        record.available = True
        return returned

    def report(
        self, node_id: str, datasets: Sequence[DatasetUsage], jobs: Sequence[JobUsage], registered: Container[str]
    ) -> bool:
        """Keep the node's latest usage, logging the datasets it newly cannot open and those it no longer reports
        so, and add up what the `registered` jobs read there; True if the node was unavailable and is back. (A
        job not registered is one that finished, reported by a node that has not yet heard so.)"""
        record = self._nodes.setdefault(node_id, _NodeRecord(self._clock()))
        for failure in _FAILURES:
            failure.log_changes(node_id, record.datasets, datasets)
        before = {usage.job_id: usage.bytes_read for usage in record.jobs}
        for usage in jobs:
            if usage.job_id in registered:
                grown = _grown(before.get(usage.job_id), usage.bytes_read)
                record.read[usage.job_id] = record.read.get(usage.job_id, 0) + grown
        record.datasets, record.jobs = datasets, jobs
        self._unreported.discard(node_id)
        return self.seen(node_id)

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._unreported.discard(node_id)

    def start_run(self, node_id: str, job_id: str) -> None:
        """The job starts a run on the node: what the node reported of it before is another run's (one banked
        as the job left, or reports still in flight from then), not this one's."""
        record = self._nodes.get(node_id)
        if record is not None:
            record.run_from[job_id] = record.read.get(job_id, 0)

    def run_bytes(self, node_id: str, job_id: str) -> int:
        """What the node has reported the job reading in its current run there (since `start_run`, or since this
        data manager started: after a restart, a node's first report of a job counts whole)."""
        record = self._nodes.get(node_id)
        return 0 if record is None else record.read.get(job_id, 0) - record.run_from.get(job_id, 0)

    def forget_job(self, job_id: str) -> None:
        """The job finished: its reads are counted no more (a job registered again under its id starts at 0)."""
        for record in self._nodes.values():
            record.read.pop(job_id, None)
            record.run_from.pop(job_id, None)

    def awaiting_first_report(self, node_id: str) -> bool:
        """Whether the node was registered when the data manager started and has sent no usage report since, while
        the start's grace lasts (`timeout` from the start): until it reports, what its caches hold and how far its
        jobs got is unknown here, although the node is likely up and serving them."""
        return node_id in self._unreported and self._clock() - self._started <= self._timeout

    def expire(self) -> list[str]:
        """Mark nodes silent for longer than the timeout unavailable; return the ones that just became so."""
        now = self._clock()
        expired = [
            node_id
            for node_id, record in self._nodes.items()
            if record.available and now - record.last_seen > self._timeout
        ]
        for node_id in expired:
            self._nodes[node_id].available = False
        return expired

    def available(self, node_id: str) -> bool:
        record = self._nodes.get(node_id)
        return record is not None and record.available

    def in_start_grace(self, node_id: str) -> bool:
        """Whether the node is available only through the grace it got at the start: nothing heard from it since
        (its `seconds_since_seen` counts from the start, not from a report)."""
        record = self._nodes.get(node_id)
        return record is not None and record.available and not record.heard

    def seconds_since_seen(self, node_id: str) -> float:
        record = self._nodes.get(node_id)
        return 0.0 if record is None else self._clock() - record.last_seen

    def dataset_usage(self, uri: str) -> list[DatasetUsage]:
        return [
            replace(usage, node_id=node_id)
            for node_id, record in sorted(self._nodes.items())
            for usage in record.datasets
            if usage.dataset_uri == uri
        ]

    def job_usage(self, job_id: str) -> list[JobUsage]:
        return [
            replace(usage, node_id=node_id)
            for node_id, record in sorted(self._nodes.items())
            for usage in record.jobs
            if usage.job_id == job_id
        ]


def _grown(before: int | None, now: int) -> int:
    """What a node's count of a job's reads grew by since its previous report (`before`: None if that report did not
    carry the job): all of `now` when it is a new count, started at 0 since that report, as one that did not carry
    the job or carried more says (the node mounted the job anew: a resumption, its agent restarted). A new count
    that overtook the old one within a report interval is taken for the old one grown: what the old one held then
    is lost, at most what the job reads in that interval."""
    return now if before is None or now < before else now - before


@dataclass(frozen=True)
class _Failure:
    """A kind of failure a node reports per dataset (a `DatasetUsage` field), and the lines that log it: `warning`
    (node, dataset, reason) when a report first carries it or another reason, `cleared` (node, dataset) once the
    dataset is reported without it, `gone` (node, dataset) once the dataset is not reported at all."""

    field: str
    warning: str
    cleared: str
    gone: str

    def reasons(self, datasets: Iterable[DatasetUsage]) -> dict[str, str]:
        return {u.dataset_uri: getattr(u, self.field) for u in datasets if getattr(u, self.field)}

    def log_changes(self, node_id: str, before: Iterable[DatasetUsage], after: Sequence[DatasetUsage]) -> None:
        """One WARNING per failure that is new since the node's last report, so that the operator hears of it once,
        not at every report; one INFO per failure that went."""
        was, now = self.reasons(before), self.reasons(after)
        for uri, reason in sorted(now.items()):
            if was.get(uri) != reason:
                log.warning(self.warning, node_id, uri, reason, extra=log_ids(node_id=node_id, dataset_uri=uri))
        reported = {usage.dataset_uri for usage in after}
        for uri in sorted(was.keys() - now.keys()):
            line = self.cleared if uri in reported else self.gone
            log.info(line, node_id, uri, extra=log_ids(node_id=node_id, dataset_uri=uri))


_FAILURES = (
    _Failure(
        "open_error",
        "node %s cannot open dataset %s, so its jobs there wait: %s",
        "node %s opened dataset %s: its jobs there run",
        "node %s no longer needs dataset %s, which it could not open",
    ),
    _Failure(
        "options_error",
        "node %s reads dataset %s with its previous options, since it cannot open the ones last set: %s",
        "node %s reads dataset %s with the options last set",
        "node %s no longer needs dataset %s, which it read with its previous options",
    ),
)
