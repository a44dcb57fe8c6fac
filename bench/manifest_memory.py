"""Client memory for an ImageNet-sized manifest: bytes per item the FUSE client holds for a dataset.

Builds a 1.28 M-file manifest with random MD5-like ETags, then, in a fresh process, measures the growth of
resident memory from before receiving the encoded manifest to holding what a mount keeps for the dataset:
the decoded manifest, its directory tree, one job's access bitset and the cache's item bitset. Target:
under 300 bytes per item.

    PYTHONPATH=. .venv/bin/python bench/manifest_memory.py [--files N]
"""

from __future__ import annotations

import argparse
import gc
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bitarray import bitarray

from fuseclient.access import AccessTracker
from fuseclient.tree import DatasetTree
from silodlib.backends.base import ObjectInfo
from silodlib.manifest import Manifest, build_manifest

IMAGENET_FILES = 1_281_167


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def write_manifest(path: Path, files: int) -> None:
    etags = random.Random(0).randbytes(16 * files).hex()
    objects = (
        ObjectInfo(
            f"train/n{i // 1300:08d}/n{i // 1300:08d}_{i}.JPEG", 110_000 + i % 5000, etags[32 * i : 32 * i + 32], i
        )
        for i in range(files)
    )
    path.write_bytes(build_manifest(objects).encode())


def measure(path: Path) -> None:
    """Run in a fresh process: RSS growth from the encoded bytes to the mount's per-dataset structures."""
    gc.collect()
    before = rss_bytes()
    started = time.monotonic()
    manifest = Manifest.decode(path.read_bytes())
    tree = DatasetTree(manifest)
    tracker = AccessTracker(manifest.item_count)
    cached = bitarray(manifest.item_count)
    cached.setall(0)
    loaded = time.monotonic() - started
    gc.collect()
    grown = rss_bytes() - before
    items = manifest.item_count
    print(f"{items} items in {manifest.file_count} files, {len(tree.dirs)} directories; loaded in {loaded:.1f} s")
    print(f"client memory: {grown / 2**20:.1f} MiB = {grown / items:.0f} bytes per item (target < 300)")
    assert tracker.epoch == 1 and not cached.any()  # keep them alive until measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=IMAGENET_FILES)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child process's half
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return 0
    with tempfile.TemporaryDirectory(prefix="silod-bench-") as tmp:
        path = Path(tmp) / "manifest.bin"
        write_manifest(path, args.files)
        print(
            f"encoded manifest: {path.stat().st_size / 2**20:.1f} MiB ({path.stat().st_size / args.files:.1f} B/file)"
        )
        return subprocess.run([sys.executable, __file__, "--measure", str(path)], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
