"""The real-client benchmark: PyTorch's DataLoader over an ImageFolder, through the mount and without it.

An ImageFolder of `--images` JPEGs (default 3,000 of about 70 KB, in 10 class folders) is put in an S3
server (moto, on loopback) and in a local directory. For each `--workers` count (default 2 and 4), a
DataLoader (batch 64, shuffle, RandomResizedCrop(224) + ToTensor, as an ImageNet training script) reads it,
and each epoch is timed in images/s, side by side in one run:

- local: `ImageFolder` on the local copy, 2 epochs (the second from the page cache);
- boto3: a Dataset that `get_object`s and decodes each image, 1 epoch (what a job without a mount does);
- mount 100 %: a fresh `silod mount` whose cache quota holds the whole dataset: epoch 1 cold, 2 and 3 warm;
- mount 50 %: a fresh mount with half of it: 2 epochs, the second at a 50 % hit ratio;
- with `--drop-caches` (root): local and mount 100 %, 2 epochs each after the warm-up, each epoch after
  `echo 3 > /proc/sys/vm/drop_caches`: the regime of a dataset larger than the node's memory.

For the mount it also shows the mount process's CPU milliseconds per file. Then the ratios the goals are
stated in: warm mount / local, cold mount / boto3, 50 % mount / local, and dropped-cache warm mount /
dropped-cache local. Needs torch and torchvision: `make bench-pytorch` installs them into `.venv-pytorch`
(the suite itself stays torch-free) and runs

    PYTHONPATH=. .venv-pytorch/bin/python bench/pytorch_loader.py [--images N] [--workers 2,4] [--drop-caches]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

from bench.epoch_read import drop_caches, settle
from bench.imagefolder import make_images
from bench.procstat import cpu_seconds
from tests.mount_fixtures import MountProcess, options_args
from tests.storage_servers import S3Server, running_s3_server, s3_client

BATCH = 64
BUCKET = "imagenet-mini"
TRAIN = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])


@dataclass(frozen=True)
class Epoch:
    source: str
    workers: int
    epoch: int
    seconds: float
    images: int
    mount_cpu: float | None = None  # seconds of the mount process's CPU in the epoch

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds

    @property
    def cpu_ms_per_file(self) -> float | None:
        return None if self.mount_cpu is None else 1000 * self.mount_cpu / self.images


class Boto3Images(Dataset[tuple[torch.Tensor, int]]):
    """An ImageFolder read with boto3 `get_object` in each worker: what a job without a mount does."""

    def __init__(self, server: S3Server, keys: list[str]) -> None:
        self.server, self.keys = server, keys
        self.classes = sorted({key.split("/")[0] for key in keys})
        self._client: Any = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._client is None:  # one client per worker process, made after the fork
            self._client = s3_client(self.server)
        key = self.keys[index]
        data = self._client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        image = Image.open(io.BytesIO(data)).convert("RGB")
        return TRAIN(image), self.classes.index(key.split("/")[0])


def image_folder(root: Path) -> datasets.ImageFolder:
    return datasets.ImageFolder(str(root), TRAIN)


def run_epochs(
    source: str, dataset: Dataset[Any], workers: int, epochs: int, *, mount_pid: int | None = None,
    before_epoch: Callable[[], None] = settle,
) -> list[Epoch]:  # fmt: skip
    """Time `epochs` passes of a DataLoader over `dataset`; each starts after `before_epoch()`."""
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=False)
    results = []
    for epoch in range(1, epochs + 1):
        before_epoch()
        cpu_before = cpu_seconds(mount_pid) if mount_pid else 0.0
        started = time.monotonic()
        images = sum(len(labels) for _, labels in loader)
        seconds = time.monotonic() - started
        cpu = cpu_seconds(mount_pid) - cpu_before if mount_pid else None
        results.append(Epoch(source, workers, epoch, seconds, images, cpu))
        print(f"  {source:<16} workers {workers}  epoch {epoch}: {images / seconds:7.1f} images/s", file=sys.stderr)
    return results


@contextmanager
def mounted(work: Path, name: str, server: S3Server, quota: int) -> Iterator[MountProcess]:
    """A fresh `silod mount` of the bucket as job "train" with a cache quota of `quota` bytes."""
    uri = f"s3://{BUCKET}/train"
    mount = MountProcess(work / name, {"train": uri}, "--cache-size", f"{uri}={quota}",
                         *options_args(server.backend_options()))  # fmt: skip
    mount.start()
    try:
        yield mount
    finally:
        mount.stop()
        shutil.rmtree(work / name / "cache", ignore_errors=True)


def benchmark(work: Path, server: S3Server, count: int, workers_list: list[int], drop: bool) -> list[Epoch]:
    local = work / "local" / "train"
    print(f"making {count} JPEGs ...", file=sys.stderr)
    sizes = make_images(local, count, processes=os.cpu_count() or 1)
    total = sum(sizes.values())
    print(f"{count} images, {total / 1e6:.0f} MB ({total / count / 1e3:.0f} KB each)", file=sys.stderr)
    client = s3_client(server)
    client.create_bucket(Bucket=BUCKET)

    def upload(key: str) -> None:
        client.put_object(Bucket=BUCKET, Key=f"train/{key}", Body=(local / key).read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(upload, sizes))
    keys = sorted(f"train/{key}" for key in sizes)
    results: list[Epoch] = []
    for workers in workers_list:
        results += run_epochs("local", image_folder(local), workers, 2)
        results += run_epochs("boto3", Boto3Images(server, keys), workers, 1)
        for name, quota, epochs in (("mount 100%", total, 3), ("mount 50%", total // 2, 2)):
            with mounted(work, f"m{workers}-{quota}", server, quota) as mount:
                assert mount.process is not None
                root = mount.job_dir("train")
                results += run_epochs(name, image_folder(root), workers, epochs, mount_pid=mount.process.pid)
        if drop:
            results += run_epochs("local, dropped", image_folder(local), workers, 2, before_epoch=drop_caches)
            with mounted(work, f"d{workers}", server, total) as mount:
                assert mount.process is not None
                root, pid = mount.job_dir("train"), mount.process.pid
                run_epochs("(warm-up)", image_folder(root), workers, 1, mount_pid=pid)
                results += run_epochs("mount, dropped", image_folder(root), workers, 2, mount_pid=pid,
                                      before_epoch=drop_caches)  # fmt: skip
    return results


def speed(results: list[Epoch], source: str, workers: int, epochs: tuple[int, ...]) -> float:
    """The median images/s of `source`'s `epochs` at `workers`."""
    return statistics.median(r.images_per_sec for r in results if (r.source, r.workers) == (source, workers)
                             and r.epoch in epochs)  # fmt: skip


def report(results: list[Epoch], workers_list: list[int], drop: bool) -> None:
    print("| source | workers | epoch | images/s | mount CPU ms/file |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        cpu = "" if r.cpu_ms_per_file is None else f"{r.cpu_ms_per_file:.2f}"
        print(f"| {r.source} | {r.workers} | {r.epoch} | {r.images_per_sec:.0f} | {cpu} |")
    print()
    print("| workers | warm / local | cold / boto3 | 50 % / local | dropped: warm / local |")
    print("| --- | --- | --- | --- | --- |")
    for w in workers_list:
        local = speed(results, "local", w, (2,))
        ratios = [
            speed(results, "mount 100%", w, (2, 3)) / local,
            speed(results, "mount 100%", w, (1,)) / speed(results, "boto3", w, (1,)),
            speed(results, "mount 50%", w, (2,)) / local,
        ]
        dropped = (
            f"{speed(results, 'mount, dropped', w, (1, 2)) / speed(results, 'local, dropped', w, (1, 2)):.2f}"
            if drop
            else "-"
        )
        print(f"| {w} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {dropped} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--workers", default="2,4", help="DataLoader num_workers values, comma-separated")
    parser.add_argument("--drop-caches", action="store_true", help="also the dropped-page-cache epochs (root)")
    args = parser.parse_args()
    workers_list = [int(w) for w in args.workers.split(",")]
    if args.drop_caches and os.geteuid() != 0:
        parser.error("--drop-caches needs root (it writes /proc/sys/vm/drop_caches)")
    torch.set_num_threads(1)  # the workers decode; the main process only collates
    with tempfile.TemporaryDirectory(prefix="silod-bench-pytorch-") as tmp, running_s3_server(Path(tmp)) as server:
        results = benchmark(Path(tmp), server, args.images, workers_list, args.drop_caches)
    report(results, workers_list, args.drop_caches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
