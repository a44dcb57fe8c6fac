"""Data-plane benchmark: a DL-style reader through the mount, against local disk and the S3 SDK.

N threads (default 4) read every file once per epoch in a fresh shuffled order, for 3 epochs, for
(a) 3,000 files of 110 KB and (b) 4 files of 64 MiB, stored in an S3 server (moto, on loopback). Side by
side in the same run:
- local disk: the same files from a local directory (the ceiling of any mount);
- direct SDK: boto3 GetObject at the same concurrency, one pass (the backend's ceiling; for the large files
  also by the same 4 MiB ranges the mount fetches);
- the mount: cache at 100 % (epoch 1 cold, epochs 2-3 warm) and 50 % of the dataset, unthrottled and
  throttled, each on a fresh cache.
For each mount epoch it prints files/s, MB/s, bytes from remote, the epoch's hit ratio, the GET, HEAD and
LIST requests the S3 server logged and the mount process's CPU seconds, then the ratios the targets are
stated in. The cold-epoch ratio is the median over `--cold-pairs` pairs (default 3), each an SDK pass right
before a fresh mount's cold epoch, so that both sides of a ratio see the same machine: a VM's speed drifts
under sustained load, and one 2-second epoch against a pass minutes earlier is mostly noise.

Each phase (local disk, each SDK pass, each mount run) starts after a `sync`, so the kernel's write-back of
what an earlier phase wrote (gigabytes of uploads, copies and caches) does not take the CPUs from it; each
mount's cache directory is removed when it stops, and each dataset's local copy and bucket when its section
ends, so that their pages do not crowd the page cache of the phases after them.

By default the S3 server shares every CPU with the readers and the mount, so a client is also measured by
how much CPU it leaves the server. `--server-cpu N` pins the server to CPU N and everything else to the
other CPUs instead, as when the object store is another machine.

    PYTHONPATH=. .venv/bin/python bench/epoch_read.py [--threads N] [--only small|large] [--server-cpu N]
        [--cold-pairs N] [--rate BYTES_PER_SEC] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procstat import cpu_seconds
from tests.mount_fixtures import MountProcess, options_args
from tests.storage_servers import S3Server, running_s3_server, s3_client

EPOCHS = 3
BLOCK = 1024 * 1024
CHUNK = 4 * 1024 * 1024  # the mount's default item size
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) /([^ ?]+)/?(\?[^ ]*)? HTTP')  # moto colours some lines


@dataclass(frozen=True)
class Dataset:
    name: str
    files: int
    size: int


@dataclass(frozen=True)
class Options:
    threads: int  # readers, and the SDK's concurrency
    rate: int  # bytes/s of the throttled run
    cold_pairs: int  # SDK passes, each followed by a fresh mount's cold epoch, that the cold ratio is taken over


@dataclass(frozen=True)
class EpochResult:
    seconds: float
    files: int
    nbytes: int
    remote_bytes: int = 0
    hit_ratio: float = 0.0
    gets: int = 0
    heads: int = 0
    lists: int = 0
    mount_cpu: float | None = None  # CPU seconds (user + system) the mount process spent in the epoch

    @property
    def files_per_sec(self) -> float:
        return self.files / self.seconds

    @property
    def mb_per_sec(self) -> float:
        return self.nbytes / self.seconds / 1e6


def read_epoch(paths: list[Path], threads: int, rng: random.Random) -> tuple[float, int]:
    """Read every path once in a fresh shuffled order with `threads` readers; (seconds, bytes)."""
    order = list(paths)
    rng.shuffle(order)

    def read(path: Path) -> int:
        total = 0
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(BLOCK):
                total += len(chunk)
        return total

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(read, order))
    return time.monotonic() - started, nbytes


def settle() -> None:
    """Write back the dirty pages earlier phases left (uploads, local copies, mount caches), so that the
    kernel's flush of them, which takes CPU the two cores' readers need, does not land in the next phase."""
    os.sync()


def drop_caches() -> None:
    """Empty the kernel's page cache (root only), after writing back what is dirty."""
    settle()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def sdk_epoch(server: S3Server, bucket: str, keys: list[str], threads: int, ranges: list[str]) -> EpochResult:
    """One pass with boto3 at the same concurrency: each object whole (ranges == [""]) or by those ranges."""
    settle()
    client = s3_client(server)

    def get(key: str) -> int:
        return sum(len(client.get_object(Bucket=bucket, Key=key, Range=r)["Body"].read()) for r in ranges)

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(get, keys))
    return EpochResult(time.monotonic() - started, len(keys), nbytes)


class RequestLog:
    """Counts the S3 server's logged requests for one bucket since the last `take()`."""

    def __init__(self, log_path: Path, bucket: str) -> None:
        self._path, self._bucket, self._offset = log_path, bucket, log_path.stat().st_size

    def take(self) -> tuple[int, int, int]:
        with self._path.open() as f:
            f.seek(self._offset)
            text = f.read()
            self._offset = f.tell()
        gets = heads = lists = 0
        for method, path, query in _REQUEST.findall(text):
            if not path.startswith(self._bucket):
                continue
            if "list-type" in query:
                lists += 1
            elif method == "HEAD":
                heads += 1
            else:
                gets += 1
        return gets, heads, lists


def mount_epochs(
    mount: MountProcess, dataset: Dataset, threads: int, requests: RequestLog, epochs: int = EPOCHS
) -> list[EpochResult]:
    assert mount.process is not None
    pid = mount.process.pid
    root = mount.job_dir("job")
    paths = sorted(p for p in root.rglob("*") if p.is_file())
    requests.take()  # the listing at mount time is not part of any epoch
    results, remote_before = [], 0
    rng = random.Random(1)
    for epoch in range(1, epochs + 1):
        cpu_before = cpu_seconds(pid)
        seconds, nbytes = read_epoch(paths, threads, rng)
        cpu = cpu_seconds(pid) - cpu_before
        settled = time.time() + 0.05
        stats = mount.wait_for_stats(lambda s, after=settled: s["written_at"] > after)["jobs"]["job"]
        finished = {e["epoch"]: e for e in stats["finished_epochs"]}
        record = finished.get(epoch)
        hit = record["hit_bytes"] / record["accessed_bytes"] if record and record["accessed_bytes"] else 0.0
        remote = stats["bytes_from_remote"] - remote_before
        remote_before = stats["bytes_from_remote"]
        results.append(EpochResult(seconds, len(paths), nbytes, remote, hit, *requests.take(), mount_cpu=cpu))
    return results


def show(label: str, results: list[EpochResult]) -> None:
    for epoch, r in enumerate(results, start=1):
        cpu = "" if r.mount_cpu is None else f"  mount CPU {r.mount_cpu:5.2f} s"
        print(
            f"  {label:<34} epoch {epoch}: {r.files_per_sec:8.0f} files/s {r.mb_per_sec:8.1f} MB/s  "
            f"remote {r.remote_bytes / 1e6:7.1f} MB  hit {r.hit_ratio:4.2f}  "
            f"GET {r.gets:5d} HEAD {r.heads} LIST {r.lists}{cpu}",
            flush=True,
        )


def run_dataset(
    dataset: Dataset,
    server: S3Server,
    workdir: Path,
    options: Options,
    mount: Callable[..., MountProcess],
) -> None:
    threads = options.threads
    print(f"\n== {dataset.name}: {dataset.files} files of {dataset.size / 1e6:.1f} MB, {threads} readers", flush=True)
    rng = random.Random(0)
    bucket = f"bench-{dataset.name}"
    client = s3_client(server)
    client.create_bucket(Bucket=bucket)
    local = workdir / f"local-{dataset.name}"
    keys = [f"train/class{i % 10:02d}/file{i:05d}.bin" for i in range(dataset.files)]

    upload(client, bucket, local, keys, dataset.size)
    total = dataset.files * dataset.size
    local_paths = sorted(p for p in local.rglob("*") if p.is_file())
    local_results = []
    settle()
    for _ in range(EPOCHS):
        seconds, nbytes = read_epoch(local_paths, threads, rng)
        local_results.append(EpochResult(seconds, dataset.files, nbytes))
    show("local disk", local_results)
    sdk = sdk_epoch(server, bucket, keys, threads, [""])
    print(f"  {'direct SDK (GetObject)':<34} one pass: {sdk.files_per_sec:8.0f} files/s {sdk.mb_per_sec:8.1f} MB/s")
    ranges, sdk_label = [""], "direct SDK (GetObject)"
    if dataset.size > CHUNK:
        # The mount fetches 4 MiB items; moto serves a range in time proportional to the whole object.
        ranges = [f"bytes={o}-{min(o + CHUNK, dataset.size) - 1}" for o in range(0, dataset.size, CHUNK)]
        sdk_label = "direct SDK, same 4 MiB ranges"

    uri = f"s3://{bucket}/train"
    requests = RequestLog(workdir / "moto" / "server.log", bucket)

    def mount_run(name: str, fraction: float, job_rate: int | None, epochs: int = EPOCHS) -> list[EpochResult]:
        """`epochs` epochs through a fresh mount with its own empty cache, removed afterwards so that its
        files do not take the page cache from the phases after it."""
        extra = ["--cache-size", f"{uri}={int(fraction * total)}", *options_args(server.backend_options())]
        if job_rate is not None:
            extra += ["--io-rate", f"job={job_rate}B/s"]
        settle()
        run_dir = f"{dataset.name}-{name}"
        process = mount({"job": uri}, *extra, name=run_dir)
        try:
            return mount_epochs(process, dataset, threads, requests, epochs)
        finally:
            process.stop()
            shutil.rmtree(workdir / run_dir)

    full = mount_run("full", 1.0, None)
    show("mount, cache 100%, unthrottled", full)
    half = mount_run("half", 0.5, None)
    show("mount, cache 50%, unthrottled", half)
    throttled = mount_run("throttled", 0.5, options.rate)
    show(f"mount, cache 50%, {options.rate / 1e6:.0f} MB/s", throttled)

    # The cold epoch against the backend's ceiling, in pairs run back to back so that both sides of a ratio
    # see the same machine (a VM's speed drifts under sustained load).
    cold_ratios = [
        cold_pair(pair, lambda: sdk_epoch(server, bucket, keys, threads, ranges), sdk_label, mount_run)
        for pair in range(1, options.cold_pairs + 1)
    ]
    shutil.rmtree(local)
    delete_bucket(client, bucket, keys)

    summarise(dataset, options, local_results, full, half, throttled, cold_ratios)


def cold_pair(
    pair: int, sdk_pass: Callable[[], EpochResult], sdk_label: str, mount_run: Callable[..., list[EpochResult]]
) -> float:
    """One SDK pass, then a fresh mount's cold epoch; the mount's MB/s over the SDK's."""
    sdk = sdk_pass()
    (cold,) = mount_run(f"cold{pair}", 1.0, None, epochs=1)
    ratio = cold.mb_per_sec / sdk.mb_per_sec
    print(
        f"  {f'cold pair {pair}: {sdk_label}':<50} {sdk.mb_per_sec:8.1f} MB/s; mount's cold epoch "
        f"{cold.mb_per_sec:8.1f} MB/s, mount CPU {cold.mount_cpu or 0:5.2f} s: {ratio:.2f} x",
        flush=True,
    )
    return ratio


def upload(client: Any, bucket: str, local: Path, keys: list[str], size: int) -> None:
    """Put `size` seeded random bytes under each key in the bucket, and the same bytes under `local`."""

    def put(key: str) -> None:
        body = random.Random(key).randbytes(size)
        client.put_object(Bucket=bucket, Key=key, Body=body)
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, keys))


def summarise(
    dataset: Dataset,
    options: Options,
    local_results: list[EpochResult],
    full: list[EpochResult],
    half: list[EpochResult],
    throttled: list[EpochResult],
    cold_ratios: list[float],
) -> None:
    """The ratios the targets are stated in, from one dataset's runs."""
    total = dataset.files * dataset.size
    warm = sum(r.files_per_sec for r in full[1:]) / len(full[1:])
    local_warm = sum(r.files_per_sec for r in local_results[1:]) / len(local_results[1:])
    print(f"  -> warm epochs vs local disk: {warm / local_warm:.2f} x files/s")
    median, listed = statistics.median(cold_ratios), ", ".join(f"{r:.2f}" for r in cold_ratios)
    print(f"  -> cold epoch vs direct SDK: median {median:.2f} x MB/s of {len(cold_ratios)} pairs ({listed})")
    print(f"  -> cold epoch requests: GETs {full[0].gets} for {dataset.files * -(-dataset.size // CHUNK)} items, "
          f"HEAD {sum(r.heads for r in full)}, LIST {sum(r.lists for r in full)} over {EPOCHS} epochs")  # fmt: skip
    print(f"  -> cache 50%: hit share of bytes in epochs 2, 3: {half[1].hit_ratio:.3f}, {half[2].hit_ratio:.3f}; "
          f"remote share {half[1].remote_bytes / total:.3f}, {half[2].remote_bytes / total:.3f}")  # fmt: skip
    predicted = options.rate / (1 - 0.5) / 1e6
    measured = sum(r.mb_per_sec for r in throttled[1:]) / len(throttled[1:])
    print(f"  -> throttled at {options.rate / 1e6:.0f} MB/s with half cached: epochs 2-3 read {measured:.1f} MB/s; "
          f"SiloDPerf b/(1-c/d) predicts {predicted:.1f} MB/s")  # fmt: skip


def delete_bucket(client: Any, bucket: str, keys: list[str]) -> None:
    """Empty and remove a section's bucket, so that the server's memory and temporary files for it do not
    weigh on the sections after it."""
    for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
        batch = [{"Key": key} for key in keys[start : start + 1000]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
    client.delete_bucket(Bucket=bucket)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rate", type=int, default=20_000_000, help="bytes/s for the throttled run")
    parser.add_argument("--only", choices=["small", "large"])
    parser.add_argument("--server-cpu", type=int, metavar="N", help="run the S3 server alone on CPU N")
    parser.add_argument("--cold-pairs", type=int, default=3, metavar="N", help="(SDK pass, cold epoch) pairs")
    parser.add_argument("--work-dir", type=Path, metavar="DIR", help="the run's TMPDIR: caches, copies, server files")
    args = parser.parse_args()
    if args.work_dir is not None:
        if not args.work_dir.is_dir():
            parser.error(f"--work-dir {args.work_dir}: not an existing directory")
        os.environ["TMPDIR"] = str(args.work_dir.resolve())  # for the S3 server's and the mounts' files too
    if args.cold_pairs < 1:
        parser.error(f"--cold-pairs {args.cold_pairs}: the cold ratio needs at least one pair")
    options = Options(args.threads, args.rate, args.cold_pairs)
    server_cpus = None
    if args.server_cpu is not None:
        others = os.sched_getaffinity(0) - {args.server_cpu}
        if args.server_cpu not in os.sched_getaffinity(0) or not others:
            parser.error(f"--server-cpu {args.server_cpu}: not one of several CPUs this process may use")
        server_cpus = {args.server_cpu}
        os.sched_setaffinity(0, others)  # before any thread or child exists: they all inherit it
        print(f"S3 server on CPU {args.server_cpu}; readers, SDK and mounts on CPUs {sorted(others)}", flush=True)
    datasets = [Dataset("small", 3000, 110_000), Dataset("large", 4, 64 * 1024 * 1024)]
    with tempfile.TemporaryDirectory(prefix="silod-bench-", dir=args.work_dir) as tmp:
        workdir = Path(tmp)
        (workdir / "moto").mkdir()
        with running_s3_server(workdir / "moto", cpus=server_cpus) as server:
            started: list[MountProcess] = []

            def mount(jobs: dict[str, str], *extra: str, name: str) -> MountProcess:
                (workdir / name).mkdir()
                process = MountProcess(workdir / name, jobs, *extra, stats_interval=0.1)
                started.append(process)
                return process.start()

            try:
                for dataset in datasets:
                    if args.only in (None, dataset.name):
                        run_dataset(dataset, server, workdir, options, mount)
            finally:
                for process in started:
                    process.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
