"""The live controller as `silod datamgr serve --policy` runs it: its flags and their precedence, and end to
end with real node agents reading through their mounts."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from datamgr.client import DataManagerClient
from datamgr.scheduler.perf import SiloDPerf
from datamgr.scheduler.policies.greedy import GreedyStorage
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import available_policies
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot
from silodcli.main import parse_args
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.datamgr_fixtures import DataManagerProcess, make_local_dataset, silod_cli
from tests.mount_fixtures import MountProcess

# ---- configuration ----


def test_policy_and_round_follow_flag_over_environment_over_file_over_default(tmp_path: Path) -> None:
    config = tmp_path / "silod.toml"
    config.write_text('[datamgr]\nstate-dir = "s"\npolicy = "greedy"\nround = 5\n')
    serve = ["--config", str(config), "datamgr", "serve"]
    default = parse_args(["datamgr", "serve", "--state-dir", "s"], {})
    assert (default.policy, default.round_seconds) == ("external", 30.0)
    assert (parse_args(serve, {}).policy, parse_args(serve, {}).round_seconds) == ("greedy", 5.0)
    from_env = parse_args(serve, {"SILOD_POLICY": "fifo", "SILOD_ROUND": "7"})
    assert (from_env.policy, from_env.round_seconds) == ("fifo", 7.0)
    from_flags = parse_args([*serve, "--policy", "external", "--round", "9"], {"SILOD_POLICY": "fifo"})
    assert (from_flags.policy, from_flags.round_seconds) == ("external", 9.0)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("nosuch", "is unknown"),
        # It was "unknown" too, though docs/harmony.md documents it: a policy of the simulator's co-location model.
        ("harmony", "is a co-location policy, which only `silod sim` runs, on a co-location scenario"),
    ],
    ids=["unknown", "co-location"],
)
def test_an_unknown_policy_exits_2_listing_the_known_ones_before_touching_the_state_dir(
    tmp_path: Path, name: str, why: str
) -> None:
    result = silod_cli(
        "datamgr", "serve", "--state-dir", str(tmp_path / "state"), "--remote-io-limit", "1GB/s", "--policy", name
    )
    assert result.returncode == 2
    assert f"--policy '{name}' {why}; known policies: external, {', '.join(available_policies())}" in result.stderr
    assert not (tmp_path / "state").exists()


def test_a_policy_without_a_remote_io_limit_exits_2_saying_so(tmp_path: Path) -> None:
    result = silod_cli("datamgr", "serve", "--state-dir", str(tmp_path / "state"), "--policy", "greedy")
    assert result.returncode == 2
    assert "--policy greedy shares out the cluster's remote IO, so it needs --remote-io-limit" in result.stderr


@pytest.mark.parametrize(
    ("policy", "option", "message"),
    [
        ("greedy", "queues=1h", "--policy-option: policy greedy takes no options"),
        ("tiresias-las", "queue=1h", "policy 'tiresias-las': unknown option 'queue'; accepted options: queues"),
        ("tiresias-las", "queues=later", "policy 'tiresias-las': option queues: duration 'later'"),
    ],
)
def test_a_bad_policy_knob_exits_2_naming_it_before_touching_the_state_dir(
    tmp_path: Path, policy: str, option: str, message: str
) -> None:
    state = tmp_path / "state"
    argv = ["--state-dir", str(state), "--remote-io-limit", "1GB/s", "--policy", policy, "--policy-option", option]
    result = silod_cli("datamgr", "serve", *argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert not state.exists()


# ---- end to end: silod datamgr serve --policy greedy, a node agent, the CLI ----

FILES, SIZE = 40, 50_000  # 2 MB per dataset
NODE_CACHE = 1_500_000  # three quarters of one dataset
REMOTE_IO = 3_000_000
FAST_RATE, SLOW_RATE = 10_000_000, 1_000_000  # f*: the fast job's dataset is 10x as cache-efficient


@dataclass
class GreedyCluster:
    """`silod datamgr serve --policy greedy` with one node agent and two datasets on local directories."""

    datamgr: DataManagerProcess
    node: MountProcess
    uris: dict[str, str]

    def cli(self, *args: str) -> str:
        result = silod_cli(*args, datamgr=self.datamgr.address)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.cli("status", "--json"))
        return document


@pytest.fixture
def greedy_cluster(tmp_path: Path) -> Iterator[GreedyCluster]:
    datamgr = DataManagerProcess(
        tmp_path / "state",
        tmp_path / "datamgr.log",
        *("--policy", "greedy", "--remote-io-limit", str(REMOTE_IO), "--round", "3600"),  # rounds on job changes
    )
    try:
        datamgr.start()
        node = MountProcess.node(tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", str(NODE_CACHE))
        try:
            node.start()
            uris = {name: make_local_dataset(tmp_path / name, files=FILES, size=SIZE) for name in ("fast", "slow")}
            yield GreedyCluster(datamgr, node, uris)
        finally:
            node.stop()
    finally:
        datamgr.stop()


def expected_greedy(jobs: Mapping[str, tuple[str, int]]) -> Decision:
    """What SiloD's greedy policy decides for these jobs (id -> dataset URI, f*) on the one node, whose caches
    are still empty (nothing reads through the mount in these tests)."""
    snapshot = Snapshot(
        time=0.0,
        nodes={"n1": NodeState("n1", len(jobs), NODE_CACHE)},
        remote_io_bytes_per_sec=REMOTE_IO,
        datasets={uri: DatasetState(uri, FILES * SIZE, cached_bytes=0) for uri, _ in jobs.values()},
        jobs={
            job_id: JobState(job_id, 0.0, 1, uri, FILES * SIZE, rate, math.inf, placement=MappingProxyType({"n1": 1}))
            for job_id, (uri, rate) in jobs.items()
        },
    )
    return GreedyStorage().schedule(snapshot, SiloDPerf())


def node_enforces(node: MountProcess, decision: Decision) -> bool:
    """Whether the node agent's live mount applies exactly the decision's quotas and rates."""
    assert decision.cache_bytes is not None and decision.io_bytes_per_sec is not None
    stats = node.stats()
    quotas = {uri: d["quota_bytes"] for uri, d in stats["datasets"].items()}
    rates = {job_id: j["io_bytes_per_sec"] for job_id, j in stats["jobs"].items()}
    return quotas == dict(decision.cache_bytes) and rates == dict(decision.io_bytes_per_sec)


def wait_for_node(node: MountProcess, decision: Decision, what: str) -> None:
    polling.eventually(
        lambda: node_enforces(node, decision),
        what=lambda: f"{what}; node stats: {node.stats()}",
        ignore=lambda exc: isinstance(exc, (FileNotFoundError, json.JSONDecodeError, KeyError)),
    )


def test_the_greedy_policy_allocates_what_reaches_the_node_and_reallocates_when_a_job_finishes(
    greedy_cluster: GreedyCluster,
) -> None:
    cluster, node = greedy_cluster, greedy_cluster.node
    fast, slow = cluster.uris["fast"], cluster.uris["slow"]
    for uri in (fast, slow):
        cluster.cli("dataset", "add", uri)
    cluster.cli("job", "add", "resnet", "--dataset", fast, "--ideal-rate", str(FAST_RATE), "--worker", "n1")
    cluster.cli("job", "add", "bert", "--dataset", slow, "--ideal-rate", str(SLOW_RATE), "--worker", "n1")

    both = expected_greedy({"resnet": (fast, FAST_RATE), "bert": (slow, SLOW_RATE)})
    assert both.cache_bytes == {fast: 1_500_000, slow: 0}  # all the cache to the cache-efficient dataset
    # Nothing is cached yet, so both need their full f* from remote: max-min fair, bert capped at its f*.
    assert both.io_bytes_per_sec == {"resnet": 2_000_000, "bert": 1_000_000}
    wait_for_node(node, both, "greedy's allocation for both jobs on the node")

    status = cluster.status()
    assert status["summary"]["controller"]["policy"] == "greedy"
    assert status["summary"]["controller"]["last_round_trigger"] == "registered job bert"
    estimates = {j["job_id"]: j["estimate"] for j in status["jobs"]}
    assert {job_id: e["io_bytes_per_sec"] for job_id, e in estimates.items()} == {
        "resnet": "2000000",
        "bert": "1000000",
    }
    # min(f*, b / (1 - c/d)) once the quota is filled: resnet 2 MB/s over a 25% miss ratio, bert at its f*.
    assert {job_id: e["throughput_bytes_per_sec"] for job_id, e in estimates.items()} == {
        "resnet": 8_000_000,
        "bert": SLOW_RATE,
    }
    tables = cluster.cli("status")
    assert "allocations: policy greedy, a round at least every 3600s" in tables
    assert "(registered job bert)" in tables
    header, bert_row = (next(line for line in tables.splitlines() if line.startswith(w)) for w in ("JOB", "bert"))
    assert header.split()[-1] == "EXPECTED" and bert_row.endswith("1.0 MB/s")

    manual = silod_cli("alloc", "io", "bert", "2MB/s", datamgr=cluster.datamgr.address)
    assert manual.returncode == 1
    assert "FAILED_PRECONDITION" in manual.stderr and "the greedy policy allocates" in manual.stderr

    cluster.cli("job", "finish", "resnet")
    alone = expected_greedy({"bert": (slow, SLOW_RATE)})
    assert alone.cache_bytes == {slow: 1_500_000} and alone.io_bytes_per_sec == {"bert": 1_000_000}
    wait_for_node(node, alone, "greedy's allocation once resnet finished")
    after = cluster.status()
    assert after["summary"]["controller"]["last_round_trigger"] == "finished job resnet"
    quotas = {d["uri"]: d["cache_quota_bytes"] for d in after["datasets"]}
    assert quotas == {fast: "0", slow: "1500000"}  # the finished job's dataset keeps no quota


# ---- end to end: silod datamgr serve --policy sjf, jobs registered with their length by the CLI ----


def test_silod_serve_with_sjf_gives_remote_io_first_to_the_job_registered_with_fewer_epochs(tmp_path: Path) -> None:
    """IO for one and a half jobs; the long job is registered first and its id sorts first, so it would win
    every tie were the registered lengths ignored."""
    datamgr = DataManagerProcess(
        tmp_path / "state",
        tmp_path / "datamgr.log",
        *("--policy", "sjf", "--remote-io-limit", "1500", "--round", "3600"),
    )
    try:
        datamgr.start()
        with DataManagerClient(datamgr.address, timeout=10) as client:
            client.register_node("n1", "h1:1", 0)

            def cli(*args: str) -> str:
                result = silod_cli(*args, datamgr=datamgr.address)
                assert result.returncode == 0, result.stderr
                return result.stdout

            for job_id, epochs in (("a-long", "10"), ("b-short", "0.07")):
                uri = make_local_dataset(tmp_path / job_id, files=4, size=500)
                cli("dataset", "add", uri)
                added = cli(
                    "job", "add", job_id, "--dataset", uri, "--ideal-rate", "1000", "--worker", "n1", "--epochs", epochs
                )
                assert f"({epochs} epochs, uniform access)" in added

            def rates() -> dict[str, int]:
                jobs = client.call(client.stub.ListJobs, pb.ListJobsRequest()).jobs
                return {job.job_id: job.io_bytes_per_sec for job in jobs}

            polling.eventually(
                lambda: rates() == {"b-short": 1000, "a-long": 500},
                what=lambda: f"sjf's remote IO for the shorter job first; rates {rates()}",
            )
            table = cli("status")
            header, long_row, short_row = (
                next(line for line in table.splitlines() if line.startswith(w)) for w in ("JOB", "a-long", "b-short")
            )
            epochs_at = header.index("EPOCHS")
            assert (long_row[epochs_at:].split()[0], short_row[epochs_at:].split()[0]) == ("10", "0.07")
    finally:
        datamgr.stop()
