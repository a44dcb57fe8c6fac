"""Cache and remote IO for co-located jobs reading remote data: the fair share and SiloD's, and what they do to
a lockstep group (pure), then in the simulator."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from datamgr.scheduler.colocation import Group, JobProfile, group_iteration_seconds
from datamgr.scheduler.colocation_storage import (
    DataNeed,
    StorageShare,
    fair_storage,
    silod_storage,
)
from datamgr.scheduler.policies.harmony import HarmonyPolicy
from datamgr.scheduler.policies.isolated import IsolatedPolicy
from datamgr.scheduler.sharing import water_fill
from datamgr.scheduler.sim.colocation_engine import simulate_colocation
from datamgr.scheduler.sim.colocation_model import ColocationCluster, ColocationJob

MB = 10**6


def test_water_filling_is_max_min_fair_and_gives_nobody_more_than_its_cap() -> None:
    # the project's water-filling (sharing.py), which the fair share and SiloD's group IO use
    assert water_fill({"a": 1, "b": 5, "c": 5}, 7) == {"a": 1, "b": 3, "c": 3}
    assert water_fill({"a": 1, "b": 2}, 100) == {"a": 1, "b": 2}  # what nobody can use stays unused
    assert water_fill({"a": 1}, 0) == {"a": 0}


def test_loading_takes_the_missed_bytes_over_the_jobs_remote_io() -> None:
    need = DataNeed(read_bytes=10 * MB, dataset="d", dataset_bytes=100 * MB)
    share = StorageShare({"d": 60 * MB}, {"j": 2 * MB})
    assert share.hit_ratio(need) == pytest.approx(0.6)
    assert share.load_seconds("j", need) == pytest.approx(4 * MB / (2 * MB))
    assert StorageShare({"d": 100 * MB}, {}).load_seconds("j", need) == 0.0  # all cached: no IO needed
    assert StorageShare({}, {}).load_seconds("j", need) == math.inf  # must read, has no IO


# One group of two jobs on one machine: COMP 2 + 1, COMM 1 + 1, own iterations 3 and 2, so T_g0 = 3 s (Eq. 1).
# "a" reads 30 MB per iteration, "b" 3 MB, each from a 300 MB dataset of its own.
A = JobProfile("a", 2, 1)
B = JobProfile("b", 1, 1)
GROUP = Group((A, B), 1)
NEEDS = {"a": DataNeed(30 * MB, "da", 300 * MB), "b": DataNeed(3 * MB, "db", 300 * MB)}


def paced(share: StorageShare) -> float:
    """The group's iteration with each job's loading under `share`."""
    loaded = [JobProfile(j.job_id, j.cpu_machine_seconds, j.net_seconds, share.load_seconds(j.job_id, NEEDS[j.job_id]))
              for j in GROUP.jobs]  # fmt: skip
    return group_iteration_seconds(loaded, 1)


def test_a_fair_share_wastes_io_on_the_fast_loader_of_a_lockstep_group() -> None:
    assert group_iteration_seconds(GROUP.jobs, 1) == 3.0
    # needs at full speed: a 30 / 3 = 10 MB/s, b 1 MB/s; max-min: b 1, a 5 => a loads for 6 s and paces the group,
    # so b could have done with 0.5 MB/s
    fair = fair_storage([GROUP], NEEDS, 0, 6 * MB)
    assert fair.io_bytes_per_sec == {"a": pytest.approx(5 * MB), "b": pytest.approx(1 * MB)}
    assert paced(fair) == pytest.approx(6.0)
    # SiloD gives the group 6 MB/s (under its 11) split 10 : 1, so both loads take 33 MB / 6 MB/s = 5.5 s
    silod = silod_storage([GROUP], NEEDS, 0, 6 * MB)
    assert silod.io_bytes_per_sec == {"a": pytest.approx(6 * MB * 10 / 11), "b": pytest.approx(6 * MB / 11)}
    assert paced(silod) == pytest.approx(5.5)


def test_silod_caches_the_dataset_that_saves_the_most_remote_io_per_byte_first() -> None:
    # f*/d: a 10 MB/s over 300 MB, b 1 MB/s over 300 MB; 300 MB of cache, 3 MB/s of remote IO
    silod = silod_storage([GROUP], NEEDS, 300 * MB, 3 * MB)
    assert silod.cache_bytes == {"da": 300 * MB, "db": 0}
    assert paced(silod) == 3.0  # a reads only hits; b needs 1 MB/s and gets it
    fair = fair_storage([GROUP], NEEDS, 300 * MB, 3 * MB)
    assert fair.cache_bytes == {"da": 150 * MB, "db": 150 * MB}
    # a misses half: 15 MB per iteration, needs 5 MB/s; b needs 0.5; max-min gives a 2.5: 6 s of loading
    assert paced(fair) == pytest.approx(6.0)


def test_remote_io_is_shared_max_min_among_groups_up_to_each_groups_need() -> None:
    small = Group((JobProfile("s", 1, 1),), 1)  # T_g0 2 s, reads 2 MB: needs 1 MB/s
    needs = {**NEEDS, "s": DataNeed(2 * MB, "ds", 300 * MB)}
    share = silod_storage([GROUP, small], needs, 0, 7 * MB)
    assert share.io_bytes_per_sec["s"] == pytest.approx(1 * MB)
    assert share.io_bytes_per_sec["a"] + share.io_bytes_per_sec["b"] == pytest.approx(6 * MB)


def test_without_an_egress_limit_nobody_waits_on_loading() -> None:
    for allocate in (fair_storage, silod_storage):
        share = allocate([GROUP], NEEDS, 0, math.inf)
        assert paced(share) == 3.0


# --- in the simulator -------------------------------------------------------------------------------------------


def reader(name: str, read: int, dataset_bytes: int) -> ColocationJob:
    # C = 4, T_net = 2: isolated DoP 2, COMP 2 s + COMM 2 s
    return ColocationJob(name, 0.0, "app", f"data-{name}", 4, 2, 10, 0, dataset_bytes, read)


def test_a_job_starved_of_remote_io_is_paced_by_its_loading() -> None:
    # 10 MB per iteration at 1 MB/s: loading takes 10 s, more than its 4 s of COMP and COMM
    machines = ColocationCluster(2, 1e6, 0, remote_io_bytes_per_sec=1 * MB, cache_bytes=0)
    (outcome,) = simulate_colocation([reader("a", 10 * MB, 100 * MB)], machines, IsolatedPolicy()).jobs
    assert outcome.finish == pytest.approx(10 * 10.0)
    cached = ColocationCluster(2, 1e6, 0, remote_io_bytes_per_sec=1 * MB, cache_bytes=100 * MB)
    (outcome,) = simulate_colocation([reader("a", 10 * MB, 100 * MB)], cached, IsolatedPolicy()).jobs
    assert outcome.finish == pytest.approx(10 * 4.0)  # every read hits


def test_the_timeline_counts_the_remote_reads() -> None:
    machines = ColocationCluster(2, 1e6, 0, remote_io_bytes_per_sec=1 * MB, cache_bytes=50 * MB)
    result = simulate_colocation([reader("a", 10 * MB, 100 * MB)], machines, HarmonyPolicy(storage_aware=True))
    # half the reads hit; 5 MB per iteration at 1 MB/s paces it at 5 s: 1 MB/s from remote storage
    assert result.samples[0].remote_io_bytes_per_sec == pytest.approx(1 * MB)
    assert result.jobs[0].finish == pytest.approx(10 * 5.0)


def test_without_an_egress_limit_remote_readers_run_as_if_their_input_were_in_memory() -> None:
    readers = [reader(name, 10 * MB, 100 * MB) for name in "abc"]
    in_memory = [replace(job, read_bytes_per_iteration=0, input_bytes=0) for job in readers]
    machines = ColocationCluster(4, 1e6, 1)  # remote_io unlimited, no cache
    for policy in (HarmonyPolicy(), HarmonyPolicy(storage_aware=True)):
        finishes = [job.finish for job in simulate_colocation(readers, machines, policy).jobs]
        expected = [job.finish for job in simulate_colocation(in_memory, machines, policy).jobs]
        assert finishes == pytest.approx(expected)
