"""A remote IO rate changed mid-run is honoured by a live mount (issue 3): readers keep demanding more than
either rate from a node agent's mount while `silod alloc io` lowers or raises the job's rate, and the bytes
the node fetches from the backend for the job stay within rate x time + burst under each rate and reach 90 %
of rate x time. The same holds when the cache quota drops to 0 under readers served from a full cache, so
that every read misses at once. Bytes and times are the node's own counters (its statistics file), not the
duration of any read.
"""

from __future__ import annotations

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
