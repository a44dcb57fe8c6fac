"""The numbers of HiveD's evaluation in the simulator's report: the regular jobs' GPUs and fragmented nodes in the
timeline, utilisation, fragmentation and preempted GPUs in the summary, each tenant's moving-average queueing
delay (Figures 6 and 7), and sharing safety against the private cluster (section 5.2) in `silod sim compare`.

Every expected number is worked out by hand from the jobs written out in the test.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from datamgr.scheduler.registry import build_scheduler
from datamgr.scheduler.sim import plots, report, tenant_report
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, Sample, SimConfig, SimResult, TraceJob, Usage
from datamgr.scheduler.tenancy import TenantShare
from silodcli.main import main
from tests.sim_fixtures import GB, MB, is_png

HOUR = 3600.0
CLUSTER = ClusterSpec(nodes=2, gpus_per_node=4, cache_bytes_per_node=0, remote_io_bytes_per_sec=1000 * GB)


def job(job_id: str, arrival: float, delay: float, gpus: int = 1, tenant: str = "a", priority: str = "") -> JobOutcome:
    """A job never preempted that waited `delay` seconds before it ran for an hour."""
    start = arrival + delay
    return JobOutcome(
        job_id, arrival, start, start + HOUR, gpus, "d", 100.0, 0.0, 100.0,
        tenant=tenant, priority=priority, queued_seconds=delay,
    )  # fmt: skip


# Tenant a: x (2 GPUs) submitted at 0 waits 2 h, y at 5 h does not wait; tenant b: z at 1 h waits 10 minutes.
# Left out of the curves: a low-priority job and a job without a tenant, both of which waited long.
SHARED = [
    job("x", 0, 2 * HOUR, gpus=2),
    job("y", 5 * HOUR, 0),
    job("z", HOUR, 600, tenant="b"),
    job("low", 0, 9 * HOUR, priority="low"),
    job("nobody", 0, 9 * HOUR, tenant=""),
]
# The private cluster: the same jobs, x without any wait.
PRIVATE = [
    replace(j, start=j.arrival, finish=j.arrival + HOUR, queued_seconds=0.0) if j.job_id == "x" else j for j in SHARED
]


def curve(points: list[tenant_report.TenantDelay], tenant: str) -> list[tuple[float, int, float]]:
    return [(p.time / HOUR, p.jobs, p.average_delay) for p in points if p.tenant == tenant]


# --- the moving average ----------------------------------------------------------------------------------------


def test_a_tenants_delay_is_the_mean_over_its_regular_jobs_submitted_in_the_12_hours_up_to_each_hour() -> None:
    points = tenant_report.tenant_delays(SHARED)
    # Hours 0 to 5: from the earliest arrival to the latest, of the tenants' regular jobs.
    assert curve(points, "a") == [(0, 1, 7200), (1, 1, 7200), (2, 1, 7200), (3, 1, 7200), (4, 1, 7200), (5, 2, 3600)]
    b = curve(points, "b")
    assert b[0][:2] == (0, 0) and math.isnan(b[0][2])  # nothing of b's submitted yet: no average
    assert b[1:] == [(hour, 1, 600) for hour in range(1, 6)]
    assert {p.tenant for p in points} == {"a", "b"}  # neither the job without a tenant nor the low-priority one


def test_the_window_holds_the_jobs_submitted_after_its_start_up_to_and_including_its_end() -> None:
    # At 13 h the window is (1 h, 13 h]: x (at 0) and z (at exactly 1 h) have left it, y (at 5 h) is in it.
    (a, b) = tenant_report.tenant_delays(SHARED, times=[13 * HOUR])
    assert (a.tenant, a.jobs, a.average_delay) == ("a", 1, 0.0)
    assert (b.tenant, b.jobs) == ("b", 0) and math.isnan(b.average_delay)
    assert tenant_report.tenant_delays(SHARED, times=[HOUR])[1].jobs == 1  # z arrives at 1 h: in (-11 h, 1 h]


def test_window_ends_run_hourly_from_the_first_arrival_to_the_last_rounded_up() -> None:
    jobs = [job("p", 1.5 * HOUR, 0), job("q", 3.2 * HOUR, 0, tenant="b")]
    assert tenant_report.delay_times(jobs) == [2 * HOUR, 3 * HOUR, 4 * HOUR]
    assert tenant_report.delay_times([job("n", 0, 0, tenant="")]) == []


def test_tenant_delay_csv_has_a_row_per_tenant_and_hour(tmp_path: Path) -> None:
    tenant_report.write_tenant_delay_csv(tmp_path / "tenant_delay.csv", SimResult("hived", "silod", SHARED))
    rows = list(csv.DictReader((tmp_path / "tenant_delay.csv").open()))
    assert list(rows[0]) == ["time", "tenant", "jobs", "average_delay"]
    assert [(r["time"], r["tenant"], r["jobs"], r["average_delay"]) for r in rows[4:7]] == [
        ("14400.0", "a", "1", "7200.0"),
        ("18000.0", "a", "2", "3600.0"),
        ("0.0", "b", "0", "nan"),
    ]
    assert len(rows) == 12  # two tenants, six hours


# --- sharing safety --------------------------------------------------------------------------------------------


def test_a_job_delayed_2h_in_the_shared_cluster_and_not_at_all_in_the_private_one_is_an_excess_of_2h() -> None:
    a, b = tenant_report.sharing_safety(SimResult("quota", "silod", SHARED), SimResult("private", "silod", PRIVATE))
    # Tenant a's curves differ at hours 0 to 4 (7200 against 0), and at 5 h by 3600 against 0: the largest, first.
    assert (a.policy, a.cache_system, a.tenant) == ("quota", "silod", "a")
    assert (a.max_excess_delay, a.max_excess_at) == (7200.0, 0.0)
    assert (a.multi_gpu_jobs, a.delayed_jobs, a.delayed_share) == (1, 1, 1.0)  # x; y has one GPU
    # Tenant b's curves are the same: no excess, and no multi-GPU job to count.
    assert (b.tenant, b.max_excess_delay, b.multi_gpu_jobs, b.delayed_jobs) == ("b", 0.0, 0, 0)
    assert math.isnan(b.max_excess_at) and math.isnan(b.delayed_share)


def test_a_run_never_above_the_private_curve_has_no_excess() -> None:
    (a, _) = tenant_report.sharing_safety(SimResult("hived", "silod", PRIVATE), SimResult("private", "silod", SHARED))
    assert a.max_excess_delay == 0.0 and math.isnan(a.max_excess_at)
    assert (a.multi_gpu_jobs, a.delayed_jobs, a.delayed_share) == (1, 0, 0.0)


def test_delays_that_differ_only_in_the_last_bits_of_a_float_are_no_excess() -> None:
    """Two runs' starts of one job differed by 2.9e-11 s on hived-tenants: the table showed an excess of 0s at 2.0d
    for a tenant no job of which waited longer."""
    private = [job("m", 0, 2908.5, gpus=4)]
    shared = [job("m", 0, 2908.500000000029, gpus=4)]
    (row,) = tenant_report.sharing_safety(SimResult("hived", "silod", shared), SimResult("private", "silod", private))
    assert row.max_excess_delay == 0.0 and math.isnan(row.max_excess_at)


def test_a_multi_gpu_job_counts_as_delayed_only_beyond_a_minute_more_than_in_the_private_cluster() -> None:
    assert tenant_report.EXCESS_THRESHOLD == 60.0
    private = [job("m", 0, 100, gpus=4), job("n", 0, 100, gpus=2)]
    shared = [job("m", 0, 160, gpus=4), job("n", 0, 161, gpus=2)]  # 60 s more: not delayed; 61 s more: delayed
    (row,) = tenant_report.sharing_safety(SimResult("quota", "silod", shared), SimResult("private", "silod", private))
    assert (row.multi_gpu_jobs, row.delayed_jobs, row.delayed_share) == (2, 1, 0.5)


def test_a_multi_gpu_job_finished_in_only_one_run_is_not_compared() -> None:
    private = [job("m", 0, 0, gpus=4)]
    shared = [job("m", 0, HOUR, gpus=4), job("late", 0, HOUR, gpus=2)]  # "late" did not finish in private
    (row,) = tenant_report.sharing_safety(SimResult("quota", "silod", shared), SimResult("private", "silod", private))
    assert (row.multi_gpu_jobs, row.delayed_jobs) == (1, 1)


def runs_of(*results: SimResult) -> list[tuple[SimResult, report.Summary]]:
    return [(result, report.summarize(result, CLUSTER)) for result in results]


def test_each_shared_run_is_compared_with_the_private_run_on_its_cache_system() -> None:
    runs = runs_of(
        SimResult("private", "silod", PRIVATE),
        SimResult("quota", "silod", SHARED),
        SimResult("quota", "alluxio", SHARED),  # no private run on alluxio: nothing to compare it with
        SimResult("hived", "silod", PRIVATE),
    )
    pairs = tenant_report.sharing_safety_runs(runs)
    assert [(s.policy, s.cache_system, p.policy, p.cache_system) for s, p in pairs] == [
        ("quota", "silod", "private", "silod"),
        ("hived", "silod", "private", "silod"),
    ]
    rows = tenant_report.sharing_safety_rows(runs)
    assert [(r.policy, r.tenant, r.max_excess_delay) for r in rows] == [
        ("quota", "a", 7200.0),
        ("quota", "b", 0.0),
        ("hived", "a", 0.0),
        ("hived", "b", 0.0),
    ]
    assert tenant_report.worst_tenant(rows[:2]) == "a"
    assert tenant_report.worst_tenant(rows[2:]) == "a"  # no excess anywhere: the first by name
    assert tenant_report.worst_tenant([]) is None


def markdown_tables(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after `heading` in a Markdown document, its header row first."""
    lines = text.splitlines()
    start = lines.index(heading) + 2
    end = lines.index("", start)
    return [line[2:-2].split(" | ") for line in lines[start:end] if not line.startswith("| ---")]


def test_compare_md_has_a_sharing_safety_section_with_a_table_per_shared_run(tmp_path: Path) -> None:
    runs = runs_of(SimResult("private", "silod", PRIVATE), SimResult("quota", "silod", SHARED))
    report.write_comparison_markdown(tmp_path / "compare.md", runs, "silod", tenant_report.sharing_safety_section(runs))
    text = (tmp_path / "compare.md").read_text()
    assert markdown_tables(text, "### quota/silod against private/silod") == [
        list(tenant_report.SAFETY_HEADERS),
        ["a", "2.0h", "0s", "1", "1", "100%"],
        ["b", "0s", "-", "0", "0", "-"],
    ]
    cluster = markdown_tables(text, "## Sharing safety")
    assert cluster[0] == list(tenant_report.CLUSTER_HEADERS) and [row[:2] for row in cluster[1:]] == [
        ["private", "silod"],
        ["quota", "silod"],
    ]
    assert "by more than 1.0m" in text  # the threshold, stated


def test_compare_md_has_no_sharing_safety_section_without_a_private_run(tmp_path: Path) -> None:
    runs = runs_of(SimResult("hived", "silod", SHARED), SimResult("quota", "silod", SHARED))
    assert tenant_report.sharing_safety_section(runs) == []


def test_sharing_safety_csv_has_a_row_per_shared_run_and_tenant(tmp_path: Path) -> None:
    runs = runs_of(SimResult("private", "silod", PRIVATE), SimResult("quota", "silod", SHARED))
    tenant_report.write_sharing_safety_csv(tmp_path / "sharing_safety.csv", tenant_report.sharing_safety_rows(runs))
    rows = list(csv.DictReader((tmp_path / "sharing_safety.csv").open()))
    assert [list(row.values()) for row in rows] == [
        ["quota", "silod", "a", "7200.0", "0.0", "1", "1", "1.0"],
        ["quota", "silod", "b", "0.0", "nan", "0", "0", "nan"],
    ]
    assert list(rows[0]) == [
        "policy",
        "cache_system",
        "tenant",
        "max_excess_delay",
        "max_excess_at",
        "multi_gpu_jobs",
        "delayed_jobs",
        "delayed_share",
    ]


def test_the_tenant_plots_are_png_files(tmp_path: Path) -> None:
    samples = [Sample(60.0 * i, 0.0, 0.0, 6, 2, 0, 0, 0, 1.0, 1.0, 0.0, 2, 1) for i in range(10)]
    shared = SimResult("quota", "silod", SHARED, samples)
    plots.plot_tenant_delay(tmp_path / "tenant_delay.png", shared, CLUSTER)
    runs = runs_of(SimResult("private", "silod", PRIVATE), shared)
    pairs = tenant_report.sharing_safety_runs(runs)
    plots.plot_sharing_safety(tmp_path / "sharing_safety.png", pairs, tenant_report.sharing_safety_rows(runs))
    plots.plot_sharing_safety(tmp_path / "nobody.png", [], [])  # no tenant: a panel saying so
    for name in ("tenant_delay.png", "sharing_safety.png", "nobody.png"):
        assert is_png(tmp_path / name), name


def test_a_delay_point_with_no_neighbour_to_join_is_drawn_as_a_marker(tmp_path: Path) -> None:
    # Window ends at hours 0 to 20. Tenant a: p at 0 h is in the windows of hours 0-11, q at 20 h alone in hour 20's,
    # between them gaps (NaN). Tenant b: r at 20 h, in the last window only. A line joins hours 0-11 of a; hour 20
    # of either has no neighbour, and a line alone draws nothing there.
    jobs = [job("p", 0, 600), job("q", 20 * HOUR, 600), job("r", 20 * HOUR, 1200, tenant="b")]
    figure = plots.plot_tenant_delay(tmp_path / "tenant_delay.png", SimResult("quota", "silod", jobs), CLUSTER)
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    for tenant, minutes in (("a", 10), ("b", 20)):
        line = lines[tenant]
        assert line.get_marker() == "o" and line.get_markevery() == [20]
        assert np.asarray(line.get_ydata())[20] == minutes  # a finite point, the one marked
    a = np.asarray(lines["a"].get_ydata())
    assert math.isnan(a[12]) and a[11] == 10  # joined up to hour 11


# --- utilisation, fragmentation and preempted GPUs ---------------------------------------------------------------


def test_the_summary_averages_utilisation_and_fragmentation_over_the_time_from_the_first_arrival() -> None:
    # From the first arrival (60 s) to the end (180 s), 120 s of 8 GPUs and 2 nodes: 720 GPU-seconds held (6 GPUs
    # on average), 360 by regular jobs, and 180 node-seconds fragmented. The samples are not what is averaged.
    samples = [Sample(60, 0.0, 0.0, 0, 0, 0, 0, 0, 1.0, 1.0)]
    usage = Usage(end=180, gpu_seconds=720, regular_gpu_seconds=360, fragmented_node_seconds=180, running_seconds=120)
    preempted = replace(job("p", 60, 0, gpus=4), preemptions=2)  # 2 preemptions of 4 GPUs
    result = SimResult("hived", "silod", [preempted, job("q", 90, 0, gpus=2)], samples, usage=usage)
    summary = report.summarize(result, CLUSTER)
    assert (summary.gpu_utilisation, summary.regular_gpu_utilisation, summary.fragmentation) == (0.75, 0.375, 0.75)
    assert (summary.preemptions, summary.preempted_gpus) == (2, 8)
    text = report.summary_text(summary)
    assert (
        "  GPUs          75% busy on average, 38% by regular jobs; 75% of nodes fragmented (a regular job on them)"
        in text
    )
    assert "  preemptions   2 (8 GPUs), " in text
    empty = report.summarize(SimResult("hived", "silod", [], samples, usage=usage), CLUSTER)
    assert math.isnan(empty.gpu_utilisation) and math.isnan(empty.fragmentation)


def test_compare_csv_and_summary_json_carry_utilisation_fragmentation_and_preempted_gpus(tmp_path: Path) -> None:
    runs = runs_of(SimResult("quota", "silod", [replace(job("p", 0, 0, gpus=4), preemptions=3)]))
    report.write_comparison_csv(tmp_path / "compare.csv", runs, "silod")
    (row,) = csv.DictReader((tmp_path / "compare.csv").open())
    assert row["preempted_gpus"] == "12"
    assert {"gpu_utilisation", "regular_gpu_utilisation", "fragmentation"} <= set(row)
    report.write_summary_json(tmp_path / "summary.json", runs[0][1])
    assert '"preempted_gpus": 12' in (tmp_path / "summary.json").read_text()


# --- the engine's samples --------------------------------------------------------------------------------------

RATE = 10 * MB  # f* of every job: a 10 GB epoch takes 1,000 s on one GPU's share


def task(job_id: str, gpus: int, seconds: float, priority: str = "") -> TraceJob:
    """A job of tenant a that trains `seconds` at full speed on `gpus` GPUs (storage never limits it)."""
    epochs = seconds * RATE * gpus / (10 * GB)
    return TraceJob(job_id, 0.0, gpus, "m", RATE * gpus, f"ds-{job_id}", 10 * GB, epochs, tenant="a", priority=priority)


def test_samples_count_the_gpus_and_nodes_of_regular_jobs_apart_from_low_priority_ones() -> None:
    """Under hived, tenant a's VC is one 4-GPU node: its regular 2-GPU job runs there, its low-priority 4-GPU job
    on the other node. Both busy: 6 GPUs, 2 of them regular, on one fragmented node."""
    vcs = {"a": TenantShare(cells={"node": 1}), "b": TenantShare(cells={"node": 1})}
    cluster = replace(CLUSTER, cell_levels="gpu:1,pcie:2,node:2", tenants=vcs)
    trace = [task("regular", 2, 600), task("scavenger", 4, 1200, priority="low")]
    result = simulate(trace, cluster, build_scheduler("hived", "silod"), SimConfig(round_seconds=60))
    by_time = {s.time: s for s in result.samples}
    both, alone = by_time[300.0], by_time[900.0]  # the regular job ends at 600 s, the low-priority one at 1,200
    assert (both.busy_gpus, both.regular_busy_gpus, both.fragmented_nodes) == (6, 2, 1)
    assert (alone.busy_gpus, alone.regular_busy_gpus, alone.fragmented_nodes) == (4, 0, 0)
    fifo = simulate(trace, cluster, build_scheduler("fifo", "silod"), SimConfig(round_seconds=60))
    fifo_both = {s.time: s for s in fifo.samples}[300.0]  # a policy that marks nothing: every job is regular
    assert (fifo_both.busy_gpus, fifo_both.regular_busy_gpus, fifo_both.fragmented_nodes) == (6, 6, 2)


# --- the command -----------------------------------------------------------------------------------------------


def tenant_inputs(tmp_path: Path) -> list[str]:
    """--trace and --cluster arguments: two tenants, a 4-GPU node cell each, on two nodes."""
    trace = tmp_path / "tenants.csv"
    trace.write_text(
        "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs,tenant\n"
        "a1,0,1,m,10MB/s,d1,10GB,1,a\n"
        "a2,60,2,m,20MB/s,d2,10GB,1,a\n"
        "b1,120,4,m,40MB/s,d3,10GB,1,b\n"
    )
    cluster = tmp_path / "c.toml"
    cluster.write_text(
        'nodes = 2\ngpus_per_node = 4\ncache_per_node = "0GB"\nremote_io = "1TB/s"\n'
        "[tenants.a]\ncells = { node = 1 }\n[tenants.b]\ncells = { node = 1 }\n"
    )
    return ["--trace", str(trace), "--cluster", str(cluster)]


@pytest.mark.parametrize(("policies", "safety"), [("private,quota,hived", True), ("quota,hived", False)])
def test_compare_writes_sharing_safety_only_beside_the_private_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policies: str, safety: bool
) -> None:
    out = tmp_path / "cmp"
    out.mkdir()
    for stale in ("sharing_safety.csv", "sharing_safety.png"):  # an earlier compare's: kept only when rewritten
        (out / stale).write_text("old")
    argv = ["sim", "compare", *tenant_inputs(tmp_path), "--policies", policies, "--cache-systems", "silod"]
    assert main([*argv, "--out", str(out), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert ("sharing_safety.csv, sharing_safety.png" in printed) is safety
    assert ("## Sharing safety" in (out / "compare.md").read_text()) is safety
    assert (out / "sharing_safety.csv").exists() is safety
    if safety:
        assert is_png(out / "sharing_safety.png")
        rows = list(csv.DictReader((out / "sharing_safety.csv").open()))
        assert [(r["policy"], r["tenant"]) for r in rows] == [
            ("quota", "a"),
            ("quota", "b"),
            ("hived", "a"),
            ("hived", "b"),
        ]
    for run in policies.split(","):  # every run writes its tenants' delays
        delays = list(csv.DictReader((out / f"{run}-silod" / "tenant_delay.csv").open()))
        assert {row["tenant"] for row in delays} == {"a", "b"}
        assert is_png(out / f"{run}-silod" / "tenant_delay.png")
