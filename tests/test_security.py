"""TLS, mutual TLS and the bearer token, end to end over real sockets: the embedded data manager, `silod`
subprocesses and a node agent with a real mount. Every failure must be quick (no hang on a handshake), name
what to fix, and never show the token; and no log, DEBUG included, shows a secret (moto and Azurite)."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from datamgr.client import ClientError, DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.security import TOKEN_FREE_METHODS, ServerSecurity
from datamgr.server import ServerConfig
from silodcli.main import main
from silodlib.credentials import ChannelSecurity, SecurityConfigError
from silodlib.grpc_channel import explain_refusal, open_channel
from silodpb.v1 import datamgr_pb2 as pb
from silodpb.v1 import datamgr_pb2_grpc as pb_grpc
from tests import polling
from tests.datamgr_fixtures import DataManagerProcess, full_state, make_local_dataset, silod_cli, until_unavailable
from tests.mount_fixtures import MountProcess
from tests.storage_servers import AzuriteServer, DatasetTargetFactory, S3Server, container_sas
from tests.tls import TlsFiles, make_tls_files

QUICK = 5.0  # seconds: a refused connection must fail well within this, never hang
SERVICE = "/silod.v1.DataManager/"


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path / "tls")


@pytest.fixture
def other_tls(tmp_path: Path) -> TlsFiles:
    """Certificates from an unrelated CA."""
    return make_tls_files(tmp_path / "other-tls", prefix="other-")


@pytest.fixture
def token(tmp_path: Path) -> tuple[str, Path]:
    value = secrets.token_urlsafe(24)
    path = tmp_path / "token"
    path.write_text(value + "\n")  # the trailing newline is not part of the token
    return value, path


@contextmanager
def serving(
    tmp_path: Path,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_ca: Path | None = None,
    auth_token_file: Path | None = None,
) -> Iterator[str]:
    """An embedded data manager on loopback with the given security settings; yields its address."""
    config = ServerConfig(
        "127.0.0.1:0",
        tmp_path / "state",
        None,
        30.0,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca=tls_ca,
        auth_token_file=auth_token_file,
    )
    with EmbeddedDataManager(config) as dm:
        yield dm.address


def _refused(call: Callable[[], Any]) -> ClientError:
    started = time.monotonic()
    with pytest.raises(ClientError) as info:
        call()
    assert time.monotonic() - started < QUICK
    return info.value


def _status(client: DataManagerClient) -> pb.ClusterSummary:
    return client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())


# ---- TLS and mutual TLS ----


def test_tls_clients_with_the_ca_read_and_write_and_others_cannot_connect(
    tmp_path: Path, tls: TlsFiles, other_tls: TlsFiles
) -> None:
    with serving(tmp_path, tls_cert=tls.server_cert, tls_key=tls.server_key) as address:
        with DataManagerClient(address, timeout=QUICK, tls_ca=tls.ca) as client:
            client.register_node("n1", "h1:1", 1000)
            assert _status(client).node_count == 1
        port = address.rsplit(":", 1)[1]
        with DataManagerClient(f"localhost:{port}", timeout=QUICK, tls_ca=tls.ca) as by_name:
            assert _status(by_name).node_count == 1

        with DataManagerClient(address, timeout=QUICK) as plaintext:
            error = _refused(lambda: _status(plaintext))
        assert error.unreachable and "set --tls-ca" in str(error)

        with DataManagerClient(address, timeout=QUICK, tls_ca=other_tls.ca) as wrong_ca:
            error = _refused(lambda: _status(wrong_ca))
        assert error.unreachable
        assert f"TLS handshake with {address} failed (CERTIFICATE_VERIFY_FAILED): check --tls-ca" in str(error)


def test_mutual_tls_refuses_clients_without_a_certificate_of_its_ca(
    tmp_path: Path, tls: TlsFiles, other_tls: TlsFiles
) -> None:
    server = {"tls_cert": tls.server_cert, "tls_key": tls.server_key, "tls_ca": tls.ca}
    with serving(tmp_path, **server) as address:
        with DataManagerClient(address, timeout=QUICK, tls_ca=tls.ca) as no_cert:
            error = _refused(lambda: no_cert.register_node("n1", "h1:1", 1000))
        assert error.unreachable and "set --tls-cert and --tls-key" in str(error)

        stranger = (other_tls.client_cert, other_tls.client_key)
        with DataManagerClient(
            address, timeout=QUICK, tls_ca=tls.ca, tls_cert=stranger[0], tls_key=stranger[1]
        ) as foreign:
            assert _refused(lambda: _status(foreign)).unreachable

        with DataManagerClient(
            address, timeout=QUICK, tls_ca=tls.ca, tls_cert=tls.client_cert, tls_key=tls.client_key
        ) as client:
            client.register_node("n1", "h1:1", 1000)
            assert _status(client).node_count == 1


def test_a_tls_client_cannot_talk_to_a_plaintext_server(tmp_path: Path, tls: TlsFiles) -> None:
    with serving(tmp_path) as address, DataManagerClient(address, timeout=QUICK, tls_ca=tls.ca) as client:
        error = _refused(lambda: _status(client))
    assert error.unreachable and "TLS handshake" in str(error)


def test_key_files_gRPC_cannot_use_are_refused_by_name(tmp_path: Path, tls: TlsFiles) -> None:
    with pytest.raises(SecurityConfigError, match=f"--tls-key {tls.server_key} is not the private key of"):
        ChannelSecurity.load(tls_cert=tls.client_cert, tls_key=tls.server_key)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        serialization.load_pem_private_key(tls.client_key.read_bytes(), None).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(SecurityConfigError, match=f"--tls-key {encrypted} is encrypted"):
        ChannelSecurity.load(tls_cert=tls.client_cert, tls_key=encrypted)
    spaced = tmp_path / "spaced-token"
    spaced.write_text("two words\n")
    with pytest.raises(SecurityConfigError, match="the token must be printable ASCII without spaces") as info:
        ServerSecurity.load(token_file=spaced)
    assert "two" not in str(info.value)


def test_only_insecure_exposure_is_warned_about(tls: TlsFiles, token: tuple[str, Path]) -> None:
    plaintext = ServerSecurity.load().exposure_warnings("0.0.0.0:7420")
    assert [w.split(":", 2)[-1].split("(")[0].strip() for w in plaintext] == [
        "calls, including dataset credentials and tokens, cross the network in plaintext",
        "anyone who can reach it can change allocations and read dataset credentials from the watch stream",
    ]
    tls_only = ServerSecurity.load(tls.server_cert, tls.server_key)
    assert [w for w in tls_only.exposure_warnings("0.0.0.0:7420") if "without TLS" in w] == []
    assert ServerSecurity.load(tls.server_cert, tls.server_key, None, token[1]).exposure_warnings("0.0.0.0:1") == []
    assert ServerSecurity.load(tls.server_cert, tls.server_key, tls.ca).exposure_warnings("0.0.0.0:1") == []


# ---- the bearer token ----


def test_exactly_the_changes_and_the_streams_need_the_token() -> None:
    service = pb.DESCRIPTOR.services_by_name["DataManager"]
    guarded = sorted(m.name for m in service.methods if SERVICE + m.name not in TOKEN_FREE_METHODS)
    assert guarded == [
        "AllocateCacheSize",
        "AllocateRemoteIO",
        "FinishJob",
        "GetManifest",
        "RegisterDataset",
        "RegisterJob",
        "RegisterNode",
        "RegisterTenant",
        "ReportUsage",
        "UnregisterDataset",
        "UnregisterNode",
        "UnregisterTenant",
        "UpdateDatasetOptions",  # it reads the dataset with the options it is given, and changes them
        "WatchAllocations",
        "WatchDecisions",  # a launcher's stream: who runs where is not for anyone on the network
    ]


def _changes(client: DataManagerClient, uri: str) -> list[Callable[[], Any]]:
    """One of each mutating call, each of which the data manager would accept from a client with the token."""
    stub = client.stub
    return [
        lambda: client.register_node("n2", "h2:1", 10_000),
        lambda: client.register_dataset(uri.replace("/ds", "/ds2")),
        lambda: client.register_job("j2", uri, 1_000_000, [("n1", 1)]),
        lambda: client.allocate_cache_size(uri, 1000),
        lambda: client.allocate_remote_io("j1", 5_000_000),
        lambda: client.call(stub.FinishJob, pb.FinishJobRequest(job_id="j1")),
        lambda: client.call(stub.UnregisterNode, pb.UnregisterNodeRequest(node_id="n3")),
        lambda: client.call(stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=uri.replace("/ds", "/ds3"))),
        lambda: client.call(stub.ReportUsage, pb.ReportUsageRequest(node_id="n1")),
    ]


@pytest.mark.expected_warnings
def test_changes_need_the_token_and_queries_do_not(
    tmp_path: Path, token: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    value, path = token
    uri = make_local_dataset(tmp_path / "ds", files=4)
    for name in ("ds2", "ds3"):
        make_local_dataset(tmp_path / name, files=2)
    wrong = secrets.token_urlsafe(24)
    # A node timeout of a second: UnregisterNode refuses a node still live (n3, registered here, until it times out).
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", None, 1.0, auth_token_file=path)
    with EmbeddedDataManager(config) as dm:
        address = dm.address
        admin = DataManagerClient(address, timeout=QUICK, token=value)
        anonymous = DataManagerClient(address, timeout=QUICK)
        impostor = DataManagerClient(address, timeout=QUICK, token=wrong)
        admin.register_node("n1", "h1:1", 100_000)
        admin.register_node("n3", "h3:1", 100_000)
        for node_id in ("n1", "n3"):  # silent for good: no availability changes between the states compared
            until_unavailable(admin, node_id)
        admin.register_dataset(uri)
        admin.register_dataset(uri.replace("/ds", "/ds3"))
        admin.register_job("j1", uri, 1_000_000, [("n1", 1)])
        before = full_state(anonymous)  # the queries need no token

        messages = []
        for client, expected in ((anonymous, "requires a token"), (impostor, "refused the token")):
            for change in _changes(client, uri):
                error = _refused(change)
                assert error.code == grpc.StatusCode.UNAUTHENTICATED and not error.unreachable
                assert expected in str(error) and "--auth-token-file or SILOD_AUTH_TOKEN_FILE" in str(error)
                messages.append(str(error))
        assert full_state(admin) == before

        for change in _changes(admin, uri):  # the same calls with the token are accepted
            change()
        assert full_state(admin) != before

        refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused ")]
        assert len(refusals) == 2 * len(_changes(admin, uri))  # one line per refused call
        assert refusals[0].startswith(f"refused {SERVICE}RegisterNode from ipv4:127.0.0.1:")
        for client in (admin, anonymous, impostor):
            client.close()
    for text in (caplog.text, *messages):
        assert value not in text and wrong not in text


@pytest.mark.expected_warnings
def test_the_watch_and_manifest_streams_need_the_token(tmp_path: Path, token: tuple[str, Path]) -> None:
    value, path = token
    uri = make_local_dataset(tmp_path / "ds", files=4)
    with serving(tmp_path, auth_token_file=path) as address:
        with DataManagerClient(address, timeout=QUICK, token=value) as admin:
            admin.register_node("n1", "h1:1", 100_000)
            admin.register_dataset(uri)
        for security in (ChannelSecurity(), ChannelSecurity(token="not-" + value)):
            with open_channel(address, security) as channel:
                stub = pb_grpc.DataManagerStub(channel)
                streams = (
                    stub.WatchAllocations(pb.WatchAllocationsRequest(node_id="n1"), timeout=QUICK),
                    stub.GetManifest(pb.GetManifestRequest(dataset_uri=uri), timeout=QUICK),
                )
                for stream in streams:
                    with pytest.raises(grpc.RpcError) as info:
                        next(iter(stream))
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with open_channel(address, ChannelSecurity(token=value)) as channel:
            stub = pb_grpc.DataManagerStub(channel)
            watch = stub.WatchAllocations(pb.WatchAllocationsRequest(node_id="n1"), timeout=QUICK)
            assert next(iter(watch)).HasField("snapshot")
            watch.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves cancel() untyped
            chunks = list(stub.GetManifest(pb.GetManifestRequest(dataset_uri=uri), timeout=QUICK))
            assert chunks and chunks[0].total_bytes > 0


# ---- the command line ----


@pytest.fixture
def start_datamgr(tmp_path: Path) -> Iterator[Callable[..., DataManagerProcess]]:
    """`start(*args)` -> a started `silod datamgr serve` with extra args, stopped at teardown."""
    started: list[DataManagerProcess] = []

    def start(*args: str | Path) -> DataManagerProcess:
        started.append(DataManagerProcess(tmp_path / "state", tmp_path / "datamgr.log", *map(str, args)))
        return started[-1].start()

    yield start
    for proc in started:
        proc.stop()


def test_the_cli_talks_to_a_tls_and_token_data_manager(
    start_datamgr: Callable[..., DataManagerProcess],
    tls: TlsFiles,
    other_tls: TlsFiles,
    token: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value, path = token
    datamgr = start_datamgr("--tls-cert", tls.server_cert, "--tls-key", tls.server_key, "--auth-token-file", path)
    address = datamgr.address
    assert "(TLS, token required for changes and streams;" in datamgr.log_path.read_text()
    secure = ("--tls-ca", str(tls.ca), "--auth-token-file", str(path))
    status = silod_cli("status", *secure, datamgr=address)
    assert status.returncode == 0, status.stderr
    assert "0 datasets, 0 jobs, 0 nodes" in status.stdout

    uri = make_local_dataset(tmp_path / "ds", files=3)
    tokenless = silod_cli("dataset", "add", uri, "--tls-ca", str(tls.ca), datamgr=address)
    assert tokenless.returncode == 1
    assert "requires a token: set --auth-token-file or SILOD_AUTH_TOKEN_FILE" in tokenless.stderr
    added = silod_cli("dataset", "add", uri, *secure, datamgr=address)
    assert added.returncode == 0, added.stderr

    plaintext = silod_cli("status", datamgr=address)
    assert plaintext.returncode == 3 and "set --tls-ca or SILOD_TLS_CA" in plaintext.stderr

    # A flag wins over its environment variable; the variable applies without the flag.
    monkeypatch.setenv("SILOD_TLS_CA", str(other_tls.ca))
    monkeypatch.setenv("SILOD_AUTH_TOKEN_FILE", str(path))
    wrong_env = silod_cli("status", datamgr=address)
    assert wrong_env.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in wrong_env.stderr
    # One line, silod's: gRPC's "I1127 ... Handshake failed with error SSL_ERROR_SSL ..." came first.
    assert wrong_env.stderr.startswith("silod: TLS handshake with") and wrong_env.stderr.count("\n") == 1
    flag_wins = silod_cli("job", "add", "j1", "--dataset", uri, "--ideal-rate", "1MB/s", "--worker", "n1",
                          "--tls-ca", str(tls.ca), datamgr=address)  # fmt: skip
    assert flag_wins.returncode == 1 and "NOT_FOUND" in flag_wins.stderr  # authenticated; node n1 is unknown
    monkeypatch.setenv("SILOD_TLS_CA", str(tls.ca))
    from_env = silod_cli("status", "--json", datamgr=address)
    assert from_env.returncode == 0, from_env.stderr

    outputs = [r.stdout + r.stderr for r in (status, tokenless, added, plaintext, wrong_env, flag_wins, from_env)]
    for text in (*outputs, datamgr.log_path.read_text()):
        assert value not in text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--tls-cert", "{CERT}"), "--tls-cert and --tls-key must be given together"),
        (("--tls-key", "{KEY}"), "--tls-cert and --tls-key must be given together"),
        (("--tls-ca", "{CA}"), "--tls-ca (require client certificates) needs --tls-cert and --tls-key"),
        (("--tls-cert", "{GARBAGE}", "--tls-key", "{KEY}"), "--tls-cert {GARBAGE} is not a PEM certificate file"),
        (("--tls-cert", "{CERT}", "--tls-key", "{GARBAGE}"), "--tls-key {GARBAGE} is not a PEM private key"),
        (("--auth-token-file", "{EMPTY}"), "--auth-token-file {EMPTY} is empty"),
        # Longer than gRPC's headers carry (a 12 KiB one failed calls at random), and a file that never ends.
        (("--auth-token-file", "{LONG}"), "--auth-token-file {LONG} is longer than 4,096 bytes"),
        (("--auth-token-file", "{ENDLESS}"), "--auth-token-file {ENDLESS} is longer than 4,096 bytes"),
    ],
)
def test_serve_refuses_bad_security_flags_by_name(
    tmp_path: Path, tls: TlsFiles, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fragment: str
) -> None:
    # In process: the flags are refused before anything starts, so no subprocess (nor the machine's speed) is
    # involved; a refusal that came later would start a server here and fail the exit code below.
    files = _bad_files(tmp_path, tls)
    serve = ["datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
    assert main([*serve, *(a.format(**files) for a in args)], environ={}) == 2
    assert fragment.format(**files) in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before touching the state dir


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--tls-cert", "{CERT}"), "--tls-cert and --tls-key must be given together"),
        (("--tls-ca", "{GARBAGE}"), "--tls-ca {GARBAGE} is not a PEM certificate file"),
        (("--tls-ca", "{MISSING}"), "cannot read --tls-ca {MISSING}: No such file or directory"),
        (("--auth-token-file", "{EMPTY}"), "--auth-token-file {EMPTY} is empty"),
        (("--auth-token-file", "{LONG}"), "--auth-token-file {LONG} is longer than 4,096 bytes"),
        (("--auth-token-file", "{ENDLESS}"), "--auth-token-file {ENDLESS} is longer than 4,096 bytes"),
    ],
)
@pytest.mark.parametrize("command", [("status",), ("node", "--node-id", "n1", "--mountpoint", "M", "--cache-dir", "C")])
def test_clients_refuse_bad_security_flags_by_name(
    tmp_path: Path,
    tls: TlsFiles,
    capsys: pytest.CaptureFixture[str],
    command: tuple[str, ...],
    args: tuple[str, ...],
    fragment: str,
) -> None:
    files = _bad_files(tmp_path, tls)
    (tmp_path / "m").mkdir()
    places = {"M": str(tmp_path / "m"), "C": str(tmp_path / "c")}
    argv = [places.get(a, a) for a in command] + [a.format(**files) for a in args]
    assert main(argv, environ={"SILOD_DATAMGR": "127.0.0.1:1"}) == 2
    assert fragment.format(**files) in capsys.readouterr().err
    assert not (tmp_path / "c").exists()  # refused before taking the cache dir


def _bad_files(tmp_path: Path, tls: TlsFiles) -> dict[str, Path]:
    (tmp_path / "garbage.pem").write_text("-----BEGIN NOTHING-----\n")
    (tmp_path / "empty").write_text("  \n")
    (tmp_path / "long").write_text("t" * 12_288 + "\n")
    return {
        "CERT": tls.server_cert,
        "KEY": tls.server_key,
        "CA": tls.ca,
        "GARBAGE": tmp_path / "garbage.pem",
        "EMPTY": tmp_path / "empty",
        "MISSING": tmp_path / "missing.pem",
        "LONG": tmp_path / "long",
        "ENDLESS": Path("/dev/zero"),
    }


# ---- the node agent ----


def test_a_node_agent_follows_a_mutual_tls_and_token_data_manager(
    start_datamgr: Callable[..., DataManagerProcess], tmp_path: Path, tls: TlsFiles, token: tuple[str, Path]
) -> None:
    value, path = token
    datamgr = start_datamgr(
        "--tls-cert", tls.server_cert, "--tls-key", tls.server_key, "--tls-ca", tls.ca, "--auth-token-file", path
    )
    node = MountProcess.node(
        tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", "1GiB", "--auth-token-file", str(path),
        "--tls-ca", str(tls.ca), "--tls-cert", str(tls.client_cert), "--tls-key", str(tls.client_key),
    )  # fmt: skip
    uri = make_local_dataset(tmp_path / "ds", files=6, size=5000)
    try:
        node.start()
        with DataManagerClient(
            datamgr.address, timeout=QUICK, tls_ca=tls.ca, tls_cert=tls.client_cert, tls_key=tls.client_key, token=value
        ) as client:
            _eventually(lambda: client.call(client.stub.GetNode, pb.GetNodeRequest(node_id="n1")), "registration")
            client.register_dataset(uri)
            client.register_job("j1", uri, 1_000_000, [("n1", 1)])
            client.allocate_remote_io("j1", 1_000_000)  # at the default of 0, uncached reads wait for a rate
        first = node.job_dir("j1") / "d0" / "f000.bin"
        _eventually(first.exists, "the job directory in the mount")
        assert first.read_bytes() == (tmp_path / "ds" / "d0" / "f000.bin").read_bytes()
    finally:
        node.stop()
    datamgr_log = datamgr.log_path.read_text()
    assert value not in node.log_path.read_text() + datamgr_log
    assert "refused" not in datamgr_log


def test_a_node_agent_without_the_token_stops_and_says_why(
    start_datamgr: Callable[..., DataManagerProcess], tmp_path: Path, token: tuple[str, Path]
) -> None:
    datamgr = start_datamgr("--auth-token-file", token[1])
    node = MountProcess.node(tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", "1GiB")
    try:  # not node.start(): the mount may come and go between its polls
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(node.argv, stdout=log, stderr=log)
        assert node.process.wait(timeout=60) == 1
    finally:
        node.stop()
    assert "requires a token: set --auth-token-file or SILOD_AUTH_TOKEN_FILE" in node.log_path.read_text()
    assert not os.path.ismount(node.mountpoint)


def _eventually(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy, tolerating a data manager that does not know it yet."""
    return polling.eventually(
        check,
        what=what,
        timeout=timeout,
        ignore=lambda exc: isinstance(exc, ClientError) and exc.code == grpc.StatusCode.NOT_FOUND,
    )


def test_a_connection_closed_during_set_up_suggests_tls_only_to_a_client_that_never_connected() -> None:
    # A real listener that reads the client's preface and hangs up, as a TLS data manager does to plaintext
    # and as a crashing one can: before any call succeeded that points at TLS settings; after, at an outage.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up_on_everyone() -> None:
        while True:
            peer, _ = listener.accept()
            peer.recv(65536)
            peer.close()

    threading.Thread(target=hang_up_on_everyone, daemon=True).start()
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as failed:
        pb_grpc.DataManagerStub(channel).GetClusterSummary(pb.GetClusterSummaryRequest(), timeout=10)
    assert "socket closed" in (failed.value.details() or "").lower()
    plaintext = ChannelSecurity()
    never = explain_refusal(failed.value, address, plaintext)
    assert never is not None and "if it serves TLS, set --tls-ca" in never
    assert explain_refusal(failed.value, address, plaintext, connected_before=True) is None
    listener.close()


# ---- no secret in the logs, DEBUG included ----


def test_debug_logs_of_the_data_manager_and_a_node_hold_no_secret(
    start_datamgr: Callable[..., DataManagerProcess],
    dataset_target_factory: DatasetTargetFactory,
    s3_server: S3Server,
    azurite: AzuriteServer,
    token: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDKs dump every request at DEBUG (botocore its headers and the string it signs, urllib3 its request
    # line with a SAS query): a data manager listing, and a node agent reading, S3 with a session token and
    # Azure with a SAS and with the account key must write all of that without one secret.
    value, token_path = token
    session_token = f"SessTokSECRET42-{secrets.token_hex(8)}"
    s3, az_sas, az_key = (dataset_target_factory(backend) for backend in ("s3", "az", "az"))
    for target in (s3, az_sas, az_key):
        target.put("x.bin", target.uri.encode())
    sas = container_sas(azurite, az_sas.uri)
    monkeypatch.setenv("SILOD_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("SILOD_TEST_SECRET_KEY", s3_server.secret_access_key)
    monkeypatch.setenv("SILOD_TEST_SESSION_TOKEN", session_token)
    monkeypatch.setenv("SILOD_TEST_SAS", sas)
    monkeypatch.setenv("SILOD_TEST_ACCOUNT_KEY", azurite.account_key)
    options = {
        s3.uri: [*(f"{k}={s3.options[k]}" for k in ("endpoint_url", "region", "path_style", "access_key_id"))],
        az_sas.uri: [f"account_url={azurite.account_url}"],
        az_key.uri: [f"account_url={azurite.account_url}"],
    }
    secret_envs = {
        s3.uri: ["secret_access_key=SILOD_TEST_SECRET_KEY", "session_token=SILOD_TEST_SESSION_TOKEN"],
        az_sas.uri: ["sas_token=SILOD_TEST_SAS"],
        az_key.uri: ["account_key=SILOD_TEST_ACCOUNT_KEY"],
    }
    datamgr = start_datamgr("--auth-token-file", token_path)
    node = MountProcess.node(
        tmp_path / "n1", datamgr.address, "n1", "--cache-capacity", "1GiB", "--auth-token-file", str(token_path)
    )
    cli_output = ""
    try:
        node.start()
        with DataManagerClient(datamgr.address, timeout=QUICK, token=value) as client:
            _eventually(lambda: client.call(client.stub.GetNode, pb.GetNodeRequest(node_id="n1")), "registration")
            for number, uri in enumerate(options, 1):
                flags = [a for o in options[uri] for a in ("--option", o)]
                flags += [a for e in secret_envs[uri] for a in ("--option-env", e)]
                flags += ["--auth-token-file", str(token_path)]
                added = silod_cli("dataset", "add", uri, *flags, datamgr=datamgr.address)
                assert added.returncode == 0, added.stderr
                cli_output += added.stdout + added.stderr
                client.register_job(f"j{number}", uri, 1_000_000, [("n1", 1)])
                client.allocate_remote_io(f"j{number}", 1_000_000)
        for number, uri in enumerate(options, 1):
            item = node.job_dir(f"j{number}") / "x.bin"
            _eventually(item.exists, str(item))
            assert item.read_bytes() == uri.encode()
    finally:
        node.stop()
    datamgr_log, node_log = datamgr.log_path.read_text(), node.log_path.read_text()

    # Everything the SDKs log at DEBUG is there, scrubbed where it held a secret.
    for log in (datamgr_log, node_log):
        assert "DEBUG botocore.auth: CanonicalRequest:" in log and "\nx-amz-security-token:<redacted>\n" in log
        assert "botocore.auth: Signature:\n<redacted>\n" in log
        assert re.search(rf'"GET /{azurite.account_name}/\S*[?&]<redacted> HTTP/1\.1" 20[06]', log)  # urllib3, SAS
    assert "DEBUG botocore.endpoint: Sending http request:" in datamgr_log
    assert "'X-Amz-Security-Token': b'<redacted>'" in datamgr_log and "'Authorization': b'<redacted>'" in datamgr_log
    sig = parse_qs(sas)["sig"][0]
    secret_values = (s3_server.secret_access_key, session_token, sas, sig, quote(sig, safe=""), azurite.account_key)
    for text in (datamgr_log, node_log, cli_output):
        for secret in (*secret_values, value):
            assert secret not in text


@pytest.mark.expected_warnings
def test_a_client_warns_once_when_its_token_would_go_to_another_machine_in_plaintext(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the data manager warned, at its end; a client sent its token to any address without TLS quietly. No
    call is made: a channel connects on its first call."""
    token = ChannelSecurity(token="t0ken-never-logged")
    for address in ("127.0.0.1:7420", "localhost:7420", "[::1]:7420"):
        open_channel(address, token).close()
    open_channel("192.0.2.7:7420", ChannelSecurity()).close()  # no token: nothing to leak but the calls
    assert "plaintext" not in caplog.text

    for _ in range(2):
        open_channel("192.0.2.7:7420", token).close()  # TEST-NET-1: documentation only, never reached
    assert caplog.text.count("the token goes to the data manager at 192.0.2.7:7420 in plaintext") == 1
    assert "--tls-ca" in caplog.text and "t0ken-never-logged" not in caplog.text
