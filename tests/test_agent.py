"""The whole system in separate processes: a data manager, node agents with real mounts, and real storage.
Allocations made with `silod alloc` are enforced on the nodes within a second, and the system survives
either daemon being killed."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from fuseclient.assembly import dataset_cache_dir
from silodpb.v1 import datamgr_pb2 as pb
from tests.cache_fixtures import entries_on_disk
from tests.cluster_fixtures import FILES, SIZE, System, eventually
from tests.datamgr_fixtures import DataManagerProcess, make_local_dataset, silod_cli
from tests.disks import TmpfsFactory, fill_up
from tests.mount_fixtures import MountProcess


def _cached_bytes(node: MountProcess) -> int:
    return sum(entries_on_disk(node.cache_dir).values())


def test_jobs_registered_with_the_cli_appear_on_their_node_and_go_when_finished(system: System) -> None:
    node = system.start_node("n1")
    address = system.datamgr.address
    assert silod_cli("dataset", "add", system.uri, datamgr=address).returncode == 0
    added = silod_cli(
        "job", "add", "j1", "--dataset", system.uri, "--ideal-rate", "100MB/s", "--worker", "n1", datamgr=address
    )
    assert added.returncode == 0, added.stderr
    assert silod_cli("alloc", "io", "j1", "50MB/s", datamgr=address).returncode == 0
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data

    open_file = (job_dir / "c0/f000.bin").open("rb")
    assert silod_cli("job", "finish", "j1", datamgr=address).returncode == 0
    eventually(lambda: not node.job_dir("j1").exists(), what="job directory removed")
    assert os.listdir(node.mountpoint) == []
    with pytest.raises(OSError) as raised:  # uncached (no quota): the job has no remote IO left to read with
        open_file.read()
    assert raised.value.errno == errno.EIO
    open_file.close()

    usage = system.client.call(system.client.stub.GetNode, pb.GetNodeRequest(node_id="n1"))
    assert usage.available


def _job_on_n1(system: System) -> tuple[MountProcess, Path]:
    """Node n1 running job j1 with a quota for its whole dataset; the node and the job's directory there."""
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_cache_size(system.uri, FILES * SIZE)
    system.client.allocate_remote_io("j1", 40_000_000)
    return node, eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")


def _job_read_once_into_a_full_cache(system: System) -> MountProcess:
    """Node n1 running job j1, whose whole dataset has been read once and is now cached."""
    node, job_dir = _job_on_n1(system)
    for path in system.files:
        (job_dir / path).read_bytes()
    eventually(lambda: _cached_bytes(node) == FILES * SIZE, what="cache filled")
    return node


@pytest.mark.expected_warnings  # the cache that cannot be opened, the stats file that cannot be written
def test_a_dataset_whose_cache_cannot_be_opened_is_served_uncached_and_cached_once_the_disk_has_room(
    tmpfs: TmpfsFactory, system: System, tmp_path: Path
) -> None:
    """A node's cache disk full when a dataset arrives: the job's directory appears all the same and reads the
    backend's bytes, uncached (it used to be missing: "this node cannot serve"); once the disk has room again the
    agent opens the cache on its next report and the dataset is cached as its quota allows."""
    filler = fill_up(tmpfs(tmp_path / "n1" / "cache", "4m"))  # the node's cache dir (`MountProcess.node`); 2 MB data
    node, job_dir = _job_on_n1(system)
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    assert node.log_lines("serving it from its backend, uncached") and not node.log_lines("cannot serve")
    assert _cached_bytes(node) == 0

    filler.unlink()
    eventually(lambda: node.log_lines("opened: caching it again"), what="the cache opened")
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    eventually(lambda: _cached_bytes(node) == FILES * SIZE, what="the dataset cached")
    stats = node.wait_for_stats(lambda s: s["datasets"][system.uri]["cached_items"] == FILES)
    assert not stats["datasets"][system.uri]["directory_lost"]


@pytest.mark.expected_warnings  # the cache that cannot be opened, the stats file that cannot be written
def test_a_cache_of_an_older_format_on_a_full_disk_says_once_that_it_drops_its_items_not_at_every_try(
    tmpfs: TmpfsFactory, system: System, tmp_path: Path
) -> None:
    """A node upgraded (its cache format changed) while its cache disk is full: opening the dataset's cache drops the
    items of the old format, then cannot write the new cache.json, so the dataset is served uncached and its cache
    tried again at every report and every change of the dataset. Each try said again that it dropped the items
    (every 5 s by default, for as long as the disk stayed full), though they went at the first. Once the disk has
    room the cache opens, says so, and fills."""
    disk = tmpfs(tmp_path / "n1" / "cache", "4m")  # the node's cache dir (`MountProcess.node`); 2 MB data
    node = _job_read_once_into_a_full_cache(system)
    node.stop()
    metadata = dataset_cache_dir(disk, system.uri) / "cache.json"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "format": "silod-cache/2"}))  # an older silod's
    for entry in (metadata.parent / "items").rglob("*"):  # emptied, so that dropping them frees no room: the disk
        if entry.is_file():  # stays full until the test frees it, however soon their deletion starts
            entry.write_bytes(b"")
    (disk / "stats.json").unlink()  # which the agent deletes as it starts: the new cache.json would take its room
    filler = fill_up(disk)
    node.start()
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory")
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    assert node.log_lines("serving it from its backend, uncached")
    # Tried again at each quota change (besides each report): by the time the job registered after it has its
    # directory, the change has applied, and the try with it.
    for quota, job_id in ((FILES * SIZE // 2, "j2"), (FILES * SIZE, "j3")):
        system.client.allocate_cache_size(system.uri, quota)
        system.client.register_job(job_id, system.uri, 100_000_000, [("n1", 1)])
        eventually(lambda: node.job_dir(job_id).is_dir(), what=f"{job_id}'s directory")  # noqa: B023  (called at once)
    dropping = "was written for another manifest or format (or is unreadable), dropping its items"
    assert len(node.log_lines(dropping)) == 1  # before: one a try

    filler.unlink()
    eventually(lambda: node.log_lines("opened: caching it again"), what="the cache opened")
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    eventually(lambda: _cached_bytes(node) == FILES * SIZE, what="the dataset cached again")
    assert len(node.log_lines(dropping)) == 1 and len(node.log_lines("cannot open the cache of dataset")) == 1


def test_allocations_are_enforced_on_the_node(system: System) -> None:
    # How fast they arrive is measured by bench/control_plane.py (watch propagation delay), not asserted here.
    node = _job_read_once_into_a_full_cache(system)

    system.client.allocate_remote_io("j1", 7_000_000)
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 7_000_000, what="rate change on the node")
    quota = FILES * SIZE // 4
    system.client.allocate_cache_size(system.uri, quota)
    eventually(lambda: _cached_bytes(node) <= quota, what="quota shrink evicting")
    assert _cached_bytes(node) > quota - SIZE  # evicted down to the quota, not emptied

    def reported_epoch() -> Sequence[pb.JobUsage] | None:
        # The agent reports every half second: a report taken while the epoch was being read shows part of it,
        # and the data manager keeps the last one it got, so wait for one taken after the reads.
        usage = system.client.call(system.client.stub.GetJob, pb.GetJobRequest(job_id="j1")).usage
        return usage if usage and usage[0].bytes_read >= FILES * SIZE else None

    usage = eventually(reported_epoch, what="a usage report covering the epoch read")
    assert usage[0].node_id == "n1" and usage[0].bytes_read >= FILES * SIZE


def test_a_nodes_usage_reports_count_each_item_a_pass_reads_once_a_miss_when_cold_and_a_hit_when_warm(
    system: System, tmp_path: Path
) -> None:
    # Counted per kernel request, a cold pass of chunked files into a cache that held them reached the data manager
    # as mostly hits: the chunk the open's read-ahead fetched was in the cache when the reader got there.
    chunk, files = 1 << 20, 2
    rng = random.Random(7)
    for name in ("a.bin", "b.bin"):
        (tmp_path / "chunked" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "chunked" / name).write_bytes(rng.randbytes(4 * chunk))
    uri, items = f"file://{tmp_path / 'chunked'}", files * 4
    node = system.start_node("n1")
    system.client.register_dataset(uri, chunk_size=chunk)
    system.client.register_job("j1", uri, 100_000_000, [("n1", 1)])
    system.client.allocate_cache_size(uri, items * chunk)
    system.client.allocate_remote_io("j1", 400_000_000)
    eventually(lambda: node.stats()["datasets"][uri]["quota_bytes"] == items * chunk, what="the quota on the node")
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")

    def reported_after(passes: int) -> tuple[int, int]:
        for path in sorted(job_dir.iterdir()):
            with path.open("rb", buffering=0) as file:
                while file.read(128 * 1024):
                    pass

        def report() -> pb.JobUsage | None:
            usage = system.client.call(system.client.stub.GetJob, pb.GetJobRequest(job_id="j1")).usage
            return usage[0] if usage and usage[0].bytes_read == passes * items * chunk else None

        usage = eventually(report, what=f"a usage report covering pass {passes}")
        return usage.cache_hits, usage.cache_misses

    assert reported_after(passes=1) == (0, items)
    assert reported_after(passes=2) == (items, items)


def test_a_quota_shrink_logs_one_line_with_the_new_quota_and_the_items_it_evicted(system: System) -> None:
    # The cache and the node agent each logged the eviction: two lines for one change, one without the node's id.
    node = _job_read_once_into_a_full_cache(system)
    quota = FILES * SIZE // 4
    system.client.allocate_cache_size(system.uri, quota)
    applied = f"cache quota of {system.uri} = {quota} bytes ("
    eventually(lambda: node.log_lines(applied), what="the quota shrink applied")
    evicted = node.wait_for_stats(lambda s: s["datasets"][system.uri]["quota_bytes"] == quota)["datasets"][system.uri]
    assert evicted["evicted"] > 0
    shrink = [line.split(" INFO ")[-1] for line in node.log_lines("evicted") if f" {quota} bytes" in line]
    assert shrink == [f"fuseclient.node_datasets: {applied}{evicted['evicted']} items evicted)"]


@pytest.mark.expected_warnings
def test_the_node_keeps_its_allocations_while_the_data_manager_is_down_and_resyncs(system: System) -> None:
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 30_000_000)
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000, what="rate")

    system.datamgr.kill()
    for path, data in system.files.items():  # uncached reads, still under the last rate
        assert (job_dir / path).read_bytes() == data
    assert system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000
    lost = eventually(
        lambda: node.log_lines("lost the data manager"),
        what="the agent noticing the outage",
    )
    assert "TLS" not in lost[0] and "tls" not in lost[0]  # a crash, not a setting to fix: no TLS advice

    system.datamgr.start()
    client = DataManagerClient(system.datamgr.address, timeout=10)
    assert client.call(client.stub.GetJob, pb.GetJobRequest(job_id="j1")).io_bytes_per_sec == 30_000_000
    client.allocate_remote_io("j1", 9_000_000)
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 9_000_000, what="rate after restart")
    client.close()


def test_a_data_manager_restored_from_an_older_state_dir_brings_its_nodes_back_to_that_state(
    system: System,
) -> None:
    # An operator restores the state dir from last night's backup: the node has seen later revisions than the
    # data manager now has, and must follow the restored state rather than keep what it saw last.
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 30_000_000)
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000, what="rate")
    system.datamgr.kill()
    backup = system.root / "backup"
    shutil.copytree(system.datamgr.state_dir, backup)

    system.datamgr.start()
    client = DataManagerClient(system.datamgr.address, timeout=10)
    client.allocate_remote_io("j1", 9_000_000)
    client.register_job("j2", system.uri, 100_000_000, [("n1", 1)])
    eventually(lambda: system.node_stats(node, "j2") and system.node_stats(node, "j1")["io_bytes_per_sec"] == 9e6)
    client.close()
    system.datamgr.kill()
    shutil.rmtree(system.datamgr.state_dir)
    shutil.copytree(backup, system.datamgr.state_dir)

    system.datamgr.start()
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000, what="the restored rate")
    eventually(lambda: not node.job_dir("j2").exists(), what="j2, unknown to the restored state, gone")


@pytest.mark.expected_warnings
def test_a_restarted_node_agent_restores_job_directories_and_reuses_its_cache(system: System) -> None:
    node = _job_read_once_into_a_full_cache(system)

    node.kill()
    restarted = MountProcess.node(node.cache_dir.parent, system.datamgr.address, "n1", "--cache-capacity", "1GiB")
    system.nodes.append(restarted)
    started = time.time()
    restarted.start()
    job_dir = eventually(lambda: restarted.job_dir("j1").is_dir() and restarted.job_dir("j1"), what="restored job")
    fresh = restarted.wait_for_stats(lambda s: s["written_at"] > started and system.uri in s["datasets"])
    assert fresh["datasets"][system.uri]["cached_items"] == FILES
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    assert system.node_stats(restarted, "j1")["bytes_from_remote"] == 0  # every read a reused cache entry


def test_a_job_on_two_nodes_reading_a_distributed_samplers_shares_counts_its_passes_on_each(system: System) -> None:
    # Data-parallel training on two nodes: every pass, PyTorch's DistributedSampler shuffles the items with the
    # pass's seed and deals rank r the items at r, r + 2, ...; each node reads only its half, another half
    # each pass, and must count a pass (and the data manager see it) when its half is read.
    nodes = [system.start_node("n1"), system.start_node("n2")]
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1), ("n2", 1)])
    system.client.allocate_remote_io("j1", 100_000_000)
    roots = [eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job dir") for node in nodes]  # noqa: B023

    def usage() -> dict[str, pb.JobUsage]:
        job = system.client.call(system.client.stub.GetJob, pb.GetJobRequest(job_id="j1"))
        return {u.node_id: u for u in job.usage}

    paths = sorted(system.files)
    passes = 3
    for number in range(passes):
        order = random.Random(number).sample(paths, len(paths))
        for rank, root in enumerate(roots):
            for path in order[rank::2]:
                assert (root / path).read_bytes() == system.files[path]
        eventually(
            lambda: [(u.epoch, u.epoch_progress) for u in usage().values()] == [(number + 2, 0.0)] * 2,  # noqa: B023
            what=f"both nodes reporting pass {number + 1} done",
        )
    for node in nodes:
        read = passes * FILES // 2 * SIZE
        epochs = node.wait_for_stats(lambda s: s["jobs"]["j1"]["bytes_read"] == read)["jobs"]["j1"]["finished_epochs"]  # noqa: B023
        assert [(e["epoch"], e["accessed_bytes"]) for e in epochs] == [(n, FILES // 2 * SIZE) for n in (1, 2, 3)]
    assert sum(u.bytes_read for u in usage().values()) == passes * FILES * SIZE


def test_a_job_on_two_nodes_gets_half_its_rate_on_each(system: System) -> None:
    nodes = [system.start_node("n1"), system.start_node("n2")]
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 2), ("n2", 2)])
    system.client.allocate_remote_io("j1", 10_000_000)
    for node in nodes:
        eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 5_000_000, what="half rate")  # noqa: B023


def test_a_node_behind_a_restored_data_manager_that_went_past_it_follows_the_restored_state(system: System) -> None:
    # Backup at revision R; the node goes on to R+2; the data manager is stopped and the backup restored; changes
    # on the restored state take it past the node's revision before the node reconnects. Resumed by its revision
    # alone, the node would get the last change only: keep j2, miss j3, enforce the old rate, and say nothing.
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 30_000_000)
    state_dir = str(system.datamgr.state_dir)
    backup = system.root / "backup.db"
    assert silod_cli("datamgr", "backup", "--state-dir", state_dir, str(backup)).returncode == 0
    system.client.allocate_remote_io("j1", 9_000_000)
    seen = system.client.register_job("j2", system.uri, 100_000_000, [("n1", 1)]).revision
    eventually(lambda: system.node_stats(node, "j2") and system.node_stats(node, "j1")["io_bytes_per_sec"] == 9e6)
    system.datamgr.kill()
    restored = silod_cli("datamgr", "restore", "--state-dir", state_dir, str(backup))
    assert restored.returncode == 0, restored.stderr

    # The changes reach the restored state on another address, which the node does not know: all before it resumes.
    elsewhere = DataManagerProcess(system.datamgr.state_dir, system.root / "elsewhere.log")
    try:
        with DataManagerClient(elsewhere.start().address, timeout=10) as client:
            revision = client.register_job("j3", system.uri, 100_000_000, [("n1", 1)]).revision
            while revision <= seen:
                revision = client.allocate_remote_io("j3", 1_000_000 * revision).revision
        assert elsewhere.terminate() == 0
    finally:
        elsewhere.stop()

    system.datamgr.start()
    eventually(lambda: system.node_stats(node, "j1")["io_bytes_per_sec"] == 30_000_000, what="the restored rate")
    eventually(lambda: not node.job_dir("j2").exists(), what="j2, unknown to the restored state, gone")
    eventually(lambda: node.job_dir("j3").is_dir(), what="j3, registered on the restored state")
    assert node.log_lines(f"sent a snapshot of its revision {revision} where this node was at revision {seen}")


def test_a_job_id_that_reads_another_dataset_after_a_snapshot_serves_that_dataset_not_the_old_one(
    system: System,
) -> None:
    # Backup with j1 on A; then j1 finishes and is registered again on B; the backup restored: the snapshot says
    # j1 reads A. The node kept j1 on B (it only updated the rate of a job it knew) and served B's bytes as j1's.
    node, _ = _job_on_n1(system)  # with a rate: at 0, the reads below would wait for one
    state_dir = str(system.datamgr.state_dir)
    backup = system.root / "backup.db"
    assert silod_cli("datamgr", "backup", "--state-dir", state_dir, str(backup)).returncode == 0
    other = make_local_dataset(system.root / "other", files=3, size=700)
    system.client.call(system.client.stub.FinishJob, pb.FinishJobRequest(job_id="j1"))
    system.client.register_dataset(other)
    system.client.register_job("j1", other, 100_000_000, [("n1", 1)])
    eventually(lambda: (node.job_dir("j1") / "d0/f000.bin").is_file(), what="j1 on the other dataset")
    system.datamgr.kill()
    assert silod_cli("datamgr", "restore", "--state-dir", state_dir, str(backup)).returncode == 0
    system.datamgr.start()
    eventually(lambda: not (node.job_dir("j1") / "d0/f000.bin").exists(), what="the other dataset's files gone")
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1 again")
    assert {path: (job_dir / path).read_bytes() for path in system.files} == system.files
