"""Tiresias and its baselines as pure policies: queue order, demotion and promotion (with the wake-ups that time
them), the greedy prefix fill, profile-based placement, the Gittins index, the SiloD-enhanced variant, and
YARN-CS, Best-effort, SRTF and SRSF."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pytest

from datamgr.scheduler.gittins import ServiceDistribution
from datamgr.scheduler.perf import SiloDPerf, VanillaPerf
from datamgr.scheduler.placement import place_by_priority, place_consolidated, place_least_fragmenting
from datamgr.scheduler.policies.held import held_quotas
from datamgr.scheduler.policies.remaining import srsf, srtf
from datamgr.scheduler.policies.tiresias import Tiresias, TiresiasConfig, tiresias_las, tiresias_silod
from datamgr.scheduler.policies.yarn import best_effort, yarn_cs
from datamgr.scheduler.registry import UnknownPolicy, load_policy
from datamgr.scheduler.snapshot import DatasetState, JobState, NodeState, Snapshot

GB = 10**9
HOUR = 3600.0
RATE = 100 * 10**6  # f* of every job here, bytes/s


def job(
    job_id: str,
    gpus: int = 1,
    *,
    submit: float = 0.0,
    on: Mapping[str, int] | None = None,
    attained: float = 0.0,
    state: Mapping[str, float] | None = None,
    hours_left: float = 10.0,
    skew: float = 0.0,
    started: float | None = None,
    queued_before: float = 0.0,
    preemptions: int = 0,
    done_bytes: float = 0.0,
) -> JobState:
    """A job at f* = RATE on its GPUs; running when `on` places it, else waiting since its last stop."""
    placement = MappingProxyType(dict(on or {}))
    return JobState(
        job_id=job_id,
        submit_time=submit,
        gpus=gpus,
        dataset_uri=f"ds-{job_id}",
        dataset_bytes=100 * GB,
        ideal_bytes_per_sec=RATE,
        total_bytes=done_bytes + hours_left * HOUR * RATE,
        done_bytes=done_bytes,
        attained_gpu_seconds=attained,
        placement=placement,
        first_start_time=started if started is not None else (submit if placement or attained else None),
        last_start_time=started,
        pending_since=None if placement else submit + queued_before + (attained / gpus if attained else 0.0),
        queued_seconds_before=queued_before,
        preemptions=preemptions,
        policy_state=MappingProxyType(dict(state or {})),
        skew=skew,
    )


def snapshot(*jobs: JobState, time: float = 0.0, nodes: int = 1, gpus: int = 4) -> Snapshot:
    node_states = {f"n{i}": NodeState(f"n{i}", gpus, 0) for i in range(nodes)}
    datasets = {j.dataset_uri: DatasetState(j.dataset_uri, j.dataset_bytes) for j in jobs}
    return Snapshot(time, node_states, 10 * GB, datasets, {j.job_id: j for j in jobs})


def queue_state(queue: int, entered: float, service_base: float = 0.0, waited_base: float = 0.0) -> dict[str, float]:
    return {"queue": float(queue), "entered": entered, "service_base": service_base, "waited_base": waited_base}


def las(**config: object) -> Tiresias:
    return Tiresias("tiresias-las", TiresiasConfig(**config), gittins=False)  # type: ignore[arg-type]


def running(decision_placements: Mapping[str, object]) -> set[str]:
    return set(decision_placements)


# --- 2D-LAS: queues, order, demotion, promotion ------------------------------------------------------------------


def test_a_new_job_enters_queue_1_and_preempts_a_demoted_job() -> None:
    old = job("old", 4, on={"n0": 4}, attained=2 * HOUR * 4, state=queue_state(1, 7200))
    new = job("new", 4, submit=9000)
    decision = las().schedule(snapshot(old, new, time=9000), VanillaPerf())
    assert running(decision.placements or {}) == {"new"}
    assert decision.job_states["new"] == queue_state(0, 9000)


def test_a_job_that_never_ran_never_preempts_a_running_job_of_its_own_queue() -> None:
    """FIFO by submission would put `early` first; it was skipped when `late` started, and must not take its GPUs."""
    late = job("late", 4, submit=10, on={"n0": 4}, attained=100, state=queue_state(0, 10))
    early = job("early", 4, submit=0, state=queue_state(0, 0))
    decision = las().schedule(snapshot(late, early, time=50), VanillaPerf())
    assert running(decision.placements or {}) == {"late"}


def test_within_a_queue_jobs_that_ran_line_up_in_the_order_they_entered_it() -> None:
    first = job("b-first", 4, submit=5, attained=2 * HOUR, started=60, state=queue_state(1, 100))
    second = job("a-second", 4, submit=0, attained=2 * HOUR, started=10, state=queue_state(1, 200))
    decision = las().schedule(snapshot(second, first, time=300), VanillaPerf())
    assert running(decision.placements or {}) == {"b-first"}  # started later, demoted sooner


def test_a_job_just_demoted_lines_up_behind_the_jobs_that_reached_its_queue_before_it() -> None:
    """A demotion preempts: `new` crosses 1 GPU-hour while `old`, demoted earlier, waits in queue 2."""
    old = job("old", 4, attained=8 * HOUR, started=0.0, state=queue_state(1, 2 * HOUR))
    new = job("new", 4, submit=3 * HOUR, on={"n0": 4}, attained=HOUR, state=queue_state(0, 3 * HOUR))
    decision = las().schedule(snapshot(old, new, time=3.25 * HOUR), VanillaPerf())
    assert running(decision.placements or {}) == {"old"}
    assert decision.job_states["new"] == queue_state(1, 3.25 * HOUR)


@pytest.mark.parametrize("gittins", [False, True])
def test_a_queue_recorded_beyond_the_configured_ones_is_the_last_in_the_order_jobs_entered(gittins: bool) -> None:
    """Restarted with one threshold where there were two, `stuck` is recorded in a third queue that is no more:
    it is in the last, the second, entered when it entered the third, so it lines up behind `earlier` and
    ahead of `later`, demoted to the second since, rather than behind everyone for good."""
    earlier = job("earlier", 4, attained=4 * HOUR, started=0.0, state=queue_state(1, HOUR))
    stuck = job("stuck", 4, submit=1, attained=8 * HOUR, started=1.0, state=queue_state(2, 2 * HOUR))
    later = job("later", 4, submit=2, on={"n0": 4}, attained=2 * HOUR, started=2.0, state=queue_state(1, 3 * HOUR))
    policy = Tiresias("tiresias", TiresiasConfig(thresholds=(HOUR,)), gittins=gittins)
    decision = policy.schedule(snapshot(earlier, stuck, later, time=4 * HOUR, nodes=2), VanillaPerf())
    assert running(decision.placements or {}) == {"earlier", "stuck"}  # `later` is preempted
    assert decision.job_states["stuck"] == queue_state(1, 2 * HOUR)  # what status shows: queue 2, of 2


def test_each_round_keeps_every_job_that_fits_and_skips_the_rest() -> None:
    """Ranked big (4), huge (4), small (1) on 5 GPUs: big and small run; huge, which does not fit, is skipped."""
    jobs = [job("big", 4, submit=0), job("huge", 4, submit=1), job("small", 1, submit=2)]
    decision = las().schedule(snapshot(*jobs, time=3, gpus=5), VanillaPerf())
    assert decision.placements == {"big": {"n0": 4}, "small": {"n0": 1}}  # each on all its GPUs


def test_a_running_job_is_demoted_when_its_attained_service_crosses_the_threshold_and_woken_for_it() -> None:
    below = job("j", 2, on={"n0": 2}, attained=HOUR / 2, state=queue_state(0, 0))
    decision = las().schedule(snapshot(below, time=1800), VanillaPerf())
    assert "j" not in decision.job_states
    assert decision.wake_at == pytest.approx(1800 + HOUR / 2 / 2)  # half a GPU-hour more, on 2 GPUs
    at = job("j", 2, on={"n0": 2}, attained=HOUR, state=queue_state(0, 0))
    demoted = las(thresholds=(HOUR / 2,)).schedule(snapshot(at, time=1800), VanillaPerf())
    assert demoted.job_states["j"] == queue_state(1, 1800)
    assert demoted.wake_at is None  # nothing below it to cross, no promotion to come


def test_attained_service_counts_from_the_last_promotion() -> None:
    promoted = job("j", 1, on={"n0": 1}, attained=5 * HOUR, state=queue_state(0, 100, service_base=4.5 * HOUR))
    decision = las().schedule(snapshot(promoted, time=200), VanillaPerf())
    assert "j" not in decision.job_states  # 0.5 GPU-h since its promotion: still queue 1
    assert decision.wake_at == pytest.approx(200 + 0.5 * HOUR)


def test_promote_knob_returns_a_long_waiting_job_to_queue_1_and_restarts_its_service_and_wait() -> None:
    # Ran 2 h on 1 GPU (t = 2 h), demoted, then waited: waiting since 2 h after its start at 0.
    waiting = job("w", 1, attained=2 * HOUR, state=queue_state(1, 2 * HOUR), started=0.0)
    # Demoted before it, so ahead of it in queue 2, and running.
    blocker = job("b", 1, on={"n0": 1}, attained=2 * HOUR, started=0.5 * HOUR, state=queue_state(1, HOUR))
    policy = las(promote_knob=1.0)
    early = policy.schedule(snapshot(waiting, blocker, time=3 * HOUR, gpus=1), VanillaPerf())
    assert "w" not in (early.placements or {}) and "w" not in early.job_states
    assert early.wake_at == pytest.approx(4 * HOUR)  # when its wait (from 2 h) reaches knob x t = 2 h
    due = policy.schedule(snapshot(waiting, blocker, time=4 * HOUR, gpus=1), VanillaPerf())
    assert due.job_states["w"] == queue_state(0, 4 * HOUR, service_base=2 * HOUR, waited_base=2 * HOUR)
    assert set(due.placements or {}) == {"w"}  # back in queue 1, ahead of the demoted job that ran


def test_without_a_knob_a_demoted_job_waits_however_long() -> None:
    waiting = job("w", 1, attained=2 * HOUR, state=queue_state(1, 2 * HOUR), started=0.0)
    blocker = job("b", 1, submit=2 * HOUR, on={"n0": 1}, attained=10.0, state=queue_state(0, 2 * HOUR))
    decision = las().schedule(snapshot(waiting, blocker, time=100 * HOUR, gpus=1), VanillaPerf())
    assert "w" not in decision.job_states


# --- 2D-Gittins ------------------------------------------------------------------------------------------------


def test_the_gittins_index_of_figure_20s_distribution() -> None:
    services = ServiceDistribution([4.0, 8.0, 12.0])
    assert services.supremum(0.0) == pytest.approx(1 / 8)  # D = 12: P = 1, E = 8
    assert services.supremum(1.0) == pytest.approx(1 / 7)  # D = 11: 1 / (8 - 1)
    assert services.supremum(3.0) == pytest.approx(1 / 3)  # D = 1: P = 1/3, E = 1
    assert services.supremum(4.0) == pytest.approx(1 / 6)  # S in {8, 12}: D = 8: P = 1, E = 6
    assert services.index(0.0, 4.0) == pytest.approx(1 / 12)  # one quantum: P = 1/3, E = 4
    assert services.index(12.0, 4.0) == 0.0 == services.supremum(13.0)  # beyond every observed service


def test_weights_count_as_repeated_services() -> None:
    weighted = ServiceDistribution([4.0, 8.0], [2.0, 1.0])
    repeated = ServiceDistribution([4.0, 4.0, 8.0])
    for attained in (0.0, 2.0, 5.0):
        assert weighted.supremum(attained) == pytest.approx(repeated.supremum(attained))
        assert weighted.index(attained, 3.0) == pytest.approx(repeated.index(attained, 3.0))


@pytest.mark.parametrize(
    ("services", "weights", "message"),
    [
        ([], None, "at least one"),
        ([1.0, -2.0], None, "positive number"),
        ([1.0], [0.0], "weight"),
        ([1.0], [1, 2], "2 weights"),
    ],
)
def test_a_bad_service_distribution_is_refused(
    services: list[float], weights: list[float] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ServiceDistribution(services, weights)


def test_gittins_ranks_a_queue_by_index_and_may_preempt_within_it() -> None:
    """Services 1 h or 100 h: a job past 1 GPU-h is very likely long, so a fresh job outranks it in queue 1."""
    history = ServiceDistribution([HOUR, 100 * HOUR])
    policy = Tiresias("g", TiresiasConfig(thresholds=(200 * HOUR,), history=history), gittins=True)
    old = job("old", 4, on={"n0": 4}, attained=4 * HOUR + 4, state=queue_state(0, 0))
    new = job("new", 4, submit=10)
    decision = policy.schedule(snapshot(old, new, time=HOUR), VanillaPerf())
    assert running(decision.placements or {}) == {"new"}


# --- placement -------------------------------------------------------------------------------------------------


def test_consolidation_takes_as_few_nodes_as_the_job_needs_or_waits() -> None:
    assert place_consolidated({"a": 4, "b": 3, "c": 4}, 8, 4) == {"a": 4, "c": 4}
    assert place_consolidated({"a": 4, "b": 3, "c": 3}, 8, 4) is None  # 10 free, but not on two nodes
    assert place_consolidated({"a": 2, "b": 3, "c": 4}, 2, 4) == {"a": 2}  # the tightest single node


def test_least_fragmenting_fills_the_smallest_holes_first() -> None:
    assert place_least_fragmenting({"a": 4, "b": 1, "c": 2}, 3) == {"a": 3}  # one node fits: no spreading
    assert place_least_fragmenting({"a": 4, "b": 1, "c": 2, "d": 4}, 6) == {"b": 1, "c": 2, "a": 3}
    assert place_least_fragmenting({"a": 1}, 2) is None


def test_a_skewed_model_is_consolidated_and_the_rest_is_not() -> None:
    free_by_half = [job(f"busy{i}", 2, on={f"n{i}": 2}, attained=1.0, state=queue_state(0, 0)) for i in range(2)]
    vgg = job("vgg", 4, submit=5, skew=0.743)
    resnet = job("resnet", 4, submit=5, skew=0.092)
    assert "vgg" not in (las().schedule(snapshot(*free_by_half, vgg, time=9, nodes=2), VanillaPerf()).placements or {})
    spread = las().schedule(snapshot(*free_by_half, resnet, time=9, nodes=2), VanillaPerf()).placements or {}
    assert spread["resnet"] == {"n0": 2, "n1": 2}


def test_a_skipped_running_job_keeps_its_gpus_when_no_one_takes_them() -> None:
    """`vgg` outranks `small` but cannot be consolidated, so preempting `small` would free GPUs nobody uses."""
    small = job("small", 2, submit=5, on={"n0": 2}, attained=3 * HOUR * 2, state=queue_state(1, 0))
    vgg = job("vgg", 4, submit=6, skew=0.743)
    ranked = [vgg, small]
    placements = place_by_priority({"n0": 3, "n1": 2}, ranked, lambda free, j: place_consolidated(free, j.gpus, 4))
    assert placements == {"small": {"n0": 2}}


# --- SiloD-enhanced ----------------------------------------------------------------------------------------------


def test_the_silod_variant_charges_ideal_gpu_time_not_time_stalled_on_io() -> None:
    """Held 2 GPUs for 1 h but read only 15 minutes' worth at full speed: half an ideal GPU-hour, not 2."""
    stalled = job("j", 2, on={"n0": 2}, attained=2 * HOUR, done_bytes=0.25 * HOUR * RATE, state=queue_state(0, 0))
    assert tiresias_silod().attained(stalled) == pytest.approx(HOUR / 2)
    assert tiresias_las().attained(stalled) == 2 * HOUR
    decision = tiresias_silod().schedule(snapshot(stalled, time=HOUR), SiloDPerf())
    assert "j" not in decision.job_states  # still queue 1 under ideal time, where GPU time held demotes it
    assert tiresias_las().schedule(snapshot(stalled, time=HOUR), SiloDPerf()).job_states["j"]["queue"] == 1
    assert decision.wake_at == pytest.approx(HOUR + HOUR / 2 / 2)  # the soonest it could cross: at full speed


def test_the_silod_variant_times_a_demotion_by_the_rate_the_job_reads_at() -> None:
    """Half its f* of remote IO and nothing cached: it gains ideal service at half speed, so the half GPU-hour
    it lacks takes an hour on its 1 GPU, not the half hour full speed would take."""
    throttled = job("j", 1, on={"n0": 1}, attained=HOUR, done_bytes=0.5 * HOUR * RATE, state=queue_state(0, 0))
    throttled = throttled._replace(io_bytes_per_sec=RATE / 2, epoch_hit_ratio=0.0)
    assert tiresias_silod().schedule(snapshot(throttled, time=HOUR), SiloDPerf()).wake_at == pytest.approx(2 * HOUR)
    cached = throttled._replace(epoch_hit_ratio=0.5)  # half its reads hit: the same IO carries it at full speed
    assert tiresias_silod().schedule(snapshot(cached, time=HOUR), SiloDPerf()).wake_at == pytest.approx(1.5 * HOUR)


def test_wake_ups_come_at_least_a_second_apart() -> None:
    almost = job("j", 1, on={"n0": 1}, attained=HOUR - 0.25, state=queue_state(0, 0))
    assert las().schedule(snapshot(almost, time=100), VanillaPerf()).wake_at == 101


def test_a_preempted_waiting_jobs_cache_quota_is_held_for_it() -> None:
    preempted = job("p", 1, submit=5, attained=HOUR, started=5.0, preemptions=1)
    fresh = job("f", 1, submit=10)
    runner = job("r", 1, on={"n0": 1}, attained=10.0)
    datasets = {
        "ds-p": DatasetState("ds-p", 100 * GB, cache_quota_bytes=40 * GB),
        "ds-f": DatasetState("ds-f", 100 * GB, cache_quota_bytes=5 * GB),
        "ds-r": DatasetState("ds-r", 100 * GB, cache_quota_bytes=50 * GB),
    }
    nodes = {"n0": NodeState("n0", 1, 100 * GB)}
    snap = Snapshot(HOUR, nodes, 10 * GB, datasets, {j.job_id: j for j in (preempted, fresh, runner)})
    assert held_quotas(snap) == {"ds-p": 40 * GB}  # not the fresh job's: it never ran, it has nothing to lose
    decision = tiresias_silod().schedule(snap, SiloDPerf())
    assert (decision.cache_bytes or {})["ds-p"] == 40 * GB
    assert sum((decision.cache_bytes or {}).values()) <= 100 * GB


def test_the_round_that_preempts_a_job_already_holds_its_cache_quota() -> None:
    """`old`, demoted, gives its GPU to a new job: its dataset keeps the quota the node caches for it now, in
    this round (storage recomputed without it would give it away, and the next round would hold nothing)."""
    old = job("old", 1, on={"n0": 1}, attained=2 * HOUR, state=queue_state(1, HOUR))
    new = job("new", 1, submit=3 * HOUR)
    datasets = {
        "ds-old": DatasetState("ds-old", 100 * GB, cache_quota_bytes=40 * GB),
        "ds-new": DatasetState("ds-new", 100 * GB),
    }
    nodes = {"n0": NodeState("n0", 1, 100 * GB)}
    snap = Snapshot(3 * HOUR, nodes, 10 * GB, datasets, {j.job_id: j for j in (old, new)})
    decision = tiresias_silod().schedule(snap, SiloDPerf())
    assert running(decision.placements or {}) == {"new"}  # `old` is preempted in this round
    assert (decision.cache_bytes or {}).get("ds-old") == 40 * GB
    assert held_quotas(snap, decision.placements) == {"ds-old": 40 * GB}
    assert (decision.cache_bytes or {})["ds-new"] == 60 * GB  # the rest of the cache, to the job that runs


# --- baselines ---------------------------------------------------------------------------------------------------


def test_yarn_cs_blocks_behind_a_head_it_cannot_consolidate_and_best_effort_does_not() -> None:
    busy = [job(f"busy{i}", 2, on={f"n{i}": 2}, attained=1.0) for i in range(2)]
    head = job("head", 4, submit=5)  # 4 GPUs free, but on two nodes
    small = job("small", 1, submit=6)
    snap = snapshot(*busy, head, small, time=9, nodes=2)
    assert set(yarn_cs().schedule(snap, VanillaPerf()).placements or {}) == {"busy0", "busy1"}
    assert set(best_effort().schedule(snap, VanillaPerf()).placements or {}) == {"busy0", "busy1", "small"}


def test_srtf_runs_the_least_remaining_time_and_srsf_the_least_remaining_gpu_time() -> None:
    wide_short = job("wide", 4, hours_left=1.0)  # 4 GPU-hours left
    narrow_long = job("narrow", 1, hours_left=2.0)  # 2 GPU-hours left
    snap = snapshot(wide_short, narrow_long, time=0, gpus=4)
    assert set(srtf().schedule(snap, VanillaPerf()).placements or {}) == {"wide"}
    assert set(srsf().schedule(snap, VanillaPerf()).placements or {}) == {"narrow"}


# --- knobs -------------------------------------------------------------------------------------------------------


def test_knobs_reach_tiresias_and_bad_ones_are_named() -> None:
    policy = load_policy("tiresias-las", {"queues": "1h,2h", "promote_knob": "4", "pack_limit": 0.6})
    assert isinstance(policy, Tiresias)
    assert policy.config == TiresiasConfig(thresholds=(HOUR, 2 * HOUR), promote_knob=4.0, pack_limit=0.6)
    assert load_policy("tiresias-las", {"queues": "continuous"}).config.continuous  # type: ignore[attr-defined]
    assert math.isinf(tiresias_las().config.promote_knob)
    for options, message in [
        ({"queue": "1h"}, "unknown option 'queue'"),
        ({"queues": "2h,1h"}, "increasing"),
        ({"queues": "soon"}, "duration"),
        ({"promote_knob": "often"}, "promote_knob: 'often' is not a number"),
        ({"pack_limit": "2"}, "between 0 and 1"),
    ]:
        with pytest.raises(UnknownPolicy, match=message):
            load_policy("tiresias-las", options)
    with pytest.raises(UnknownPolicy, match="'fifo' takes no options"):
        load_policy("fifo", {"queues": "1h"})


def test_each_silod_enhancement_is_a_knob_of_its_own() -> None:
    stalled = job("j", 2, on={"n0": 2}, attained=2 * HOUR, done_bytes=0.25 * HOUR * RATE, state=queue_state(0, 0))
    held_only = load_policy("tiresias-silod", {"service": "gpu-time"})
    assert isinstance(held_only, Tiresias) and held_only.attained(stalled) == 2 * HOUR
    assert held_only.schedule(snapshot(stalled, time=HOUR), SiloDPerf()).decides_storage
    ideal_only = load_policy("tiresias-las", {"service": "ideal"})
    assert isinstance(ideal_only, Tiresias) and ideal_only.attained(stalled) == pytest.approx(HOUR / 2)
    unheld = load_policy("tiresias-silod", {"hold_cache": False})  # as a TOML boolean
    assert not unheld.schedule(snapshot(stalled, time=HOUR), SiloDPerf()).decides_storage
    with pytest.raises(UnknownPolicy, match="option service: 'wall' is not one of ideal, gpu-time"):
        load_policy("tiresias-silod", {"service": "wall"})


def test_a_history_file_gives_gittins_its_distribution(tmp_path: Path) -> None:
    path = tmp_path / "history.txt"
    path.write_text("# GPU-time of past jobs\n4h\n8h  # a comment\n\n12h\n")
    policy = load_policy("tiresias-gittins", {"history": str(path)})
    assert policy.history.services == (4 * HOUR, 8 * HOUR, 12 * HOUR)  # type: ignore[attr-defined]


def test_a_history_file_that_is_not_there_is_named_as_a_missing_file(tmp_path: Path) -> None:
    # It was read as a list of durations: "duration '/...' is not a number of seconds".
    missing = tmp_path / "history.txt"
    with pytest.raises(UnknownPolicy, match=f"option history: '{missing}' is no file \\(nor a list of durations\\)"):
        load_policy("tiresias-gittins", {"history": str(missing)})


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("4h\n8h\nsoon  # ?\n", "line 3: duration 'soon' is not"),  # it named the value, not where it is
        ("4h\n\xff\n", "is not UTF-8 text"),  # it was the codec's own message, naming no option
    ],
    ids=["bad-line", "not-utf8"],
)
def test_a_history_file_line_that_is_no_duration_is_refused_naming_the_file_and_line(
    tmp_path: Path, content: str, why: str
) -> None:
    path = tmp_path / "history.txt"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(UnknownPolicy) as refused:
        load_policy("tiresias-gittins", {"history": str(path)})
    assert f"option history: {path}" in str(refused.value) and why in str(refused.value)


def test_a_state_that_is_no_place_in_the_queues_starts_the_job_afresh_in_queue_1() -> None:
    """HiveD's cells in a state dir written before the controller recorded who wrote each state."""
    hived_state = {"opportunistic": 1.0, "cells": 1.0, "level": 1.0, "c0": 0.0}
    running_job = job("j", 1, submit=10, on={"n0": 1}, attained=60.0, state=hived_state)
    decision = las().schedule(snapshot(running_job, time=70), VanillaPerf())
    assert decision.job_states["j"] == queue_state(0, 10) and running(decision.placements or {}) == {"j"}
