"""`silod demo` (what `make run` runs): the control plane on embedded defaults, narrated.

It starts a data manager with SQLite in a temporary state dir, generates two small local datasets, registers
a node and two jobs, makes the paper's two calls (AllocateCacheSize, AllocateRemoteIO) as a cache-efficiency
greedy would, shows the node's watch stream receiving each change, kills nothing but restarts the server on
the same state dir to show that every allocation and revision survives, and prints the status tables.
"""

from __future__ import annotations

import argparse
import queue
import random
import tempfile
import threading
from pathlib import Path

import grpc

from datamgr.cli import commands
from datamgr.client import DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from datamgr.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb

REMOTE_IO_LIMIT = 200 * 10**6
NODE_CAPACITY = 24 * 2**20
# (job id, dataset dir, files, bytes per file, ideal rate f*): ResNet-50-like and EfficientNet-like readers.
JOBS = (
    ("resnet50", "imagenet-a", 160, 110_000, 114 * 10**6),
    ("effnetb1", "imagenet-b", 200, 110_000, 69 * 10**6),
)


def _make_dataset(root: Path, files: int, size: int, rng: random.Random) -> None:
    for i in range(files):
        path = root / f"class{i % 10:02d}" / f"img{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))


_print_lock = threading.Lock()


def _say(line: str) -> None:
    """Print one whole line; the watcher thread prints too."""
    with _print_lock:
        print(line, flush=True)


def _describe(change: pb.AllocationChange) -> str:
    kind = change.WhichOneof("change")
    if kind == "dataset_set":
        return f"dataset {change.dataset_set.uri} quota {format_size(change.dataset_set.cache_quota_bytes)}"
    if kind == "job_set":
        return f"job {change.job_set.job_id} rate {format_rate(change.job_set.io_bytes_per_sec)}"
    return f"{kind} {getattr(change, str(kind))}"


def _print_watch(stream: grpc.CallIterator[pb.WatchEvent], node_id: str, applied: queue.Queue[int]) -> None:
    """Print the node's allocation events as they arrive, as a node agent would apply them."""
    try:
        for event in stream:
            if event.HasField("snapshot"):
                _say(f"  [watch {node_id}] r{event.revision} snapshot: {len(event.snapshot.jobs)} jobs")
            for change in event.changes:
                _say(f"  [watch {node_id}] r{event.revision} {_describe(change)}")
            applied.put(event.revision)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise


def run_demo() -> int:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="silod-demo-") as tmp:
        root = Path(tmp)
        config = ServerConfig("127.0.0.1:0", root / "state", REMOTE_IO_LIMIT, 30.0)
        _say(
            f"== data manager on embedded defaults (state {config.state_dir}, remote IO limit "
            f"{format_rate(REMOTE_IO_LIMIT)})"
        )
        with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address) as client:
            client.register_node("node-1", "127.0.0.1:0", NODE_CAPACITY)
            _say(f"registered node-1 with {format_size(NODE_CAPACITY)} of cache")
            stream = client.stub.WatchAllocations(pb.WatchAllocationsRequest(node_id="node-1"))
            applied: queue.Queue[int] = queue.Queue()
            watcher = threading.Thread(target=_print_watch, args=(stream, "node-1", applied), daemon=True)
            watcher.start()
            sizes = {}
            for job_id, name, files, size, ideal in JOBS:
                _make_dataset(root / name, files, size, rng)
                reply = client.register_dataset(f"file://{root / name}")
                sizes[job_id] = reply.dataset.size_bytes
                _say(
                    f"registered {reply.dataset.uri}: {reply.dataset.item_count} items, "
                    f"{format_size(reply.dataset.size_bytes)}"
                )
                client.register_job(job_id, reply.dataset.uri, ideal, [("node-1", 1)])
                _say(f"registered job {job_id} (f* = {format_rate(ideal)})")
            _say("== greedy allocation: cache the most cache-efficient dataset first (f*/d), then share IO")
            cache_left = NODE_CAPACITY
            for job_id, name, _files, _size, ideal in sorted(JOBS, key=lambda j: -j[4] / sizes[j[0]]):
                quota = min(sizes[job_id], cache_left)
                cache_left -= quota
                client.allocate_cache_size(f"file://{root / name}", quota)
                demand = round(ideal * (1 - quota / sizes[job_id]))
                client.allocate_remote_io(job_id, min(demand, REMOTE_IO_LIMIT // len(JOBS)))
                _say(
                    f"{job_id}: cache {format_size(quota)} of {format_size(sizes[job_id])}, "
                    f"remote demand {format_rate(demand)}"
                )
            revision = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest()).revision
            while applied.get(timeout=10) < revision:
                pass  # the node has applied every change before we stop watching
            stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves cancel() untyped
            watcher.join()
        _say("== restart on the same state dir")
        with EmbeddedDataManager(config) as dm, DataManagerClient(dm.address) as client:
            summary = client.call(client.stub.GetClusterSummary, pb.GetClusterSummaryRequest())
            _say(f"revision after restart: {summary.revision} (was {revision} before)\n")
            commands.status(argparse.Namespace(json=False), client)
    return 0
