"""Prometheus metrics of a node: cache, backend, throttle and per-job progress, read from the live mount.

A collector reads the mount state when scraped, on the mount's own trio loop, so the read path keeps plain
counters and pays nothing for metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from fuseclient.mounted import MountState
from silodlib.metrics_endpoint import MetricsEndpoint

Metric = CounterMetricFamily | GaugeMetricFamily | SummaryMetricFamily

# The label of per-job series: not `job`, which Prometheus sets to the scrape job's name, storing a target's own
# `job` as `exported_job` (with the default honor_labels: false), so a query by the documented label found nothing.
JOB_LABEL = "job_id"


def _family(kind: type[Metric], name: str, documentation: str, label: str) -> Any:
    """A metric family keyed by one label: "dataset" or JOB_LABEL."""
    return kind(name, documentation, labels=[label])


class MountMetrics(MetricsEndpoint, Collector):
    """Per dataset: cache bytes, items, quota, admissions, rejections, evictions, write errors, dropped and
    corrupt entries, backend reads and their latency. Per job: bytes read and from remote, hits, misses, items
    fetched again, throttle wait, rate, epoch, throughput. For the node: the open files' read buffers and their
    budget; `reconnects` (if given) counts the node agent's watch-stream reconnects."""

    def __init__(
        self, mount: MountState, token: trio.lowlevel.TrioToken, reconnects: Callable[[], int] | None = None
    ) -> None:
        super().__init__()
        self._mount = mount
        self._token = token  # the mount's trio loop, whose clock the throughput meters use
        self._reconnects = reconnects
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """Called on the scrape thread: the numbers are gathered on the mount's trio loop, in one consistent
        pass, since the state (and the throttle's clock) belong to it."""
        yield from trio.from_thread.run(self._families, trio_token=self._token)

    async def _families(self) -> list[Metric]:
        return [*self._datasets(), *self._jobs(), *self._read_buffers(), *self._agent()]

    def _read_buffers(self) -> Iterator[Metric]:
        stats = self._mount.read_buffers.statistics()
        yield GaugeMetricFamily(
            "silod_read_buffer_bytes",
            "Bytes of fetched items the cache did not admit that open files hold for their next reads",
            value=stats.held_bytes,
        )
        yield GaugeMetricFamily(
            "silod_read_buffer_budget_bytes", "The most bytes open files may hold so", value=stats.budget_bytes
        )

    def _agent(self) -> Iterator[Metric]:
        if self._reconnects is not None:
            yield CounterMetricFamily(
                "silod_watch_reconnects",
                "Times the allocation watch stream was re-established",
                value=self._reconnects(),
            )

    def _datasets(self) -> Iterator[Metric]:
        cached = _family(GaugeMetricFamily, "silod_cache_bytes", "Bytes in the dataset's cache on this node", "dataset")
        items = _family(GaugeMetricFamily, "silod_cache_items", "Items in the dataset's cache on this node", "dataset")
        quota = _family(
            GaugeMetricFamily, "silod_cache_quota_bytes", "The dataset's cache quota on this node", "dataset"
        )
        admitted = _family(
            CounterMetricFamily, "silod_cache_admitted_items", "Fetched items admitted to the cache", "dataset"
        )
        rejected = _family(
            CounterMetricFamily, "silod_cache_rejected_items", "Fetched items not admitted: quota full", "dataset"
        )
        evicted = _family(CounterMetricFamily, "silod_cache_evicted_items", "Items evicted by quota shrinks", "dataset")
        errors = _family(CounterMetricFamily, "silod_cache_write_errors", "Admissions that failed on disk", "dataset")
        dropped = _family(
            CounterMetricFamily,
            "silod_cache_dropped_items",
            "Cached items dropped because their file went missing, short, unreadable or corrupt",
            "dataset",
        )
        corrupt = _family(
            CounterMetricFamily,
            "silod_cache_corrupt_items",
            "Cached items dropped because their bytes failed their checksums (a failing cache disk)",
            "dataset",
        )
        fetched = _family(CounterMetricFamily, "silod_backend_bytes", "Bytes read from the storage backend", "dataset")
        latency = _family(
            SummaryMetricFamily, "silod_backend_read_seconds", "Backend reads and the time they took", "dataset"
        )
        for uri, dataset in self._mount.datasets.items():
            stats = dataset.cache.statistics()
            cached.add_metric([uri], stats.used_bytes)
            items.add_metric([uri], stats.cached_items)
            quota.add_metric([uri], stats.quota_bytes)
            admitted.add_metric([uri], stats.admitted)
            rejected.add_metric([uri], stats.rejected_full)
            evicted.add_metric([uri], stats.evicted)
            errors.add_metric([uri], stats.write_errors)
            dropped.add_metric([uri], stats.dropped)
            corrupt.add_metric([uri], stats.corrupt)
            fetched.add_metric([uri], dataset.fetch_bytes)
            latency.add_metric([uri], count_value=dataset.fetches, sum_value=dataset.fetch_seconds)
        yield from (cached, items, quota, admitted, rejected, evicted, errors, dropped, corrupt, fetched, latency)

    def _jobs(self) -> Iterator[Metric]:
        read = _family(CounterMetricFamily, "silod_job_read_bytes", "Bytes the job read through the mount", JOB_LABEL)
        remote = _family(
            CounterMetricFamily, "silod_job_remote_bytes", "Bytes fetched from the backend for the job", JOB_LABEL
        )
        hits = _family(
            CounterMetricFamily,
            "silod_job_cache_hits",
            "Item reads through an open served from the local cache, the item not fetched by that open",
            JOB_LABEL,
        )
        misses = _family(
            CounterMetricFamily,
            "silod_job_cache_misses",
            "Item reads through an open whose bytes came from storage, read-ahead included",
            JOB_LABEL,
        )
        refetched = _family(
            CounterMetricFamily,
            "silod_job_refetched_items",
            "Items fetched again because the read buffers' budget let go of their bytes before the reader was done",
            JOB_LABEL,
        )
        failed = _family(
            CounterMetricFamily, "silod_job_failed_reads", "Reads the backend failed (EIO, EACCES)", JOB_LABEL
        )
        denied = _family(
            CounterMetricFamily, "silod_job_denied_reads", "Reads storage refused: access denied (EACCES)", JOB_LABEL
        )
        waited = _family(
            CounterMetricFamily, "silod_job_throttle_wait_seconds", "Time reads waited for the throttle", JOB_LABEL
        )
        rate = _family(
            GaugeMetricFamily,
            "silod_job_remote_io_bytes_per_second",
            "The job's remote IO rate on this node: its throttle's, this node's share of the allocation",
            JOB_LABEL,
        )
        epoch = _family(GaugeMetricFamily, "silod_job_epoch", "The job's current epoch (1 = first pass)", JOB_LABEL)
        throughput = _family(
            GaugeMetricFamily, "silod_job_throughput_bytes_per_second", "Recent read throughput", JOB_LABEL
        )
        now = trio.current_time()
        for job_id, job in self._mount.jobs.items():
            read.add_metric([job_id], job.bytes_read)
            remote.add_metric([job_id], job.bytes_from_remote)
            hits.add_metric([job_id], job.cache_hits)
            misses.add_metric([job_id], job.cache_misses)
            refetched.add_metric([job_id], job.refetched_items)
            failed.add_metric([job_id], job.failed_reads)
            denied.add_metric([job_id], job.denied_reads)
            epoch.add_metric([job_id], job.tracker.epoch)
            throughput.add_metric([job_id], job.meter.rate(now))
            if job.bucket is not None:
                bucket = job.bucket.statistics()
                waited.add_metric([job_id], bucket.waited_seconds)
                rate.add_metric([job_id], bucket.rate_bytes_per_sec)
        yield from (read, remote, hits, misses, refetched, failed, denied, waited, rate, epoch, throughput)
