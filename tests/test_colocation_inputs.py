"""The co-location simulator's inputs and outputs: CSV traces, machine cluster files, the shipped Harmony
scenarios and their generated workload, the cost of moving a job, the summary and comparison numbers, and
`silod sim` / `silod sim compare` end to end on a tiny co-location cluster.

Bad input must fail whole, with a message naming the file, the line (or key) and the column. The engine and
the policies themselves: test_colocation_sim.py and test_harmony.py.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from datamgr.scheduler.registry import COLOCATION_POLICIES, DEFAULT_COLOCATION_POLICIES
from datamgr.scheduler.sim.colocation_inputs import (
    colocation_cluster_from_table,
    colocation_scenario_from_document,
    is_colocation_cluster,
    load_colocation_cluster,
    load_colocation_trace,
    write_colocation_trace,
)
from datamgr.scheduler.sim.colocation_model import (
    ColocationCluster,
    ColocationJob,
    ColocationOutcome,
    ColocationResult,
    ColocationSample,
)
from datamgr.scheduler.sim.colocation_report import (
    ColocationSummary,
    comparison_rows,
    summarize_colocation,
    summary_text,
    write_comparison,
    write_jobs_csv,
    write_summary_json,
    write_timeline_csv,
)
from datamgr.scheduler.sim.fields import SimInputError
from datamgr.scheduler.sim.harmony_workload import HarmonyWorkloadConfig, generate_harmony_workload
from datamgr.scheduler.sim.scenarios import is_colocation_scenario, load_colocation_scenario, load_scenario
from silodcli.main import main
from tests.sim_fixtures import is_png

REQUIRED = ("job_id", "arrival", "app", "dataset", "cpu_machine_seconds", "net_seconds", "iterations", "model_size",
            "input_size")  # fmt: skip
HEADER = ",".join(REQUIRED)
GOOD_ROW = "a,0,lda,nytimes,8,1,20,1GB,2GB"
MB = 10**6
GB = 10**9


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def job(job_id: str = "a", **changes: Any) -> ColocationJob:
    base = ColocationJob(job_id, 0.0, "lda", "nytimes", 8.0, 1.0, 20.0, 1 * GB, 2 * GB)
    return replace(base, **changes)


# --- trace files -----------------------------------------------------------------------------------------------


def test_a_trace_reads_durations_and_sizes_with_units(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.csv",
        f"{HEADER}\n"
        "lda-1,8m,lda,nytimes,12.5,0.5,300,1.1GB,600MB\n"
        "\n"  # a blank line is skipped
        "mlr-1,90,mlr,synthetic78,40,2s,1.5,12GB,78400000000\n",
    )
    assert load_colocation_trace(trace) == [
        ColocationJob("lda-1", 480.0, "lda", "nytimes", 12.5, 0.5, 300.0, 1_100_000_000, 600_000_000),
        ColocationJob("mlr-1", 90.0, "mlr", "synthetic78", 40.0, 2.0, 1.5, 12_000_000_000, 78_400_000_000),
    ]


def test_a_written_trace_reads_back_equal(tmp_path: Path) -> None:
    jobs = [
        job("a"),
        job("b", arrival=0.1, cpu_machine_seconds=1 / 3, net_seconds=0.0, iterations=2.5, model_bytes=0),
        job("c", arrival=3600.25, app="mlr", dataset="synthetic155", model_bytes=24 * GB, input_bytes=155 * GB),
    ]
    path = tmp_path / "round.csv"
    write_colocation_trace(path, jobs)
    assert load_colocation_trace(path) == jobs


def test_a_written_trace_with_a_tiny_duration_reads_back_equal(tmp_path: Path) -> None:
    jobs = [job("a", net_seconds=1e-05)]
    path = tmp_path / "tiny.csv"
    write_colocation_trace(path, jobs)
    assert load_colocation_trace(path) == jobs


def row(**cells: str) -> str:
    values = dict(zip(REQUIRED, GOOD_ROW.split(","), strict=True))
    values.update(cells)
    return ",".join(values[column] for column in REQUIRED)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER.replace(",input_size", "") + "\n" + GOOD_ROW.rsplit(",", 1)[0] + "\n",
         ":1: missing required column 'input_size'"),
        (HEADER + ",gpus\n" + GOOD_ROW + ",1\n", ":1: unknown column 'gpus'; accepted columns: job_id, arrival"),
        (f"{HEADER}\n{GOOD_ROW}\n{row(job_id='b')}\n{GOOD_ROW}\n", ":4: job_id: 'a' is already used on line 2"),
        (f"{HEADER}\n{row(cpu_machine_seconds='0')}\n", ":2: cpu_machine_seconds: '0' must be positive"),
        (f"{HEADER}\n{GOOD_ROW}\n{row(job_id='b', cpu_machine_seconds='-3')}\n",
         ":3: cpu_machine_seconds: '-3' must be positive"),
        (f"{HEADER}\n{row(net_seconds='-1')}\n", ":2: net_seconds: duration '-1' must not be negative"),
        (f"{HEADER}\n{row(iterations='0')}\n", ":2: iterations: '0' must be positive"),
        (f"{HEADER}\n{row(arrival='soon')}\n", ":2: arrival: duration 'soon' is not a number of seconds"),
        (f"{HEADER}\n{row(model_size='12G')}\n", ":2: model_size: size '12G'"),
        (f"{HEADER}\n{row(app=' ')}\n", ":2: app: expected a non-empty string"),
        (f"{HEADER}\n{GOOD_ROW}\nb,0,lda,nytimes,8,1,20,1GB\n", ":3: 8 cells, but the header has 9 columns"),
        (f"{HEADER}\n{GOOD_ROW},extra\n", ":2: 10 cells, but the header has 9 columns"),
        ("", ": the trace has no header line"),
        (f"{HEADER}\n", ": the trace has no jobs"),
        (f"{HEADER}\n\n\n", ": the trace has no jobs"),
    ],
)  # fmt: skip
def test_a_bad_trace_is_refused_naming_the_file_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    trace = write(tmp_path / "bad.csv", text)
    with pytest.raises(SimInputError, match=re.escape(f"{trace}{message}")):
        load_colocation_trace(trace)


def test_a_trace_that_is_not_csv_or_not_there_is_refused_naming_the_file(tmp_path: Path) -> None:
    jsonl = write(tmp_path / "t.jsonl", '{"job_id": "a"}\n')
    with pytest.raises(SimInputError, match=re.escape(f"{jsonl}: a co-location trace must be a .csv file")):
        load_colocation_trace(jsonl)
    with pytest.raises(SimInputError, match=re.escape(f"cannot read {tmp_path / 'missing.csv'}")):
        load_colocation_trace(tmp_path / "missing.csv")
    latin = tmp_path / "latin.csv"
    cafe = row(app="caf\u00e9")
    latin.write_bytes(f"{HEADER}\n{cafe}\n".encode("latin-1"))
    with pytest.raises(SimInputError, match=re.escape(f"{latin}: not UTF-8 text")):
        load_colocation_trace(latin)


def test_a_bad_cell_names_its_file_and_line_once(tmp_path: Path) -> None:
    trace = write(tmp_path / "bad.csv", f"{HEADER}\n{row(iterations='0')}\n")
    with pytest.raises(SimInputError) as refused:
        load_colocation_trace(trace)
    assert str(refused.value) == f"{trace}:2: iterations: '0' must be positive"


def test_a_repeated_column_is_refused(tmp_path: Path) -> None:
    trace = write(tmp_path / "twice.csv", f"{HEADER},iterations\n{GOOD_ROW},40\n")
    with pytest.raises(SimInputError, match=re.escape(f"{trace}:1: column 'iterations'")):
        load_colocation_trace(trace)


# --- cluster files ---------------------------------------------------------------------------------------------


def test_a_cluster_file_reads_its_bandwidth_and_defaults_the_rest(tmp_path: Path) -> None:
    full = write(tmp_path / "full.toml", 'machines = 4\nmachine_bandwidth = "1.1Gbps"\nprofile_iterations = 1\n')
    assert load_colocation_cluster(full) == ColocationCluster(4, 137_500_000, 1)
    plain = load_colocation_cluster(write(tmp_path / "plain.toml", "machines = 100\n"))
    assert plain == ColocationCluster(100, 137_500_000, 2)  # 1.1 Gbps = 137.5 MB/s and 2 profiling iterations
    fast = colocation_cluster_from_table({"machines": 2, "machine_bandwidth": "200MB/s", "profile_iterations": 0}, "t")
    assert fast == ColocationCluster(2, 200_000_000, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('machine_bandwidth = "1Gbps"\n', ": missing required key 'machines'"),
        ("machines = 4\ngpus_per_node = 8\n", ": unknown key 'gpus_per_node'; accepted keys: machines"),
        ("machines = 0\n", ": machines: 0 must be at least 1"),
        ("machines = 2.5\n", ": machines: 2.5 is not a whole number"),
        ('machines = 4\nmachine_bandwidth = "0Gbps"\n', ": machine_bandwidth: '0Gbps' must be positive"),
        ('machines = 4\nmachine_bandwidth = "1GB"\n', ": machine_bandwidth: rate '1GB' has no time unit"),
        ("machines = 4\nprofile_iterations = -1\n", ": profile_iterations: -1 is not a whole number"),
        # Past the largest float: an OverflowError traceback before.
        ("machines = 1" + "0" * 400 + "\n", ": machines: 100000000000000000000000... (401 characters) is too large"),
    ],
)
def test_a_bad_cluster_file_is_refused_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(SimInputError, match=re.escape(f"{path}{message}")):
        load_colocation_cluster(path)


def test_more_machines_than_the_simulator_takes_are_refused_naming_the_key_and_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # machines had no bound: a billion ran Harmony for as long as anyone waited, handing machines out one by one.
    assert load_colocation_cluster(write(tmp_path / "most.toml", "machines = 100000\n")).machines == 100_000
    path = write(tmp_path / "c.toml", "machines = 1000000000\n")
    bound = "must be at most 100,000: a run's cost grows with the cluster's size, whatever the trace"
    with pytest.raises(SimInputError, match=re.escape(f"{path}: machines: 1000000000 {bound}")):
        load_colocation_cluster(path)
    trace = write(tmp_path / "t.csv", f"{HEADER}\n{GOOD_ROW}\n")
    out = tmp_path / "out"
    assert main(["sim", "--trace", str(trace), "--cluster", str(path), "--out", str(out)]) == 2
    assert f"{path}: machines: 1000000000 {bound}" in capsys.readouterr().err
    assert not out.exists()  # refused before anything ran
    with pytest.raises(SimInputError, match=re.escape(f"scenario big [cluster]: machines: 1000000000 {bound}")):
        colocation_scenario_from_document(
            "big",
            {"model": "colocation", "description": "d", "cluster": {"machines": 10**9}, "generate": {}},
            "scenario big",
        )


def test_machines_without_nodes_make_a_co_location_cluster() -> None:
    assert is_colocation_cluster({"machines": 4})
    assert is_colocation_cluster({"machines": 4, "machine_bandwidth": "1Gbps"})
    assert not is_colocation_cluster({"machines": 4, "nodes": 2})
    assert not is_colocation_cluster({"nodes": 2, "gpus_per_node": 4})


# --- what moving a job costs -----------------------------------------------------------------------------------


def test_start_resume_and_migration_spread_the_bytes_over_the_machines() -> None:
    cluster = ColocationCluster(machines=8, machine_bytes_per_sec=100 * MB)
    moved = job(model_bytes=200 * MB, input_bytes=800 * MB)
    assert cluster.start_seconds(moved, 2) == pytest.approx(4.0)  # 800 MB over 2 x 100 MB/s
    assert cluster.start_seconds(moved, 8) == pytest.approx(1.0)
    assert cluster.resume_seconds(moved, 2) == pytest.approx(5.0)  # (200 + 800) MB over 2 x 100 MB/s
    # checkpointed on 4 machines (200 MB over 400 MB/s), then resumed on 2
    assert cluster.migration_seconds(moved, 4, 2) == pytest.approx(0.5 + 5.0)
    assert cluster.migration_seconds(moved, 1, 10) == pytest.approx(2.0 + 1.0)
    assert cluster.start_seconds(job(input_bytes=0), 1) == 0.0


def test_a_cluster_refuses_impossible_numbers() -> None:
    with pytest.raises(ValueError, match="machines must be at least 1"):
        ColocationCluster(0)
    with pytest.raises(ValueError, match="machine_bytes_per_sec must be positive"):
        ColocationCluster(1, 0.0)
    with pytest.raises(ValueError, match="profile_iterations must be at least 0"):
        ColocationCluster(1, profile_iterations=-1)


# --- shipped scenarios and the generated workload --------------------------------------------------------------

TABLE_I = {  # (application, dataset) -> (input bytes, model bytes), Harmony's Table I
    ("nmf", "netflix64x"): (45_600_000_000, 1_000_000_000),
    ("nmf", "netflix128x"): (91_200_000_000, 5_000_000_000),
    ("lda", "pubmed"): (4_300_000_000, 2_100_000_000),
    ("lda", "nytimes"): (600_000_000, 1_100_000_000),
    ("mlr", "synthetic78"): (78_400_000_000, 12_000_000_000),
    ("mlr", "synthetic155"): (155_000_000_000, 24_000_000_000),
    ("lasso", "synthetic78"): (78_400_000_000, 12_000_000_000),
    ("lasso", "synthetic155"): (155_000_000_000, 24_000_000_000),
}


def test_harmony_80_is_80_jobs_of_table_i_submitted_at_once_on_100_machines() -> None:
    scenario = load_colocation_scenario("harmony-80")
    assert scenario.name == "harmony-80"
    assert scenario.cluster == ColocationCluster(100, 137_500_000, 2)
    trace = scenario.trace
    assert len(trace) == 80 and len({j.job_id for j in trace}) == 80
    assert all(j.arrival == 0.0 for j in trace)
    assert Counter((j.app, j.dataset) for j in trace) == dict.fromkeys(TABLE_I, 10)
    for j in trace:
        assert (j.input_bytes, j.model_bytes) == TABLE_I[(j.app, j.dataset)], j.job_id
        assert j.job_id.startswith(f"{j.app}-{j.dataset}-")
    nytimes = [j for j in trace if j.job_id.startswith("lda-nytimes-")]
    assert len(nytimes) == 10
    assert {(j.input_bytes, j.model_bytes) for j in nytimes} == {(int(0.6e9), int(1.1e9))}
    assert load_colocation_scenario("harmony-80").trace == trace  # seeded: the same jobs every time


def test_the_generated_jobs_lie_in_the_documented_ranges_at_dop_16() -> None:
    for j in load_colocation_scenario("harmony-80").trace:
        compute = j.cpu_machine_seconds / 16
        iteration = compute + j.net_seconds
        assert 2.0 <= iteration <= 60.0, j.job_id
        assert 0.2 <= compute / iteration <= 0.8, j.job_id
        assert 3600.0 <= j.iterations * iteration <= 6 * 3600.0 + 1e-6, j.job_id


def test_harmony_80_poisson_has_the_same_jobs_arriving_about_8_minutes_apart() -> None:
    at_once = load_colocation_scenario("harmony-80").trace
    poisson = load_colocation_scenario("harmony-80-poisson")
    assert poisson.cluster == ColocationCluster(100, 137_500_000, 2)
    assert [replace(j, arrival=0.0) for j in poisson.trace] == at_once  # same ids, order, profiles and sizes
    arrivals = [j.arrival for j in poisson.trace]
    assert arrivals[0] == 0.0
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert all(gap > 0 for gap in gaps)
    assert 4 * 60 < statistics.fmean(gaps) < 16 * 60
    assert load_colocation_scenario("harmony-80-poisson").trace == poisson.trace


def test_the_scenarios_are_the_workload_generator_with_their_seed_and_gap() -> None:
    assert load_colocation_scenario("harmony-80").trace == generate_harmony_workload(HarmonyWorkloadConfig(seed=1))
    poisson = generate_harmony_workload(HarmonyWorkloadConfig(seed=1, mean_gap_seconds=480.0))
    assert load_colocation_scenario("harmony-80-poisson").trace == poisson
    other = generate_harmony_workload(HarmonyWorkloadConfig(seed=2))
    assert {j.job_id for j in other} == {j.job_id for j in poisson}
    assert other != load_colocation_scenario("harmony-80").trace  # another seed draws other jobs


def test_harmony_80_io_reads_a_hundredth_of_each_input_per_iteration_through_a_cache() -> None:
    io = load_colocation_scenario("harmony-80-io")
    assert (io.cluster.remote_io_bytes_per_sec, io.cluster.cache_bytes) == (500 * MB, 100 * GB)
    in_memory = {job.job_id: job for job in load_colocation_scenario("harmony-80").trace}
    for job in io.trace:
        assert job.read_bytes_per_iteration == job.input_bytes // 100
        assert replace(job, read_bytes_per_iteration=0) == in_memory[job.job_id]


def test_a_trace_may_give_the_bytes_each_iteration_reads_remotely(tmp_path: Path) -> None:
    path = tmp_path / "reads.csv"
    path.write_text(f"{HEADER},read_size\n{GOOD_ROW},20MB\nb,0,lda,nytimes,8,1,20,1GB,2GB,\n", encoding="utf-8")
    first, second = load_colocation_trace(path)
    assert (first.read_bytes_per_iteration, second.read_bytes_per_iteration) == (20 * MB, 0)
    write_colocation_trace(tmp_path / "again.csv", [first, second])
    assert load_colocation_trace(tmp_path / "again.csv") == [first, second]


def test_a_cluster_file_may_limit_remote_io_and_hold_a_cache(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('machines = 4\nremote_io = "200MB/s"\ncache = "10GB"\n', encoding="utf-8")
    cluster = load_colocation_cluster(path)
    assert (cluster.remote_io_bytes_per_sec, cluster.cache_bytes) == (200 * MB, 10 * GB)
    assert ColocationCluster(4).remote_io_bytes_per_sec == float("inf") and ColocationCluster(4).cache_bytes == 0


def test_co_location_scenarios_are_told_apart_from_gpu_ones() -> None:
    assert is_colocation_scenario("harmony-80") and is_colocation_scenario("harmony-80-poisson")
    assert not is_colocation_scenario("micro") and not is_colocation_scenario("nano")
    with pytest.raises(SimInputError, match=r"scenario 'harmony-80' models co-located CPU jobs.*co-location policy"):
        load_scenario("harmony-80")
    known = "co-location scenarios: harmony-80, harmony-80-io, harmony-80-poisson$"
    with pytest.raises(SimInputError, match=f"no co-location scenario 'micro'; {known}"):
        load_colocation_scenario("micro")
    with pytest.raises(SimInputError, match=f"no co-location scenario 'nano'; {known}"):
        load_colocation_scenario("nano")


def scenario_document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "model": "colocation",
        "description": "two machines",
        "cluster": {"machines": 2},
        "generate": {"kind": "harmony", "seed": 3, "mean_gap": "1m"},
    }
    document.update(changes)
    return document


def test_a_scenario_document_generates_its_jobs_on_its_cluster() -> None:
    scenario = colocation_scenario_from_document("mine", scenario_document(), "mine.toml")
    assert (scenario.name, scenario.description) == ("mine", "two machines")
    assert scenario.cluster == ColocationCluster(2)
    assert scenario.trace == generate_harmony_workload(HarmonyWorkloadConfig(seed=3, mean_gap_seconds=60.0))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trace": "t.csv"}, "mine.toml: unknown key 'trace'"),
        ({"cluster": {"machines": 2, "nodes": 1}}, "mine.toml [cluster]: unknown key 'nodes'"),
        ({"generate": {"kind": "harmony", "seed": 3}}, "mine.toml [generate]: missing required key 'mean_gap'"),
        ({"generate": {"kind": "philly", "seed": 3, "mean_gap": "0s"}}, "kind: 'philly' is not a co-location recipe"),
        ({"generate": {"kind": "harmony", "seed": -3, "mean_gap": "0s"}}, "mine.toml [generate]: seed: -3 is not"),
        ({"generate": {"kind": "harmony", "seed": 3, "mean_gap": "-1m"}}, "[generate]: mean_gap: duration '-1m'"),
    ],
)
def test_a_bad_scenario_document_is_refused_naming_the_table_and_key(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SimInputError, match=re.escape(message)):
        colocation_scenario_from_document("mine", scenario_document(**changes), "mine.toml")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mean_gap_seconds": -1.0}, "mean_gap_seconds"),
        ({"mean_gap_seconds": float("nan")}, "mean_gap_seconds"),
        ({"iteration_range": (0.0, 60.0)}, "iteration_range"),
        ({"iteration_range": (60.0, 2.0)}, "iteration_range"),
        ({"length_range": (-1.0, 3600.0)}, "length_range"),
        ({"length_range": (7200.0, 3600.0)}, "length_range"),
        ({"compute_share_range": (0.0, 0.5)}, "compute_share_range"),
        ({"compute_share_range": (0.2, 1.0)}, "compute_share_range"),
        ({"compute_share_range": (0.8, 0.2)}, "compute_share_range"),
    ],
)
def test_the_workload_config_refuses_bad_ranges_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must"):
        HarmonyWorkloadConfig(**changes)


# --- summary and comparison ------------------------------------------------------------------------------------


def hand_made_result(policy: str = "harmony") -> ColocationResult:
    jobs = [
        ColocationOutcome("a", "lda", "nytimes", 0.0, 0.0, 100.0, migrations=1, pauses=0, overhead_seconds=5.0),
        ColocationOutcome("b", "mlr", "synthetic78", 20.0, 30.0, 220.0, migrations=0, pauses=2, overhead_seconds=15.0),
    ]
    samples = [
        ColocationSample(0.0, cpu=0.5, net=0.25, running_jobs=1, groups=1, waiting_jobs=0),
        ColocationSample(100.0, cpu=1.0, net=0.5, running_jobs=2, groups=1, waiting_jobs=0),
        ColocationSample(200.0, cpu=0.2, net=0.1, running_jobs=1, groups=1, waiting_jobs=1),
        ColocationSample(220.0, cpu=0.0, net=0.0, running_jobs=0, groups=0, waiting_jobs=0),
    ]
    return ColocationResult(policy, jobs, samples, rounds=7)


def test_the_summary_averages_utilisation_over_the_makespan() -> None:
    summary = summarize_colocation(hand_made_result())
    assert (summary.policy, summary.jobs, summary.rounds) == ("harmony", 2, 7)
    assert summary.average_jct == pytest.approx((100 + 200) / 2)  # a: 0 -> 100, b: 20 -> 220
    assert summary.makespan == pytest.approx(220.0)  # first arrival 0 to last finish 220
    assert summary.cpu_utilisation == pytest.approx((0.5 * 100 + 1.0 * 100 + 0.2 * 20) / 220)  # 0.7
    assert summary.net_utilisation == pytest.approx((0.25 * 100 + 0.5 * 100 + 0.1 * 20) / 220)  # 0.35
    assert summary.running_jobs == pytest.approx((1 * 100 + 2 * 100 + 1 * 20) / 220)
    assert summary.groups == pytest.approx(1.0)
    assert (summary.migrations, summary.pauses) == (1, 2)
    assert summary.overhead_share == pytest.approx((5 + 15) / (100 + 200))


def test_the_summary_text_and_json_carry_the_numbers(tmp_path: Path) -> None:
    summary = summarize_colocation(hand_made_result())
    text = summary_text(summary)
    assert "harmony: 2 jobs, average JCT 2.5m, makespan 3.7m" in text
    assert "CPU 70.0%, network 35.0%" in text
    assert "1 migrations, 2 pauses, 6.7% of job time starting, resuming or migrating; 7 rounds" in text
    write_summary_json(tmp_path / "summary.json", summary)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["jobs"] == 2 and written["average_jct"] == pytest.approx(150.0)
    assert written["cpu_utilisation"] == pytest.approx(0.7)


def test_a_run_with_no_finished_job_has_no_summary() -> None:
    with pytest.raises(ValueError, match="no finished job"):
        summarize_colocation(ColocationResult("harmony", []))


def test_the_job_and_timeline_csv_hold_one_row_per_job_and_sample(tmp_path: Path) -> None:
    result = hand_made_result()
    write_jobs_csv(tmp_path / "jobs.csv", result)
    jobs = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert [(r["job_id"], float(r["jct"]), int(r["pauses"])) for r in jobs] == [("a", 100, 0), ("b", 200, 2)]
    write_timeline_csv(tmp_path / "timeline.csv", result)
    timeline = list(csv.DictReader((tmp_path / "timeline.csv").open()))
    assert [(float(r["time"]), float(r["cpu"]), int(r["waiting_jobs"])) for r in timeline] == [
        (0, 0.5, 0), (100, 1.0, 0), (200, 0.2, 1), (220, 0.0, 0),
    ]  # fmt: skip


def summary(policy: str, average_jct: float, makespan: float) -> ColocationSummary:
    return ColocationSummary(policy, 3, average_jct, makespan, 0.4, 0.3, 1.5, 1.0, 2, 1, 0.01, 5, 20 * MB)


def test_comparison_rows_give_speedups_over_the_baseline_policy(tmp_path: Path) -> None:
    runs = [summary("isolated", 300.0, 600.0), summary("naive", 200.0, 400.0), summary("harmony", 150.0, 200.0)]
    rows = comparison_rows(runs, "isolated")
    assert [row[0] for row in rows] == ["isolated", "naive", "harmony"]
    assert [row[3:5] for row in rows] == [("1.00x", "1.00x"), ("1.50x", "1.50x"), ("2.00x", "3.00x")]
    assert rows[2] == (
        "harmony",
        "2.5m",
        "3.3m",
        "2.00x",
        "3.00x",
        "40.0%",
        "30.0%",
        "20.0 MB/s",
        "1.5",
        "1.0",
        "2",
        "1.0%",
    )
    assert [row[3:5] for row in comparison_rows(runs, "harmony")] == [
        ("0.50x", "0.33x"), ("0.75x", "0.50x"), ("1.00x", "1.00x"),
    ]  # fmt: skip
    write_comparison(tmp_path / "compare.csv", tmp_path / "compare.md", runs, "isolated")
    table = list(csv.reader((tmp_path / "compare.csv").open()))
    assert table[0][:5] == ["POLICY", "AVG JCT", "MAKESPAN", "JCT SPEEDUP", "MAKESPAN SPEEDUP"]
    assert [tuple(r) for r in table[1:]] == rows
    markdown = (tmp_path / "compare.md").read_text()
    assert "Speedups are over `isolated`" in markdown
    assert "| harmony | 2.5m | 3.3m | 2.00x | 3.00x |" in markdown


# --- the command -----------------------------------------------------------------------------------------------


def tiny_colocation_inputs(tmp_path: Path) -> list[str]:
    """--trace and --cluster arguments for three short jobs on four machines (well under a second to run)."""
    trace = write(
        tmp_path / "t.csv",
        f"{HEADER}\n"
        "a,0,lda,nytimes,8,1,20,10MB,50MB\n"
        "b,0,nmf,netflix64x,4,2,30,20MB,100MB\n"
        "c,5s,mlr,synthetic78,2,0.5,40,5MB,10MB\n",
    )
    cluster = write(tmp_path / "c.toml", "machines = 4\nprofile_iterations = 1\n")
    return ["--trace", str(trace), "--cluster", str(cluster)]


@pytest.mark.parametrize("policy", ["harmony", "isolated", "naive"])
def test_sim_runs_a_co_location_policy_and_writes_its_outputs(
    policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sim", *tiny_colocation_inputs(tmp_path), "--policy", policy, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(rf"^{policy}: 3 jobs, average JCT \S+, makespan \S+$", printed, re.MULTILINE)
    assert f"wrote {out}/: jobs.csv, timeline.csv, summary.json, utilisation.png" in printed
    assert sorted(path.name for path in out.iterdir()) == [
        "jobs.csv",
        "summary.json",
        "timeline.csv",
        "utilisation.png",
    ]
    jobs = list(csv.DictReader((out / "jobs.csv").open()))
    assert sorted(r["job_id"] for r in jobs) == ["a", "b", "c"]
    assert all(float(r["finish"]) > float(r["start"]) >= float(r["arrival"]) for r in jobs)
    timeline = list(csv.DictReader((out / "timeline.csv").open()))
    assert timeline and float(timeline[0]["time"]) == 0.0
    written = json.loads((out / "summary.json").read_text())
    assert (written["policy"], written["jobs"]) == (policy, 3)
    average = statistics.fmean(float(r["jct"]) for r in jobs)
    assert written["average_jct"] == pytest.approx(average, abs=1e-3)
    assert (out / "utilisation.png").stat().st_size > 0 and is_png(out / "utilisation.png")


def test_sim_on_co_location_inputs_runs_harmony_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", *tiny_colocation_inputs(tmp_path)]
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert "harmony: 3 jobs, average JCT" in capsys.readouterr().out
    written = json.loads((tmp_path / "sim-t-harmony" / "summary.json").read_text())  # named by trace and policy
    assert written["policy"] == "harmony"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--policy", "fifo"], "'fifo' is not a co-location policy"),
        (["--policy", "nope"], f"co-location policies: {', '.join(COLOCATION_POLICIES)}"),
        (["--cache-system", "alluxio"], "--cache-system: not used by the co-location simulator"),
        (["--round", "60"], "--round: not used by the co-location simulator"),
        (["--policy-option", "x=1"], "--policy-option: not used by the co-location simulator"),
        (["--preemption-cost", "1m"], "--preemption-cost: not used"),
        (["--time-limit", "1h"], "--time-limit: not used"),
        (["--decision-log"], "--decision-log: not used"),
        (["--remote-io-scale", "2"], "--remote-io-scale: not used"),
        (["--round", "60", "--cache-system", "silod"], "--round, --cache-system: not used"),
    ],
)
def test_sim_refuses_gpu_only_options_and_policies_by_name(
    options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sim", *tiny_colocation_inputs(tmp_path), *options, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before anything ran


def test_compare_runs_the_three_policies_with_speedups_over_isolated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert DEFAULT_COLOCATION_POLICIES == ("isolated", "naive", "harmony")
    assert set(DEFAULT_COLOCATION_POLICIES) <= set(COLOCATION_POLICIES)
    out = tmp_path / "cmp"
    assert main(["sim", "compare", *tiny_colocation_inputs(tmp_path), "--out", str(out), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "speedups are over isolated" in printed
    assert sorted(path.name for path in out.iterdir()) == [
        "compare.csv", "compare.md", "harmony", "isolated", "naive", "utilisation.png",
    ]  # fmt: skip
    table = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["POLICY"] for r in table] == ["isolated", "naive", "harmony"]
    assert table[0]["JCT SPEEDUP"] == "1.00x" and table[0]["MAKESPAN SPEEDUP"] == "1.00x"
    assert "isolated" in (out / "compare.md").read_text()
    assert is_png(out / "utilisation.png")
    for policy in ("isolated", "naive", "harmony"):
        written = json.loads((out / policy / "summary.json").read_text())
        assert (written["policy"], written["jobs"]) == (policy, 3)
        assert sorted(path.name for path in (out / policy).iterdir()) == [
            "jobs.csv", "summary.json", "timeline.csv", "utilisation.png",
        ]  # fmt: skip


def test_compare_removes_the_policy_directories_of_an_earlier_compare_that_it_does_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An earlier compare's naive/ stayed beside the new compare's isolated/, which its compare.md did not list.
    out = tmp_path / "cmp"
    argv = ["sim", "compare", *tiny_colocation_inputs(tmp_path), "--out", str(out), "--jobs", "1"]
    assert main([*argv, "--policies", "isolated,naive"]) == 0
    (out / "notes").mkdir()
    (out / "notes" / "todo.txt").write_text("mine")  # not a run's file: it stays
    assert main([*argv, "--policies", "isolated"]) == 0
    capsys.readouterr()
    assert sorted(path.name for path in out.iterdir()) == [
        "compare.csv", "compare.md", "isolated", "notes", "utilisation.png",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "--baseline", "nope"], "--baseline nope is not one of --policies isolated,naive,harmony"),
        (["compare", "--policies", "harmony,fifo"], "'fifo' is not a co-location policy"),
        (["compare", "--cache-systems", "silod"], "--cache-systems: not used by the co-location simulator"),
        (["compare", "--round", "60"], "--round: not used by the co-location simulator"),
        (["--scenario", "harmony-80"], "--scenario replaces --trace and --cluster"),
        (["compare", "--scenario", "harmony-80"], "--scenario replaces --trace and --cluster"),
    ],
)
def test_bad_co_location_command_lines_exit_2_naming_the_problem(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sim", *argv, *tiny_colocation_inputs(tmp_path), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_co_location_cluster_needs_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path / "c.toml", "machines = 4\n")
    assert main(["sim", "--cluster", str(cluster), "--out", str(tmp_path / "out")]) == 2
    assert "give --trace FILE with the co-location --cluster FILE" in capsys.readouterr().err
