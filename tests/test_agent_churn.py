"""A node agent serving datasets that come and go keeps what the datasets it serves need, and nothing of those it
served before: found by a soak run, where an agent grew by a manifest (1.3 MB for 8,000 files) each time a dataset
was registered anew and left a cache directory behind for each dataset URI it had served.

A real data manager (in process, with its metrics, which count the manifests agents fetch), a real node agent and
FUSE mount, and file:// datasets."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from datamgr.client import DataManagerClient
from datamgr.devservers import free_port
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from fuseclient import cache_disk
from fuseclient.assembly import dataset_cache_dir, unserved_cache_dirs
from fuseclient.cache import DatasetCache, NoCache
from fuseclient.mounted import MountState
from fuseclient.node_datasets import NodeDatasets
from silodlib.backends import open_backend
from silodlib.manifest import freeze_listing
from silodpb.v1 import datamgr_pb2 as pb
from tests.cache_fixtures import hold_deletions
from tests.cluster_fixtures import eventually
from tests.datamgr_fixtures import make_local_dataset
from tests.disks import TmpfsFactory, fill_up
from tests.mount_fixtures import MountProcess
from tests.test_metrics import samples


@contextlib.contextmanager
def _running_cluster(tmp_path: Path) -> Iterator[tuple[DataManagerClient, MountProcess, int]]:
    """A data manager with metrics on the returned port, its client, and node n1's agent (its cache dir
    TMP_PATH/n1/cache), stopped on leaving."""
    port = free_port()
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 10**9, 30.0, metrics_port=port)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        agent = MountProcess.node(tmp_path / "n1", dm.address, "n1", "--cache-capacity", "1GiB").start()
        try:
            yield client, agent, port
        finally:
            agent.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[DataManagerClient, MountProcess, int]]:
    """`_running_cluster`, for the test."""
    with _running_cluster(tmp_path) as running:
        yield running


def _add_job(client: DataManagerClient, agent: MountProcess, uri: str, job_id: str) -> None:
    """Register `uri` with a cache quota and a job reading it on n1, and wait for the job's directory there."""
    client.register_dataset(uri)
    client.register_job(job_id, uri, 100_000_000, [("n1", 1)])
    client.allocate_remote_io(job_id, 100_000_000)
    client.allocate_cache_size(uri, 8000)
    eventually(lambda: agent.job_dir(job_id).is_dir(), what=f"{job_id}'s directory")


def _serve(client: DataManagerClient, agent: MountProcess, uri: str, job_id: str) -> None:
    """`_add_job`, then wait for the dataset's quota on n1, so that what the job reads is cached (the job's directory
    can come first)."""
    _add_job(client, agent, uri, job_id)
    eventually(lambda: agent.stats()["datasets"][uri]["quota_bytes"] == 8000, what=f"{uri}'s quota on n1")


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
        assert not directory.exists()  # renamed aside at once, then deleted by a thread
    eventually(lambda: not any(p.is_dir() for p in agent.cache_dir.iterdir()), what="the removed caches deleted")


@pytest.mark.expected_warnings  # the full disk: the cache that cannot be opened, the statistics that cannot be written
def test_a_dataset_served_uncached_and_no_longer_served_leaves_no_cache_directory(
    tmpfs: TmpfsFactory, tmp_path: Path
) -> None:
    """A dataset whose cache could not be opened (its disk full) is served uncached, and has a cache directory all the
    same: the opening made it before the disk refused its cache.json (or an earlier run left it). Once the dataset
    went, that directory stayed until the sweep after the agent's next snapshot (a restart or a reconnect, which may
    be days away); it goes at once now, as a cached dataset's does."""
    fill_up(tmpfs(tmp_path / "n1" / "cache", "4m"))  # n1's cache dir (`_running_cluster`)
    with _running_cluster(tmp_path) as (client, agent, _):
        uri = make_local_dataset(tmp_path / "ds")
        _add_job(client, agent, uri, "j1")
        assert (agent.job_dir("j1") / "d0" / "f000.bin").read_bytes() == bytes(1000)
        assert agent.log_lines("serving it from its backend, uncached")
        directory = dataset_cache_dir(agent.cache_dir, uri)
        assert directory.is_dir()
        _retire(client, agent, uri, "j1")
        assert not directory.exists()  # renamed aside at once; before: left until the next snapshot
        (removed,) = agent.log_lines("no longer served here")
        assert removed.endswith(
            f"{uri} is no longer served here (it was served uncached): its cache directory is being deleted"
        )
        eventually(lambda: not any(p.is_dir() for p in agent.cache_dir.iterdir()), what="the directory deleted")


@pytest.mark.expected_warnings  # the cache directory that cannot be opened, named
def test_a_cache_reopened_while_its_dataset_was_dropped_and_sent_again_is_closed_not_attached_slowness_faked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset served uncached (its cache directory could not be opened) gets its cache at the next report; if the
    quota changed meanwhile, the reopen sets it, an await during which the dataset can be dropped and sent again. The
    reopened cache went to the dropped dataset, open on the directory the new one's cache uses too: open files of the
    finished job admitted into it, uncounted. Faked: only the time the restore and the quota change take (slow disks),
    which a test cannot otherwise hold open."""
    data, cache_root = tmp_path / "data", tmp_path / "cache"
    for i, size in enumerate([1000, 2000, 3000]):
        (data / f"f{i}.bin").parent.mkdir(parents=True, exist_ok=True)
        (data / f"f{i}.bin").write_bytes(bytes([i]) * size)
    uri = f"file://{data}"
    manifest = freeze_listing(uri, open_backend(uri, {}).list(), 65536)

    def wanted(quota: int) -> pb.NodeDataset:
        return pb.NodeDataset(uri=uri, manifest_digest=manifest.digest, cache_quota_bytes=quota)

    restore, set_quota = cache_disk.restore, DatasetCache.set_quota
    slow = {"restore": 1, "set_quota": 1}  # the first of each takes long

    def slow_restore(*args: Any, **kwargs: Any) -> Any:
        if slow["restore"]:
            slow["restore"] -= 1
            time.sleep(0.3)
        return restore(*args, **kwargs)

    def slow_set_quota(cache: DatasetCache, quota: int) -> int:
        if slow["set_quota"]:
            slow["set_quota"] -= 1
            time.sleep(0.6)
        return set_quota(cache, quota)

    async def main() -> None:
        mount = MountState()
        opening: list[trio.Event] = []
        datasets = NodeDatasets(mount, cache_root, "n1", 0.2, lambda uri: opening[-1].set())

        async def send(quota: int) -> None:
            """Send the dataset (not served), and wait for it to open: its backend opens in the background."""
            opening.append(trio.Event())
            await datasets.set(wanted(quota), {manifest.digest: manifest})
            await opening[-1].wait()

        directory = dataset_cache_dir(cache_root, uri)
        cache_root.mkdir()
        directory.write_text("a file where the cache's directory goes")
        async with trio.open_nursery() as background:
            background.start_soon(datasets.run_opens)
            await send(100_000)
            dropped = mount.datasets[uri]
            assert isinstance(dropped.cache, NoCache)
            directory.unlink()
            monkeypatch.setattr(cache_disk, "restore", slow_restore)
            monkeypatch.setattr(DatasetCache, "set_quota", slow_set_quota)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(datasets.reopen_caches)
                await trio.sleep(0.1)  # the reopen restores
                await datasets.set(wanted(50_000), {manifest.digest: manifest})  # the quota changes meanwhile
                await trio.sleep(0.4)  # the reopen sets the new quota
                await datasets.remove(uri)  # the job finished: the dataset is dropped ...
                await send(50_000)  # ... and sent again for a new one
            background.cancel_scope.cancel()
        assert isinstance(dropped.cache, NoCache)  # before: the reopened cache, open on the new one's directory
        assert not dropped.cache.admit(2, (data / "f2.bin").read_bytes())
        assert isinstance(mount.datasets[uri].cache, DatasetCache)
        assert not any(directory.rglob("items/*/*"))

    trio.run(main)


def test_an_agent_deletes_the_caches_of_datasets_dropped_while_it_was_down_and_nothing_else(
    cluster: tuple[DataManagerClient, MountProcess, int], tmp_path: Path
) -> None:
    """Found while the agent was down, a dataset's drop reaches it only as its absence from the snapshot that a restart
    gets, and its cache kept its disk space for good. Kept: the caches of the datasets still served, and whatever else
    is in the cache dir that is not a cache (an operator's notes, a file of a cache's name, another user's)."""
    client, agent, _ = cluster
    kept, dropped = make_local_dataset(tmp_path / "kept"), make_local_dataset(tmp_path / "dropped")
    for job_id, uri in (("j1", kept), ("j2", dropped)):
        _serve(client, agent, uri, job_id)
        assert (agent.job_dir(job_id) / "d0" / "f000.bin").read_bytes() == bytes(1000)
        directory = dataset_cache_dir(agent.cache_dir, uri)
        eventually(lambda: any(directory.glob("items/*/*")), what="an item cached")  # noqa: B023  (called at once)
    agent.stop()
    client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j2"))
    client.call(client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=dropped))
    unfinished = agent.cache_dir / f"{'0' * 24}.removed-123-456"  # a deletion a killed agent did not finish
    (unfinished / "items" / "0").mkdir(parents=True)
    (unfinished / "items" / "0" / "1").write_bytes(b"x")
    notes, cache_named_file, other_users = (agent.cache_dir / name for name in ("notes", "f" * 24, "e" * 24))
    notes.mkdir()
    (notes / "README").write_text("the operator's")
    cache_named_file.write_text("not a directory")
    other_users.mkdir()
    os.chown(other_users, 65534, 65534)

    agent.start()
    eventually(lambda: agent.job_dir("j1").is_dir(), what="j1's directory after the restart")
    eventually(
        lambda: not dataset_cache_dir(agent.cache_dir, dropped).exists() and not unfinished.exists(),
        what="the dropped dataset's cache and the unfinished deletion gone",
    )
    assert any(dataset_cache_dir(agent.cache_dir, kept).glob("items/*/*"))
    assert (notes / "README").read_text() == "the operator's" and cache_named_file.is_file() and other_users.is_dir()
    assert len(agent.log_lines("deleting 2 directories in the cache dir")) == 1


def test_a_cache_the_sweep_deletes_is_set_aside_first_so_a_cache_opened_at_its_name_keeps_its_items_slowness_faked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep after a snapshot deleted a dropped dataset's cache where it lay, in a thread: the dataset sent again
    meanwhile opened its cache at that name, had its cache.json and items taken, and cached nothing until a restart
    ("its directory ... is gone"). Faked: only the time the deletion takes (40,000 items took 3 s)."""
    cache_root = tmp_path / "cache"
    cache_root.mkdir()
    uri = make_local_dataset(tmp_path / "ds")
    manifest = freeze_listing(uri, open_backend(uri, {}).list(), 65536)
    directory = dataset_cache_dir(cache_root, uri)
    old = DatasetCache(directory, manifest, 10_000, dataset_uri=uri)
    assert old.admit(0, bytes(1000))
    old.close()
    release = hold_deletions(monkeypatch)

    async def main() -> DatasetCache:
        datasets = NodeDatasets(MountState(), cache_root, "n1", 0.2, lambda uri: None)
        await datasets.delete_unserved_caches()  # a snapshot without the dataset: its cache goes
        return DatasetCache(directory, manifest, 10_000, dataset_uri=uri)  # and it is sent again at once

    new = trio.run(main)
    assert new.admit(1, bytes(1000))
    (aside,) = [path for path in cache_root.iterdir() if cache_disk.removed_directory_of(path.name) is not None]
    release.set()
    eventually(lambda: not aside.exists(), what="the old cache deleted")
    assert new.read(1, 0, 1000) == bytes(1000) and new.statistics().directory_lost is False
    new.close()


def test_a_cache_directory_gone_between_the_sweeps_listing_and_its_look_is_skipped_timing_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent died of the FileNotFoundError (its whole mount torn down): the sweep's own deletion threads, and other
    users' in a shared cache dir, remove directories between the listing and the look at each. Forced: the removal,
    made right after the listing names the directory."""
    cache_root = tmp_path / "cache"
    gone, kept = cache_root / f"{'a' * 24}.removed-1-2", cache_root / ("b" * 24)
    gone.mkdir(parents=True)
    kept.mkdir()
    listing = os.scandir

    @contextlib.contextmanager
    def removing_as_listed(path: str) -> Iterator[Iterator[os.DirEntry[str]]]:
        with listing(path) as entries:

            def listed() -> Iterator[os.DirEntry[str]]:
                for entry in entries:
                    if entry.name == gone.name:
                        gone.rmdir()
                    yield entry

            yield listed()

    monkeypatch.setattr(os, "scandir", removing_as_listed)
    assert unserved_cache_dirs(cache_root, []) == [str(kept)]
