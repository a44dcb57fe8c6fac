"""End to end: `silod datamgr serve --policy hived --cell-levels gpu:1,node:2` shares two nodes of 2 GPUs between
two tenants, each guaranteed one node cell, and a launcher (tests/launcher.py) follows its WatchDecisions stream.

Tenant A's regular job binds a node cell of A's VC; A's low-priority job runs on the other node, which B's VC
reserves but B does not use yet; B's regular job then takes that node back: the low-priority job is preempted
(PREEMPTED on the stream, stops before starts) and B's job starts there. A restarted data manager keeps the
tenants, the jobs' tenants and priorities, and the placements: the launcher, reconnected, has nothing to do, and
the rounds after the restart move nothing. When B's job finishes, A's low-priority job runs again on the node it
frees. `silod status` shows each job's tenant and priority and each tenant's VC and use; `--round 3600` rules
out periodic rounds, so rounds come only from registrations and finishes (and the start)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datamgr.client import DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.datamgr_fixtures import DataManagerProcess, cli, make_local_dataset
from tests.launcher import Launcher

GPUS = 2  # per node: one node cell of "gpu:1,node:2"
Pods = dict[str, tuple[tuple[str, int], ...]]


@pytest.fixture
def hived(tmp_path: Path) -> Iterator[DataManagerProcess]:
    datamgr = DataManagerProcess(
        tmp_path / "state",
        tmp_path / "datamgr.log",
        *("--policy", "hived", "--cell-levels", "gpu:1,node:2", "--remote-io-limit", "1MB/s", "--round", "3600"),
    )
    try:
        yield datamgr.start()
    finally:
        datamgr.stop()


def status(datamgr: DataManagerProcess) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(cli(datamgr, "status", "--json"))
    return document


def column(table: str, row_start: str, name: str) -> str:
    """The cell in column `name` of the row that starts with `row_start` (`JOB`'s table or `TENANT`'s)."""
    lines = table.splitlines()
    row = next(line for line in lines if line.startswith(row_start))
    header = next(line for line in reversed(lines[: lines.index(row)]) if line.startswith(("JOB ", "TENANT ")))
    return row[header.index(name) :].split()[0]


def test_a_tenants_regular_job_preempts_a_low_priority_job_on_its_vc_and_a_restart_keeps_tenants_and_placements(
    hived: DataManagerProcess, launcher: Launcher, tmp_path: Path
) -> None:
    with DataManagerClient(hived.address, timeout=10) as client:
        for node in ("n1", "n2"):
            client.register_node(node, f"{node}:1", 10_000_000, gpus=GPUS)
    vc = tmp_path / "b.toml"
    vc.write_text('cells = { node = 1 }\nremote_io = "100kB/s"\n')
    assert "registered tenant a: cells node=1 (2 GPUs)" in cli(hived, "tenant", "add", "a", "--cells", "node=1")
    assert "registered tenant b: cells node=1 (2 GPUs)" in cli(hived, "tenant", "add", "b", "--vc", str(vc))
    uri = make_local_dataset(tmp_path / "data", files=4, size=500)
    cli(hived, "dataset", "add", uri)
    launcher.connect(hived.address)

    def add(job_id: str, tenant: str, priority: str = "high") -> None:
        cli(hived, *("job", "add", job_id, "--dataset", uri, "--ideal-rate", "1MB/s", "--gpus", str(GPUS)),
            *("--tenant", tenant, "--priority", priority))  # fmt: skip

    def launched(pods: Pods, actions: list[str]) -> None:
        polling.eventually(lambda: launcher.state() == (pods, actions), what=lambda: f"{launcher.state()}")

    add("a-train", "a")  # binds a node cell of A's VC: the first, n1
    add("a-scavenge", "a", "low")  # low priority: the node nobody's regular job uses
    started = ["start a-train on n1:2", "start a-scavenge on n2:2"]
    launched({"a-train": (("n1", GPUS),), "a-scavenge": (("n2", GPUS),)}, started)

    add("b-train", "b")  # B's VC needs its node cell: the one A's low-priority job runs on
    preempted = [*started, "stop a-scavenge", "start b-train on n2:2"]
    launched({"a-train": (("n1", GPUS),), "b-train": (("n2", GPUS),)}, preempted)
    order = [(d.job_id, d.phase) for d in launcher.sent()]
    assert order.index(("a-scavenge", pb.JOB_PHASE_PREEMPTED)) < order.index(("b-train", pb.JOB_PHASE_RUNNING))

    jobs = {job["job_id"]: job for job in status(hived)["jobs"]}
    scavenge = jobs["a-scavenge"]
    assert (scavenge["tenant"], scavenge["priority"], scavenge["schedule"]["phase"]) == (
        "a",
        "JOB_PRIORITY_LOW",
        "JOB_PHASE_PREEMPTED",
    )
    assert (jobs["b-train"]["tenant"], jobs["b-train"]["priority"]) == ("b", "JOB_PRIORITY_HIGH")
    table = cli(hived, "status")
    assert "tenants (cell levels gpu:1,node:2):" in table
    shown = {name: column(table, "a-scavenge ", name) for name in ("TENANT", "PRIORITY", "STATE")}
    assert shown == {"TENANT": "a", "PRIORITY": "low", "STATE": "preempted"}
    per_tenant = {
        tenant: [column(table, f"{tenant} ", name) for name in ("CELLS", "VC", "REGULAR", "LOW-PRI", "QUEUED")]
        for tenant in ("a", "b")
    }
    assert per_tenant == {"a": ["node=1", "2", "2", "0", "1"], "b": ["node=1", "2", "2", "0", "0"]}

    # A restarted data manager keeps the tenants, the jobs' tenants and priorities, and every placement: the
    # launcher, reconnected, has nothing to do, and the restart's first round moves nothing.
    launcher.disconnect()
    revision = status(hived)["summary"]["revision"]
    assert hived.terminate() == 0
    hived.start()
    with DataManagerClient(hived.address, timeout=10) as client:  # as the nodes' agents do: the first round waits
        for node in ("n1", "n2"):  # for the usage of nodes that run jobs (or the node timeout)
            client.call(client.stub.ReportUsage, pb.ReportUsageRequest(node_id=node))
    polling.eventually(lambda: status(hived)["summary"]["controller"].get("rounds") == "1", what="the start round")
    assert status(hived)["summary"]["revision"] == revision  # the round changed nothing at all
    launcher.connect(hived.address)
    polling.eventually(lambda: launcher.snapshots == 2, what="a snapshot from the restarted data manager")
    assert launcher.state() == ({"a-train": (("n1", GPUS),), "b-train": (("n2", GPUS),)}, preempted)
    resent = [(d.job_id, d.phase) for d in launcher.sent()[len(order) :]]
    assert resent == [
        ("a-scavenge", pb.JOB_PHASE_PREEMPTED),
        ("a-train", pb.JOB_PHASE_RUNNING),
        ("b-train", pb.JOB_PHASE_RUNNING),
    ]
    tenants = {t["name"]: t for t in json.loads(cli(hived, "tenant", "list", "--json"))}
    assert {name: (t["cells"], t["io_bytes_per_sec"]) for name, t in tenants.items()} == {
        "a": ({"node": 1}, "0"),
        "b": ({"node": 1}, "100000"),
    }
    assert tenants["a"]["job_ids"] == ["a-scavenge", "a-train"] and tenants["a"]["jobs_queued"] == 1
    after = {job["job_id"]: job for job in status(hived)["jobs"]}
    assert {job_id: (j["tenant"], j["priority"]) for job_id, j in after.items()} == {
        "a-scavenge": ("a", "JOB_PRIORITY_LOW"),
        "a-train": ("a", "JOB_PRIORITY_HIGH"),
        "b-train": ("b", "JOB_PRIORITY_HIGH"),
    }
    assert after["b-train"]["schedule"]["policy_state"] == jobs["b-train"]["schedule"]["policy_state"]  # its cells

    # B's job finishes: A's low-priority job runs again on the node it frees.
    cli(hived, "job", "finish", "b-train")
    resumed = [*preempted, "stop b-train", "start a-scavenge on n2:2"]
    launched({"a-train": (("n1", GPUS),), "a-scavenge": (("n2", GPUS),)}, resumed)
    assert launcher.error is None
