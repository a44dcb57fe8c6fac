"""200 allocate calls racing from 8 clients: the final state is the last accepted write per key, and a
node replaying every revision from its watch stream never sees a limit exceeded."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from datamgr.client import ClientError, DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import REMOTE_IO_LIMIT, RunningDataManager, make_local_dataset, watch

CLIENTS = 8
CALLS = 200
JOBS = 10
DATASETS = 4
NODE_CAPACITY = 60_000  # less than the datasets' total size (4 x 20,000), so quotas compete


@dataclass(frozen=True)
class Accepted:
    key: str
    value: int
    revision: int


def _caller(address: str, seed: int, uris: list[str]) -> tuple[list[Accepted], int]:
    """One client's share of the calls; returns the accepted writes and the number refused."""
    rng = random.Random(seed)
    accepted, refused = [], 0
    with DataManagerClient(address) as client:
        for _ in range(CALLS // CLIENTS):
            try:
                if rng.random() < 0.5:
                    job_id, rate = f"job{rng.randrange(JOBS)}", rng.randrange(0, 300_000_000)
                    reply = client.allocate_remote_io(job_id, rate)
                    accepted.append(Accepted(job_id, rate, reply.revision))
                else:
                    uri, size = rng.choice(uris), rng.randrange(0, 20_001)
                    cache = client.allocate_cache_size(uri, size)
                    accepted.append(Accepted(uri, size, cache.revision))
            except ClientError as exc:
                assert "FAILED_PRECONDITION" in str(exc), exc  # over a limit: the only acceptable refusal
                refused += 1
    return accepted, refused


def test_racing_allocations_end_in_the_last_accepted_writes_within_limits(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    client = datamgr.client
    client.register_node("n1", "h1:1", NODE_CAPACITY)
    uris = [make_local_dataset(tmp_path / f"ds{i}", files=10, size=2000) for i in range(DATASETS)]
    for uri in uris:
        client.register_dataset(uri)
    for j in range(JOBS):
        client.register_job(f"job{j}", uris[j % DATASETS], 100_000_000, [("n1", 1)])
    stream = watch(client, "n1")
    snapshot = stream.next()

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(_caller, [datamgr.address] * CLIENTS, range(CLIENTS), [uris] * CLIENTS))
    accepted = sorted((a for batch, _ in results for a in batch), key=lambda a: a.revision)
    assert len(accepted) + sum(refused for _, refused in results) == CALLS
    assert len(accepted) > CALLS // 4  # the race really happened

    last_write = {a.key: a.value for a in accepted}
    jobs = {j.job_id: j for j in client.call(client.stub.ListJobs, pb.ListJobsRequest()).jobs}
    datasets = {d.uri: d for d in client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets}
    for key, value in last_write.items():
        shown = jobs[key].io_bytes_per_sec if key in jobs else datasets[key].cache_quota_bytes
        assert shown == value, key

    # Replay the node's view revision by revision: every intermediate state respects both limits.
    rates = {j.job_id: j.io_bytes_per_sec for j in snapshot.snapshot.jobs}
    quotas = {d.uri: d.cache_quota_bytes for d in snapshot.snapshot.datasets}
    final_revision = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision
    revision = snapshot.revision
    while revision < final_revision:
        event = stream.next()
        assert event.revision > revision
        revision = event.revision
        for change in event.changes:
            if change.HasField("job_set"):
                rates[change.job_set.job_id] = change.job_set.io_bytes_per_sec
            else:
                quotas[change.dataset_set.uri] = change.dataset_set.cache_quota_bytes
        assert sum(rates.values()) <= REMOTE_IO_LIMIT, revision
        assert sum(quotas.values()) <= NODE_CAPACITY, revision
    assert rates == {job_id: job.io_bytes_per_sec for job_id, job in jobs.items()}
    assert quotas == {uri: d.cache_quota_bytes for uri, d in datasets.items()}
