"""Control-plane benchmark: allocation latency and throughput, and watch propagation delay, at scale.

Starts `silod datamgr serve` as its own process on a fresh state dir, registers 1,000 datasets (local
directories), 1,000 nodes and 10,000 jobs, then has 8 concurrent clients issue AllocateRemoteIO and
AllocateCacheSize calls while watch streams on a sample of nodes record when each change arrives.

Prints p50/p99 latency per call, throughput, and the delay from a call being sent to its change arriving on
the watching node (an upper bound of the push delay: it includes the call's own latency).

    .venv/bin/python bench/control_plane.py [--datasets N] [--jobs N] [--nodes N] [--calls N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from datamgr.client import DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb
from tests.datamgr_fixtures import DataManagerProcess

CLIENTS = 8
WATCHED_NODES = 16


@dataclass(frozen=True)
class Sample:
    method: str
    sent: float
    latency: float
    revision: int


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def in_parallel(work: Callable[[int], None], count: int) -> None:
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in pool.map(work, range(count)):
            pass


def populate(address: str, root: Path, datasets: int, nodes: int, jobs: int) -> None:
    clients = [DataManagerClient(address, timeout=60) for _ in range(CLIENTS)]
    started = time.monotonic()

    def dataset(i: int) -> None:
        directory = root / f"ds{i:05d}"
        directory.mkdir()
        (directory / "item.bin").write_bytes(b"x" * 4096)
        clients[i % CLIENTS].register_dataset(f"file://{directory}")

    def node(i: int) -> None:
        clients[i % CLIENTS].register_node(f"node{i:05d}", f"10.0.{i // 250}.{i % 250}:7421", 2**40)

    def job(i: int) -> None:
        uri = f"file://{root / f'ds{i % datasets:05d}'}"
        clients[i % CLIENTS].register_job(f"job{i:06d}", uri, 100_000_000, [(f"node{i % nodes:05d}", 1)])

    for name, work, count in (("datasets", dataset, datasets), ("nodes", node, nodes), ("jobs", job, jobs)):
        t0 = time.monotonic()
        in_parallel(work, count)
        print(f"registered {count} {name} in {time.monotonic() - t0:.1f} s", flush=True)
    print(f"setup took {time.monotonic() - started:.1f} s\n", flush=True)
    for client in clients:
        client.close()


class Watcher(threading.Thread):
    """Records when each revision arrives on one node's watch stream."""

    def __init__(self, address: str, node_id: str) -> None:
        super().__init__(daemon=True)
        self.arrivals: dict[int, float] = {}
        self.ready = threading.Event()
        self._client = DataManagerClient(address)
        self._call = self._client.stub.WatchAllocations(pb.WatchAllocationsRequest(node_id=node_id))

    def run(self) -> None:
        try:
            for event in self._call:
                self.arrivals[event.revision] = time.monotonic()
                self.ready.set()
        except grpc.RpcError:
            pass  # cancelled at the end of the run

    def stop(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves cancel() untyped
        self._client.close()


def run_calls(address: str, root: Path, args: argparse.Namespace, watched_jobs: list[str]) -> list[Sample]:
    """`args.calls` allocations from 8 clients; a fifth of them aimed at jobs on watched nodes."""

    def client_run(seed: int) -> list[Sample]:
        rng = random.Random(seed)
        samples = []
        with DataManagerClient(address) as client:
            for _ in range(args.calls // CLIENTS):
                watched = rng.random() < 0.2
                job = rng.choice(watched_jobs) if watched else f"job{rng.randrange(args.jobs):06d}"
                sent = time.monotonic()
                if rng.random() < 0.5:
                    revision = client.allocate_remote_io(job, rng.randrange(1, 100_000)).revision
                    method = "AllocateRemoteIO"
                else:
                    uri = f"file://{root / f'ds{int(job[3:]) % args.datasets:05d}'}"
                    revision = client.allocate_cache_size(uri, rng.randrange(0, 4097)).revision
                    method = "AllocateCacheSize"
                samples.append(Sample(method, sent, time.monotonic() - sent, revision))
        return samples

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [s for batch in pool.map(client_run, range(CLIENTS)) for s in batch]


def report(samples: list[Sample], elapsed: float, watchers: list[Watcher]) -> None:
    print(f"{len(samples)} calls from {CLIENTS} clients in {elapsed:.1f} s: {len(samples) / elapsed:.0f} calls/s")
    for method in ("AllocateRemoteIO", "AllocateCacheSize"):
        latencies = [s.latency * 1000 for s in samples if s.method == method]
        print(
            f"  {method:<18} n={len(latencies):<6} p50 {statistics.median(latencies):6.2f} ms"
            f"   p99 {percentile(latencies, 0.99):6.2f} ms   max {max(latencies):6.2f} ms"
        )
    sent_at = {s.revision: s.sent for s in samples}
    delays = [
        (arrived - sent_at[revision]) * 1000
        for watcher in watchers
        for revision, arrived in watcher.arrivals.items()
        if revision in sent_at
    ]
    if delays:
        print(
            f"  propagation (call sent -> event on node) n={len(delays)}: p50 {statistics.median(delays):6.2f} ms"
            f"   p99 {percentile(delays, 0.99):6.2f} ms   max {max(delays):6.2f} ms"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=8000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="silod-bench-") as tmp:
        root = Path(tmp)
        server = DataManagerProcess(root / "state", root / "datamgr.log").start()
        try:
            populate(server.address, root, args.datasets, args.nodes, args.jobs)
            watched_nodes = [f"node{i:05d}" for i in range(WATCHED_NODES)]
            watchers = [Watcher(server.address, node) for node in watched_nodes]
            for watcher in watchers:
                watcher.start()
                watcher.ready.wait(30)
            watched_jobs = [f"job{i:06d}" for i in range(args.jobs) if i % args.nodes < WATCHED_NODES]
            started = time.monotonic()
            samples = run_calls(server.address, root, args, watched_jobs)
            elapsed = time.monotonic() - started
            time.sleep(0.5)  # let the last events arrive before reading the watchers
            for watcher in watchers:
                watcher.stop()
            report(samples, elapsed, watchers)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
