"""Measuring a job's remote fetch rate through a running node, and the readers that make it pull."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fuseclient.throttle import default_burst
from tests.cluster_fixtures import SIZE
from tests.mount_fixtures import MountProcess

READERS = 4
WINDOW = 2.5  # seconds of reading measured under each rate
# Bytes are counted when a fetch completes, after its tokens were granted: a fetch granted before a window
# opens may be counted in it. Each reader has at most one fetch in flight (the files are single items).
IN_FLIGHT = READERS * SIZE


@dataclass(frozen=True)
class Sample:
    """One statistics snapshot of the job on the node."""

    at: float  # the node's monotonic clock, seconds: rates stay right whatever the wall clock does
    rate: float  # the job's token bucket rate, bytes/s
    fetched: int  # bytes fetched from the backend for the job so far


def sample(node: MountProcess) -> Sample:
    stats = node.stats()
    job = stats["jobs"]["j1"]
    return Sample(stats["monotonic_seconds"], job["io_bytes_per_sec"], job["bytes_from_remote"])


def assert_held_to(rate: int, start: Sample, end: Sample) -> None:
    elapsed, fetched = end.at - start.at, end.fetched - start.fetched
    bound = rate * elapsed + default_burst(rate, SIZE)  # the agent's burst for this dataset
    assert fetched <= bound + IN_FLIGHT, f"{fetched} B fetched in {elapsed:.2f} s at {rate} B/s (bound {bound:.0f})"
    assert fetched >= 0.9 * rate * elapsed, f"only {fetched} B in {elapsed:.2f} s at {rate} B/s: demand exceeds it"


@contextmanager
def readers_demanding_more(job_dir: Path, files: dict[str, bytes]) -> Iterator[None]:
    """READERS threads reading `files` through the mount over and over, checking every byte, until the block
    ends; a failed read fails the block."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def read_forever(paths: list[str]) -> None:
        try:
            while not stop.is_set():
                for path in paths:
                    assert (job_dir / path).read_bytes() == files[path]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=read_forever, args=(sorted(files)[i::READERS],)) for i in range(READERS)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not failures, failures
