"""HiveD's policies (`hived`, `quota`, `private`) driven by the simulator: the paper's Figure 2 anomaly under
the quota scheme and its absence under HiveD, low-priority jobs scavenging idle cells and preempted by the
owner, FIFO inside a tenant, overflow, jobs larger than a node, the private cluster, the cells each job holds
in its policy state, and sub-node affinity (a 2-GPU job on one PCIe switch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from datamgr.scheduler.cells import CellHierarchy
from datamgr.scheduler.perf import SiloDPerf
from datamgr.scheduler.policies.hived import hived, private, quota
from datamgr.scheduler.registry import UnknownPolicy, build_scheduler
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.fields import SimInputError
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, SimConfig, TraceJob
from datamgr.scheduler.sim.tenants import load_tenants
from datamgr.scheduler.snapshot import OPPORTUNISTIC, JobState, NodeState, Snapshot
from datamgr.scheduler.tenancy import TenantShare
from tests.sim_fixtures import GB, MB

RATE = 10 * MB  # f* of every job: a 10 GB epoch takes 1,000 s


def task(job_id: str, tenant: str, gpus: int, seconds: float, arrival: float = 0.0, priority: str = "") -> TraceJob:
    """A job of `tenant` that trains `seconds` at full speed on `gpus` GPUs (storage never limits it)."""
    return TraceJob(
        job_id, arrival, gpus, "m", RATE * gpus, f"ds-{job_id}", 10 * GB, seconds * RATE * gpus / (10 * GB),
        tenant=tenant, priority=priority,
    )  # fmt: skip


def figure_2_cluster(levels: str = "gpu:1,pcie:2,node:2") -> ClusterSpec:
    """The paper's Figure 2: two 4-GPU nodes of two PCIe switches; tenants A and B, a 4-GPU node cell each."""
    shares = {"a": TenantShare(cells={"node": 1}), "b": TenantShare(cells={"node": 1})}
    return ClusterSpec(2, 4, 0, 1000 * GB, cell_levels=levels, tenants=shares)


def run(trace: list[TraceJob], policy: str, cluster: ClusterSpec, **options: object) -> dict[str, JobOutcome]:
    scheduler = build_scheduler(policy, "silod", options or None)
    return {j.job_id: j for j in simulate(trace, cluster, scheduler, SimConfig(round_seconds=60)).jobs}


def figure_2_trace() -> list[TraceJob]:
    """t1: a1-a4 on four GPUs; t2: a2 and a4 finish, the 2-GPU a5 arrives; t3: B's 4-GPU b1 arrives."""
    return [
        task("a1", "a", 1, 10_000),
        task("a2", "a", 1, 1_000),
        task("a3", "a", 1, 10_000),
        task("a4", "a", 1, 1_000),
        task("a5", "a", 2, 5_000, arrival=1_500),
        task("b1", "b", 4, 2_000, arrival=2_000),
    ]


def test_figure_2_the_quota_scheme_lets_one_tenants_fragments_delay_another_hived_does_not() -> None:
    shared = run(figure_2_trace(), "quota", figure_2_cluster())
    # a5 finds no free switch on A's node and takes one on the other node: b1, with all 4 of its quota unused,
    # finds no whole node until a5 is done.
    assert shared["a5"].start == pytest.approx(1_500)
    assert shared["b1"].start == pytest.approx(shared["a5"].finish)
    hived_run = run(figure_2_trace(), "hived", figure_2_cluster())
    assert hived_run["b1"].start == pytest.approx(2_000)  # B's node cell is its own: no delay at all
    # a5 ran as a low-priority job on B's idle node until b1 needed it, and waited again for A's own node.
    assert hived_run["a5"].preemptions == 1 and hived_run["a5"].start == pytest.approx(1_500)
    private_run = run(figure_2_trace(), "private", figure_2_cluster())
    assert private_run["b1"].start == pytest.approx(2_000)
    assert private_run["a5"].start == pytest.approx(10_000)  # in its private node a5 waits for a1 and a3


def test_a_tenants_regular_jobs_start_as_in_its_private_cluster() -> None:
    """Sharing safety on a busier trace: no regular job of either tenant starts later than in its private
    cluster; low-priority work and the other tenant's load never delay it."""
    trace = [
        task(f"{tenant}{i}", tenant, gpus, 600 + 97 * i, arrival=45.0 * i)
        for i, (tenant, gpus) in enumerate(
            [("a", 1), ("b", 2), ("a", 2), ("a", 1), ("b", 4), ("a", 1), ("b", 1), ("a", 4), ("b", 1), ("a", 2)] * 3
        )
    ] + [task(f"low{i}", "b", 2, 3_000, arrival=10.0 * i, priority="low") for i in range(4)]
    cluster = figure_2_cluster()
    alone = run([j for j in trace if j.priority != "low"], "private", cluster)
    shared = run(trace, "hived", cluster, overflow="false")
    for job_id, outcome in alone.items():
        assert shared[job_id].start <= outcome.start + 1e-6, job_id
    assert sum(shared[f"low{i}"].preemptions for i in range(4)) > 0  # the low-priority work did get in the way
    quota_run = run(trace, "quota", cluster, overflow="false")  # the same check catches the quota scheme
    assert any(quota_run[job_id].start > outcome.start + 1 for job_id, outcome in alone.items())


def test_low_priority_jobs_use_idle_cells_and_are_preempted_when_the_owner_needs_them() -> None:
    trace = [
        task("scavenger", "a", 4, 5_000, priority="low"),
        task("scavenger2", "a", 4, 5_000, priority="low"),
        task("owner", "b", 4, 1_000, arrival=600),
    ]
    outcomes = run(trace, "hived", figure_2_cluster())
    assert outcomes["scavenger"].start == 0 and outcomes["scavenger2"].start == 0  # both nodes, no VC used
    preempted = [job_id for job_id in ("scavenger", "scavenger2") if outcomes[job_id].preemptions]
    assert len(preempted) == 1 and outcomes["owner"].start == pytest.approx(600)
    assert outcomes[preempted[0]].queued_seconds == pytest.approx(1_000)  # waited until the owner was done


def test_a_low_priority_job_without_free_cells_is_passed_over_and_smaller_ones_behind_it_start() -> None:
    """The low-priority pass walks the waiting jobs in order: one that free cells cannot hold waits, and the
    jobs behind it still start where cells are free, until none is."""
    jobs = [
        ("node", 4, 10_000),  # a whole node cell
        ("pair", 2, 10_000),  # one PCIe cell of the other node
        ("big", 4, 1_000),  # no node cell is left
        ("one", 1, 10_000),
        ("big2", 4, 1_000),
        ("two", 1, 10_000),  # the last free GPU
        ("three", 1, 1_000),
    ]
    trace = [
        task(job_id, "a", gpus, seconds, arrival=i, priority="low") for i, (job_id, gpus, seconds) in enumerate(jobs)
    ]
    outcomes = run(trace, "hived", figure_2_cluster())
    started = [job_id for job_id, _, _ in jobs if outcomes[job_id].start == outcomes[job_id].arrival]
    assert started == ["node", "pair", "one", "two"]
    assert outcomes["big"].start == pytest.approx(10_000)  # when the first node is whole again
    assert outcomes["three"].start == pytest.approx(10_000 + 1)  # when a GPU is free again


def test_without_overflow_a_regular_job_waits_for_its_vc_and_blocks_its_tenants_queue() -> None:
    trace = [task("a1", "a", 4, 1_000), task("a2", "a", 4, 1_000, arrival=10), task("a3", "a", 1, 100, arrival=20)]
    strict = run(trace, "hived", figure_2_cluster(), overflow="false")
    assert strict["a2"].start == pytest.approx(1_000)
    assert strict["a3"].start == pytest.approx(2_000)  # FIFO inside the tenant: behind a2
    spilling = run(trace, "hived", figure_2_cluster())
    assert spilling["a2"].start == pytest.approx(10)  # on B's idle node, as a low-priority job
    assert spilling["a3"].start == pytest.approx(1_000)


def _waiting(job_id: str, tenant: str, gpus: int, submit: float) -> JobState:
    return JobState(job_id, submit, gpus, "ds", GB, RATE * gpus, GB, tenant=tenant)


NO_ROOM = "tenant a's VC has no room for 2 cells of level 3 (node) (8 GPUs) even with none of its jobs running"


@pytest.mark.parametrize(
    ("mode", "never", "reason"),
    [
        ("hived", 8, NO_ROOM),
        ("private", 8, NO_ROOM),
        ("quota", 5, "its 5 GPUs exceed tenant a's quota of 4"),
        ("hived", 16, "no cell of the cluster holds a job of 16 GPUs"),
    ],
)
def test_a_regular_job_its_vc_could_never_hold_does_not_block_its_tenants_queue_and_its_note_says_why(
    mode: str, never: int, reason: str
) -> None:
    """A private cluster's scheduler refuses a job larger than the cluster rather than queue it; queued at the
    head of its tenant's FIFO, it blocked the tenant's later regular jobs for good (they ran only preemptibly)."""
    nodes = {"n0": NodeState("n0", 4, 0), "n1": NodeState("n1", 4, 0)}
    cluster = figure_2_cluster()
    jobs = {"never": _waiting("never", "a", never, 0.0), "small": _waiting("small", "a", 1, 1.0)}
    snapshot = Snapshot(0.0, nodes, 1e9, {}, jobs, tenants=cluster.tenants, cell_levels=cluster.cell_levels)
    policies = {"hived": hived, "private": private, "quota": quota}

    decision = policies[mode]().schedule(snapshot, SiloDPerf())

    assert decision.placements is not None and "small" in decision.placements
    assert decision.job_states["small"][OPPORTUNISTIC] == 0.0  # in its VC, not preemptible
    assert "never" not in decision.placements
    where = "never runs" if mode == "private" else "waits for free cells as a low-priority job"
    assert decision.notes["never"] == f"{reason}: it {where}"
    if mode == "hived":
        strict = hived({"overflow": "false"}).schedule(snapshot, SiloDPerf())
        assert strict.placements is not None and "small" in strict.placements
        assert strict.notes["never"] == f"{reason}: it never runs"


def test_a_regular_job_its_vc_can_hold_once_its_jobs_finish_still_blocks_its_tenants_queue() -> None:
    """The FIFO inside a tenant stands for jobs that wait their turn: the whole VC would hold this one."""
    nodes = {"n0": NodeState("n0", 4, 0), "n1": NodeState("n1", 4, 0)}
    cluster = figure_2_cluster()
    running = _waiting("running", "a", 2, 0.0)._replace(placement={"n0": 2})
    jobs = {"running": running, "whole": _waiting("whole", "a", 4, 1.0), "small": _waiting("small", "a", 1, 2.0)}
    snapshot = Snapshot(0.0, nodes, 1e9, {}, jobs, tenants=cluster.tenants, cell_levels=cluster.cell_levels)

    decision = hived({"overflow": "false"}).schedule(snapshot, SiloDPerf())

    assert decision.placements is not None and set(decision.placements) == {"running"}
    assert "whole" not in decision.notes


def test_a_job_larger_than_a_node_takes_whole_node_cells() -> None:
    cluster = ClusterSpec(
        4, 4, 0, 1000 * GB, tenants={"a": TenantShare(cells={"node": 3}), "b": TenantShare(cells={"node": 1})}
    )
    outcomes = run([task("big", "a", 12, 1_000), task("b1", "b", 4, 1_000)], "hived", cluster)
    assert outcomes["big"].start == 0 and outcomes["b1"].start == 0


def test_a_2_gpu_job_gets_both_gpus_of_one_pcie_switch() -> None:
    """Affinity below the node: with a PCIe level a 2-GPU job's cell is one switch, so after two single GPUs
    on different switches of a node, the pair needs a switch that is free."""
    cluster = ClusterSpec(
        1, 4, 0, 1000 * GB, cell_levels="gpu:1,pcie:2,node:2", tenants={"a": TenantShare(cells={"node": 1})}
    )
    policy = hived()
    nodes = {"n0": NodeState("n0", 4, 0)}
    hierarchy = CellHierarchy.over_nodes((("gpu", 1), ("pcie", 2), ("node", 2)), ["n0"])
    one = _running("one", 1, hierarchy.index((0, 0, 0)), roots=0)
    two = _running("two", 1, hierarchy.index((0, 1, 0)), roots=0)
    pair = JobState("pair", 5.0, 2, "ds", GB, RATE, GB, tenant="a")
    snapshot = Snapshot(
        0.0,
        nodes,
        1e9,
        {},
        {"one": one, "two": two, "pair": pair},
        tenants=cluster.tenants,
        cell_levels=cluster.cell_levels,
    )
    decision = policy.schedule(snapshot, SiloDPerf())
    assert decision.placements is not None and "pair" not in decision.placements  # no switch has two free GPUs
    packed = snapshot.jobs["two"]._replace(
        policy_state={OPPORTUNISTIC: 0.0, "cells": 1.0, "level": 1.0, "c0": 1.0, "v0": 0.0}
    )
    decision = policy.schedule(replace(snapshot, jobs={"one": one, "two": packed, "pair": pair}), SiloDPerf())
    assert decision.placements is not None and decision.placements["pair"] == {"n0": 2}
    assert decision.job_states["pair"] == {OPPORTUNISTIC: 0.0, "cells": 1.0, "level": 2.0, "c0": 1.0, "v0": 0.0}


def _running(job_id: str, gpus: int, gpu_index: int, roots: int) -> JobState:
    return JobState(
        job_id, 0.0, gpus, "ds", GB, RATE, GB, placement={"n0": gpus}, tenant="a",
        policy_state={OPPORTUNISTIC: 0.0, "cells": 1.0, "level": 1.0, "c0": float(gpu_index), "v0": float(roots)},
    )  # fmt: skip


def test_a_job_running_without_hiveds_cells_is_kept_and_planned_around() -> None:
    """Live, a job another policy placed keeps running; HiveD takes its GPUs as low-priority cells."""
    nodes = {"n0": NodeState("n0", 4, 0), "n1": NodeState("n1", 4, 0)}
    foreign = JobState("old", 0.0, 4, "ds", GB, RATE, GB, placement={"n0": 4})
    new = JobState("new", 1.0, 4, "ds", GB, RATE, GB, priority="low")
    decision = quota().schedule(Snapshot(0.0, nodes, 1e9, {}, {"old": foreign, "new": new}), SiloDPerf())
    assert decision.placements == {"old": {"n0": 4}, "new": {"n1": 4}}
    assert decision.job_states["old"][OPPORTUNISTIC] == 1.0


def test_hiveds_knobs_are_checked() -> None:
    with pytest.raises(UnknownPolicy, match="option overflow: 'maybe' is not one of true, false"):
        build_scheduler("hived", "silod", {"overflow": "maybe"})
    with pytest.raises(UnknownPolicy, match="takes no options"):
        build_scheduler("private", "silod", {"overflow": "true"})
    assert private().name == "private" and hived().config.overflow


def test_gpus_a_node_lacks_or_a_suspending_job_holds_are_never_given_out() -> None:
    """A node smaller than a node cell (nodes of unequal sizes, no `cell_levels`) and a suspending job's GPUs:
    both are left out of every placement, and a regular job whose VC finds no whole cell waits."""
    nodes = {"n0": NodeState("n0", 4, 0), "n1": NodeState("n1", 2, 0)}
    suspending = JobState("paused", 0.0, 1, "ds", GB, RATE, GB, held={"n0": 1})
    jobs = {"paused": suspending, "whole": JobState("whole", 1.0, 4, "ds", GB, RATE, GB, tenant="a")}
    for i in range(6):
        jobs[f"low{i}"] = JobState(f"low{i}", 2.0 + i, 1, "ds", GB, RATE, GB, priority="low")
    tenants = {"a": TenantShare(cells={"node": 1})}
    decision = hived().schedule(Snapshot(0.0, nodes, 1e9, {}, jobs, tenants=tenants), SiloDPerf())
    assert decision.placements is not None and "whole" not in decision.placements  # no node has 4 usable GPUs
    used: dict[str, int] = {}
    for placement in decision.placements.values():
        for node, gpus in placement.items():
            used[node] = used.get(node, 0) + gpus
    assert used == {"n0": 3, "n1": 2}  # 5 usable GPUs: the sixth low-priority job waits


def test_irregular_jobs_under_silods_storage_partition_run_beside_tenants() -> None:
    """The irregular-job partition re-runs the policy on nodes cut to the GPUs regular jobs hold."""
    trace = [task("regular", "a", 4, 1_000), task("odd", "b", 2, 1_000)]
    trace[1] = replace(trace[1], irregular=True)
    outcomes = run(trace, "hived", figure_2_cluster())
    assert outcomes["regular"].start == 0 and outcomes["odd"].start == 0


def test_live_while_nodes_register_hived_places_on_the_nodes_there_are() -> None:
    """No node yet, then fewer nodes than a rack holds: the hierarchy is padded with absent nodes."""
    job = JobState("j", 0.0, 4, "ds", GB, RATE, GB, tenant="a")
    tenants = {"a": TenantShare(cells={"node": 1})}
    levels = "gpu:1,pcie:2,node:2,rack:4"
    empty = Snapshot(0.0, {}, 1e9, {}, {"j": job}, tenants=tenants, cell_levels=levels)
    assert hived().schedule(empty, SiloDPerf()).placements == {}
    nodes = {"n0": NodeState("n0", 4, 0)}
    one = Snapshot(0.0, nodes, 1e9, {}, {"j": job}, tenants=tenants, cell_levels=levels)
    assert hived().schedule(one, SiloDPerf()).placements == {"j": {"n0": 4}}


def test_in_a_private_cluster_a_tenants_low_priority_jobs_run_in_its_own_cells() -> None:
    trace = [task("regular", "a", 4, 1_000), task("background", "a", 4, 1_000, arrival=10, priority="low")]
    outcomes = run(trace, "private", figure_2_cluster())
    assert outcomes["regular"].start == 0 and outcomes["background"].start == pytest.approx(1_000)


def test_the_quota_scheme_places_where_it_preempts_least_then_packs() -> None:
    """YARN-CS as the paper refined it: a regular job goes to free GPUs before it preempts anyone, and among
    those to a node already running regular jobs."""
    levels = "gpu:1,pcie:2,node:2"
    hierarchy = CellHierarchy.over_nodes((("gpu", 1), ("pcie", 2), ("node", 2)), ["n0", "n1", "n2"])
    nodes = {node: NodeState(node, 4, 0) for node in ("n0", "n1", "n2")}
    tenants = {"a": TenantShare(cells={"node": 2}), "b": TenantShare(cells={"node": 1})}

    def low(job_id: str, cell: tuple[int, ...], gpus: int) -> JobState:
        state = {
            OPPORTUNISTIC: 1.0,
            "cells": 1.0,
            "level": float(hierarchy.level_of(cell)),
            "c0": float(hierarchy.index(cell)),
        }
        node = hierarchy.node_of(cell)
        return JobState(
            job_id, 0.0, gpus, "ds", GB, RATE, GB, placement={node: gpus}, policy_state=state, priority="low"
        )

    regular = _running("r", 1, hierarchy.index((0, 0, 0)), roots=0)._replace(
        policy_state={OPPORTUNISTIC: 0.0, "cells": 1.0, "level": 1.0, "c0": 0.0, "v0": 0.0}
    )
    jobs = {"r": regular, "x": low("x", (0, 0, 1), 1), "y": low("y", (0, 1), 2), "z": low("z", (1,), 4)}
    jobs["new"] = JobState("new", 1.0, 1, "ds", GB, RATE, GB, tenant="a")
    snapshot = Snapshot(0.0, nodes, 1e9, {}, jobs, tenants=tenants, cell_levels=levels)
    decision = quota().schedule(snapshot, SiloDPerf())
    assert decision.placements is not None and decision.placements["new"] == {"n2": 1}  # n0 and n1: preemptions
    assert {"x", "y", "z"} <= set(decision.placements)
    jobs["x"] = jobs["x"]._replace(placement={}, policy_state={})  # a free GPU on n0, beside the regular job
    decision = quota().schedule(replace(snapshot, jobs=jobs), SiloDPerf())
    assert decision.placements is not None and decision.placements["new"] == {"n0": 1}  # packed, no preemption


def tiresias_cluster(scheduler: str) -> ClusterSpec:
    shares = {"a": TenantShare(cells={"node": 1}, scheduler=scheduler), "b": TenantShare(cells={"node": 1})}
    return ClusterSpec(2, 4, 0, 1000 * GB, cell_levels="gpu:1,pcie:2,node:2", tenants=shares)


def test_a_tenant_may_run_tiresias_inside_its_vc() -> None:
    """Tenant a runs 2D-LAS in its VC: a short job arriving after a long one has passed 1 GPU-hour preempts it
    (the long one is in the lower queue), where FIFO would make it wait; tenant b's cells are untouched."""
    trace = [
        task("long", "a", 4, 5_000),  # 4 GPUs: 1 GPU-hour of service after 900 s
        task("short", "a", 4, 600, arrival=1_200),
        task("b1", "b", 4, 8_000, arrival=100),
    ]
    fifo = run(trace, "hived", tiresias_cluster("fifo"), overflow="false")
    assert fifo["short"].start == pytest.approx(5_000)
    las = run(trace, "hived", tiresias_cluster("tiresias"), overflow="false")
    assert las["short"].start == pytest.approx(1_200) and las["short"].finish == pytest.approx(1_800)
    assert las["long"].preemptions == 1 and las["long"].finish == pytest.approx(5_600)
    assert las["b1"].start == pytest.approx(100) and las["b1"].preemptions == 0


def test_under_tiresias_a_job_that_never_ran_does_not_preempt_one_of_its_own_queue() -> None:
    """Both in the first queue: the one that started first keeps its GPUs; the second waits for it, and does
    not overflow onto the other tenant's idle node with overflow off."""
    trace = [task("first", "a", 2, 1_000), task("second", "a", 4, 500, arrival=10)]  # first stays under 1 GPU-hour
    outcomes = run(trace, "hived", tiresias_cluster("tiresias"), overflow="false")
    assert outcomes["first"].preemptions == 0 and outcomes["second"].start == pytest.approx(1_000)


def test_a_tenant_scheduler_the_policy_does_not_know_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vcs.toml"
    path.write_text('[a]\ncells = { node = 1 }\nscheduler = "sjf"\n')
    with pytest.raises(SimInputError, match=r"tenant 'a': scheduler: 'sjf' is not one of fifo, tiresias"):
        load_tenants(path)


# ---- live: states written against another hierarchy, or by another policy ----


def _worker(job_id: str, submit: float, node: str, state: Mapping[str, float] | None = None) -> JobState:
    """A 1-GPU job registered with its worker on `node` (the cluster scheduler placed it), and its state."""
    return JobState(
        job_id, submit, 1, "ds", GB, RATE, GB, placement={node: 1}, policy_state=MappingProxyType(dict(state or {}))
    )


def test_states_recorded_on_an_oversubscribed_node_that_shrank_since_do_not_fail_the_round() -> None:
    """Five workers on a node of 4 GPUs make its node cell 5 GPUs; two finish and it is 4 again. The job whose
    state records the fifth GPU is adopted where a GPU is free instead of every round failing."""
    five = {f"j{i}": _worker(f"j{i}", float(i), "n1") for i in range(5)}
    first = hived().schedule(Snapshot(0.0, {"n1": NodeState("n1", 5, 0)}, 1e9, {}, five), SiloDPerf())
    left = {job_id: five[job_id]._replace(policy_state=first.job_states[job_id]) for job_id in ("j2", "j3", "j4")}
    assert left["j4"].policy_state["c0"] == 4.0  # the fifth GPU, which a 4-GPU node cell lacks
    left["new"] = JobState("new", 9.0, 1, "ds", GB, RATE, GB, priority="low")

    decision = hived().schedule(Snapshot(1.0, {"n1": NodeState("n1", 4, 0)}, 1e9, {}, left), SiloDPerf())

    assert decision.placements == {job_id: {"n1": 1} for job_id in ("j2", "j3", "j4", "new")}
    assert decision.job_states["j4"]["c0"] < 4.0


def test_cells_recorded_on_another_node_than_the_job_runs_on_are_not_replayed() -> None:
    """A node whose id sorts first registers: the state's cell index now names its GPU, not the one the job
    runs on. The job keeps its own node's GPU, and a new job goes to the free one."""
    running = _worker("a", 0.0, "n1", {OPPORTUNISTIC: 1.0, "cells": 1.0, "level": 1.0, "c0": 0.0})
    new = JobState("b", 1.0, 1, "ds", GB, RATE, GB, priority="low")
    nodes = {"n0": NodeState("n0", 1, 0), "n1": NodeState("n1", 1, 0)}

    decision = hived().schedule(Snapshot(0.0, nodes, 1e9, {}, {"a": running, "b": new}), SiloDPerf())

    assert decision.placements == {"a": {"n1": 1}, "b": {"n0": 1}}


def test_a_regular_job_taking_a_node_whose_gpus_one_adopted_job_holds_preempts_it_whole() -> None:
    """After a policy switch a job another policy ran on both GPUs of a node holds them as two low-priority
    GPU cells; a tenant's job needing that node cell preempts both at once (which failed every round)."""
    adopted = _worker("old", 0.0, "n0")._replace(gpus=2, placement=MappingProxyType({"n0": 2}))
    regular = JobState("new", 1.0, 2, "ds", GB, RATE, GB, tenant="a")
    snapshot = Snapshot(
        0.0,
        {"n0": NodeState("n0", 2, 0)},
        1e9,
        {},
        {"old": adopted, "new": regular},
        tenants={"a": TenantShare(cells={"node": 1})},
        cell_levels="gpu:1,node:2",
    )

    decision = hived().schedule(snapshot, SiloDPerf())

    assert decision.placements == {"new": {"n0": 2}}
    assert decision.job_states["old"] == {}


def test_a_state_hived_cannot_read_is_treated_as_no_state() -> None:
    """A state that lacks keys HiveD's has (another policy's, in a state dir older than the controller's record
    of who wrote it): the job is kept where it runs, adopted, and moved into its tenant's VC as its turn is now."""
    running = _worker("a", 0.0, "n0", {OPPORTUNISTIC: 0.0, "cells": 1.0, "level": 1.0, "c0": 0.0})._replace(tenant="a")
    snapshot = Snapshot(
        0.0,
        {"n0": NodeState("n0", 2, 0)},
        1e9,
        {},
        {"a": running},
        tenants={"a": TenantShare(cells={"node": 1})},
        cell_levels="gpu:1,node:2",
    )
    decision = hived().schedule(snapshot, SiloDPerf())
    assert decision.placements == {"a": {"n0": 1}}
    assert decision.job_states["a"] == {OPPORTUNISTIC: 0.0, "cells": 1.0, "level": 1.0, "c0": 0.0, "v0": 0.0}


def test_more_workers_on_a_node_than_a_node_cell_of_the_cell_levels_holds_do_not_fail_the_round() -> None:
    """The data manager refuses a node with more GPUs than a node cell, not more workers than its GPUs: the
    snapshot's node shows them all. The jobs beyond the node cell's GPUs hold no cell and keep running."""
    jobs = {f"j{i}": _worker(f"j{i}", float(i), "n1") for i in range(3)}
    snapshot = Snapshot(0.0, {"n1": NodeState("n1", 3, 0)}, 1e9, {}, jobs, cell_levels="gpu:1,node:2")
    decision = hived().schedule(snapshot, SiloDPerf())
    assert decision.placements == {job_id: {"n1": 1} for job_id in jobs}
