"""Prometheus metrics: the data manager's /metrics over real HTTP, and a node's collector over a live mount."""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from datamgr.client import ClientError, DataManagerClient
from datamgr.devservers import free_port
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from fuseclient.assembly import MountConfig, build_state
from fuseclient.metrics import MountMetrics
from fuseclient.openfile import OpenFile
from silodlib.metrics_endpoint import MetricsEndpoint, MetricsPortError
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.datamgr_fixtures import DataManagerProcess, RunningDataManager, make_local_dataset, silod_cli, watch
from tests.mount_fixtures import MountProcess, is_live_mount


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, from the Prometheus text format."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_data_manager_counts_rpcs_by_method_and_status_and_shows_its_state(tmp_path: Path) -> None:
    port = free_port()
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 10**9, 30.0, metrics_port=port)
    with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address) as client:
        uri = make_local_dataset(tmp_path / "ds")
        client.register_node("n1", "h:1", 10**9)
        client.register_dataset(uri)
        client.register_job("j1", uri, 10**8, [("n1", 1)])
        client.allocate_remote_io("j1", 5_000_000)
        with contextlib.suppress(ClientError):  # a NOT_FOUND to be counted
            client.allocate_remote_io("nojob", 1)
        # A call is counted once its handler is done, and an aborted call's status reaches the client first.
        not_found = ("silod_rpc_requests_total", (("code", "NOT_FOUND"), ("method", "AllocateRemoteIO")))

        def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            found = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
            return found if not_found in found else None

        values = polling.eventually(scraped, what="the NOT_FOUND call counted", timeout=10)
    assert values[("silod_rpc_requests_total", (("code", "OK"), ("method", "AllocateRemoteIO")))] == 1
    assert values[not_found] == 1
    assert values[("silod_rpc_duration_seconds_count", (("method", "RegisterJob"),))] == 1
    assert values[("silod_nodes", ())] == 1
    assert values[("silod_revision", ())] == 4
    assert values[("silod_remote_io_allocated_bytes_per_second", ())] == 5_000_000
    assert values[("silod_job_remote_io_allocated_bytes_per_second", (("job_id", "j1"),))] == 5_000_000


@pytest.mark.expected_warnings  # the refusal of the tokenless watch
def test_refused_and_cancelled_streams_are_counted_by_their_status_and_refused_ones_refused(tmp_path: Path) -> None:
    # With metrics on, a tokenless stream got UNKNOWN ("'async for' requires an object with __aiter__ method") and a
    # traceback, not UNAUTHENTICATED; and a watch its agent ended was counted as UNKNOWN, a server error.
    port, token = free_port(), tmp_path / "token"
    token.write_text("a-token-of-the-data-manager\n")
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 10**9, 30.0, auth_token_file=token, metrics_port=port)
    with EmbeddedDataManager(config) as dm:
        with DataManagerClient(dm.address, token="a-token-of-the-data-manager") as client:
            client.register_node("n1", "h:1", 10**9)
            stream = watch(client, "n1")
            stream.next()
            stream.cancel()
        with DataManagerClient(dm.address) as tokenless, pytest.raises(grpc.RpcError) as refused:
            watch(tokenless, "n1").next()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()

        def counted(code: str) -> tuple[str, tuple[tuple[str, str], ...]]:
            return ("silod_rpc_requests_total", (("code", code), ("method", "WatchAllocations")))

        def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            found = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
            return found if counted("CANCELLED") in found and counted("UNAUTHENTICATED") in found else None

        values = polling.eventually(scraped, what="both streams counted", timeout=10)
    assert values[counted("CANCELLED")] == values[counted("UNAUTHENTICATED")] == 1
    assert counted("UNKNOWN") not in values


def test_a_node_exposes_cache_backend_throttle_and_job_progress(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    rng = random.Random(2)
    for i in range(10):
        (root / f"f{i}.bin").parent.mkdir(parents=True, exist_ok=True)
        (root / f"f{i}.bin").write_bytes(rng.randbytes(1000))
    uri = f"file://{root}"
    config = MountConfig(tmp_path / "mnt", tmp_path / "cache", {"job": uri}, {uri: 5000}, {"job": 1_000_000})

    async def main() -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], int]:
        mount = await build_state(config)
        job = mount.jobs["job"]
        for index in range(9):
            opened = OpenFile(job, index, mount.read_buffers)
            await opened.read(0, 1000)
            opened.release()
        # An open file's first read of an item the cache did not admit: it holds the item for its next reads.
        await OpenFile(job, 9, mount.read_buffers).read(0, 100)
        metrics = MountMetrics(mount, trio.lowlevel.current_trio_token(), reconnects=lambda: 3)
        text = await trio.to_thread.run_sync(generate_latest, metrics.registry)  # scrapes come from a thread
        job.dataset.cache.close()
        return samples(text.decode()), mount.read_buffers.budget_bytes

    values, budget = trio.run(main)
    dataset, job = (("dataset", uri),), (("job_id", "job"),)
    assert values[("silod_cache_bytes", dataset)] == 5000
    assert values[("silod_cache_items", dataset)] == 5
    assert values[("silod_cache_rejected_items_total", dataset)] == 5
    assert values[("silod_backend_bytes_total", dataset)] == 10_000
    assert values[("silod_backend_read_seconds_count", dataset)] == 10
    assert values[("silod_job_read_bytes_total", job)] == 9_100
    assert (values[("silod_job_cache_hits_total", job)], values[("silod_job_cache_misses_total", job)]) == (0, 10)
    assert values[("silod_job_refetched_items_total", job)] == 0
    assert values[("silod_job_remote_io_bytes_per_second", job)] == 1_000_000
    assert values[("silod_job_throughput_bytes_per_second", job)] > 0
    assert values[("silod_read_buffer_bytes", ())] == 1000
    assert values[("silod_read_buffer_budget_bytes", ())] == budget > 0
    assert values[("silod_watch_reconnects_total", ())] == 3


def test_silod_mount_serves_its_metrics_over_http(mount_factory: Any, tmp_path: Path) -> None:
    uri = make_local_dataset(tmp_path / "ds", files=4, size=3000)
    port = free_port()
    mount = mount_factory({"job1": uri}, "--metrics-port", str(port), "--cache-size", f"{uri}=1MB")
    for path in (tmp_path / "ds").rglob("*.bin"):
        (mount.job_dir("job1") / path.relative_to(tmp_path / "ds")).read_bytes()
    values = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
    assert values[("silod_job_read_bytes_total", (("job_id", "job1"),))] == 4 * 3000
    assert values[("silod_cache_items", (("dataset", uri),))] == 4


@contextlib.contextmanager
def _port_in_use() -> Iterator[int]:
    """A port another program listens on, for as long as the block runs."""
    with socket.create_server(("0.0.0.0", 0)) as taken:
        yield int(taken.getsockname()[1])


def test_a_metrics_port_in_use_stops_the_data_manager_before_it_serves_naming_the_port(tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    with _port_in_use() as port:
        result = silod_cli(
            "datamgr", "serve", "--state-dir", str(tmp_path / "state"), "--listen", listen, "--metrics-port", str(port)
        )
    assert result.returncode == 2
    assert f"--metrics-port {port}: cannot serve /metrics on 127.0.0.1: the port is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert "data manager listening" not in result.stderr  # it stopped before serving anything


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "detached"])
def test_a_metrics_port_in_use_stops_a_mount_before_it_mounts_naming_the_port(tmp_path: Path, foreground: bool) -> None:
    uri = make_local_dataset(tmp_path / "ds", files=2, size=100)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = ["mount", str(mountpoint), "--cache-dir", str(tmp_path / "cache"), "--job", f"j={uri}"]
    with _port_in_use() as port:
        result = silod_cli(*argv, "--metrics-port", str(port), *(["--foreground"] if foreground else []))
    assert result.returncode == 1
    assert f"silod mount: --metrics-port {port}: cannot serve /metrics on 0.0.0.0: the port is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not is_live_mount(mountpoint)


def test_a_metrics_port_in_use_stops_a_node_agent_before_it_registers_its_node(
    datamgr: RunningDataManager, tmp_path: Path
) -> None:
    # The port was bound only once the node was registered: the agent exited 1, its node stayed registered and
    # shown available, and an agent started again with other flags was refused until `silod node remove`.
    agent = MountProcess.node(tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", "1GiB")
    with _port_in_use() as port:
        result = subprocess.run([*agent.argv, "--metrics-port", str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"silod node: --metrics-port {port}: cannot serve /metrics on 0.0.0.0: the port is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not is_live_mount(agent.mountpoint)
    nodes = datamgr.client.call(datamgr.client.stub.ListNodes, pb.ListNodesRequest())
    assert [node.node_id for node in nodes.nodes] == []


# /metrics where the gRPC listener is, at /metrics only; a refused port as a JSON record with --log-json.

LOOPBACKS = frozenset({"127.0.0.1", "::1"})
_LISTENING_PORT = re.compile(r"data manager listening on \S+:(\d+) ")
_METRICS_PORT = re.compile(r"metrics at http://\S+:(\d+)/metrics")


def _loopbacks_listening(port: int) -> set[str]:
    """The loopback addresses that take a connection at `port`."""
    listening = set()
    for host in LOOPBACKS:
        with contextlib.suppress(ConnectionRefusedError), socket.create_connection((host, port), timeout=5):
            listening.add(host)
    return listening


def _scrape(host: str, port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a request to the metrics server at `host` (an IPv6 one bare)."""
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


def _logged_ports(dm: DataManagerProcess) -> tuple[int, int]:
    """The gRPC and metrics ports a data manager logs once it serves."""

    def ports() -> tuple[int, int] | None:
        log = dm.log_path.read_text()
        assert dm.process is not None and dm.process.poll() is None, f"the data manager exited:\n{log}"
        listening, metrics = _LISTENING_PORT.search(log), _METRICS_PORT.search(log)
        return None if listening is None or metrics is None else (int(listening[1]), int(metrics[1]))

    logged: tuple[int, int] = polling.eventually(ports, what=lambda: f"ports:\n{dm.log_path.read_text()}", timeout=30)
    return logged


@pytest.mark.parametrize(
    ("host", "loopbacks"),
    [("[::1]", {"::1"}), ("[::]", LOOPBACKS), ("localhost", LOOPBACKS), ("0.0.0.0", LOOPBACKS)],
)
def test_the_data_managers_metrics_are_served_on_the_addresses_its_grpc_listener_takes(
    tmp_path: Path, host: str, loopbacks: set[str]
) -> None:
    # An IPv6 --listen with --metrics-port exited 2 ("cannot serve /metrics on [::1]: Name or service not known");
    # localhost and 0.0.0.0 served /metrics on IPv4 only, while gRPC took IPv6 too.
    dm = DataManagerProcess(tmp_path / "state", tmp_path / "dm.log", "--metrics-port", "0", listen=f"{host}:0")
    dm.launch()
    try:
        grpc_port, metrics_port = _logged_ports(dm)
        assert _loopbacks_listening(grpc_port) == loopbacks
        assert _loopbacks_listening(metrics_port) == loopbacks
        for loopback in loopbacks:
            status, _, body = _scrape(loopback, metrics_port)
            assert status == 200 and samples(body.decode())[("silod_revision", ())] == 0
    finally:
        dm.stop()


def test_a_mounts_metrics_are_served_over_ipv6_as_well_as_ipv4(mount_factory: Any, tmp_path: Path) -> None:
    # "All interfaces" were IPv4's only: a node scraped over IPv6 (an IPv6-only cluster) served no metrics.
    uri = make_local_dataset(tmp_path / "ds", files=2, size=100)
    port = free_port()
    mount_factory({"job1": uri}, "--metrics-port", str(port))
    assert _loopbacks_listening(port) == LOOPBACKS
    status, _, body = _scrape("::1", port)
    assert status == 200 and samples(body.decode())[("silod_job_read_bytes_total", (("job_id", "job1"),))] == 0


def test_a_metrics_host_resolving_to_an_address_this_machine_lacks_is_served_on_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As gRPC passes over such an address (::1 for localhost where IPv6 is off): /metrics failed on the first one.
    resolve = socket.getaddrinfo
    lacked, held = resolve("192.0.2.1", 0, type=socket.SOCK_STREAM), resolve("127.0.0.1", 0, type=socket.SOCK_STREAM)
    names = {"lacked-and-held.test": lacked + held, "lacked.test": lacked}
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kw: names.get(host) or resolve(host, *args, **kw))
    endpoint = MetricsEndpoint()
    try:
        port = endpoint.serve("lacked-and-held.test", 0)
        assert _scrape("127.0.0.1", port)[0] == 200
        with pytest.raises(MetricsPortError) as refused:
            MetricsEndpoint().serve("lacked.test", 0)
        assert "on lacked.test: lacked.test is not an address of this machine" in str(refused.value)
    finally:
        endpoint.close()


def test_metrics_are_only_at_metrics_head_has_the_headers_of_get_and_name_filters_are_refused(tmp_path: Path) -> None:
    # prometheus_client's server served the metrics on any path (hiding a scrape job's wrong metrics_path), answered
    # HEAD with 405, and `?name[]=silod_revision` with 200 and an empty body: its filter drops what collectors make.
    port = free_port()
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 10**9, 30.0, metrics_port=port)
    with EmbeddedDataManager(config):
        for path in ("/", "/no/such/path", "/metrics/", "/favicon.ico"):
            assert _scrape("127.0.0.1", port, path)[::2] == (404, b"silod serves its metrics at /metrics\n"), path
        status, _, body = _scrape("127.0.0.1", port, "/metrics?name[]=silod_revision")
        assert status == 400 and b"takes no name[] filter" in body
        got, got_headers, metrics = _scrape("127.0.0.1", port)
        head, head_headers, nothing = _scrape("127.0.0.1", port, method="HEAD")
    assert got == head == 200 and nothing == b""
    assert head_headers["Content-Type"] == got_headers["Content-Type"]
    assert int(head_headers["Content-Length"]) == len(metrics) > 0


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "detached"])
def test_a_mount_logging_json_writes_its_refused_metrics_port_as_json(tmp_path: Path, foreground: bool) -> None:
    # The line that says why the daemon stopped was the one plain-text line among JSON ones.
    uri = make_local_dataset(tmp_path / "ds", files=2, size=100)
    mountpoint, cache_dir = tmp_path / "mnt", tmp_path / "cache"
    mountpoint.mkdir()
    argv = ["--log-json", "mount", str(mountpoint), "--cache-dir", str(cache_dir), "--job", f"j={uri}"]
    with _port_in_use() as port:
        result = silod_cli(*argv, "--metrics-port", str(port), *(["--foreground"] if foreground else []))
    assert result.returncode == 1
    *_, last = [json.loads(line) for line in result.stderr.splitlines()]
    refusal = f"silod mount: --metrics-port {port}: cannot serve /metrics on 0.0.0.0: the port is in use"
    detached = "" if foreground else f"; see {cache_dir}/mount.log"
    assert last["level"] == "CRITICAL" and last["logger"] == "silod" and {"ts", "msg"} <= last.keys()
    assert last["msg"] == f"{refusal} (another program, or another silod daemon, listens there){detached}"


def test_per_job_series_of_both_daemons_are_labelled_job_id_and_their_remote_io_rates_are_named_apart(
    tmp_path: Path,
) -> None:
    # Labelled `job`, which Prometheus sets to the scrape job's name (a target's own is stored as `exported_job`):
    # a query by the label the docs named found nothing. And both daemons served
    # silod_job_remote_io_bytes_per_second (the job's allocation, and each node's share of it), so a sum by job
    # over everything scraped counted every job twice.
    dm = DataManagerProcess(tmp_path / "state", tmp_path / "dm.log", "--metrics-port", "0")
    dm.start()
    node_port = free_port()
    node = MountProcess.node(tmp_path / "n1", dm.address, "n1", "--metrics-port", str(node_port))
    try:
        node.start()
        with DataManagerClient(dm.address, timeout=10) as client:
            uri = make_local_dataset(tmp_path / "ds")
            client.register_dataset(uri)
            client.register_job("j1", uri, 10**8, [("n1", 1)])
            client.allocate_remote_io("j1", 4_000_000)
        node_rate = ("silod_job_remote_io_bytes_per_second", (("job_id", "j1"),))

        def node_scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            found = samples(_scrape("127.0.0.1", node_port)[2].decode())
            return found if found.get(node_rate) == 4_000_000 else None

        on_node = polling.eventually(node_scraped, what="the node throttling j1 at its rate", timeout=30)
        on_datamgr = samples(_scrape("127.0.0.1", _logged_ports(dm)[1])[2].decode())
    finally:
        node.stop()
        dm.stop()
    assert on_datamgr[("silod_job_remote_io_allocated_bytes_per_second", (("job_id", "j1"),))] == 4_000_000
    for scraped in (on_node, on_datamgr):
        per_job = {(name, labels) for name, labels in scraped if name.startswith("silod_job_")}
        assert per_job and all(labels == (("job_id", "j1"),) for _, labels in per_job), per_job
    assert not {name for name, _ in on_node} & {name for name, _ in on_datamgr if name.startswith("silod_job_")}
