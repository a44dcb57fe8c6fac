"""bench/sim_floor.py: its replay retraces the run it recorded with the policy's work taken out, and says so
when it strays, rather than timing some other run."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest

from bench.sim_floor import Allocations, ReplayDiverged, _outcomes, _Recording, _Replay, _replay, measure
from datamgr.scheduler.perf import SiloDPerf
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.registry import Scheduler, build_scheduler
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.model import SimConfig, SimResult
from datamgr.scheduler.sim.scenarios import load_scenario
from datamgr.scheduler.snapshot import Snapshot


def run_micro(scheduler: Scheduler) -> SimResult:
    scenario = load_scenario("micro")
    return simulate(scenario.trace, scenario.cluster, scheduler, SimConfig())


@pytest.mark.parametrize("policy", ["fifo", "gavel"])
def test_a_replay_retraces_the_recorded_run_and_counts_its_rounds(policy: str) -> None:
    floor = measure(build_scheduler(policy, "silod"), run_micro)  # raises ReplayDiverged if it strays
    assert floor.policy == f"{policy}/silod"
    assert floor.rounds > 1 and 0 < floor.present_per_round <= len(load_scenario("micro").trace)
    assert floor.full_cpu > 0 and floor.replay_cpu > 0
    assert 0 < floor.running_per_round <= floor.present_per_round
    assert 0 < floor.changed_share <= 1  # the first round starts every job it runs


def test_a_round_changes_the_jobs_it_starts_stops_moves_or_gives_another_rate_and_no_other() -> None:
    allocations = Allocations()
    first = Decision(
        placements={"a": {"n1": 1}, "b": {"n1": 1}, "c": {"n2": 2}, "d": {}},
        io_bytes_per_sec={"a": 100, "b": 100, "c": 50},
    )
    assert allocations.changed(first) == (3, 3)  # a, b and c start; d waits
    second = Decision(
        placements={"a": {"n1": 1}, "b": {"n2": 1}, "c": {"n2": 2}, "e": {"n1": 1}},  # b moves, e starts, d waits
        io_bytes_per_sec={"a": 100, "b": 100, "c": 70, "e": 0},  # c gets another rate; a is untouched
    )
    assert allocations.changed(second) == (4, 3)  # b, c, e
    third = Decision(placements={"a": {"n1": 1}, "c": {"n2": 2}, "e": {"n1": 1}}, io_bytes_per_sec={"a": 100, "c": 70})
    assert allocations.changed(third) == (3, 1)  # b stops; e's missing rate is the 0 it had
    storage_only = Decision(io_bytes_per_sec={"a": 100, "c": 70, "e": 5})  # placements left as they are
    assert allocations.changed(storage_only) == (3, 1)  # e


def test_a_replayed_round_at_another_time_than_recorded_fails_naming_both_times() -> None:
    replay = _Replay("fifo", deque([(60.0, Decision())]))
    with pytest.raises(ReplayDiverged, match=r"t=30s where the recording has t=60s"):
        replay.schedule(Snapshot(30.0, {}, 1.0, {}, {}), SiloDPerf())


def test_a_replay_asked_for_more_rounds_than_recorded_fails() -> None:
    with pytest.raises(ReplayDiverged, match="after the last recorded one"):
        _Replay("fifo", deque()).schedule(Snapshot(30.0, {}, 1.0, {}, {}), SiloDPerf())


def test_a_replay_of_decisions_other_than_the_recorded_policys_is_caught() -> None:
    scheduler = build_scheduler("fifo", "silod")
    recording = _Recording(scheduler.policy)
    recorded = _outcomes(run_micro(replace(scheduler, policy=recording)))
    when, _ = recording.rounds[0]
    recording.rounds[0] = (when, Decision(placements={}, cache_bytes={}, io_bytes_per_sec={}))  # starts nobody
    with pytest.raises(ReplayDiverged):
        _replay(scheduler, recording.rounds, recorded, run_micro)
