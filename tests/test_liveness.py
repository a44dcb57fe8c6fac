"""Nodes that stop reporting for the node timeout are marked unavailable, not forgotten."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from datamgr import queries
from datamgr.client import DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.manager import DataManager
from datamgr.server import ServerConfig
from datamgr.store import SQLiteStore
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _register(manager: DataManager, *node_ids: str) -> None:
    for node_id in node_ids:
        await manager.register_node(node_id, f"{node_id}:1", 100)
    await manager.close()


@pytest.mark.expected_warnings
def test_a_silent_node_becomes_unavailable_and_returns_when_it_reports(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SQLiteStore(tmp_path)
    manager = DataManager(store, node_timeout=10.0, clock=clock)
    asyncio.run(_register(manager, "n1", "n2"))
    clock.now += 6
    manager.report_usage("n2", [], [])
    clock.now += 6
    assert manager.expire_nodes() == ["n1"]
    assert manager.expire_nodes() == []  # reported once, not on every sweep
    assert not queries.node_info(manager, "n1").available
    assert queries.node_info(manager, "n1").seconds_since_seen == pytest.approx(12.0)
    assert queries.cluster_summary(manager).node_count == 2
    assert queries.cluster_summary(manager).nodes_available == 1
    manager.report_usage("n1", [], [])
    assert queries.node_info(manager, "n1").available
    store.close()


def test_nodes_known_at_startup_get_a_full_timeout_of_grace(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SQLiteStore(tmp_path)
    asyncio.run(_register(DataManager(store, clock=clock), "n1"))
    clock.now += 3600
    restarted = DataManager(store, node_timeout=10.0, clock=clock)
    assert restarted.expire_nodes() == []
    assert queries.node_info(restarted, "n1").available
    store.close()


@pytest.mark.expected_warnings
def test_the_server_sweeps_silent_nodes_on_its_own(tmp_path: Path) -> None:
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", None, node_timeout=0.2)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address) as client:
        client.register_node("n1", "h1:1", 100)
        polling.eventually(
            lambda: not client.call(client.stub.GetNode, pb.GetNodeRequest(node_id="n1")).available,
            what="the node marked unavailable",
            timeout=10,
        )
        assert client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes[0].node_id == "n1"
