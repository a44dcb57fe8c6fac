"""Structured logs: an event about a job, a dataset or a node carries `job_id`, `dataset_uri` and `node_id` as
JSON fields (`--log-json`), while its message still names them for the human format.

Captured from real event paths: a cache restored above its quota, and a data manager with a node agent (both with
`SILOD_LOG_JSON=1`) going through registration, a rate change, a quota shrink, a failed backend read, a finished
job, a removed dataset and an unmount. Every line a node agent writes carries its `node_id`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from datamgr.logs import JsonFormatter
from fuseclient.cache import DatasetCache
from silodlib.manifest import Manifest
from silodpb.v1 import datamgr_pb2 as pb
from tests.cluster_fixtures import FILES, SIZE, System, eventually
from tests.datamgr_fixtures import RunningDataManager
from tests.mount_fixtures import MountProcess

Event = dict[str, Any]
ID_FIELDS = ("job_id", "dataset_uri", "node_id")


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What the `fuseclient` loggers write at INFO and above, one JSON object per line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("fuseclient")
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)


def test_a_restore_above_the_quota_logs_its_evictions_with_the_dataset_uri(
    tmp_path: Path, json_log: io.StringIO
) -> None:
    uri = "s3://bucket/train"
    manifest = Manifest(100, ["data"], [10 * 100], [0], ["v1"])  # one file of ten 100-byte items
    cache = DatasetCache(tmp_path / "cache", manifest, 1000, seed=3, dataset_uri=uri)
    for item in range(10):
        assert cache.admit(item, bytes([item]) * 100)
    cache.close()
    opened = len(json_log.getvalue())

    reopened = DatasetCache(tmp_path / "cache", manifest, 450, seed=3, dataset_uri=uri)
    assert reopened.statistics().evicted == 6
    (event,) = [json.loads(line) for line in json_log.getvalue()[opened:].splitlines()]
    assert event["dataset_uri"] == uri and event["level"] == "INFO" and event["logger"] == "fuseclient.cache"
    assert event["msg"].startswith(f"cache of {uri}: restored 10 items (1000 bytes) from ")
    assert event["msg"].endswith("; evicted 6 of them at random to fit its quota of 450 bytes")


def json_events(path: Path) -> list[Event]:
    """The JSON log lines in `path` (gRPC's own C-core lines, in its format, are skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def logged(path: Path, matches: Callable[[Event], bool], what: str) -> Event:
    """The first event in `path` that `matches`, once it has been logged."""
    found: Event = eventually(lambda: next((e for e in json_events(path) if matches(e)), None), what=what)
    return found


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[System]:
    """The data manager and the node agents it starts, logging JSON lines."""
    monkeypatch.setenv("SILOD_LOG_JSON", "1")
    running = System(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_the_node_agent_and_the_data_manager_log_events_with_their_ids(system: System, tmp_path: Path) -> None:
    node = system.start_node("n1")
    uri, unread = system.uri, sorted(system.files)[-1]
    system.client.register_dataset(uri)
    system.client.register_job("j1", uri, 100_000_000, [("n1", 1)])
    system.client.allocate_cache_size(uri, FILES * SIZE)
    system.client.allocate_remote_io("j1", 40_000_000)
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")
    for path in sorted(system.files)[:-1]:
        (job_dir / path).read_bytes()
    (tmp_path / "dataset" / unread).unlink()  # the backend loses an object the manifest names
    with pytest.raises(OSError):
        (job_dir / unread).read_bytes()
    system.client.allocate_remote_io("j1", 7_000_000)
    system.client.allocate_cache_size(uri, FILES * SIZE // 4)
    shrunk = f"cache quota of {uri} = {FILES * SIZE // 4} bytes"
    logged(node.log_path, lambda e: e["msg"].startswith(shrunk), "eviction")
    # Logged with each statistics write, every few seconds: the job must live until one has been.
    logged(node.log_path, lambda e: e["msg"].startswith("job j1: epoch "), "the job's statistics")
    system.client.call(system.client.stub.FinishJob, pb.FinishJobRequest(job_id="j1"))
    logged(node.log_path, lambda e: "finished here" in e["msg"], "job finished")
    system.client.call(system.client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=uri))
    deleted = f"cache of {uri}: done deleting its directory"  # by a thread of its own
    logged(node.log_path, lambda e: e["msg"].startswith(deleted), "the dataset's cache deleted")
    node.stop()

    events = json_events(node.log_path)

    def the_event(starts: str) -> Event:
        matching = [e for e in events if e["msg"].startswith(starts)]
        assert matching, f"no event starting {starts!r} in {[e['msg'] for e in events]}"
        return matching[0]

    job, dataset, on_node = {"job_id": "j1"}, {"dataset_uri": uri}, {"node_id": "n1"}
    expected = {
        "registered node n1 ": on_node,
        f"mounted {node.mountpoint} ": on_node,
        f"dataset {uri}: ": dataset | on_node,
        # At the rate it has when its directory appears: 0 if that is before its rate reaches the node, else the rate
        # (its dataset's backend opens in the background, as the revisions go on).
        f"job j1: {uri} at ": job | dataset | on_node,
        "job j1: epoch ": job | dataset | on_node,
        "job j1: read failed: ": job | dataset | on_node,
        "remote IO of job j1 = 7000000 bytes/s": job | dataset | on_node,
        f"cache quota of {uri} = {FILES * SIZE // 4} bytes": dataset | on_node,
        "job j1 finished here": job | on_node,
        deleted: dataset | on_node,
        f"unmounted {node.mountpoint}": on_node,
    }
    for starts, fields in expected.items():
        event = the_event(starts)
        assert {name: event[name] for name in ID_FIELDS if name in event} == fields, event
    assert the_event("job j1: read failed: ")["level"] == "WARNING"
    # Every line the agent wrote names its node, whichever module or thread wrote it: the cache's, the dataset's and
    # the failed reads' lines went without, and a cluster's logs filtered by node missed them.
    assert [(e["logger"], e["msg"]) for e in events if e.get("node_id") != "n1"] == []

    listed = logged(system.datamgr.log_path, lambda e: e["msg"].startswith(f"listed {uri}: "), "listing")
    assert listed["dataset_uri"] == uri


def test_a_node_agent_refused_at_its_start_says_why_in_a_line_naming_its_node(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    # The line saying why an agent stopped, the one a log filtered by node most needs, named no node.
    datamgr.client.register_node("n1", "h:1", 10**9)
    agent = MountProcess.node(tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", "2GiB")
    env = {**os.environ, "SILOD_LOG_JSON": "1"}
    result = subprocess.run(agent.argv, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    (why,) = [e for e in events if e["level"] == "CRITICAL"]
    assert why["msg"].startswith("silod node: cannot register node n1: "), why
    assert [e for e in events if e.get("node_id") != "n1"] == []
