"""The GPU check: a training job on a GPU node reading from the mount, against the same job reading local disk.

ResNet-50 (torchvision, random weights) trains with bf16 autocast and channels_last at batch 256 on an
ImageFolder of `--images` JPEGs (default 40,000 of about 84 KB at 500 x 375, `bench/imagefolder.py`), read by a
DataLoader with each of `--workers` worker counts (default 12 and 16; ImageNet's training transform:
RandomResizedCrop(224), horizontal flip, ToTensor, Normalize; shuffled, pinned memory). Two sources alternate,
`--repeats` times (default 2), each run one epoch, timed over its steady state (`loader_waves.steady_window`:
whole waves of batches after the workers' first prefetches, some 110-130 steps at the default size):

- local: the folder on the node's disk (in its page cache: the node has the memory);
- mount: the same folder through a `silod mount` over `file://`, its cache quota holding the whole dataset,
  warmed before the first run: what a job sees once its dataset is cached on the node.

Per run: images/s; the GPU's busy share (the time between CUDA events recorded around each step, over the
wall time); the seconds the training loop was blocked waiting for the loader's next batch; and, for the
mount, the cores its process used. Also measured: the model alone (one batch held on the GPU: the ceiling
any loader can reach), and the cache fill: `--fill-readers` threads (default 16) reading every file once
through the cold mount, against the same threads reading the folder directly. After the runs it checks
that the mount fetched nothing while the jobs trained (every read a cache hit).

Needs a CUDA GPU with torch and torchvision (`--rehearse` runs without a GPU, training nothing, to try the
harness out first), and the mount's dependencies; on a GPU machine that cannot reach a package registry,
`bench/gpu_bundle.sh` here and `bench/gpu_setup.sh` there provide them
(docs/benchmarks.md, "The GPU check"). Progress goes to stderr, the tables (Markdown) to stdout, every
figure to `--json` if given (rewritten after each run, so a run cut short keeps what it measured).

    PYTHONPATH=/tmp/silod-site:. PATH=$PWD/.gpu-bundle/root/bin:$PATH python3 bench/pytorch_gpu.py \
        [--images N] [--workers 12,16] [--repeats N] [--fill-readers N] [--json PATH] [--rehearse]
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms

from bench.imagefolder import make_images
from bench.loader_waves import PREFETCH, fewest_batches, steady_window
from bench.procstat import cpu_seconds
from tests.mount_fixtures import MountProcess

BATCH = 256
TRAIN = transforms.Compose(
    [
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    ]
)
JOB = "train"


GpuSeconds = Callable[[], float]  # reads the GPU time of a step, once the steps are finished


class Learner(Protocol):
    """What the harness trains with: `Trainer` on a GPU, or `Rehearsal` without one."""

    device: str

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None: ...

    def timed_step(self, images: torch.Tensor, labels: torch.Tensor) -> GpuSeconds: ...

    def finish(self) -> None: ...

    def alone(self, steps: int) -> float | None: ...


class Trainer:
    """ResNet-50 training steps on one GPU in bf16 and channels_last; one model for the whole benchmark."""

    def __init__(self) -> None:
        torch.backends.cudnn.benchmark = True
        self.device = f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPUs"
        self.model = models.resnet50().cuda().to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        labels = labels.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.loss(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def timed_step(self, images: torch.Tensor, labels: torch.Tensor) -> GpuSeconds:
        """`step` between two CUDA events; returns how to read the time between them once `finish` returned."""
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        self.step(images, labels)
        end.record()
        return lambda: float(begin.elapsed_time(end)) / 1000

    def finish(self) -> None:
        """Wait for the GPU to run every step queued so far."""
        torch.cuda.synchronize()

    def alone(self, steps: int) -> float:
        """Images/s with one batch held on the GPU: the rate no loader can raise."""
        images = torch.randn(BATCH, 3, 224, 224, device="cuda")
        labels = torch.randint(0, 1000, (BATCH,), device="cuda")
        for _ in range(10):
            self.step(images, labels)
        self.finish()
        started = time.perf_counter()
        for _ in range(steps):
            self.step(images, labels)
        self.finish()
        return steps * BATCH / (time.perf_counter() - started)


class Rehearsal:
    """Stands in for `Trainer` where there is no GPU (`--rehearse`): it takes each batch and does nothing with it,
    so that the whole harness (the images, the mount, the loaders, the timing) can run before GPU time is spent
    on it. Its rates are the loaders' alone, and the GPU's share is 0."""

    def __init__(self) -> None:
        self.device = f"no GPU (a rehearsal), {os.cpu_count()} CPUs"

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        pass

    def timed_step(self, images: torch.Tensor, labels: torch.Tensor) -> GpuSeconds:
        return lambda: 0.0

    def finish(self) -> None:
        pass

    def alone(self, steps: int) -> None:
        return None


def learner(rehearse: bool) -> Learner:
    """A `Rehearsal` if asked for one, else a `Trainer`; exits 2 if that needs a GPU that torch does not see."""
    if rehearse:
        return Rehearsal()
    if not torch.cuda.is_available():
        print(
            f"{Path(sys.argv[0]).name}: needs a CUDA GPU, and torch sees none (--rehearse runs without)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return Trainer()


@dataclass(frozen=True)
class Run:
    """One timed stretch of training from one source."""

    source: str
    workers: int
    repeat: int
    images: int
    seconds: float
    gpu_seconds: float  # between the CUDA events around each step
    blocked_seconds: float  # waiting for the loader's next batch
    mount_cpu_seconds: float | None

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds

    @property
    def gpu_busy(self) -> float:
        return self.gpu_seconds / self.seconds

    @property
    def mount_cores(self) -> float | None:
        return None if self.mount_cpu_seconds is None else self.mount_cpu_seconds / self.seconds


def fewest_images(workers: int) -> int:
    """The smallest dataset whose epoch `steady_window` can time with `workers` loader workers."""
    return fewest_batches(workers) * BATCH


def loader_for(root: Path, workers: int) -> DataLoader[Any]:
    return DataLoader(
        datasets.ImageFolder(str(root), TRAIN), batch_size=BATCH, shuffle=True, num_workers=workers,
        pin_memory=torch.cuda.is_available(), drop_last=True, persistent_workers=True, prefetch_factor=PREFETCH,
    )  # fmt: skip


def train(trainer: Learner, root: Path, source: str, workers: int, repeat: int, mount_pid: int | None) -> Run:
    """One epoch of training on the ImageFolder at `root`, measured over its steady state (`steady_window`)."""
    loader = loader_for(root, workers)
    first, last = steady_window(len(loader), workers)
    marks: list[GpuSeconds] = []
    blocked = started = finished = cpu_started = cpu_finished = 0.0
    batches = iter(loader)
    for index in range(last + 1):
        waiting = time.perf_counter()
        images, labels = next(batches)
        arrived = time.perf_counter()
        if index == first:
            started, cpu_started = arrived, cpu_seconds(mount_pid) if mount_pid else 0.0
        elif index > first:
            blocked += arrived - waiting
        if index == last:
            finished, cpu_finished = arrived, cpu_seconds(mount_pid) if mount_pid else 0.0
        if index > first:
            marks.append(trainer.timed_step(images, labels))
        else:
            trainer.step(images, labels)
    trainer.finish()
    del batches, loader  # its workers go now, not when the next run's are starting
    gpu = sum(seconds() for seconds in marks)
    cpu = cpu_finished - cpu_started if mount_pid else None
    return Run(source, workers, repeat, (last - first) * BATCH, finished - started, gpu, blocked, cpu)


def read_files(paths: list[Path], threads: int) -> float:
    """Seconds for `threads` threads to read every file in `paths` once, whole."""

    def read(path: Path) -> None:
        with path.open("rb", buffering=0) as file:
            while file.read(1 << 20):
                pass

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, paths))
    return time.perf_counter() - started


def files_under(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


@dataclass
class Results:
    """Everything measured, written to `path` (if any) whenever it grows."""

    path: Path | None
    device: str = ""
    images: int = 0
    image_bytes: int = 0
    model_alone_images_per_sec: float | None = None  # None: not measured (a rehearsal)
    fill: dict[str, float] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    fetched_while_training_bytes: int | None = None
    counted_epochs: int | None = None

    def save(self) -> None:
        if self.path is not None:
            document = asdict(self)
            document.pop("path")
            self.path.write_text(json.dumps(document, indent=1) + "\n")


@dataclass(frozen=True)
class JobProgress:
    """What the mount's statistics say of the job at one moment."""

    seconds: float  # on the mount's monotonic clock
    fetched_bytes: int  # from the source, so far
    epoch: int  # the one in progress (which may have read every item already: it is closed at the next pass)
    completed_epochs: int
    epoch_hit_ratio: float  # of the epoch in progress, so far
    hit_ratios: dict[int, float]  # of the epochs it has closed


def job_progress(mount: MountProcess) -> JobProgress:
    """The job's progress from a statistics file written after now."""
    after = time.time()
    stats = mount.wait_for_stats(lambda s: s["written_at"] > after)
    job = stats["jobs"][JOB]
    access = job["access"]
    closed = {e["epoch"]: e["hit_bytes"] / e["accessed_bytes"] for e in job["finished_epochs"] if e["accessed_bytes"]}
    return JobProgress(
        stats["monotonic_seconds"], int(job["bytes_from_remote"]), int(access["epoch"]),
        int(access["completed_epochs"]), job["epoch_hit_ratio"], closed,
    )  # fmt: skip


def fill(mount: MountProcess, local: Path, readers: int, results: Results) -> None:
    """Read every file directly, then through the cold mount (which caches it): files/s of each."""
    direct = files_under(local)
    read_files(direct, readers)  # the source in the page cache, as it is for the mount's reads below
    direct_seconds = read_files(direct, readers)
    mounted = files_under(mount.job_dir(JOB))
    assert mount.process is not None
    cpu_before = cpu_seconds(mount.process.pid)
    mount_seconds = read_files(mounted, readers)
    cpu = cpu_seconds(mount.process.pid) - cpu_before
    results.fill = {
        "readers": readers,
        "direct_files_per_sec": len(direct) / direct_seconds,
        "mount_files_per_sec": len(mounted) / mount_seconds,
        "mount_cores": cpu / mount_seconds,
    }
    results.save()
    print(
        f"cache fill with {readers} readers: {len(mounted) / mount_seconds:,.0f} files/s through the mount, "
        f"{len(direct) / direct_seconds:,.0f} reading the folder directly",
        file=sys.stderr,
        flush=True,
    )


def benchmark(args: argparse.Namespace, trainer: Learner, work: Path, results: Results) -> None:
    local = work / "local" / JOB
    print(f"making {args.images} JPEGs ...", file=sys.stderr, flush=True)
    sizes = make_images(local, args.images, processes=os.cpu_count() or 1)
    results.images, results.image_bytes = len(sizes), sum(sizes.values())
    print(f"{len(sizes)} images, {results.image_bytes / 1e6:,.0f} MB", file=sys.stderr, flush=True)
    results.model_alone_images_per_sec = trainer.alone(steps=30)
    results.save()
    print(f"the model alone: {alone(results)}", file=sys.stderr, flush=True)
    uri = f"file://{local}"
    mount = MountProcess(work / "mount", {JOB: uri}, "--cache-size", f"{uri}={2 * results.image_bytes}").start()
    try:
        assert mount.process is not None
        fill(mount, local, args.fill_readers, results)
        before = job_progress(mount)
        for repeat in range(1, args.repeats + 1):
            for workers in args.workers:
                order = ("local", "mount") if repeat % 2 else ("mount", "local")
                for source in order:
                    root, pid = (local, None) if source == "local" else (mount.job_dir(JOB), mount.process.pid)
                    run = train(trainer, root, source, workers, repeat, pid)
                    results.runs.append(run)
                    results.save()
                    print(
                        f"  {source:<5} workers {workers:2d}  repeat {repeat}: {run.images_per_sec:7,.0f} images/s, "
                        f"GPU busy {run.gpu_busy:4.0%}, blocked {run.blocked_seconds:5.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        after = job_progress(mount)
        results.fetched_while_training_bytes = after.fetched_bytes - before.fetched_bytes
        results.counted_epochs = after.epoch - before.completed_epochs  # the passes begun since the fill
        results.save()
    finally:
        mount.stop()


def spread(values: list[float], form: Callable[[float], str]) -> str:
    """`low-high` of `values` (one value alone)."""
    low, high = form(min(values)), form(max(values))
    return low if low == high else f"{low}-{high}"


def row(workers: int, local: list[Run], mount: list[Run]) -> str:
    """The summary table's row for one worker count."""
    count, share, secs = (lambda v: f"{v:,.0f}"), (lambda v: f"{v:.0%}"), (lambda v: f"{v:.1f}")

    def pair(measure: Callable[[Run], float], form: Callable[[float], str]) -> str:
        return f"{spread([measure(r) for r in local], form)} / {spread([measure(r) for r in mount], form)}"

    speed = statistics.median(r.images_per_sec for r in mount) / statistics.median(r.images_per_sec for r in local)
    cores = [r.mount_cores for r in mount if r.mount_cores is not None]
    return (
        f"| {workers} | {spread([r.images_per_sec for r in local], count)} "
        f"| {spread([r.images_per_sec for r in mount], count)} | {speed:.2f} "
        f"| {pair(lambda r: r.gpu_busy, share)} | {pair(lambda r: r.blocked_seconds, secs)} "
        f"| {spread(cores, lambda v: f'{v:.2f}')} |"
    )


def alone(results: Results) -> str:
    rate = results.model_alone_images_per_sec
    return "not measured" if rate is None else f"{rate:,.0f} images/s"


def report(results: Results, workers_list: list[int]) -> None:
    print(f"{results.device}; {results.images} JPEGs of {results.image_bytes / results.images / 1e3:.0f} KB")
    print(f"model alone: {alone(results)}\n")
    print("| loader workers | local | mount, warm | mount / local (medians) | GPU busy, local / mount "
          "| seconds blocked on the loader, local / mount | mount's cores |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workers in workers_list:
        local = [r for r in results.runs if r.workers == workers and r.source == "local"]
        mount = [r for r in results.runs if r.workers == workers and r.source == "mount"]
        if local and mount:
            print(row(workers, local, mount))
    print(f"\nOne epoch of {BATCH}-image steps per run, timed over its steady state.")
    if results.fill:
        ratio = results.fill["mount_files_per_sec"] / results.fill["direct_files_per_sec"]
        print(
            f"Cache fill, {results.fill['readers']:.0f} readers: {results.fill['mount_files_per_sec']:,.0f} files/s "
            f"through the cold mount, {results.fill['direct_files_per_sec']:,.0f} reading the folder directly "
            f"({ratio:.2f}x), the mount using {results.fill['mount_cores']:.2f} cores."
        )
    if results.fetched_while_training_bytes is not None:
        print(
            f"Fetched by the mount while the jobs trained: {results.fetched_while_training_bytes:,} bytes; "
            f"epochs it counted: {results.counted_epochs}, for {sum(r.source == 'mount' for r in results.runs)} runs "
            "of an epoch through it."
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=40_000)
    parser.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[12, 16])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--fill-readers", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--rehearse", action="store_true", help="run without a GPU, training nothing (`Rehearsal`)")
    args = parser.parse_args()
    if args.images < fewest_images(max(args.workers)):
        parser.error(f"--images {args.images} is too few to time {max(args.workers)} workers: give at least "
                     f"{fewest_images(max(args.workers))}")  # fmt: skip
    trainer = learner(args.rehearse)
    results = Results(args.json, device=trainer.device)
    with tempfile.TemporaryDirectory(prefix="silod-gpu-") as work:
        benchmark(args, trainer, Path(work), results)
    report(results, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
