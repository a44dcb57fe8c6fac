"""The frozen manifest: item numbering, POSIX-shape checks, and a lossless compact encoding."""

from __future__ import annotations

import pytest

from silodlib.backends.base import ObjectInfo
from silodlib.manifest import Manifest, ManifestError, build_manifest, items_in_file

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
    ("keys", "fragment"),
    [
        (["a", "a/b"], "'a' is both a file and a folder"),
        (["a//b"], "empty, '.' or '..'"),
        (["a/../b"], "empty, '.' or '..'"),
        (["x" * 256], "longer than 255 bytes"),
        (["nul\0byte"], "NUL"),
    ],
)
def test_listings_a_posix_tree_cannot_show_are_refused_by_key(keys: list[str], fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        build_manifest([_obj(k) for k in keys], CHUNK)


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
