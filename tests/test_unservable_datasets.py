"""A dataset a node cannot open, seen from the data manager: the node's agent says so in its usage reports
(`DatasetUsage.open_error`, the reason it logs), the data manager logs a WARNING when a node first reports it and an
INFO once it clears, and `silod status` names the node, the dataset, the jobs that wait there and the reason under
the jobs table, where those jobs otherwise show as running.

End to end with a data manager and a node agent as processes, a real FUSE mount and real storage (an AWS profile
the data manager's host has and the node's lacks; a dataset directory the node cannot reach), and against a real
gRPC data manager fed the reports an agent sends (the data manager's side, with older agents' reports)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.devservers import S3Server
from silodpb.v1 import datamgr_pb2 as pb
from tests.cluster_fixtures import System, eventually
from tests.credential_fixtures import node_lacking_a_profile
from tests.datamgr_fixtures import DataManagerProcess, RunningDataManager, make_local_dataset, silod_cli
from tests.mount_fixtures import MountProcess
from tests.storage_servers import DatasetTargetFactory

PROFILE = "datamgr-only"
KEYS = ("access_key_id", "secret_access_key")
REASON = "s3://b/train: option 'profile': no such AWS profile"


def _status(address: str, *args: str) -> str:
    """`silod status ARGS`'s output, as an operator runs it."""
    result = silod_cli("status", *args, datamgr=address)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _unopened_lines(status: str) -> list[str]:
    """The lines `silod status` shows under its jobs table for datasets nodes cannot open."""
    return [line for line in status.splitlines() if line.startswith("  node ") and " cannot open " in line]


def _usage_row(address: str, uri: str, node_id: str) -> str:
    """The node's row of `silod dataset show URI`'s usage table."""
    result = silod_cli("dataset", "show", uri, datamgr=address)
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith(f"{node_id} ")]
    return row


def _log_lines(path: Path, containing: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if containing in line]


@pytest.fixture
def node_lacking_the_profile(
    tmp_path: Path, datamgr_process: DataManagerProcess, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MountProcess]:
    """The data manager started with AWS profile PROFILE (the S3 server's keys), and node n1's agent started without
    it: options naming the profile are good for the one and refused by the other, as where the node's host lacks a
    profile the data manager's has. Stopped after the test."""
    agent = node_lacking_a_profile(tmp_path, datamgr_process, s3_server, monkeypatch, PROFILE)
    try:
        yield agent.start()
    finally:
        agent.stop()


def test_status_names_the_node_the_dataset_its_waiting_job_and_the_agents_reason_until_set_options_opens_it(
    datamgr_process: DataManagerProcess,
    node_lacking_the_profile: MountProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
) -> None:
    node, address = node_lacking_the_profile, datamgr_process.address
    target = dataset_target_factory("s3")
    target.put("f0.bin", b"silod" * 200)
    by_profile = {key: value for key, value in target.options.items() if key not in KEYS}
    with DataManagerClient(address, timeout=10) as client:
        client.register_dataset(target.uri, {**by_profile, "profile": PROFILE})
        client.register_job("j1", target.uri, 100_000_000, [("n1", 1)])
        client.allocate_remote_io("j1", 100_000_000)

        (shown,) = eventually(lambda: _unopened_lines(_status(address)), what="status naming the dataset n1 lacks")
        waiting = f"  node n1 cannot open {target.uri}, so job j1 waits there: "
        assert shown.startswith(waiting) and shown.endswith("option 'profile': no such AWS profile")
        reason = shown.removeprefix(waiting)
        (logged,) = node.log_lines("cannot serve dataset")
        assert logged.endswith(f"ERROR fuseclient.node_datasets: cannot serve dataset {target.uri}: {reason}")
        (usage,) = json.loads(_status(address, "--json"))["datasets"][0]["usage"]
        assert usage == {
            "node_id": "n1",
            "dataset_uri": target.uri,
            "cached_bytes": "0",
            "cached_items": "0",
            "open_error": reason,
            "options_error": "",
        }
        (warning,) = _log_lines(datamgr_process.log_path, "cannot open dataset")
        assert warning.endswith(
            f"WARNING datamgr.liveness: node n1 cannot open dataset {target.uri}, so its jobs there wait: {reason}"
        )
        assert _usage_row(address, target.uri, "n1").endswith(f"cannot open it: {reason}")

        # The data manager sends the dataset again at a quota change: the agent tries it again, but the same cause
        # makes no second ERROR (events apply in order: by the time j1's directory appears, this one was tried).
        client.allocate_cache_size(target.uri, 500)
        client.update_dataset_options(target.uri, {key: target.options[key] for key in KEYS}, ["profile"])
        job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory")
        assert (job_dir / "f0.bin").read_bytes() == b"silod" * 200
        assert node.log_lines("cannot serve dataset") == [logged]
        opened = f"INFO datamgr.liveness: node n1 opened dataset {target.uri}: its jobs there run"
        eventually(lambda: _log_lines(datamgr_process.log_path, opened), what="the data manager hearing it opened")
    status = _status(address)
    assert not _unopened_lines(status) and "j1" in status
    assert _log_lines(datamgr_process.log_path, "cannot open dataset") == [warning]  # one WARNING, at the first
    assert s3_server.secret_access_key not in datamgr_process.log_path.read_text() + shown + status


def test_a_job_finished_while_its_node_could_not_reach_its_dataset_leaves_status_and_the_data_manager_says_so(
    system: System,
) -> None:
    """A file:// dataset whose directory the node cannot reach when the dataset arrives (a share not mounted
    there): the status line names the agent's reason; once the job finishes, the node no longer needs the dataset,
    its next report drops it, and the line goes."""
    node = system.start_node("n1")
    address, log = system.datamgr.address, system.datamgr.log_path
    system.client.register_dataset(system.uri)
    shutil.move(system.root / "dataset", system.root / "elsewhere")  # after the data manager listed it
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 100_000_000)

    (shown,) = eventually(lambda: _unopened_lines(_status(address)), what="status naming the dataset n1 cannot reach")
    (logged,) = node.log_lines("cannot serve dataset")
    assert shown.startswith(f"  node n1 cannot open {system.uri}, so job j1 waits there: {system.uri}")
    assert logged.endswith(shown.split(" waits there: ")[1])
    (warning,) = _log_lines(log, "cannot open dataset")
    assert "WARNING" in warning

    system.client.call(system.client.stub.FinishJob, pb.FinishJobRequest(job_id="j1"))
    cleared = f"INFO datamgr.liveness: node n1 no longer needs dataset {system.uri}, which it could not open"
    eventually(lambda: _log_lines(log, cleared), what="the data manager hearing the node no longer needs it")
    assert not _unopened_lines(_status(address))
    assert _log_lines(log, "cannot open dataset") == [warning]


def _report(datamgr: RunningDataManager, node_id: str, *datasets: pb.DatasetUsage) -> None:
    """A usage report as node `node_id`'s agent sends one (an agent without an id)."""
    request = pb.ReportUsageRequest(node_id=node_id, datasets=datasets)
    datamgr.client.call(datamgr.client.stub.ReportUsage, request)


def _liveness_records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "datamgr.liveness"]


@pytest.mark.expected_warnings  # the data manager's WARNING for the failure reported, asserted below
def test_the_data_manager_warns_once_while_a_node_reports_a_dataset_it_cannot_open_and_says_when_that_clears(
    datamgr: RunningDataManager, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = make_local_dataset(tmp_path / "data")
    datamgr.client.register_node("n1", "h1:1", 2**30)
    datamgr.client.register_dataset(uri)
    datamgr.client.register_job("j1", uri, 100_000_000, [("n1", 1)])
    unopened = pb.DatasetUsage(dataset_uri=uri, open_error=REASON)
    warned = ("WARNING", f"node n1 cannot open dataset {uri}, so its jobs there wait: {REASON}")

    for _ in range(3):
        _report(datamgr, "n1", unopened)
    assert _liveness_records(caplog) == [warned]

    for _ in range(2):  # it opened: its cache reported as every agent reports it
        _report(datamgr, "n1", pb.DatasetUsage(dataset_uri=uri, cached_bytes=1000, cached_items=1))
    assert _liveness_records(caplog) == [warned, ("INFO", f"node n1 opened dataset {uri}: its jobs there run")]

    caplog.clear()
    _report(datamgr, "n1", unopened)
    _report(datamgr, "n1", pb.DatasetUsage(dataset_uri=uri, open_error="another reason"))
    _report(datamgr, "n1")  # no longer sent to the node: the job finished, say
    assert _liveness_records(caplog) == [
        warned,
        ("WARNING", f"node n1 cannot open dataset {uri}, so its jobs there wait: another reason"),
        ("INFO", f"node n1 no longer needs dataset {uri}, which it could not open"),
    ]


@pytest.mark.expected_warnings  # the data manager's WARNING for the failure reported
def test_status_shows_only_the_nodes_that_report_a_dataset_unopened_under_the_jobs_table_escaped(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    """n1 reports the dataset unopened (with a control character, shown escaped: the text comes from a node);
    n2, whose agent is older than the report's field, reports it as it always has, and shows nothing new."""
    uri = make_local_dataset(tmp_path / "data")
    for node_id in ("n1", "n2"):
        datamgr.client.register_node(node_id, f"{node_id}:1", 2**30)
    datamgr.client.register_dataset(uri)
    datamgr.client.register_job("j1", uri, 100_000_000, [("n1", 1), ("n2", 1)])
    datamgr.client.register_job("j2", uri, 100_000_000, [("n1", 1)])
    datamgr.client.register_job("j3", uri, 100_000_000, [("n2", 1)])
    _report(datamgr, "n2", pb.DatasetUsage(dataset_uri=uri, cached_bytes=1000, cached_items=1))
    assert not _unopened_lines(_status(datamgr.address))

    _report(datamgr, "n1", pb.DatasetUsage(dataset_uri=uri, open_error=f"{REASON}\x1b[2J"))
    lines = _status(datamgr.address).splitlines()
    shown = f"  node n1 cannot open {uri}, so jobs j1, j2 wait there: {REASON}\\x1b[2J"
    assert _unopened_lines("\n".join(lines)) == [shown]
    assert lines[lines.index(shown) - 1].startswith("j3 ") and lines[lines.index(shown) + 2].startswith("NODE ")


def test_a_dataset_the_node_could_not_reach_opens_once_it_can_without_a_change_at_the_data_manager(
    system: System,
) -> None:
    """What kept a dataset shut may be on the node (a share mounted late, a profile added to its host): the agent
    tries it again at its usage reports, so the job's directory appears once the directory is back, with no change
    at the data manager to send the dataset again, and one ERROR for the cause."""
    node = system.start_node("n1")
    address, log = system.datamgr.address, system.datamgr.log_path
    system.client.register_dataset(system.uri)
    dataset, elsewhere = system.root / "dataset", system.root / "elsewhere"
    shutil.move(dataset, elsewhere)  # after the data manager listed it
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 100_000_000)
    eventually(lambda: _unopened_lines(_status(address)), what="status naming the dataset n1 cannot reach")
    revision = system.client.call(system.client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision

    shutil.move(elsewhere, dataset)
    job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory")
    assert sorted(p.name for p in job_dir.iterdir()) == sorted(p.name for p in dataset.iterdir())
    opened = f"INFO datamgr.liveness: node n1 opened dataset {system.uri}: its jobs there run"
    eventually(lambda: _log_lines(log, opened), what="the data manager hearing it opened")
    assert not _unopened_lines(_status(address))
    assert system.client.call(system.client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision == revision
    assert len(node.log_lines("cannot serve dataset")) == 1


def _stale_lines(status: str) -> list[str]:
    """The lines `silod status` shows under its datasets table for datasets nodes read with their previous options."""
    return [line for line in status.splitlines() if line.startswith("  node ") and " with its previous options" in line]


def test_a_node_that_cannot_open_the_options_last_set_reads_on_says_so_in_status_and_takes_them_once_it_can(
    datamgr_process: DataManagerProcess,
    node_lacking_the_profile: MountProcess,
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    """Credentials rotated to options node n1 cannot open (a profile its host lacks): n1 reads on with its previous
    ones, its report says so, the data manager warns once and `silod status` names node, dataset and reason under
    its datasets table; once the profile is on n1's host, n1 takes the options at its next report, with no change
    at the data manager."""
    node, address = node_lacking_the_profile, datamgr_process.address
    target = dataset_target_factory("s3")
    target.put("f0.bin", b"silod" * 200)
    with DataManagerClient(address, timeout=10) as client:
        client.register_dataset(target.uri, target.options)
        client.register_job("j1", target.uri, 100_000_000, [("n1", 1)])
        client.allocate_remote_io("j1", 100_000_000)
        job_dir: Path = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="j1's directory")

        client.update_dataset_options(target.uri, {"profile": PROFILE}, list(KEYS))
        (shown,) = eventually(lambda: _stale_lines(_status(address)), what="status naming n1's previous options")
        assert shown == (
            f"  node n1 reads {target.uri} with its previous options, since it cannot open the ones last set: "
            f"{target.uri}: option 'profile': no such AWS profile"
        )
        status = _status(address)
        assert status.index(shown) < status.index("\nJOB ")  # under the datasets table
        assert (job_dir / "f0.bin").read_bytes() == b"silod" * 200  # read with the keys it had
        reason = shown.split(" the ones last set: ")[1]
        assert _usage_row(address, target.uri, "n1").endswith(
            f"reads with its previous options, since it cannot open the ones last set: {reason}"
        )
        (warning,) = _log_lines(datamgr_process.log_path, "with its previous options")
        assert warning.endswith(
            f"WARNING datamgr.liveness: node n1 reads dataset {target.uri} with its previous options, since it "
            f"cannot open the ones last set: {reason}"
        )

        # The profile arrives on n1's host (the file its agent was started to read): its next report's try opens it.
        (tmp_path / "no-aws-credentials").write_text((tmp_path / "aws-credentials").read_text())
        taken = f"INFO datamgr.liveness: node n1 reads dataset {target.uri} with the options last set"
        eventually(lambda: _log_lines(datamgr_process.log_path, taken), what="the data manager hearing n1 took them")
        assert not _stale_lines(_status(address))
        (swapped,) = node.log_lines("reading with its new options")
        assert "(access_key_id removed, profile set, secret_access_key removed)" in swapped
    (failed,) = node.log_lines("reads on with its old options")  # one ERROR, though tried at every report
    assert "ERROR" in failed and reason in failed
    assert _log_lines(datamgr_process.log_path, "with its previous options") == [warning]
    assert s3_server.secret_access_key not in datamgr_process.log_path.read_text() + node.log_path.read_text()
