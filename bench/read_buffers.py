"""What files held open cost a mount's memory, and what streaming files costs its reads, build against build.

The daemon holds, for an open file, the bytes of items it fetched that the cache did not admit, so that the
kernel's many read requests for one item (128 KiB to 1 MiB each) cost one backend GET (`fuseclient/readpath.py`,
`ReadBuffers` in `fuseclient/read_buffers.py`). `--files` files (default 20) of `--size` bytes (default 8 MiB: two
chunks of 4 MiB, so a read at the start of one fetches the second ahead) are served from local disk as a file://
dataset, each scenario on a fresh mount:

- hold, quota 0 and quota all: open every file `--opens` times (default 3), read 4 KiB at its start through each
  open and keep them all open, as loaders keeping a handle on every shard (np.memmap, h5py, LMDB) do; the daemon's
  resident memory then, over what it was before the opens;
- stream, quota 0: read every file front to back (1 MiB reads) through one open each, closed after it, 4 times
  over; MB/s and backend GETs per item read (1.00: each item fetched once per open);
- stream, budget spent, quota 0: the same with the hold scenario's opens held meanwhile.

Every scenario runs `--rounds` times (default 3) for each build, the builds alternating, and the medians are
printed, with each build's MB/s over the first's. `--build NAME=PATH` (repeatable) runs the daemon with
PYTHONPATH=PATH, a checkout of another build; without it, the current tree only.

    PYTHONPATH=. .venv/bin/python bench/read_buffers.py [--build before=/tmp/old --build after=.] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from datamgr.devservers import free_port
from silodcli.tables import render_table
from silodlib.manifest import DEFAULT_CHUNK_SIZE
from tests.mount_fixtures import MountProcess
from tests.test_metrics import samples

PROBE = 4096  # what a loader reads of each file it holds open
READ = 1 << 20  # a streaming reader's read size
STREAM_PASSES = 4  # over the dataset, so that a stream is timed over a second or so
MiB = 1 << 20


@dataclass(frozen=True)
class Build:
    name: str
    path: Path


@dataclass(frozen=True)
class Sample:
    rss_growth: float  # bytes the daemon's resident memory grew by in the scenario
    mb_per_sec: float | None  # of a stream, None for a hold
    gets_per_item: float | None


@dataclass(frozen=True)
class Dataset:
    root: Path
    names: list[str]
    size: int
    items: int  # in all its files

    @property
    def uri(self) -> str:
        return f"file://{self.root}"


def make_dataset(root: Path, files: int, size: int) -> Dataset:
    """`files` files of `size` random bytes under `root`, items of the default chunk."""
    rng = random.Random(0)
    names = [f"shard{i:04d}.bin" for i in range(files)]
    root.mkdir(parents=True)
    for name in names:
        (root / name).write_bytes(rng.randbytes(size))
    return Dataset(root, names, size, files * -(-size // DEFAULT_CHUNK_SIZE))


class Mounted:
    """`silod mount` of the dataset run by one build, with its metrics on a port of its own."""

    def __init__(self, work: Path, build: Build, dataset: Dataset, quota: int) -> None:
        self.port = free_port()
        self.process = MountProcess(
            work, {"job": dataset.uri}, "--cache-size", f"{dataset.uri}={quota}", "--metrics-port", str(self.port),
            launcher=("env", f"PYTHONPATH={build.path}"),
        )  # fmt: skip
        self.root = self.process.job_dir("job")

    @contextlib.contextmanager
    def serving(self) -> Iterator[Mounted]:
        self.process.start()
        try:
            yield self
        finally:
            self.process.stop()

    def rss(self) -> int:
        assert self.process.process is not None
        status = Path(f"/proc/{self.process.process.pid}/status").read_text()
        return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))

    def fetches(self, uri: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        return samples(text)[("silod_backend_read_seconds_count", (("dataset", uri),))]


@contextlib.contextmanager
def held_open(mount: Mounted, dataset: Dataset, opens: int) -> Iterator[None]:
    """Every file opened `opens` times, `PROBE` bytes read through each open, all kept open."""
    with contextlib.ExitStack() as stack:
        for _ in range(opens):
            for name in dataset.names:
                fd = os.open(mount.root / name, os.O_RDONLY)
                stack.callback(os.close, fd)
                if len(os.pread(fd, PROBE, 0)) != PROBE:
                    raise RuntimeError(f"short read of {name}")
        yield


def stream(mount: Mounted, dataset: Dataset) -> tuple[float, float]:
    """Every file read front to back through one open each, `STREAM_PASSES` times: MB/s, and backend GETs per item
    read (uncached, each pass fetches every item)."""
    fetched = mount.fetches(dataset.uri)
    started = time.perf_counter()
    for _ in range(STREAM_PASSES):
        for name in dataset.names:
            with (mount.root / name).open("rb", buffering=0) as file:
                while file.read(READ):
                    pass
    seconds = time.perf_counter() - started
    gets = mount.fetches(dataset.uri) - fetched
    return STREAM_PASSES * len(dataset.names) * dataset.size / seconds / 1e6, gets / STREAM_PASSES / dataset.items


def hold(work: Path, build: Build, dataset: Dataset, opens: int, quota: int) -> Sample:
    with Mounted(work, build, dataset, quota).serving() as mount:
        before = mount.rss()
        with held_open(mount, dataset, opens):
            return Sample(mount.rss() - before, None, None)


def streamed(work: Path, build: Build, dataset: Dataset, opens: int, spent: bool) -> Sample:
    with Mounted(work, build, dataset, 0).serving() as mount:
        before = mount.rss()
        with held_open(mount, dataset, opens if spent else 0):
            rate, gets = stream(mount, dataset)
            return Sample(mount.rss() - before, rate, gets)


Scenario = Callable[[Path, Build, Dataset, int], Sample]
SCENARIOS: dict[str, Scenario] = {
    "hold, quota 0": lambda work, build, dataset, opens: hold(work, build, dataset, opens, 0),
    "hold, quota all": lambda work, build, dataset, opens: hold(work, build, dataset, opens, 1 << 40),
    "stream": lambda work, build, dataset, opens: streamed(work, build, dataset, opens, spent=False),
    "stream, budget spent": lambda work, build, dataset, opens: streamed(work, build, dataset, opens, spent=True),
}


def benchmark(work: Path, builds: list[Build], dataset: Dataset, opens: int, rounds: int) -> list[tuple[str, ...]]:
    results: dict[tuple[str, str], list[Sample]] = {}
    mounts = itertools.count()
    for round_number in range(rounds):
        for scenario, run in SCENARIOS.items():
            for build in builds:
                sample = run(work / f"mount{next(mounts)}", build, dataset, opens)
                results.setdefault((scenario, build.name), []).append(sample)
                print(f"  round {round_number + 1} {scenario:<21} {build.name:<8} {sample}", file=sys.stderr)
    rows: list[tuple[str, ...]] = []
    for scenario in SCENARIOS:
        first = _median([s.mb_per_sec for s in results[scenario, builds[0].name]])
        for build in builds:
            samples_ = results[scenario, build.name]
            rate = _median([s.mb_per_sec for s in samples_])
            gets = _median([s.gets_per_item for s in samples_])
            rows.append((
                scenario,
                build.name,
                f"{statistics.median(s.rss_growth for s in samples_) / MiB:.0f}",
                "-" if rate is None else f"{rate:.0f}",
                "-" if rate is None or first is None else f"{rate / first:.2f}",
                "-" if gets is None else f"{gets:.2f}",
            ))  # fmt: skip
    return rows


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _build(text: str) -> Build:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} must be NAME=PATH")
    return Build(name, Path(path).resolve())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=_build, action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--size", type=int, default=8 * MiB, metavar="BYTES")
    parser.add_argument("--opens", type=int, default=3, help="opens of each file held (default 3)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    builds = args.build or [Build("this", Path(__file__).resolve().parents[1])]
    with tempfile.TemporaryDirectory(prefix="silod-read-buffers-") as work:
        dataset = make_dataset(Path(work) / "dataset", args.files, args.size)
        rows = benchmark(Path(work), builds, dataset, args.opens, args.rounds)
    header = ("SCENARIO", "BUILD", "RSS GROWTH MIB", "MB/S", "VS FIRST", "GETS PER ITEM")
    print(render_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
