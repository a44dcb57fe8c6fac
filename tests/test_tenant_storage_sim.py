"""The shared-cache anomaly between tenants, in the simulator, and its absence under `hived-silod`.

Two tenants share two 4-GPU nodes, each guaranteed one node, 100 GB of the 200 GB cache and 200 of the
400 MB/s of remote IO. Tenant a trains four jobs in a row on one 60 GB dataset, five epochs each, on its whole
node at f* = 200 MB/s: its dataset fits its cache reservation and its f* its remote IO reservation, so on its
own share it runs compute-bound once the first epoch has cached the dataset. Tenant b scans: eight one-GPU jobs,
arriving 250 s apart, each reading its own 400 GB dataset once at up to 200 MB/s, so b always wants more remote
IO than the cluster has and its datasets are twice the whole cache.

Under `hived` with the `alluxio` cache system (one LRU pool for everyone, remote IO shared fairly among jobs) b's
scans push a's chunks out of the pool between a's epochs, a reads them again from remote storage at a fair
share of the IO, and its jobs take longer than when a is alone. Under `hived-silod` a's share is its own: its
hit ratio and every job's completion time are those of a alone. Both runs use `overflow = false` so that a,
alone, does not spread its queued jobs onto b's idle node (HiveD's compute lending, not what is tested here):
"a alone" is then exactly a on its own share.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import pytest

from datamgr.scheduler.registry import build_scheduler
from datamgr.scheduler.sim.cluster import with_tenants
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, SimConfig, SimResult, TraceJob
from datamgr.scheduler.tenancy import TenantShare

MB = 10**6
GB = 10**9

RESERVED_CACHE = 100 * GB
RESERVED_IO = 200 * MB
CLUSTER = with_tenants(
    ClusterSpec(nodes=2, gpus_per_node=4, cache_bytes_per_node=100 * GB, remote_io_bytes_per_sec=400 * MB),
    {
        "a": TenantShare({"node": 1}, RESERVED_CACHE, RESERVED_IO),
        "b": TenantShare({"node": 1}, RESERVED_CACHE, RESERVED_IO),
    },
    "the anomaly's cluster",
)
A_EPOCHS = 5
# a trains repeatedly on one dataset that fits its cache reservation, at an f* its remote IO reservation covers
TRAINING = [
    TraceJob(f"a-{i}", 0.0, 4, "resnet", 200 * MB, "s3://a/train", 60 * GB, A_EPOCHS, tenant="a") for i in range(4)
]
# b streams datasets twice the whole cache, always wanting more remote IO than there is
SCANS = [
    TraceJob(f"b-{i}", 250.0 * i, 1, "scan", 200 * MB, f"s3://b/stream-{i}", 400 * GB, 1, tenant="b") for i in range(8)
]


def run(trace: Sequence[TraceJob], policy: str, cache_system: str, log: io.StringIO | None = None) -> SimResult:
    scheduler = build_scheduler(policy, cache_system, {"overflow": "false"})
    return simulate(trace, CLUSTER, scheduler, SimConfig(), decision_log=log)


def of_tenant(result: SimResult, tenant: str) -> dict[str, JobOutcome]:
    assert not result.unfinished
    return {job.job_id: job for job in result.jobs if job.tenant == tenant}


def hit_ratio(jobs: dict[str, JobOutcome]) -> float:
    return sum(job.hit_bytes for job in jobs.values()) / sum(job.bytes_read for job in jobs.values())


def average_jct(jobs: dict[str, JobOutcome]) -> float:
    return sum(job.jct for job in jobs.values()) / len(jobs)


def test_one_shared_lru_cache_lets_one_tenants_scans_thrash_anothers_hits() -> None:
    alone = of_tenant(run(TRAINING, "hived", "alluxio"), "a")
    shared = run(TRAINING + SCANS, "hived", "alluxio")
    a = of_tenant(shared, "a")
    # alone, the pool keeps a's dataset: every epoch but the very first hits it whole
    assert hit_ratio(alone) == pytest.approx(1 - 1 / (A_EPOCHS * len(TRAINING)))
    assert all(job.hit_bytes == 0 for job in of_tenant(shared, "b").values())  # scans never hit
    # shared, b's scans evict a's chunks between a's epochs: a loses over a quarter of its hits ...
    assert hit_ratio(a) < 0.75 * hit_ratio(alone)
    # ... reads them again at a fair share of the remote IO, and its jobs take over a fifth longer
    assert average_jct(a) > 1.2 * average_jct(alone)
    assert all(a[job_id].jct > alone[job_id].jct for job_id in alone)


def test_under_hived_silod_a_tenants_hits_and_completion_times_are_those_it_has_alone() -> None:
    """a's demand fits its reservations, so its storage share is the same whether b scans or not: b's presence
    changes only how often rounds fall, which splits a's progress into more steps of the same rates. So the
    tolerance is float rounding (a relative 1e-9; the runs measured equal to the last bit)."""
    alone = of_tenant(run(TRAINING, "hived-silod", "silod"), "a")
    shared = run(TRAINING + SCANS, "hived-silod", "silod")
    a = of_tenant(shared, "a")
    assert hit_ratio(a) == pytest.approx(hit_ratio(alone), rel=1e-9)
    for job_id, job in alone.items():
        assert a[job_id].jct == pytest.approx(job.jct, rel=1e-9)
        assert a[job_id].hit_bytes == pytest.approx(job.hit_bytes, rel=1e-9)
    # ... and the anomaly is gone: better than under the shared LRU cache on both counts
    lru = of_tenant(run(TRAINING + SCANS, "hived", "alluxio"), "a")
    assert hit_ratio(a) > hit_ratio(lru) and average_jct(a) < average_jct(lru)
    # b borrowed what a left idle: on its reserved remote IO alone its scans could not have finished so early
    scans = of_tenant(shared, "b")
    assert max(job.finish for job in scans.values()) < sum(job.bytes_read for job in scans.values()) / RESERVED_IO


def test_a_lent_reservation_is_taken_back_the_round_its_owner_arrives() -> None:
    """b borrows a's idle cache; when a's job arrives, the round that starts it shrinks b's quota (evicting b's
    cached bytes uniformly down to it) and a runs as it would alone."""
    arrival = 2000.0
    late = [TraceJob("a-late", arrival, 4, "resnet", 200 * MB, "s3://a/train", 60 * GB, A_EPOCHS, tenant="a")]
    log = io.StringIO()
    shared = of_tenant(run(late + SCANS, "hived-silod", "silod", log), "a")["a-late"]
    alone = of_tenant(run(late, "hived-silod", "silod"), "a")["a-late"]
    assert shared.jct == pytest.approx(alone.jct, rel=1e-9)
    assert shared.hit_bytes == pytest.approx(alone.hit_bytes, rel=1e-9)
    rounds = [json.loads(line) for line in log.getvalue().splitlines()]
    before = [r for r in rounds if r["time"] < arrival][-1]
    at = next(r for r in rounds if r["time"] == arrival)

    def b_cache(record: dict[str, dict[str, float]], key: str) -> float:
        return sum(amount for uri, amount in record[key].items() if uri.startswith("s3://b/"))

    assert b_cache(before, "cache_quota_bytes") > RESERVED_CACHE  # b holds a's idle reservation ...
    assert b_cache(before, "cached_bytes") > CLUSTER.total_cache_bytes - 60 * GB  # ... and has filled it
    assert at["cache_quota_bytes"]["s3://a/train"] == 60 * GB  # a's reservation covers its dataset: it gets it
    assert b_cache(at, "cache_quota_bytes") == CLUSTER.total_cache_bytes - 60 * GB
    assert b_cache(at, "cached_bytes") <= b_cache(at, "cache_quota_bytes")  # evicted down to the new quota
