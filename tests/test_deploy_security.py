"""The secure deployment: the overlays' TLS and token settings, the Secrets behind their files, and the
recipe of docs/deploy.md that makes them, run against a loopback data manager with the overlay's settings."""

from __future__ import annotations

import itertools
import posixpath
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from datamgr.client import DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from silodlib.credentials import read_token
from silodpb.v1 import datamgr_pb2 as pb
from tests.deploy_model import (
    DEPLOY_DOC,
    K8S,
    NAMESPACE,
    SECURE,
    SECURE_JOB,
    SERVICE_DNS,
    Container,
    SilodCall,
    calls_of,
    host_port,
    k8s_containers,
    kustomize_build,
    kustomize_resources,
    silod_calls,
)
from tests.storage_servers import missing_dependency

# ---- the secure overlays: TLS, mutual TLS and a token ----

SECURITY_SETTINGS = ("tls_cert", "tls_key", "tls_ca", "auth_token_file")  # the flags' dests, and ServerConfig's


def secret_file(container: Container, path: Path) -> tuple[str, str]:
    """The (Secret, key) that provides `path` in `container`: a read-only Secret volume mounted at its directory,
    its keys as the file names."""
    mounts = [m for m in container.spec.get("volumeMounts", []) if m["mountPath"] == posixpath.dirname(str(path))]
    assert len(mounts) == 1, f"{container.origin}: no volume is mounted where {path} is"
    (mount,) = mounts
    (volume,) = [v for v in container.pod["volumes"] if v["name"] == mount["name"]]
    assert "secret" in volume, f"{container.origin}: {path} is on volume {volume['name']}, which is not a Secret"
    assert mount.get("readOnly") is True and "items" not in volume["secret"], container.origin
    return volume["secret"]["secretName"], posixpath.basename(str(path))


def security_files(
    container: Container, call: SilodCall, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, tuple[str, str]]:
    """The TLS and token settings of `call` (flags, or SILOD_* variables of the container), each as the
    (Secret, key) that provides the file; fails on a setting left unset."""
    args = call.parse(monkeypatch, capsys)
    unset = [name for name in SECURITY_SETTINGS if getattr(args, name) is None]
    assert not unset, f"{call.origin}: `silod {call.subcommand}` runs without {unset}"
    return {name: secret_file(container, getattr(args, name)) for name in SECURITY_SETTINGS}


def secure_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[SilodCall, dict[str, tuple[str, str]]]:
    (datamgr,) = [c for c in k8s_containers(kustomize_build(SECURE)) if calls_of([c], "datamgr serve")]
    (serve,) = calls_of([datamgr], "datamgr serve")
    return serve, security_files(datamgr, serve, monkeypatch, capsys)


def secure_clients(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, dict[str, tuple[str, str]]]:
    """Every call that talks to the data manager in the secure overlays, by origin and subcommand."""
    clients = {}
    for directory in (SECURE, SECURE_JOB):
        for container in k8s_containers(kustomize_build(directory), str(directory.relative_to(K8S))):
            for call in silod_calls(container):
                if call.subcommand not in ("datamgr serve", "umount"):
                    files = security_files(container, call, monkeypatch, capsys)
                    clients[f"{call.origin}: silod {call.subcommand}"] = files
    return clients


def test_the_secure_data_manager_serves_mutual_tls_and_requires_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve, files = secure_server(monkeypatch, capsys)
    tls_secret = files["tls_cert"][0]
    assert files == {
        "tls_cert": (tls_secret, "tls.crt"),
        "tls_key": (tls_secret, "tls.key"),
        "tls_ca": (tls_secret, "ca.crt"),  # given: client certificates are required
        "auth_token_file": (files["auth_token_file"][0], "token"),
    }
    assert files["auth_token_file"][0] != tls_secret, "the token is its own Secret, shared with the clients"
    base_serve = calls_of(k8s_containers(kustomize_resources()), "datamgr serve")[0].argv
    assert serve.argv[: len(base_serve)] == base_serve, "the overlay only adds flags"


def test_every_secure_client_presents_a_certificate_and_the_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, server = secure_server(monkeypatch, capsys)
    clients = secure_clients(monkeypatch, capsys)
    subcommands = {origin.rsplit("silod ", 1)[1] for origin in clients}
    assert subcommands == {"node", "job add", "alloc io", "job finish"}, "the node agent and the example job"
    for origin, files in clients.items():
        client_secret = files["tls_cert"][0]
        assert files["tls_cert"] == (client_secret, "tls.crt") and files["tls_key"] == (client_secret, "tls.key")
        assert files["tls_ca"] == (client_secret, "ca.crt"), f"{origin}: verifies the data manager with a CA"
        assert client_secret != server["tls_cert"][0], f"{origin}: a client certificate, not the data manager's"
        assert files["auth_token_file"] == server["auth_token_file"], f"{origin}: the data manager's token"


def documented_secrets() -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, Secret) -> {key: file} from the `kubectl create secret generic` commands in docs/deploy.md."""
    secrets: dict[tuple[str, str], dict[str, str]] = {}
    for block in re.findall(r"```sh\n(.*?)```", DEPLOY_DOC.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] != ["kubectl"] or "secret" not in words:
                continue
            namespace, name, files = "default", "", {}
            for flag, value in itertools.pairwise(words):
                if flag in ("-n", "--namespace"):
                    namespace = value
                elif flag == "generic":
                    name = value
            for word in words:
                if word.startswith("--from-file="):
                    key, _, file = word.removeprefix("--from-file=").partition("=")
                    files[key] = file
            assert words[words.index("secret") - 1 : words.index("secret") + 2] == ["create", "secret", "generic"]
            secrets[(namespace, name)] = files
    return secrets


def test_the_deploy_doc_creates_the_secrets_the_overlays_mount(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = documented_secrets()
    _, server = secure_server(monkeypatch, capsys)
    used = {(NAMESPACE, secret, key) for secret, key in server.values()}
    for origin, files in secure_clients(monkeypatch, capsys).items():
        in_silod = origin.startswith(f"{SECURE.relative_to(K8S)}: ")
        (job_namespace,) = {ns for ns, _ in secrets if ns != NAMESPACE}
        used |= {(NAMESPACE if in_silod else job_namespace, secret, key) for secret, key in files.values()}
    created = {(ns, name, key) for (ns, name), files in secrets.items() for key in files}
    assert used == created, "docs/deploy.md creates exactly the Secrets and keys the overlays mount"


def test_the_deploy_docs_certificates_and_token_work_with_the_overlays_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The openssl recipe of docs/deploy.md, its files put in the Secrets its kubectl commands create, and those
    mounted where the secure overlay says: a data manager with the overlay's settings accepts a node agent's
    mutating call, and its certificate names the Service the agents dial."""
    if shutil.which("openssl") is None:
        missing_dependency("openssl is not installed")
    (recipe,) = [b for b in re.findall(r"```sh\n(.*?)```", DEPLOY_DOC.read_text(), re.S) if "openssl req" in b]
    made = subprocess.run(["bash", "-c", recipe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    secrets = {name: files for (_, name), files in documented_secrets().items()}

    def mounted(secret_and_key: tuple[str, str]) -> Path:
        secret, key = secret_and_key
        return tmp_path / secrets[secret][key]

    _, server = secure_server(monkeypatch, capsys)
    certificate = x509.load_pem_x509_certificate(mounted(server["tls_cert"]).read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {SERVICE_DNS, "localhost"} <= set(names.get_values_for_type(x509.DNSName))

    (node,) = [files for origin, files in secure_clients(monkeypatch, capsys).items() if origin.endswith("silod node")]
    config = ServerConfig(  # the overlay's settings, on any free port
        "127.0.0.1:0",
        tmp_path / "state",
        tls_cert=mounted(server["tls_cert"]),
        tls_key=mounted(server["tls_key"]),
        tls_ca=mounted(server["tls_ca"]),
        auth_token_file=mounted(server["auth_token_file"]),
    )
    with EmbeddedDataManager(config) as datamgr:
        port = host_port(datamgr.address)[1]
        client = DataManagerClient(
            f"localhost:{port}",
            tls_ca=mounted(node["tls_ca"]),
            tls_cert=mounted(node["tls_cert"]),
            tls_key=mounted(node["tls_key"]),
            token=read_token(mounted(node["auth_token_file"])),
        )
        with client:
            client.register_node("node-a", "node-a", 2**30)
            nodes = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
            assert [n.node_id for n in nodes] == ["node-a"]
