"""Datasets an older silod registered with options this version refuses (a control character, such as a Secret
file's trailing newline; a URL with `user:password@`): the data manager's start warns of each, naming the option
and the `silod dataset set-options` command that fixes it, and changes nothing; every output that shows options
masks a URL's password and escapes control characters. This version's registration refuses such options, so the
state dirs here are written with the store's own API, as the older silod left them."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.entities import Dataset
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import DataManagerProcess, cli, silod_cli
from tests.storage_servers import AzuriteServer, DatasetTargetFactory, container_sas

# Secrets that must never show in a log line or an output.
PASSWORD = "Pr0xyPassw0rd" + os.urandom(8).hex()
TOKEN = "ghp" + os.urandom(12).hex()
SAS = "sv=2024-08-04&sr=c&sp=rl&sig=" + os.urandom(16).hex()

_WARNING = re.compile(r"^\S+ \S+ WARNING datamgr\.stored_options: (.*)$", re.MULTILINE)
_FIX = re.compile(r"silod dataset set-options (\S+)((?: --(?:option \w+=\.\.\.|remove-option \w+))+)")


def _dataset(uri: str, options: dict[str, str]) -> Dataset:
    return Dataset(
        uri, options, size_bytes=10, file_count=1, item_count=1, chunk_size_bytes=4 << 20, manifest_digest="d"
    )


def _store_as_an_older_silod_did(state_dir: Path, *datasets: Dataset) -> None:
    """Put `datasets` into the state dir as the next revision, as a data manager that took their options would
    have."""
    store = SQLiteStore(state_dir)
    try:
        revision = store.load().revision + 1
        store.commit([Commit(revision, Change(datasets_put=datasets))])
    finally:
        store.close()


def _stored_datasets(state_dir: Path) -> dict[str, Dataset]:
    store = SQLiteStore(state_dir)
    try:
        return {dataset.uri: dataset for dataset in store.load().datasets}
    finally:
        store.close()


def _warnings(log: str) -> dict[str, str]:
    """The start's warnings of stored options, by the dataset each names."""
    found = {}
    for warning in _WARNING.findall(log):
        dataset = re.match(r"dataset (\S+) ", warning)
        assert dataset is not None, warning
        assert dataset.group(1) not in found, f"two warnings for {dataset.group(1)}:\n{log}"
        found[dataset.group(1)] = warning
    return found


def test_a_start_warns_once_per_dataset_with_refused_options_naming_each_and_its_fix_never_a_value_changing_nothing(
    datamgr_process: DataManagerProcess,
) -> None:
    datasets = (
        _dataset("s3://proxied/train", {"endpoint_url": f"http://proxyuser:{PASSWORD}@127.0.0.1:9000"}),
        _dataset(
            "az://acct/secretfile/train",
            {"account_url": "http://127.0.0.1:10000/acct", "sas_token": SAS + "\n", "read_timeout": "3\t0"},
        ),
        _dataset("s3://renamed/train", {"proxy": "http://127.0.0.1:3128"}),  # a name this version does not take
        _dataset("s3://fine/train", {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}),
    )
    _store_as_an_older_silod_did(datamgr_process.state_dir, *datasets)

    datamgr_process.start()
    with DataManagerClient(datamgr_process.address, timeout=10) as client:  # started, and serving all four
        assert len(client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets) == 4
    assert datamgr_process.terminate() == 0

    log = datamgr_process.log_path.read_text()
    warnings = _warnings(log)
    assert sorted(warnings) == ["az://acct/secretfile/train", "s3://proxied/train", "s3://renamed/train"], log
    proxied = warnings["s3://proxied/train"]
    assert "option 'endpoint_url' must not hold a user name or password" in proxied
    assert "silod dataset set-options s3://proxied/train --option endpoint_url=... " in proxied
    secret_file = warnings["az://acct/secretfile/train"]
    assert "option 'read_timeout' holds a control character (U+0009)" in secret_file
    assert "option 'sas_token' ends with a newline (a file's trailing newline?): remove it" in secret_file
    assert "account_url" not in secret_file  # taken as it is
    fix = "silod dataset set-options az://acct/secretfile/train --option read_timeout=... --option sas_token=... "
    assert fix in secret_file  # one command for both: set-options tries the whole result
    renamed = warnings["s3://renamed/train"]
    assert "unknown option 'proxy' for s3://" in renamed
    assert renamed.endswith("silod dataset set-options s3://renamed/train --remove-option proxy"), renamed
    for secret in (PASSWORD, SAS, "3\t0", "3\\t0"):
        assert secret not in log
    assert _stored_datasets(datamgr_process.state_dir) == {dataset.uri: dataset for dataset in datasets}


def test_outputs_that_show_options_mask_a_url_s_password_and_escape_control_characters(
    datamgr_process: DataManagerProcess,
) -> None:
    _store_as_an_older_silod_did(
        datamgr_process.state_dir,
        _dataset(
            "s3://proxied/train",
            {"endpoint_url": f"https://proxyuser:{PASSWORD}@s3.example.com/", "region": "us-east-1\n\x1b[2J"},
        ),
        _dataset("s3://token/train", {"endpoint_url": f"http://{TOKEN}@127.0.0.1:9000", "profile": "p"}),
        _dataset("az://acct/secretfile/train", {"account_url": "http://127.0.0.1:10000/acct", "sas_token": SAS + "\n"}),
    )
    datamgr_process.start()

    shown = json.loads(cli(datamgr_process, "dataset", "show", "s3://proxied/train", "--json"))
    assert shown["options"] == {
        "endpoint_url": "https://proxyuser:***@s3.example.com/",
        "region": "us-east-1\\n\\x1b[2J",
    }
    status = json.loads(cli(datamgr_process, "status", "--json"))
    listed = {dataset["uri"]: dataset["options"] for dataset in status["datasets"]}
    assert listed == {
        "s3://proxied/train": shown["options"],
        "s3://token/train": {"endpoint_url": "http://***@127.0.0.1:9000", "profile": "p"},
        "az://acct/secretfile/train": {"account_url": "http://127.0.0.1:10000/acct", "sas_token": "<redacted>"},
    }
    outputs = [
        silod_cli("dataset", "show", uri, *flags, datamgr=datamgr_process.address)
        for uri in listed
        for flags in ((), ("--json",))
    ]
    outputs.append(silod_cli("status", datamgr=datamgr_process.address))
    for output in outputs:
        assert output.returncode == 0, output.stderr
        for secret in (PASSWORD, TOKEN, SAS):
            assert secret not in output.stdout + output.stderr
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", output.stdout), output.stdout  # no raw control


def test_the_command_the_start_warning_gives_fixes_the_dataset_and_the_next_start_is_quiet(
    datamgr_process: DataManagerProcess,
    dataset_target_factory: DatasetTargetFactory,
    azurite: AzuriteServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warning's command, its `...` filled in, is all an operator needs: set-options tries it on storage."""
    target = dataset_target_factory("az")
    target.put("a.bin", b"first file")
    sas = container_sas(azurite, target.uri)
    datamgr_process.start()
    with DataManagerClient(datamgr_process.address, timeout=10) as client:
        client.register_dataset(target.uri, {"account_url": azurite.account_url, "sas_token": sas})
    assert datamgr_process.terminate() == 0
    registered = _stored_datasets(datamgr_process.state_dir)[target.uri]
    userinfo_url = azurite.account_url.replace("://", f"://{azurite.account_name}:{PASSWORD}@", 1)
    older = replace(registered, options={"account_url": userinfo_url, "sas_token": sas + "\n"})
    _store_as_an_older_silod_did(datamgr_process.state_dir, older)

    datamgr_process.start()
    log = datamgr_process.log_path.read_text()
    warning = _warnings(log).get(target.uri)
    assert warning is not None, log
    fix = _FIX.search(warning)
    assert fix is not None, warning
    assert fix.group(1) == target.uri
    monkeypatch.setenv("SILOD_TEST_FIXED_SAS", sas)
    filled = fix.group(0).replace("account_url=...", f"account_url={azurite.account_url}")
    filled = filled.replace("--option sas_token=...", "--option-env sas_token=SILOD_TEST_FIXED_SAS")
    fixed = silod_cli(*shlex.split(filled)[1:], datamgr=datamgr_process.address)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert f"options of {target.uri} replaced: account_url={azurite.account_url}, sas_token=<redacted>" in fixed.stdout
    assert datamgr_process.terminate() == 0
    log_before_restart = len(datamgr_process.log_path.read_text())

    datamgr_process.start()
    assert datamgr_process.terminate() == 0
    log = datamgr_process.log_path.read_text()
    assert _warnings(log[log_before_restart:]) == {}
    assert _stored_datasets(datamgr_process.state_dir)[target.uri].options == {
        "account_url": azurite.account_url,
        "sas_token": sas,
    }
    for secret in (PASSWORD, sas):
        assert secret not in log + fixed.stdout + fixed.stderr
