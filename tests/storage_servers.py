"""Real storage servers for tests, and dataset targets on them.

`azurite` and `s3_server` (moto) are session fixtures, each a subprocess on a free loopback port that
is stopped at session end whatever happens. `dataset_target` gives every test a fresh dataset location
on each backend (file, s3, az); `dataset_target_factory` gives one for a backend chosen by the test.
A missing server is a skip on a developer machine and a failure in CI (`CI=true`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

import boto3
import pytest
from azure.storage.blob import BlobServiceClient
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REPO_ROOT = Path(__file__).resolve().parent.parent
BACKEND_NAMES = ("file", "s3", "az")
DATASET_PREFIX = "data/train"
READY_TIMEOUT_S = 30.0

# Azurite's fixed development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass(frozen=True)
class AzuriteServer:
    account_name: str
    account_key: str
    account_url: str
    connection_string: str

    def backend_options(self) -> dict[str, str]:
        """What `open_backend` needs to reach this server for an az:// URI."""
        return {"account_url": self.account_url, "account_key": self.account_key}


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str

    def backend_options(self) -> dict[str, str]:
        """What `open_backend` needs to reach this server for an s3:// URI."""
        return {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "path_style": "true",
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
        }


class DatasetTarget(Protocol):
    """A fresh, empty dataset location: `uri` and `options` for `open_backend`, and ways to fill it.

    `put` and `make_dir` take keys relative to the dataset and are safe to call from several threads.
    """

    @property
    def uri(self) -> str: ...

    @property
    def options(self) -> dict[str, str]: ...

    def put(self, key: str, data: bytes) -> None: ...

    def make_dir(self, key: str) -> None:
        """Create an explicit empty folder: a directory, or a zero-byte object named `key + "/"`."""


DatasetTargetFactory = Callable[[str], DatasetTarget]


@dataclass(frozen=True)
class LocalTarget:
    uri: str
    options: dict[str, str]
    root: Path

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def make_dir(self, key: str) -> None:
        (self.root / key).mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class ObjectStoreTarget:
    """A prefix in a bucket or container; `upload(name, data)` writes one object by its full name."""

    uri: str
    options: dict[str, str]
    upload: Callable[[str, bytes], object]

    def put(self, key: str, data: bytes) -> None:
        self.upload(f"{DATASET_PREFIX}/{key}", data)

    def make_dir(self, key: str) -> None:
        self.put(key + "/", b"")


def free_port() -> int:
    """A loopback TCP port nothing listens on (until someone binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@functools.cache
def s3_client(server: S3Server) -> S3Client:
    """An admin client for `server`, for test setup (shared; boto3 clients are thread-safe)."""
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        aws_access_key_id=server.access_key_id,
        aws_secret_access_key=server.secret_access_key,
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
    )


@functools.cache
def azure_client(server: AzuriteServer) -> BlobServiceClient:
    """An admin client for `server`, for test setup (shared; azure clients are thread-safe)."""
    return BlobServiceClient.from_connection_string(server.connection_string, retry_total=0)


_Server = TypeVar("_Server", AzuriteServer, S3Server)


class ServerNotReady(RuntimeError):
    """A storage server exited or did not answer in time; the message carries its output."""


@contextlib.contextmanager
def running_azurite(workdir: Path) -> Iterator[AzuriteServer]:
    """Azurite's blob service on a free loopback port with its data in `workdir`, until the block exits."""
    script = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
    if not script.exists() or shutil.which("node") is None:
        raise FileNotFoundError("Azurite is not installed (needs node and `npm ci`; `make setup` does both)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    server = AzuriteServer(
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        account_url=endpoint,
        connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
        ),
    )
    argv = [str(script), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(workdir)]
    # --disableTelemetry: Azurite otherwise phones home, and tests may only contact loopback.
    argv += ["--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"]
    with _running("Azurite", argv, workdir, ready=lambda: azure_client(server).get_service_properties()):
        yield server


@contextlib.contextmanager
def running_s3_server(workdir: Path) -> Iterator[S3Server]:
    """`moto_server` on a free loopback port, logging each request to workdir/server.log, until the block exits."""
    executable = Path(sys.executable).parent / "moto_server"
    if not executable.exists():
        raise FileNotFoundError(f"moto_server is not installed next to {sys.executable} (pip install 'moto[server]')")
    port = free_port()
    # moto accepts any credentials; a unique secret lets tests check it never leaks into messages.
    server = S3Server(
        endpoint_url=f"http://127.0.0.1:{port}",
        region="us-east-1",
        access_key_id="silod-test",
        secret_access_key=f"silod-secret-{secrets.token_hex(8)}",
    )
    argv = [str(executable), "-H", "127.0.0.1", "-p", str(port)]
    with _running("moto_server", argv, workdir, ready=lambda: s3_client(server).list_buckets()):
        yield server


def _session_server(
    starter: Callable[[Path], contextlib.AbstractContextManager[_Server]], workdir: Path
) -> Iterator[_Server]:
    """A server for the whole test session: a missing one fails in CI and skips elsewhere."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(starter(workdir))
        except FileNotFoundError as exc:
            _missing_dependency(str(exc))
        except ServerNotReady as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    yield from _session_server(running_azurite, tmp_path_factory.mktemp("azurite"))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from _session_server(running_s3_server, tmp_path_factory.mktemp("moto"))


@pytest.fixture
def dataset_target_factory(request: pytest.FixtureRequest, tmp_path: Path) -> DatasetTargetFactory:
    """`make(backend)` -> a fresh dataset target on "file", "s3" or "az"; servers start on first use."""

    def make(backend: str) -> DatasetTarget:
        name = f"silod-{uuid.uuid4().hex[:16]}"
        if backend == "file":
            root = tmp_path / name
            root.mkdir()
            return LocalTarget(f"file://{root}", {}, root)
        if backend == "s3":
            s3: S3Server = request.getfixturevalue("s3_server")
            client = s3_client(s3)
            client.create_bucket(Bucket=name)
            return ObjectStoreTarget(
                f"s3://{name}/{DATASET_PREFIX}",
                s3.backend_options(),
                lambda key, data: client.put_object(Bucket=name, Key=key, Body=data),
            )
        if backend == "az":
            az: AzuriteServer = request.getfixturevalue("azurite")
            container = azure_client(az).create_container(name)
            return ObjectStoreTarget(
                f"az://{az.account_name}/{name}/{DATASET_PREFIX}",
                az.backend_options(),
                lambda key, data: container.upload_blob(key, data, overwrite=True),
            )
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKEND_NAMES}")

    return make


@pytest.fixture(params=BACKEND_NAMES, ids=BACKEND_NAMES)
def dataset_target(request: pytest.FixtureRequest, dataset_target_factory: DatasetTargetFactory) -> DatasetTarget:
    """A fresh dataset location on each backend in turn."""
    backend: str = request.param
    return dataset_target_factory(backend)


def _missing_dependency(reason: str) -> NoReturn:
    """A missing server fails the test in CI, where it must be installed, and skips it elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must provide it", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def _running(name: str, argv: list[str], workdir: Path, ready: Callable[[], object]) -> Iterator[None]:
    """Run `argv` in `workdir` (output in workdir/server.log) until the block exits; wait until `ready()`
    stops raising, raising `ServerNotReady` with the server's output if it exits or takes too long."""
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    try:
        _wait_ready(name, process, log_path, ready)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(name: str, process: subprocess.Popen[bytes], log_path: Path, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            output = log_path.read_text(errors="replace")
            raise ServerNotReady(
                f"{name} exited with status {process.returncode} before it was ready; output:\n{output}"
            )
        try:
            ready()
            return
        except Exception as exc:
            last_error = exc
        if time.monotonic() > deadline:
            output = log_path.read_text(errors="replace")
            raise ServerNotReady(f"{name} not ready after {READY_TIMEOUT_S:.0f} s ({last_error!r}); output:\n{output}")
        time.sleep(0.1)  # the bounded readiness poll: the one sleep allowed in tests


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if pytest dies without running finalizers (Linux prctl)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
