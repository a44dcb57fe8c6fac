"""FitGpp's victim rule (its Eqs. 1-4) and the LRTP and RAND baselines, as pure functions: the smallest,
quickest-to-suspend BE job that frees enough on its own node, never one preempted P times, random ones when
none qualifies, and scores that do not depend on the units demands are given in."""

from __future__ import annotations

import math
import random

import pytest

from datamgr.scheduler.fitgpp import (
    Resources,
    RunningBe,
    fitgpp_victims,
    lrtp_victims,
    rand_victims,
    scores,
    size,
)

GB = 10**9
NODE = Resources(32, 256 * GB, 8)  # the paper's nodes
CAPACITY = {"a": NODE, "b": NODE}
NOTHING = Resources(0, 0, 0)


def be(job_id: str, node: str, cpus: float, ram_gb: float, gpus: float, grace: float = 60.0, **kw: float) -> RunningBe:
    return RunningBe(
        job_id, node, Resources(cpus, ram_gb * GB, gpus), grace, int(kw.get("preemptions", 0)), kw.get("left", 3600.0)
    )


def victims(
    te: Resources, running: list[RunningBe], free: dict[str, Resources] | None = None, **kw: object
) -> list[str]:
    return fitgpp_victims(te, running, free or {"a": NOTHING, "b": NOTHING}, CAPACITY, rng=random.Random(0), **kw)  # type: ignore[arg-type]


def test_size_is_the_demand_in_units_of_its_node() -> None:
    assert size(Resources(16, 128 * GB, 4), NODE) == pytest.approx(math.sqrt(3 * 0.25))
    assert size(NODE, NODE) == pytest.approx(math.sqrt(3))


def test_scores_do_not_change_with_the_units_of_the_demands() -> None:
    running = [be("x", "a", 8, 64, 2, grace=30), be("y", "b", 4, 200, 1, grace=120)]
    in_bytes = scores(running, CAPACITY, 4.0)
    in_gib = scores(
        [j._replace(demand=j.demand._replace(ram_bytes=j.demand.ram_bytes / 2**30)) for j in running],
        {node: cap._replace(ram_bytes=cap.ram_bytes / 2**30) for node, cap in CAPACITY.items()},
        4.0,
    )
    assert in_bytes == pytest.approx(in_gib)
    assert in_bytes["y"] == pytest.approx(size(running[1].demand, NODE) / size(running[1].demand, NODE) + 4.0)


def test_the_victim_frees_enough_on_its_own_node_and_is_the_smallest_quickest_one() -> None:
    te = Resources(4, 32 * GB, 2)
    too_small = be("too-small", "a", 2, 16, 1, grace=1)  # the cheapest, but cannot make room alone
    big_slow = be("big-slow", "b", 16, 128, 4, grace=600)
    small_quick = be("small-quick", "b", 4, 32, 2, grace=30)
    assert victims(te, [too_small, big_slow, small_quick]) == ["small-quick"]
    # Free resources on a node count: with 2 GPUs free on node a, the small job there now suffices.
    assert victims(te, [too_small, big_slow, small_quick], {"a": Resources(2, 16 * GB, 1), "b": NOTHING}) == [
        "too-small"
    ]


def test_a_long_grace_period_outweighs_a_small_demand_by_s() -> None:
    te = Resources(1, 8 * GB, 1)
    small_slow = be("small-slow", "a", 1, 8, 1, grace=600)
    big_quick = be("big-quick", "b", 16, 128, 4, grace=60)
    assert victims(te, [small_slow, big_quick]) == ["big-quick"]  # s = 4: GP dominates
    assert victims(te, [small_slow, big_quick], s=0.0) == ["small-slow"]  # size alone


def test_a_job_preempted_p_times_is_not_chosen() -> None:
    te = Resources(4, 32 * GB, 2)
    once = be("once", "a", 4, 32, 2, grace=10, preemptions=1)
    fresh = be("fresh", "b", 8, 64, 4, grace=300)
    assert victims(te, [once, fresh]) == ["fresh"]  # P = 1
    assert victims(te, [once, fresh], limit=2) == ["once"]


def test_with_no_qualifying_job_random_ones_are_preempted_until_the_te_job_fits() -> None:
    te = Resources(8, 64 * GB, 4)
    halves = [be(f"h{i}", "a", 4, 32, 2, grace=10) for i in range(2)] + [be("q", "b", 2, 16, 1)]
    chosen = victims(te, halves)
    assert {"h0", "h1"} <= set(chosen) and chosen[-1] in {"h0", "h1"}  # node a fits once both halves go
    assert victims(Resources(40, GB, 1), halves) == []  # no node could ever hold it: preempt nothing
    spent = [job._replace(preemptions=1) for job in halves[:1]] + halves[1:]
    assert victims(te, spent) == []  # without h0 (preempted P times already) node a can never fit it


def test_lrtp_preempts_the_longest_remaining_first_until_it_fits() -> None:
    te = Resources(8, 64 * GB, 4)
    running = [
        be("long", "b", 2, 16, 1, left=9000),
        be("mid", "a", 4, 32, 2, left=5000),
        be("short", "a", 4, 32, 2, left=10),
    ]
    assert lrtp_victims(te, running, {"a": NOTHING, "b": NOTHING}) == ["long", "mid", "short"]
    assert lrtp_victims(te, running, {"a": Resources(4, 32 * GB, 2), "b": NOTHING}) == ["long", "mid"]


def test_rand_is_reproducible_from_its_seed_and_stops_once_the_te_job_fits() -> None:
    running = [be(f"j{i}", "a" if i % 2 else "b", 4, 32, 2) for i in range(8)]
    te = Resources(4, 32 * GB, 2)
    free = {"a": NOTHING, "b": NOTHING}
    first = rand_victims(te, running, free, rng=random.Random(7))
    assert first == rand_victims(te, running, free, rng=random.Random(7)) and len(first) == 1
