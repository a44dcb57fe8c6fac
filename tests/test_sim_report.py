"""The simulator report's distributions and breakdowns: percentiles, queueing delays, groups by GPU count and by
trace label, and the files that carry them (summary.json, groups.csv, jobs.csv's label columns, compare.md).

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

from datamgr.scheduler.sim import report
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, Sample, SimResult

CLUSTER = ClusterSpec(nodes=2, gpus_per_node=8, cache_bytes_per_node=10**12, remote_io_bytes_per_sec=1e9)


def job(
    job_id: str, arrival: float, start: float, finish: float, gpus: int = 1, tenant: str = "", job_class: str = ""
) -> JobOutcome:
    return JobOutcome(job_id, arrival, start, finish, gpus, "d", 100.0, 0.0, 100.0, tenant=tenant, job_class=job_class)


# JCTs 100, 200, 300, 400, 1000; queueing delays 0, 50, 10, 100, 40.
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
    assert rows == [
        ("1", "2", "4.2m", "6.4m", "50s"),
        ("2", "2", "10.0m", "16.0m", "45s"),
        ("16", "1", "5.0m", "5.0m", "10s"),
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
    assert list(rows[0]) == ["kind", "value", "finished", "average_jct", "p95_jct", "average_queueing_delay"]
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
    assert cells(lines[2]) == [*printed[0], "5.0m", "14.7m", "16.3m", "40s", "40s", "1.5m", "0"]
    assert cells(lines[3])[: len(printed[1])] == list(printed[1])
    assert report.speedup_note("alluxio") in lines


def test_a_pipe_in_a_markdown_cell_is_escaped() -> None:
    assert report.markdown_table(["A", "B"], [["x|y", "z"]]).splitlines() == [
        "| A | B |",
        "| --- | --- |",
        r"| x\|y | z |",
    ]


def test_the_io_bound_share_counts_the_busy_samples_whose_demand_exceeds_the_limit() -> None:
    def busy(demand: float, running: int = 1) -> Sample:
        return Sample(0.0, 0.0, 0.0, running, running, 0, 0, 0, 1.0, 1.0, demand)

    samples = [busy(300.0), busy(100.0), busy(200.0), busy(500.0), busy(900.0, running=0)]
    assert report.io_bound_share(samples, limit=200.0) == 0.5  # 300 and 500 of four busy samples; 200 is not above
    assert math.isnan(report.io_bound_share([busy(900.0, running=0)], limit=200.0))
