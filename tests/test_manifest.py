"""The frozen manifest: item numbering, POSIX-shape checks, and a lossless compact encoding."""

from __future__ import annotations

import logging

import pytest

from silodlib.backends.base import ObjectInfo
from silodlib.manifest import (
    EmptyListing,
    ListingTally,
    Manifest,
    ManifestError,
    build_manifest,
    freeze_listing,
    items_in_file,
)

CHUNK = 1024


def _obj(key: str, size: int = 10, *, is_dir: bool = False) -> ObjectInfo:
    return ObjectInfo(key, size, f"v-{key}", 1_700_000_000_000_000_000 + size, is_dir)


def test_items_are_numbered_in_path_order_with_large_files_split_into_chunks() -> None:
    manifest = build_manifest([_obj("b/big", 3 * CHUNK + 1), _obj("a/small", 10), _obj("c/empty", 0)], CHUNK)
    assert manifest.paths == ["a/small", "b/big", "c/empty"]
    entries = [manifest.file(i) for i in range(manifest.file_count)]
    assert [(e.first_item, e.item_count) for e in entries] == [(0, 1), (1, 4), (5, 1)]
    assert manifest.item_count == 6
    assert manifest.size_bytes == 10 + 3 * CHUNK + 1


@pytest.mark.parametrize(("size", "items"), [(0, 1), (1, 1), (CHUNK, 1), (CHUNK + 1, 2), (10 * CHUNK, 10)])
def test_items_in_file_is_the_ceiling_of_size_over_chunk_and_at_least_one(size: int, items: int) -> None:
    assert items_in_file(size, CHUNK) == items


def test_explicit_empty_folders_are_kept_and_implied_ones_dropped() -> None:
    objects = [_obj("a/x"), _obj("a", is_dir=True), _obj("empty/inner", is_dir=True), _obj("", is_dir=True)]
    manifest = build_manifest(objects, CHUNK)
    assert manifest.empty_dirs == ("empty/inner",)
    assert manifest.paths == ["a/x"]


@pytest.mark.parametrize(
    ("objects", "fragment"),
    [
        ([_obj("a"), _obj("a/b")], "'a' is both a file and a folder"),
        ([_obj("k"), _obj("k", is_dir=True)], "'k' is both a file and a folder"),  # a file beside the marker 'k/'
        ([_obj("ok"), _obj("d/" + "x" * 300)], "longer than 255 bytes"),
        ([_obj("a"), _obj("a")], "'a' is listed twice"),
    ],
)
def test_listings_a_posix_tree_cannot_show_are_refused_by_key(objects: list[ObjectInfo], fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        build_manifest(objects, CHUNK)


def test_keys_no_path_can_name_are_left_out_and_counted_by_reason() -> None:
    # Listed as stored by the backends ('/x' is the usual upload mistake: a leading slash); the manifest decides.
    odd = ["/train/img0.jpg", "a//b", "a/./b", "../x", "x/..", "nul\0byte", "caf\udce9.jpg"]
    objects = [_obj("good"), *map(_obj, odd), _obj("", is_dir=True), _obj("e/", is_dir=True), _obj("e", is_dir=True)]
    tally = ListingTally()
    manifest = build_manifest(objects, CHUNK, tally)
    assert manifest.paths == ["good"] and manifest.empty_dirs == ("e",)
    assert (tally.objects, tally.folders, tally.skipped_count) == (10, 1, 8)  # the prefix's own marker aside
    assert tally.describe_skipped() == (
        "6 keys with an empty, '.' or '..' component, such as '/train/img0.jpg', 'a//b', 'a/./b'; "
        "1 key with a NUL character, such as 'nul\\x00byte'; "
        "1 name that is not valid UTF-8, such as 'caf\\udce9.jpg'"
    )


URI = "s3://lead-s3"
CHECK = "check the bucket, container, prefix or path"


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ([], f"{URI} lists no objects; {CHECK}"),
        ([_obj("", is_dir=True)], f"{URI} lists no objects; {CHECK}"),  # only the prefix's own marker
        (
            [_obj("a", is_dir=True), _obj("b/c", is_dir=True)],
            f"{URI} lists 2 objects, none of which can be a file below a mount point (2 folder markers, such as "
            f"'a/'); {CHECK}",
        ),
        (
            [_obj(f"/train/img{i}.jpg") for i in range(2_000)],
            f"{URI} lists 2,000 objects, none of which can be a file below a mount point (2,000 skipped: keys with "
            "an empty, '.' or '..' component, such as '/train/img0.jpg', '/train/img1.jpg', '/train/img2.jpg'); "
            f"rename the objects to relative paths, or {CHECK}",
        ),
        (
            [_obj("/x"), _obj("d", is_dir=True)],
            f"{URI} lists 2 objects, none of which can be a file below a mount point (1 skipped: key with an empty, "
            f"'.' or '..' component, such as '/x'; 1 folder marker, such as 'd/'); rename the objects to relative "
            f"paths, or {CHECK}",
        ),
    ],
)
def test_a_listing_without_a_file_is_refused_saying_what_it_held(objects: list[ObjectInfo], message: str) -> None:
    with pytest.raises(EmptyListing) as refused:
        freeze_listing(URI, objects, CHUNK)
    assert str(refused.value) == message


@pytest.mark.expected_warnings
def test_keys_left_out_of_a_kept_dataset_are_logged_once_with_their_count(caplog: pytest.LogCaptureFixture) -> None:
    objects = [_obj("train/good.jpg"), *(_obj(f"/train/img{i}.jpg") for i in range(2_000))]
    manifest = freeze_listing(URI, objects, CHUNK)
    assert manifest.paths == ["train/good.jpg"]
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.getMessage() == (
        f"{URI}: 2,000 of the 2,001 objects listed are left out of the dataset, since no path below a mount point "
        "can name them: keys with an empty, '.' or '..' component, such as '/train/img0.jpg', '/train/img1.jpg', "
        "'/train/img2.jpg'"
    )
    assert getattr(warning, "dataset_uri", None) == URI


def test_a_listing_that_skips_nothing_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    assert freeze_listing(URI, [_obj("a"), _obj("b/c")], CHUNK).paths == ["a", "b/c"]
    assert not [r for r in caplog.records if r.name == "silodlib.manifest"]


def test_encoding_round_trips_and_the_digest_identifies_the_numbering() -> None:
    objects = [_obj("train/ünï cöde ✓.jpg", 5), _obj("train/b", 2 * CHUNK), _obj("e", is_dir=True)]
    manifest = build_manifest(objects, CHUNK)
    decoded = Manifest.decode(manifest.encode())
    assert decoded.paths == manifest.paths
    assert list(decoded.sizes) == list(manifest.sizes)
    assert list(decoded.mtimes_ns) == list(manifest.mtimes_ns)
    assert decoded.versions == manifest.versions
    assert decoded.empty_dirs == manifest.empty_dirs
    assert decoded.item_count == manifest.item_count
    assert decoded.digest == manifest.digest
    assert build_manifest(objects, 2 * CHUNK).digest != manifest.digest


def test_encoding_is_compact_for_many_files() -> None:
    objects = [_obj(f"train/n{i // 1000:05d}/n{i:08d}.JPEG", 110_000) for i in range(20_000)]
    encoded = build_manifest(objects, 4 << 20).encode()
    assert len(encoded) < 20_000 * 20  # well under the ~60 bytes of raw text per entry


@pytest.mark.parametrize("data", [b"garbage", b"silod-manifest/1\nnot zlib"])
def test_decode_refuses_bytes_that_are_not_a_manifest(data: bytes) -> None:
    with pytest.raises(ManifestError):
        Manifest.decode(data)


def test_item_extents_cover_every_byte_of_every_file_once() -> None:
    manifest = build_manifest([_obj("a", 2 * CHUNK + 5), _obj("b", 0), _obj("c", CHUNK)], CHUNK)
    extents = [manifest.item_extent(i) for i in range(manifest.item_count)]
    assert extents == [(0, 0, CHUNK), (0, CHUNK, CHUNK), (0, 2 * CHUNK, 5), (1, 0, 0), (2, 0, CHUNK)]
    assert [manifest.item_size(i) for i in range(manifest.item_count)] == [e[2] for e in extents]
    with pytest.raises(IndexError):
        manifest.item_extent(manifest.item_count)


def test_the_largest_item_is_the_biggest_file_or_the_chunk_size() -> None:
    assert build_manifest([_obj("a", 10), _obj("b", 300)], CHUNK).largest_item == 300
    assert build_manifest([_obj("a", 10), _obj("b", 3 * CHUNK)], CHUNK).largest_item == CHUNK


def test_items_covering_a_read_are_clipped_at_the_end_of_the_file() -> None:
    manifest = build_manifest([_obj("a", 10), _obj("b", 2 * CHUNK + 5)], CHUNK)  # b owns items 1, 2, 3
    assert manifest.items_covering(1, 0, 1) == range(1, 2)
    assert manifest.items_covering(1, CHUNK - 1, 2) == range(1, 3)
    assert manifest.items_covering(1, CHUNK, 10 * CHUNK) == range(2, 4)
    assert not manifest.items_covering(1, 2 * CHUNK + 5, 100)  # at the end: nothing


def test_modification_times_past_what_64_bit_nanoseconds_hold_are_the_nearest_they_hold() -> None:
    # ext4 keeps times up to 2446; a manifest (and the kernel's inode) nanoseconds up to 2262 and from 1677.
    times = [2**63 + 5, -(2**63) - 5, 1_700_000_000 * 10**9]
    objects = [ObjectInfo(f"f{i}", 10, "v", ns) for i, ns in enumerate(times)]
    manifest = build_manifest(objects, CHUNK)
    assert list(manifest.mtimes_ns) == [2**63 - 1, -(2**63), times[2]]
    assert Manifest.decode(manifest.encode()).digest == manifest.digest
