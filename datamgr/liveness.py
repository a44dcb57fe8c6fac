"""Which nodes are reporting, and the usage they last reported.

This is soft state, kept in memory only: nodes report every few seconds, so a restarted data manager learns
it again within one report interval. Every known node starts with a full timeout of grace.

A node that reports a dataset it cannot open (`DatasetUsage.open_error`) is logged here, as a WARNING when the
failure first arrives and at INFO once a report no longer carries it: the node's agent logs why, but without this
the data manager would show the node's jobs running while they wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from silodlib.logfields import log_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DatasetUsage:
    """What one node last reported of a dataset's cache; `node_id` is filled in by `NodeLiveness`."""

    dataset_uri: str
    cached_bytes: int = 0
    cached_items: int = 0
    open_error: str = ""  # why the node cannot open the dataset, its jobs there waiting; "": it serves it
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

    def report(self, node_id: str, datasets: Sequence[DatasetUsage], jobs: Sequence[JobUsage]) -> bool:
        """Keep the node's latest usage, logging the datasets it newly cannot open and those it no longer reports
        so; True if the node was unavailable and is back."""
        record = self._nodes.setdefault(node_id, _NodeRecord(self._clock()))
        _log_open_errors(node_id, _open_errors(record.datasets), datasets)
        record.datasets, record.jobs = datasets, jobs
        self._unreported.discard(node_id)
        return self.seen(node_id)

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._unreported.discard(node_id)

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


def _open_errors(datasets: Iterable[DatasetUsage]) -> dict[str, str]:
    """The datasets a report says the node cannot open, with why."""
    return {usage.dataset_uri: usage.open_error for usage in datasets if usage.open_error}


def _log_open_errors(node_id: str, before: Mapping[str, str], datasets: Sequence[DatasetUsage]) -> None:
    """A WARNING for each dataset the node reports it cannot open that its last report did not (or for another
    reason), so that the operator hears of it once, not at every report; INFO for each it no longer reports so:
    opened, or no longer sent to the node."""
    now = _open_errors(datasets)
    for uri, reason in sorted(now.items()):
        if before.get(uri) != reason:
            log.warning(
                "node %s cannot open dataset %s, so its jobs there wait: %s",
                node_id,
                uri,
                reason,
                extra=log_ids(node_id=node_id, dataset_uri=uri),
            )
    reported = {usage.dataset_uri for usage in datasets}
    for uri in sorted(before.keys() - now.keys()):
        ids = log_ids(node_id=node_id, dataset_uri=uri)
        if uri in reported:
            log.info("node %s opened dataset %s: its jobs there run", node_id, uri, extra=ids)
        else:
            log.info("node %s no longer needs dataset %s, which it could not open", node_id, uri, extra=ids)
