"""A small cluster as processes: a data manager on a fixed port, a dataset directory, and node agents started
on demand."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from datamgr.client import ClientError, DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.datamgr_fixtures import DataManagerProcess
from tests.mount_fixtures import MountProcess
from tests.storage_servers import free_port

FILES, SIZE = 40, 50_000


def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy; a missing file, key or registration is "not yet"."""
    return polling.eventually(
        check,
        what=what,
        timeout=timeout,
        interval=0.02,
        ignore=lambda exc: isinstance(exc, (OSError, KeyError, ValueError, ClientError)),
    )


class System:
    """A data manager on a fixed port, a dataset directory, and node agents started on demand."""

    def __init__(self, root: Path, node_timeout: float = 5.0) -> None:
        self.root = root
        self.datamgr = DataManagerProcess(
            root / "state", root / "datamgr.log", "--node-timeout", f"{node_timeout:g}",
            listen=f"127.0.0.1:{free_port()}",
        )  # fmt: skip
        self.datamgr.start()
        self.client = DataManagerClient(self.datamgr.address, timeout=10)
        self.nodes: list[MountProcess] = []
        rng = random.Random(4)
        self.files = {f"c{i % 4}/f{i:03d}.bin": rng.randbytes(SIZE) for i in range(FILES)}
        for path, data in self.files.items():
            (root / "dataset" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "dataset" / path).write_bytes(data)
        self.uri = f"file://{root / 'dataset'}"

    def start_node(self, node_id: str) -> MountProcess:
        node = MountProcess.node(self.root / node_id, self.datamgr.address, node_id, "--cache-capacity", "1GiB")
        self.nodes.append(node)
        node.start()
        eventually(lambda: self.client.call(self.client.stub.GetNode, pb.GetNodeRequest(node_id=node_id)), what="node")
        return node

    def node_stats(self, node: MountProcess, job_id: str) -> dict[str, Any]:
        stats: dict[str, Any] = node.stats()["jobs"][job_id]
        return stats

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.client.close()
        self.datamgr.stop()


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    """A `System` under the test's directory, stopped (its nodes, then its data manager) after the test."""
    running = System(tmp_path)
    try:
        yield running
    finally:
        running.stop()
