"""Credentials that storage refuses at a test's command, and credentials one host has and another lacks: for tests of
credentials that expire or are rotated under running jobs.

A SAS bound to a stored access policy of the dataset's container, whose expiry a test moves into the past: Azurite
then refuses it, as Azure refuses a SAS past its own expiry, without a test waiting for the clock. An AWS profile the
data manager's environment has and a node agent's lacks, as where a node's host lacks a profile."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import AccessPolicy, ContainerClient, ContainerSasPermissions, generate_container_sas

from datamgr.devservers import AzuriteServer, S3Server, azure_client
from silodlib.backends import parse_dataset_uri
from tests.datamgr_fixtures import DataManagerProcess
from tests.mount_fixtures import MountProcess
from tests.storage_servers import DATASET_PREFIX, DatasetTarget

POLICY = "expiring"


def expiring_sas(azurite: AzuriteServer, target: DatasetTarget) -> tuple[str, Callable[[], None]]:
    """A SAS reading the target's container for an hour, and the call that makes storage refuse it from then on."""
    container = azure_client(azurite).get_container_client(parse_dataset_uri(target.uri).location[1])
    permission = ContainerSasPermissions(read=True, list=True)

    def expiring_at(expiry: datetime) -> None:
        container.set_container_access_policy({POLICY: AccessPolicy(permission=permission, expiry=expiry)})

    expiring_at(datetime.now(UTC) + timedelta(hours=1))
    sas = generate_container_sas(azurite.account_name, container.container_name, azurite.account_key, policy_id=POLICY)
    return sas, lambda: expiring_at(datetime.now(UTC) - timedelta(minutes=5))


def sas_refused(sas: str, azurite: AzuriteServer, target: DatasetTarget, name: str) -> bool:
    """Whether storage refuses `sas` now for the dataset's file `name` (the policy's change has taken effect)."""
    container = ContainerClient(azurite.account_url, parse_dataset_uri(target.uri).location[1], credential=sas)
    try:
        container.get_blob_client(f"{DATASET_PREFIX}/{name}").download_blob().readall()
    except HttpResponseError as exc:
        return exc.status_code == 403
    return False


def node_lacking_a_profile(
    tmp_path: Path,
    datamgr_process: DataManagerProcess,
    s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    profile: str,
) -> MountProcess:
    """Start the data manager with AWS profile `profile` (the S3 server's keys) and return node n1's agent, not started,
    whose environment has no such profile: options naming it are good for the one and refused by the other. Its
    credentials file is `tmp_path / "no-aws-credentials"`, missing until a test writes it (the profile arriving on
    the node's host)."""
    profiles = tmp_path / "aws-credentials"
    profiles.write_text(
        f"[{profile}]\naws_access_key_id = {s3_server.access_key_id}\n"
        f"aws_secret_access_key = {s3_server.secret_access_key}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(profiles))
    datamgr_process.start()
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    return MountProcess.node(tmp_path / "n1", datamgr_process.address, "n1", "--cache-capacity", "1GiB")
