"""A node agent whose registration the data manager refuses stops before it mounts, with the reason on the
terminal, whether it runs in the foreground or detaches; `silod node remove` unregisters the node so that
its agent can register again with other parameters, unless the tenants' virtual clusters need it (then only with
--force), and a node they need that goes, removed or silent, is logged naming them. Real processes: a data
manager, node agents, mounts."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest

from datamgr.client import ClientError, DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from silodpb.v1 import datamgr_pb2 as pb
from tests.cluster_fixtures import FILES, SIZE, System, eventually
from tests.datamgr_fixtures import (
    REMOTE_IO_LIMIT,
    DataManagerProcess,
    full_state,
    make_local_dataset,
    silod_cli,
    until_unavailable,
)
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


# ---- two agents with one node id: the data manager lets one serve the node ----


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "detached"])
def test_a_second_agent_with_the_node_id_of_a_serving_one_exits_1_naming_it_and_the_first_keeps_serving(
    system: System, foreground: bool
) -> None:
    """Both used to be accepted: both mounted the node's jobs and each read at the node's rate, twice the remote
    IO the data manager gave it, while their usage reports overwrote each other."""
    first = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    system.client.allocate_remote_io("j1", 30_000_000)
    job_dir = eventually(lambda: first.job_dir("j1").is_dir() and first.job_dir("j1"), what="j1 on the first agent")
    second = MountProcess.node(system.root / "n1-copy", system.datamgr.address, "n1", "--cache-capacity", "1GiB")
    if not foreground:
        second.argv.remove("--foreground")

    try:
        result = _run(second)
    finally:  # had it mounted after all (live, or dead once killed), unmounting would stop it, detached or not
        subprocess.run(["fusermount3", "-u", "-z", str(second.mountpoint)], capture_output=True, check=False)

    assert result.returncode == 1, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "silod node: cannot register node n1: node_id: node 'n1' is served by another node agent, at ipv4:" in (
        result.stderr
    )
    assert "give each agent its own --node-id, or stop the other agent first" in result.stderr
    (registered,) = first.log_lines("registered node n1")
    agent_id = registered.rsplit("(agent ", 1)[1].rstrip(")")
    assert f"(agent {agent_id})" in result.stderr  # names the one that serves the node
    assert "Traceback" not in result.stderr
    assert not is_live_mount(second.mountpoint)
    # The first agent serves on: its reads, its allocation changes, its usage reports.
    for path, data in system.files.items():
        assert (job_dir / path).read_bytes() == data
    system.client.allocate_remote_io("j1", 7_000_000)
    eventually(lambda: system.node_stats(first, "j1")["io_bytes_per_sec"] == 7_000_000, what="the first's new rate")

    def reported_reads() -> bool:
        usage = system.client.call(system.client.stub.GetJob, pb.GetJobRequest(job_id="j1")).usage
        return bool(usage) and usage[0].bytes_read >= FILES * SIZE

    eventually(reported_reads, what="the first agent's report of its reads")
    assert first.process is not None and first.process.poll() is None
    assert _available(system, "n1")


class TcpRelay:
    """A loopback TCP relay to `target` that a test can cut, as a network partition cuts a node off: `cut()` closes
    every connection through it and refuses new ones until `restore()`."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut = False
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._cut:
                    client.close()
                    continue
                upstream = socket.create_connection(self._target)
                self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            for connection in self._open:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._open = []

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._listener.close()


def _registrable_by_another_agent(system: System) -> bool:
    """Whether the data manager lets an agent other than the one serving n1 register it (as it is registered)."""
    request = pb.RegisterNodeRequest(
        node_id="n1", address=socket.gethostname(), cache_capacity_bytes=2**30, agent_id="probe"
    )
    try:
        system.client.stub.RegisterNode(request, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
        return False
    return True


def test_an_agent_cut_off_while_another_took_its_node_is_refused_serves_its_last_allocation_and_takes_over_later(
    system: System,
) -> None:
    """A partition ends the first agent's stream; a second agent with its node id starts meanwhile and serves the
    node. When the network comes back the first agent is refused: it says so, keeps running (it serves its last
    allocation meanwhile) and keeps trying; once the second agent stops, it follows the node again."""
    relay = TcpRelay(system.datamgr.address)
    try:
        first = MountProcess.node(system.root / "first", relay.address, "n1", "--cache-capacity", "1GiB")
        system.nodes.append(first)
        first.start()
        system.client.register_dataset(system.uri)
        system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
        system.client.allocate_remote_io("j1", 30_000_000)
        eventually(lambda: system.node_stats(first, "j1")["io_bytes_per_sec"] == 30_000_000, what="the first's rate")
        assert not _registrable_by_another_agent(system)

        relay.cut()
        eventually(lambda: _registrable_by_another_agent(system), what="the first agent's stream ended")
        second = system.start_node("n1")
        eventually(lambda: system.node_stats(second, "j1")["io_bytes_per_sec"] == 30_000_000, what="the second's rate")
        (registered,) = second.log_lines("registered node n1")
        second_id = registered.rsplit("(agent ", 1)[1].rstrip(")")
        relay.restore()

        refused = eventually(lambda: first.log_lines("refuses node n1 to this agent"), timeout=30, what="the refusal")
        assert "ERROR" in refused[0] and f"(agent {second_id}): give each agent its own --node-id" in refused[0]
        assert "enforcing the allocations of revision" in refused[0]
        system.client.allocate_remote_io("j1", 9_000_000)
        eventually(lambda: system.node_stats(second, "j1")["io_bytes_per_sec"] == 9_000_000, what="the second's rate")
        assert system.node_stats(first, "j1")["io_bytes_per_sec"] == 30_000_000  # its last allocation, not followed
        eventually(lambda: first.log_lines("refuses this agent's usage reports"), what="its reports refused")
        assert first.process is not None and first.process.poll() is None and is_live_mount(first.mountpoint)

        second.stop()
        eventually(lambda: first.log_lines("lets this agent serve node n1 again"), timeout=30, what="the first back")
        eventually(lambda: system.node_stats(first, "j1")["io_bytes_per_sec"] == 9_000_000, what="the first's rate")
        assert "Traceback" not in first.log_path.read_text()
    finally:
        relay.close()


def test_an_agent_with_more_gpus_than_a_node_cell_holds_exits_1_before_mounting(tmp_path: Path) -> None:
    # It mounted and waited for good ("waiting for the data manager ... FAILED_PRECONDITION"), as for a state disk that
    # refuses writes, though no restart of either changes a node cell's size.
    datamgr = DataManagerProcess(
        tmp_path / "state", tmp_path / "datamgr.log", "--policy", "hived", "--cell-levels", "gpu:1,node:2",
        "--remote-io-limit", "1MB/s",
    )  # fmt: skip
    datamgr.start()
    try:
        agent = MountProcess.node(tmp_path / "h1", datamgr.address, "h1", "--cache-capacity", "1GiB", "--gpus", "4")
        result = _run(agent)
    finally:
        datamgr.stop()
    assert result.returncode == 1, result.stderr
    assert (
        "silod node: cannot register node h1: gpus: node 'h1' has 4 GPUs, more than the 2 of a node cell of "
        "--cell-levels gpu:1,node:2"
    ) in result.stderr
    assert not is_live_mount(agent.mountpoint)


# ---- nodes the tenants' virtual clusters need ----

NODE_TIMEOUT = 2.0  # short, for a node to be marked unavailable; the nodes that stay report meanwhile


@contextlib.contextmanager
def _tenants_on_nodes(
    tmp_path: Path, cell_levels: str, nodes: int, vcs: Mapping[str, Mapping[str, int]]
) -> Iterator[tuple[str, DataManagerClient]]:
    """A data manager with `nodes` registered nodes of 2 GPUs, n1, n2, ..., and tenants with these VCs, which fit
    them all; its address and a client."""
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, NODE_TIMEOUT, cell_levels=cell_levels)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address, timeout=10) as client:
        for index in range(1, nodes + 1):
            client.register_node(f"n{index}", f"h{index}:1", 10**9, gpus=2)
        for name, cells in vcs.items():
            client.register_tenant(name, dict(cells))
        yield dm.address, client


def _messages(caplog: pytest.LogCaptureFixture, level: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelname == level]


LOST_AT_NODE = (
    "the VC assignment does not fit at level 2 (node): the VCs reserve 2 cells there (a: 1, b: 1), and 1 are left "
    "once the higher levels' are set aside (4 GPUs reserved at this level and above, 2 in the cluster)"
)


@pytest.mark.expected_warnings
def test_a_node_the_vcs_need_that_stops_reporting_is_logged_once_naming_them_until_it_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing said so: `hived` went on without HiveD's guarantee for the VCs, silently, until the node returned.
    with _tenants_on_nodes(tmp_path, "gpu:1,node:2", 2, {"a": {"node": 1}, "b": {"node": 1}}) as (_, client):
        until_unavailable(client, "n2", reporting=["n1"])
        until_unavailable(client, "n2", reporting=["n1"])  # later sweeps add nothing
        assert _messages(caplog, "WARNING") == [
            "node n2 stopped reporting; marked unavailable",
            f"without node n2, which stopped reporting, {LOST_AT_NODE}: the VCs of tenants a, b cannot be "
            "guaranteed until it returns, and a job may find no free cell meanwhile",
        ]
        client.call(client.stub.ReportUsage, pb.ReportUsageRequest(node_id="n2"))
        assert "with node n2 back, the tenants' VCs fit the available nodes again" in _messages(caplog, "INFO")


@pytest.mark.expected_warnings
@pytest.mark.parametrize(
    ("cell_levels", "nodes", "vcs", "reason", "whose"),
    [
        ("gpu:1,node:2", 2, {"a": {"node": 1}, "b": {"node": 1}}, LOST_AT_NODE, "the VCs of tenants a, b"),
        # Three nodes make no whole rack: the data manager's check at registration and at a start skips them.
        (
            "gpu:1,node:2,rack:2",
            4,
            {"a": {"rack": 2}},
            "the VC assignment does not fit at level 3 (rack): the VCs reserve 2 cells there (a: 2), and 1 are left "
            "once the higher levels' are set aside (8 GPUs reserved at this level and above, 6 in the cluster); on "
            "its own, the VC of tenant a does not fit",
            "the VC of tenant a",
        ),
    ],
    ids=["node", "rack"],
)
def test_silod_node_remove_of_a_node_the_vcs_need_is_refused_naming_them_and_the_level_unless_forced(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    cell_levels: str,
    nodes: int,
    vcs: Mapping[str, Mapping[str, int]],
    reason: str,
    whose: str,
) -> None:
    # It was unregistered without a word, and the data manager's next start warned (or, short of a whole rack, not).
    gone = f"n{nodes}"
    with _tenants_on_nodes(tmp_path, cell_levels, nodes, vcs) as (address, client):
        until_unavailable(client, gone, reporting=[f"n{index}" for index in range(1, nodes)])
        refused = silod_cli("node", "remove", gone, datamgr=address)
        assert refused.returncode == 1, refused.stderr
        # The data manager's refusal, shown as the CLI shows any: the check is the server's, for every client.
        assert (
            f"silod: FAILED_PRECONDITION: node_id: without node '{gone}' {reason}, so {whose} could no longer be "
            "guaranteed."
        ) in refused.stderr
        assert "Register a node in its place first, or shrink the VCs (silod tenant remove NAME" in refused.stderr
        assert "remove the node anyway with --force" in refused.stderr
        assert client.call(client.stub.GetNode, pb.GetNodeRequest(node_id=gone)).node_id == gone  # still registered
        assert not [w for w in _messages(caplog, "WARNING") if w.startswith(f"node {gone} is unregistered")]

        forced = silod_cli("node", "remove", gone, "--force", datamgr=address)
        assert forced.returncode == 0, forced.stderr
        assert f"unregistered node {gone}" in forced.stdout
        listed = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
        assert [node.node_id for node in listed] == [f"n{index}" for index in range(1, nodes)]
        (unregistered,) = [w for w in _messages(caplog, "WARNING") if w.startswith(f"node {gone} is unregistered")]
        assert unregistered == (
            f"node {gone} is unregistered by force, and without it {reason}: {whose} can no longer be guaranteed, and "
            "a job may find no free cell; register a node in its place, or shrink the VCs"
        )


@pytest.mark.expected_warnings  # the forced removal, and the registered nodes marked unavailable as they never report
def test_unregister_node_over_grpc_of_a_node_the_vcs_need_is_refused_changing_nothing_unless_forced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Only `silod node remove` refused it: any other client of the API (scripts, an operator) removed the node and
    # broke the tenants' guarantee with no more than a WARNING.
    with _tenants_on_nodes(tmp_path, "gpu:1,node:2", 2, {"a": {"node": 1}, "b": {"node": 1}}) as (_, client):
        for node_id in ("n1", "n2"):  # both live: their agents report
            client.call(client.stub.ReportUsage, pb.ReportUsageRequest(node_id=node_id))
        before = full_state(client)
        revision = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision
        with pytest.raises(ClientError) as refused:
            client.unregister_node("n2")
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        # The VCs first, though n2's agent reports: heard of before the agent is stopped, which costs them n2 already.
        assert str(refused.value) == (
            f"FAILED_PRECONDITION: node_id: without node 'n2' {LOST_AT_NODE}, so the VCs of tenants a, b could no "
            "longer be guaranteed. Register a node in its place first, or shrink the VCs (silod tenant remove NAME "
            "once its jobs have finished, then silod tenant add NAME with fewer cells); or remove the node anyway "
            "with --force (UnregisterNode's force: to register it again with other parameters, say; the VCs fit "
            "again once it is back)"
        )
        with pytest.raises(ClientError) as live:  # force passes the VCs, not an agent that reports
            client.unregister_node("n2", force=True)
        assert live.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert str(live.value).startswith("FAILED_PRECONDITION: node_id: node n2's agent reported ")
        assert full_state(client) == before  # n2 still registered, the revision where it was
        assert not [w for w in _messages(caplog, "WARNING") if w.startswith("node n2 is unregistered")]

        until_unavailable(client, "n2", reporting=["n1"])
        forced = client.unregister_node("n2", force=True)
        assert forced.revision == revision + 1
        assert [node.node_id for node in client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes] == ["n1"]
        assert [w for w in _messages(caplog, "WARNING") if w.startswith("node n2 is unregistered")] == [
            f"node n2 is unregistered by force, and without it {LOST_AT_NODE}: the VCs of tenants a, b can no longer "
            "be guaranteed, and a job may find no free cell; register a node in its place, or shrink the VCs"
        ]
        until_unavailable(client, "n1")
        client.unregister_node("n1", force=True)  # the VCs fit no longer: nothing left to lose, nothing logged
        assert len([w for w in _messages(caplog, "WARNING") if " is unregistered" in w]) == 1


@pytest.mark.expected_warnings  # the registered nodes marked unavailable as they never report
@pytest.mark.parametrize("force", [False, True], ids=["plain", "forced"])
def test_unregister_node_of_a_node_the_vcs_need_that_runs_a_job_is_refused_naming_the_job_even_forced(
    tmp_path: Path, force: bool
) -> None:
    """Force overrides the tenants' guarantee only: a node that jobs use is refused first, naming them, so that a
    refusal that offers --force never leads to one that --force cannot pass (a live node's, which comes after the
    VCs', passes once its agent has stopped and the node timed out)."""
    with _tenants_on_nodes(tmp_path, "gpu:1,node:2", 2, {"a": {"node": 1}, "b": {"node": 1}}) as (_, client):
        uri = make_local_dataset(tmp_path / "ds")
        client.register_dataset(uri)
        client.register_job("j", uri, 10**6, [("n2", 1)])
        before = full_state(client)
        with pytest.raises(ClientError) as refused:
            client.unregister_node("n2", force=force)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert (
            str(refused.value)
            == "FAILED_PRECONDITION: node_id: node 'n2' runs workers of jobs ['j']; finish them first"
        )
        assert full_state(client) == before


# ---- a node still live: its agent reports, or the data manager has just restarted ----

AGENT_REPORTED = (
    r"FAILED_PRECONDITION: node_id: node n1's agent reported \d+ s ago: stop it first \(a running agent registers its "
    r"node again\), then remove the node once the data manager marks it unavailable, --node-timeout after its last "
    r"report \({timeout} s; `silod status` shows it\)"
)


def _refused_for_any_force(client: DataManagerClient, node_id: str) -> list[str]:
    """The refusals of `UnregisterNode` for `node_id`, without and with force; they must change nothing."""
    before = full_state(client)
    messages = []
    for force in (False, True):
        with pytest.raises(ClientError) as refused:
            client.unregister_node(node_id, force=force)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        messages.append(str(refused.value))
    assert full_state(client) == before
    return messages


def test_unregister_node_over_grpc_of_a_node_whose_agent_reports_is_refused_changing_nothing_until_it_times_out(
    system: System,
) -> None:
    """Only `silod node remove` refused it: through the API (a script, an operator draining nodes) the node was
    unregistered while its agent ran on, serving a node the data manager no longer knew, and the agent registered
    it again, with its own flags, at its next watch reconnect."""
    agent = system.start_node("n1")
    eventually(lambda: _available(system, "n1"), what="n1 reported by its agent")
    revision = system.client.call(system.client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision

    for message in _refused_for_any_force(system.client, "n1"):  # force passes the tenants' VCs, not an agent
        assert re.fullmatch(AGENT_REPORTED.format(timeout=5), message), message
    assert agent.process is not None and agent.process.poll() is None and is_live_mount(agent.mountpoint)

    agent.stop()
    eventually(lambda: not _available(system, "n1") or None, what="n1 marked unavailable once its agent stopped")
    assert system.client.unregister_node("n1").revision == revision + 1
    assert not system.client.call(system.client.stub.ListNodes, pb.ListNodesRequest()).nodes


def test_unregister_node_over_grpc_right_after_a_restart_says_the_restart_keeps_the_node_live_not_its_agent(
    tmp_path: Path,
) -> None:
    """The data manager gives every node it knows a --node-timeout of grace when it starts: until then it cannot
    tell a node whose agent is gone from one whose agent has yet to reconnect. An hour here, so that the grace
    outlasts the test on a busy machine."""
    system = System(tmp_path, node_timeout=3600)
    try:
        system.start_node("n1").stop()
        system.datamgr.terminate()
        system.datamgr.start()
        node = system.client.call(system.client.stub.GetNode, pb.GetNodeRequest(node_id="n1"))
        assert node.available and node.start_grace

        for message in _refused_for_any_force(system.client, "n1"):
            assert re.fullmatch(
                r"FAILED_PRECONDITION: node_id: the data manager restarted \d+ s ago and counts node n1 as live for "
                r"its --node-timeout after a start \(3600 s\) although its agent has not reported since: remove the "
                r"node once `silod status` shows it unavailable \(stop its agent first if it runs: a running agent "
                r"registers its node again\)",
                message,
            ), message

        again = MountProcess.node(system.root / "n1-again", system.datamgr.address, "n1", "--cache-capacity", "1GiB")
        system.nodes.append(again)
        again.start()
        eventually(
            lambda: not system.client.call(system.client.stub.GetNode, pb.GetNodeRequest(node_id="n1")).start_grace,
            what="n1's agent heard from",
        )
        for message in _refused_for_any_force(system.client, "n1"):  # now its agent, not the restart, keeps it live
            assert re.fullmatch(AGENT_REPORTED.format(timeout=3600), message), message
    finally:
        system.stop()
