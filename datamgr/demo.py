"""`silod demo` (what `make run` runs): the whole system on one machine, narrated.

A real storage server (Azurite by default; `--backend s3|file` or `DEMO_BACKEND`) holds two generated datasets.
An embedded data manager (SQLite in a temporary state dir) and one node agent (`silod node`, a real FUSE mount)
serve two jobs with different cache efficiency. SiloD's greedy policy allocates the node's cache and the
cluster's scarce remote IO; a synthetic trainer per job reads its dataset through the mount for three epochs in
shuffled order, consuming at most its ideal rate f*. A live line per job shows epoch, throughput, hit ratio and
remote IO; when a job finishes the policy reallocates; a final table compares each epoch with SiloDPerf's
prediction min(f*, b / (1 - c/d)). Ctrl-C tears everything down and unmounts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datamgr.client import DataManagerClient
from datamgr.devservers import azure_client, running_azurite, running_s3_server, s3_client
from datamgr.embedded import EmbeddedDataManager
from datamgr.scheduler.policies.greedy import Allocation, JobDemand, greedy
from datamgr.server import ServerConfig
from silodlib.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb

MB = 10**6
EPOCHS = 3
NODE_ID = "demo-node"
BACKENDS = ("azurite", "s3", "file")
READERS = 4  # parallel readers per trainer, like a data loader's workers


@dataclass(frozen=True)
class DemoJob:
    job_id: str
    dataset: str
    files: int
    file_size: int
    ideal_rate: int  # f*

    @property
    def size(self) -> int:
        return self.files * self.file_size


@dataclass(frozen=True)
class Scale:
    jobs: tuple[DemoJob, ...]
    node_cache: int
    remote_io_limit: int


FULL = Scale(
    (DemoJob("resnet50", "imagenet-a", 600, 100_000, 25 * MB), DemoJob("bert", "wiki-b", 800, 100_000, 12 * MB)),
    node_cache=80 * MB,
    remote_io_limit=20 * MB,
)
SHORT = Scale(
    (DemoJob("resnet50", "imagenet-a", 150, 100_000, 25 * MB), DemoJob("bert", "wiki-b", 200, 100_000, 12 * MB)),
    node_cache=20 * MB,
    remote_io_limit=20 * MB,
)


def say(line: str) -> None:
    print(line, flush=True)


# ---- storage ----


@dataclass(frozen=True)
class DemoStorage:
    """Where the demo datasets live: one bucket, container or directory per dataset."""

    uri: Callable[[str], str]
    options: dict[str, str]
    create: Callable[[str], object]  # a bucket or container for a dataset
    put: Callable[[str, str, bytes], object]  # (dataset, key, data)


@contextlib.contextmanager
def demo_storage(backend: str, workdir: Path) -> Iterator[DemoStorage]:
    if backend == "azurite":
        with running_azurite(workdir / "azurite") as az:
            service = azure_client(az)

            def put_blob(dataset: str, key: str, data: bytes) -> object:
                return service.get_container_client(dataset).upload_blob(f"train/{key}", data, overwrite=True)

            uri = f"az://{az.account_name}/{{}}/train"
            yield DemoStorage(uri.format, az.backend_options(), service.create_container, put_blob)
    elif backend == "s3":
        with running_s3_server(workdir / "moto") as s3:
            client = s3_client(s3)

            def put_object(dataset: str, key: str, data: bytes) -> object:
                return client.put_object(Bucket=dataset, Key=f"train/{key}", Body=data)

            yield DemoStorage(
                "s3://{}/train".format, s3.backend_options(), lambda d: client.create_bucket(Bucket=d), put_object
            )
    else:

        def put_file(dataset: str, key: str, data: bytes) -> object:
            path = workdir / "datasets" / dataset / key
            path.parent.mkdir(parents=True, exist_ok=True)
            return path.write_bytes(data)

        yield DemoStorage(f"file://{workdir / 'datasets'}/{{}}".format, {}, lambda d: None, put_file)


def upload(storage: DemoStorage, jobs: tuple[DemoJob, ...]) -> None:
    for job in jobs:
        storage.create(job.dataset)
    work = [(job.dataset, f"class{i % 10:02d}/img{i:05d}.jpg", job.file_size) for job in jobs for i in range(job.files)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda w: storage.put(w[0], w[1], random.Random(w[1]).randbytes(w[2])), work))


# ---- the node agent ----


class NodeDidNotMount(Exception):
    """The demo's node agent stopped, or did not mount in time; the message says why."""


class DemoNode:
    """`silod node` as a child process with its mount under `root`; NodeDidNotMount if it does not mount."""

    def __init__(self, root: Path, datamgr: str, cache_capacity: int) -> None:
        self.mountpoint = root / "mnt"
        self.cache_dir = root / "cache"
        self.log_path = root / "node.log"
        self.mountpoint.mkdir(parents=True)
        argv = [
            sys.executable, "-m", "silodcli.main", "node", "--foreground", "--datamgr", datamgr,
            "--node-id", NODE_ID, "--mountpoint", str(self.mountpoint), "--cache-dir", str(self.cache_dir),
            "--cache-capacity", str(cache_capacity), "--report-interval", "1", "--stats-interval", "0.5",
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                raise NodeDidNotMount(self._reason())
            if time.monotonic() > deadline:
                self.stop()  # not yet on the demo's stack of things to tear down
                raise NodeDidNotMount("it was not mounted after 60 s")
            time.sleep(0.1)

    def _reason(self) -> str:
        """The line in which the agent said why it stopped (`silod node: ...`), else its log's last line."""
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        said = [line.removeprefix("silod node: ") for line in lines if line.startswith("silod node: ")]
        return (said or lines or ["its log is empty"])[-1]

    def stats(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.cache_dir / "stats.json").read_text())
            return data
        except (OSError, ValueError):
            return {"jobs": {}, "datasets": {}}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the agent unmounts on SIGTERM
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)


# ---- trainers ----


@dataclass(eq=False)
class Trainer(threading.Thread):
    """Reads a job's dataset for `EPOCHS` epochs in shuffled order with `READERS` parallel readers, as a DL
    data loader does, never consuming faster than the job's f* (the GPU's pace)."""

    job: DemoJob
    directory: Path
    stop: threading.Event
    epoch: int = 0
    files_done: int = 0
    bytes_read: int = 0
    epoch_seconds: list[float] = field(default_factory=list)
    error: BaseException | None = None
    _compute_clock: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        super().__init__(daemon=True, name=f"trainer-{self.job.job_id}")

    def run(self) -> None:
        paths = sorted(p for p in self.directory.rglob("*") if p.is_file())
        rng = random.Random(self.job.job_id)
        try:
            with ThreadPoolExecutor(READERS) as pool:
                for epoch in range(1, EPOCHS + 1):
                    self.epoch, self.files_done = epoch, 0
                    rng.shuffle(paths)
                    started = self._compute_clock = time.monotonic()
                    list(pool.map(self._step, paths))
                    if self.stop.is_set():
                        return
                    self.epoch_seconds.append(time.monotonic() - started)
        except OSError as exc:
            self.error = exc

    def _step(self, path: Path) -> None:
        if self.stop.is_set():
            return
        data = path.read_bytes()
        with self._lock:
            self.bytes_read += len(data)
            self.files_done += 1
            self._compute_clock = max(self._compute_clock, time.monotonic()) + len(data) / self.job.ideal_rate
            wake = self._compute_clock
        time.sleep(max(0.0, wake - time.monotonic()))  # the GPU's share of the step


# ---- allocation ----


def allocate(client: DataManagerClient, jobs: list[DemoJob], uris: dict[str, str], scale: Scale) -> Allocation:
    """Run the greedy policy over the running jobs and apply it: decreases first, so limits always hold.
    Returns the allocation applied."""
    demands = [JobDemand(j.job_id, uris[j.dataset], j.ideal_rate) for j in jobs]
    plan = greedy(demands, {uris[j.dataset]: j.size for j in jobs}, scale.node_cache, scale.remote_io_limit)
    current = {
        d.uri: d.cache_quota_bytes for d in client.call(client.stub.ListDatasets, pb.ListDatasetsRequest()).datasets
    }
    rates = {j.job_id: j.io_bytes_per_sec for j in client.list_jobs()}
    calls: list[tuple[int, Callable[..., object], str, int]] = [
        (size - current.get(uri, 0), client.allocate_cache_size, uri, size) for uri, size in plan.cache_bytes.items()
    ]
    calls += [
        (rate - rates.get(job_id, 0), client.allocate_remote_io, job_id, rate)
        for job_id, rate in plan.io_bytes_per_sec.items()
    ]
    for _, call, key, value in sorted(calls, key=lambda c: c[0]):
        call(key, value)
    for job in jobs:
        uri = uris[job.dataset]
        say(
            f"  {job.job_id:<9} cache {format_size(plan.cache_bytes[uri]):>9} of {format_size(job.size):>9} "
            f"(c/d {plan.cache_bytes[uri] / job.size:4.2f}), remote IO {format_rate(plan.io_bytes_per_sec[job.job_id])}"
        )
    return plan


# ---- the run ----


def _live_line(trainers: dict[str, Trainer], node: DemoNode, last: dict[str, tuple[int, int]], elapsed: float) -> str:
    """One line a second: per job, its epoch, read rate (the trainer's), epoch hit ratio and remote rate
    (the node's; the kernel's page cache may answer reads of cached files without the node seeing them)."""
    stats = node.stats()["jobs"]
    parts = []
    for job_id, trainer in trainers.items():
        if not trainer.is_alive():
            parts.append(f"{job_id} done")
            continue
        job_stats = stats.get(job_id, {})
        read_before, remote_before = last.get(job_id, (0, 0))
        remote = job_stats.get("bytes_from_remote", remote_before)
        last[job_id] = (trainer.bytes_read, remote)
        rate, remote_rate = trainer.bytes_read - read_before, remote - remote_before
        parts.append(
            f"{job_id} epoch {trainer.epoch}/{EPOCHS} {trainer.files_done:4d} files {rate / MB:5.1f} MB/s "
            f"hit {job_stats.get('epoch_hit_ratio', 0.0):4.2f} remote {remote_rate / MB:4.1f} MB/s"
        )
    return f"[{elapsed:5.1f}s] " + " | ".join(parts)


def run_demo(backend: str = "azurite", short: bool = False) -> int:
    if backend not in BACKENDS:
        say(f"silod demo: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        return 2
    if not Path("/dev/fuse").exists() or shutil.which("fusermount3") is None:
        say("silod demo: needs FUSE (/dev/fuse and fusermount3; `make setup` installs fuse3)")
        return 2
    scale = SHORT if short else FULL
    try:
        with contextlib.ExitStack() as stack:
            return _run(stack, backend, scale)
    except KeyboardInterrupt:
        say("\ninterrupted: everything is torn down and unmounted")
        return 130
    except NodeDidNotMount as exc:  # no FUSE for this user, most often: the agent's one line says which fix
        say(f"silod demo: the node agent did not mount: {exc}")
        return 1


def _run(stack: contextlib.ExitStack, backend: str, scale: Scale) -> int:
    started = time.monotonic()
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="silod-demo-")))
    say(f"== storage: {backend}; generating {len(scale.jobs)} datasets")
    storage = stack.enter_context(demo_storage(backend, root))
    upload(storage, scale.jobs)
    config = ServerConfig("127.0.0.1:0", root / "state", scale.remote_io_limit, 30.0)
    dm = stack.enter_context(EmbeddedDataManager(config))
    client = stack.enter_context(DataManagerClient(dm.address))
    say(f"== data manager at {dm.address} (remote IO limit {format_rate(scale.remote_io_limit)})")
    node = DemoNode(root / "node", dm.address, scale.node_cache)
    stack.callback(node.stop)
    say(f"== node agent {NODE_ID}: {format_size(scale.node_cache)} of cache, mounted at {node.mountpoint}")

    uris = {job.dataset: storage.uri(job.dataset) for job in scale.jobs}
    for job in scale.jobs:
        client.register_dataset(uris[job.dataset], storage.options)
        client.register_job(job.job_id, uris[job.dataset], job.ideal_rate, [(NODE_ID, 1)])
        say(f"registered {job.job_id}: {job.files} files, {format_size(job.size)}, f* {format_rate(job.ideal_rate)}")
    say("== greedy allocation (most cache-efficient dataset first)")
    running = list(scale.jobs)
    plan = allocate(client, running, uris, scale)

    stop = threading.Event()
    stack.callback(stop.set)
    trainers = {}
    for job in scale.jobs:
        directory = node.mountpoint / job.job_id
        while not directory.is_dir():
            time.sleep(0.05)
        trainers[job.job_id] = Trainer(job, directory, stop)
        trainers[job.job_id].start()
    say(f"== {len(trainers)} trainers reading {EPOCHS} epochs each")

    finished: dict[str, list[dict[str, Any]]] = {}
    # (cache bytes, remote IO) each job last ran with, for the final table
    allocations = {j.job_id: (plan.cache_bytes[uris[j.dataset]], plan.io_bytes_per_sec[j.job_id]) for j in scale.jobs}
    last: dict[str, tuple[int, int]] = {}
    while running:
        time.sleep(1.0)
        say(_live_line(trainers, node, last, time.monotonic() - started))
        for job in [j for j in running if not trainers[j.job_id].is_alive()]:
            trainer = trainers[job.job_id]
            if trainer.error is not None:
                raise RuntimeError(f"trainer {job.job_id} failed: {trainer.error}")
            finished[job.job_id] = _finished_epochs(node, job.job_id)
            client.call(client.stub.FinishJob, pb.FinishJobRequest(job_id=job.job_id))
            running.remove(job)
            say(f"== {job.job_id} finished; the policy reallocates")
            if running:
                plan = allocate(client, running, uris, scale)
                for other in running:
                    allocations[other.job_id] = (
                        plan.cache_bytes[uris[other.dataset]],
                        plan.io_bytes_per_sec[other.job_id],
                    )

    _final_table(scale, trainers, finished, allocations)
    say(f"== done in {time.monotonic() - started:.0f} s; tearing down")
    return 0


def _finished_epochs(node: DemoNode, job_id: str) -> list[dict[str, Any]]:
    """The node's record of the job's epochs, once its statistics show all of them (or after 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        records: list[dict[str, Any]] = node.stats()["jobs"].get(job_id, {}).get("finished_epochs", [])
        if len(records) >= EPOCHS or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _final_table(
    scale: Scale,
    trainers: dict[str, Trainer],
    finished: dict[str, list[dict[str, Any]]],
    allocations: dict[str, tuple[int, int]],
) -> None:
    say("\nJOB        EPOCH  MB/s   HIT RATIO  FROM REMOTE")
    for job in scale.jobs:
        trainer = trainers[job.job_id]
        for index, seconds in enumerate(trainer.epoch_seconds):
            record = next((e for e in finished.get(job.job_id, []) if e["epoch"] == index + 1), None)
            hit = record["hit_bytes"] / record["accessed_bytes"] if record and record["accessed_bytes"] else 0.0
            remote = (record["accessed_bytes"] - record["hit_bytes"]) if record else 0
            say(
                f"{job.job_id:<10} {index + 1:>5}  {job.size / seconds / MB:5.1f}  {hit:9.2f}  "
                f"{format_size(remote):>11}"
            )
        cache, rate = allocations[job.job_id]
        uncached = 1 - cache / job.size
        predicted = job.ideal_rate if uncached <= 0 else min(job.ideal_rate, rate / uncached)
        say(
            f"{'':<10} last allocation: c/d {cache / job.size:.2f}, b {format_rate(rate)} -> SiloDPerf "
            f"min(f*, b/(1-c/d)) = {format_rate(predicted)}"
        )
    say(
        "Uniform caching at work: once a dataset's quota is full nothing is evicted, so every later epoch hits "
        "exactly its cached fraction c/d (LRU would thrash under shuffled epochs), and remote IO carries the rest."
    )
