"""Every RPC of silod.v1.DataManager over a real gRPC channel: happy paths, and a table of bad inputs that
must each be refused with the right status code and a message naming the problem, changing nothing."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from datamgr import lifecycle, servicer
from datamgr.client import LARGEST_PAGE, ClientError, DataManagerClient
from datamgr.defaults import EXTERNAL_POLICY
from datamgr.embedded import EmbeddedDataManager
from datamgr.entities import Job, Worker
from datamgr.queries import PAGE_BYTES
from datamgr.server import ServerConfig
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore
from silodlib import grpc_channel
from silodlib.manifest import Manifest
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.datamgr_fixtures import (
    REMOTE_IO_LIMIT,
    STILL_ALIVE_SECONDS,
    STREAM_DEADLINE,
    NodeWatch,
    RunningDataManager,
    full_state,
    make_local_dataset,
    silod_cli,
    until_unavailable,
    watch,
)
from tests.storage_servers import DatasetTargetFactory


def test_nodes_register_idempotently_and_show_in_queries(datamgr: RunningDataManager) -> None:
    client = datamgr.client
    first = client.register_node("node-1", "10.0.0.1:7421", 10_000)
    again = client.register_node("node-1", "10.0.0.1:7421", 10_000)
    assert first.created and not again.created
    assert again.revision == first.revision
    node = client.call(client.stub.GetNode, pb.GetNodeRequest(node_id="node-1"))
    assert (node.address, node.cache_capacity_bytes, node.available) == ("10.0.0.1:7421", 10_000, True)
    listed = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
    assert [n.node_id for n in listed] == ["node-1"]


def test_dataset_registration_freezes_a_manifest_served_by_get_manifest(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    client = datamgr.client
    uri = make_local_dataset(tmp_path / "ds", files=6, size=3000)
    reply = client.register_dataset(uri + "/", chunk_size=64 * 1024)
    assert reply.created
    assert reply.dataset.uri == uri  # canonical form: no trailing slash
    assert (reply.dataset.file_count, reply.dataset.item_count, reply.dataset.size_bytes) == (6, 6, 18_000)
    assert not client.register_dataset(uri, chunk_size=64 * 1024).created
    chunks = list(client.stub.GetManifest(pb.GetManifestRequest(dataset_uri=uri)))
    manifest = Manifest.decode(b"".join(c.data for c in chunks))
    assert manifest.digest == chunks[0].digest == reply.dataset.manifest_digest
    assert manifest.paths == sorted(p.relative_to(tmp_path / "ds").as_posix() for p in (tmp_path / "ds").rglob("*.bin"))


TEARDOWN_NODE_TIMEOUT = 5.0  # long enough for the test to see both nodes available, short enough to wait out


@pytest.fixture
def teardown_datamgr(tmp_path: Path) -> Iterator[RunningDataManager]:
    """The `datamgr` fixture's data manager with a node timeout of seconds, not an hour: a node registered here and
    never reporting counts as live until it times out, and UnregisterNode refuses a live node (its agent would
    register it again)."""
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, TEARDOWN_NODE_TIMEOUT)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        yield RunningDataManager(dm.address, client, config.state_dir)


@pytest.mark.expected_warnings  # the nodes, which never report, marked unavailable
def test_jobs_allocations_usage_and_teardown(teardown_datamgr: RunningDataManager, tmp_path: Path) -> None:
    client = teardown_datamgr.client
    client.register_node("n1", "h1:1", 50_000)
    client.register_node("n2", "h2:1", 50_000)
    uri = make_local_dataset(tmp_path / "ds", files=10, size=2000)
    client.register_dataset(uri)
    job = client.register_job("job-1", uri, 100_000_000, [("n1", 3), ("n2", 1)]).job
    assert [(w.node_id, w.count) for w in job.workers] == [("n1", 3), ("n2", 1)]

    cache = client.allocate_cache_size(uri, 15_000)
    io = client.allocate_remote_io("job-1", 40_000_000)
    assert cache.cache_size_bytes == 15_000
    assert io.revision == cache.revision + 1
    assert {r.node_id: r.io_bytes_per_sec for r in io.node_rates} == {"n1": 30_000_000, "n2": 10_000_000}

    usage = pb.ReportUsageRequest(
        node_id="n1",
        datasets=[pb.DatasetUsage(dataset_uri=uri, cached_bytes=12_000, cached_items=6)],
        jobs=[pb.JobUsage(job_id="job-1", bytes_read=20_000, epoch=2, epoch_progress=0.5)],
    )
    client.call(client.stub.ReportUsage, usage)
    dataset = client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=uri))
    assert (dataset.cache_quota_bytes, list(dataset.job_ids)) == (15_000, ["job-1"])
    assert [(u.node_id, u.cached_bytes) for u in dataset.usage] == [("n1", 12_000)]
    shown = client.call(client.stub.GetJob, pb.GetJobRequest(job_id="job-1"))
    assert (shown.io_bytes_per_sec, shown.usage[0].node_id, shown.usage[0].epoch) == (40_000_000, "n1", 2)

    summary = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
    assert (summary.dataset_count, summary.job_count, summary.node_count, summary.nodes_available) == (
        1,
        1,
        2,
        2,
    )
    assert summary.remote_io_allocated_bytes_per_sec == 40_000_000
    assert summary.remote_io_limit_bytes_per_sec == REMOTE_IO_LIMIT
    assert summary.cache_allocated_bytes == 30_000  # the quota is held on each of the two nodes
    assert [j.job_id for j in client.call(client.stub.ListJobs, pb.ListJobsRequest()).jobs] == ["job-1"]
    assert [d.uri for d in client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets] == [uri]

    client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="job-1"))
    assert (
        client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).remote_io_allocated_bytes_per_sec == 0
    )
    client.call(client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=uri))
    until_unavailable(client, "n2")  # as once its agent has stopped
    client.call(client.stub.UnregisterNode, pb.UnregisterNodeRequest(node_id="n2"))
    final = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
    assert (final.dataset_count, final.job_count, final.node_count) == (0, 0, 1)


def test_a_job_registers_with_its_length_and_irregular_flag_and_every_query_shows_them(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    client = datamgr.client
    client.register_node("n1", "h1:1", 50_000)
    uri = make_local_dataset(tmp_path / "ds", files=4, size=1000)
    client.register_dataset(uri)
    reply = client.register_job("bert", uri, 10_000_000, [("n1", 1)], epochs=0.07, irregular=True)
    client.register_job("resnet", uri, 10_000_000, [("n1", 1)])

    shown = client.call(client.stub.GetJob, pb.GetJobRequest(job_id="bert"))
    listed = {j.job_id: j for j in client.call(client.stub.ListJobs, pb.ListJobsRequest()).jobs}
    assert (reply.job.epochs, reply.job.irregular) == (0.07, True)
    assert (shown.epochs, shown.irregular) == (0.07, True)
    assert (listed["bert"].epochs, listed["bert"].irregular) == (0.07, True)
    assert (listed["resnet"].epochs, listed["resnet"].irregular) == (0.0, False)  # unknown length, regular

    before = full_state(client)
    again = client.register_job("bert", uri, 10_000_000, [("n1", 1)], epochs=0.07, irregular=True)
    assert not again.created and full_state(client) == before  # the same registration again: a no-op


def test_re_registering_a_job_with_another_length_or_flag_is_refused_naming_both_values(setup: Setup) -> None:
    client = setup.client
    client.register_job("j3", setup.a, 1000, [("n1", 1)], epochs=2.5)
    before = full_state(client)
    with pytest.raises(ClientError) as info:
        client.register_job("j3", setup.a, 1000, [("n1", 1)], epochs=3, irregular=True)
    assert info.value.code == EXISTS
    assert "job 'j3' is registered with epochs 2.5, irregular False, not epochs 3, irregular True" in str(info.value)
    assert full_state(client) == before


def test_a_dataset_registered_again_without_a_chunk_size_is_the_one_registered_whatever_its_chunk_size(
    setup: Setup, tmp_path: Path
) -> None:
    # `silod dataset add URI` run again without --chunk-size: the default asked for nothing, so it is no reason to
    # refuse (it was: "registered with chunk size 65536, not 4194304").
    uri = make_local_dataset(tmp_path / "chunked", files=2, size=1000)
    client = setup.client
    client.register_dataset(uri, chunk_size=2**16)
    before = full_state(client)
    again = client.register_dataset(uri)
    assert not again.created and again.dataset.chunk_size_bytes == 2**16
    assert full_state(client) == before
    with pytest.raises(ClientError, match="is registered with chunk size 65536, not 4194304"):
        client.register_dataset(uri, chunk_size=4 << 20)  # asked for: refused as before


def test_a_jobs_length_and_irregular_flag_survive_a_restart(tmp_path: Path) -> None:
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, 30.0)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        client.register_node("n1", "h1:1", 50_000)
        uri = make_local_dataset(tmp_path / "ds", files=4, size=1000)
        client.register_dataset(uri)
        client.register_job("curriculum", uri, 1000, [("n1", 1)], epochs=0.07, irregular=True)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        job = client.call(client.stub.GetJob, pb.GetJobRequest(job_id="curriculum"))
        assert (job.epochs, job.irregular) == (0.07, True)


def test_secret_options_are_redacted_in_queries(
    datamgr: RunningDataManager, dataset_target_factory: DatasetTargetFactory
) -> None:
    target = dataset_target_factory("az")
    target.put("x/one.bin", b"1")
    client = datamgr.client
    reply = client.register_dataset(target.uri, target.options)
    listed = client.call(client.stub.ListDatasets, pb.ListDatasetsRequest())
    assert reply.dataset.options["account_key"] == "<redacted>"
    assert reply.dataset.options["account_url"] == target.options["account_url"]
    assert target.options["account_key"] not in str(reply) + str(listed)


# ---- bad inputs ----


@dataclass
class Setup:
    """A small cluster to aim bad calls at: n1 (big) runs job j1 on dataset A; n2 (small) runs j2 on B."""

    client: DataManagerClient
    a: str
    b: str
    c: str
    empty_dir: str


@pytest.fixture
def setup(datamgr: RunningDataManager, tmp_path: Path) -> Setup:
    client = datamgr.client
    client.register_node("n1", "h1:1", 100_000)
    client.register_node("n2", "h2:1", 5_000)
    a = make_local_dataset(tmp_path / "a", files=8, size=1000)
    b = make_local_dataset(tmp_path / "b", files=20, size=1000)
    c = make_local_dataset(tmp_path / "c", files=10, size=1000)
    for uri in (a, b, c):
        client.register_dataset(uri)
    client.allocate_cache_size(c, 8_000)
    client.register_job("j1", a, 50_000_000, [("n1", 1)])
    client.register_job("j2", b, 50_000_000, [("n2", 1)])
    client.allocate_remote_io("j1", 600_000_000)
    (tmp_path / "empty").mkdir()
    return Setup(client, a, b, c, f"file://{tmp_path / 'empty'}")


Call = Callable[[Setup], object]
INVALID, NOT_FOUND, EXISTS, PRECONDITION = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
)


def _rpc(method: str, request: object) -> Call:
    return lambda s: s.client.call(getattr(s.client.stub, method), request)


def _stream(method: str, request: object) -> Call:
    return lambda s: next(iter(getattr(s.client.stub, method)(request, timeout=10)))


BAD_CALLS: list[tuple[str, Call, grpc.StatusCode, str]] = [
    ("cache: unknown scheme", lambda s: s.client.allocate_cache_size("gs://bucket/x", 1), INVALID, "gs"),
    ("cache: malformed uri", lambda s: s.client.allocate_cache_size("s3://", 1), INVALID, "dataset_uri"),
    ("cache: negative", lambda s: s.client.allocate_cache_size(s.a, -1), INVALID, "must not be negative"),
    ("cache: absurd", lambda s: s.client.allocate_cache_size(s.a, 2**62), INVALID, "sanity limit"),
    (
        "cache: unknown dataset",
        lambda s: s.client.allocate_cache_size("s3://nobucket/x", 1),
        NOT_FOUND,
        "not registered",
    ),
    (
        "cache: above dataset size",
        lambda s: s.client.allocate_cache_size(s.a, 8_001),
        PRECONDITION,
        "larger than dataset",
    ),
    (
        "cache: above node capacity",
        lambda s: s.client.allocate_cache_size(s.b, 6_000),
        PRECONDITION,
        "'n2' mounts",
    ),
    (
        "io: unknown job",
        lambda s: s.client.allocate_remote_io("nojob", 1),
        NOT_FOUND,
        "'nojob' is not registered",
    ),
    (
        "io: above the limit",
        lambda s: s.client.allocate_remote_io("j2", 500_000_000),
        PRECONDITION,
        "400000000 bytes/s",
    ),
    ("io: negative", lambda s: s.client.allocate_remote_io("j1", -5), INVALID, "io_bytes_per_sec -5"),
    ("io: bad job id", lambda s: s.client.allocate_remote_io("a/b", 5), INVALID, "[A-Za-z0-9._-]{1,128}"),
    ("job: path-like id", lambda s: s.client.register_job("..", s.a, 1, [("n1", 1)]), INVALID, "job_id '..'"),
    ("job: id too long", lambda s: s.client.register_job("j" * 129, s.a, 1, [("n1", 1)]), INVALID, "job_id"),
    (
        "job: unknown node",
        lambda s: s.client.register_job("j3", s.a, 1, [("n9", 1)]),
        NOT_FOUND,
        "workers[0].node_id",
    ),
    (
        "job: unknown dataset",
        lambda s: s.client.register_job("j3", "file:///nope", 1, [("n1", 1)]),
        NOT_FOUND,
        "file:///nope",
    ),
    (
        "job: unknown class",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], job_class=pb.JobClass.ValueType(7)),
        INVALID,
        "job_class 7 is not a job class: JOB_CLASS_BEST_EFFORT (1) or JOB_CLASS_TRIAL_AND_ERROR (2)",
    ),
    (
        "job: negative grace period",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], grace_seconds=-180),
        INVALID,
        "grace_seconds -180 must be a number of seconds from 0 to 86,400 (a day)",
    ),
    (
        "job: grace period over a day",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], grace_seconds=86_401),
        INVALID,
        "grace_seconds 86401 must be",
    ),
    (
        "job: grace period not a number",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], grace_seconds=math.nan),
        INVALID,
        "grace_seconds nan must be",
    ),
    (
        "job: duplicate, other params",
        lambda s: s.client.register_job("j1", s.a, 7, [("n1", 1)]),
        EXISTS,
        "'j1'",
    ),
    (
        "job: negative epochs",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], epochs=-1),
        INVALID,
        "epochs -1.0 must be a number of epochs from 0 (unknown) to 1,000,000",
    ),
    (
        "job: NaN epochs",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], epochs=math.nan),
        INVALID,
        "epochs nan",
    ),
    (
        "job: infinite epochs",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1)], epochs=math.inf),
        INVALID,
        "epochs inf",
    ),
    (
        "job: duplicate, other epochs",
        lambda s: s.client.register_job("j1", s.a, 50_000_000, [("n1", 1)], epochs=90),
        EXISTS,
        "epochs unknown, not epochs 90",
    ),
    ("job: no workers", lambda s: s.client.register_job("j3", s.a, 1, []), INVALID, "at least one node"),
    (
        "job: node twice",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 1), ("n1", 2)]),
        INVALID,
        "listed twice",
    ),
    (
        "job: zero workers",
        lambda s: s.client.register_job("j3", s.a, 1, [("n1", 0)]),
        INVALID,
        "workers[0].count",
    ),
    (
        "job: zero ideal rate",
        lambda s: s.client.register_job("j3", s.a, 0, [("n1", 1)]),
        INVALID,
        "must be positive",
    ),
    (
        "job: node lacks room",
        lambda s: s.client.register_job("j3", s.c, 1, [("n2", 1)]),
        PRECONDITION,
        "'n2' has room",
    ),
    ("node: bad id", lambda s: s.client.register_node("node 1", "h:1", 1), INVALID, "node_id 'node 1'"),
    ("node: bad address", lambda s: s.client.register_node("n3", "", 1), INVALID, "address"),
    (
        "node: negative capacity",
        lambda s: s.client.register_node("n3", "h:1", -1),
        INVALID,
        "cache_capacity_bytes",
    ),
    (
        "node: duplicate, other params",
        lambda s: s.client.register_node("n1", "h1:1", 1),
        EXISTS,
        "unregister it first",
    ),
    ("dataset: unknown scheme", lambda s: s.client.register_dataset("hdfs://x/y"), INVALID, "hdfs"),
    (
        "dataset: missing dir",
        lambda s: s.client.register_dataset("file:///no/such/dir"),
        PRECONDITION,
        "uri file:///no/such/dir: No such file or directory",  # the URI once, though the backend named it too
    ),
    (
        "dataset: empty dir",
        lambda s: s.client.register_dataset(s.empty_dir),
        PRECONDITION,
        "lists no objects",
    ),
    (
        "dataset: unknown option",
        lambda s: s.client.register_dataset(s.a + "x", {"colour": "red"}),
        INVALID,
        "colour",
    ),
    (
        "dataset: tiny chunks",
        lambda s: s.client.register_dataset(s.a, chunk_size=100),
        INVALID,
        "chunk_size_bytes",
    ),
    (
        "dataset: other chunk size",
        lambda s: s.client.register_dataset(s.a, chunk_size=2**20),
        EXISTS,
        "is registered with chunk size 4194304, not 1048576; unregister it first to change them",
    ),
    (
        "dataset: a name the file system refuses",
        lambda s: s.client.register_dataset(s.empty_dir + "/" + "n" * 300),
        PRECONDITION,
        "uri file://",
    ),
    (
        "dataset: a 3 MB uri",
        lambda s: s.client.register_dataset("file:///" + "x" * 3_000_000),
        INVALID,
        "dataset URI of 3,000,008 characters",
    ),
    (
        "dataset: a 100,000-character option",
        lambda s: s.client.register_dataset(s.empty_dir, {"k" * 100_000: "v"}),
        INVALID,
        "unknown option 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...' (100,000 characters) for file://",  # shown cut
    ),
    (
        "dataset: removing a 100,000-character option",
        lambda s: s.client.update_dataset_options(s.a, {}, ["k" * 100_000]),
        PRECONDITION,
        "(98,",  # a message past 2,000 characters is cut by the server: "... (98,0xx more characters)"
    ),
    (
        "dataset: remove empty uri",
        _rpc("UnregisterDataset", pb.UnregisterDatasetRequest(uri="")),
        INVALID,
        "uri",
    ),
    (
        "node: remove in use",
        _rpc("UnregisterNode", pb.UnregisterNodeRequest(node_id="n1")),
        PRECONDITION,
        "['j1']",
    ),
    ("finish: unknown job", _rpc("FinishJob", pb.FinishJobRequest(job_id="j9")), NOT_FOUND, "'j9'"),
    ("usage: unknown node", _rpc("ReportUsage", pb.ReportUsageRequest(node_id="n9")), NOT_FOUND, "'n9'"),
    ("get: unknown node", _rpc("GetNode", pb.GetNodeRequest(node_id="n9")), NOT_FOUND, "'n9'"),
    (
        "watch: unknown node",
        _stream("WatchAllocations", pb.WatchAllocationsRequest(node_id="n9")),
        NOT_FOUND,
        "'n9'",
    ),
    (
        "manifest: unknown",
        _stream("GetManifest", pb.GetManifestRequest(dataset_uri="s3://bkt/x")),
        NOT_FOUND,
        "s3://bkt/x",
    ),
    ("jobs: negative page size", _rpc("ListJobs", pb.ListJobsRequest(page_size=-1)), INVALID, "page_size -1"),
    (
        "jobs: a page token it did not give",
        _rpc("ListJobs", pb.ListJobsRequest(page_size=1, page_token="j1!")),
        INVALID,
        "page_token 'j1!' is not one this data manager gave",
    ),
]


@pytest.mark.parametrize(("call", "code", "fragment"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_are_refused_by_name_and_change_nothing(
    setup: Setup, call: Call, code: grpc.StatusCode, fragment: str
) -> None:
    before = full_state(setup.client)
    with pytest.raises((ClientError, grpc.RpcError)) as info:
        call(setup)
    error = info.value
    actual = error.code if isinstance(error, ClientError) else error.code()  # type: ignore[attr-defined]
    message = str(error) if isinstance(error, ClientError) else error.details()  # type: ignore[attr-defined]
    assert actual == code, message
    assert fragment in message
    assert len(message) < 2_100  # whatever the input, an error fits on a screen and in a gRPC trailer
    assert full_state(setup.client) == before


def test_removing_a_dataset_in_use_names_its_jobs(setup: Setup) -> None:
    before = full_state(setup.client)
    with pytest.raises(ClientError, match=r"in use by jobs \['j1'\]") as info:
        setup.client.call(setup.client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=setup.a))
    assert info.value.code == PRECONDITION
    assert full_state(setup.client) == before


# ---- one node agent per node: another agent with the same node id is refused while one's watch is open ----


def _watch(setup: Setup, agent_id: str, node_id: str = "n1") -> NodeWatch:
    request = pb.WatchAllocationsRequest(node_id=node_id, agent_id=agent_id)
    return NodeWatch(setup.client.stub.WatchAllocations(request, timeout=STREAM_DEADLINE))


def _usage(agent_id: str, bytes_read: int) -> pb.ReportUsageRequest:
    return pb.ReportUsageRequest(
        node_id="n1", agent_id=agent_id, jobs=[pb.JobUsage(job_id="j1", bytes_read=bytes_read)]
    )


def _register_n1(agent_id: str, capacity: int = 100_000) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(node_id="n1", address="h1:1", cache_capacity_bytes=capacity, agent_id=agent_id)


def _refused_as_served_elsewhere(call: Callable[[], object]) -> str:
    """The message of `call`'s refusal, which must be FAILED_PRECONDITION with the metadata agents recognise."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    error = info.value
    assert error.code() == PRECONDITION, error.details()
    metadata: list[tuple[str, object]] = [(item.key, item.value) for item in error.trailing_metadata()]  # str values
    assert ("silod-refusal", "node-served-by-another-agent") in metadata, metadata
    message = error.details() or ""
    assert re.fullmatch(
        r"node_id: node 'n1' is served by another node agent, at ipv4:127\.0\.0\.1:\d+ since "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(agent agent-a\): give each agent its own --node-id, or stop the other "
        r"agent first",
        message,
    ), message
    return message


@pytest.mark.expected_warnings  # the data manager logs its refusals of the other agent
def test_a_watch_a_report_and_a_registration_from_another_agent_are_refused_while_a_watch_is_open(
    setup: Setup,
) -> None:
    """Two agents started with the same --node-id: while the first one's watch stream is open, the second's calls
    for the node are refused, naming where the first one runs, and change nothing; once the stream has ended, the
    second one takes the node."""
    stub = setup.client.stub
    stub.RegisterNode(_register_n1("agent-a"))
    first = _watch(setup, "agent-a")
    assert first.next().HasField("snapshot")  # the stream is open
    before = full_state(setup.client)

    _refused_as_served_elsewhere(lambda: _watch(setup, "agent-b").next())
    _refused_as_served_elsewhere(lambda: stub.ReportUsage(_usage("agent-b", 5_000)))
    _refused_as_served_elsewhere(lambda: stub.RegisterNode(_register_n1("agent-b")))
    _refused_as_served_elsewhere(lambda: stub.RegisterNode(_register_n1("agent-b", 1)))  # not "other parameters"
    assert full_state(setup.client) == before
    # The first agent's own calls go on, a second stream of its own (a reconnect) included.
    stub.ReportUsage(_usage("agent-a", 1_000))
    reconnect = _watch(setup, "agent-a")
    assert reconnect.next().HasField("snapshot")
    stub.RegisterNode(_register_n1("agent-a"))

    first.cancel()
    _refused_as_served_elsewhere(lambda: stub.ReportUsage(_usage("agent-b", 5_000)))  # its reconnect holds the node
    reconnect.cancel()

    def report_accepted() -> bool:
        try:
            stub.ReportUsage(_usage("agent-b", 5_000))
        except grpc.RpcError as exc:
            assert exc.code() == PRECONDITION, exc.details()
            return False
        return True

    polling.eventually(report_accepted, what="agent-b's report accepted once agent-a's streams ended", timeout=10)
    job = setup.client.call(stub.GetJob, pb.GetJobRequest(job_id="j1"))
    assert [(u.node_id, u.bytes_read) for u in job.usage] == [("n1", 5_000)]
    second = _watch(setup, "agent-b")
    assert second.next().HasField("snapshot")
    stub.RegisterNode(_register_n1("agent-b"))
    with pytest.raises(grpc.RpcError) as info:  # now the first agent is the other one
        stub.ReportUsage(_usage("agent-a", 1_000))
    assert info.value.code() == PRECONDITION and "(agent agent-b)" in (info.value.details() or "")
    second.cancel()


@pytest.mark.expected_warnings  # the data manager logs its refusals of the other agent
def test_an_agent_without_an_id_is_never_refused_and_holds_no_node(setup: Setup) -> None:
    """An agent from before agent ids sends none: never refused while another agent serves the node (as an agent
    with an id is), and holding the node against no agent while it watches."""
    stub = setup.client.stub
    first = _watch(setup, "agent-a")
    first.next()
    _refused_as_served_elsewhere(lambda: stub.ReportUsage(_usage("agent-c", 1_000)))
    stub.RegisterNode(_register_n1(""))
    stub.ReportUsage(_usage("", 1_000))
    old = _watch(setup, "")
    assert old.next().HasField("snapshot")
    first.cancel()

    def accepted() -> bool:
        try:
            stub.RegisterNode(_register_n1("agent-b"))
        except grpc.RpcError as exc:
            assert exc.code() == PRECONDITION, exc.details()
            return False
        return True

    polling.eventually(accepted, what="agent-b registering once agent-a's stream ended", timeout=10)
    stub.ReportUsage(_usage("agent-b", 2_000))  # the old agent's open stream holds nothing
    second = _watch(setup, "agent-b")
    assert second.next().HasField("snapshot")
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportUsage(_usage("agent-a", 2_000))
    assert info.value.code() == PRECONDITION
    stub.ReportUsage(_usage("", 3_000))  # while the old agent is still not
    old.cancel()
    second.cancel()


def test_a_node_shows_the_agent_whose_watch_is_open_and_none_once_it_has_ended(setup: Setup) -> None:
    stub = setup.client.stub
    stub.RegisterNode(_register_n1("agent-a"))
    assert not setup.client.call(stub.GetNode, pb.GetNodeRequest(node_id="n1")).HasField("agent")
    before = time.time()
    watch = _watch(setup, "agent-a")
    watch.next()

    agent = setup.client.call(stub.GetNode, pb.GetNodeRequest(node_id="n1")).agent
    assert agent.agent_id == "agent-a"
    assert re.fullmatch(r"ipv4:127\.0\.0\.1:\d+", agent.peer), agent.peer
    assert before - 1 <= agent.since <= time.time()
    listed = {n.node_id: n for n in setup.client.call(stub.ListNodes, pb.ListNodesRequest()).nodes}
    assert listed["n1"].agent == agent
    assert not any(n.HasField("agent") for node_id, n in listed.items() if node_id != "n1")
    watch.cancel()
    polling.eventually(
        lambda: not setup.client.call(stub.GetNode, pb.GetNodeRequest(node_id="n1")).HasField("agent"),
        what="the node served by no agent once the watch ended",
        timeout=10,
    )


def test_a_nodes_failed_and_denied_reads_of_a_job_reach_get_job_silod_job_show_and_silod_status(
    setup: Setup,
) -> None:
    """Storage refusing every read of a job (its credentials expired) showed nowhere but in the node's log."""
    usage = pb.JobUsage(job_id="j1", bytes_read=5_000, failed_reads=12, denied_reads=9)
    setup.client.call(setup.client.stub.ReportUsage, pb.ReportUsageRequest(node_id="n1", jobs=[usage]))

    job = setup.client.call(setup.client.stub.GetJob, pb.GetJobRequest(job_id="j1"))
    assert [(u.node_id, u.failed_reads, u.denied_reads) for u in job.usage] == [("n1", 12, 9)]
    shown = silod_cli("job", "show", "j1", datamgr=setup.client.address)
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if line.startswith("NODE ") and "FAILED READS" in line)
    row = next(line for line in shown.stdout.splitlines()[::-1] if line.startswith("n1 "))
    assert row[header.index("FAILED READS") :].strip() == "12 (9 denied)"

    status = silod_cli("status", datamgr=setup.client.address)
    assert status.returncode == 0, status.stderr
    header = next(line for line in status.stdout.splitlines() if line.startswith("JOB "))
    row = next(line for line in status.stdout.splitlines() if line.startswith("j1 "))
    assert row[header.index(" READ ") + 1 : header.index("EXPECTED")].strip() == "4.9 KiB, 12 failed (9 denied)"


# A keepalive ping after 20 s, 10 s for its answer (datamgr.server.GRPC_OPTIONS); half as much again for a loaded
# machine. Without `grpc.http2.ping_timeout_ms`, grpcio waited 60 s for the answer: 80 s in all.
FROZEN_AGENT_RELEASED_WITHIN = 45.0
_FROZEN_AGENT = """
import sys, time, grpc
from silodpb.v1 import datamgr_pb2 as pb, datamgr_pb2_grpc as pb_grpc
channel = grpc.insecure_channel(sys.argv[1])
watch = pb_grpc.DataManagerStub(channel).WatchAllocations(pb.WatchAllocationsRequest(node_id="n1", agent_id="agent-a"))
next(watch)
print("watching", flush=True)
time.sleep(3600)
"""


@pytest.mark.expected_warnings  # the data manager logs its refusals of the other agent
def test_the_node_of_a_frozen_agent_is_free_for_another_once_keepalive_finds_it_silent(setup: Setup) -> None:
    """An agent that freezes (SIGSTOP; a hung host) keeps its connection open, and its kernel acknowledges the data
    manager's packets: only the keepalive ping, unanswered, ends its stream and so its hold on the node."""
    agent = subprocess.Popen(
        [sys.executable, "-c", _FROZEN_AGENT, setup.client.address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline() == "watching\n"
        _refused_as_served_elsewhere(lambda: setup.client.stub.ReportUsage(_usage("agent-b", 5_000)))
        agent.send_signal(signal.SIGSTOP)

        def report_accepted() -> bool:
            try:
                setup.client.stub.ReportUsage(_usage("agent-b", 5_000))
            except grpc.RpcError as exc:
                assert exc.code() == PRECONDITION, exc.details()
                return False
            return True

        polling.eventually(report_accepted, what="the frozen agent's hold ended", timeout=FROZEN_AGENT_RELEASED_WITHIN)
    finally:
        agent.kill()
        agent.wait()


# ---- answers, stream events and requests past gRPC's default 4 MiB limit on a message ----

GRPC_DEFAULT_LIMIT = 4 * 1024 * 1024  # what silod's channels took before, as gRPC's do unless told otherwise
# Jobs of 128-character ids reading a dataset of a 560-character URI, each on the node of a 128-character id: every
# answer and snapshot below is 4.3 to 6.2 MB (about 8,700 such jobs broke `silod status` with dataset URIs of 40).
CROWD = 6_000
CROWDED_NODE = "n" * 128


@contextlib.contextmanager
def crowded(tmp_path: Path, policy: str = EXTERNAL_POLICY) -> Iterator[RunningDataManager]:
    """A data manager with CROWD jobs, which run on CROWDED_NODE (registered with their workers) or, with a `policy`,
    wait for it to place them (the node has no GPUs). The jobs go into the state dir through the store in one commit
    between two starts of the data manager: registering them one call at a time takes about a minute."""
    uri = make_local_dataset(tmp_path / ("d" * 200) / ("d" * 200) / ("d" * 150), files=2)
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, STILL_ALIVE_SECONDS, policy=policy)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address) as client:
        client.register_node(CROWDED_NODE, "h1:1", 10**12)
        client.register_dataset(uri)
    placed_by_policy = policy != EXTERNAL_POLICY
    workers = () if placed_by_policy else (Worker(CROWDED_NODE, 1),)
    jobs = tuple(Job(f"{i:08d}" + "j" * 120, uri, 10**6, workers, gpus=int(placed_by_policy)) for i in range(CROWD))
    now = time.time()
    store = SQLiteStore(config.state_dir)
    try:
        change = Change(jobs_put=jobs, histories_put=tuple(lifecycle.registered(job, now) for job in jobs))
        store.commit([Commit(store.load().revision + 1, change)])
    finally:
        store.close()
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address) as client:
        yield RunningDataManager(dm.address, client, config.state_dir)


@pytest.fixture
def crowd(tmp_path: Path) -> Iterator[RunningDataManager]:
    with crowded(tmp_path) as running:
        yield running


def test_list_jobs_answers_past_grpcs_default_limit_whole_or_in_pages_that_each_fit_it(
    crowd: RunningDataManager,
) -> None:
    client = crowd.client
    whole = client.call(client.stub.ListJobs, pb.ListJobsRequest())
    ids = [job.job_id for job in whole.jobs]
    assert whole.ByteSize() > GRPC_DEFAULT_LIMIT and not whole.next_page_token
    assert len(ids) == CROWD and ids == sorted(ids)

    first = client.call(client.stub.ListJobs, pb.ListJobsRequest(page_size=LARGEST_PAGE))
    assert PAGE_BYTES <= first.ByteSize() < GRPC_DEFAULT_LIMIT, "a page ends at 2 MiB, short of its 5,000 jobs"
    assert [job.job_id for job in first.jobs] == ids[: len(first.jobs)] and first.next_page_token
    second = client.call(
        client.stub.ListJobs, pb.ListJobsRequest(page_size=LARGEST_PAGE, page_token=first.next_page_token)
    )
    assert second.jobs[0].job_id == ids[len(first.jobs)]
    assert [job.job_id for job in client.list_jobs()] == ids


def test_list_jobs_pages_follow_each_other_in_id_order_and_a_token_outlives_the_job_it_follows(setup: Setup) -> None:
    client = setup.client
    first = client.call(client.stub.ListJobs, pb.ListJobsRequest(page_size=1))
    assert [job.job_id for job in first.jobs] == ["j1"] and first.next_page_token
    client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j1"))
    last = client.call(client.stub.ListJobs, pb.ListJobsRequest(page_size=1, page_token=first.next_page_token))
    assert ([job.job_id for job in last.jobs], last.next_page_token) == (["j2"], "")
    client.register_job("j0", setup.a, 50_000_000, [("n1", 1)])
    everything = client.call(client.stub.ListJobs, pb.ListJobsRequest(page_size=10**9))  # counts as 5,000
    assert ([job.job_id for job in everything.jobs], everything.next_page_token) == (["j0", "j2"], "")


def test_silod_status_shows_a_cluster_past_grpcs_default_limit(crowd: RunningDataManager) -> None:
    result = silod_cli("status", "--json", datamgr=crowd.address)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["jobs"]) == CROWD


def test_a_nodes_watch_snapshot_past_grpcs_default_limit_arrives_whole(crowd: RunningDataManager) -> None:
    snapshot = watch(crowd.client, CROWDED_NODE).next()
    assert snapshot.ByteSize() > GRPC_DEFAULT_LIMIT and len(snapshot.snapshot.jobs) == CROWD


def test_a_launchers_decision_snapshot_past_grpcs_default_limit_arrives_whole(tmp_path: Path) -> None:
    with crowded(tmp_path, policy="fifo") as running:
        call = running.client.stub.WatchDecisions(pb.WatchDecisionsRequest(), timeout=STREAM_DEADLINE)
        snapshot = next(iter(call))
    assert snapshot.snapshot and snapshot.ByteSize() > GRPC_DEFAULT_LIMIT
    assert len(snapshot.jobs) == CROWD and {job.phase for job in snapshot.jobs} == {pb.JOB_PHASE_PENDING}


def test_a_usage_report_past_grpcs_default_limit_is_taken(setup: Setup) -> None:
    jobs = [pb.JobUsage(job_id=f"{i:08d}" + "r" * 120, bytes_read=1) for i in range(35_000)]  # finished, as it hears
    report = pb.ReportUsageRequest(node_id="n1", jobs=jobs)
    assert report.ByteSize() > GRPC_DEFAULT_LIMIT
    setup.client.call(setup.client.stub.ReportUsage, report)


@pytest.mark.expected_warnings  # the data manager logs each message it refuses to send
def test_an_answer_or_event_over_the_limit_is_refused_naming_the_call_its_size_and_the_limit(
    crowd: RunningDataManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the limit, gRPC's own refusal read "RESOURCE_EXHAUSTED: ... Received message larger than max (4840000 vs.
    4194304)": the status code of a full state disk, and nothing of which call or what to do. The limit is lowered
    to gRPC's default here, to pass it with a few thousand jobs."""
    monkeypatch.setattr(servicer, "MAX_MESSAGE_BYTES", GRPC_DEFAULT_LIMIT)
    client = crowd.client
    with pytest.raises(ClientError) as listed:
        client.call(client.stub.ListJobs, pb.ListJobsRequest())
    assert listed.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert re.fullmatch(
        r"RESOURCE_EXHAUSTED: ListJobs: the answer is [\d,]{9} bytes, over the limit of 4\.0 MiB on one gRPC message "
        r'\(docs/datamgr\.md, "Message sizes"\); ask for the jobs a page at a time \(page_size\)',
        str(listed.value),
    ), listed.value
    assert len(client.list_jobs()) == CROWD  # its pages fit

    revision = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision
    with pytest.raises(grpc.RpcError) as watched:
        watch(client, CROWDED_NODE).next()
    assert watched.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert re.fullmatch(
        rf"WatchAllocations: the snapshot of revision {revision} for node {CROWDED_NODE} is [\d,]{{9}} bytes, over the "
        r'limit of 4\.0 MiB on one gRPC message \(docs/datamgr\.md, "Message sizes"\)',
        watched.value.details() or "",
    ), watched.value
    logged = [r.getMessage() for r in caplog.get_records("call") if r.levelno == logging.WARNING]
    assert [line.split(" is ")[0] for line in logged] == [
        "refused to send it: ListJobs: the answer",
        f"refused to send it: WatchAllocations: the snapshot of revision {revision} for node {CROWDED_NODE}",
    ]


def test_an_answer_over_this_clients_limit_is_explained_naming_its_size_and_the_limit(
    crowd: RunningDataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a client whose limit is lower than the data manager's says (gRPC's default here, as every silod client
    had): not gRPC's "RESOURCE_EXHAUSTED: ... Received message larger than max (6210000 vs. 4194304)"."""
    monkeypatch.setattr(grpc_channel, "MAX_MESSAGE_BYTES", GRPC_DEFAULT_LIMIT)
    with DataManagerClient(crowd.address) as client, pytest.raises(ClientError) as failed:
        client.call(client.stub.ListJobs, pb.ListJobsRequest())
    assert re.fullmatch(
        rf"a call to the data manager at {crowd.address} failed: the answer is [\d,]{{9}} bytes, over this client's "
        r'limit of 4\.0 MiB on one gRPC message \(docs/datamgr\.md, "Message sizes"\)',
        str(failed.value),
    ), failed.value
