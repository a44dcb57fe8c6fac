"""Deterministic test datasets shaped like training data: many small files, a few large ones, odd names."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.storage_servers import DatasetTarget

EDGE_CASE_FILES = (
    "train/zero-byte.bin",
    "train/class a/ünïcode ✓.bin",
    "val/with space/sample 1.txt",
    "val/reserved chars/a+b=c&d%20~e;f,g@h$i!j'k(l).bin",
)
EMPTY_DIR = "val/empty folder"


@dataclass
class GeneratedDataset:
    """File contents by key (relative, '/'-separated) and explicit empty folders."""

    files: dict[str, bytes]
    empty_dirs: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(len(data) for data in self.files.values())


def generate_dataset(
    seed: int = 0,
    small_files: int = 120,
    small_size: tuple[int, int] = (1, 20_000),
    large_files: int = 2,
    large_size: int = 9 * 1024 * 1024 + 123,
    include_edge_cases: bool = True,
) -> GeneratedDataset:
    """The same dataset for the same arguments: random bytes in folders 2-3 levels deep.

    Large files are `large_size` bytes (by default not a multiple of any chunk size). Edge cases are a
    zero-byte file, names with spaces and non-ASCII characters, and one empty folder.
    """
    rng = random.Random(seed)
    folders = [
        f"{split}/class_{c:02d}" + (f"/part_{rng.randrange(3)}" if rng.random() < 0.5 else "")
        for split in ("train", "val")
        for c in range(6)
    ]
    files: dict[str, bytes] = {}
    for i in range(small_files):
        files[f"{rng.choice(folders)}/item_{i:05d}.bin"] = rng.randbytes(rng.randint(*small_size))
    for i in range(large_files):
        files[f"train/large/shard_{i:02d}.tar"] = rng.randbytes(large_size)
    empty_dirs: list[str] = []
    if include_edge_cases:
        files[EDGE_CASE_FILES[0]] = b""
        for key in EDGE_CASE_FILES[1:]:
            files[key] = rng.randbytes(rng.randint(*small_size))
        empty_dirs.append(EMPTY_DIR)
    return GeneratedDataset(files, empty_dirs)


def upload_dataset(target: DatasetTarget, dataset: GeneratedDataset) -> None:
    """Put every file and make every empty folder of `dataset` in `target`, a few requests at a time."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        puts = [pool.submit(target.put, key, data) for key, data in dataset.files.items()]
        dirs = [pool.submit(target.make_dir, key) for key in dataset.empty_dirs]
        for future in [*puts, *dirs]:
            future.result()
