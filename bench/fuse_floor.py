"""Where a warm mount's time goes: silod against the floor of its FUSE stack and of a compiled daemon.

A DataLoader-style reader (`--workers` forked processes, default 2 and 4, each opening, reading whole and
closing its share of the files in a fresh shuffled order) reads `--files` files (default 3,000 of 80 KB) from:

- local disk: the files themselves (the ceiling);
- silod: `silod mount` of the same directory as a `file://` dataset, its cache holding all of it (one cold
  epoch first, untimed, to fill it);
- pyfuse3 mirror (`bench/mirror_fs/pyfuse3_mirror.py`): the same stack as silod, pyfuse3 and trio, doing
  nothing but answer: the floor of that stack;
- C mirror (`bench/mirror_fs/mirror_ll.c`, built here with gcc against libfuse3): libfuse's low-level API
  in one thread: what a compiled daemon costs. Its row says why when it cannot be built.

Every source is timed warm (two epochs from the page cache) and, as root, with the page cache dropped before
each of two epochs (the regime of a dataset larger than the node's memory). For each it prints files/s,
the ratio to local disk in the same regime, and the daemon's CPU microseconds per file (user + system, from
/proc). Each file costs a warm mount two requests (open and release; `keep_cache` lets the kernel serve
the bytes) and a cold one four (lookup, open, read, release), so the pyfuse3 mirror's CPU per file is what
any daemon on that stack pays, however little it does.

    PYTHONPATH=. .venv/bin/python bench/fuse_floor.py [--files N] [--size BYTES] [--workers 2,4]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.epoch_read import drop_caches, settle
from bench.procstat import cpu_seconds
from silodcli.tables import render_table
from tests.mount_fixtures import MountProcess, is_live_mount

HERE = Path(__file__).resolve().parent
PYFUSE3_MIRROR = HERE / "mirror_fs" / "pyfuse3_mirror.py"
C_MIRROR = HERE / "mirror_fs" / "mirror_ll.c"
EPOCHS = 2
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Source:
    """Something to read the files from: its root, and the daemon serving it (None: local disk)."""

    name: str
    root: Path
    daemon_pid: int | None


@dataclass(frozen=True)
class Row:
    source: str
    regime: str
    workers: int
    files_per_sec: float
    cpu_us_per_file: float | None


def make_files(root: Path, count: int, size: int) -> list[str]:
    """`count` files of `size` random bytes in 10 folders, as an ImageFolder; their relative paths."""
    rng = random.Random(0)
    names = [f"class{i % 10}/file{i:06d}.bin" for i in range(count)]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(rng.randbytes(size))
    return names


def read_epoch(root: Path, names: list[str], workers: int, seed: int) -> float:
    """Forked readers (as DataLoader workers) each open, read whole and close every `workers`-th file of a
    shuffled order; the epoch's seconds."""
    order = list(names)
    random.Random(seed).shuffle(order)
    started = time.monotonic()
    children = []
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            status = 0
            try:
                for name in order[worker::workers]:
                    with open(root / name, "rb") as file:
                        file.read()
            except BaseException:
                status = 1
            os._exit(status)
        children.append(pid)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} readers of {root} failed")
    return time.monotonic() - started


def measure(source: Source, names: list[str], workers: int, regime: str, before_epoch: Callable[[], None]) -> Row:
    seconds = cpu = 0.0
    for epoch in range(EPOCHS):
        before_epoch()
        cpu_before = cpu_seconds(source.daemon_pid) if source.daemon_pid else 0.0
        seconds += read_epoch(source.root, names, workers, seed=epoch)
        cpu += cpu_seconds(source.daemon_pid) - cpu_before if source.daemon_pid else 0.0
    files = EPOCHS * len(names)
    per_file = cpu / files * 1e6 if source.daemon_pid else None
    row = Row(source.name, regime, workers, files / seconds, per_file)
    cpu_text = "" if per_file is None else f", daemon {per_file:.0f} us CPU per file"
    speed = f"{row.files_per_sec:7.0f} files/s"
    print(f"  {source.name:<15} {regime:<7} workers {workers}: {speed}{cpu_text}", file=sys.stderr)
    return row


@contextmanager
def mirror(name: str, argv: list[str], root: Path) -> Iterator[Source]:
    """A mirror daemon in the foreground, mounted at `root`/mnt and logging to `root`/daemon.log, until it is
    unmounted."""
    mountpoint, log = root / "mnt", root / "daemon.log"
    mountpoint.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        process = subprocess.Popen([*argv, str(mountpoint)], stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not is_live_mount(mountpoint):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.05)  # polling for the mount, bounded by the deadline
        yield Source(name, mountpoint, process.pid)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
        process.wait(timeout=30)


@contextmanager
def silod(work: Path, local: Path, names: list[str]) -> Iterator[Source]:
    """`silod mount` of `local` as job "train", its cache filled by one untimed epoch."""
    uri = f"file://{local}"
    mount = MountProcess(work / "silod", {"train": uri}, "--cache-size", f"{uri}=1TB").start()
    try:
        assert mount.process is not None
        read_epoch(mount.job_dir("train"), names, workers=4, seed=99)
        yield Source("silod", mount.job_dir("train"), mount.process.pid)
    finally:
        mount.stop()


def build_c_mirror(work: Path) -> Path | str:
    """The C mirror's binary, or why it could not be built."""
    binary = work / "mirror_ll"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
    if flags.returncode != 0 or shutil.which("gcc") is None:
        return "needs gcc, pkg-config and libfuse3-dev"
    built = subprocess.run(
        ["gcc", "-O2", "-o", str(binary), str(C_MIRROR), *flags.stdout.split()], capture_output=True, text=True
    )
    return binary if built.returncode == 0 else f"gcc failed: {built.stderr.strip()[-300:]}"


def benchmark(work: Path, count: int, size: int, workers_list: list[int]) -> tuple[list[Row], list[str]]:
    local = work / "local"
    print(f"making {count} files of {size} bytes ...", file=sys.stderr)
    names = make_files(local, count, size)
    regimes: list[tuple[str, Callable[[], None]]] = [("warm", settle)]
    notes = []
    if os.geteuid() == 0:
        regimes.append(("dropped", drop_caches))
    else:
        notes.append("dropped page cache: not measured (needs root)")
    c_mirror = build_c_mirror(work)
    if isinstance(c_mirror, str):
        notes.append(f"C mirror: not built ({c_mirror})")

    @contextmanager
    def local_disk() -> Iterator[Source]:
        yield Source("local", local, None)

    sources: list[Callable[[], AbstractContextManager[Source]]] = [
        local_disk,
        lambda: silod(work, local, names),
        lambda: mirror("pyfuse3 mirror", [sys.executable, str(PYFUSE3_MIRROR), str(local)], work / "pyfuse3"),
    ]
    if not isinstance(c_mirror, str):
        sources.append(lambda: mirror("C mirror", [str(c_mirror), str(local)], work / "c"))
    rows = []
    for open_source in sources:
        with open_source() as source:
            for workers in workers_list:
                for regime, before_epoch in regimes:
                    read_epoch(source.root, names, workers, seed=50)  # warm the page cache the same way for all
                    rows.append(measure(source, names, workers, regime, before_epoch))
    return rows, notes


def report(rows: list[Row], notes: list[str]) -> None:
    local = {(r.regime, r.workers): r.files_per_sec for r in rows if r.source == "local"}
    table = [
        (
            r.source,
            r.regime,
            str(r.workers),
            f"{r.files_per_sec:.0f}",
            f"{r.files_per_sec / local[r.regime, r.workers]:.2f}",
            "-" if r.cpu_us_per_file is None else f"{r.cpu_us_per_file:.0f}",
        )
        for r in rows
    ]
    print(render_table(("SOURCE", "PAGE CACHE", "WORKERS", "FILES/S", "VS LOCAL", "DAEMON CPU US/FILE"), table))
    for note in notes:
        print(note)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--size", type=int, default=80_000, metavar="BYTES")
    parser.add_argument("--workers", default="2,4", help="reader counts, comma-separated")
    args = parser.parse_args()
    workers_list = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="silod-fuse-floor-") as work:
        rows, notes = benchmark(Path(work), args.files, args.size, workers_list)
    report(rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
