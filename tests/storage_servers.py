"""Real storage servers for tests, and dataset targets on them.

`azurite` and `s3_server` (moto) are session fixtures, each a subprocess on a free loopback port that
is stopped at session end whatever happens. `dataset_target` gives every test a fresh dataset location
on each backend (file, s3, az); `dataset_target_factory` gives one for a backend chosen by the test.
A missing server is a skip on a developer machine and a failure in CI (`CI=true`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

import pytest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from datamgr.devservers import (
    AzuriteServer,
    S3Server,
    ServerNotReady,
    azure_client,
    free_port,
    running_azurite,
    running_s3_server,
    s3_client,
)
from silodlib.backends import parse_dataset_uri

__all__ = [
    "AzuriteServer", "S3Server", "container_sas", "free_port", "running_azurite", "running_s3_server", "s3_client",
]  # fmt: skip

BACKEND_NAMES = ("file", "s3", "az")
DATASET_PREFIX = "data/train"


class DatasetTarget(Protocol):
    """A fresh, empty dataset location: `uri` and `options` for `open_backend`, and ways to fill it.

    `put` and `make_dir` take keys relative to the dataset and are safe to call from several threads.
    """

    @property
    def uri(self) -> str: ...

    @property
    def options(self) -> dict[str, str]: ...

    def put(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None:
        """Remove the object `key`, as someone cleaning up the bucket under a running job would."""

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

    def delete(self, key: str) -> None:
        (self.root / key).unlink()

    def make_dir(self, key: str) -> None:
        (self.root / key).mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class ObjectStoreTarget:
    """A prefix in a bucket or container; `upload(name, data)` writes one object by its full name and
    `remove(name)` deletes one."""

    uri: str
    options: dict[str, str]
    upload: Callable[[str, bytes], object]
    remove: Callable[[str], object]

    def put(self, key: str, data: bytes) -> None:
        self.upload(f"{DATASET_PREFIX}/{key}", data)

    def delete(self, key: str) -> None:
        self.remove(f"{DATASET_PREFIX}/{key}")

    def make_dir(self, key: str) -> None:
        self.put(key + "/", b"")


def rewrite_same_size(target: DatasetTarget, key: str, data: bytes) -> None:
    """Replace the object with other bytes of the same size, so only its version tells the change."""
    target.put(key, data)
    if isinstance(target, LocalTarget):  # its version is size + mtime: move the mtime past the clock's tick
        path = target.root / key
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


_Server = TypeVar("_Server", AzuriteServer, S3Server)


def _session_server(
    starter: Callable[[Path], contextlib.AbstractContextManager[_Server]], workdir: Path
) -> Iterator[_Server]:
    """A server for the whole test session: a missing one fails in CI and skips elsewhere."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(starter(workdir))
        except FileNotFoundError as exc:
            missing_dependency(str(exc))
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
                lambda key: client.delete_object(Bucket=name, Key=key),
            )
        if backend == "az":
            az: AzuriteServer = request.getfixturevalue("azurite")
            container = azure_client(az).create_container(name)
            return ObjectStoreTarget(
                f"az://{az.account_name}/{name}/{DATASET_PREFIX}",
                az.backend_options(),
                lambda key, data: container.upload_blob(key, data, overwrite=True),
                container.delete_blob,
            )
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKEND_NAMES}")

    return make


@pytest.fixture(params=BACKEND_NAMES, ids=BACKEND_NAMES)
def dataset_target(request: pytest.FixtureRequest, dataset_target_factory: DatasetTargetFactory) -> DatasetTarget:
    """A fresh dataset location on each backend in turn."""
    backend: str = request.param
    return dataset_target_factory(backend)


def missing_dependency(reason: str) -> NoReturn:
    """Something a test needs is missing (a server, root, a library): a failure in CI (`CI=true`), where it must
    be there, a skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must provide it", pytrace=False)
    pytest.skip(reason)


def container_sas(
    azurite: AzuriteServer,
    uri: str,
    permission: ContainerSasPermissions | None = None,
    expiry: datetime | None = None,
) -> str:
    """A SAS token for the container of the dataset at `uri` on `azurite`: read and list, good for an hour, unless
    told otherwise."""
    return generate_container_sas(
        azurite.account_name,
        parse_dataset_uri(uri).location[1],
        account_key=azurite.account_key,
        permission=permission or ContainerSasPermissions(read=True, list=True),
        expiry=expiry or datetime.now(UTC) + timedelta(hours=1),
    )
