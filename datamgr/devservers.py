"""Local storage servers on loopback: Azurite (Azure Blob) and moto (S3), each as its own process.

Used by the demo (`silod demo`, which `make run` runs), the test fixtures and the benchmarks. Each server
gets a free loopback port and a data directory, is waited for with a real SDK call, and is stopped when its
context exits. Azurite comes from the project's `node_modules` (`npm ci`), moto from the `moto[server]`
package next to this Python.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from azure.storage.blob import BlobServiceClient
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REPO_ROOT = Path(__file__).resolve().parent.parent
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


class ServerNotReady(RuntimeError):
    """A storage server exited or did not answer in time; the message carries its output."""


@contextlib.contextmanager
def running_azurite(workdir: Path) -> Iterator[AzuriteServer]:
    """Azurite's blob service on a free loopback port with its data in `workdir`, until the block exits."""
    port = free_port()
    server, argv = azurite_server(port), azurite_argv(workdir, port)
    with running_server("Azurite", argv, workdir, ready=lambda: azure_client(server).get_service_properties()):
        yield server


def azurite_server(port: int) -> AzuriteServer:
    """How to reach an Azurite blob service listening on loopback `port` with the development account."""
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    return AzuriteServer(
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        account_url=endpoint,
        connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
        ),
    )


def azurite_argv(workdir: Path, port: int) -> list[str]:
    """The command that runs Azurite's blob service on loopback `port` with its data in `workdir`: a server
    started again with the same arguments (after a crash, say) finds the data where it left it."""
    script = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
    if not script.exists() or shutil.which("node") is None:
        raise FileNotFoundError("Azurite is not installed (needs node and `npm ci`; `make setup` does both)")
    argv = [str(script), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(workdir)]
    # --disableTelemetry: Azurite otherwise phones home, and tests may only contact loopback.
    return [*argv, "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"]


@contextlib.contextmanager
def running_s3_server(workdir: Path, cpus: set[int] | None = None) -> Iterator[S3Server]:
    """`moto_server` on a free loopback port, logging each request to workdir/server.log, until the block exits.

    `cpus` confines the server to those CPUs (a benchmark may give it cores of its own, as a real object store
    is another machine); by default it runs wherever the scheduler puts it."""
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
    with running_server("moto_server", argv, workdir, ready=lambda: s3_client(server).list_buckets(), cpus=cpus):
        yield server


@contextlib.contextmanager
def running_server(
    name: str, argv: list[str], workdir: Path, ready: Callable[[], object], cpus: set[int] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` in `workdir` (output in workdir/server.log), on `cpus` if given, until the block exits, and
    yield its process; wait until `ready()` stops raising, raising `ServerNotReady` with the server's output if
    it exits or takes too long. The process is ended (SIGTERM, SIGKILL after 10 s) as the block exits."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            dying_with_parent(argv, cpus),
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(name, process, log_path, ready)
        yield process
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


def dying_with_parent(argv: list[str], cpus: set[int] | None = None) -> list[str]:
    """`argv` prefixed, on Linux, so that the server gets SIGTERM if this process dies without running its
    finalizers (util-linux's `setpriv --pdeathsig`), and keeps to `cpus` (`taskset`; every thread it starts
    inherits that).

    Not a `preexec_fn`: that runs Python in the forked child before exec, and a child forked while gRPC's
    threads are busy (an in-process data manager's) can then abort before exec, as gRPC's fork handlers restart
    its poller there ("epoll_wait error: Bad file descriptor", grpc/grpc#43055). Without one, `subprocess` uses
    vfork, which runs no fork handlers at all."""
    if sys.platform != "linux":
        return argv
    pinned = ["taskset", "--cpu-list", ",".join(str(cpu) for cpu in sorted(cpus))] if cpus else []
    return ["setpriv", "--pdeathsig", "TERM", *pinned, *argv]
