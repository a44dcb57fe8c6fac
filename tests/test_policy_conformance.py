"""Every policy paired with every cache system keeps the invariants the data manager and the simulator rely
on, on random clusters (fixed seeds) with shared datasets, irregular jobs, running, queued and suspending jobs
(preempted, holding their GPUs through a grace period), and tight, loose and absent storage.

The cache systems come from `registry.CACHE_SYSTEMS` and the policies from `available_policies()`, so a new
one is covered the moment it is registered; one that cannot be built fails here rather than being skipped.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from datamgr.scheduler.placement import place_gang, take
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import CACHE_SYSTEMS, available_policies, build_scheduler
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot

MB = 10**6
GB = 10**9


@dataclass(frozen=True)
class Scenario:
    seed: int
    cache_fraction: float  # cluster cache / total bytes of the datasets
    io_fraction: float  # remote IO limit / total f* of the jobs

    def __str__(self) -> str:
        return f"seed{self.seed}-cache{self.cache_fraction:g}-io{self.io_fraction:g}"


SCENARIOS = [
    Scenario(1, 0.1, 0.2),
    Scenario(2, 2.0, 10.0),
    Scenario(3, 0.5, 0.05),
    Scenario(4, 0.0, 0.0),
    Scenario(5, 0.3, 1.0),
    Scenario(6, 1.0, 0.3),
]


def random_snapshot(scenario: Scenario) -> Snapshot:
    """A cluster of 2-5 nodes, 2-6 datasets shared by 4-24 jobs, a quarter of them irregular, some running."""
    rng = random.Random(scenario.seed)
    node_gpus = {f"node-{i}": rng.choice([4, 8]) for i in range(rng.randint(2, 5))}
    sizes = {f"s3://data/set-{i}": rng.randint(10, 1500) * GB for i in range(rng.randint(2, 6))}
    free = dict(node_gpus)
    jobs: dict[str, JobState] = {}
    for i in range(rng.randint(4, 24)):
        uri = rng.choice(sorted(sizes))
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        total = sizes[uri] * rng.uniform(0.5, 40)
        placement = place_gang(free, gpus) if rng.random() < 0.6 else None
        if placement is not None:
            take(free, placement)
        held = None  # a preempted job still holding its GPUs through a grace period
        if placement is None and rng.random() < 0.2:
            held = place_gang(free, gpus)
            if held is not None:
                take(free, held)
        jobs[f"job-{i:02d}"] = JobState(
            job_id=f"job-{i:02d}",
            submit_time=float(rng.randint(0, 3600)),
            gpus=gpus,
            dataset_uri=uri,
            dataset_bytes=sizes[uri],
            ideal_bytes_per_sec=rng.uniform(2, 250) * MB * gpus,
            total_bytes=total,
            done_bytes=total * rng.choice([0.0, rng.random()]),
            attained_gpu_seconds=rng.uniform(0, 1e5),
            irregular=rng.random() < 0.25,
            placement=MappingProxyType(placement or {}),
            io_bytes_per_sec=rng.uniform(0, 100) * MB if placement else 0.0,
            held=MappingProxyType(held or {}),
            preemptions=1 if held else 0,
            grace_seconds=60.0 if held else 0.0,
        )
    cache = int(scenario.cache_fraction * sum(sizes.values()))
    nodes = {node_id: NodeState(node_id, gpus, cache // len(node_gpus)) for node_id, gpus in node_gpus.items()}
    return Snapshot(
        time=7200.0,
        nodes=nodes,
        remote_io_bytes_per_sec=scenario.io_fraction * sum(job.ideal_bytes_per_sec for job in jobs.values()),
        datasets={uri: DatasetState(uri, size, cache_quota_bytes=size // 4) for uri, size in sizes.items()},
        jobs=jobs,
        seed=scenario.seed,
    )


@functools.cache
def decided(policy: str, cache_system: str, scenario: Scenario) -> tuple[Snapshot, Decision]:
    snapshot = random_snapshot(scenario)
    return snapshot, build_scheduler(policy, cache_system).decide(snapshot)


GRID = pytest.mark.parametrize(
    ("policy", "cache_system", "scenario"),
    [
        (policy, cache_system, scenario)
        for policy in available_policies()
        for cache_system in CACHE_SYSTEMS
        for scenario in SCENARIOS
    ],
    ids=str,
)


def test_the_scenarios_cover_what_the_suite_claims() -> None:
    snapshots = [random_snapshot(scenario) for scenario in SCENARIOS]
    jobs = [job for snapshot in snapshots for job in snapshot.jobs.values()]
    assert any(job.irregular for job in jobs) and any(not job.irregular for job in jobs)
    assert any(job.running for job in jobs) and any(not job.running for job in jobs)
    assert all(max(Counter(job.dataset_uri for job in s.jobs.values()).values()) > 1 for s in snapshots)
    assert any(job.gpus > s.total_gpus for s in snapshots for job in s.jobs.values())
    assert any(job.held for job in jobs)


@GRID
def test_placements_are_whole_gangs_on_known_nodes_within_the_gpus_suspending_jobs_leave(
    policy: str, cache_system: str, scenario: Scenario
) -> None:
    snapshot, decision = decided(policy, cache_system, scenario)
    assert decision.placements is not None
    assert set(decision.placements) <= set(snapshot.jobs)
    used: Counter[str] = Counter()
    for job in snapshot.suspending_jobs():
        assert not decision.placements.get(job.job_id), f"{job.job_id} is still suspending"
        used.update(job.held)
    for job_id, placement in decision.placements.items():
        assert set(placement) <= set(snapshot.nodes), job_id
        assert all(gpus > 0 for gpus in placement.values()), job_id
        assert sum(placement.values()) == snapshot.jobs[job_id].gpus, job_id
        used.update(placement)
    assert all(used[node_id] <= node.gpus for node_id, node in snapshot.nodes.items())


@GRID
def test_cache_stays_within_capacity_and_no_dataset_gets_more_than_its_size(
    policy: str, cache_system: str, scenario: Scenario
) -> None:
    snapshot, decision = decided(policy, cache_system, scenario)
    assert decision.cache_bytes is not None
    sizes = {job.dataset_uri: job.dataset_bytes for job in snapshot.jobs.values()}
    assert set(decision.cache_bytes) <= set(sizes)
    assert all(0 <= quota <= sizes[uri] for uri, quota in decision.cache_bytes.items())
    assert set(decision.job_cache_bytes) <= set(snapshot.jobs)
    assert all(0 <= quota <= snapshot.jobs[job_id].dataset_bytes for job_id, quota in decision.job_cache_bytes.items())
    in_use = sum(decision.cache_bytes.values()) + sum(decision.job_cache_bytes.values())
    assert in_use <= snapshot.cache_capacity_bytes


@GRID
def test_remote_io_stays_within_the_limit_and_goes_only_to_jobs_that_run(
    policy: str, cache_system: str, scenario: Scenario
) -> None:
    snapshot, decision = decided(policy, cache_system, scenario)
    assert decision.io_bytes_per_sec is not None and decision.placements is not None
    assert set(decision.io_bytes_per_sec) <= set(snapshot.jobs)
    assert all(rate >= 0 for rate in decision.io_bytes_per_sec.values())
    assert {job_id for job_id, rate in decision.io_bytes_per_sec.items() if rate > 0} <= set(decision.placements)
    assert sum(decision.io_bytes_per_sec.values()) <= snapshot.remote_io_bytes_per_sec


@GRID
def test_the_same_snapshot_gets_the_same_decision(policy: str, cache_system: str, scenario: Scenario) -> None:
    snapshot, decision = decided(policy, cache_system, scenario)
    assert build_scheduler(policy, cache_system).decide(snapshot) == decision


@GRID
def test_the_snapshot_is_left_as_it_was(policy: str, cache_system: str, scenario: Scenario) -> None:
    snapshot = random_snapshot(scenario)
    build_scheduler(policy, cache_system).decide(snapshot)
    assert snapshot == random_snapshot(scenario)
