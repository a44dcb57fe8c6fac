"""Finding policies by name: unknown names are refused with the known ones listed, and a policy a site
installs under the `silod.policies` entry-point group is found and run like a built-in. A paired scheduler's
notes are the policy's and its storage side's, formatted only when read; a storage-only policy is not run
where a baseline replaces its storage."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from datamgr.scheduler.perf import Estimator, SiloDPerf, VanillaPerf
from datamgr.scheduler.policy import Decision, LazyNotes, MergedNotes
from datamgr.scheduler.registry import (
    BUILTIN_POLICIES,
    CACHE_SYSTEMS,
    ENTRY_POINT_GROUP,
    FilledIn,
    UnknownPolicy,
    available_policies,
    build_scheduler,
    load_policy,
)
from datamgr.scheduler.snapshot import JobState, NodeState, Snapshot
from tests.site_packages import install_site_package

GB = 10**9
MB = 10**6

SITE_MODULE = "silod_site_lifo_policy"
SITE_POLICY = textwrap.dedent(
    """
    from datamgr.scheduler.placement import place_in_order
    from datamgr.scheduler.policy import Decision


    class LastInFirstOut:
        name = "site-lifo"

        def schedule(self, snapshot, estimator):
            newest_first = sorted(snapshot.jobs.values(), key=lambda job: -job.submit_time)
            return Decision(placements=place_in_order(snapshot.free_gpus({}), newest_first))
    """
)


def install_site_policy(site: Path, entry_points: str) -> None:
    install_site_package(site, "silod-site-policies", SITE_MODULE, SITE_POLICY, entry_points)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, SITE_MODULE, raising=False)
    yield tmp_path
    sys.modules.pop(SITE_MODULE, None)


def two_jobs_one_gpu() -> Snapshot:
    jobs = {
        job_id: JobState(job_id, submitted, 1, f"s3://data/{job_id}", 10 * GB, 100 * MB, 100 * GB)
        for job_id, submitted in (("older", 0.0), ("newer", 60.0))
    }
    return Snapshot(120.0, {"node-0": NodeState("node-0", 1, 5 * GB)}, 50 * MB, MappingProxyType({}), jobs)


def test_an_unknown_policy_is_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(UnknownPolicy) as refused:
        load_policy("shortest-remaining")
    message = str(refused.value)
    assert "'shortest-remaining'" in message
    assert all(name in message for name in available_policies())


def test_an_unknown_cache_system_is_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(UnknownPolicy) as refused:
        build_scheduler("fifo", "lru")
    assert "'lru'" in str(refused.value)
    assert all(name in str(refused.value) for name in CACHE_SYSTEMS)


def test_every_builtin_policy_is_available_and_loads_under_its_name() -> None:
    assert set(BUILTIN_POLICIES) <= set(available_policies())
    assert all(load_policy(name).name == name for name in BUILTIN_POLICIES)


def test_a_policy_installed_under_the_entry_point_group_is_discovered_and_run(site: Path) -> None:
    install_site_policy(site, f"[{ENTRY_POINT_GROUP}]\nsite-lifo = {SITE_MODULE}:LastInFirstOut\n")
    assert "site-lifo" in available_policies()
    scheduler = build_scheduler("site-lifo", "silod")
    assert scheduler.name == "site-lifo/silod"
    decision = scheduler.decide(two_jobs_one_gpu())
    assert decision.placements == {"newer": {"node-0": 1}}  # FIFO, the fallback for compute, would run "older"
    assert decision.decides_storage  # the policy decides compute only; SiloD's greedy storage fills in


def test_an_entry_point_cannot_shadow_a_builtin_policy(site: Path) -> None:
    install_site_policy(site, f"[{ENTRY_POINT_GROUP}]\nfifo = {SITE_MODULE}:LastInFirstOut\n")
    assert load_policy("fifo").name == "fifo"


def test_notes_are_formatted_only_when_read_and_merge_as_a_dict_union_would() -> None:
    formatted: list[int] = []

    def describe(value: int) -> str:
        formatted.append(value)
        return f"value {value}"

    first = {"b": "from first", "c": "only in first"}
    lazy = LazyNotes({"a": 1, "b": 2}, describe)
    merged = MergedNotes(first, lazy)
    assert formatted == [] and len(merged) == 3
    expected = {**first, "a": "value 1", "b": "value 2"}
    assert list(merged) == list(expected) and dict(merged) == expected
    assert "z" not in merged


@pytest.mark.parametrize("cache_system", ["silod", "alluxio"])
def test_a_filled_in_decision_has_the_policys_notes_and_the_storage_policys(cache_system: str) -> None:
    snapshot = two_jobs_one_gpu()
    scheduler = build_scheduler("sjf", cache_system)
    notes = scheduler.decide(snapshot).notes
    own = load_policy("sjf").schedule(snapshot, scheduler.estimator).notes
    assert {key: notes[key] for key in own} == dict(own)
    assert set(notes) >= set(snapshot.jobs) and (cache_system == "silod" or "cache" in notes)


class StorageOnlySpy:
    """A storage-only policy that counts its rounds and decides nothing."""

    name = "storage-spy"
    storage_only = True

    def __init__(self) -> None:
        self.rounds = 0

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        self.rounds += 1
        return Decision()


@pytest.mark.parametrize("cache_system", [name for name, baseline in CACHE_SYSTEMS.items() if baseline is not None])
def test_a_storage_only_policy_is_not_run_under_a_baseline_that_replaces_its_storage(cache_system: str) -> None:
    spy = StorageOnlySpy()
    baseline = build_scheduler("fifo", cache_system).policy
    assert isinstance(baseline, FilledIn)
    replace(baseline, policy=spy).schedule(two_jobs_one_gpu(), VanillaPerf())
    assert spy.rounds == 0
    # Where the policy's storage is used, it is run.
    FilledIn(spy, load_policy("fifo"), load_policy("greedy"), storage_overrides=False).schedule(
        two_jobs_one_gpu(), SiloDPerf()
    )
    assert spy.rounds == 1
    # So greedy over a baseline is FIFO over it, notes and all.
    snapshot = two_jobs_one_gpu()
    assert build_scheduler("greedy", cache_system).decide(snapshot) == build_scheduler("fifo", cache_system).decide(
        snapshot
    )
