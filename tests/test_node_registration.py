"""A node agent whose registration the data manager refuses stops before it mounts, with the reason on the
terminal, whether it runs in the foreground or detaches; `silod node remove` unregisters the node so that
its agent can register again with other parameters. Real processes: a data manager, node agents, mounts."""

from __future__ import annotations

import subprocess
import time

import pytest

from silodpb.v1 import datamgr_pb2 as pb
from tests.cluster_fixtures import System, eventually
from tests.datamgr_fixtures import silod_cli
from tests.mount_fixtures import MountProcess, is_live_mount


def _agent(system: System, node_id: str, capacity: str) -> MountProcess:
    """A foreground node agent for `node_id` offering `capacity`, under the system's root (not started)."""
    return MountProcess.node(system.root / node_id, system.datamgr.address, node_id, "--cache-capacity", capacity)


def _run(agent: MountProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run(agent.argv, capture_output=True, text=True, timeout=60)


def _capacity(system: System, node_id: str) -> int:
    node = system.client.call(system.client.stub.GetNode, pb.GetNodeRequest(node_id=node_id))
    return int(node.cache_capacity_bytes)


def _available(system: System, node_id: str) -> bool:
    return system.client.call(system.client.stub.GetNode, pb.GetNodeRequest(node_id=node_id)).available


def _registered_with_another_capacity(system: System) -> MountProcess:
    """n1 registered with 1 GiB by an agent since stopped; an agent for n1 offering 2 GiB instead."""
    system.start_node("n1").stop()
    assert _capacity(system, "n1") == 2**30
    return _agent(system, "n1", "2GiB")


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "detached"])
def test_an_agent_the_data_manager_refuses_exits_1_before_mounting_and_says_why(
    system: System, foreground: bool
) -> None:
    agent = _registered_with_another_capacity(system)
    if not foreground:
        agent.argv.remove("--foreground")

    result = _run(agent)

    assert result.returncode == 1, result.stderr
    assert "silod node: cannot register node n1: node_id: node 'n1' is registered with" in result.stderr
    assert "capacity 1073741824 bytes" in result.stderr
    assert "silod node remove n1" in result.stderr
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr
    if not foreground:
        assert f"see {agent.cache_dir / 'node.log'}" in result.stderr
    assert not is_live_mount(agent.mountpoint)
    assert _capacity(system, "n1") == 2**30  # the refused start changed nothing


@pytest.mark.parametrize(
    ("flags", "difference"),
    [(("--gpus", "4"), "0 GPUs, not 4"), (("--address", "elsewhere:1"), "not elsewhere:1")],
    ids=["gpus", "address"],
)
def test_an_agent_without_a_capacity_asking_for_other_gpus_or_another_address_is_refused_not_ignored(
    system: System, flags: tuple[str, str], difference: str
) -> None:
    # Without --cache-capacity the agent keeps the registered capacity (its default, the disk's free space, moves);
    # the GPUs and address it was given were dropped with it, and the agent ran as registered, saying nothing.
    system.start_node("n1").stop()
    agent = MountProcess.node(system.root / "n1-again", system.datamgr.address, "n1", *flags)

    result = _run(agent)

    assert result.returncode == 1, result.stderr
    assert "silod node: cannot register node n1: it is registered with" in result.stderr
    assert difference in result.stderr and "silod node remove n1" in result.stderr
    assert not is_live_mount(agent.mountpoint)
    registered = system.client.call(system.client.stub.GetNode, pb.GetNodeRequest(node_id="n1"))
    assert registered.gpus == 0 and registered.cache_capacity_bytes == 2**30  # unchanged


def test_an_agent_without_a_capacity_gpus_or_address_uses_the_registration(system: System) -> None:
    system.start_node("n1").stop()
    agent = MountProcess.node(system.root / "n1-again", system.datamgr.address, "n1")
    system.nodes.append(agent)
    agent.start()
    assert agent.log_lines("node n1 is already registered; using its registration")


def test_silod_node_remove_lets_the_agent_register_again_with_another_capacity(system: System) -> None:
    agent = _registered_with_another_capacity(system)

    eventually(lambda: not _available(system, "n1") or None, what="n1 marked unavailable once its agent stopped")
    removed = silod_cli("node", "remove", "n1", datamgr=system.datamgr.address)
    assert removed.returncode == 0, removed.stderr
    assert "unregistered node n1" in removed.stdout
    system.nodes.append(agent)
    agent.start()

    eventually(lambda: _capacity(system, "n1") == 2 * 2**30 or None, what="n1 registered with 2 GiB")


def test_an_agent_refused_once_the_data_manager_answers_late_unmounts_and_says_why(system: System) -> None:
    agent = _registered_with_another_capacity(system)
    system.datamgr.terminate()
    system.nodes.append(agent)
    agent.start()  # the data manager is down: the agent mounts and waits for it
    time.sleep(1.0)
    assert agent.process is not None and agent.process.poll() is None

    system.datamgr.start()

    assert agent.process.wait(timeout=60) == 1
    log = agent.log_path.read_text()
    assert "waiting for the data manager" in log
    assert "silod node: cannot register node n1: node_id: node 'n1' is registered with" in log
    assert "Traceback" not in log and "ExceptionGroup" not in log
    assert not is_live_mount(agent.mountpoint)
