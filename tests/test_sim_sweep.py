"""`silod sim sweep`: which runs a sweep makes and on what (the pure part, `sim/sweep.py`), how their summaries
become rows, CSV, Markdown and a plot, and the command end to end on a tiny trace and on cluster96 cut short,
one run at a time and in worker processes, with its refusals of bad input.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from datamgr.scheduler.registry import build_scheduler
from datamgr.scheduler.sim import sweep
from datamgr.scheduler.sim.cluster import with_remote_io_scale
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.generator import GeneratorConfig, generate
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig
from datamgr.scheduler.sim.report import summarize
from datamgr.scheduler.sim.scenarios import load_scenario
from silodcli.main import main
from tests.sim_fixtures import install_missing_node_policy, is_png, tiny_inputs

CLUSTER = ClusterSpec(nodes=1, gpus_per_node=4, cache_bytes_per_node=500 * 10**9, remote_io_bytes_per_sec=100e6)


@dataclass(frozen=True)
class Numbers:
    """A run's summary as far as a sweep's rows read it (`report.Summary` has more)."""

    jobs: int
    finished: int
    average_jct: float
    makespan: float
    remote_io_limit: float


def summary(average_jct: float, finished: int = 3, jobs: int = 3, limit: float = 100e6) -> Numbers:
    return Numbers(jobs, finished, average_jct, 2 * average_jct, limit)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


# --- which runs, on what ----------------------------------------------------------------------------------------


def test_a_bandwidth_sweep_runs_every_cache_system_at_every_scale_of_the_remote_io_limit() -> None:
    trace = generate(GeneratorConfig(jobs=5, seed=1))
    points = sweep.bandwidth_points(trace, CLUSTER, [0.5, 2.0])
    assert [p.cluster.remote_io_bytes_per_sec for p in points] == [50e6, 200e6]
    assert all(p.trace == trace for p in points)
    assert all(replace(p.cluster, remote_io_bytes_per_sec=CLUSTER.remote_io_bytes_per_sec) == CLUSTER for p in points)
    runs = sweep.sweep_runs("bandwidth", points, "fifo", ["silod", "alluxio"])
    assert [(r.value, r.cache_system) for r in runs] == [
        (0.5, "silod"),
        (0.5, "alluxio"),
        (2.0, "silod"),
        (2.0, "alluxio"),
    ]
    assert runs[3].label == "fifo/alluxio at 2x"


def test_a_sharing_sweep_draws_the_same_jobs_and_only_moves_them_onto_shared_datasets() -> None:
    recipe = GeneratorConfig(jobs=80, sharing=0.3, seed=5)
    points = sweep.sharing_points(recipe, CLUSTER, [0.0, 0.3, 1.0])
    assert [p.value for p in points] == [0.0, 0.3, 1.0] and all(p.cluster == CLUSTER for p in points)
    private, recipes_own, shared = (p.trace for p in points)
    assert recipes_own == generate(recipe)  # at the recipe's own fraction, the scenario's own trace
    unmoved = [replace(job, dataset="") for job in private]
    for trace in (recipes_own, shared):
        assert [replace(job, dataset="") for job in trace] == unmoved  # same jobs, only the dataset differs
    assert all("/" in job.dataset for job in private)  # every job on a private copy
    assert all("/" not in job.dataset for job in shared)  # every job on the shared copy
    moved = {job.job_id for job in recipes_own if "/" not in job.dataset}
    assert 0 < len(moved) < len(recipes_own)
    assert [p.value for p in points] == [r.value for r in sweep.sweep_runs("sharing", points, "fifo", ["silod"])]
    assert sweep.SweepRun("sharing", 0.3, "fifo", "quiver").label == "fifo/quiver at sharing 0.3"


# --- rows ---------------------------------------------------------------------------------------------------------


def test_each_row_holds_silods_speedup_over_it_at_the_same_value() -> None:
    runs = [
        sweep.SweepRun("bandwidth", 0.5, "fifo", "alluxio"),
        sweep.SweepRun("bandwidth", 0.5, "fifo", "silod"),
        sweep.SweepRun("bandwidth", 0.5, "fifo", "coordl"),
        sweep.SweepRun("bandwidth", 2.0, "fifo", "silod"),
        sweep.SweepRun("bandwidth", 2.0, "fifo", "alluxio"),
        sweep.SweepRun("bandwidth", 4.0, "fifo", "alluxio"),  # no silod run at 4x
    ]
    summaries = [summary(800), summary(200), summary(100), summary(300), summary(330, limit=200e6), summary(50)]
    rows = sweep.sweep_rows(runs, summaries)
    assert [r.silod_speedup for r in rows[:5]] == [4.0, 1.0, 0.5, 1.0, pytest.approx(1.1)]
    assert math.isnan(rows[5].silod_speedup)
    assert replace(rows[4], silod_speedup=0.0) == sweep.SweepRow(2.0, 200e6, "fifo", "alluxio", 3, 3, 330, 660, 0.0)
    nothing_finished = sweep.sweep_rows(runs[:2], [summary(800), summary(math.nan, finished=0)])
    assert all(math.isnan(r.silod_speedup) for r in nothing_finished)


def test_the_table_csv_and_markdown_show_the_same_rows() -> None:
    runs = [sweep.SweepRun("bandwidth", 2.0, "fifo", "silod"), sweep.SweepRun("bandwidth", 2.0, "fifo", "alluxio")]
    rows = sweep.sweep_rows(runs, [summary(1800, limit=200e6), summary(3600, limit=200e6)])
    assert sweep.table_rows("bandwidth", rows) == [
        ("2x", "200.0 MB/s", "silod", "3/3", "30.0m", "1.0h", "1.00x"),
        ("2x", "200.0 MB/s", "alluxio", "3/3", "1.0h", "2.0h", "2.00x"),
    ]
    assert sweep.table_headers("bandwidth")[:2] == ("SCALE", "REMOTE IO")
    sharing = sweep.sweep_rows([replace(r, kind="sharing") for r in runs], [summary(1800), summary(900)])
    assert sweep.table_headers("sharing")[0] == "SHARING" and "REMOTE IO" not in sweep.table_headers("sharing")
    assert sweep.table_rows("sharing", sharing)[1] == ("2", "alluxio", "3/3", "15.0m", "30.0m", "0.50x")

    text = sweep.csv_text("bandwidth", rows)
    parsed = list(csv.DictReader(text.splitlines()))
    assert parsed[1] == {
        "scale": "2.0",
        "remote_io_bytes_per_sec": "200000000.0",
        "policy": "fifo",
        "cache_system": "alluxio",
        "jobs": "3",
        "finished": "3",
        "average_jct": "3600",
        "makespan": "7200",
        "silod_jct_speedup": "2.0",
    }
    assert sweep.csv_text("sharing", sharing).startswith("sharing,remote_io_bytes_per_sec,")

    lines = sweep.markdown_text("bandwidth sweep: tiny, fifo", "bandwidth", rows).splitlines()
    assert lines[0] == "# bandwidth sweep: tiny, fifo"
    assert lines[2] == "| SCALE | REMOTE IO | CACHE | FINISHED | AVG JCT | MAKESPAN | SILOD SPEEDUP |"
    assert lines[3] == "| --- | --- | --- | --- | --- | --- | --- |"
    assert lines[5] == "| 2x | 200.0 MB/s | alluxio | 3/3 | 1.0h | 2.0h | 2.00x |"
    assert lines[7] == sweep.speedup_note("bandwidth", rows)
    assert lines[7] == (
        "SILOD SPEEDUP: average JCT of the cache system / silod's at the same scale (above 1: silod is faster)"
    )


def test_no_silod_speedup_where_the_run_or_silods_left_jobs_unfinished() -> None:
    # At 1x alluxio finished 2 of 3 jobs, at 2x silod did: their averages are over different jobs. At 4x both
    # ran to the end.
    runs = [sweep.SweepRun("bandwidth", v, "fifo", c) for v in (1.0, 2.0, 4.0) for c in ("silod", "alluxio")]
    numbers = [summary(1800), summary(900, finished=2), summary(1800, finished=2), summary(3600), *[summary(900)] * 2]
    rows = sweep.sweep_rows(runs, numbers)
    assert rows[0].silod_speedup == 1.0
    assert all(math.isnan(row.silod_speedup) for row in rows[1:4])
    assert [row.silod_speedup for row in rows[4:]] == [1.0, 1.0]
    assert [cells[-1] for cells in sweep.table_rows("bandwidth", rows)] == ["1.00x", "-", "-", "-", "1.00x", "1.00x"]
    assert sweep.speedup_note("bandwidth", rows).endswith(
        "; - where this run or silod's left jobs unfinished (a time limit): each average is over the jobs that run "
        "finished, not the same jobs"
    )


def test_the_plots_are_valid_png_files(tmp_path: Path) -> None:
    runs = [sweep.SweepRun("sharing", v, "fifo", c) for v in (0.0, 0.5, 1.0) for c in ("silod", "alluxio", "quiver")]
    rows = sweep.sweep_rows(runs, [summary(100 * (i + 1)) for i in range(len(runs))])
    sweep.plot_sweep(tmp_path / "sharing.png", "sharing", "sharing", rows)
    bandwidth = [replace(r, remote_io_limit=r.value * 1e9 + 1e8) for r in rows]
    sweep.plot_sweep(tmp_path / "bandwidth.png", "bandwidth", "bandwidth", bandwidth)
    assert is_png(tmp_path / "sharing.png") and is_png(tmp_path / "bandwidth.png")


# --- the command ------------------------------------------------------------------------------------------------


def test_bandwidth_runs_each_cache_system_at_each_scale_and_writes_the_table_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    argv = [
        "sim",
        "sweep",
        "bandwidth",
        *tiny_inputs(tmp_path),
        "--scales",
        "0.5,2",
        "--cache-systems",
        "alluxio,silod",
    ]
    assert main([*argv, "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    rows = read_csv(out / "sweep.csv")
    assert [(r["scale"], r["remote_io_bytes_per_sec"], r["cache_system"]) for r in rows] == [
        ("0.5", "50000000.0", "alluxio"),
        ("0.5", "50000000.0", "silod"),
        ("2.0", "200000000.0", "alluxio"),
        ("2.0", "200000000.0", "silod"),
    ]
    assert all((r["policy"], r["jobs"], r["finished"]) == ("fifo", "3", "3") for r in rows)
    for alluxio, silod in (rows[0:2], rows[2:4]):
        assert float(alluxio["silod_jct_speedup"]) == pytest.approx(
            float(alluxio["average_jct"]) / float(silod["average_jct"])
        )
        assert float(silod["silod_jct_speedup"]) == 1.0
    assert float(rows[0]["average_jct"]) != float(rows[2]["average_jct"])  # the scale changed the runs

    # The 2x rows are what `silod sim --remote-io-scale 2` reports.
    single = tmp_path / "single"
    assert (
        main(
            ["sim", *tiny_inputs(tmp_path), "--remote-io-scale", "2", "--cache-system", "alluxio", "--out", str(single)]
        )
        == 0
    )
    jcts = [float(job["jct"]) for job in read_csv(single / "jobs.csv")]
    assert float(rows[2]["average_jct"]) == pytest.approx(sum(jcts) / len(jcts))

    assert "[1/4] fifo/alluxio at 0.5x: avg JCT " in printed.err and "[4/4] fifo/silod at 2x: avg JCT " in printed.err
    table = printed.out.splitlines()
    assert table[0].split() == [
        "SCALE",
        "REMOTE",
        "IO",
        "CACHE",
        "FINISHED",
        "AVG",
        "JCT",
        "MAKESPAN",
        "SILOD",
        "SPEEDUP",
    ]
    assert table[3].split()[:5] == ["2x", "200.0", "MB/s", "alluxio", "3/3"]
    assert table[3].split()[-1] == f"{float(rows[2]['silod_jct_speedup']):.2f}x"
    markdown = (out / "sweep.md").read_text()
    assert "| 2x | 200.0 MB/s | alluxio | 3/3 |" in markdown
    assert is_png(out / "bandwidth.png")
    assert sorted(path.name for path in out.iterdir()) == ["bandwidth.png", "sweep.csv", "sweep.md"]  # no decision logs


def test_bandwidth_in_worker_processes_writes_what_one_run_at_a_time_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "sweep", "bandwidth", *tiny_inputs(tmp_path), "--scales", "0.25,1", "--policy", "sjf"]
    assert main([*argv, "--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    one_at_a_time = capsys.readouterr()
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    in_workers = capsys.readouterr()
    assert "running 4 simulations, 2 at a time" in in_workers.err
    labels = ("sjf/silod at 0.25x", "sjf/alluxio at 0.25x", "sjf/silod at 1x", "sjf/alluxio at 1x")
    assert all(f"] {label}: avg JCT " in in_workers.err for label in labels)
    assert sorted(line[: line.index("]") + 1] for line in in_workers.err.splitlines() if line.startswith("[")) == [
        f"[{i}/4]" for i in range(1, 5)
    ]
    assert in_workers.out.replace("two", "one") == one_at_a_time.out
    for name in ("sweep.csv", "sweep.md"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text(), name


def test_sharing_regenerates_the_scenario_at_each_fraction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # cluster96 with a tenth of its egress, cut off after 12 simulated hours: enough for sharing to matter.
    monkeypatch.chdir(tmp_path)
    options = ["--remote-io-scale", "0.1", "--time-limit", "12h"]
    argv = [
        "sim",
        "sweep",
        "sharing",
        "--scenario",
        "cluster96",
        "--fractions",
        "0,1",
        "--cache-systems",
        "silod,alluxio",
    ]
    assert main([*argv, *options, "--jobs", "1"]) == 0
    out = tmp_path / "sim-cluster96-sweep-sharing"
    rows = read_csv(out / "sweep.csv")
    assert [(r["sharing"], r["cache_system"]) for r in rows] == [
        ("0.0", "silod"),
        ("0.0", "alluxio"),
        ("1.0", "silod"),
        ("1.0", "alluxio"),
    ]
    scenario = load_scenario("cluster96")
    assert scenario.recipe is not None
    cluster = with_remote_io_scale(scenario.cluster, 0.1)
    config = SimConfig(time_limit=12 * 3600)
    for row in rows:
        trace = generate(replace(scenario.recipe, sharing=float(row["sharing"])))
        direct = summarize(simulate(trace, cluster, build_scheduler("fifo", row["cache_system"]), config), cluster)
        assert int(row["finished"]) == direct.finished
        assert float(row["average_jct"]) == pytest.approx(direct.average_jct)
        assert float(row["remote_io_bytes_per_sec"]) == 100e6
    assert (rows[0]["finished"], rows[0]["average_jct"]) != (rows[2]["finished"], rows[2]["average_jct"])
    assert "SHARING  CACHE" in capsys.readouterr().out
    assert is_png(out / "sharing.png")


def test_each_run_is_the_run_silod_sim_makes_with_the_scenarios_settings_and_knobs(tmp_path: Path) -> None:
    # tiresias-fig7's [simulation] round (1 h) and [policy] knobs make Tiresias's Figure 7: 11.7 h under 2D-LAS
    # (the sweep ran 5-minute rounds and the default knobs before: 10.0 h).
    common = ["--scenario", "tiresias-fig7", "--policy", "tiresias-las"]
    assert main(["sim", *common, "--out", str(tmp_path / "single")]) == 0
    single = json.loads((tmp_path / "single" / "summary.json").read_text())
    argv = ["sim", "sweep", "bandwidth", *common, "--cache-systems", "silod", "--scales", "1"]
    assert main([*argv, "--jobs", "1", "--out", str(tmp_path / "sweep")]) == 0
    (row,) = read_csv(tmp_path / "sweep" / "sweep.csv")
    assert float(row["average_jct"]) == pytest.approx(single["average_jct"])
    assert float(row["makespan"]) == pytest.approx(single["makespan"])
    assert format_duration(float(row["average_jct"])) == "11.7h"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sharing", "--scenario", "micro"], "--scenario micro: it replays a trace file, which cannot be regenerated"),
        (["sharing", "--trace", "t.csv", "--cluster", "c.toml"], "it takes --scenario NAME of a generated scenario"),
        (["sharing"], "it takes --scenario NAME of a generated scenario (cluster400, cluster96, tiresias-philly)"),
        (
            ["bandwidth", "--scenario", "micro", "--cache-systems", "silod,redis"],
            "--cache-systems: unknown cache system 'redis'",
        ),
        (["bandwidth", "--scenario", "micro", "--policy", "lottery"], "--policy: unknown policy 'lottery'"),
        (
            ["bandwidth", "--scenario", "micro", "--remote-io-scale", "2"],
            "--remote-io-scale: the bandwidth sweep scales",
        ),
        (["bandwidth"], "give --trace FILE and --cluster FILE, or --scenario NAME"),
        # A sweep's runs are built as `silod sim` builds its run: the same knobs, the same tenants, refused alike.
        (
            ["bandwidth", "--scenario", "micro", "--policy", "tiresias-las", "--policy-option", "queues=garbage"],
            "policy 'tiresias-las': option queues: duration 'garbage' is not a number",
        ),
        (["bandwidth", "--scenario", "micro", "--policy-option", "s=8"], "--policy-option: none of fifo takes 's'"),
        (["sharing", "--scenario", "cluster96", "--tenants", "nowhere.toml"], "cannot read nowhere.toml"),
        # Generated, but by recipes without a sharing knob.
        (
            ["sharing", "--scenario", "fitgpp-synthetic"],
            '--scenario fitgpp-synthetic: its [generate] recipe is of kind "te-be", which has no sharing knob',
        ),
        (
            ["sharing", "--scenario", "hived-tenants"],
            '--scenario hived-tenants: its [generate] recipe is of kind "tenants", which has no sharing knob',
        ),
    ],
)
def test_bad_input_exits_2_naming_the_option_before_anything_runs(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["sim", "sweep", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bandwidth", "--scenario", "micro", "--scales", "0.5,0"], "argument --scales: '0' must be positive"),
        (["bandwidth", "--scenario", "micro", "--scales", "1,2,1"], "argument --scales: 1 given more than once"),
        (
            ["sharing", "--scenario", "cluster96", "--fractions", "0,1.5"],
            "argument --fractions: '1.5' must be between 0 and 1",
        ),
        (["sharing", "--scenario", "nowhere"], "argument --scenario: invalid choice: 'nowhere'"),
        # Only the last of two values counted, silently.
        (
            ["bandwidth", "--scenario", "micro", "--policy-option", "queues=1h", "--policy-option", "queues=2h"],
            "argument --policy-option: queues given twice (queues=1h, queues=2h); give it once",
        ),
    ],
)
def test_bad_values_are_refused_by_the_parser_with_exit_2(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["sim", "sweep", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_failed_run_in_a_worker_process_stops_the_sweep_with_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install_missing_node_policy(tmp_path, monkeypatch, "silod_sweep_site_policy")
    argv = ["sim", "sweep", "bandwidth", *tiny_inputs(tmp_path), "--policy", "missing-node", "--scales", "1,2"]
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "silod sim sweep bandwidth: " in err and "no-such-node" in err
    assert not (tmp_path / "out" / "sweep.csv").exists()
