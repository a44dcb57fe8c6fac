"""The simulator report's distributions and breakdowns: percentiles, queueing delays, slowdowns, preemption
shares and re-scheduling intervals, groups by GPU count and by trace label, and the files that carry them
(summary.json, groups.csv, jobs.csv's label and interval columns, compare.md, the slowdown plot).

Every expected number is worked out by hand from the jobs written out in the test.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from datamgr.scheduler.sim import plots, report
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, SimResult, Usage
from silodcli.tables import render_table
from tests.sim_fixtures import is_png

CLUSTER = ClusterSpec(nodes=2, gpus_per_node=8, cache_bytes_per_node=10**12, remote_io_bytes_per_sec=1e9)


def job(
    job_id: str, arrival: float, start: float, finish: float, gpus: int = 1, tenant: str = "", job_class: str = ""
) -> JobOutcome:
    """A job never preempted: it waited from its arrival to its start, then ran to its finish."""
    return JobOutcome(
        job_id, arrival, start, finish, gpus, "d", 100.0, 0.0, 100.0,
        tenant=tenant, job_class=job_class, queued_seconds=start - arrival,
    )  # fmt: skip


def preempted(
    job_id: str,
    arrival: float,
    finish: float,
    queued: float,
    restarts: tuple[float, ...] = (),
    job_class: str = "",
) -> JobOutcome:
    """A job that waited `queued` seconds in all, of which each of `restarts` after a preemption."""
    outcome = job(job_id, arrival, arrival, finish, job_class=job_class)
    return replace(outcome, queued_seconds=queued, preemptions=len(restarts), restart_seconds=restarts)


# JCTs 100, 200, 300, 400, 1000; queueing delays 0, 50, 10, 100, 40.
# Slowdowns 1 + waiting / executing: 1, 1 + 50/150 = 4/3, 1 + 10/290 = 30/29, 1 + 100/300 = 4/3, 1 + 40/960 = 25/24.
JOBS = [
    job("a", 0, 0, 100, gpus=1, tenant="vc-a"),
    job("b", 0, 50, 200, gpus=2, tenant="vc-b"),
    job("c", 100, 110, 400, gpus=16, tenant="vc-a"),
    job("d", 100, 200, 500, gpus=1),
    job("e", 0, 40, 1000, gpus=2, tenant="vc-b"),
]


def summary_of(*jobs: JobOutcome, policy: str = "fifo", cache_system: str = "silod") -> report.Summary:
    return report.summarize(SimResult(policy, cache_system, list(jobs)), CLUSTER)


def groups(summary: report.Summary, kind: str) -> dict[str, report.GroupSummary]:
    return {g.value: g for g in summary.groups if g.kind == kind}


def numbers(group: report.GroupSummary) -> tuple[float, ...]:
    return (group.finished, group.average_jct, group.p95_jct, group.average_queueing_delay)


def slowdown_percentiles(numbers: report.Summary | report.GroupSummary) -> tuple[float, float, float]:
    return (numbers.median_slowdown, numbers.p95_slowdown, numbers.p99_slowdown)


# --- percentiles and queueing ----------------------------------------------------------------------------------


def test_percentiles_interpolate_linearly_between_closest_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10 20 30 40, ranks 0..3
    assert report.percentile(values, 0) == 10 and report.percentile(values, 100) == 40
    assert report.percentile(values, 50) == 25  # rank 1.5: halfway between 20 and 30
    assert report.percentile(values, 95) == pytest.approx(38.5)  # rank 2.85: 30 + 0.85 x 10
    assert report.percentile(values, 99) == pytest.approx(39.7)  # rank 2.97
    assert report.percentile([7.0], 95) == 7
    assert math.isnan(report.percentile([], 50))


@pytest.mark.parametrize("values", [[3.0, 1.0, 2.0], [5.0, 1.0, 4.0, 2.0], [1.0, 1.0, 9.0, 10.0, 11.0, 12.0]])
def test_the_50th_percentile_is_the_median(values: list[float]) -> None:
    assert report.percentile(values, 50) == statistics.median(values)


def test_the_summary_has_jct_percentiles_and_queueing_delays_from_the_first_start() -> None:
    summary = summary_of(*JOBS)
    assert summary.average_jct == 400
    assert summary.median_jct == 300
    assert summary.p95_jct == pytest.approx(880)  # rank 3.8 of 100 200 300 400 1000: 400 + 0.8 x 600
    assert summary.p99_jct == pytest.approx(976)  # rank 3.96
    assert summary.average_queueing_delay == 40  # (0 + 50 + 10 + 100 + 40) / 5
    assert summary.median_queueing_delay == 40  # of 0 10 40 50 100
    assert summary.p95_queueing_delay == pytest.approx(90)  # rank 3.8: 50 + 0.8 x 50


def test_a_run_without_finished_jobs_has_nothing_to_measure() -> None:
    summary = summary_of()
    assert math.isnan(summary.p95_jct) and math.isnan(summary.average_queueing_delay)
    assert summary.groups == ()


def test_the_summary_text_shows_jct_percentiles_and_queueing() -> None:
    text = report.summary_text(summary_of(*JOBS))
    assert "average JCT   6.7m (median 5.0m, p95 14.7m, p99 16.3m)" in text
    assert "queueing      40s average (median 40s, p95 1.5m) from arrival to first start" in text


def test_an_infinite_value_stays_infinite_in_a_percentile_rather_than_turning_nan() -> None:
    # A job that never executed has an infinite slowdown: on its rank, or between two, the percentile is inf.
    assert report.percentile([1.0, math.inf], 100) == math.inf
    assert report.percentile([1.0, math.inf, math.inf], 75) == math.inf  # rank 1.5, between two infinities
    assert report.percentile([1.0, 2.0, math.inf], 50) == 2  # rank 1: the value itself, not 2 + 0 x inf


# --- slowdown --------------------------------------------------------------------------------------------------

# Slowdowns 1, 2, 3, 5, 11: waiting 0, 50, 200, 400, 1000 s over executing 100, 50, 100, 100, 100 s. The job of
# slowdown 3 first ran at once and waited its 200 s after a preemption: all waiting counts, not only the first.
SLOWED = [
    job("s1", 0, 0, 100, job_class="te"),
    job("s2", 0, 50, 100, job_class="te"),
    preempted("s3", 0, 300, queued=200, restarts=(200,), job_class="be"),
    job("s5", 0, 400, 500, job_class="be"),
    job("s11", 0, 1000, 1100, job_class="be"),
]


def test_slowdown_is_one_plus_the_time_waiting_over_the_time_executing() -> None:
    assert [j.slowdown for j in SLOWED] == [1, 2, 3, 5, 11]


def test_the_summary_has_slowdown_percentiles_over_finished_jobs() -> None:
    summary = summary_of(*SLOWED)
    # Ranks 2, 3.8 and 3.96 of 1 2 3 5 11: 3, 5 + 0.8 x 6 and 5 + 0.96 x 6.
    assert slowdown_percentiles(summary) == pytest.approx((3, 9.8, 10.76))
    assert all(math.isnan(value) for value in slowdown_percentiles(summary_of()))


def test_the_class_groups_have_slowdown_percentiles_as_fitgpps_table_1() -> None:
    by_class = groups(summary_of(*SLOWED), "class")
    assert list(by_class) == ["be", "te"]
    assert slowdown_percentiles(by_class["te"]) == pytest.approx((1.5, 1.95, 1.99))  # of 1 and 2
    assert slowdown_percentiles(by_class["be"]) == pytest.approx((5, 10.4, 10.88))  # ranks 1, 1.9, 1.98 of 3 5 11


def test_the_summary_text_shows_the_slowdown_to_three_significant_digits() -> None:
    assert "  slowdown      3.00 median (p95 9.80, p99 10.8): 1 + time waiting / time executing" in (
        report.summary_text(summary_of(*SLOWED))
    )
    slow = summary_of(job("x", 0, 24_940, 25_040))  # waited 24,940 s, ran 100: slowdown 250.4
    assert "  slowdown      250 median (p95 250, p99 250)" in report.summary_text(slow)


# --- preemptions -----------------------------------------------------------------------------------------------

# Ten jobs preempted 0, 0, 0, 0, 0, 1, 1, 2, 3 and 4 times; their re-scheduling intervals 60; 30; 120, 240; 10, 20,
# 30; 5, 5, 5, 5.
PREEMPTED = [
    *(job(f"n{i}", 0, 0, 1000) for i in range(5)),
    preempted("p1", 0, 1000, queued=60, restarts=(60.0,)),
    preempted("p1b", 0, 1000, queued=30, restarts=(30.0,)),
    preempted("p2", 0, 1000, queued=360, restarts=(120.0, 240.0)),
    preempted("p3", 0, 1000, queued=60, restarts=(10.0, 20.0, 30.0)),
    preempted("p4", 0, 1000, queued=20, restarts=(5.0, 5.0, 5.0, 5.0)),
]


def test_the_shares_of_jobs_preempted_at_least_once_and_once_twice_and_three_or_more_times() -> None:
    summary = summary_of(*PREEMPTED)
    assert summary.preemptions == 11
    assert summary.preempted_share == 0.5  # 5 of 10
    shares = (summary.preempted_once_share, summary.preempted_twice_share, summary.preempted_3_plus_share)
    assert shares == (0.2, 0.1, 0.2)  # p1 and p1b; p2; p3 and p4
    assert report.preemption_shares([]) == pytest.approx((math.nan,) * 4, nan_ok=True)


def test_rescheduling_intervals_are_percentiles_over_every_preemption_of_a_finished_job() -> None:
    summary = summary_of(*PREEMPTED)
    # Sorted: 5 5 5 5 10 20 30 30 60 120 240 (11 intervals, ranks 0..10). p50: rank 5, 20; p75: rank 7.5, 30 + 0.5
    # x 30 = 45; p95: rank 9.5, 120 + 0.5 x 120 = 180; p99: rank 9.9, 120 + 0.9 x 120 = 228.
    intervals = (
        summary.median_rescheduling_interval,
        summary.p75_rescheduling_interval,
        summary.p95_rescheduling_interval,
        summary.p99_rescheduling_interval,
    )
    assert intervals == pytest.approx((20, 45, 180, 228))


def test_a_job_never_preempted_adds_no_rescheduling_interval() -> None:
    assert report.rescheduling_intervals(PREEMPTED[:5]) == []
    with_them = summary_of(*PREEMPTED)
    without_them = summary_of(*PREEMPTED[5:])
    assert with_them.p75_rescheduling_interval == without_them.p75_rescheduling_interval == 45
    assert without_them.preempted_share == 1.0  # the shares do count them, as jobs not preempted
    nothing = summary_of(*PREEMPTED[:5])
    assert nothing.preempted_share == 0 and math.isnan(nothing.median_rescheduling_interval)


def test_the_summary_text_adds_preempted_shares_and_intervals_only_when_jobs_were_preempted() -> None:
    lines = report.summary_text(summary_of(*PREEMPTED)).splitlines()
    assert lines[-2] == (
        "  preemptions   11 (11 GPUs), 0s restoring checkpoints in all; 50% of jobs preempted (20% once, 10% twice, "
        "20% 3+ times)"
    )
    assert (
        lines[-1]
        == "  rescheduling  20s median (p75 45s, p95 3.0m, p99 3.8m) from a preemption to the restart after it"
    )
    calm = report.summary_text(summary_of(*JOBS)).splitlines()
    assert calm[-1] == "  preemptions   0, 0s restoring checkpoints in all"
    rare = [*PREEMPTED[5:6], *(job(f"n{i}", 0, 0, 10) for i in range(159))]  # one job of 160: 0.625 %
    assert "; 0.625% of jobs preempted (0.625% once, 0% twice, 0% 3+ times)" in report.summary_text(summary_of(*rare))


# --- groups ----------------------------------------------------------------------------------------------------


def test_jobs_are_grouped_by_gpu_count_in_numeric_order() -> None:
    by_gpus = groups(summary_of(*JOBS), "gpus")
    assert list(by_gpus) == ["1", "2", "16"]  # not "16" before "2"
    assert numbers(by_gpus["1"]) == pytest.approx((2, 250, 385, 50))  # JCTs 100 and 400, waits 0 and 100
    assert numbers(by_gpus["2"]) == pytest.approx((2, 600, 960, 45))  # JCTs 200 and 1000, waits 50 and 40
    assert numbers(by_gpus["16"]) == (1, 300, 300, 10)


def test_a_label_column_is_a_breakdown_only_when_some_job_has_a_value() -> None:
    summary = summary_of(*JOBS)
    by_tenant = groups(summary, "tenant")
    assert list(by_tenant) == ["", "vc-a", "vc-b"]  # job d has no tenant
    assert [by_tenant[t].finished for t in by_tenant] == [1, 2, 2]
    assert by_tenant["vc-b"].average_jct == 600 and by_tenant["vc-a"].average_queueing_delay == 5
    assert not groups(summary, "class")  # no job has a class
    unlabelled = summary_of(job("x", 0, 0, 10))
    assert {g.kind for g in unlabelled.groups} == {"gpus", "bin"}
    classes = groups(summary_of(job("x", 0, 0, 10, job_class="best-effort"), job("y", 0, 5, 10)), "class")
    assert list(classes) == ["", "best-effort"]


def test_jobs_fall_in_tiresias_bins_by_gpus_and_training_time_at_full_speed() -> None:
    def binned(gpus: int, hours: float) -> str:
        outcome = replace(job("j", 0, 0, 1, gpus=gpus), ideal_seconds=hours * 3600)
        return report.job_bin(outcome)

    assert [binned(8, 3.99), binned(8, 4.0), binned(9, 0.1), binned(16, 40)] == ["SS", "SL", "LS", "LL"]
    summary = summary_of(
        replace(job("a", 0, 0, 100, gpus=1), ideal_seconds=60, preemptions=2, overhead_seconds=120),
        replace(job("b", 0, 50, 300, gpus=16), ideal_seconds=5 * 3600, preemptions=1, overhead_seconds=60),
    )
    assert {value: g.finished for value, g in groups(summary, "bin").items()} == {"LL": 1, "SS": 1}
    assert (summary.preemptions, summary.preemption_overhead) == (3, 180)


def test_group_rows_are_the_groups_of_one_kind_in_human_units() -> None:
    rows = report.group_rows(summary_of(*JOBS), "gpus")
    # Slowdowns: 1-GPU jobs 1 and 4/3 (p50 7/6, p95 1 + 0.95/3, p99 1 + 0.99/3); 2-GPU jobs 25/24 and 4/3
    # (p50 1.1875, p95 25/24 + 0.95 x 7/24 = 1.3188, p99 1.3304); the 16-GPU job 30/29.
    assert rows == [
        ("1", "2", "4.2m", "6.4m", "50s", "1.17", "1.32", "1.33"),
        ("2", "2", "10.0m", "16.0m", "45s", "1.19", "1.32", "1.33"),
        ("16", "1", "5.0m", "5.0m", "10s", "1.03", "1.03", "1.03"),
    ]
    assert len(report.GROUP_HEADERS) == len(rows[0]) - 1  # the first cell is the group's value


# --- files -----------------------------------------------------------------------------------------------------


def test_summary_json_is_strict_json_in_plain_units_with_null_for_nothing_measured(tmp_path: Path) -> None:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    report.write_summary_json(tmp_path / "full.json", summary_of(*JOBS))
    full = json.loads((tmp_path / "full.json").read_text(), parse_constant=refuse)
    assert (full["label"], full["finished"], full["p95_queueing_delay"]) == ("fifo/silod", 5, pytest.approx(90))
    assert full["groups"][0] == {
        "kind": "gpus",
        "value": "1",
        "finished": 2,
        "average_jct": 250,
        "p95_jct": pytest.approx(385),
        "average_queueing_delay": 50,
        "median_slowdown": pytest.approx(7 / 6),  # of 1 and 4/3
        "p95_slowdown": pytest.approx(1 + 0.95 / 3),
        "p99_slowdown": pytest.approx(1 + 0.99 / 3),
    }
    assert [(g["kind"], g["value"]) for g in full["groups"]][3:] == [
        ("bin", "LS"),
        ("bin", "SS"),
        ("tenant", ""),
        ("tenant", "vc-a"),
        ("tenant", "vc-b"),
    ]
    report.write_summary_json(tmp_path / "empty.json", summary_of())
    empty = json.loads((tmp_path / "empty.json").read_text(), parse_constant=refuse)
    assert empty["average_jct"] is None and empty["groups"] == []


def test_groups_csv_has_one_row_per_group(tmp_path: Path) -> None:
    report.write_groups_csv(tmp_path / "groups.csv", summary_of(*JOBS))
    rows = list(csv.DictReader((tmp_path / "groups.csv").open()))
    assert list(rows[0]) == [
        "kind",
        "value",
        "finished",
        "average_jct",
        "p95_jct",
        "average_queueing_delay",
        "median_slowdown",
        "p95_slowdown",
        "p99_slowdown",
    ]
    assert [(r["kind"], r["value"], r["finished"]) for r in rows] == [
        ("gpus", "1", "2"),
        ("gpus", "2", "2"),
        ("gpus", "16", "1"),
        ("bin", "LS", "1"),
        ("bin", "SS", "4"),
        ("tenant", "", "1"),
        ("tenant", "vc-a", "2"),
        ("tenant", "vc-b", "2"),
    ]
    assert float(rows[6]["average_queueing_delay"]) == 5
    assert float(rows[2]["p99_slowdown"]) == pytest.approx(30 / 29)  # the 16-GPU job alone


def test_summary_json_carries_the_slowdown_and_preemption_numbers(tmp_path: Path) -> None:
    report.write_summary_json(tmp_path / "summary.json", summary_of(*PREEMPTED))
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["preempted_share"] == 0.5 and written["preempted_3_plus_share"] == 0.2
    assert written["p95_rescheduling_interval"] == pytest.approx(180)
    # Slowdowns: five 1s, then p4's 1 + 20/980, p1b's 1 + 30/970, p1's and p3's 1 + 60/940, p2's 1 + 360/640.
    # The median sits at rank 4.5, halfway between the fifth 1 and p4's.
    assert written["median_slowdown"] == pytest.approx(1 + 0.5 * 20 / 980)
    report.write_summary_json(tmp_path / "none.json", summary_of(*JOBS))
    calm = json.loads((tmp_path / "none.json").read_text())
    assert calm["preempted_share"] == 0 and calm["median_rescheduling_interval"] is None  # no preemption to time


def test_summary_json_writes_an_infinite_slowdown_as_null(tmp_path: Path) -> None:
    never_ran = replace(job("x", 0, 0, 100), queued_seconds=100.0)  # waited its whole stay: slowdown inf
    report.write_summary_json(tmp_path / "summary.json", summary_of(never_ran))
    written = json.loads((tmp_path / "summary.json").read_text())  # strict JSON would refuse Infinity
    assert written["p99_slowdown"] is None and written["groups"][0]["median_slowdown"] is None


def test_compare_csv_has_the_slowdown_and_preemption_columns(tmp_path: Path) -> None:
    runs = [(SimResult("fitgpp", "silod", PREEMPTED), summary_of(*PREEMPTED, policy="fitgpp"))]
    report.write_comparison_csv(tmp_path / "compare.csv", runs, "silod")
    (row,) = csv.DictReader((tmp_path / "compare.csv").open())
    assert float(row["preempted_once_share"]) == 0.2 and float(row["preempted_twice_share"]) == 0.1
    assert float(row["p99_rescheduling_interval"]) == pytest.approx(228)
    # Rank 8.91 of the ten slowdowns (see the summary.json test): from p3's 1 + 60/940 towards p2's 1 + 360/640.
    assert float(row["p99_slowdown"]) == pytest.approx(1 + 60 / 940 + 0.91 * (360 / 640 - 60 / 940))


def test_jobs_csv_writes_the_rescheduling_intervals_as_numbers_joined_by_semicolons(tmp_path: Path) -> None:
    result = SimResult("fitgpp", "silod", [PREEMPTED[0], PREEMPTED[5], PREEMPTED[7]])
    report.write_jobs_csv(tmp_path / "jobs.csv", result)
    rows = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert [row["restart_seconds"] for row in rows] == ["", "60.0", "120.0;240.0"]
    assert [row["preemptions"] for row in rows] == ["0", "1", "2"]


def test_jobs_csv_names_the_labels_by_their_trace_columns(tmp_path: Path) -> None:
    result = SimResult("fifo", "silod", [job("a", 0, 5, 10, tenant="vc-a", job_class="best-effort")])
    report.write_jobs_csv(tmp_path / "jobs.csv", result)
    (row,) = csv.DictReader((tmp_path / "jobs.csv").open())
    assert (row["tenant"], row["class"], row["start"]) == ("vc-a", "best-effort", "5")
    assert "job_class" not in row


def test_compare_md_is_the_printed_table_with_the_percentiles_added(tmp_path: Path) -> None:
    runs = [
        (SimResult("fifo", policy_cache, jobs), summary_of(*jobs, cache_system=policy_cache))
        for policy_cache, jobs in (("alluxio", JOBS), ("silod", JOBS[:2]))
    ]
    report.write_comparison_markdown(tmp_path / "compare.md", runs, "alluxio")
    lines = (tmp_path / "compare.md").read_text().splitlines()

    def cells(line: str) -> list[str]:
        assert line.startswith("| ") and line.endswith(" |"), line
        return line[2:-2].split(" | ")

    assert cells(lines[0]) == [*report.COMPARISON_HEADERS, *report.DETAIL_HEADERS]
    assert cells(lines[1]) == ["---"] * len(cells(lines[0]))
    printed = report.comparison_rows(runs, "alluxio")
    # Slowdowns sorted 1, 30/29, 25/24, 4/3, 4/3: p50 25/24, p95 and p99 between the two 4/3.
    assert cells(lines[2]) == [*printed[0], "5.0m", "14.7m", "16.3m", "40s", "40s", "1.5m", "1.04", "1.33", "1.33", "0"]
    assert cells(lines[3])[: len(printed[1])] == list(printed[1])
    assert report.speedup_note("alluxio", runs) in lines


def markdown_section(lines: list[str], heading: str) -> list[list[str]]:
    """The cells of the table under `heading` in compare.md, its header row first."""
    start = lines.index(heading) + 2  # the heading, a blank line, then the table
    end = lines.index("", start)
    return [line[2:-2].split(" | ") for line in lines[start:end] if not line.startswith("| ---")]


def test_compare_md_has_slowdowns_by_class_and_preemptions_when_runs_have_them(tmp_path: Path) -> None:
    fifo = [job("t", 0, 100, 200, job_class="te"), job("b", 0, 0, 1000, job_class="be")]  # slowdowns 2 and 1
    runs = [
        (SimResult("fifo", "silod", fifo), summary_of(*fifo)),
        (SimResult("fitgpp", "silod", SLOWED), summary_of(*SLOWED, policy="fitgpp")),
    ]
    report.write_comparison_markdown(tmp_path / "compare.md", runs, "silod")
    lines = (tmp_path / "compare.md").read_text().splitlines()
    assert markdown_section(lines, "## Slowdown by class") == [
        list(report.CLASS_HEADERS),
        ["fifo", "silod", "be", "1", "1.00", "1.00", "1.00"],
        ["fifo", "silod", "te", "1", "2.00", "2.00", "2.00"],
        ["fitgpp", "silod", "be", "3", "5.00", "10.4", "10.9"],  # of 3, 5, 11 (see the class groups' test)
        ["fitgpp", "silod", "te", "2", "1.50", "1.95", "1.99"],
    ]
    # fitgpp preempted s3 (1 GPU) once, 200 s before its restart: one job of five, one interval, one GPU.
    assert markdown_section(lines, "## Preemptions") == [
        list(report.PREEMPTION_HEADERS),
        ["fifo", "silod", "0", "0", "0%", "0%", "0%", "0%", "-", "-", "-", "-"],
        ["fitgpp", "silod", "1", "1", "20%", "20%", "0%", "0%", "3.3m", "3.3m", "3.3m", "3.3m"],  # s3: one GPU
    ]


def test_compare_md_has_no_class_or_preemption_section_when_no_run_has_either(tmp_path: Path) -> None:
    runs = [(SimResult("fifo", "silod", JOBS), summary_of(*JOBS))]
    report.write_comparison_markdown(tmp_path / "compare.md", runs, "silod")
    text = (tmp_path / "compare.md").read_text()
    assert "## Slowdown by class" not in text and "## Preemptions" not in text


def test_the_slowdown_cdf_is_written_with_a_panel_per_class(tmp_path: Path) -> None:
    never_ran = replace(job("x", 0, 0, 100, job_class="be"), queued_seconds=100.0)  # infinite: counted, not drawn
    runs = {
        "fitgpp/silod": SimResult("fitgpp", "silod", [*SLOWED, never_ran]),
        "fifo/silod": SimResult("fifo", "silod", [job("t", 0, 100, 200, job_class="te")]),  # no BE job at all
    }
    plots.plot_slowdown_cdf(tmp_path / "slowdown_cdf.png", runs)
    assert is_png(tmp_path / "slowdown_cdf.png")
    one_panel = imread(tmp_path / "slowdown_cdf.png").shape[0]
    plots.plot_slowdown_cdf(tmp_path / "unlabelled.png", {"fifo/silod": SimResult("fifo", "silod", JOBS)})
    assert imread(tmp_path / "unlabelled.png").shape[0] < one_panel  # one panel ("no class") against two


def line_looks(figure: Figure) -> list[list[tuple[str, str, str]]]:
    """Per panel, how each drawn line looks: its colour, line style and marker."""
    return [
        [(str(line.get_color()), str(line.get_linestyle()), str(line.get_marker())) for line in ax.get_lines()]
        for ax in figure.axes
    ]


def test_every_run_of_a_compare_has_a_line_of_its_own_in_the_cdf_plots(tmp_path: Path) -> None:
    # Five policies on two cache systems: with four line styles, the fifth policy's lines looked like the first's.
    policies = ("fifo", "sjf", "gavel", "tiresias-las", "hived")
    runs = {
        f"{policy}/{cache_system}": SimResult(policy, cache_system, [job("t", 0, 100, 200, job_class="te"), *SLOWED])
        for policy in policies
        for cache_system in ("silod", "alluxio")
    }
    jct = line_looks(plots.plot_jct_cdf(tmp_path / "jct_cdf.png", runs))
    slowdown = line_looks(plots.plot_slowdown_cdf(tmp_path / "slowdown_cdf.png", runs))
    for panel in (*jct, *slowdown):
        assert len(panel) == len(set(panel)) == 10
    # Still a colour per cache system and a line style per policy: fifo/silod and hived/silod share both, and a
    # marker tells them apart.
    fifo, hived = jct[0][0], jct[0][8]
    assert fifo[:2] == hived[:2] and (fifo[2], hived[2]) == ("", "o")
    assert {looks[0] for looks in jct[0][::2]} == {"C0"} and {looks[0] for looks in jct[0][1::2]} == {"C1"}


def test_every_run_has_a_line_of_its_own_on_one_cache_system_or_more_than_ten() -> None:
    many = [SimResult(f"p{i}", "silod", []) for i in range(25)]
    style = plots._run_styles(many)
    assert len({style(result) for result in many}) == 25
    wide = [SimResult(policy, f"c{i}", []) for i in range(11) for policy in ("fifo", "sjf")]
    style = plots._run_styles(wide)
    assert len({style(result) for result in wide}) == 22


def test_a_pipe_in_a_markdown_cell_is_escaped() -> None:
    assert report.markdown_table(["A", "B"], [["x|y", "z"]]).splitlines() == [
        "| A | B |",
        "| --- | --- |",
        r"| x\|y | z |",
    ]


def test_a_line_break_in_a_markdown_cell_keeps_the_row_on_one_line() -> None:
    # A trace's label is free text: a CSV cell "te\ny" split compare.md's row by class in two.
    rows = [["te\ny", "1"], ["a\r\nb|c", "2"], ["d\re", "3"]]
    assert report.markdown_table(["CLASS", "JOBS"], rows).splitlines() == [
        "| CLASS | JOBS |",
        "| --- | --- |",
        "| te<br>y | 1 |",
        r"| a<br>b\|c | 2 |",
        "| d<br>e | 3 |",
    ]


def test_the_io_bound_share_is_the_io_bound_time_over_the_time_with_jobs_running() -> None:
    assert report.io_bound_share(Usage(end=500, running_seconds=400, io_bound_seconds=100)) == 0.25
    assert math.isnan(report.io_bound_share(Usage(end=500)))  # no job ever ran


def test_a_line_break_or_escape_in_a_terminal_table_cell_is_shown_escaped_on_the_cells_line() -> None:
    # The same labels split the terminal table's row by class, and an escape sequence reached the terminal.
    rows = [["te\ny", "1"], ["\x1b[2Jbe", "2"]]
    assert render_table(["CLASS", "JOBS"], rows).splitlines() == [
        "CLASS      JOBS",
        r"te\ny      1",
        r"\x1b[2Jbe  2",
    ]
