"""SiloDPerf against a real training job on a GPU: does `min(f*, b / (1 - c/d))` predict how fast it trains?

The job is `bench/pytorch_gpu.py`'s: ResNet-50 in bf16 on one GPU, a DataLoader with `--workers` workers (default
16) over an ImageFolder of `--images` JPEGs (default 30,000 of about 84 KB). First it trains `--epochs` epochs
(default 3) from local disk, which gives f*, the rate of the job with nothing to wait for but its own loader and
GPU. Then a fresh `silod mount` serves the same folder over `file://` as the "remote" source, with a cache quota of
`--cache-share` of the dataset (default 0.5: c/d) and the job's remote reads throttled to b (default: a quarter of
f*, so that the job is IO-bound in every epoch), and the job trains `--epochs` epochs from it.

Per epoch it compares the measured rate (the images' bytes over the time, in the epoch's steady state: after the
batches the workers load together as it starts) with SiloDPerf at the epoch's hit ratio as the mount
measured it, and with the c/d a scheduler plans with: the first epoch starts with an empty cache (hit ratio 0,
predicted rate b), the later ones find c/d of the dataset cached (predicted `min(f*, b / (1 - c/d))`). It also
shows the bytes the mount fetched per second over each whole epoch, from its own statistics: the throttle's
check, at most b whatever the timing window.

Needs what `bench/pytorch_gpu.py` needs (docs/benchmarks.md, "The GPU check"); `--rehearse` runs it without a GPU,
training nothing, to try the harness out before GPU time is spent on it. Progress goes to stderr, the table
(Markdown) to stdout, every figure to `--json` if given.

    PYTHONPATH=/tmp/silod-site:. PATH=$PWD/.gpu-bundle/root/bin:$PATH python3 bench/gpu_estimator.py \
        [--images N] [--workers N] [--epochs N] [--cache-share F] [--io-share F] [--json PATH] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.imagefolder import make_images
from bench.loader_waves import steady_window
from bench.pytorch_gpu import BATCH, JOB, JobProgress, Learner, fewest_images, job_progress, learner, loader_for
from datamgr.scheduler.perf import rate_at_hit_ratio
from tests.mount_fixtures import MountProcess


@dataclass(frozen=True)
class Epoch:
    source: str
    epoch: int
    images: int  # in the epoch's steady state (`train_epochs`)
    seconds: float

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds


def _nothing() -> None:
    pass


def train_epochs(
    trainer: Learner, root: Path, source: str, workers: int, epochs: int, after_epoch: Callable[[], None] = _nothing
) -> list[Epoch]:
    """Train `epochs` epochs on the ImageFolder at `root`, timing each one's steady state (`steady_window`);
    `after_epoch` runs after each one."""
    loader = loader_for(root, workers)
    first, last = steady_window(len(loader), workers)
    results = []
    for epoch in range(1, epochs + 1):
        started = finished = 0.0
        for index, (batch, labels) in enumerate(loader):
            if index == first:
                started = time.perf_counter()
            elif index == last:
                finished = time.perf_counter()
            trainer.step(batch, labels)
        trainer.finish()
        result = Epoch(source, epoch, (last - first) * BATCH, finished - started)
        results.append(result)
        print(f"  {source:<5} epoch {epoch}: {result.images_per_sec:7,.0f} images/s", file=sys.stderr, flush=True)
        after_epoch()
    del loader
    return results


def epoch_hit_ratio(epoch: int, right_after: JobProgress, last: JobProgress) -> float | None:
    """Epoch `epoch`'s hit ratio: as the mount closed it, else as it stood when the epoch's reads were done (the
    mount closes an epoch only once the next one is well under way, in case a straggler of it comes late)."""
    if epoch in last.hit_ratios:
        return last.hit_ratios[epoch]
    return right_after.epoch_hit_ratio if right_after.epoch == epoch else None


def measure(args: argparse.Namespace, trainer: Learner, work: Path) -> dict[str, Any]:
    """Train from local disk (f*), then from a throttled mount with a partial cache; every figure, by name."""
    local = work / "local" / JOB
    sizes = make_images(local, args.images, processes=os.cpu_count() or 1)
    image_bytes = sum(sizes.values()) / len(sizes)
    trainer.alone(steps=5)  # cuDNN picks its kernels now, not in the first epoch
    local_epochs = train_epochs(trainer, local, "local", args.workers, args.epochs)
    steady = local_epochs[1:] or local_epochs  # the first also reads the folder into the page cache
    ideal = statistics.mean(e.images_per_sec for e in steady) * image_bytes  # f*, bytes/s
    io = args.io_share * ideal
    uri = f"file://{local}"
    quota = int(args.cache_share * sum(sizes.values()))
    mount = MountProcess(work / "mount", {JOB: uri}, "--cache-size", f"{uri}={quota}", "--io-rate", f"{JOB}={int(io)}")
    mount.start()
    try:
        progress = [job_progress(mount)]

        def count() -> None:
            progress.append(job_progress(mount))

        mount_epochs = train_epochs(trainer, mount.job_dir(JOB), "mount", args.workers, args.epochs, count)
    finally:
        mount.stop()
    rows = []
    for epoch in mount_epochs:
        before, after = progress[epoch.epoch - 1], progress[epoch.epoch]
        hit = epoch_hit_ratio(epoch.epoch, after, progress[-1])
        fetched = (after.fetched_bytes - before.fetched_bytes) / (after.seconds - before.seconds)
        rows.append(
            {
                **asdict(epoch),
                "measured_bytes_per_sec": epoch.images_per_sec * image_bytes,
                "hit_ratio": hit,
                "predicted_at_hit_ratio": None if hit is None else rate_at_hit_ratio(ideal, hit, io),
                "predicted_at_c_over_d": rate_at_hit_ratio(ideal, 0.0 if epoch.epoch == 1 else args.cache_share, io),
                # The throttle's check: over the whole epoch, its edges and the pause to read the statistics
                # included, so at most b.
                "fetched_bytes_per_sec": fetched,
            }
        )
    return {
        "device": trainer.device,
        "images": len(sizes),
        "image_bytes": image_bytes,
        "workers": args.workers,
        "ideal_bytes_per_sec": ideal,
        "io_bytes_per_sec": io,
        "cache_share": args.cache_share,
        "local": [asdict(e) for e in local_epochs],
        "mount": rows,
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"{report['device']}; {report['images']} JPEGs of {report['image_bytes'] / 1e3:.0f} KB, "
        f"{report['workers']} loader workers; f* {report['ideal_bytes_per_sec'] / 1e6:.1f} MB/s (from local disk), "
        f"b {report['io_bytes_per_sec'] / 1e6:.1f} MB/s, c/d {report['cache_share']:g}\n"
    )
    print(
        "| epoch | hit ratio (mount) | measured MB/s | SiloDPerf at that hit ratio | at c/d | measured / predicted "
        "| fetched MB/s, whole epoch |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in report["mount"]:
        hit, at_hit, measured = row["hit_ratio"], row["predicted_at_hit_ratio"], row["measured_bytes_per_sec"]
        known = hit is not None and at_hit is not None
        print(
            f"| {row['epoch']} | {f'{hit:.3f}' if known else '-'} | {measured / 1e6:.1f} "
            f"| {f'{at_hit / 1e6:.1f}' if known else '-'} | {row['predicted_at_c_over_d'] / 1e6:.1f} "
            f"| {f'{measured / at_hit:.3f}' if known else '-'} | {row['fetched_bytes_per_sec'] / 1e6:.1f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=30_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cache-share", type=float, default=0.5, help="the cache quota over the dataset: c/d")
    parser.add_argument("--io-share", type=float, default=0.25, help="the remote IO rate b over f*")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--rehearse", action="store_true", help="run without a GPU, training nothing")
    args = parser.parse_args()
    if args.images < fewest_images(args.workers):
        parser.error(f"--images {args.images} is too few to time {args.workers} workers: give at least "
                     f"{fewest_images(args.workers)}")  # fmt: skip
    trainer = learner(args.rehearse)
    with tempfile.TemporaryDirectory(prefix="silod-estimator-") as work:
        report = measure(args, trainer, Path(work))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
