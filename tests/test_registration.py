"""RegisterDataset against real storage: Azurite, the S3 server and a local directory, each holding nested
folders, an empty folder, a zero-byte object, large objects split into chunks, and names with spaces and
unicode. The frozen manifest must describe exactly what was uploaded."""

from __future__ import annotations

import pytest

from datamgr.client import ClientError
from silodlib.manifest import Manifest, items_in_file
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import RunningDataManager
from tests.datasets import generate_dataset, upload_dataset
from tests.storage_servers import DatasetTarget, DatasetTargetFactory

CHUNK = 4 * 1024 * 1024


def test_registration_freezes_exactly_the_uploaded_tree(
    datamgr: RunningDataManager, dataset_target: DatasetTarget
) -> None:
    dataset = generate_dataset(seed=3, small_files=60)
    upload_dataset(dataset_target, dataset)
    reply = datamgr.client.register_dataset(dataset_target.uri, dataset_target.options, CHUNK)

    expected_items = sum(items_in_file(len(data), CHUNK) for data in dataset.files.values())
    assert reply.created
    assert reply.dataset.file_count == len(dataset.files)
    assert reply.dataset.size_bytes == dataset.total_bytes
    assert reply.dataset.item_count == expected_items
    assert expected_items > len(dataset.files)  # the large objects really were split

    chunks = datamgr.client.stub.GetManifest(pb.GetManifestRequest(dataset_uri=dataset_target.uri))
    manifest = Manifest.decode(b"".join(c.data for c in chunks))
    assert manifest.paths == sorted(dataset.files)
    assert {p: s for p, s in zip(manifest.paths, manifest.sizes, strict=True)} == {
        path: len(data) for path, data in dataset.files.items()
    }
    assert list(manifest.empty_dirs) == sorted(dataset.empty_dirs)
    assert all(manifest.versions)
    assert any(" " in p for p in manifest.paths) and any("ü" in p for p in manifest.paths)
    assert 0 in manifest.sizes


@pytest.mark.parametrize("backend", ["s3", "az"])
def test_a_missing_bucket_or_container_is_a_failed_precondition_naming_it(
    datamgr: RunningDataManager, dataset_target_factory: DatasetTargetFactory, backend: str
) -> None:
    target = dataset_target_factory(backend)
    scheme, rest = target.uri.split("://")
    missing = f"{scheme}://{rest.replace('silod-', 'missing-', 1)}"
    with pytest.raises(ClientError, match="FAILED_PRECONDITION") as info:
        datamgr.client.register_dataset(missing, target.options)
    assert "missing-" in str(info.value)
