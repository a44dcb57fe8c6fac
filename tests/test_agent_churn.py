"""A node agent serving datasets that come and go keeps what the datasets it serves need, and nothing of those it
served before: found by a soak run, where an agent grew by a manifest (1.3 MB for 8,000 files) each time a dataset
was registered anew and left a cache directory behind for each dataset URI it had served.

A real data manager (in process, with its metrics, which count the manifests agents fetch), a real node agent and
FUSE mount, and file:// datasets."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.devservers import free_port
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from fuseclient.assembly import dataset_cache_dir
from silodpb.v1 import datamgr_pb2 as pb
from tests.cluster_fixtures import eventually
from tests.datamgr_fixtures import make_local_dataset
from tests.mount_fixtures import MountProcess
from tests.test_metrics import samples


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[DataManagerClient, MountProcess, int]]:
    """A data manager with metrics on the returned port, its client, and node n1's agent."""
    port = free_port()
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 10**9, 30.0, metrics_port=port)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        agent = MountProcess.node(tmp_path / "n1", dm.address, "n1", "--cache-capacity", "1GiB").start()
        try:
            yield client, agent, port
        finally:
            agent.stop()


def _serve(client: DataManagerClient, agent: MountProcess, uri: str, job_id: str) -> None:
    """Register `uri` and a job reading it on n1, and wait for the job's directory there."""
    client.register_dataset(uri)
    client.register_job(job_id, uri, 100_000_000, [("n1", 1)])
    client.allocate_remote_io(job_id, 100_000_000)
    client.allocate_cache_size(uri, 8000)
    eventually(lambda: agent.job_dir(job_id).is_dir(), what=f"{job_id}'s directory")


def _retire(client: DataManagerClient, agent: MountProcess, uri: str, job_id: str) -> None:
    """Finish the job and unregister its dataset, and wait for n1 to drop the dataset."""
    dropped = len(agent.log_lines("no longer served here"))
    client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id=job_id))
    client.call(client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=uri))
    eventually(lambda: len(agent.log_lines("no longer served here")) > dropped, what=f"n1 dropping {uri}")


def _manifests_fetched(port: int) -> float:
    scraped = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
    return scraped.get(("silod_rpc_requests_total", (("code", "OK"), ("method", "GetManifest"))), 0.0)


def test_an_agent_keeps_no_manifest_of_a_dataset_it_no_longer_serves(
    cluster: tuple[DataManagerClient, MountProcess, int], tmp_path: Path
) -> None:
    # The same directory registered again has the same manifest digest: an agent that kept the manifest of the
    # dataset it dropped would take it from memory; one that kept nothing fetches it again.
    client, agent, port = cluster
    uri = make_local_dataset(tmp_path / "ds")
    _serve(client, agent, uri, "j1")
    assert _manifests_fetched(port) == 1
    _retire(client, agent, uri, "j1")
    _serve(client, agent, uri, "j2")
    assert _manifests_fetched(port) == 2


def test_a_dataset_no_longer_served_leaves_no_cache_directory(
    cluster: tuple[DataManagerClient, MountProcess, int], tmp_path: Path
) -> None:
    client, agent, _ = cluster
    uris = [make_local_dataset(tmp_path / f"ds{i}") for i in range(3)]
    for i, uri in enumerate(uris):
        _serve(client, agent, uri, f"j{i}")
        directory = dataset_cache_dir(agent.cache_dir, uri)
        assert (agent.job_dir(f"j{i}") / "d0" / "f000.bin").read_bytes() == bytes(1000)  # cached as it is read
        eventually(lambda: any(directory.glob("items/*/*")), what="an item cached")  # noqa: B023  (called at once)
        _retire(client, agent, uri, f"j{i}")
        assert not directory.exists()
