"""A remote IO rate changed mid-run is honoured by a live mount (issue 3): readers keep demanding more than
either rate from a node agent's mount while `silod alloc io` lowers or raises the job's rate, and the bytes
the node fetches from the backend for the job stay within rate x time + burst under each rate and reach 90 %
of rate x time. The same holds when the cache quota drops to 0 under readers served from a full cache, so
that every read misses at once. Bytes and times are the node's own counters (its statistics file), not the
duration of any read. A job held at 0 B/s says so in the node's log, once as its reads start waiting and once as
they resume, however many wait.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from silodlib.units import parse_rate
from tests.cluster_fixtures import SIZE, System, eventually
from tests.datamgr_fixtures import silod_cli
from tests.mount_fixtures import MountProcess
from tests.rate_sampling import WINDOW, Sample, assert_held_to, readers_demanding_more, sample


def window_under(node: MountProcess, rate: int) -> tuple[Sample, Sample]:
    """Two samples at least WINDOW seconds apart, the node enforcing `rate` at both."""
    start: Sample = eventually(lambda: (s := sample(node)).rate == rate and s, what=f"rate {rate} on the node")
    end: Sample = eventually(lambda: (s := sample(node)).at >= start.at + WINDOW and s, what="the window's end")
    assert end.rate == rate, "the rate changed within the window"
    return start, end


@pytest.mark.parametrize(("first", "second"), [("4MB/s", "1MB/s"), ("1MB/s", "4MB/s")], ids=["lowered", "raised"])
def test_a_rate_changed_mid_run_holds_the_fetched_bytes_to_the_new_rate(
    system: System, first: str, second: str
) -> None:
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)  # cache quota 0: every read is fetched
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    assert silod_cli("alloc", "io", "j1", first, datamgr=system.datamgr.address).returncode == 0
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")

    with readers_demanding_more(job_dir, system.files):
        before = window_under(node, parse_rate(first))
        changed = silod_cli("alloc", "io", "j1", second, datamgr=system.datamgr.address)
        assert changed.returncode == 0, changed.stderr
        after = window_under(node, parse_rate(second))
    assert_held_to(parse_rate(first), *before)
    assert_held_to(parse_rate(second), *after)


def test_a_cache_quota_shrunk_under_throttled_readers_keeps_the_fetched_bytes_to_the_rate(system: System) -> None:
    # Readers run from a full cache; then the quota drops to 0, the cache is evicted and every read misses at
    # once: the token bucket, not the sudden demand, still sets what the node fetches.
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])
    assert silod_cli("alloc", "io", "j1", "2MB/s", datamgr=system.datamgr.address).returncode == 0
    whole = str(len(system.files) * SIZE)
    assert silod_cli("alloc", "cache", system.uri, whole, datamgr=system.datamgr.address).returncode == 0
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")
    for path, data in system.files.items():  # one epoch fills the cache
        assert (job_dir / path).read_bytes() == data
    eventually(lambda: node.stats()["datasets"][system.uri]["cached_items"] == len(system.files), what="a full cache")

    with readers_demanding_more(job_dir, system.files):
        shrunk = silod_cli("alloc", "cache", system.uri, "0", datamgr=system.datamgr.address)
        assert shrunk.returncode == 0, shrunk.stderr
        eventually(lambda: node.stats()["datasets"][system.uri]["cached_items"] == 0, what="the cache evicted")
        window = window_under(node, parse_rate("2MB/s"))
    assert_held_to(parse_rate("2MB/s"), *window)


def reading_in_threads(job_dir: Path, paths: list[str]) -> dict[str, bytes | OSError]:
    """Start a daemon thread reading each of `paths` once; the returned dict fills in as they finish (one held for
    good ends when the node unmounts)."""
    outcomes: dict[str, bytes | OSError] = {}

    def read(path: str) -> None:
        try:
            outcomes[path] = (job_dir / path).read_bytes()
        except OSError as exc:
            outcomes[path] = exc

    for path in paths:
        threading.Thread(target=read, args=(path,), daemon=True).start()
    return outcomes


def test_reads_held_at_0_bytes_per_second_log_once_that_they_wait_and_once_that_they_resume(system: System) -> None:
    # Before, the readers hung in read() and the node's log said nothing of why.
    node = system.start_node("n1")
    system.client.register_dataset(system.uri)  # cache quota 0: every read is fetched
    system.client.register_job("j1", system.uri, 100_000_000, [("n1", 1)])  # no remote IO allocated: 0 B/s
    job_dir = eventually(lambda: node.job_dir("j1").is_dir() and node.job_dir("j1"), what="job directory")
    waits, resumes = f"job j1: reads of {system.uri} that need storage wait", f"job j1: reads of {system.uri} resume"

    outcomes = reading_in_threads(job_dir, sorted(system.files))
    # A miss is counted as its read starts waiting on the job's throttle: every reader waits by now.
    eventually(lambda: system.node_stats(node, "j1")["cache_misses"] >= len(system.files), what="every read waiting")
    assert outcomes == {}
    logged = node.log_lines(waits)
    assert len(logged) == 1, f"{len(system.files)} reads waiting on 0 B/s logged {logged}: one line wanted"
    waiting = logged[0]
    assert " INFO fuseclient.readpath: " in waiting
    assert waiting.endswith(
        "its remote IO rate is 0 B/s, and they resume once the data manager grants it some (cached items still read)"
    )
    assert node.log_lines(resumes) == []

    granted = silod_cli("alloc", "io", "j1", "4MB/s", datamgr=system.datamgr.address)
    assert granted.returncode == 0, granted.stderr
    eventually(lambda: len(outcomes) == len(system.files), what="every read done")
    assert outcomes == system.files
    logged = node.log_lines(resumes)
    assert len(logged) == 1, f"{len(system.files)} reads resuming logged {logged}: one line wanted"
    resuming = logged[0]
    assert " INFO fuseclient.readpath: " in resuming
    assert re.search(r"resume: remote IO granted after \d+\.\d s at 0 B/s$", resuming), resuming
    assert node.log_lines(waits) == [waiting]
