"""Conformance suite for storage backends: the same promises checked on file://, S3 (moto) and Azurite."""

from __future__ import annotations

import base64
import contextlib
import errno
import http.server
import logging
import os
import random
import re
import threading
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError, ServiceRequestError
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from datamgr.entities import FailedPrecondition, InvalidArgument
from datamgr.listing import freeze_manifest
from silodlib.backends import (
    AccessDenied,
    Backend,
    BackendError,
    BackendUnavailable,
    ChangedObject,
    InvalidBackendOption,
    NoSuchObject,
    ObjectInfo,
    open_backend,
    parse_dataset_uri,
)
from silodlib.backends.azure import AzureBackend, sas_expiry
from silodlib.backends.s3 import _Route
from silodlib.manifest import DEFAULT_CHUNK_SIZE, EmptyListing, freeze_listing
from tests.datasets import generate_dataset, upload_dataset
from tests.storage_servers import (
    AzuriteServer,
    DatasetTarget,
    DatasetTargetFactory,
    LocalTarget,
    container_sas,
    free_port,
    rewrite_same_size,
)

# A secret that must never show up in an exception message or a log line.
SECRET_KEY = base64.b64encode(b"silod-never-print-this-secret-" + os.urandom(16)).decode()
# One that can stand in a URL's userinfo as it is; fixed, as it names parametrized tests (pytest-xdist's workers
# must collect the same ones).
URL_PASSWORD = "Pr0xyPassw0rd-n3ver-pr1nted"


@contextlib.contextmanager
def opened(target: DatasetTarget, **overrides: str) -> Iterator[Backend]:
    backend = open_backend(target.uri, {**target.options, **overrides})
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def backend(dataset_target: DatasetTarget) -> Iterator[Backend]:
    with opened(dataset_target) as opened_backend:
        yield opened_backend


def listing(backend: Backend) -> dict[str, ObjectInfo]:
    return {info.key: info for info in backend.list()}


# --- listing -----------------------------------------------------------------------------------------


def test_list_and_read_round_trip_a_generated_dataset(dataset_target: DatasetTarget, backend: Backend) -> None:
    dataset = generate_dataset(seed=1, large_files=1)
    upload_dataset(dataset_target, dataset)

    first = listing(backend)

    files = {key: info.size for key, info in first.items() if not info.is_dir}
    assert files == {key: len(data) for key, data in dataset.files.items()}
    assert sorted(key for key, info in first.items() if info.is_dir) == sorted(dataset.empty_dirs)
    for key, info in first.items():
        assert info.key == key
        assert not key.startswith("/") and not key.endswith("/")
        assert info.version
        assert datetime(2020, 1, 1, tzinfo=UTC).timestamp() * 1e9 < info.mtime_ns < time.time_ns() + 86_400e9
    assert {key: info.version for key, info in listing(backend).items()} == {
        key: info.version for key, info in first.items()
    }
    for key, data in dataset.files.items():
        assert backend.read(key, 0, len(data) + 1) == data, key


@pytest.mark.parametrize("backend_name", ["s3", "az"])
def test_list_follows_pagination(
    dataset_target_factory: DatasetTargetFactory, backend_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # S3 servers page at 1,000 keys; Azure at 5,000, so make Azurite page as well.
    monkeypatch.setattr(AzureBackend, "list_page_size", 400)
    target = dataset_target_factory(backend_name)
    keys = [f"shard_{i % 7}/item_{i:04d}" for i in range(1_100)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        for future in [pool.submit(target.put, key, key.encode()) for key in keys]:
            future.result()

    with opened(target) as backend:
        found = listing(backend)

    assert {key: info.size for key, info in found.items()} == {key: len(key.encode()) for key in keys}


@pytest.mark.expected_warnings
@pytest.mark.parametrize("backend_name", ["s3", "az"])
def test_names_that_are_not_paths_are_listed_as_stored_and_left_out_of_the_manifest_with_one_warning(
    dataset_target_factory: DatasetTargetFactory, backend_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # '//' under the prefix lists as a key with a leading '/', the usual upload mistake ('/train/img0.jpg').
    target = dataset_target_factory(backend_name)
    target.put("good.bin", b"1")
    odd = ["bad//name.bin", "/train/img0.jpg", "/train/img1.jpg", "/train/img2.jpg", "/train/img3.jpg"]
    for key in odd:
        target.put(key, b"2")

    with opened(target) as backend:
        assert sorted(listing(backend)) == sorted(["good.bin", *odd])
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # listing warns of no key
        manifest = freeze_listing(target.uri, backend.list())

    assert manifest.paths == ["good.bin"]
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.getMessage() == (
        f"{target.uri}: 5 of the 6 objects listed are left out of the dataset, since no path below a mount point "
        "can name them: keys with an empty, '.' or '..' component, such as '/train/img0.jpg', '/train/img1.jpg', "
        "'/train/img2.jpg'"
    )


def test_local_names_that_are_not_utf8_are_left_out_of_the_manifest_and_counted(
    dataset_target_factory: DatasetTargetFactory,
) -> None:
    target = dataset_target_factory("file")
    assert isinstance(target, LocalTarget)
    os.mkdir(os.fsencode(target.root) + b"/caf\xe9")
    (Path(os.fsdecode(os.fsencode(target.root) + b"/caf\xe9")) / "x.jpg").write_bytes(b"1")
    with opened(target) as backend, pytest.raises(EmptyListing) as refused:
        freeze_listing(target.uri, backend.list())
    assert str(refused.value) == (
        f"{target.uri} lists 1 object, none of which can be a file below a mount point (1 skipped: name that is "
        "not valid UTF-8, such as 'caf\\udce9/x.jpg'); rename the objects to relative paths, or check the bucket, "
        "container, prefix or path"
    )


@pytest.mark.parametrize("backend_name", ["s3", "az"])
def test_registering_keys_that_all_have_a_leading_slash_is_refused_saying_how_many_were_listed(
    dataset_target_factory: DatasetTargetFactory, backend_name: str
) -> None:
    target = dataset_target_factory(backend_name)
    for i in range(3):
        target.put(f"/train/img{i}.jpg", b"x")  # 'data/train//train/img0.jpg': under the prefix, a leading '/'
    with pytest.raises(FailedPrecondition) as refused:
        freeze_manifest(target.uri, target.options, DEFAULT_CHUNK_SIZE)
    assert str(refused.value) == (
        f"uri {target.uri} lists 3 objects, none of which can be a file below a mount point (3 skipped: keys with "
        "an empty, '.' or '..' component, such as '/train/img0.jpg', '/train/img1.jpg', '/train/img2.jpg'); "
        "rename the objects to relative paths, or check the bucket, container, prefix or path"
    )


@pytest.mark.parametrize("backend_name", ["s3", "az"])
def test_registering_a_prefix_with_only_folder_markers_is_refused_naming_them(
    dataset_target_factory: DatasetTargetFactory, backend_name: str
) -> None:
    target = dataset_target_factory(backend_name)
    target.make_dir("a")
    target.make_dir("b/c")
    with pytest.raises(FailedPrecondition) as refused:
        freeze_manifest(target.uri, target.options, DEFAULT_CHUNK_SIZE)
    assert str(refused.value) == (
        f"uri {target.uri} lists 2 objects, none of which can be a file below a mount point (2 folder markers, such "
        "as 'a/'); check the bucket, container, prefix or path"
    )


# --- reading -----------------------------------------------------------------------------------------


def test_read_byte_ranges(dataset_target: DatasetTarget, backend: Backend) -> None:
    data = random.Random(3).randbytes(10_007)
    dataset_target.put("dir/blob.bin", data)
    dataset_target.put("empty.bin", b"")

    def read(offset: int, length: int) -> bytes:
        return backend.read("dir/blob.bin", offset, length)

    assert read(0, len(data)) == data
    for offset, length in [(0, 1), (1, 4095), (4097, 3001), (10_000, 7), (123, 0)]:
        assert read(offset, length) == data[offset : offset + length], (offset, length)
    assert read(9_990, 100) == data[9_990:]
    assert read(len(data), 10) == b""
    assert read(len(data) + 5, 10) == b""
    assert backend.read("empty.bin", 0, 10) == b""
    with pytest.raises(ValueError, match="offset and length"):
        read(-1, 10)


def test_a_read_given_the_old_version_of_a_changed_object_fails_instead_of_returning_new_bytes(
    dataset_target: DatasetTarget, backend: Backend
) -> None:
    dataset_target.put("shard.bin", b"a" * 5000)
    registered = backend.stat("shard.bin").version
    assert backend.read("shard.bin", 100, 10, registered) == b"a" * 10

    rewrite_same_size(dataset_target, "shard.bin", b"b" * 5000)
    current = backend.stat("shard.bin").version
    assert current != registered
    uri = re.escape(f"{dataset_target.uri}/shard.bin")
    with pytest.raises(ChangedObject, match=f"{uri}: changed after the dataset was registered") as changed:
        backend.read("shard.bin", 100, 10, registered)
    assert not backend.is_transient(changed.value)
    assert backend.read("shard.bin", 100, 10, current) == b"b" * 10
    assert backend.read("shard.bin", 100, 10) == b"b" * 10  # without a version nothing is checked


def test_stat_agrees_with_list(dataset_target: DatasetTarget, backend: Backend) -> None:
    dataset_target.put("a/one.bin", b"1" * 100)
    dataset_target.put("a/b/two words ü.bin", b"")
    dataset_target.make_dir("a/folder")

    for key, listed in listing(backend).items():
        if listed.is_dir:
            with pytest.raises(NoSuchObject, match=re.escape(key)):
                backend.stat(key)
            continue
        stat = backend.stat(key)
        assert (stat.key, stat.size, stat.version, stat.is_dir) == (key, listed.size, listed.version, False)
        # Listings and HEAD report modification times at different precisions.
        assert abs(stat.mtime_ns - listed.mtime_ns) < 1_000_000_000


def test_missing_object_is_named(dataset_target: DatasetTarget, backend: Backend) -> None:
    dataset_target.put("present.bin", b"x")
    for operation in (lambda: backend.stat("no/such key.bin"), lambda: backend.read("no/such key.bin", 0, 1)):
        with pytest.raises(NoSuchObject, match=re.escape(f"{dataset_target.uri}/no/such key.bin")):
            operation()


@pytest.mark.parametrize("key", ["", "/abs", "../escape", "a//b", "a/./b", "a/../b", "dir/"])
def test_keys_outside_the_dataset_are_refused(dataset_target: DatasetTarget, backend: Backend, key: str) -> None:
    with pytest.raises(NoSuchObject, match="not a valid key"):
        backend.stat(key)
    with pytest.raises(NoSuchObject, match="not a valid key"):
        backend.read(key, 0, 1)


def test_local_backend_ignores_symlinks(dataset_target_factory: DatasetTargetFactory, tmp_path: Path) -> None:
    target = dataset_target_factory("file")
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_bytes(b"outside")
    (outside / "dir" / "f.bin").write_bytes(b"outside")
    target.put("real.bin", b"inside")
    root = Path(parse_dataset_uri(target.uri).prefix)
    (root / "file-link").symlink_to(outside / "secret.txt")
    (root / "dir-link").symlink_to(outside / "dir")
    (root / "inner-link").symlink_to(root / "real.bin")

    with opened(target) as backend:
        assert list(listing(backend)) == ["real.bin"]
        for key in ("file-link", "dir-link/f.bin", "inner-link"):
            with pytest.raises(NoSuchObject, match=re.escape(key)):
                backend.read(key, 0, 10)
            with pytest.raises(NoSuchObject, match=re.escape(key)):
                backend.stat(key)


# --- configuration and failures ----------------------------------------------------------------------


def test_unknown_option_is_rejected(dataset_target: DatasetTarget) -> None:
    with pytest.raises(InvalidBackendOption, match=r"'bogus_option'.*accepted") as raised:
        open_backend(dataset_target.uri, {**dataset_target.options, "bogus_option": "1"})
    for name in dataset_target.options:
        assert name in str(raised.value)


@pytest.mark.parametrize(
    ("uri", "options", "fragment"),
    [
        ("s3://bucket", {"path_style": "maybe"}, "'path_style' must be 'true' or 'false'"),
        ("s3://bucket", {"endpoint_url": "ftp://host"}, "'endpoint_url' must be an http"),
        ("s3://bucket", {"region": " "}, "'region' must not be empty"),
        ("s3://bucket", {"secret_access_key": SECRET_KEY}, "go together"),
        ("s3://bucket", {"profile": "silod-no-such-profile"}, "'profile'"),
        ("az://account/container", {"account_url": "not a url"}, "'account_url' must be an http"),
        ("az://account/container", {"account_url": "http://127.0.0.1:1/account"}, "'account_url' must be https://"),
        (
            "az://account/container",
            {"account_key": "not base64! " + SECRET_KEY},
            "'account_key' must be base64",
        ),
        (
            "az://account/container",
            {"account_key": SECRET_KEY, "sas_token": SECRET_KEY},
            "exclude each other",
        ),
        ("az://account/container", {"connection_string": "junk;" + SECRET_KEY}, "'connection_string'"),
        ("file:///tmp", {"path_style": "true"}, "accepted: none"),
    ],
)
def test_bad_option_values_are_rejected(uri: str, options: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidBackendOption, match=re.escape(fragment)) as raised:
        open_backend(uri, options)
    assert SECRET_KEY not in str(raised.value)


@pytest.mark.parametrize(
    ("uri", "name", "value"),
    [
        ("s3://bucket", "endpoint_url", f"http://proxyuser:{URL_PASSWORD}@127.0.0.1:9000"),
        ("s3://bucket", "endpoint_url", f"https://{URL_PASSWORD}@s3.example.com"),
        ("s3://bucket", "endpoint_url", f"http://proxyuser:{URL_PASSWORD}@[::1"),  # not a URL: still not echoed
        ("az://account/container", "account_url", f"https://account:{URL_PASSWORD}@account.blob.core.windows.net"),
        ("az://account/container", "account_url", f"http://u:{URL_PASSWORD}@127.0.0.1:10000/account"),
    ],
)
def test_a_url_option_with_a_user_name_or_password_is_refused_without_echoing_it(
    uri: str, name: str, value: str
) -> None:
    """URL options are not secret: queries show them and logs print them, so credentials in one are refused."""
    with pytest.raises(InvalidBackendOption) as raised:
        open_backend(uri, {name: value})
    message = str(raised.value)
    assert f"option {name!r}" in message and URL_PASSWORD not in message, message
    if "[::1" not in value:
        assert "must not hold a user name or password" in message and "their own options" in message, message


@pytest.mark.parametrize(
    ("uri", "name", "suffix", "fragment"),
    [
        ("s3://bucket", "session_token", "\n", "ends with a newline (a file's trailing newline?)"),
        ("s3://bucket", "secret_access_key", "\r\n", "ends with a newline"),
        ("s3://bucket", "endpoint_url", "\n", "ends with a newline"),
        ("s3://bucket", "region", "\t", "holds a control character (U+0009)"),
        ("az://account/container", "sas_token", "\x00tail", "holds a control character (U+0000)"),
        ("az://account/container", "account_key", "\x7f", "holds a control character (U+007F)"),
        ("az://account/container", "connection_string", "\x85", "holds a control character (U+0085)"),
        ("az://account/container", "account_key", "\n\x1b", "holds a control character (U+000A)"),
    ],
)
def test_an_option_value_with_a_control_character_is_refused_naming_the_option_only(
    uri: str, name: str, suffix: str, fragment: str
) -> None:
    """An SDK refusing a header value prints the value's repr (`b'...\\n'`), which the log scrubber did not know:
    such values are refused before any SDK sees them."""
    value = "http://127.0.0.1:9000" if name == "endpoint_url" else SECRET_KEY
    options = {"access_key_id": "AKID", "secret_access_key": SECRET_KEY} if name == "session_token" else {}
    with pytest.raises(InvalidBackendOption, match=re.escape(fragment)) as raised:
        open_backend(uri, {**options, name: value + suffix})
    message = str(raised.value)
    assert f"option {name!r}" in message and SECRET_KEY not in message, message


@pytest.mark.parametrize("backend_name", ["s3", "az"])
def test_a_secret_with_a_files_trailing_newline_is_refused_at_registration_and_never_shown(
    dataset_target_factory: DatasetTargetFactory,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    backend_name: str,
) -> None:
    """A Kubernetes Secret made from a file ends with a newline; with it, botocore failed every request with
    "Invalid header value b'<token>\\n'", retried as transient and shown in full; now it is INVALID_ARGUMENT."""
    caplog.set_level(logging.DEBUG)
    target = dataset_target_factory(backend_name)
    target.put("x.bin", b"hello")
    if backend_name == "s3":
        name, secret = "session_token", f"FwoGZXIvYXdz{os.urandom(16).hex()}"
        options = {**target.options, name: secret + "\n"}
    else:
        azurite: AzuriteServer = request.getfixturevalue("azurite")
        name, secret = "sas_token", container_sas(azurite, target.uri)
        options = {"account_url": azurite.account_url, name: secret + "\n"}
    with pytest.raises(InvalidArgument) as raised:
        freeze_manifest(target.uri, options, DEFAULT_CHUNK_SIZE)
    message = str(raised.value)
    assert f"option {name!r} ends with a newline" in message, message
    assert secret not in message and secret not in caplog.text


def test_missing_bucket_container_or_directory_is_named(dataset_target: DatasetTarget) -> None:
    missing_uri = re.sub(r"silod-([0-9a-f]+)", r"missing-\1", dataset_target.uri)
    missing_location = re.search(r"missing-[0-9a-f]+", missing_uri)
    assert missing_location is not None
    with (
        pytest.raises(NoSuchObject, match=missing_location[0]),
        contextlib.closing(open_backend(missing_uri, dataset_target.options)) as backend,
    ):
        list(backend.list())


def test_wrong_azure_key_is_access_denied(
    dataset_target_factory: DatasetTargetFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Only Azurite checks credentials; moto accepts any S3 keys, so S3 has no counterpart here.
    caplog.set_level(logging.DEBUG)
    target = dataset_target_factory("az")
    target.put("x.bin", b"x")
    with opened(target, account_key=SECRET_KEY) as backend, pytest.raises(AccessDenied) as raised:
        list(backend.list())
    assert target.uri in str(raised.value)
    assert SECRET_KEY not in str(raised.value)
    assert SECRET_KEY not in caplog.text


@pytest.mark.parametrize(
    ("uri", "options"),
    [
        (
            "s3://bucket/data",
            {"access_key_id": "id", "secret_access_key": SECRET_KEY, "session_token": "T" * 40},
        ),
        ("az://account/container/data", {"account_key": SECRET_KEY}),
        ("az://account/container/data", {"sas_token": f"sv=2024-05-04&sr=c&sp=rl&sig={SECRET_KEY}"}),
    ],
    ids=["s3", "az-key", "az-sas"],
)
def test_unreachable_endpoint_is_transient_and_fails_fast(
    uri: str, options: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    endpoint_option = {"endpoint_url": endpoint} if uri.startswith("s3") else {"account_url": f"{endpoint}/account"}
    with contextlib.closing(open_backend(uri, {**options, **endpoint_option})) as backend:
        for operation in (lambda: list(backend.list()), lambda: backend.read("x.bin", 0, 10)):
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match=re.escape(uri)) as raised:
                operation()
            assert time.monotonic() - started < 10
            assert backend.is_transient(raised.value)
            assert SECRET_KEY not in str(raised.value)
    assert SECRET_KEY not in caplog.text


def test_azure_connection_string_and_sas_token_reach_azurite(
    dataset_target_factory: DatasetTargetFactory, azurite: AzuriteServer
) -> None:
    target = dataset_target_factory("az")
    target.put("x.bin", b"hello")
    sas = container_sas(azurite, target.uri)
    for options in (
        {"connection_string": azurite.connection_string},
        {"account_url": azurite.account_url, "sas_token": sas},
    ):
        with contextlib.closing(open_backend(target.uri, options)) as backend:
            assert list(listing(backend)) == ["x.bin"]
            assert backend.read("x.bin", 1, 3) == b"ell"


def test_an_expired_sas_token_is_named_as_the_cause_of_access_denied(
    dataset_target_factory: DatasetTargetFactory, azurite: AzuriteServer
) -> None:
    """An expired SAS, a changed account key and a missing permission were one message, the SDK's first line:
    "Server failed to authenticate the request"; the service's error code and the token's own expiry tell them
    apart."""
    target = dataset_target_factory("az")
    target.put("x.bin", b"hello")
    expiry = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    sas = container_sas(azurite, target.uri, expiry=expiry)
    with (
        contextlib.closing(open_backend(target.uri, {"account_url": azurite.account_url, "sas_token": sas})) as backend,
        pytest.raises(AccessDenied) as refused,
    ):
        backend.read("x.bin", 0, 5)
    message = str(refused.value)
    # The service's error code first (Azurite's AuthorizationFailure; Azure says AuthenticationFailed).
    assert re.match(rf"{re.escape(target.uri)}/x\.bin: access denied \(Auth\w+: HttpResponseError: ", message), message
    assert message.endswith(f"; the sas_token option expired at {expiry:%Y-%m-%d %H:%M:%S} UTC"), message
    assert sas.split("sig=")[1].split("&")[0] not in message


def test_a_sas_tokens_expiry_is_read_from_its_se_field() -> None:
    assert sas_expiry("?sv=2021&se=2026-11-27T10%3A30%3A05Z&sig=x") == datetime(2026, 11, 27, 10, 30, 5, tzinfo=UTC)
    assert sas_expiry("sv=2021&se=2026-11-27T10:30:05Z") == datetime(2026, 11, 27, 10, 30, 5, tzinfo=UTC)
    assert sas_expiry("") is None and sas_expiry("sv=2021&sig=x") is None and sas_expiry("se=tomorrow") is None


class _RefreshingCredentialsFake:
    """Credentials refreshed between two reads of their parts (an instance role's, mid-request): a fake, as no
    server makes that race happen on demand. Only a snapshot taken with `get_frozen_credentials` is whole."""

    def __init__(self) -> None:
        self.snapshots = 0

    def __getattr__(self, name: str) -> str:
        raise AssertionError(f"credentials.{name} read outside a snapshot: it may mix old and new parts")

    def get_frozen_credentials(self) -> ReadOnlyCredentials:
        self.snapshots += 1
        return ReadOnlyCredentials(f"key{self.snapshots}", f"secret{self.snapshots}", None)


def test_a_ranged_get_signs_each_request_with_one_snapshot_of_refreshing_credentials_fake() -> None:
    credentials = _RefreshingCredentialsFake()
    route = _Route("http://127.0.0.1:1/bucket/", cast(Credentials, credentials), "us-east-1", cast(Any, None))
    for expected in ("key1", "key2"):
        request = AWSRequest("GET", "http://127.0.0.1:1/bucket/x", headers={"Range": "bytes=0-1"})
        route.sign(request)
        assert f"Credential={expected}/" in request.headers["Authorization"]


REOPEN_ALLOCATION_LIMIT = 3_000_000  # bytes an S3 backend's open may leave allocated once one was opened before


def test_reopening_an_s3_backend_does_not_parse_the_service_model_again() -> None:
    """A node agent opens a dataset's backend whenever a job on it arrives after the last one left; each open
    parsed S3's service model anew, 12 MB of objects freed only by a full garbage collection."""
    options = {"access_key_id": "id", "secret_access_key": SECRET_KEY, "region": "us-east-1"}
    open_backend("s3://bucket", options).close()  # the first one parses it
    tracemalloc.start()
    try:
        backend = open_backend("s3://bucket", options)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    backend.close()
    assert held < REOPEN_ALLOCATION_LIMIT, f"{held:,} bytes"


def test_is_transient_classifies_raw_sdk_errors(tmp_path: Path) -> None:
    s3 = open_backend("s3://bucket", {"access_key_id": "id", "secret_access_key": SECRET_KEY})
    az = open_backend("az://account/container", {"account_key": SECRET_KEY})
    local = open_backend(f"file://{tmp_path}")

    def client_error(code: str, status: int) -> ClientError:
        response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(response, "GetObject")

    def azure_error(status: int) -> HttpResponseError:
        error = HttpResponseError("failed")
        error.status_code = status
        return error

    cases: list[tuple[Backend, BaseException, bool]] = [
        (s3, client_error("SlowDown", 503), True),
        (s3, client_error("InternalError", 500), True),
        (s3, client_error("NoSuchKey", 404), False),
        (s3, client_error("AccessDenied", 403), False),
        (s3, EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (s3, ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (az, ServiceRequestError("connection reset"), True),
        (az, azure_error(503), True),
        (az, azure_error(429), True),
        (az, ResourceNotFoundError("gone"), False),
        (local, OSError(errno.ESTALE, "stale file handle"), True),
        (local, FileNotFoundError(errno.ENOENT, "gone"), False),
        (local, BackendUnavailable("ours"), True),
        (local, BackendError("ours"), False),
    ]
    for backend, exc, transient in cases:
        assert backend.is_transient(exc) is transient, (backend.scheme, exc)
    for backend in (s3, az, local):
        backend.close()


def test_local_backend_requires_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NoSuchObject, match=re.escape(f"file://{tmp_path}/file: not a directory")):
        open_backend(f"file://{tmp_path}/file")
    with pytest.raises(NoSuchObject, match=re.escape(f"file://{tmp_path}/nowhere")):
        open_backend(f"file://{tmp_path}/nowhere")


def test_s3_without_any_credentials_opens_and_reads_fail_as_access_denied(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    endpoint = f"http://127.0.0.1:{free_port()}"
    with (
        contextlib.closing(open_backend("s3://bucket/x", {"endpoint_url": endpoint, "region": "us-east-1"})) as backend,
        pytest.raises(AccessDenied, match=r"s3://bucket/x/a\.bin: no usable credentials"),
    ):
        backend.read("a.bin", 0, 10)


class _FakeS3Handler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the status, body and Content-Length the test put in `answers` (one per
    request, in order); a Content-Length above the body's length is a connection lost mid-body."""

    answers: ClassVar[list[tuple[int, bytes, int]]] = []

    def do_GET(self) -> None:
        status, body, content_length = self.answers.pop(0)
        self.send_response(status)
        self.send_header("Content-Length", str(content_length))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _fake_s3_backend(answers: list[tuple[int, bytes, int]]) -> Iterator[Backend]:
    """An S3 backend on a fake endpoint that gives `answers` (see `_FakeS3Handler`)."""
    _FakeS3Handler.answers = answers
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeS3Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    options = {
        "endpoint_url": f"http://127.0.0.1:{server.server_port}",
        "region": "us-east-1",
        "path_style": "true",
        "access_key_id": "id",
        "secret_access_key": SECRET_KEY,
    }
    try:
        with contextlib.closing(open_backend("s3://bucket/x", options)) as backend:
            yield backend
    finally:
        server.shutdown()
        thread.join()


def test_fake_s3_endpoint_error_answers_are_classified_by_status_and_code() -> None:
    # A real S3 server does not throttle or fail on demand; this fake answers with S3's error documents.
    def error(code: str) -> bytes:
        return f"<Error><Code>{code}</Code><Message>{code} happened</Message></Error>".encode()

    cases: list[tuple[int, bytes, type[BackendError], str]] = [
        (503, error("SlowDown"), BackendUnavailable, "SlowDown"),
        (500, b"not xml", BackendUnavailable, "HTTP error"),
        (403, error("AccessDenied"), AccessDenied, "AccessDenied"),
        (404, error("NoSuchKey"), NoSuchObject, "NoSuchKey"),
        (400, error("InvalidRequest"), BackendError, "InvalidRequest"),
    ]
    with _fake_s3_backend([(status, body, len(body)) for status, body, _, _ in cases]) as backend:
        for status, _, expected, code in cases:
            with pytest.raises(BackendError, match=rf"s3://bucket/x/a\.bin: .*{code}.*\({status}\)") as raised:
                backend.read("a.bin", 0, 10)
            assert type(raised.value) is expected
            assert backend.is_transient(raised.value) == (status >= 500)
            assert SECRET_KEY not in str(raised.value)


def test_fake_s3_endpoint_losing_the_connection_mid_body_is_a_transient_error() -> None:
    # A real server does not drop a connection on demand; this fake promises 10 bytes and sends 4.
    with _fake_s3_backend([(206, b"0123", 10)]) as backend:
        with pytest.raises(BackendUnavailable, match=r"s3://bucket/x/a\.bin: .*connection lost") as raised:
            backend.read("a.bin", 0, 10)
        assert backend.is_transient(raised.value)
        assert SECRET_KEY not in str(raised.value)


def test_a_secret_too_short_to_scrub_is_not_cut_out_of_a_failures_message() -> None:
    """A secret_access_key of "b" was replaced in every failure's text: the bucket "bkt" read "<redacted>kt" in the
    URL the message gives. Failures are scrubbed as log lines are, which leave values under 8 characters."""
    backend = open_backend(
        parse_dataset_uri("s3://bkt/zz"),
        {"endpoint_url": "http://127.0.0.1:1", "access_key_id": "AKIDSHORTSECRET", "secret_access_key": "b"},
    )
    with pytest.raises(BackendUnavailable) as refused:
        next(iter(backend.list()))
    assert "127.0.0.1:1/bkt" in str(refused.value) and "<redacted>" not in str(refused.value)
