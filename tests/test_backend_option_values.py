"""Option values the SDKs refuse when a client is made (a region botocore's pattern refuses, an endpoint host with an
'_', a profile whose config has such a region, a port that is no port, a malformed connection string) and values of
any length: each is refused as a bad option, naming it, on one short line: `silod mount` exits 2, the data manager
answers INVALID_ARGUMENT and logs no traceback, its start warns of a stored one, and nothing is registered or
changed. A value is shown at most as a short excerpt, a secret one never."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import grpc
import pytest

from datamgr.client import ClientError, DataManagerClient
from datamgr.entities import Dataset
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore
from silodlib.backends import backend_class
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import SILOD, DataManagerProcess, silod_cli
from tests.storage_servers import DatasetTarget, DatasetTargetFactory, free_port

# Secrets that must never show in an output or a log line.
SECRET_KEY = "NotBase64!" + os.urandom(8).hex()
LONG_SECRET = "tok" + os.urandom(8).hex()
AZURE_KEY = base64.b64encode(b"silod-option-values-" + os.urandom(16)).decode()  # a valid account key

REGION_RULE = "must be a region name such as us-east-1"
BAD_HOST = "option 'endpoint_url' has a host botocore refuses, 'a_b': a host must be an IP address or a DNS name"
LONG = 100_000

# (URI, options, what the refusal says): values the SDKs refused when a client was made, with a traceback.
S3_REFUSALS = [
    ({"region": " x"}, f"option 'region' {REGION_RULE}"),
    ({"region": "us east"}, f"option 'region' {REGION_RULE}"),
    ({"endpoint_url": "http://a_b:9000"}, BAD_HOST),
    ({"region": "x" * LONG}, f"option 'region' is {LONG:,} characters long"),
    ({"endpoint_url": "http://" + "h" * (LONG - 7)}, f"option 'endpoint_url' is {LONG:,} characters long"),
]
S3_IDS = ["region-space", "region-blank-inside", "endpoint-underscore", "region-100k", "endpoint-100k"]


def _option_args(options: Mapping[str, str]) -> list[str]:
    return [arg for name, value in options.items() for arg in ("--option", f"{name}={value}")]


def _assert_one_line_refusal(stderr: str, fragment: str) -> None:
    assert fragment in stderr, stderr
    assert "Traceback" not in stderr and "Unexpected" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert len(stderr) < 1000, stderr[:2000]  # a value is shown cut short, never whole


def _mount(tmp_path: Path, uri: str, options: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """`silod mount` of `uri` with `options` in the foreground, which must be refused with exit 2 before mounting;
    its stderr."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = [*SILOD, "mount", str(mountpoint), "--cache-dir", str(tmp_path / "cache"), "--foreground"]
    argv += ["--job", f"a={uri}", *_option_args(options)]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)
    assert result.returncode == 2, result.stderr[-3000:]
    assert not os.path.ismount(mountpoint)
    return result.stderr


@pytest.mark.parametrize(("options", "fragment"), S3_REFUSALS, ids=S3_IDS)
def test_an_s3_option_value_botocore_refuses_fails_the_mount_with_exit_2_and_one_line_naming_it(
    tmp_path: Path, options: dict[str, str], fragment: str
) -> None:
    stderr = _mount(tmp_path, "s3://bkt1/train", options)
    _assert_one_line_refusal(stderr, f"silod mount: --option s3://bkt1/train: {fragment}")


def test_a_profile_whose_config_has_a_region_botocore_refuses_fails_the_mount_naming_the_profile(
    tmp_path: Path,
) -> None:
    config = tmp_path / "aws-config"
    config.write_text("[profile compose]\nregion = us east\n")
    env = {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    stderr = _mount(tmp_path, "s3://bkt1/train", {"profile": "compose"}, env)
    _assert_one_line_refusal(
        stderr, "option 'profile' names an AWS profile whose region is not a region name such as us-east-1"
    )
    assert "'us east'" in stderr and "or set option 'region'" in stderr


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (
            {"account_url": "http://127.0.0.1:99999/devstoreaccount1", "account_key": "a2V5"},
            "option 'account_url' has a port that is not a number from 0 to 65535: '99999'",
        ),
        (
            {"connection_string": f"AccountName=devstoreaccount1;AccountKey={SECRET_KEY}"},
            "the AccountKey of option 'connection_string' must be base64",
        ),
        (
            {"connection_string": f"{SECRET_KEY};x"},
            "option 'connection_string' is malformed: it must be Name=value settings separated by ';'",
        ),
        (
            {"connection_string": f"BlobEndpoint=not a url;AccountName=devstoreaccount1;AccountKey={AZURE_KEY}"},
            "the BlobEndpoint of option 'connection_string' has a host the Azure SDK's HTTP client refuses: "
            "'not a url'",
        ),
        (
            {"connection_string": f"DefaultEndpointsProtocol=ftp;AccountName=devstoreaccount1;AccountKey={AZURE_KEY}"},
            "the DefaultEndpointsProtocol of option 'connection_string' must be http or https, got 'ftp'",
        ),
    ],
    ids=["port", "connection-string-key", "connection-string-syntax", "connection-string-endpoint", "protocol"],
)
def test_an_azure_option_value_the_sdk_would_refuse_fails_the_mount_with_exit_2_never_showing_a_secret(
    tmp_path: Path, options: dict[str, str], fragment: str
) -> None:
    stderr = _mount(tmp_path, "az://devstoreaccount1/cont/train", options)
    _assert_one_line_refusal(stderr, fragment)
    assert SECRET_KEY not in stderr and AZURE_KEY not in stderr


def test_an_azure_ad_environment_azure_identity_refuses_fails_the_mount_with_exit_2_naming_the_variable(
    tmp_path: Path,
) -> None:
    """It failed with azure-identity's ValueError and a traceback."""
    options = {"account_url": "https://127.0.0.1:1/devstoreaccount1"}  # no credential option: DefaultAzureCredential
    stderr = _mount(tmp_path, "az://devstoreaccount1/cont/train", options, {"AZURE_TOKEN_CREDENTIALS": "bogus"})
    _assert_one_line_refusal(stderr, "refuses the Azure AD configuration of this process's environment")
    assert "Invalid value for AZURE_TOKEN_CREDENTIALS: bogus" in stderr


def test_a_secret_azure_identity_takes_from_the_environment_never_shows_in_the_mounts_output(tmp_path: Path) -> None:
    """A managed identity's IDENTITY_HEADER that `requests` refuses as a header value (here for its newline) was shown
    whole in azure-identity's WARNING log line; the mount now says what to set, the header scrubbed."""
    secret = "identity-header-" + os.urandom(8).hex()
    env = {
        "AZURE_TOKEN_CREDENTIALS": "managedidentitycredential",
        "IDENTITY_ENDPOINT": f"http://127.0.0.1:{free_port()}/msi",  # never reached: the header is refused first
        "IDENTITY_HEADER": secret + "\n",
    }
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = [*SILOD, "mount", str(mountpoint), "--cache-dir", str(tmp_path / "cache"), "--foreground"]
    argv += ["--job", "a=az://devstoreaccount1/cont/train", "--option", "account_url=https://127.0.0.1:1/x"]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert result.returncode == 1 and not os.path.ismount(mountpoint), result.stderr[-3000:]
    assert secret not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "access denied (no Azure AD token: DefaultAzureCredential tried ManagedIdentityCredential" in result.stderr


def _started(datamgr_process: DataManagerProcess) -> DataManagerClient:
    datamgr_process.start()
    return DataManagerClient(datamgr_process.address, timeout=30)


def _assert_log_clean(datamgr_process: DataManagerProcess, *secrets: str) -> None:
    log = datamgr_process.log_path.read_text()
    assert "Traceback" not in log and "Unexpected" not in log and " ERROR " not in log, log[-5000:]
    for secret in secrets:
        assert secret not in log


@pytest.fixture
def s3_dataset(dataset_target_factory: DatasetTargetFactory) -> DatasetTarget:
    target = dataset_target_factory("s3")
    target.put("a.bin", b"first file")
    return target


@pytest.mark.parametrize(("options", "fragment"), S3_REFUSALS, ids=S3_IDS)
def test_dataset_add_with_an_s3_option_value_botocore_refuses_is_invalid_argument_in_one_line_registering_nothing(
    datamgr_process: DataManagerProcess, s3_dataset: DatasetTarget, options: dict[str, str], fragment: str
) -> None:
    with _started(datamgr_process) as client:
        result = silod_cli(
            "dataset", "add", s3_dataset.uri, *_option_args({**s3_dataset.options, **options}),
            datamgr=datamgr_process.address,
        )  # fmt: skip
        assert result.returncode != 0
        _assert_one_line_refusal(result.stderr, "INVALID_ARGUMENT")
        assert f"options: {s3_dataset.uri}: {fragment}" in result.stderr
        assert not client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets
    _assert_log_clean(datamgr_process)


def test_set_options_with_s3_option_values_botocore_refuses_is_invalid_argument_changing_nothing(
    datamgr_process: DataManagerProcess, s3_dataset: DatasetTarget
) -> None:
    with _started(datamgr_process) as client:
        client.register_dataset(s3_dataset.uri, s3_dataset.options)
        before = client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=s3_dataset.uri))
        for options, fragment in S3_REFUSALS:
            result = silod_cli(
                "dataset", "set-options", s3_dataset.uri, *_option_args(options), datamgr=datamgr_process.address
            )
            assert result.returncode != 0
            _assert_one_line_refusal(result.stderr, "INVALID_ARGUMENT")
            assert f"options: {s3_dataset.uri}: {fragment}" in result.stderr
        assert client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=s3_dataset.uri)) == before
    _assert_log_clean(datamgr_process)


def test_a_registration_with_a_profile_whose_config_has_a_bad_region_is_invalid_argument_naming_the_profile(
    datamgr_process: DataManagerProcess, s3_dataset: DatasetTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "aws-config"
    config.write_text("[profile compose]\nregion = us east\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))  # the data manager's, which opens the backend
    options = {"endpoint_url": s3_dataset.options["endpoint_url"], "path_style": "true", "profile": "compose"}
    with _started(datamgr_process) as client:
        with pytest.raises(ClientError) as refused:
            client.register_dataset(s3_dataset.uri, options)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        message = str(refused.value)
        assert "option 'profile' names an AWS profile whose region is not a region name" in message, message
        assert "'us east'" in message and len(message.splitlines()) == 1
        assert not client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets
    _assert_log_clean(datamgr_process)


@pytest.mark.parametrize(
    ("scheme", "uri"), [("s3", "s3://bkt1/train"), ("az", "az://devstoreaccount1/cont/train")], ids=["s3", "az"]
)
def test_a_100k_value_of_any_option_or_a_100k_name_is_invalid_argument_naming_it_in_a_short_message(
    datamgr_process: DataManagerProcess, scheme: str, uri: str
) -> None:
    secret_options = backend_class(scheme).secret_options
    with _started(datamgr_process) as client:
        for name in sorted(backend_class(scheme).option_names):
            value = (LONG_SECRET if name in secret_options else "v") * (LONG // 10)
            with pytest.raises(ClientError) as refused:
                client.register_dataset(uri, {name: value})
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, (name, refused.value)
            message = str(refused.value)
            assert f"option {name!r} is {len(value):,} characters long" in message, (name, message[:2000])
            assert len(message) < 1000 and LONG_SECRET not in message, (name, message[:2000])
        with pytest.raises(ClientError) as refused:
            client.register_dataset(uri, {"n" * LONG: "1"})
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        message = str(refused.value)
        assert f"unknown option {'n' * 40 + '...'!r} ({LONG:,} characters) for {scheme}://" in message, message[:2000]
        assert len(message) < 1000
        assert not client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets
    _assert_log_clean(datamgr_process, LONG_SECRET)


def test_a_start_warns_of_stored_s3_options_botocore_refuses_naming_each_and_changing_nothing(
    datamgr_process: DataManagerProcess,
) -> None:
    stored = {
        "s3://spaced/train": {"region": "us east", "path_style": "maybe"},
        "s3://compose/train": {"endpoint_url": "http://a_b:9000", "read_timeout": "soon"},
    }
    datasets = tuple(
        Dataset(uri, options, size_bytes=10, file_count=1, item_count=1, chunk_size_bytes=4 << 20, manifest_digest="d")
        for uri, options in stored.items()
    )
    store = SQLiteStore(datamgr_process.state_dir)
    try:  # as an older silod, which took these options, left them
        store.commit([Commit(store.load().revision + 1, Change(datasets_put=datasets))])
    finally:
        store.close()

    with _started(datamgr_process) as client:
        assert len(client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets) == 2
    assert datamgr_process.terminate() == 0

    log = datamgr_process.log_path.read_text()
    warnings = [line for line in log.splitlines() if " WARNING datamgr.stored_options: " in line]
    assert len(warnings) == 2, log
    compose, spaced = sorted(warnings, key=lambda line: "s3://spaced/" in line)
    assert "dataset s3://compose/train holds options this version refuses" in compose
    assert BAD_HOST in compose and "option 'read_timeout' must be a number of seconds" in compose
    assert "silod dataset set-options s3://compose/train --option endpoint_url=... --option read_timeout=..." in compose
    assert f"option 'region' {REGION_RULE}" in spaced and "got 'us east'" in spaced
    assert "option 'path_style' must be 'true' or 'false'" in spaced
    assert "Traceback" not in log
    store = SQLiteStore(datamgr_process.state_dir)
    try:
        assert {dataset.uri: dataset.options for dataset in store.load().datasets} == stored
    finally:
        store.close()
