"""Tenants and their virtual clusters on a real data manager (`--cell-levels gpu:1,pcie:2,node:2`: nodes of 4
GPUs), over gRPC and through `silod tenant` and `silod job add --tenant --priority`: what each refuses, with the
status code or exit code and a message that names the field and the rule, changing nothing; what a tenant and a
job's tenant and priority look like once registered; the settings the data manager refuses at start."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from datamgr.client import ClientError, DataManagerClient
from datamgr.controller import snapshot_of
from datamgr.embedded import EmbeddedDataManager
from datamgr.entities import Tenant
from datamgr.manager import DataManager
from datamgr.scheduler.tenancy import TenantShare
from datamgr.server import ServeError, ServerConfig, serve
from datamgr.state import Change, ClusterState
from datamgr.store import MemoryStore
from silodcli.main import main
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import (
    REMOTE_IO_LIMIT,
    STILL_ALIVE_SECONDS,
    full_state,
    make_local_dataset,
    silod_cli,
    until_unavailable,
)

LEVELS = "gpu:1,pcie:2,node:2"  # a node cell: 2 PCIe switches of 2 GPUs
NODE_GPUS = 4


def config(tmp_path: Path, cell_levels: str = LEVELS) -> ServerConfig:
    return ServerConfig(
        "127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, STILL_ALIVE_SECONDS, cell_levels=cell_levels
    )


class Cluster:
    """A data manager with its cell levels, a client, and a registered dataset."""

    def __init__(self, address: str, client: DataManagerClient, uri: str) -> None:
        self.address = address
        self.client = client
        self.uri = uri

    def tenants(self) -> list[pb.Tenant]:
        return list(self.client.call(self.client.stub.ListTenants, pb.ListTenantsRequest()).tenants)

    def state(self) -> tuple[bytes, ...]:
        """Everything the queries show but the clock, tenants included."""
        listed = self.client.call(self.client.stub.ListTenants, pb.ListTenantsRequest())
        return (*full_state(self.client), listed.SerializeToString())

    def cli(self, *args: str) -> int:
        return main(list(args), environ={"SILOD_DATAMGR": self.address})


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with EmbeddedDataManager(config(tmp_path)) as dm, DataManagerClient(dm.address, timeout=10) as client:
        uri = make_local_dataset(tmp_path / "data", files=4, size=500)
        client.register_dataset(uri)
        yield Cluster(dm.address, client, uri)


def register(
    cluster: Cluster, name: str, cells: dict[str, int], cache: int = 0, io: int = 0
) -> pb.RegisterTenantResponse:
    return cluster.client.register_tenant(name, cells, cache, io)


def refused(cluster: Cluster, call: Callable[[], object], code: grpc.StatusCode) -> str:
    """The message of a call that must be refused with `code`, changing nothing."""
    before = cluster.state()
    with pytest.raises(ClientError) as error:
        call()
    assert error.value.code == code, error.value
    assert cluster.state() == before
    return str(error.value)


@pytest.mark.parametrize(
    ("name", "cells", "cache", "io", "fragment"),
    [
        ("a b", {"node": 1}, 0, 0, "name 'a b' must match [A-Za-z0-9._-]{1,128}"),
        ("", {"node": 1}, 0, 0, "name '' must match"),
        ("a", {}, 0, 0, "cells must give at least one level and its number of cells, such as node=2"),
        ("a", {"node": -1}, 0, 0, "cells: node=-1 must be a number of cells from 0 to 1,000,000"),
        ("a", {"no de": 1}, 0, 0, "cells: level name 'no de' must match"),
        ("a", {"rack": 1}, 0, 0, "cells: the cell hierarchy has no level 'rack'; its levels are gpu, pcie, node"),
        ("a", {"node": 1}, -1, 0, "cache_bytes -1 must not be negative"),
        ("a", {"node": 1}, 0, -5, "io_bytes_per_sec -5 must be zero or more"),
        ("a", {"node": 1}, 2**61, 0, "cache_bytes 2305843009213693952 is over the sanity limit"),
    ],
)
def test_a_bad_tenant_is_invalid_argument_naming_the_field_and_the_rule(
    cluster: Cluster, name: str, cells: dict[str, int], cache: int, io: int, fragment: str
) -> None:
    message = refused(cluster, lambda: register(cluster, name, cells, cache, io), grpc.StatusCode.INVALID_ARGUMENT)
    assert fragment in message


def test_a_tenant_is_registered_once_listed_with_its_vc_and_a_different_vc_for_it_already_exists(
    cluster: Cluster,
) -> None:
    reply = register(cluster, "prod-a", {"node": 1, "pcie": 1}, 2 * 10**12, 400_000_000)
    assert reply.created and reply.tenant.name == "prod-a"
    assert dict(reply.tenant.cells) == {"node": 1, "pcie": 1}
    assert (reply.tenant.cache_bytes, reply.tenant.io_bytes_per_sec) == (2 * 10**12, 400_000_000)
    assert reply.tenant.vc_gpus == NODE_GPUS + 2  # the levels alone size the cells
    again = register(cluster, "prod-a", {"pcie": 1, "node": 1}, 2 * 10**12, 400_000_000)
    assert (again.created, again.revision) == (False, reply.revision)  # a repeated registration is a no-op
    message = refused(cluster, lambda: register(cluster, "prod-a", {"node": 2}), grpc.StatusCode.ALREADY_EXISTS)
    registered = "cells node=1,pcie=1, cache 1.8 TiB, remote IO 400.0 MB/s"
    assert f"tenant 'prod-a' is registered with {registered}, not cells node=2, cache 0 B" in message
    assert "unregister it first" in message
    assert [t.name for t in cluster.tenants()] == ["prod-a"]
    summary = cluster.client.call(cluster.client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
    assert (summary.cell_levels, summary.tenant_count) == (LEVELS, 1)


def test_vcs_that_do_not_fit_the_nodes_are_refused_naming_the_level_once_the_nodes_are_known(cluster: Cluster) -> None:
    register(cluster, "big", {"node": 3})  # no node offers GPUs yet: nothing to check the VCs against
    for index in range(3):
        cluster.client.register_node(f"n{index}", f"h{index}:1", 10**9, gpus=NODE_GPUS)
    message = refused(cluster, lambda: register(cluster, "small", {"pcie": 1}), grpc.StatusCode.FAILED_PRECONDITION)
    assert "cells: the VC assignment does not fit at level 2 (pcie)" in message
    assert "the VCs reserve 1 cells there (small: 1)" in message and "checked against 3 nodes of 4 GPUs" in message
    message = refused(cluster, lambda: register(cluster, "other", {"node": 1}), grpc.StatusCode.FAILED_PRECONDITION)
    assert "does not fit at level 3 (node): the VCs reserve 4 cells there (big: 3, other: 1)" in message
    assert register(cluster, "zero", {"node": 0}).created  # a VC of no cells fits anywhere
    assert [(t.name, t.vc_gpus) for t in cluster.tenants()] == [("big", 12), ("zero", 0)]


def test_tenants_remote_io_together_stays_within_the_limit(cluster: Cluster) -> None:
    register(cluster, "a", {"gpu": 1}, io=600_000_000)
    over = 400_000_001
    message = refused(cluster, lambda: register(cluster, "b", {"gpu": 1}, io=over), grpc.StatusCode.FAILED_PRECONDITION)
    assert message.endswith(
        f"io_bytes_per_sec {over}: the other tenants reserve 600.0 MB/s of the remote IO limit of 1.0 GB/s, so "
        "400.0 MB/s are left"
    )
    assert register(cluster, "b", {"gpu": 1}, io=over - 1).created


def test_a_job_names_a_registered_tenant_and_a_priority_and_its_tenant_cannot_go_until_it_finishes(
    cluster: Cluster,
) -> None:
    client = cluster.client
    client.register_node("n1", "h1:1", 10**9, gpus=NODE_GPUS)
    register(cluster, "a", {"node": 1})

    def job(job_id: str, tenant: str, priority: pb.JobPriority.ValueType) -> pb.RegisterJobResponse:
        return client.register_job(job_id, cluster.uri, 10**6, [("n1", 1)], tenant=tenant, priority=priority)

    message = refused(cluster, lambda: job("j", "nobody", pb.JOB_PRIORITY_LOW), grpc.StatusCode.NOT_FOUND)
    assert "tenant: tenant 'nobody' is not registered (silod tenant add nobody ...)" in message
    message = refused(cluster, lambda: job("j", "a", 7), grpc.StatusCode.INVALID_ARGUMENT)  # type: ignore[arg-type]
    assert "priority 7 is not a job priority: JOB_PRIORITY_HIGH (1) or JOB_PRIORITY_LOW (2)" in message
    message = refused(cluster, lambda: job("j", "a b", pb.JOB_PRIORITY_LOW), grpc.StatusCode.INVALID_ARGUMENT)
    assert "tenant 'a b' must match" in message

    low = job("low", "a", pb.JOB_PRIORITY_LOW).job
    regular = job("regular", "", pb.JOB_PRIORITY_UNSPECIFIED).job  # no tenant; high, as older clients mean
    assert (low.tenant, low.priority) == ("a", pb.JOB_PRIORITY_LOW)
    assert (regular.tenant, regular.priority) == ("", pb.JOB_PRIORITY_HIGH)
    assert not job("low", "a", pb.JOB_PRIORITY_LOW).created
    message = refused(cluster, lambda: job("low", "", pb.JOB_PRIORITY_HIGH), grpc.StatusCode.ALREADY_EXISTS)
    assert "registered with tenant a, priority low, not tenant none, priority high" in message
    (a,) = cluster.tenants()
    assert (list(a.job_ids), a.low_priority_gpus, a.regular_gpus, a.jobs_queued) == (["low"], 1, 0, 0)

    remove = pb.UnregisterTenantRequest(name="a")
    code = grpc.StatusCode.FAILED_PRECONDITION
    message = refused(cluster, lambda: client.call(client.stub.UnregisterTenant, remove), code)
    assert "name: tenant 'a' has unfinished jobs ['low']; finish them first" in message
    missing = pb.UnregisterTenantRequest(name="b")
    assert "tenant 'b' is not registered" in refused(
        cluster, lambda: client.call(client.stub.UnregisterTenant, missing), grpc.StatusCode.NOT_FOUND
    )
    client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="low"))
    client.call(client.stub.UnregisterTenant, remove)
    assert cluster.tenants() == []


def test_the_policys_snapshot_carries_the_tenants_the_cell_levels_and_each_jobs_tenant_and_priority(
    tmp_path: Path,
) -> None:
    async def snapshot() -> None:
        manager = DataManager(MemoryStore(), remote_io_limit=10**6, policy="hived", cell_levels=LEVELS)
        await manager.register_node("n1", "h1:1", 10**9, gpus=NODE_GPUS)
        await manager.register_tenant("a", {"node": 1}, 10**9, 10**5)
        dataset, _, _ = await manager.register_dataset(make_local_dataset(tmp_path / "d", files=2), {}, 0)
        await manager.register_job("low", dataset.uri, 10**6, [], gpus=2, tenant="a", priority="low")
        await manager.register_job("none", dataset.uri, 10**6, [], gpus=1)
        seen = snapshot_of(manager, 10**6, manager.wall_clock())
        assert (seen.cell_levels, dict(seen.tenants)) == (LEVELS, {"a": TenantShare({"node": 1}, 10**9, 1e5)})
        assert [(j.job_id, j.tenant, j.priority) for j in seen.jobs_by_submission()] == [
            ("low", "a", "low"),
            ("none", "", "high"),
        ]
        await manager.close()

    asyncio.run(snapshot())


def test_a_tenant_change_undoes_whole_as_a_refused_commit_needs() -> None:
    a, b = Tenant("a", {"node": 1}), Tenant("b", {"gpu": 2}, 5, 6)
    state = ClusterState(tenants=[a])
    undo = state.apply(Change(tenants_put=(replace(a, cache_bytes=1), b)))
    assert state.tenants == {"a": replace(a, cache_bytes=1), "b": b}
    state.apply(undo)
    assert state.tenants == {"a": a}
    state.apply(state.apply(Change(tenants_deleted=("a",))))
    assert state.tenants == {"a": a}


# ---- the command line ----


def test_tenant_add_list_remove_and_job_add_with_a_tenant_and_a_priority(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vc = tmp_path / "vc.toml"
    vc.write_text('cells = { node = 1 }\ncache = "2TB"\nremote_io = "400MB/s"\n')
    assert cluster.cli("tenant", "add", "prod-a", "--vc", str(vc)) == 0
    shown = capsys.readouterr().out
    assert "registered tenant prod-a: cells node=1 (4 GPUs), cache 1.8 TiB, remote IO 400.0 MB/s" in shown
    tables = tmp_path / "vcs.toml"  # a file of [NAME] tables, as silod sim --tenants takes: the tenant's own
    tables.write_text("[prod-b]\ncells = { pcie = 1 }\n\n[other]\ncells = { node = 9 }\n")
    assert cluster.cli("tenant", "add", "prod-b", "--vc", str(tables), "--remote-io", "1MB/s") == 0  # a flag wins
    assert "registered tenant prod-b: cells pcie=1 (2 GPUs), cache 0 B, remote IO 1.0 MB/s" in capsys.readouterr().out
    assert cluster.cli("tenant", "add", "dev", "--cells", "gpu=1,pcie=0", "--cache", "1GiB") == 0
    assert "cells gpu=1,pcie=0 (1 GPUs), cache 1.0 GiB" in capsys.readouterr().out

    cluster.client.register_node("n1", "h1:1", 10**9, gpus=NODE_GPUS)
    args = ["job", "add", "j", "--dataset", cluster.uri, "--ideal-rate", "1MB/s", "--worker", "n1:2"]
    assert cluster.cli(*args, "--tenant", "prod-a", "--priority", "low") == 0
    assert "; tenant prod-a, low priority (preemptible)) (revision" in capsys.readouterr().out
    assert cluster.cli("job", "show", "j") == 0
    assert "tenant: tenant prod-a, low priority (preemptible)" in capsys.readouterr().out

    assert cluster.cli("tenant", "list") == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split() == [
        *("TENANT", "CELLS", "VC", "GPUS", "CACHE", "REMOTE", "IO", "REGULAR", "GPUS", "LOW-PRI", "GPUS"),
        *("QUEUED", "JOBS"),
    ]
    assert listed[1].split() == ["dev", "gpu=1,pcie=0", "1", "1.0", "GiB", "0", "B/s", "0", "0", "0", "0"]
    assert listed[2].split() == ["prod-a", "node=1", "4", "1.8", "TiB", "400.0", "MB/s", "0", "2", "0", "1"]
    assert cluster.cli("status") == 0
    status = capsys.readouterr().out
    assert f"tenants (cell levels {LEVELS}):\nTENANT" in status
    header, row = (next(line for line in status.splitlines() if line.startswith(w)) for w in ("JOB ", "j "))
    assert [row[header.index(name) :].split()[0] for name in ("TENANT", "PRIORITY")] == ["prod-a", "low"]

    assert cluster.cli("tenant", "remove", "prod-a") == 1
    assert "FAILED_PRECONDITION: name: tenant 'prod-a' has unfinished jobs ['j']" in capsys.readouterr().err
    assert cluster.cli("job", "add", "k", *args[3:], "--tenant", "nobody") == 1
    assert "NOT_FOUND: tenant: tenant 'nobody' is not registered" in capsys.readouterr().err
    assert cluster.cli("job", "finish", "j") == 0
    assert cluster.cli("tenant", "remove", "prod-a") == 0
    assert "unregistered tenant prod-a" in capsys.readouterr().out
    assert [t.name for t in cluster.tenants()] == ["dev", "prod-b"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("tenant", "add", "a"), "one of the arguments --vc --cells is required"),
        (("tenant", "add", "a", "--cells", "node"), "cells 'node': 'node' is not LEVEL=COUNT with a whole COUNT"),
        (("tenant", "add", "a", "--cells", "node=-1"), "'node=-1' is not LEVEL=COUNT"),
        (("tenant", "add", "a", "--cells", "node=1,node=2"), "level 'node' is given twice"),
        (("tenant", "add", "a", "--cells", "node=1", "--cache", "2G"), "ambiguous"),
        (("tenant", "add", "a", "--cells", "node=1", "--remote-io", "400MB"), "did you mean 400MB/s?"),
        (("tenant", "add", "a", "--vc", "VC", "--cells", "node=1"), "not allowed with argument"),
        (("tenant", "add", "a", "--vc", "MISSING"), "cannot read"),
        (("tenant", "add", "a", "--vc", "VC:cells = { node = -1 }"), "cells: node: "),
        (("tenant", "add", "a", "--vc", 'VC:cells = { node = 1 }\ncache = "2G"'), "--vc VC: cache: "),
        (("tenant", "add", "a", "--vc", "VC:cells = { node = 1 }\nnodes = 2"), "nodes"),
        (("tenant", "add", "a", "--vc", "VC:[b]\ncells = { node = 1 }"), "or a [a] table; its tables are [b]"),
        (("tenant", "add", "a", "--vc", 'VC:cells = { node = 1 }\nscheduler = "tiresias"'), "a live tenant runs fifo"),
        (("job", "add", "j", "--dataset", "URI", "--ideal-rate", "1MB/s", "--gpus", "1", "--priority", "mid"),
         "argument --priority: 'mid' must be high (regular) or low (preemptible)"),
    ],
)  # fmt: skip
def test_bad_tenant_command_lines_and_vc_files_exit_2_naming_the_problem_and_change_nothing(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fragment: str
) -> None:
    """`VC:TEXT` is a VC file holding TEXT; `MISSING` one that does not exist."""
    vc = tmp_path / "vc.toml"
    argv: list[str] = []
    for arg in args:
        if arg.startswith("VC"):
            vc.write_text(arg.partition(":")[2] or "cells = { node = 1 }")
        argv.append(str(vc) if arg.startswith("VC") else str(tmp_path / "no.toml") if arg == "MISSING" else arg)
    argv = [cluster.uri if a == "URI" else a for a in argv]
    before = cluster.state()
    try:
        code = cluster.cli(*argv)
    except SystemExit as exited:  # argparse
        code = int(str(exited.code))
    assert code == 2
    assert fragment.replace("VC", str(vc)) in capsys.readouterr().err
    assert cluster.state() == before


# ---- the data manager's settings ----


@pytest.mark.parametrize(
    ("levels", "fragment"),
    [
        ("gpu:1,socket", "cell level 'socket' is not NAME:BUDDIES"),
        ("gpu:2,node:2", "the lowest level (gpu) is one GPU, so it is made of 1, not 2"),
        ("gpu:1,socket:2", "no level 'node'"),
        ("gpu:1,gpu:2,node:2", "level names repeat"),
        ("gpu:1,my node:2", "cell level name 'my node' must match"),
    ],
)
def test_cell_levels_that_are_no_hierarchy_stop_the_server_before_the_state_dir_is_touched(
    tmp_path: Path, levels: str, fragment: str
) -> None:
    with pytest.raises(ServeError, match="--cell-levels") as error:
        asyncio.run(serve(config(tmp_path, levels)))
    assert fragment in str(error.value)
    assert not (tmp_path / "state").exists()
    result = silod_cli("datamgr", "serve", "--state-dir", str(tmp_path / "state"), "--cell-levels", levels)
    assert result.returncode == 2 and "argument --cell-levels: " in result.stderr and fragment in result.stderr
    assert not (tmp_path / "state").exists()


def test_a_restart_keeps_the_tenants_and_refuses_cell_levels_without_a_level_a_tenant_reserves(tmp_path: Path) -> None:
    with EmbeddedDataManager(config(tmp_path)) as dm, DataManagerClient(dm.address, timeout=10) as client:
        client.register_tenant("a", {"pcie": 1}, 10**9, 10**6)
        client.register_tenant("b", {"node": 1})
    with EmbeddedDataManager(config(tmp_path)) as dm, DataManagerClient(dm.address, timeout=10) as client:
        listed = client.call(client.stub.ListTenants, pb.ListTenantsRequest()).tenants
        assert [(t.name, dict(t.cells), t.cache_bytes, t.io_bytes_per_sec) for t in listed] == [
            ("a", {"pcie": 1}, 10**9, 10**6),
            ("b", {"node": 1}, 0, 0),
        ]
    with pytest.raises(ServeError) as error:
        EmbeddedDataManager(config(tmp_path, "gpu:1,node:4")).start()
    assert str(error.value) == (
        "--cell-levels: tenant a: the cell hierarchy has no level 'pcie'; its levels are gpu, node (--cell-levels "
        "gpu:1,node:4); unregister the tenant to change the levels"
    )


@pytest.mark.expected_warnings
def test_a_restart_warns_when_the_vcs_no_longer_fit_the_nodes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    two_gpu_nodes = config(tmp_path, "gpu:1,node:2")
    # n2 is unregistered once silent (UnregisterNode refuses a live node): a node timeout of seconds for that.
    with (
        EmbeddedDataManager(replace(two_gpu_nodes, node_timeout=2.0)) as dm,
        DataManagerClient(dm.address, timeout=10) as client,
    ):
        client.register_node("n1", "h1:1", 10**9, gpus=2)
        client.register_node("n2", "h2:1", 10**9, gpus=2)
        client.register_tenant("a", {"node": 2})
        until_unavailable(client, "n2", reporting=["n1"])
        client.unregister_node("n2", force=True)  # a is promised 2 nodes: refused without force
    with EmbeddedDataManager(two_gpu_nodes) as dm, DataManagerClient(dm.address, timeout=10) as client:
        assert [t.name for t in client.call(client.stub.ListTenants, pb.ListTenantsRequest()).tenants] == ["a"]
    stopped, unavailable, unregistered, warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert stopped == "node n2 stopped reporting; marked unavailable"
    assert unavailable.startswith(
        "without node n2, which stopped reporting, the VC assignment does not fit at level 2 (node)"
    )
    assert unregistered.startswith(
        "node n2 is unregistered by force, and without it the VC assignment does not fit at level 2"
    )
    assert warning.startswith("tenants: the VC assignment does not fit at level 2 (node)")
    # It said they "cannot run until they fit", but they run on (`CellAllocator(require_feasible=False)`).
    assert warning.endswith("a tenant's job may find no free cell until they fit again")


def test_a_node_with_more_gpus_than_a_node_cell_is_refused(cluster: Cluster) -> None:
    message = refused(
        cluster, lambda: cluster.client.register_node("n1", "h1:1", 10**9, gpus=5), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert message.endswith(
        "gpus: node 'n1' has 5 GPUs, more than the 4 of a node cell of --cell-levels gpu:1,pcie:2,node:2"
    )
    cluster.client.register_node("n1", "h1:1", 10**9, gpus=NODE_GPUS)  # a node cell's worth is fine


def test_a_restart_refuses_cell_levels_whose_node_cell_is_smaller_than_a_registered_node(tmp_path: Path) -> None:
    with EmbeddedDataManager(config(tmp_path)) as dm, DataManagerClient(dm.address, timeout=10) as client:
        client.register_node("n1", "h1:1", 10**9, gpus=NODE_GPUS)
    with pytest.raises(ServeError) as error:
        EmbeddedDataManager(config(tmp_path, "gpu:1,node:2")).start()
    assert str(error.value) == (
        "--cell-levels: nodes: node 'n1' has 4 GPUs, more than the 2 of a node cell of --cell-levels gpu:1,node:2; "
        "unregister the node to change the levels"
    )


def test_a_restart_refused_for_its_node_cells_does_not_first_warn_that_the_vcs_do_not_fit_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tenants' VCs were checked against nodes cut to the refused levels' cells first: a WARNING that they did
    not fit (\"checked against 2 nodes of 2 GPUs\") came before the refusal, on nodes of 4 GPUs."""
    with EmbeddedDataManager(config(tmp_path)) as dm, DataManagerClient(dm.address, timeout=10) as client:
        for node_id in ("n1", "n2"):
            client.register_node(node_id, "h1:1", 10**9, gpus=NODE_GPUS)
        client.register_tenant("a", {"node": 1})
        client.register_tenant("b", {"pcie": 1})
        client.register_tenant("c", {"pcie": 1})
    with pytest.raises(ServeError, match="node 'n1' has 4 GPUs, more than the 2 of a node cell"):
        EmbeddedDataManager(config(tmp_path, "gpu:1,pcie:2,node:1")).start()
    assert "does not fit" not in caplog.text


def test_cell_levels_of_more_than_a_million_gpus_stop_the_server_with_exit_2_naming_the_level(
    tmp_path: Path,
) -> None:
    levels, fragment = "gpu:1,node:2,rack:1000000000", "level rack:1000000000 makes cells of 2,000,000,000 GPUs"
    with pytest.raises(ServeError, match=fragment):
        asyncio.run(serve(config(tmp_path, levels)))
    result = silod_cli("datamgr", "serve", "--state-dir", str(tmp_path / "state"), "--cell-levels", levels)
    assert result.returncode == 2 and "argument --cell-levels: " in result.stderr and fragment in result.stderr
    assert not (tmp_path / "state").exists()
