"""Replacing a registered dataset's backend options in place (UpdateDatasetOptions, `silod dataset set-options`):
the new options are tried on real storage (Azurite) before anything changes, persist, and reach the nodes that
mount the dataset with its manifest unchanged; every refusal changes nothing and names what failed, never a
secret."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import grpc
import pytest
from azure.storage.blob import ContainerSasPermissions

from datamgr.client import ClientError, DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import DataManagerProcess, RunningDataManager, full_state, silod_cli, watch
from tests.state_files import files_of
from tests.storage_servers import AzuriteServer, DatasetTarget, DatasetTargetFactory, container_sas


@pytest.fixture
def az_dataset(dataset_target_factory: DatasetTargetFactory) -> DatasetTarget:
    """An Azurite container with two small files."""
    target = dataset_target_factory("az")
    target.put("a.bin", b"first file")
    target.put("b.bin", b"second file")
    return target


def _sas_options(azurite: AzuriteServer, target: DatasetTarget, sas: str) -> dict[str, str]:
    return {"account_url": azurite.account_url, "sas_token": sas}


def _registered(client: DataManagerClient, azurite: AzuriteServer, target: DatasetTarget) -> str:
    """Register `target` with a SAS good for an hour; the SAS."""
    sas = container_sas(azurite, target.uri)
    client.register_dataset(target.uri, _sas_options(azurite, target, sas))
    return sas


def _later_sas(azurite: AzuriteServer, target: DatasetTarget) -> str:
    """Another SAS than `_registered`'s: one made within the same second with the same expiry would be the same."""
    return container_sas(azurite, target.uri, expiry=datetime.now(UTC) + timedelta(hours=2))


def _refusal(client: DataManagerClient, uri: str, options: dict[str, str], removed: list[str]) -> ClientError:
    with pytest.raises(ClientError) as refused:
        client.update_dataset_options(uri, options, removed)
    return refused.value


def test_new_options_replace_the_old_keeping_the_manifest_and_reach_the_node_that_mounts_it(
    datamgr: RunningDataManager, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    client = datamgr.client
    old_sas = _registered(client, azurite, az_dataset)
    digest = client.call(client.stub.GetDataset, pb.GetDatasetRequest(uri=az_dataset.uri)).manifest_digest
    client.register_node("n1", "h1:1", 2**30)
    client.register_job("j1", az_dataset.uri, 1_000_000, [("n1", 1)])
    client.allocate_cache_size(az_dataset.uri, 10)
    node = watch(client, "n1")
    assert dict(node.next().snapshot.datasets[0].options)["sas_token"] == old_sas

    new_sas = _later_sas(azurite, az_dataset)
    reply = client.update_dataset_options(az_dataset.uri, {"sas_token": new_sas})
    assert reply.changed
    assert dict(reply.dataset.options) == {"account_url": azurite.account_url, "sas_token": "<redacted>"}
    assert (reply.dataset.manifest_digest, reply.dataset.file_count) == (digest, 2)
    event = node.next()
    assert event.revision == reply.revision
    assert [change.WhichOneof("change") for change in event.changes] == ["dataset_set"]
    pushed = event.changes[0].dataset_set
    assert (pushed.manifest_digest, pushed.cache_quota_bytes) == (digest, 10)
    assert dict(pushed.options) == _sas_options(azurite, az_dataset, new_sas)

    again = client.update_dataset_options(az_dataset.uri, {"sas_token": new_sas})
    assert not again.changed and again.revision == reply.revision  # nothing to change: no revision
    node.cancel()


def test_a_key_removed_and_another_set_switch_a_dataset_from_its_account_key_to_a_sas(
    datamgr: RunningDataManager, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    client = datamgr.client
    client.register_dataset(az_dataset.uri, az_dataset.options)  # account_url + account_key
    reply = client.update_dataset_options(
        az_dataset.uri, {"sas_token": _later_sas(azurite, az_dataset)}, ["account_key"]
    )
    assert reply.changed
    assert dict(reply.dataset.options) == {"account_url": azurite.account_url, "sas_token": "<redacted>"}


def _expired_sas(azurite: AzuriteServer, target: DatasetTarget) -> str:
    return container_sas(azurite, target.uri, expiry=datetime.now(UTC) - timedelta(minutes=5))


def test_options_refused_change_nothing_and_name_the_option_or_the_object_that_failed_never_a_secret(
    datamgr: RunningDataManager, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    client = datamgr.client
    old_sas = _registered(client, azurite, az_dataset)
    client.register_node("n1", "h1:1", 2**30)
    client.register_job("j1", az_dataset.uri, 1_000_000, [("n1", 1)])
    before = full_state(client)
    uri = az_dataset.uri
    expired = _expired_sas(azurite, az_dataset)
    list_only = container_sas(azurite, uri, ContainerSasPermissions(list=True))
    wrong_key = base64.b64encode(b"not the account key").decode()
    cases = [
        (uri.replace("silod-", "silod-gone-"), {"sas_token": old_sas}, [], grpc.StatusCode.NOT_FOUND, "not registered"),
        (uri, {}, [], grpc.StatusCode.INVALID_ARGUMENT, "give at least one option to set or to remove"),
        (uri, {"sas": old_sas}, [], grpc.StatusCode.INVALID_ARGUMENT, "unknown option 'sas' for az://"),
        (uri, {"read_timeout": "soon"}, [], grpc.StatusCode.INVALID_ARGUMENT, "read_timeout"),
        (
            uri,
            {"sas_token": old_sas},
            ["sas_token"],
            grpc.StatusCode.INVALID_ARGUMENT,
            "sas_token both set and removed",
        ),
        (uri, {}, ["account_key"], grpc.StatusCode.FAILED_PRECONDITION, "account_key not set on the dataset"),
        (
            uri,
            {"sas_token": expired},
            [],
            grpc.StatusCode.PERMISSION_DENIED,
            f"a read with the new options failed: uri {uri}/a.bin: access denied",
        ),
        (uri, {"sas_token": list_only}, [], grpc.StatusCode.PERMISSION_DENIED, f"uri {uri}/a.bin: access denied"),
        (uri, {"account_key": wrong_key}, ["sas_token"], grpc.StatusCode.PERMISSION_DENIED, "access denied"),
    ]
    for dataset_uri, options, removed, code, fragment in cases:
        refused = _refusal(client, dataset_uri, options, removed)
        assert refused.code == code, (options, removed, refused)
        assert fragment in str(refused), str(refused)
        for secret in (old_sas, expired, list_only, parse_qs(expired)["sig"][0], wrong_key):
            assert secret not in str(refused)
        assert full_state(client) == before
    assert "the sas_token option expired at" in str(_refusal(client, uri, {"sas_token": expired}, []))
    assert not client.update_dataset_options(uri, {"sas_token": old_sas}).changed  # the old SAS is still in effect


def test_a_dataset_of_empty_files_has_new_options_tried_on_a_file_s_properties(
    datamgr: RunningDataManager, dataset_target_factory: DatasetTargetFactory, azurite: AzuriteServer
) -> None:
    """A read of nothing asks storage nothing, so where every file is empty the properties of one are read."""
    target = dataset_target_factory("az")
    target.put("empty.bin", b"")
    client = datamgr.client
    _registered(client, azurite, target)
    refused = _refusal(client, target.uri, {"sas_token": _expired_sas(azurite, target)}, [])
    assert refused.code == grpc.StatusCode.PERMISSION_DENIED and f"{target.uri}/empty.bin" in str(refused)
    assert client.update_dataset_options(target.uri, {"sas_token": _later_sas(azurite, target)}).changed


def test_new_options_outlive_a_restart_of_the_data_manager(
    datamgr_process: DataManagerProcess, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    datamgr_process.start()
    new_sas = _later_sas(azurite, az_dataset)
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        _registered(client, azurite, az_dataset)
        client.register_node("n1", "h1:1", 2**30)
        client.register_job("j1", az_dataset.uri, 1_000_000, [("n1", 1)])
        assert client.update_dataset_options(az_dataset.uri, {"sas_token": new_sas}).changed
    assert datamgr_process.terminate() == 0
    datamgr_process.start()
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        node = watch(client, "n1")
        assert dict(node.next().snapshot.datasets[0].options) == _sas_options(azurite, az_dataset, new_sas)
        node.cancel()
        assert not client.update_dataset_options(az_dataset.uri, {"sas_token": new_sas}).changed


def test_the_old_options_leave_the_state_dir_and_a_node_behind_the_change_resyncs_from_a_snapshot(
    datamgr_process: DataManagerProcess, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    """The event log kept every event that set the dataset on a node, old SAS and all, for 100,000 revisions: a
    credential rotated because it leaked stayed in silod.db."""
    datamgr_process.start()
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        old_sas = _registered(client, azurite, az_dataset)
        client.register_node("n1", "h1:1", 2**30)
        client.register_job("j1", az_dataset.uri, 1_000_000, [("n1", 1)])  # sets the dataset, old SAS, on n1
        node = watch(client, "n1")
        before = node.next().revision
        node.cancel()
        assert any(old_sas.encode() in data for data in files_of(datamgr_process.state_dir).values())

        new_sas = _later_sas(azurite, az_dataset)
        rotated = client.update_dataset_options(az_dataset.uri, {"sas_token": new_sas}).revision

        assert [name for name, data in files_of(datamgr_process.state_dir).items() if old_sas.encode() in data] == []
        behind = watch(client, "n1", since=before - 1)  # yet to get the event that set the dataset, old SAS and all
        first = behind.next()
        assert first.HasField("snapshot") and first.revision == rotated
        assert dict(first.snapshot.datasets[0].options)["sas_token"] == new_sas
        behind.cancel()
        current = watch(client, "n1", since=rotated - 1)
        assert [change.WhichOneof("change") for change in current.next().changes] == ["dataset_set"]
        current.cancel()


def test_a_dataset_unregistered_leaves_no_option_of_it_in_the_state_dir(
    datamgr_process: DataManagerProcess, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    datamgr_process.start()
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        sas = _registered(client, azurite, az_dataset)
        client.register_node("n1", "h1:1", 2**30)
        client.register_job("j1", az_dataset.uri, 1_000_000, [("n1", 1)])
        client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id="j1"))
        client.call(client.stub.UnregisterDataset, pb.UnregisterDatasetRequest(uri=az_dataset.uri))

        assert [name for name, data in files_of(datamgr_process.state_dir).items() if sas.encode() in data] == []


# ---- the command line ----


def test_set_options_prints_the_options_now_in_effect_redacted_and_says_when_nothing_changed(
    datamgr: RunningDataManager, az_dataset: DatasetTarget, azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _registered(datamgr.client, azurite, az_dataset)
    new_sas = _later_sas(azurite, az_dataset)
    monkeypatch.setenv("SILOD_TEST_SAS", new_sas)
    command = ("dataset", "set-options", az_dataset.uri, "--option-env", "sas_token=SILOD_TEST_SAS")
    replaced = silod_cli(*command, datamgr=datamgr.address)
    assert replaced.returncode == 0, replaced.stderr
    shown = f"account_url={azurite.account_url}, sas_token=<redacted>"
    assert f"options of {az_dataset.uri} replaced: {shown} (revision " in replaced.stdout
    unchanged = silod_cli(*command, datamgr=datamgr.address)
    assert unchanged.returncode == 0, unchanged.stderr
    assert f"options of {az_dataset.uri} unchanged: it has these already: {shown}" in unchanged.stdout
    for output in (replaced, unchanged):
        assert new_sas not in output.stdout + output.stderr


def test_set_options_refused_exits_1_with_the_reason_and_without_options_exits_2(
    datamgr: RunningDataManager, az_dataset: DatasetTarget, azurite: AzuriteServer
) -> None:
    _registered(datamgr.client, azurite, az_dataset)
    expired = _expired_sas(azurite, az_dataset)
    refused = silod_cli(
        "dataset", "set-options", az_dataset.uri, "--option", f"sas_token={expired}", datamgr=datamgr.address
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (
        f"silod: PERMISSION_DENIED: a read with the new options failed: uri {az_dataset.uri}/a.bin: access denied"
    ) in refused.stderr
    assert expired not in refused.stdout + refused.stderr
    unknown = silod_cli("dataset", "set-options", az_dataset.uri, "--remove-option", "sas", datamgr=datamgr.address)
    assert unknown.returncode == 1 and "FAILED_PRECONDITION: remove_options: sas not set" in unknown.stderr
    empty = silod_cli("dataset", "set-options", az_dataset.uri, datamgr=datamgr.address)
    assert empty.returncode == 2
    assert "give the options to set (--option, --option-env) or remove" in empty.stderr


@pytest.fixture
def data_manager_without_the_call() -> Iterator[str]:
    """A real gRPC server that serves no call: what a data manager older than UpdateDatasetOptions answers it."""
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_set_options_against_an_older_data_manager_says_it_is_older(data_manager_without_the_call: str) -> None:
    address = data_manager_without_the_call
    result = silod_cli("dataset", "set-options", "az://account1/data", "--option", "sas_token=x", datamgr=address)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the data manager at {address} does not know this command's call: it is older than this silod" in (
        result.stderr
    )
