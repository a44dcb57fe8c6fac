"""The `silod` command line as an operator types it: human units, tables, JSON, and clear failures with
distinct exit codes (1 rejected, 2 bad command line, 3 data manager unreachable)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from datamgr.client import DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.entities import Node, Tenant
from datamgr.server import ServerConfig
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore
from datamgr.store.backup import back_up
from silodcli.main import main
from silodpb.v1 import datamgr_pb2 as pb
from tests.cluster_fixtures import eventually
from tests.datamgr_fixtures import (
    REMOTE_IO_LIMIT,
    SILOD,
    STILL_ALIVE_SECONDS,
    RunningDataManager,
    damage_tables,
    full_state,
    make_local_dataset,
    silod_cli,
)
from tests.disks import TmpfsFactory, fill_up
from tests.state_files import (
    damage_log_header,
    edit,
    files_of,
    killed_state_dir,
    linked_state_dir,
    revision_and_nodes,
    state_of_nodes,
)
from tests.storage_servers import missing_dependency


@pytest.fixture
def cluster(datamgr: RunningDataManager, tmp_path: Path) -> tuple[RunningDataManager, str]:
    datamgr.client.register_node("n1", "h1:1", 2**30)
    datamgr.client.register_node("n2", "h2:1", 2**30)
    return datamgr, make_local_dataset(tmp_path / "ds", files=30, size=10_000)


def test_help_lists_the_subcommands() -> None:
    result = silod_cli("--help")
    assert result.returncode == 0
    for command in ("datamgr", "alloc", "dataset", "job", "status", "demo"):
        assert command in result.stdout


def test_an_operator_session_with_human_units(cluster: tuple[RunningDataManager, str]) -> None:
    dm, uri = cluster
    add = silod_cli("dataset", "add", uri, "--chunk-size", "1MiB", datamgr=dm.address)
    assert add.returncode == 0, add.stderr
    assert f"registered {uri}: 30 files, 30 items of up to 1.0 MiB" in add.stdout

    job = silod_cli(
        "job", "add", "resnet", "--dataset", uri, "--ideal-rate", "114MB/s", "--worker", "n1:3", "--worker", "n2",
        datamgr=dm.address,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    cache = silod_cli("alloc", "cache", uri, "150kB", datamgr=dm.address)
    assert cache.returncode == 0, cache.stderr
    assert "= 146.5 KiB" in cache.stdout
    io = silod_cli("alloc", "io", "resnet", "0.8Gbps", datamgr=dm.address)
    assert io.returncode == 0, io.stderr
    assert "n1 75.0 MB/s, n2 25.0 MB/s" in io.stdout

    status = silod_cli("status", datamgr=dm.address)
    assert status.returncode == 0, status.stderr
    assert "1 datasets, 1 jobs, 2 nodes (2 available)" in status.stdout
    assert "remote IO 100.0 MB/s of 1.0 GB/s" in status.stdout
    assert "resnet" in status.stdout and "n1:3,n2:1" in status.stdout

    as_json = json.loads(silod_cli("status", "--json", datamgr=dm.address).stdout)
    assert as_json["datasets"][0]["cache_quota_bytes"] == "150000"
    assert as_json["jobs"][0]["io_bytes_per_sec"] == "100000000"
    shown = silod_cli("job", "show", "resnet", datamgr=dm.address)
    assert "75.0 MB/s" in shown.stdout and "25.0 MB/s" in shown.stdout

    finish = silod_cli("job", "finish", "resnet", datamgr=dm.address)
    remove = silod_cli("dataset", "remove", uri, datamgr=dm.address)
    assert (finish.returncode, remove.returncode) == (0, 0)
    assert json.loads(silod_cli("status", "--json", datamgr=dm.address).stdout)["datasets"] == []


def test_job_add_registers_the_epochs_and_irregular_flag_that_status_and_show_then_display(
    cluster: tuple[RunningDataManager, str],
) -> None:
    dm, uri = cluster
    dm.client.register_dataset(uri)
    add = silod_cli(
        "job", "add", "bert", "--dataset", uri, "--ideal-rate", "12MB/s", "--worker", "n1", "--epochs", "0.07",
        "--irregular", datamgr=dm.address,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert f"registered job bert on {uri} (0.07 epochs, irregular access)" in add.stdout
    plain = silod_cli(
        "job", "add", "resnet", "--dataset", uri, "--ideal-rate", "114MB/s", "--worker", "n2", datamgr=dm.address
    )
    assert "(length unknown, uniform access)" in plain.stdout

    job = dm.client.call(dm.client.stub.GetJob, pb.GetJobRequest(job_id="bert"))
    assert (job.epochs, job.irregular) == (0.07, True)
    lines = silod_cli("status", datamgr=dm.address).stdout.splitlines()
    header, bert, resnet = (next(line for line in lines if line.startswith(w)) for w in ("JOB", "bert", "resnet"))
    columns = header.index("EPOCHS"), header.index("ACCESS")
    assert [bert[c:].split()[0] for c in columns] == ["0.07", "irregular"]
    assert [resnet[c:].split()[0] for c in columns] == ["-", "uniform"]
    shown = json.loads(silod_cli("job", "show", "bert", "--json", datamgr=dm.address).stdout)
    assert (shown["epochs"], shown["irregular"]) == (0.07, True)


@pytest.mark.parametrize("epochs", ["-1", "nan", "inf", "two", "1e300"])  # negative; non-finite; no number; absurd
def test_job_add_with_impossible_epochs_exits_2_naming_the_value(
    cluster: tuple[RunningDataManager, str], epochs: str
) -> None:
    dm, uri = cluster
    dm.client.register_dataset(uri)
    before = full_state(dm.client)
    result = silod_cli(
        "job", "add", "j", "--dataset", uri, "--ideal-rate", "1MB/s", "--worker", "n1", "--epochs", epochs,
        datamgr=dm.address,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"--epochs: {epochs!r} " in result.stderr and "number of epochs" in result.stderr
    assert full_state(dm.client) == before


def test_job_add_registers_the_class_and_grace_period_that_status_and_show_then_display(
    cluster: tuple[RunningDataManager, str],
) -> None:
    dm, uri = cluster
    dm.client.register_dataset(uri)
    add = silod_cli(
        "job", "add", "trial", "--dataset", uri, "--ideal-rate", "12MB/s", "--worker", "n1", "--class", "te",
        "--grace-period", "90s", datamgr=dm.address,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert f"registered job trial on {uri} (length unknown, uniform access; trial-and-error, 90s grace)" in add.stdout
    long = silod_cli(
        "job", "add", "long", "--dataset", uri, "--ideal-rate", "12MB/s", "--worker", "n2", "--grace-period", "3m",
        datamgr=dm.address,
    )  # fmt: skip
    assert "best-effort, 3m grace" in long.stdout  # best-effort unless told
    plain = silod_cli(
        "job", "add", "plain", "--dataset", uri, "--ideal-rate", "1MB/s", "--worker", "n2", datamgr=dm.address
    )
    assert "(length unknown, uniform access) (revision" in plain.stdout  # best-effort without grace: as before

    job = dm.client.call(dm.client.stub.GetJob, pb.GetJobRequest(job_id="long"))
    assert (job.job_class, job.grace_seconds) == (pb.JOB_CLASS_BEST_EFFORT, 180.0)
    lines = silod_cli("status", datamgr=dm.address).stdout.splitlines()
    header, *rows = (next(line for line in lines if line.startswith(w)) for w in ("JOB", "trial", "long", "plain"))
    columns = header.index("CLASS"), header.index("GRACE")
    assert [[row[c:].split()[0] for c in columns] for row in rows] == [["te", "90s"], ["be", "3m"], ["be", "-"]]
    shown = silod_cli("job", "show", "trial", datamgr=dm.address).stdout
    assert "class: trial-and-error, 90s grace" in shown
    as_json = json.loads(silod_cli("job", "show", "trial", "--json", datamgr=dm.address).stdout)
    assert (as_json["job_class"], as_json["grace_seconds"]) == ("JOB_CLASS_TRIAL_AND_ERROR", 90.0)


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--class", "xx", "argument --class: 'xx' must be te (trial-and-error) or be (best-effort)"),
        ("--grace-period", "-3m", "argument --grace-period: duration '-3m' must not be negative"),
        ("--grace-period", "abc", "argument --grace-period: duration 'abc' is not a number of seconds or a number"),
        ("--grace-period", "2d", "argument --grace-period: duration '2d' must be at most a day (86,400s)"),
        ("--grace-period", "1e999", "argument --grace-period: duration '1e999' is too long to be a number of seconds"),
    ],
)
def test_job_add_with_a_bad_class_or_grace_period_exits_2_naming_the_flag_and_the_rule_and_changes_nothing(
    cluster: tuple[RunningDataManager, str], capsys: pytest.CaptureFixture[str], flag: str, value: str, fragment: str
) -> None:
    dm, uri = cluster
    dm.client.register_dataset(uri)
    before = full_state(dm.client)
    args = ["job", "add", "j", "--dataset", uri, "--ideal-rate", "1MB/s", "--worker", "n1", f"{flag}={value}"]
    with pytest.raises(SystemExit) as exited:
        main(args, environ={"SILOD_DATAMGR": dm.address})
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err
    assert full_state(dm.client) == before


def test_the_datamgr_address_comes_from_the_environment(cluster: tuple[RunningDataManager, str]) -> None:
    dm, _ = cluster
    result = silod_cli("status", "--json", datamgr=dm.address)  # passed as SILOD_DATAMGR
    assert result.returncode == 0
    assert json.loads(result.stdout)["summary"]["node_count"] == "2"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("alloc", "cache", "URI", "1G"), "'G' is ambiguous"),
        (("alloc", "io", "j", "200MB"), "did you mean 200MB/s?"),
        (("alloc", "io", "j", "-5"), "is negative"),
        (("alloc", "cache", "URI", "--", "-5GiB"), "is negative"),
        # A negative quantity with a unit is a value, not an unknown flag: its own check names the problem.
        (("alloc", "cache", "URI", "-5GiB"), "size '-5GiB' is negative"),
        (("alloc", "io", "j", "-5MB/s"), "rate '-5MB/s' is negative"),
        (("alloc", "io", "j", "-.5GB/s"), "rate '-.5GB/s' is negative"),
        (("job", "add", "j", "--dataset", "URI", "--ideal-rate", "-1MB/s", "--worker", "n1"), "is negative"),
        (
            ("job", "add", "j", "--dataset", "URI", "--ideal-rate", "1MB/s", "--worker", "n1", "--grace-period", "-3m"),
            "duration '-3m' must not be negative",
        ),
        (("job", "add", "j", "--dataset", "URI", "--ideal-rate", "1MB/s", "--worker", "n1:x"), "COUNT"),
        (("dataset", "add", "URI", "--option", "novalue"), "KEY=VALUE"),
        (("dataset", "add", "URI", "--option-env", "account_key=SILOD_TEST_UNSET_VAR"), "is not set"),
        (("alloc", "cache", "URI", "99999999999999999999999"), "larger than the largest a request can carry"),
        (("alloc", "io", "j", "99999999999999999999999"), "larger than the largest a request can carry"),
        (("alloc", "cache", "URI", "0.5B"), "not a whole number of bytes"),
        (("alloc", "cache", "URI", "1MB/s"), "is a rate"),
        (("job", "add", "j", "--dataset", "URI", "--ideal-rate", "1MB/s", "--worker", "n1:99999999999"), "1,000,000"),
        # `silod node` runs the agent, whose flags stay required unless an action takes its place.
        (("node", "rm", "n1"), "invalid choice: 'rm' (choose from 'remove')"),
        (("node", "remove"), "silod node remove: error: the following arguments are required: NODE_ID"),
        (("node", "--node-id", "n1"), "the following arguments are required: --mountpoint, --cache-dir"),
        # The agent's flags before an action would be silently replaced by the action's defaults.
        (("node", "--datamgr", "127.0.0.1:1", "remove", "n1"), "--datamgr given before 'remove'"),
        # 0 is what the request carries for "the default chunk size": typed, it is out of range as any other.
        (("dataset", "add", "URI", "--chunk-size", "0"), "chunk size '0' must be from 64.0 KiB to 1.0 GiB"),
        (("dataset", "add", "URI", "--chunk-size", "2GiB"), "chunk size '2GiB' must be from 64.0 KiB to 1.0 GiB"),
        # A job the policy places runs on GPUs; with none it would be a job with workers, and it names none.
        (
            ("job", "add", "j", "--dataset", "URI", "--ideal-rate", "1MB/s", "--gpus", "0"),
            "GPUs '0' must be a whole number from 1 to 1,000,000",
        ),
        # A data manager address is HOST:PORT, with a port it can listen on: not only "cannot reach" it later.
        (("status", "--datamgr", "127.0.0.1"), "argument --datamgr: '127.0.0.1' must be HOST:PORT with a PORT"),
        (("status", "--datamgr", "nonsense"), "argument --datamgr: 'nonsense' must be HOST:PORT"),
        (("status", "--datamgr", "127.0.0.1:99999"), "'127.0.0.1:99999' must be HOST:PORT with a PORT from 1 to"),
        (("status", "--datamgr", "127.0.0.1:0"), "'127.0.0.1:0' must be HOST:PORT with a PORT from 1 to 65535"),
        (("node", "remove", "n1", "--datamgr", "127.0.0.1"), "argument --datamgr: '127.0.0.1' must be HOST:PORT"),
        # Intervals: a tick of a nanosecond floods the output (22k frames in 3 s); inf is no interval.
        (("status", "--watch", "1e-9"), "argument --watch: '1e-9' must be a positive number of seconds from 0.1"),
        (("status", "--watch", "inf"), "argument --watch: 'inf' must be a positive number of seconds from 0.1 to"),
        (("status", "--watch", "nan"), "'nan' must be a positive number of seconds from 0.1 to 86,400 (a day)"),
        (
            ("node", "--node-id", "n", "--mountpoint", "m", "--cache-dir", "c", "--report-interval", "0.01"),
            "argument --report-interval: '0.01' must be a positive number of seconds from 0.1",
        ),
        (
            ("node", "--node-id", "n", "--mountpoint", "m", "--cache-dir", "c", "--stats-interval", "1e9"),
            "argument --stats-interval: '1e9' must be a positive number of seconds from 0.1 to 86,400",
        ),
    ],
)
def test_bad_command_lines_exit_2_naming_the_problem_and_change_nothing(
    cluster: tuple[RunningDataManager, str],
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    fragment: str,
) -> None:
    # In process: argparse refuses these before any call, so no subprocess (and no machine speed) is needed.
    dm, uri = cluster
    before = full_state(dm.client)
    with pytest.raises(SystemExit) as exited:
        main([uri if a == "URI" else a for a in args], environ={"SILOD_DATAMGR": dm.address})
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err
    assert full_state(dm.client) == before


def test_a_rejected_call_exits_1_with_the_servers_reason(cluster: tuple[RunningDataManager, str]) -> None:
    dm, _ = cluster
    result = silod_cli("alloc", "io", "nojob", "1MB/s", datamgr=dm.address)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr and "'nojob'" in result.stderr


NODE_TIMEOUT = 5.0  # long enough for a CLI process to start on a busy machine, short enough to wait out


def _node_seen_by_the_data_manager(client: DataManagerClient, node_id: str) -> bool:
    return client.call(client.stub.GetNode, pb.GetNodeRequest(node_id=node_id)).available


@pytest.mark.expected_warnings  # the nodes stop reporting and are marked unavailable, as the test wants
def test_node_remove_refuses_a_node_whose_agent_reports_one_in_use_and_one_unknown_and_removes_an_idle_one(
    tmp_path: Path,
) -> None:
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, NODE_TIMEOUT)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        uri = make_local_dataset(tmp_path / "ds")
        client.register_node("n1", "h1:1", 2**30)
        client.register_node("n2", "h2:1", 2**30)  # registering counts as a report: both are available
        client.register_dataset(uri)
        client.register_job("j", uri, 10**6, [("n1", 1)])

        revision = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision
        reporting = silod_cli("node", "remove", "n2", datamgr=dm.address)
        assert reporting.returncode == 1
        # The data manager's refusal, as the CLI shows any: the rule is the server's, for every client.
        assert "silod: FAILED_PRECONDITION: node_id: node n2's agent reported" in reporting.stderr
        assert "stop it first" in reporting.stderr and f"--node-timeout after its last report ({NODE_TIMEOUT:g} s;" in (
            reporting.stderr
        )
        assert client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision == revision
        assert _node_seen_by_the_data_manager(client, "n2")  # still registered, still live: the refusal changed nothing

        eventually(lambda: not _node_seen_by_the_data_manager(client, "n2") or None, what="n2 unavailable")
        busy = silod_cli("node", "remove", "n1", datamgr=dm.address)
        assert busy.returncode == 1
        assert "FAILED_PRECONDITION" in busy.stderr and "node 'n1' runs workers of jobs ['j']" in busy.stderr
        unknown = silod_cli("node", "remove", "n9", datamgr=dm.address)
        assert unknown.returncode == 1
        assert "NOT_FOUND" in unknown.stderr and "'n9'" in unknown.stderr
        idle = silod_cli("node", "remove", "n2", datamgr=dm.address)
        assert idle.returncode == 0, idle.stderr
        assert "unregistered node n2 (revision" in idle.stdout

        assert [node.node_id for node in client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes] == ["n1"]


def test_a_gpu_job_the_nodes_cannot_hold_is_registered_with_a_warning_and_status_shows_each_nodes_gpus(
    tmp_path: Path,
) -> None:
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, STILL_ALIVE_SECONDS, policy="fifo")
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        uri = make_local_dataset(tmp_path / "ds")
        client.register_dataset(uri)
        client.register_node("n1", "h1:1", 2**30, gpus=2)
        client.register_node("n2", "h2:1", 2**30)  # a node agent offers no GPUs unless told to

        wide = silod_cli(
            "job", "add", "wide", "--dataset", uri, "--ideal-rate", "1MB/s", "--gpus", "4", datamgr=dm.address
        )
        assert wide.returncode == 0, wide.stderr
        assert "registered job wide" in wide.stdout
        assert "warning: the registered nodes offer 2 GPUs in all; job wide waits for its 4" in wide.stderr
        fits = silod_cli(
            "job", "add", "fits", "--dataset", uri, "--ideal-rate", "1MB/s", "--gpus", "2", datamgr=dm.address
        )
        assert fits.returncode == 0, fits.stderr
        assert "warning" not in fits.stderr

        lines = silod_cli("status", datamgr=dm.address).stdout.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("NODE "))
        assert lines[header].split() == ["NODE", "ADDRESS", "GPUS", "CACHE", "QUOTA", "STATE", "AGENT", "JOBS"]
        assert [line.split()[:3] for line in lines[header + 1 : header + 3]] == [
            ["n1", "h1:1", "2"],
            ["n2", "h2:1", "0"],
        ]


def test_an_unreachable_data_manager_exits_3(tmp_path: Path) -> None:
    result = silod_cli("status", datamgr="127.0.0.1:1")
    assert result.returncode == 3
    assert "cannot reach the data manager at 127.0.0.1:1" in result.stderr


@pytest.mark.parametrize(
    "command",
    [("status",), ("status", "--json"), ("status", "--watch", "1"), ("--help",)],
    ids=["status", "json", "watch", "help"],
)
@pytest.mark.parametrize("reader", ["gone", "full"])
def test_output_whose_reader_is_gone_or_that_cannot_be_written_ends_the_command_without_a_traceback(
    datamgr: RunningDataManager, command: tuple[str, ...], reader: str
) -> None:
    # `silod status | head -1` once head has exited (the pipe's reading end closed before anything is written,
    # so the outcome does not depend on timing), and `silod status > /dev/full`.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open("/dev/full", "w") as full:
        stdout = write_end if reader == "gone" else full
        environ = {**os.environ, "SILOD_DATAMGR": datamgr.address}
        result = subprocess.run(
            [*SILOD, *command], stdout=stdout, stderr=subprocess.PIPE, env=environ, text=True, timeout=60
        )
    os.close(write_end)
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr  # nor at exit's flush
    if reader == "gone":  # quietly, as `yes | head` ends; 141 as the shell reports a tool that SIGPIPE stopped
        assert result.returncode == 141
        assert "silod" not in result.stderr and "Error" not in result.stderr
    else:
        assert result.returncode == 1
        assert result.stderr.count("silod") == 1  # one line
        assert "silod: cannot write standard output: No space left on device\n" in result.stderr


@pytest.mark.expected_warnings  # the restarted data manager warns of the allocations over its lowered limit
def test_a_restart_with_a_lower_remote_io_limit_warns_and_lets_allocations_only_come_down_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 2_000_000, STILL_ALIVE_SECONDS)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        uri = make_local_dataset(tmp_path / "ds")
        client.register_node("n1", "h1:1", 2**30)
        client.register_dataset(uri)
        for job_id in ("j1", "j2"):
            client.register_job(job_id, uri, 10**6, [("n1", 1)])
        client.allocate_remote_io("j1", 1_000_000)
        client.register_tenant("t1", {"node": 0}, io_bytes_per_sec=600_000)
    with EmbeddedDataManager(replace(config, remote_io_limit=500_000)) as dm:
        assert (
            "--remote-io-limit 500.0 kB/s is below what the state dir holds: jobs are allocated 1.0 MB/s of remote "
            "IO and tenants reserve 600.0 kB/s" in caplog.text
        )
        environ = {"SILOD_DATAMGR": dm.address}
        assert main(["status"], environ) == 0
        assert "remote IO 1.0 MB/s of 500.0 kB/s (over the limit" in capsys.readouterr().out
        assert main(["alloc", "io", "j2", "1"], environ) == 1
        assert (
            "0 bytes/s (0 B/s) are left for job 'j2'; the other jobs are allocated 500000 bytes/s (500.0 kB/s) "
            "beyond the limit" in capsys.readouterr().err
        )
        assert main(["tenant", "add", "t2", "--cells", "node=0"], environ) == 0  # it reserves no remote IO
        assert main(["tenant", "add", "t3", "--cells", "node=0", "--remote-io", "1B/s"], environ) == 1
        assert "the other tenants reserve 600.0 kB/s of the remote IO limit of 500.0 kB/s" in capsys.readouterr().err
        assert main(["alloc", "io", "j1", "800kB/s"], environ) == 0  # lowering is how allocations come under it
        assert main(["alloc", "io", "j1", "900kB/s"], environ) == 1  # but never up while over it


def test_node_remove_right_after_a_restart_says_the_restart_keeps_the_node_live_not_its_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, STILL_ALIVE_SECONDS)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        client.register_node("n3", "h3:1", 2**30)  # its agent is gone from now on
    with EmbeddedDataManager(config) as dm:
        assert main(["node", "remove", "n3"], {"SILOD_DATAMGR": dm.address}) == 1
    refusal = capsys.readouterr().err
    assert "the data manager restarted 0 s ago and counts node n3 as live for its --node-timeout" in refusal
    assert "its agent has not reported since" in refusal and "agent reported" not in refusal


def test_a_data_manager_name_that_does_not_resolve_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    address = "nonsense.invalid:7420"  # .invalid never resolves (RFC 2606)
    assert main(["status", "--datamgr", address], environ={}) == 3
    assert f"cannot reach the data manager at {address}: the name does not resolve" in capsys.readouterr().err


def test_secret_options_from_the_environment_are_not_echoed(
    cluster: tuple[RunningDataManager, str], tmp_path: Path
) -> None:
    dm, _ = cluster
    os.environ["SILOD_TEST_SECRET"] = "hunter2-very-secret"
    try:
        result = silod_cli(
            "dataset",
            "add",
            "file:///nonexistent",
            "--option-env",
            "account_key=SILOD_TEST_SECRET",
            datamgr=dm.address,
        )
    finally:
        del os.environ["SILOD_TEST_SECRET"]
    assert result.returncode == 1  # file:// takes no account_key
    assert "account_key" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--listen", "nonsense"), "must be HOST:PORT"),
        (("--remote-io-limit", "1G"), "ambiguous"),
        (("--remote-io-limit", "0"), "rate '0' is 0, which lets no job read remotely; leave the flag out for no limit"),
        (("--remote-io-limit", "0GB/s"), "rate '0GB/s' is 0"),
        (("--node-timeout", "0"), "positive number of seconds"),
        (("--node-timeout", "inf"), "argument --node-timeout: 'inf' must be a positive number of seconds from 0.1"),
        # 38,421 rounds, each with its log line, in 8 s; and "every infs".
        (("--round", "1e-9"), "argument --round: '1e-9' must be a positive number of seconds from 0.1 to 86,400"),
        (("--round", "inf"), "argument --round: 'inf' must be a positive number of seconds from 0.1 to 86,400"),
        # Knobs without the policy they are for were dropped without a word.
        (("--policy-option", "queues=1h"), "--policy-option queues=1h: --policy-option needs --policy NAME"),
        (
            ("--policy", "tiresias-las", "--policy-option", "queues=1h", "--policy-option", "queues=2h"),
            "argument --policy-option: queues given twice (queues=1h, queues=2h); give it once",
        ),
        (("--listen", "127.0.0.1:99999"), "--listen '127.0.0.1:99999' must be HOST:PORT with a PORT from 0 to"),
        # 192.0.2.0/24 is documentation space (RFC 5737): never an address of this machine; binding sends nothing.
        (("--listen", "192.0.2.1:7420"), "cannot listen on 192.0.2.1:7420: 192.0.2.1 is not an address of this"),
    ],
)
def test_serve_refuses_bad_flags(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    result = silod_cli("datamgr", "serve", "--state-dir", str(tmp_path / "s"), *args)
    assert result.returncode == 2
    assert fragment in result.stderr


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.1:99999", "nonsense"])
def test_a_listen_address_that_is_no_host_and_port_is_refused_before_the_state_dir_is_made(
    tmp_path: Path, listen: str
) -> None:
    # The state dir, its lock and database were made first, then the address refused.
    result = silod_cli("datamgr", "serve", "--state-dir", str(tmp_path / "s"), "--listen", listen)
    assert result.returncode == 2 and f"--listen '{listen}' must be HOST:PORT" in result.stderr
    assert not (tmp_path / "s").exists()


def test_status_of_an_empty_cluster_shows_empty_tables(datamgr: RunningDataManager) -> None:
    result = silod_cli("status", datamgr=datamgr.address)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(none)") == 3


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("datamgr", "serve", "--state-dir", ""), "--state-dir"),
        (("mount", "", "--cache-dir", "c", "--datamgr", "127.0.0.1:1"), "MOUNTPOINT"),
        (("mount", "m", "--cache-dir", " ", "--datamgr", "127.0.0.1:1"), "--cache-dir"),
        (("sim", "--scenario", "micro", "--out", ""), "--out"),
        (("--config", "", "status"), "--config"),
    ],
    ids=["state-dir", "mountpoint", "cache-dir", "sim-out", "config"],
)
def test_an_empty_path_is_refused_by_name_and_nothing_is_written_where_it_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    named: str,
) -> None:
    # Path("") is the working directory: `--state-dir "$UNSET"` used to create silod.db wherever it ran.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(list(args), environ={})
    assert exited.value.code == 2
    assert f"argument {named}: an empty path is not a path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_path_in_a_config_file_is_refused_by_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "silod.toml"
    settings.write_text('[datamgr]\nstate-dir = ""\n')
    assert main(["--config", str(settings), "datamgr", "serve"], environ={}) == 2
    assert "[datamgr] state-dir: an empty path is not a path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [settings]


def test_a_state_dir_whose_database_is_damaged_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "silod.db").write_bytes(b"not a database\n" * 100)
    assert main(["datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path)], environ={}) == 2
    err = capsys.readouterr().err
    assert f"cannot use state dir {tmp_path}: {tmp_path / 'silod.db'} is damaged or not a silod database" in err
    assert "Traceback" not in err
    assert (tmp_path / "silod.db").read_bytes() == b"not a database\n" * 100


def test_a_data_manager_started_on_a_full_state_disk_exits_2_saying_so_and_the_state_dir_works_once_freed(
    tmpfs: TmpfsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disk = tmpfs(tmp_path / "state-disk", "1m")
    filler = fill_up(disk)
    os.truncate(filler, filler.stat().st_size - 8192)  # room for the state dir and its lock, not for a database
    state_dir = disk / "state"
    assert main(["datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(state_dir)], environ={}) == 2
    err = capsys.readouterr().err
    assert f"cannot use state dir {state_dir}: database or disk is full; free space on its disk" in err
    assert "Traceback" not in err
    filler.unlink()
    store = SQLiteStore(state_dir)  # what the data manager's next start opens: the lock was given back
    assert store.load().revision == 0
    store.close()


def _state_of_2000_nodes(state_dir: Path) -> None:
    """A state dir whose database is some 200 kB: 2,000 registered nodes."""
    store = SQLiteStore(state_dir)
    store.commit([Commit(1, Change(nodes_put=tuple(Node(f"n{i:04d}", "h1:7421", 10_000) for i in range(2000))))])
    store.close()


@pytest.mark.parametrize("state", ["no database", "a damaged database"])
def test_a_backup_of_a_state_dir_without_a_readable_database_exits_2_and_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    if state == "a damaged database":
        (state_dir / "silod.db").write_bytes(b"not a database\n" * 100)
    out = tmp_path / "backup.db"
    assert main(["datamgr", "backup", "--state-dir", str(state_dir), str(out)], environ={}) == 2
    why = "it has no state database (silod.db)" if state == "no database" else "is damaged or not a silod database"
    assert why in capsys.readouterr().err
    assert not out.exists()


def test_a_backup_of_a_stopped_data_managers_state_dir_leaves_its_files_as_they_were(tmp_path: Path) -> None:
    """A read-only connection left an empty write-ahead log and a shared-memory index beside the database."""
    state_dir, out = tmp_path / "state", tmp_path / "backup.db"
    _state_of_2000_nodes(state_dir)
    before = files_of(state_dir)

    backup = silod_cli("datamgr", "backup", "--state-dir", str(state_dir), str(out))

    assert backup.returncode == 0, backup.stderr
    assert files_of(state_dir) == before
    restored = tmp_path / "restored"
    assert silod_cli("datamgr", "restore", "--state-dir", str(restored), str(out)).returncode == 0
    assert revision_and_nodes(restored) == (1, [f"n{i:04d}" for i in range(2000)])


@pytest.mark.parametrize("backup", ["missing", "another SQLite database", "damaged", "damaged past its header"])
def test_a_restore_from_a_file_that_is_no_silod_backup_exits_2_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backup: str
) -> None:
    state_dir = tmp_path / "state"
    SQLiteStore(state_dir).close()
    database = (state_dir / "silod.db").read_bytes()
    given = tmp_path / "backup.db"
    if backup == "another SQLite database":
        sqlite3.connect(given).execute("CREATE TABLE t (x)").connection.close()
    elif backup == "damaged":
        given.write_bytes(b"not a database\n" * 100)
    elif backup == "damaged past its header":  # a real backup whose tables' pages were lost: SQLite copies them
        _state_of_2000_nodes(tmp_path / "other")
        back_up(tmp_path / "other", given)
        damage_tables(given)
    assert main(["datamgr", "restore", "--state-dir", str(state_dir), str(given)], environ={}) == 2
    why = {
        "missing": f"cannot restore {given}: no such file",
        "another SQLite database": f"cannot restore {given}: it is not a silod state database",
        "damaged": f"cannot restore {given}: {given} is damaged or not a silod database",
        "damaged past its header": f"cannot restore {given}: {given} is damaged or not a silod database",
    }[backup]
    assert why in capsys.readouterr().err
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock", "silod.db"]
    assert (state_dir / "silod.db").read_bytes() == database


def test_a_backup_onto_a_full_disk_exits_2_saying_so_and_leaves_no_file(
    tmpfs: TmpfsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    _state_of_2000_nodes(state_dir)
    out = tmpfs(tmp_path / "small-disk", "64k") / "backup.db"
    assert main(["datamgr", "backup", "--state-dir", str(state_dir), str(out)], environ={}) == 2
    err = capsys.readouterr().err
    assert f"cannot back up state dir {state_dir} to {out}: database or disk is full; nothing was written" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_restore_onto_a_full_state_disk_exits_2_saying_so_and_leaves_the_state_dir_as_it_was(
    tmpfs: TmpfsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "backup.db"
    _state_of_2000_nodes(tmp_path / "other")
    back_up(tmp_path / "other", given)
    disk = tmpfs(tmp_path / "state-disk", "1m")
    state_dir = disk / "state"
    SQLiteStore(state_dir).close()
    database = (state_dir / "silod.db").read_bytes()
    room = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * (room - given.stat().st_size // 2))  # room for half the backup
    assert main(["datamgr", "restore", "--state-dir", str(state_dir), str(given)], environ={}) == 2
    err = capsys.readouterr().err
    assert f"cannot restore {given} into state dir {state_dir}: database or disk is full; it is as it was" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock", "silod.db"]
    assert (state_dir / "silod.db").read_bytes() == database


@pytest.mark.parametrize("beside", ["a write-ahead log", "a rollback journal"])
def test_a_restore_from_a_database_with_a_log_beside_it_exits_2_saying_what_to_restore_instead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], beside: str
) -> None:
    """A restore reads the file alone: given the `silod.db` of a data manager that was killed, it silently dropped
    the acknowledged changes its log held (or, the log holding most of them, called it "not a silod state
    database"). A journal beside a file says the copy was never finished (a backup killed midway, before backups
    were written under another name)."""
    state_dir = tmp_path / "state"
    SQLiteStore(state_dir).close()
    database = (state_dir / "silod.db").read_bytes()
    if beside == "a write-ahead log":
        killed = tmp_path / "killed"
        killed_state_dir(killed, 3)
        given = killed / "silod.db"
    else:
        given = tmp_path / "backup.db"
        _state_of_2000_nodes(tmp_path / "other")
        back_up(tmp_path / "other", given)
        Path(f"{given}-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + bytes(504))  # a journal's magic

    assert main(["datamgr", "restore", "--state-dir", str(state_dir), str(given)], environ={}) == 2

    err = capsys.readouterr().err
    if beside == "a write-ahead log":
        assert f"cannot restore {given}: a write-ahead log ({given}-wal) is beside it, holding changes a restore" in err
        assert f"back that state dir up with silod datamgr backup --state-dir {killed} FILE, which reads the log" in err
    else:
        assert f"cannot restore {given}: a rollback journal ({given}-journal) is beside it" in err
    assert "nothing was changed" in err and "Traceback" not in err
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock", "silod.db"]
    assert (state_dir / "silod.db").read_bytes() == database
    if beside == "a write-ahead log":  # the advice, followed, restores every acknowledged change
        assert main(["datamgr", "backup", "--state-dir", str(killed), str(tmp_path / "b.db")], environ={}) == 0
        assert main(["datamgr", "restore", "--state-dir", str(state_dir), str(tmp_path / "b.db")], environ={}) == 0
        assert revision_and_nodes(state_dir) == (3, ["killed1", "killed2", "killed3"])


@pytest.mark.parametrize("command", ["serve", "backup", "restore"])
def test_a_database_holding_a_row_this_silod_cannot_read_is_not_served_backed_up_or_restored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """One changed byte in a row's JSON, in a database SQLite finds whole (`quick_check` passes): the data manager
    exited 1 with a JSONDecodeError traceback, and backups and restores took the file as a good one."""
    state_dir = tmp_path / "state"
    store = SQLiteStore(state_dir)
    store.commit([Commit(1, Change(nodes_put=(Node("n1", "h1:7421", 10_000),)))])
    store.commit([Commit(2, Change(tenants_put=(Tenant("t1", {"node": 1}),)))])
    store.close()
    damaged = tmp_path / "backup.db" if command == "restore" else state_dir / "silod.db"
    if command == "restore":
        back_up(state_dir, damaged)
        state_dir = tmp_path / "other"
        SQLiteStore(state_dir).close()
    edit(damaged, """UPDATE tenants SET cells = '{"node": 1]'""")
    before = damaged.read_bytes()
    args = {
        "serve": ["serve", "--listen", "127.0.0.1:0", "--state-dir", str(state_dir)],
        "backup": ["backup", "--state-dir", str(state_dir), str(tmp_path / "new-backup.db")],
        "restore": ["restore", "--state-dir", str(state_dir), str(damaged)],
    }[command]

    assert main(["datamgr", *args], environ={}) == 2

    err = capsys.readouterr().err
    refused = {
        "serve": f"cannot use state dir {state_dir}",
        "backup": f"cannot back up state dir {state_dir}",
        "restore": f"cannot restore {damaged}",
    }[command]
    assert f"{refused}: {damaged} holds a row this silod cannot read: table tenants, row 't1': column cells " in err
    assert ("nothing was written" if command == "backup" else "nothing was changed") in err
    assert "Traceback" not in err
    assert damaged.read_bytes() == before
    assert not (tmp_path / "new-backup.db").exists()
    if command == "restore":
        assert revision_and_nodes(state_dir) == (0, [])


@pytest.mark.parametrize("database", ["unreadable to it", "readable by all, but not its to make private"])
def test_a_state_dir_whose_database_another_user_owns_exits_2_naming_the_file(shared_dir: Path, database: str) -> None:
    """The data manager run as another user (a service account) than the one who made its state dir's database
    (root, once): it exited 1 with a traceback, SQLite's "unable to open database file" naming no file, or
    PermissionError from chmod."""
    if os.geteuid() != 0:
        missing_dependency("root, to run the data manager as another user (setpriv)")
    nobody = pwd.getpwuid(65534).pw_name
    state_dir = shared_dir / "state"
    SQLiteStore(state_dir).close()
    for path in (state_dir, state_dir / "lock"):  # the directory given to the user, its database left to root's
        os.chown(path, 65534, 65534)
    if database != "unreadable to it":
        (state_dir / "silod.db").chmod(0o666)
    before = files_of(state_dir)

    refused = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
         *SILOD, "datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert refused.returncode == 2, refused.stderr
    why = "Permission denied" if database == "unreadable to it" else "Operation not permitted (making it private"
    assert f"silod: cannot use state dir {state_dir}: {state_dir / 'silod.db'}: {why}" in refused.stderr
    advice = "nothing was changed: give the state dir and its files to the user the data manager runs as"
    assert f"{advice} (chown -R {nobody} {state_dir})" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert files_of(state_dir) == before


def test_a_backup_killed_midway_leaves_no_file_under_its_name_and_a_retry_makes_it(tmp_path: Path) -> None:
    """strace kills the backup at its 20th write: before, it left a partial FILE with its journal, and a retry was
    refused with "File exists"."""
    if shutil.which("strace") is None:
        missing_dependency("strace is not installed (make setup installs it)")
    state_dir, out = tmp_path / "state", tmp_path / "backup.db"
    _state_of_2000_nodes(state_dir)

    killed = subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64", "-e", "inject=pwrite64:signal=KILL:when=20",
         *SILOD, "datamgr", "backup", "--state-dir", str(state_dir), str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert killed.returncode != 0
    assert not os.path.lexists(out) and not os.path.lexists(f"{out}-journal")
    assert [p.name.split("-")[0] for p in tmp_path.glob("backup.db.partial-*")] == ["backup.db.partial"]
    again = silod_cli("datamgr", "backup", "--state-dir", str(state_dir), str(out))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"backed up state dir {state_dir} at revision 1 to {out}"
    restored = tmp_path / "restored"
    assert silod_cli("datamgr", "restore", "--state-dir", str(restored), str(out)).returncode == 0
    assert revision_and_nodes(restored) == (1, [f"n{i:04d}" for i in range(2000)])


@pytest.mark.parametrize("where", ["/proc/silod-test", "a-file"], ids=["under-proc", "a-file-in-the-way"])
def test_a_state_or_cache_dir_that_cannot_be_made_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "a-file").write_text("")
    unusable = where if where.startswith("/") else str(tmp_path / where)
    why = f"{unusable} is not a directory" if where == "a-file" else ""  # not mkdir's "File exists"
    assert main(["datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", unusable], environ={}) == 2
    assert f"cannot use state dir {unusable}: {why}" in capsys.readouterr().err
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    job = f"j=file://{tmp_path}"
    assert main(["mount", str(mountpoint), "--cache-dir", unusable, "--job", job, "--foreground"], environ={}) == 2
    assert f"cannot use --cache-dir {unusable}: {why}" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", ["new/", "existing", "existing/", "existing/."])
def test_a_backup_to_a_directory_exits_2_saying_a_backup_wants_a_file_path(tmp_path: Path, spelling: str) -> None:
    """`Path` drops a trailing slash: "new/" made a file named `new`, and an existing directory was refused as
    "File exists". Neither writes anything."""
    state_dir = tmp_path / "state"
    SQLiteStore(state_dir).close()
    (tmp_path / "existing").mkdir()
    given = f"{tmp_path}/{spelling}"  # as typed: `tmp_path / spelling` would drop the slash too
    refused = silod_cli("datamgr", "backup", "--state-dir", str(state_dir), given)
    assert refused.returncode == 2
    err = refused.stderr
    assert f"{given}: it is a directory" in err or f"{given} names a directory" in err, err
    assert "Traceback" not in err
    assert "a backup is a new file: give the file's path" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "state"]
    assert list((tmp_path / "existing").iterdir()) == []


def test_a_restore_from_a_directory_exits_2_saying_it_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    SQLiteStore(state_dir).close()
    database = (state_dir / "silod.db").read_bytes()
    assert main(["datamgr", "restore", "--state-dir", str(state_dir), str(tmp_path)], environ={}) == 2
    assert f"cannot restore {tmp_path}: it is a directory, not a backup file" in capsys.readouterr().err
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock", "silod.db"]
    assert (state_dir / "silod.db").read_bytes() == database


def _cli(*args: str) -> int:
    return main(["datamgr", *args], environ={})


def test_a_backup_of_a_state_dir_whose_log_header_is_damaged_exits_2_naming_the_log_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite ignores a log whose header it does not take: the backup copied what the database alone held (revision
    0, no node) and called it done, rewriting the shared-memory index, while the start refused the state dir."""
    state_dir, out = tmp_path / "state", tmp_path / "backup.db"
    killed_state_dir(state_dir, 3)
    damage_log_header(state_dir)
    before = files_of(state_dir)

    assert _cli("backup", "--state-dir", str(state_dir), str(out)) == 2

    err = capsys.readouterr().err
    log = state_dir / "silod.db-wal"
    assert (
        f"cannot back up state dir {state_dir}: {log}, the write-ahead log of {state_dir / 'silod.db'}, is damaged"
        in err
    )
    assert "nothing was changed" in err and "Traceback" not in err
    assert files_of(state_dir) == before
    assert not out.exists()


def test_a_backup_of_a_linked_database_reads_the_log_beside_the_file_the_link_names(tmp_path: Path) -> None:
    """`silod.db` linking to a database on another volume, whose data manager was killed: the backup looked for the
    log beside the link, found none, and copied the file alone (revision 0) as a whole backup."""
    volume, state_dir, out = tmp_path / "volume", tmp_path / "state", tmp_path / "backup.db"
    killed_state_dir(volume, 3)
    linked_state_dir(state_dir, volume)

    taken = silod_cli("datamgr", "backup", "--state-dir", str(state_dir), str(out))

    assert taken.returncode == 0, taken.stderr
    assert f"at revision 3 to {out}" in taken.stdout
    restored = tmp_path / "restored"
    assert _cli("restore", "--state-dir", str(restored), str(out)) == 0
    assert revision_and_nodes(restored) == (3, ["killed1", "killed2", "killed3"])


def test_a_restore_from_a_link_to_a_database_with_a_log_beside_it_exits_2_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check of a log beside the backup looked beside the link: the restore read the file alone and restored
    revision 0, dropping the acknowledged changes its log held."""
    killed, state_dir, given = tmp_path / "killed", tmp_path / "state", tmp_path / "link.db"
    killed_state_dir(killed, 3)
    given.symlink_to(killed / "silod.db")

    assert _cli("restore", "--state-dir", str(state_dir), str(given)) == 2

    err = capsys.readouterr().err
    assert (
        f"cannot restore {given}: a write-ahead log ({killed / 'silod.db-wal'}) is beside the file it links to "
        f"({killed / 'silod.db'})"
    ) in err
    assert f"back that state dir up with silod datamgr backup --state-dir {killed} FILE" in err
    assert not state_dir.exists()


def test_a_restore_into_a_state_dir_whose_database_links_to_another_volume_restores_the_file_it_names(
    tmp_path: Path,
) -> None:
    """The restore kept the link as `silod.db.replaced-TIME` and put a regular file in its place: the database moved
    off its volume to the state dir's disk without a word. Now the link stays, the restored database is the file it
    names, and the one it replaces is kept beside that file."""
    volume, state_dir, given = tmp_path / "volume", tmp_path / "state", tmp_path / "backup.db"
    state_of_nodes(tmp_path / "other", 2, prefix="b")
    back_up(tmp_path / "other", given)
    state_of_nodes(volume, 1, prefix="old")
    (volume / "lock").unlink()
    link = linked_state_dir(state_dir, volume)

    restored = silod_cli("datamgr", "restore", "--state-dir", str(state_dir), str(given))

    assert restored.returncode == 0, restored.stderr
    kept = Path(restored.stdout.strip().rsplit(" ", 1)[1])
    assert kept.parent == volume and kept.name.startswith("silod.db.replaced-")
    assert link.is_symlink() and link.readlink() == volume / "silod.db"
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock", "silod.db"]
    assert sorted(p.name for p in volume.iterdir()) == ["silod.db", kept.name]
    assert revision_and_nodes(state_dir) == (1, ["b0000", "b0001"])
    old = tmp_path / "old"
    old.mkdir()
    shutil.copyfile(kept, old / "silod.db")
    assert revision_and_nodes(old) == (1, ["old0000"])


@pytest.mark.parametrize("command", ["backup", "restore"])
@pytest.mark.parametrize("dangling", ["silod.db", "the state dir"])
def test_a_backup_or_restore_through_a_link_to_nothing_exits_2_naming_the_link_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, dangling: str
) -> None:
    """A link to a volume that is not mounted. The backup said "it has no state database (silod.db)", naming neither
    the link nor where it points; a restore into a state dir that is such a link said only "File exists"; and a
    restore over a `silod.db` that is one replaced the link with a new file on the state dir's disk."""
    given = tmp_path / "backup.db"
    state_of_nodes(tmp_path / "other", 1)
    back_up(tmp_path / "other", given)
    nowhere = tmp_path / "unmounted"
    if dangling == "silod.db":
        state_dir = tmp_path / "state"
        link = linked_state_dir(state_dir, nowhere)
    else:
        state_dir = link = tmp_path / "state"
        link.symlink_to(nowhere / "state")
    before = sorted(os.listdir(tmp_path))
    args = [str(state_dir), str(tmp_path / "out.db")] if command == "backup" else [str(state_dir), str(given)]

    assert _cli(command, "--state-dir", *args) == 2

    err = capsys.readouterr().err
    refused = (
        f"cannot back up state dir {state_dir}" if command == "backup" else f"cannot restore into state dir {state_dir}"
    )
    assert f"{refused}: {link} is a symbolic link to {os.readlink(link)}, which does not exist" in err, err
    assert (
        "nothing was changed: mount the volume" in err and f"then {command.replace('backup', 'back up')} again" in err
    )
    assert sorted(os.listdir(tmp_path)) == before
    assert link.is_symlink() and not link.exists()
    if dangling == "silod.db":
        assert sorted(p.name for p in state_dir.iterdir()) == ["silod.db"]


def test_a_restore_from_a_pipe_exits_2_saying_it_is_not_a_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "no such file" for a FIFO, or /dev/null, that is there."""
    pipe = tmp_path / "backup.fifo"
    os.mkfifo(pipe)
    for given in (pipe, Path("/dev/null")):
        assert _cli("restore", "--state-dir", str(tmp_path / "state"), str(given)) == 2
        assert f"cannot restore {given}: it is not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("there", ["a file", "a symbolic link"])
def test_a_backup_to_a_name_already_taken_exits_2_asking_for_another_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], there: str
) -> None:
    """It said a bare "File exists", for a link to nothing too."""
    state_dir, out = tmp_path / "state", tmp_path / "backup.db"
    state_of_nodes(state_dir, 1)
    if there == "a file":
        out.write_text("keep me\n")
    else:
        out.symlink_to(tmp_path / "nowhere")

    assert _cli("backup", "--state-dir", str(state_dir), str(out)) == 2

    err = capsys.readouterr().err
    assert f"cannot write the backup {out}: {there} of that name is there, and a backup never replaces one" in err
    assert "nothing was written: give the backup another name" in err
    assert out.is_symlink() if there == "a symbolic link" else out.read_text() == "keep me\n"


def _register_job_as_before_tenants(request: pb.RegisterJobRequest, context: Any) -> pb.RegisterJobResponse:
    """RegisterJob as a data manager from before tenants, priorities and job classes answered it: protobuf drops
    the request's fields it does not know, so its reply holds only those it did."""
    job = pb.Job(
        job_id=request.job_id, dataset_uri=request.dataset_uri, ideal_bytes_per_sec=request.ideal_bytes_per_sec
    )
    job.workers.extend(request.workers)
    job.epochs = request.epochs
    return pb.RegisterJobResponse(job=job, created=True, revision=7)


@pytest.fixture
def fake_old_data_manager() -> Iterator[str]:
    """A real gRPC server that serves only RegisterJob, answering as a data manager older than tenants would (a
    fake: an old silod is not installed here); every other call gets gRPC's own UNIMPLEMENTED, as from any data
    manager older than the call."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(
        _register_job_as_before_tenants,
        request_deserializer=pb.RegisterJobRequest.FromString,
        response_serializer=pb.RegisterJobResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("silod.v1.DataManager", {"RegisterJob": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_a_job_registered_by_a_fake_old_data_manager_without_the_options_it_ignored_exits_1_naming_them(
    fake_old_data_manager: str,
) -> None:
    uri = "file:///data/ds"
    low = silod_cli(
        "job", "add", "jt", "--dataset", uri, "--ideal-rate", "1MB/s", "--worker", "n1",
        "--tenant", "research", "--priority", "low", "--epochs", "3", datamgr=fake_old_data_manager,
    )  # fmt: skip
    assert low.returncode == 1, low.stdout + low.stderr
    assert "registered job" not in low.stdout
    assert (
        f"the data manager at {fake_old_data_manager} registered job jt without --tenant, --priority low: it is older "
        "than those options and ignored them. Finish the job (`silod job finish jt`) unless it should run as "
        "registered, and upgrade the data manager"
    ) in low.stderr
    plain = silod_cli(
        "job", "add", "j2", "--dataset", uri, "--ideal-rate", "1MB/s", "--worker", "n1", "--epochs", "3",
        datamgr=fake_old_data_manager,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "registered job j2" in plain.stdout


def test_a_call_a_data_manager_does_not_serve_is_named_as_too_new_for_it(fake_old_data_manager: str) -> None:
    result = silod_cli("tenant", "list", datamgr=fake_old_data_manager)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"silod: the data manager at {fake_old_data_manager} does not know this command's call: it is older than this "
        "silod; upgrade it, or use a silod of its version"
    ) in result.stderr
