"""`silod sim` and its reports: the summary math on hand-made results, the CSV and PNG files, the progress
line, running calls in worker processes, and the command end to end (generate, one run on the micro scenario, a
compare on a tiny trace, one at a time and in worker processes). The percentiles, groups and the files that
carry them: test_sim_report.py. test_sim_sweep.py shares the tiny trace and the failing site policy from here.

The command-line tests go through `silodcli.main.main`, so they need `silod sim` wired into main.py.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import multiprocessing
import os
import signal
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from time import monotonic, sleep

import pytest

from datamgr.scheduler.registry import CACHE_SYSTEMS, PAPER_CACHE_SYSTEMS
from datamgr.scheduler.sim import generator, plots, report
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.generator import GeneratorConfig, generate
from datamgr.scheduler.sim.model import (
    RUNNING,
    ClusterSpec,
    JobOutcome,
    RemoteIoLedger,
    Sample,
    SimResult,
    UnfinishedJob,
)
from datamgr.scheduler.sim.trace import load_trace
from silodcli.main import build_parser, main
from silodcli.processes import run_in_processes
from silodcli.progress import ProgressLine
from silodcli.sim import RUN_FILES, with_gpu_defaults
from silodcli.sim_outputs import staged_outputs
from tests.disks import TmpfsFactory
from tests.sim_fixtures import install_missing_node_policy, is_png, tiny_inputs

CLUSTER = ClusterSpec(nodes=2, gpus_per_node=4, cache_bytes_per_node=10**12, remote_io_bytes_per_sec=250e6)


def outcome(
    job_id: str, arrival: float, finish: float, hit: float = 0.0, remote: float = 100.0, equal_share: float = 0.0
) -> JobOutcome:
    return JobOutcome(job_id, arrival, arrival, finish, 1, "d", hit + remote, hit, remote, 0, equal_share)


def sample(time: float, io: float, running: int, fairness: float, cached: int = 0, effective: int = 0) -> Sample:
    return Sample(time, 2 * io, io, running, running, 0, cached, effective, fairness, fairness)


def result(policy: str = "fifo", cache_system: str = "silod", *jobs: JobOutcome) -> SimResult:
    outcomes = list(jobs) or [
        outcome("a", 0, 100, hit=30, remote=70, equal_share=200),  # fairness 100 / 200 = 0.5
        outcome("b", 10, 50, equal_share=100),  # 1.0
        outcome("c", 20, 220),  # nothing to compare with: left out of the fairness numbers
    ]
    samples = [
        sample(0, 100e6, 2, 0.5, cached=100, effective=50),
        sample(60, 200e6, 3, 1.0, cached=300, effective=300),
        sample(120, 0.0, 0, 0.0),  # an idle cluster: no fairness to measure
    ]
    ledger = RemoteIoLedger()
    for time, rate in ((0, 100e6), (30, 250e6), (31, 100e6), (60, 200e6), (120, 0.0)):
        ledger.record(time, rate)  # a one-second burst at 30 s, between samples
    ledger.end = 220
    unfinished = [UnfinishedJob("z", 5, RUNNING)]
    return SimResult(policy, cache_system, outcomes, samples, unfinished_jobs=unfinished, remote_io=ledger)


# --- report math -----------------------------------------------------------------------------------------------


def test_average_jct_and_makespan_follow_their_definitions() -> None:
    jobs = [outcome("a", 0, 100), outcome("b", 10, 50), outcome("c", 20, 220)]
    assert report.average_jct(jobs) == pytest.approx((100 + 40 + 200) / 3)
    assert report.makespan(jobs) == 220  # first arrival 0 to last finish 220
    assert report.makespan([outcome("late", 1000, 1500)]) == 500
    assert math.isnan(report.average_jct([])) and math.isnan(report.makespan([]))


def test_the_summary_averages_fairness_over_jobs_and_remote_io_over_the_run() -> None:
    summary = report.summarize(result(), CLUSTER)
    assert (summary.jobs, summary.finished) == (4, 3)  # the unfinished job counts as a job, not a JCT
    assert summary.median_jct == 100
    assert summary.fairness_median == pytest.approx(0.75)  # of 0.5 and 1.0 (job c has nothing to compare with)
    assert summary.fairness_p5 == pytest.approx(0.5 + 0.05 * 0.5)
    fetched = 100e6 * 59 + 250e6 * 1 + 200e6 * 60  # bytes from the first arrival (0) to the end (220)
    assert summary.remote_io_mean == pytest.approx(fetched / 220)
    assert summary.remote_io_peak == 250e6  # the burst no sample saw
    assert summary.remote_io_limit == 250e6
    assert summary.hit_ratio == pytest.approx(30 / 300)
    assert summary.effective_cache == pytest.approx(350 / 400)


def test_the_summary_text_shows_the_numbers_in_human_units() -> None:
    text = report.summary_text(report.summarize(result(), CLUSTER))
    assert "fifo/silod: 3 of 4 jobs finished (1 unfinished when the run stopped: 1 running)" in text
    assert "average JCT   1.9m (median 1.7m, p95 3.2m, p99 3.3m)" in text
    assert "queueing      0s average (median 0s, p95 0s) from arrival to first start" in text
    assert "makespan      -" in text  # job z has not finished: the last finish is still to come
    assert "fairness      0.525 p5, 0.75 median over jobs" in text
    assert "remote IO     82.5 MB/s mean (33%), 250.0 MB/s peak (100%) of 250.0 MB/s" in text
    assert "0.10 hit ratio, 88% of cached bytes effective" in text


def whole(policy: str, cache_system: str, *jobs: JobOutcome) -> SimResult:
    """`result` run to its end: every job finished (none left unfinished by a time limit)."""
    return replace(result(policy, cache_system, *jobs), unfinished_jobs=[])


def test_speedups_are_over_the_same_policy_on_the_baseline_cache_system() -> None:
    runs = [
        whole("fifo", "alluxio", outcome("a", 0, 200)),
        whole("fifo", "silod", outcome("a", 0, 50, equal_share=400 / 3)),  # fairness 100 / (400 / 3) = 0.75
        whole("sjf", "silod", outcome("a", 0, 80)),  # no sjf/alluxio run: no speedup
    ]
    summarized = [(r, report.summarize(r, CLUSTER)) for r in runs]
    assert report.jct_speedups(summarized, "alluxio")[:2] == [1.0, 4.0]
    rows = report.comparison_rows(summarized, "alluxio")
    assert [row[7] for row in rows] == ["1.00x", "4.00x", "-"]
    assert rows[1][:6] == ("fifo", "silod", "1/1", "50s", "50s", "0.750")
    note = report.speedup_note("alluxio", summarized)
    assert note == "SPEEDUP: average JCT of the same policy on alluxio / this run's"  # nothing cut: nothing to say


def test_no_speedup_is_shown_where_the_run_or_its_baseline_left_jobs_unfinished() -> None:
    # `result` leaves job z running when the time limit stops the run: each average JCT is over its run's
    # finished jobs, a different set in each run, so no ratio of them is shown.
    runs = [
        whole("fifo", "alluxio", outcome("a", 0, 200)),
        result("fifo", "silod", outcome("a", 0, 50)),  # cut: its baseline ran to the end, it did not
        result("sjf", "alluxio", outcome("a", 0, 200)),  # cut: the baseline of sjf/silod
        whole("sjf", "silod", outcome("a", 0, 50)),
        whole("gavel", "alluxio", outcome("a", 0, 200)),
        whole("gavel", "silod", outcome("a", 0, 50)),  # neither cut: 200 / 50
    ]
    summarized = [(r, report.summarize(r, CLUSTER)) for r in runs]
    speedups = report.jct_speedups(summarized, "alluxio")
    assert speedups[0] == 1.0 and speedups[4:] == [1.0, 4.0]
    assert all(math.isnan(speedup) for speedup in speedups[1:4])
    rows = report.comparison_rows(summarized, "alluxio")
    assert [row[7] for row in rows] == ["1.00x", "-", "-", "-", "1.00x", "4.00x"]
    assert report.speedup_note("alluxio", summarized) == (
        "SPEEDUP: average JCT of the same policy on alluxio / this run's; - where this run or its alluxio run left "
        "jobs unfinished (a time limit): each average is over the jobs that run finished, not the same jobs"
    )


def test_the_csv_files_hold_one_row_per_job_sample_and_run(tmp_path: Path) -> None:
    run = result()
    report.write_jobs_csv(tmp_path / "jobs.csv", run)
    jobs = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert [row["job_id"] for row in jobs] == ["a", "b", "c"]
    assert [float(row["jct"]) for row in jobs] == [100, 40, 200]
    report.write_timeline_csv(tmp_path / "timeline.csv", run)
    timeline = list(csv.DictReader((tmp_path / "timeline.csv").open()))
    assert [float(row["remote_io_bytes_per_sec"]) for row in timeline] == [100e6, 200e6, 0]
    summarized = [(run, report.summarize(run, CLUSTER))]
    report.write_comparison_csv(tmp_path / "compare.csv", summarized, "silod")
    (row,) = csv.DictReader((tmp_path / "compare.csv").open())
    assert row["policy"] == "fifo" and float(row["average_jct"]) == pytest.approx(340 / 3)
    assert math.isnan(float(row["jct_speedup_vs_silod"]))  # job z is left unfinished: no speedup (`nan`)


def test_the_plots_are_valid_png_files(tmp_path: Path) -> None:
    run = result()
    plots.plot_jct_cdf(tmp_path / "cdf.png", {"fifo/silod": run, "fifo/alluxio": result("fifo", "alluxio")})
    plots.plot_timeline(tmp_path / "timeline.png", run, CLUSTER)
    plots.plot_fairness(tmp_path / "fairness.png", run)
    for name in ("cdf.png", "timeline.png", "fairness.png"):
        assert is_png(tmp_path / name), name


# --- the progress line -----------------------------------------------------------------------------------------


class Stream(io.StringIO):
    """A stderr stand-in that is a terminal or not, as the test says."""

    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_line_stays_quiet_for_short_runs_and_rate_limits_long_ones() -> None:
    clock, stream = Clock(), Stream(terminal=True)
    progress = ProgressLine("fifo/silod", stream=stream, clock=clock, delay=1.0)
    progress(60.0, 1, 10)
    clock.now = 100.5
    progress(120.0, 2, 10)
    assert stream.getvalue() == ""
    clock.now = 102.0
    progress(7200.0, 3, 10)
    clock.now = 102.5
    progress(9000.0, 4, 10)  # within a second of the last line
    assert stream.getvalue() == "\rfifo/silod: 2.0h simulated, 3/10 jobs done, 2 s elapsed"


def test_the_progress_line_redraws_in_place_and_ends_with_the_final_numbers() -> None:
    clock, stream = Clock(), Stream(terminal=True)
    progress = ProgressLine("fifo/silod", stream=stream, clock=clock, delay=1.0)
    clock.now = 101.0
    progress(3570.0, 3, 10)
    clock.now = 103.0
    progress(3600.0, 4, 10)  # "59.5m" becomes "1.0h": a blank covers the longer line's last character
    clock.now = 103.5
    progress(7200.0, 10, 10)  # too soon to draw, but the last numbers
    clock.now = 110.0
    progress.close()
    assert stream.getvalue().split("\r") == [
        "",
        "fifo/silod: 59.5m simulated, 3/10 jobs done, 1 s elapsed",
        "fifo/silod: 1.0h simulated, 4/10 jobs done, 3 s elapsed ",
        "fifo/silod: 2.0h simulated, 10/10 jobs done, 10 s elapsed\n",
    ]


def test_the_progress_line_writes_nothing_when_the_stream_is_not_a_terminal() -> None:
    clock, stream = Clock(), Stream(terminal=False)
    progress = ProgressLine("fifo/silod", stream=stream, clock=clock, delay=1.0)
    for step in range(1, 5):
        clock.now += 10.0
        progress(3600.0 * step, step, 4)
    progress.close()
    assert stream.getvalue() == ""


# --- worker processes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 3])
def test_run_in_processes_returns_results_in_order_and_reports_each_as_it_ends(
    processes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    told: list[tuple[int, int, int]] = []
    calls = [partial(pow, 2, exponent) for exponent in range(5)]  # builtins: they pickle into a spawned worker
    assert run_in_processes(calls, processes, lambda *done: told.append(done)) == [1, 2, 4, 8, 16]
    assert {index: result for index, _, result in told} == {index: 2**index for index in range(5)}
    assert [count for _, count, _ in told] == [1, 2, 3, 4, 5]  # in the order they ended
    if processes == 1:
        assert [index for index, _, _ in told] == [0, 1, 2, 3, 4]
    announced = "running 5 simulations, 3 at a time" in capsys.readouterr().err
    assert announced == (processes > 1)


def test_run_in_processes_raises_the_first_failure() -> None:
    calls = [partial(int, "1"), partial(int, "not a number"), partial(int, "3")]
    for processes in (1, 2):
        with pytest.raises(ValueError, match="not a number"):
            run_in_processes(calls, processes, lambda *_: None)


def test_ctrl_c_in_run_in_processes_ends_the_workers_in_their_calls_and_waits_for_them() -> None:
    # Ctrl-C while the parent waits: the workers, in calls that sleep a minute, are ended rather than waited for.
    calls = [partial(sleep, 0), partial(sleep, 60), partial(sleep, 60)]

    def interrupted(index: int, count: int, result: object) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C raises it: the first call has ended, the others are sleeping

    started = monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_in_processes(calls, 2, interrupted)
    assert multiprocessing.active_children() == []  # ended, and waited for: none is left to write anything
    assert monotonic() - started < 30


# --- the command -----------------------------------------------------------------------------------------------


def test_compare_and_the_sharing_sweep_run_the_papers_cache_systems_unless_told() -> None:
    # quiver-stable is registered, and opt-in: a run names it.
    assert PAPER_CACHE_SYSTEMS == ("silod", "alluxio", "coordl", "quiver")
    assert set(PAPER_CACHE_SYSTEMS) < set(CACHE_SYSTEMS) and "quiver-stable" in CACHE_SYSTEMS
    parser = build_parser()
    assert with_gpu_defaults(parser.parse_args(["sim", "compare"])).cache_systems == list(PAPER_CACHE_SYSTEMS)
    assert with_gpu_defaults(parser.parse_args(["sim", "compare"])).policies == ["fifo", "sjf", "gavel"]
    assert with_gpu_defaults(parser.parse_args(["sim"])).cache_system == "silod"
    assert parser.parse_args(["sim", "sweep", "sharing"]).cache_systems == list(PAPER_CACHE_SYSTEMS)
    assert parser.parse_args(["sim", "sweep", "bandwidth"]).cache_systems == ["silod", "alluxio"]
    assert parser.parse_args(["sim", "--cache-system", "quiver-stable"]).cache_system == "quiver-stable"
    chosen = parser.parse_args(["sim", "compare", "--cache-systems", "quiver,quiver-stable"])
    assert chosen.cache_systems == ["quiver", "quiver-stable"]


def test_compare_help_names_its_default_and_every_cache_system(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default silod,alluxio,coordl,quiver, the paper's; known: " in text
    assert "all four" not in text and "quiver-stable" in text


def test_generate_writes_the_trace_the_generator_makes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.jsonl"
    code = main(["sim", "generate", "--out", str(out), "--jobs", "40", "--sharing", "0.2", "--seed", "9"])
    assert code == 0
    assert load_trace(out) == generate(GeneratorConfig(jobs=40, sharing=0.2, seed=9))
    assert "wrote 40 jobs arriving over" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim"], "give --trace FILE and --cluster FILE, or --scenario NAME"),
        (["sim", "--scenario", "micro", "--trace", "t.csv"], "--scenario replaces --trace and --cluster"),
        (["sim", "--scenario", "micro", "--policy", "lottery"], "unknown policy 'lottery'; known policies: "),
        (  # was "unknown policy 'harmony'", though docs/harmony.md documents it
            ["sim", "--scenario", "micro", "--policy", "harmony"],
            "'harmony' is a co-location policy, which only `silod sim` runs, on a co-location scenario",
        ),
        (["sim", "--trace", "missing.csv", "--cluster", "c.toml"], "cannot read c.toml"),
        (
            ["sim", "compare", "--scenario", "micro", "--cache-systems", "silod", "--baseline", "quiver"],
            "--baseline quiver is not one of --cache-systems silod",
        ),
        (["sim", "generate", "--out", "t.txt", "--jobs", "3"], "t.txt: a trace file must end in .csv or .jsonl"),
        # A limit past what a rate can be (an OverflowError traceback in the first round before).
        (
            ["sim", "--scenario", "micro", "--remote-io-scale", "1e308"],
            "silod sim: --remote-io-scale 1e+308: the cluster's remote IO limit of 200,000,000 bytes/s x 1e+308 is",
        ),
        (
            ["sim", "sweep", "bandwidth", "--scenario", "micro", "--scales", "1,1e308"],
            "silod sim sweep bandwidth: --scales 1e+308: the cluster's remote IO limit of 200,000,000 bytes/s x 1e+308",
        ),
        # A limit under a byte a second: named by the option that scaled it, not blamed on the cluster's remote_io
        # ("check the unit of remote_io" before), in each command that takes a scale.
        (
            ["sim", "--scenario", "micro", "--remote-io-scale", "1e-12"],
            "silod sim: --remote-io-scale 1e-12: the cluster's remote IO limit of 200,000,000 bytes/s x 1e-12 is "
            "0.0002 bytes/s, less than the smallest limit silod takes, 1 byte/s",
        ),
        (
            ["sim", "compare", "--scenario", "micro", "--remote-io-scale", "1e-12"],
            "silod sim compare: --remote-io-scale 1e-12: the cluster's remote IO limit of 200,000,000 bytes/s x 1e-12",
        ),
        (
            ["sim", "sweep", "bandwidth", "--scenario", "micro", "--scales", "1,1e-9"],
            "silod sim sweep bandwidth: --scales 1e-09: the cluster's remote IO limit of 200,000,000 bytes/s x 1e-09 "
            "is 0.2 bytes/s, less than the smallest limit silod takes",
        ),
        # A limit that would take ten thousand years to bring the datasets in (a traceback from a worker before).
        (
            ["sim", "--scenario", "micro", "--remote-io-scale", "1e-7"],
            "silod sim: --remote-io-scale 1e-07: the trace's jobs read at least 6.1 TiB from remote storage, 1.06e+04 "
            "years at the cluster's remote IO limit of 20 B/s, past the simulator's horizon of 10 years: give a larger "
            "--remote-io-scale",
        ),
        (
            ["sim", "sweep", "bandwidth", "--scenario", "micro", "--scales", "1,1e-7"],
            "silod sim sweep bandwidth: --scales 1e-07: the trace's jobs read at least 6.1 TiB",
        ),
        (["sim", "generate", "--out", "no/such/dir/t.csv", "--jobs", "3"], "cannot write no/such/dir/t.csv: No such"),
        # Knobs whose trace the simulator would refuse, named by their options: a rate past the largest (an
        # OverflowError traceback before), one rounded to 0 bytes/s, arrivals 1e296 years apart (a 300-digit "arriving
        # over ...d" before).
        (
            ["sim", "generate", "--out", "t.csv", "--jobs", "10", "--gpu-speed-scale", "1e300"],
            "silod sim generate: --gpu-speed-scale: 1e+300 must be at most 1e+10: the fastest job the generator draws",
        ),
        (
            ["sim", "generate", "--out", "t.csv", "--jobs", "10", "--gpu-speed-scale", "1e-300"],
            "silod sim generate: --gpu-speed-scale: 1e-300 must be at least 0.002: the longest job the generator draws",
        ),
        (
            ["sim", "generate", "--out", "t.csv", "--jobs", "10", "--arrivals-per-hour", "1e-300"],
            "silod sim generate: --jobs, --arrivals-per-hour: 10 jobs at 1e-300 an hour arrive over 1.14e+297 years",
        ),
        (
            ["sim", "generate", "--out", "t.csv", "--duration", "1000w"],
            "silod sim generate: --duration: 604,800,000 s must be at most the simulator's horizon of 10 years",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_problem(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("t.txt", "t.txt: a trace file must end in .csv or .jsonl"),
        ("no/such/dir/t.csv", "cannot write no/such/dir/t.csv: No such file or directory"),
        ("a-dir.csv", "cannot write a-dir.csv: Is a directory"),
    ],
    ids=["extension", "no-directory", "a-directory"],
)
def test_generate_refuses_an_output_it_cannot_write_before_it_makes_a_job(
    out: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A million jobs were drawn, 9 s and 520 MB, before the file's extension or directory was looked at."""
    monkeypatch.chdir(tmp_path)
    Path("a-dir.csv").mkdir()

    def no_job(*args: object) -> object:
        raise AssertionError("a job was drawn")

    monkeypatch.setattr(generator, "_draw", no_job)
    assert main(["sim", "generate", "--out", out, "--jobs", "1000000"]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir.csv"]  # nothing written, not even in part


@pytest.mark.parametrize("existing", [True, False], ids=["to-a-file", "to-no-file-yet"])
def test_generate_writes_through_a_symlink_at_out_and_leaves_the_link(existing: bool, tmp_path: Path) -> None:
    """As a shell's `>` and cp write through a symlink. The trace was renamed over the link: the link was gone, a
    regular file in its place, and the file it led to left as it was."""
    target = tmp_path / "traces" / "t.csv"
    target.parent.mkdir()
    if existing:
        target.write_text("an earlier trace\n")
    link = tmp_path / "latest.csv"
    link.symlink_to(Path("traces") / "t.csv")

    assert main(["sim", "generate", "--out", str(link), "--jobs", "3"]) == 0

    assert link.is_symlink() and os.readlink(link) == str(Path("traces") / "t.csv")
    assert load_trace(target) == generate(GeneratorConfig(jobs=3))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["latest.csv", "t.csv", "traces"]  # no partial file left


@pytest.mark.parametrize(
    ("leads_to", "options", "message"),
    [
        ("no/such/dir/t.csv", ["--jobs", "3"], "(a symlink to no/such/dir/t.csv): No such file or directory"),
        ("t.csv", ["--duration", "1000w"], "--duration: 604,800,000 s must be at most the simulator's horizon"),
    ],
    ids=["to-a-missing-directory", "bad-knob"],
)
def test_generate_refused_through_a_symlink_leaves_the_link_and_its_file_as_they_were(
    leads_to: str, options: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link into a missing directory was replaced by the trace (exit 0), and the link lost."""
    (tmp_path / "t.csv").write_text("an earlier trace\n")
    link = tmp_path / "latest.csv"
    link.symlink_to(leads_to)

    assert main(["sim", "generate", "--out", str(link), *options]) == 2

    assert message in capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == leads_to
    assert (tmp_path / "t.csv").read_text() == "an earlier trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.csv", "t.csv"]


def test_generate_writes_a_trace_job_by_job_in_the_same_memory_at_any_length(tmp_path: Path) -> None:
    """It built the whole trace first, about half a kilobyte a job: 2.3 GB and growing a minute into --jobs 1e9."""
    assert main(["sim", "generate", "--out", str(tmp_path / "warm.csv"), "--jobs", "10"]) == 0  # imports done
    tracemalloc.start()
    try:
        assert main(["sim", "generate", "--out", str(tmp_path / "t.csv"), "--jobs", "10000"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, f"{peak:,} bytes at the peak for 10,000 jobs"
    assert len(load_trace(tmp_path / "t.csv")) == 10_000


@pytest.mark.parametrize(
    ("options", "sha256"),
    [
        (
            ["--jobs", "5000", "--sharing", "0.2", "--irregular", "0.3", "--gpu-speed-scale", "2.5", "--seed", "11"],
            {".csv": "35726fbfd44680a63758622a074fc813a994e45e83a7afe40934a05c3a365282",
             ".jsonl": "5c10b25da72035ff46b07cc73e28c1ffb0cb70dbd8678cd0cf219d328f00c501"},
        ),
        (
            ["--duration", "36h", "--arrivals-per-hour", "0.5"],
            {".csv": "b3e1ad1d0819235fec244e40021533714fb71f8a56ca8eb013cdfc5f3c6a59ae",
             ".jsonl": "7dffb4e8637947ce0d2ae4d57621abe75adb8c9d2b9dde33bf96a1beab09c83e"},
        ),
    ],
    ids=["jobs", "duration"],
)  # fmt: skip
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_generate_writes_the_same_bytes_for_the_same_options_as_it_always_has(
    options: list[str], sha256: dict[str, str], suffix: str, tmp_path: Path
) -> None:
    """The files `silod sim generate` wrote at 35fa8e1, when it built the whole trace before writing it: writing job
    by job must not change a byte of a trace someone's results were measured on."""
    out = tmp_path / f"t{suffix}"
    assert main(["sim", "generate", "--out", str(out), *options]) == 0
    assert hashlib.sha256(out.read_bytes()).hexdigest() == sha256[suffix]


def test_a_generate_refused_for_arrivals_past_the_horizon_leaves_the_file_at_out_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ten jobs 0.91 years apart on average pass the 10-year horizon with this seed: the trace was written, and the
    simulator refused it. Now nothing is written, and an earlier trace at --out stays whole."""
    out = tmp_path / "t.csv"
    out.write_text("an earlier trace\n")
    argv = ["sim", "generate", "--out", str(out), "--jobs", "10", "--arrivals-per-hour", "0.000125", "--seed", "0"]
    assert main(argv) == 2
    assert (
        "--jobs, --arrivals-per-hour: job 8 of 10 arrives 11.3 years after the trace start" in capsys.readouterr().err
    )
    assert out.read_text() == "an earlier trace\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_a_trace_with_timestamps_for_arrivals_is_refused_at_once_naming_the_mistake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Public traces often carry Unix timestamps; taken as seconds from the trace start they put 54 years of empty
    rounds and samples before the first job (over 5 minutes and 9.5 GB, still stepping, before this check)."""
    monkeypatch.chdir(tmp_path)
    header = "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs"
    Path("t.csv").write_text(f"{header}\na,1700000000,1,m,1MB/s,d,1GB,1\nb,1700000100,1,m,1MB/s,d,1GB,1\n")
    Path("c.toml").write_text('nodes = 1\ngpus_per_node = 1\ncache_per_node = "0B"\nremote_io = "1MB/s"\n')

    assert main(["sim", "--trace", "t.csv", "--cluster", "c.toml", "--out", "out"]) == 2
    assert "trace job 'a': arrival 1700000000 s is 53.9 years after the trace start" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "t.csv"]  # nothing ran, nothing written


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (["--jobs", "-3"], "argument --jobs: '-3' must be at least 1"),  # not "is not a whole number, zero or more"
        (["--jobs", "0"], "argument --jobs: '0' must be at least 1"),
        (["--jobs", "2.5"], "argument --jobs: '2.5' is not a whole number"),
        (["--duration", "0s"], "argument --duration: duration '0s' must be longer than 0"),  # a traceback before
        (["--duration", "0"], "argument --duration: duration '0' must be longer than 0"),
        (["--duration", "-5m"], "argument --duration: duration '-5m' must not be negative"),
        # Infinity: arrivals drawn until memory ran out, before.
        (["--duration", "1e400"], "argument --duration: duration '1e400' is too long to be a number of seconds"),
    ],
)
def test_a_generated_traces_size_that_breaks_its_rule_is_refused_naming_it(
    size: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["sim", "generate", "--out", "t.csv", *size])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # A name listed twice would run the same pair twice, both writing into one directory at once.
        (["compare", "--policies", "fifo,sjf,fifo"], "argument --policies: fifo given more than once"),
        (["compare", "--cache-systems", "silod, silod"], "argument --cache-systems: silod given more than once"),
        (["sweep", "bandwidth", "--cache-systems", "silod,alluxio,silod"], "--cache-systems: silod given more than"),
        # A time limit of 0 would stop the run before anything happens.
        (["--time-limit", "0"], "argument --time-limit: duration '0' must be longer than 0"),
        (["--time-limit", "0s"], "argument --time-limit: duration '0s' must be longer than 0"),
        (["--time-limit", "-1d"], "argument --time-limit: duration '-1d' must not be negative"),
        # The live data manager's shortest round: a nanosecond's made hours of rounds of a minute's trace.
        (["--round", "1e-9"], "argument --round: '1e-9' must be a positive number of seconds of at least 0.1"),
        (["compare", "--round", "0.01"], "argument --round: '0.01' must be a positive number of seconds of at least"),
        # Paid at every preemption: a cost of 1e12 s, or infinity, ran until memory ran out.
        (["--preemption-cost", "1e400"], "argument --preemption-cost: duration '1e400' is too long to be a number"),
        (["--preemption-cost", "1e12"], "argument --preemption-cost: '1e12' must be at most a day (86,400 s)"),
        (["sweep", "bandwidth", "--preemption-cost", "2d"], "argument --preemption-cost: '2d' must be at most a day"),
    ],
)
def test_run_options_the_parser_refuses_exit_2_naming_the_rule_and_write_nothing(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["sim", *argv, "--scenario", "micro"])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "--seed", "5", "compare", "--scenario", "micro"], "--seed given before 'compare'"),
        (["sim", "--scenario", "micro", "generate", "--out", "t.csv", "--jobs", "3"], "--scenario given before"),
    ],
)
def test_options_before_an_action_are_refused_not_dropped(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--scenario", "micro"],
        ["sim", "compare", "--scenario", "micro", "--policies", "fifo", "--cache-systems", "silod"],
        ["sim", "--scenario", "harmony-80"],
        ["sim", "compare", "--scenario", "harmony-80"],
        ["sim", "sweep", "bandwidth", "--scenario", "micro", "--scales", "1,2"],
    ],
    ids=["sim", "compare", "colocation-sim", "colocation-compare", "sweep"],
)
@pytest.mark.parametrize("below", [False, True], ids=["file", "below-a-file"])
def test_an_out_that_cannot_be_a_directory_is_refused_naming_it_before_anything_runs(
    argv: list[str], below: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    in_the_way = tmp_path / "results"
    in_the_way.write_text("kept")
    out = in_the_way / "run" if below else in_the_way

    assert main([*argv, "--out", str(out)]) == 2

    printed = capsys.readouterr()
    assert f"--out {out}: {in_the_way} is not a directory" in printed.err
    assert printed.out == ""  # no run reported: none started
    assert in_the_way.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--scenario", "micro"],
        ["sim", "compare", "--scenario", "micro", "--policies", "fifo", "--cache-systems", "silod"],
        ["sim", "--scenario", "harmony-80"],
        ["sim", "sweep", "bandwidth", "--scenario", "micro", "--scales", "1,2"],
    ],
    ids=["sim", "compare", "colocation-sim", "sweep"],
)
@pytest.mark.parametrize("leads_to", ["missing", "missing/run", "a-file"], ids=["missing", "below-missing", "file"])
def test_an_out_that_is_a_symlink_to_no_directory_is_refused_naming_where_it_leads(
    argv: list[str], leads_to: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mkdir's own answer, "--out results: File exists", named neither the link nor where it leads."""
    (tmp_path / "a-file").write_text("kept")
    out = tmp_path / "results"
    out.symlink_to(leads_to)

    assert main([*argv, "--out", str(out)]) == 2

    printed = capsys.readouterr()
    assert f"--out {out}: a symlink to {leads_to}, which is not a directory; make that directory" in printed.err
    assert printed.out == ""  # no run reported: none started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "results"]
    assert out.is_symlink() and (tmp_path / "a-file").read_text() == "kept"


def test_an_out_that_is_a_symlink_to_a_directory_gets_the_files_where_it_leads(tmp_path: Path) -> None:
    """As `cp FILE LINK/` puts a file: the link stays, the directory it leads to holds the run."""
    (tmp_path / "runs").mkdir()
    out = tmp_path / "latest"
    out.symlink_to("runs")
    assert main(["sim", *tiny_inputs(tmp_path), "--out", str(out)]) == 0
    assert out.is_symlink() and os.readlink(out) == "runs"
    assert "summary.json" in {path.name for path in (tmp_path / "runs").iterdir()}


@pytest.mark.parametrize("action", [["sim"], ["sim", "sweep", "bandwidth", "--scales", "1,0.5"]], ids=["sim", "sweep"])
@pytest.mark.parametrize("named_by", ["cluster-file", "--tenants"])
def test_a_remote_io_scale_below_what_the_tenants_reserve_is_refused_naming_the_scale(
    action: list[str], named_by: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cluster file's tenants were checked against its remote_io before it was scaled: the run went ahead with
    VCs reserving more remote IO than the cluster had; --tenants FILE was refused, but blamed on the file."""
    argv = tiny_inputs(tmp_path)  # 100MB/s of remote IO
    tenants = tmp_path / "vcs.toml"
    tenants.write_text('[vc-a]\ncells = { node = 1 }\nremote_io = "80MB/s"\n')
    if named_by == "cluster-file":
        cluster = Path(argv[3])
        cluster.write_text(cluster.read_text() + 'tenants = "vcs.toml"\n')
    else:
        argv += ["--tenants", str(tenants)]
    scale = ["--remote-io-scale", "0.5"] if action == ["sim"] else []
    out = tmp_path / "out"

    assert main([*action, *argv, *scale, "--out", str(out)]) == 2

    option = "--remote-io-scale" if action == ["sim"] else "--scales"
    assert (
        f"{option} 0.5: the cluster's remote IO limit of 100,000,000 bytes/s x 0.5 is 50,000,000 bytes/s, less than "
        "the 80,000,000 bytes/s its tenants reserve"
    ) in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["sim", "--policy", "fifo"], "sim"),
        (["sim", "compare", "--policies", "fifo", "--cache-systems", "silod,alluxio", "--jobs", "2"], "sim compare"),
        (["sim", "sweep", "bandwidth", "--scales", "1,2", "--cache-systems", "silod,alluxio"], "sim sweep bandwidth"),
    ],
    ids=["sim", "compare-in-workers", "sweep"],
)
def test_a_simulation_whose_outputs_fill_the_disk_exits_1_saying_where_without_a_traceback(
    tmpfs: TmpfsFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], name: str
) -> None:
    out = tmpfs(tmp_path / "small-disk", "16k") / "out"
    assert main([*command, "--scenario", "micro", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"silod {name}: cannot write its outputs (" in err and "No space left on device" in err, err
    assert str(out) in err and "Traceback" not in err


def test_sim_runs_the_micro_scenario_and_writes_its_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "micro"
    assert main(["sim", "--scenario", "micro", "--policy", "fifo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    jobs = list(csv.DictReader((out / "jobs.csv").open()))
    assert sorted(row["job_id"] for row in jobs) == [
        "bert",
        "efficientnetb1-0",
        "efficientnetb1-1",
        "resnet50-0",
        "resnet50-1",
    ]
    average = sum(float(row["jct"]) for row in jobs) / len(jobs)
    assert "fifo/silod: 5 of 5 jobs finished" in printed
    assert f"average JCT   {format_duration(average)}" in printed
    assert "of 200.0 MB/s" in printed
    lines = printed.splitlines()
    header = lines.index("  GPUS  JOBS  AVG JCT  P95 JCT  AVG QUEUEING  P50 SLOWDOWN  P95 SLOWDOWN  P99 SLOWDOWN")
    assert [line.split()[:2] for line in lines[header + 1 : header + 3]] == [["1", "4"], ["4", "1"]]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 5 and summary["average_jct"] == pytest.approx(average)
    assert sorted(wrote(printed, out)) == sorted(path.name for path in out.iterdir())
    assert "decisions.jsonl.gz" not in wrote(printed, out)  # only when asked
    for name in ("jct_cdf.png", "timeline.png", "fairness.png"):
        assert is_png(out / name), name


def wrote(printed: str, out: Path) -> list[str]:
    """The files that the command's closing line says it wrote into `out` (for a compare, into each run's
    directory)."""
    (line,) = [line for line in printed.splitlines() if line.startswith(f"wrote {out}/: ")]
    return line.split(": ")[-1].split(", ")


def test_the_decision_log_is_written_gzipped_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "micro"
    assert main(["sim", "--scenario", "micro", "--out", str(out), "--decision-log"]) == 0
    assert "decisions.jsonl.gz" in wrote(capsys.readouterr().out, out)
    with gzip.open(out / "decisions.jsonl.gz", "rt", encoding="utf-8") as log:
        rounds = [json.loads(line) for line in log]
    assert rounds and all({"time", "placements", "notes"} <= set(decision) for decision in rounds)
    assert main(["sim", "--scenario", "micro", "--out", str(out)]) == 0
    assert "decisions.jsonl.gz" not in wrote(capsys.readouterr().out, out)
    assert not (out / "decisions.jsonl.gz").exists()  # the first run's log would pass for the second's


def labelled_inputs(tmp_path: Path) -> list[str]:
    """The tiny trace's three jobs with tenants and classes (job a has no class). They fit on the node together
    (1 + 2 + 1 of 4 GPUs), so none waits: every slowdown is exactly 1."""
    argv = tiny_inputs(tmp_path)
    Path(argv[1]).write_text(
        "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs,tenant,class\n"
        "a,0,1,resnet50,100MB/s,small,100GB,3,vc-a,\n"
        "b,60,2,resnet50,200MB/s,large,1TB,1,vc-b,best-effort\n"
        "c,120,1,bert,2MB/s,huge,20TB,0.001,vc-a,best-effort\n"
    )
    return argv


def test_trace_labels_reach_jobs_csv_and_the_group_breakdowns(tmp_path: Path) -> None:
    # Through the engine: JobRun.outcome carries the trace's labels onto each JobOutcome.
    argv = labelled_inputs(tmp_path)
    out = tmp_path / "labelled"
    assert main(["sim", *argv, "--out", str(out)]) == 0
    jobs = {row["job_id"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert [(jobs[j]["tenant"], jobs[j]["class"]) for j in "abc"] == [
        ("vc-a", ""),
        ("vc-b", "best-effort"),
        ("vc-a", "best-effort"),
    ]
    groups = [(row["kind"], row["value"], row["finished"]) for row in csv.DictReader((out / "groups.csv").open())]
    assert groups == [
        ("gpus", "1", "2"),
        ("gpus", "2", "1"),
        ("bin", "SS", "3"),  # Tiresias's bins: every job here is small (<= 8 GPUs) and short (< 4 h)
        ("tenant", "vc-a", "2"),
        ("tenant", "vc-b", "1"),
        ("class", "", "1"),
        ("class", "best-effort", "2"),
    ]


def test_a_run_with_classes_prints_their_slowdowns_and_plots_them_by_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "labelled"
    assert main(["sim", *labelled_inputs(tmp_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    header = lines.index(
        "  CLASS        JOBS  AVG JCT  P95 JCT  AVG QUEUEING  P50 SLOWDOWN  P95 SLOWDOWN  P99 SLOWDOWN"
    )
    unlabelled, best_effort = lines[header + 1].split(), lines[header + 2].split()
    assert unlabelled[0] == "1" and best_effort[:2] == ["best-effort", "2"]  # job a's value is "": no cell
    assert unlabelled[-3:] == best_effort[-3:] == ["1.00", "1.00", "1.00"]  # nobody waited
    assert "  slowdown      1.00 median (p95 1.00, p99 1.00)" in printed
    assert "slowdown_cdf.png" in wrote(printed, out)
    assert is_png(out / "slowdown_cdf.png")

    assert main(["sim", *tiny_inputs(tmp_path), "--out", str(out)]) == 0  # the same jobs, no labels
    printed = capsys.readouterr().out
    assert "  CLASS " not in printed and "slowdown_cdf.png" not in wrote(printed, out)
    assert not (out / "slowdown_cdf.png").exists()  # the labelled run's plot would pass for this one's


def test_compare_plots_slowdowns_by_class_when_the_trace_has_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    argv = ["sim", "compare", *labelled_inputs(tmp_path), "--policies", "fifo,sjf", "--cache-systems", "silod"]
    assert main([*argv, "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}/: compare.csv, compare.md, jct_cdf.png, slowdown_cdf.png, and in each " in printed
    assert is_png(out / "slowdown_cdf.png") and is_png(out / "fifo-silod" / "slowdown_cdf.png")
    markdown = (out / "compare.md").read_text().splitlines()
    section = markdown.index("## Slowdown by class")
    assert [line.split(" | ")[:4] for line in markdown[section + 4 : section + 8]] == [
        ["| fifo", "silod", "", "1"],
        ["| fifo", "silod", "best-effort", "2"],
        ["| sjf", "silod", "", "1"],
        ["| sjf", "silod", "best-effort", "2"],
    ]


def test_compare_prints_one_row_per_pair_with_speedups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    argv = ["sim", "compare", *tiny_inputs(tmp_path), "--policies", "fifo", "--cache-systems", "alluxio,silod"]
    argv += ["--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].split() == [
        "POLICY",
        "CACHE",
        "FINISHED",
        "AVG",
        "JCT",
        "MAKESPAN",
        "FAIRNESS",
        "REMOTE",
        "IO",
        "SPEEDUP",
    ]
    alluxio, silod = lines[1].split(), lines[2].split()
    assert alluxio[:3] == ["fifo", "alluxio", "3/3"] and alluxio[-1] == "1.00x"
    assert silod[:3] == ["fifo", "silod", "3/3"]
    rows = {row["cache_system"]: row for row in csv.DictReader((out / "compare.csv").open())}
    speedup = float(rows["alluxio"]["average_jct"]) / float(rows["silod"]["average_jct"])
    assert silod[-1] == f"{speedup:.2f}x"
    assert is_png(out / "jct_cdf.png")
    markdown = (out / "compare.md").read_text().splitlines()
    assert markdown[0].startswith("| POLICY | CACHE | FINISHED | AVG JCT |") and "| P95 QUEUEING |" in markdown[0]
    assert markdown[3].startswith(f"| fifo | silod | 3/3 | {silod[3]} |")
    assert f"wrote {out}/: compare.csv, compare.md, jct_cdf.png, and in each POLICY-CACHE/: " in printed
    for run in ("fifo-silod", "fifo-alluxio"):
        assert sorted(wrote(printed, out)) == sorted(path.name for path in (out / run).iterdir()), run


@pytest.mark.parametrize(
    ("action", "labels"),
    [
        (["compare", "--cache-systems", "alluxio,silod"], ["fifo/alluxio", "fifo/silod"]),
        (
            ["sweep", "bandwidth", "--cache-systems", "alluxio,silod", "--scales", "2"],
            ["fifo/alluxio at 2x", "fifo/silod at 2x"],
        ),
    ],
)
def test_one_run_at_a_time_each_run_has_a_progress_line_and_in_workers_none(
    action: list[str], labels: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[str] = []

    class Recorded(ProgressLine):
        def __init__(self, label: str) -> None:
            super().__init__(label)
            drawn.append(label)

    monkeypatch.setattr("silodcli.sim.ProgressLine", Recorded)
    argv = ["sim", *action, *tiny_inputs(tmp_path), "--policy" if action[0] == "sweep" else "--policies", "fifo"]
    assert main([*argv, "--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    assert drawn == labels
    drawn.clear()
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    assert drawn == []  # a worker's line would garble the others'; each reports as it ends instead


def test_compare_in_worker_processes_writes_what_one_run_at_a_time_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = ["--policies", "fifo,sjf", "--cache-systems", "silod,coordl", "--decision-log"]
    assert main(["sim", "compare", *tiny_inputs(tmp_path), *matrix, "--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    one_at_a_time = capsys.readouterr()
    assert (
        main(["sim", "compare", *tiny_inputs(tmp_path), *matrix, "--jobs", "3", "--out", str(tmp_path / "three")]) == 0
    )
    in_workers = capsys.readouterr()
    assert "running 4 simulations, 3 at a time" in in_workers.err
    assert " simulations, " not in one_at_a_time.err and " done (" not in one_at_a_time.err
    assert all(f"{pair} done (" in in_workers.err for pair in ("fifo/silod", "fifo/coordl", "sjf/silod", "sjf/coordl"))
    assert in_workers.out.replace("three", "one") == one_at_a_time.out
    files = ("compare.csv", "compare.md", "sjf-coordl/jobs.csv", "fifo-silod/decisions.jsonl.gz")
    for name in (*files, "sjf-silod/timeline.csv", "fifo-coordl/summary.json", "sjf-silod/groups.csv"):
        assert (tmp_path / "three" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name


def test_compare_stops_with_exit_1_when_a_run_in_a_worker_process_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install_missing_node_policy(tmp_path, monkeypatch, "silod_bad_site_policy")
    argv = ["sim", "compare", *tiny_inputs(tmp_path), "--policies", "fifo,missing-node", "--cache-systems", "silod"]
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "out")]) == 1
    assert "no-such-node" in capsys.readouterr().err


# --- a run a time limit stops ------------------------------------------------------------------------------------

TRACE_HEADER = "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs\n"
ONE_NODE_TWO_GPUS = 'nodes = 1\ngpus_per_node = 2\ncache_per_node = "0"\nremote_io = "100GB/s"\n'


def cut_inputs(tmp_path: Path, *rows: str) -> list[str]:
    """--trace and --cluster arguments for `rows` on one node of two GPUs, no cache, remote IO to spare."""
    (tmp_path / "cut.csv").write_text(TRACE_HEADER + "".join(f"{row}\n" for row in rows))
    (tmp_path / "cut.toml").write_text(ONE_NODE_TWO_GPUS)
    return ["--trace", str(tmp_path / "cut.csv"), "--cluster", str(tmp_path / "cut.toml")]


def test_a_time_limited_run_measures_its_remote_io_and_gpus_from_the_first_arrival_finished_or_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # x reads at 100 MB/s for 10 h, y for the hour from 1 h: at 3 h x still runs. Over [0, 3 h] the cluster
    # fetched 100 MB/s x 3 h + 100 MB/s x 1 h and held 1, 2 then 1 of its 2 GPUs (the finished y alone arrived
    # at 1 h: from there the numbers were 150 MB/s and 75 %).
    argv = cut_inputs(tmp_path, "x,0,1,m,100MB/s,d1,3600GB,1", "y,1h,1,m,100MB/s,d2,360GB,1")
    out = tmp_path / "out"
    assert main(["sim", *argv, "--time-limit", "3h", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["remote_io_mean"] == pytest.approx(100e6 * 4 / 3)
    assert summary["gpu_utilisation"] == pytest.approx((3 + 1) / (3 * 2))  # x's 3 h and y's 1 h of 2 GPUs' 3 h
    assert summary["makespan"] is None  # x finishes after the limit: the makespan is unknown, not y's 1 h
    printed = capsys.readouterr().out
    assert "fifo/silod: 1 of 2 jobs finished (1 unfinished when the run stopped: 1 running)" in printed
    assert "  makespan      -" in printed and "133.3 MB/s mean" in printed and "GPUs          67% busy" in printed


def test_compare_shows_no_speedup_for_runs_a_time_limit_cut_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # y (1 h at 100 MB/s) finishes in both runs, x (10 h) in neither by 3 h: each average JCT is y's alone, and
    # their ratio (1.00x) would compare the survivors of the two runs, not the runs.
    argv = cut_inputs(tmp_path, "x,0,1,m,100MB/s,d1,3600GB,1", "y,0,1,m,100MB/s,d2,360GB,1")
    options = ["--policies", "fifo", "--cache-systems", "silod,alluxio", "--time-limit", "3h", "--jobs", "1"]
    assert main(["sim", "compare", *argv, *options, "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "compare.csv").open()))
    assert [(row["finished"], float(row["average_jct"])) for row in rows] == [("1", 3600.0), ("1", 3600.0)]
    assert all(math.isnan(float(row["jct_speedup_vs_silod"])) for row in rows)
    printed = capsys.readouterr().out.splitlines()
    table = [line.split() for line in printed if line.startswith("fifo ")]
    assert [cells[-1] for cells in table] == ["-", "-"]
    assert "- where this run or its silod run left jobs unfinished (a time limit)" in printed[len(table) + 1]
    assert "- where this run or its silod run left jobs unfinished" in (tmp_path / "out" / "compare.md").read_text()


def test_a_run_stopped_before_any_job_finished_still_measures_what_ran(tmp_path: Path) -> None:
    argv = ["sim", "compare", *cut_inputs(tmp_path, "a,0,1,m,100MB/s,d1,360GB,1"), "--time-limit", "10m"]
    assert main([*argv, "--policies", "fifo", "--cache-systems", "silod", "--out", str(tmp_path / "out")]) == 0
    (row,) = csv.DictReader((tmp_path / "out" / "compare.csv").open())
    assert (row["finished"], row["jobs"]) == ("0", "1")
    assert float(row["remote_io_mean"]) == pytest.approx(100e6) and float(row["remote_io_peak"]) == 100e6
    assert float(row["gpu_utilisation"]) == pytest.approx(0.5)
    assert math.isnan(float(row["makespan"])) and math.isnan(float(row["average_jct"]))


def test_the_summary_says_where_each_unfinished_job_stood_when_the_run_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # x runs on one GPU, w waits for both, y arrives at 1 h: after 30 minutes none has finished.
    rows = ("x,0,1,m,100MB/s,d1,3600GB,1", "w,0,2,m,100MB/s,d2,360GB,1", "y,1h,1,m,100MB/s,d3,360GB,1")
    assert main(["sim", *cut_inputs(tmp_path, *rows), "--time-limit", "30m", "--out", str(tmp_path / "out")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    expected = "1 running, 1 waiting (queued or preempted), 1 not yet arrived"
    assert first == f"fifo/silod: 0 of 3 jobs finished (3 unfinished when the run stopped: {expected})"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    counts = ("unfinished_running", "unfinished_waiting", "unfinished_not_arrived")
    assert [summary[name] for name in counts] == [1, 1, 1]


# --- interrupted runs and outputs that are inputs ------------------------------------------------------------------


def contents(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (hidden ones included), by its path relative to it."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


def test_ctrl_c_during_a_run_exits_130_in_one_line_and_leaves_the_earlier_runs_files_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sim", *tiny_inputs(tmp_path), "--out", str(out), "--decision-log"]) == 0
    earlier = contents(out)
    capsys.readouterr()

    def interrupted(*args: object, decision_log: io.TextIOBase, **kwargs: object) -> SimResult:
        decision_log.write('{"time": 0}\n')  # a decision log begun, as a run's first rounds write it
        raise KeyboardInterrupt

    monkeypatch.setattr("silodcli.sim.simulate", interrupted)
    assert main(["sim", *tiny_inputs(tmp_path), "--policy", "sjf", "--out", str(out), "--decision-log"]) == 130
    err = capsys.readouterr().err
    assert err == f"silod: interrupted; nothing of this run was written to {out}/\n"  # no traceback
    assert contents(out) == earlier  # the fifo run's files, whole, and nothing of the sjf run's


def test_a_run_interrupted_before_its_out_existed_leaves_no_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty --out stayed behind, though the line said nothing was written to it.
    def interrupted(*args: object, **kwargs: object) -> SimResult:
        raise KeyboardInterrupt

    monkeypatch.setattr("silodcli.sim.simulate", interrupted)
    out = tmp_path / "new" / "out"
    assert main(["sim", *tiny_inputs(tmp_path), "--out", str(out)]) == 130
    assert capsys.readouterr().err == f"silod: interrupted; nothing of this run was written to {out}/\n"
    assert not out.exists()


def test_a_compare_removes_the_run_directories_of_an_earlier_compare_that_it_does_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An earlier compare's sjf-silod/ stayed beside the new compare's, which its compare.md did not list.
    out = tmp_path / "out"
    argv = ["sim", "compare", *tiny_inputs(tmp_path), "--cache-systems", "silod", "--jobs", "1", "--out", str(out)]
    assert main([*argv, "--policies", "fifo,sjf", "--decision-log"]) == 0
    (out / "kept").mkdir()  # a run's files and another: not recognisably silod's, so it stays
    (out / "kept" / "summary.json").write_text("{}")
    (out / "kept" / "notes.txt").write_text("mine")
    (out / "linked").mkdir()  # a link to a run's file: not silod's either
    (out / "linked" / "summary.json").symlink_to(out / "sjf-silod" / "summary.json")
    fifo_log = out / "fifo-silod" / "decisions.jsonl.gz"
    assert fifo_log.exists()
    capsys.readouterr()
    assert main([*argv, "--policies", "fifo"]) == 0
    assert sorted(path.name for path in out.iterdir()) == [
        "compare.csv", "compare.md", "fifo-silod", "jct_cdf.png", "kept", "linked",
    ]  # fmt: skip
    assert not fifo_log.exists()  # the new fifo run wrote no decision log: the earlier one's went too
    assert sorted(path.name for path in (out / "kept").iterdir()) == ["notes.txt", "summary.json"]
    assert [path.name for path in out.rglob(".*")] == []  # nothing hidden left behind


def test_ctrl_c_during_a_compare_in_workers_ends_them_and_leaves_the_earlier_compare_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sim", "compare", *tiny_inputs(tmp_path), "--cache-systems", "silod", "--jobs", "2", "--out", str(out)]
    assert main([*argv, "--policies", "fifo"]) == 0
    earlier = contents(out)

    def interrupt_after_the_first(labels: list[str], workers: bool) -> Callable[[int, int, object], None]:
        def finished(index: int, count: int, result: object) -> None:
            raise KeyboardInterrupt  # Ctrl-C while the parent waits for the other runs

        return finished

    monkeypatch.setattr("silodcli.sim.say_when_done", interrupt_after_the_first)
    assert main([*argv, "--policies", "sjf,gavel,fifo"]) == 130
    assert "Traceback" not in capsys.readouterr().err
    assert contents(out) == earlier  # no sjf-silod/ beside the fifo compare's compare.md
    assert multiprocessing.active_children() == []  # the workers were ended, not left to finish their runs


@pytest.mark.parametrize(
    ("action", "output"),
    [
        (["sim"], "jobs.csv"),
        (["sim", "compare", "--policies", "fifo", "--cache-systems", "silod"], "fifo-silod/timeline.csv"),
        (["sim", "sweep", "bandwidth", "--scales", "1"], "sweep.md"),
    ],
    ids=["sim", "compare", "sweep"],
)
def test_an_output_that_is_an_input_file_is_refused_naming_both_before_anything_runs(
    action: list[str], output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = tiny_inputs(tmp_path)
    trace = Path(argv[1])
    out = tmp_path / "out"
    (out / output).parent.mkdir(parents=True)
    (out / output).hardlink_to(trace)  # the same file by another name: `--out .` beside jobs.csv is this too
    before = trace.read_bytes()
    assert main([*action, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: the run would replace {out / output}, which is the --trace file {trace}" in err
    assert trace.read_bytes() == before
    assert [path.name for path in out.rglob("*") if path.is_file()] == [Path(output).name]  # nothing ran


@pytest.mark.parametrize(
    ("action", "output"),
    [
        (["sim"], "summary.json"),
        (["sim", "compare", "--policies", "fifo", "--cache-systems", "silod"], "fifo-silod/groups.csv"),
        (["sim", "sweep", "bandwidth", "--scales", "1"], "sweep.csv"),
    ],
    ids=["sim", "compare", "sweep"],
)
def test_an_output_that_is_the_tenants_file_a_cluster_file_names_is_refused_naming_both(
    action: list[str], output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the files named on the command line were checked: the run replaced the VCs its cluster file reads.
    argv = tiny_inputs(tmp_path)
    cluster = Path(argv[3])
    cluster.write_text(cluster.read_text() + 'tenants = "vcs.toml"\n')
    tenants = tmp_path / "vcs.toml"
    tenants.write_text("[vc-a]\ncells = { node = 1 }\n")
    out = tmp_path / "out"
    (out / output).parent.mkdir(parents=True)
    (out / output).hardlink_to(tenants)
    assert main([*action, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    named = f"the run would replace {out / output}, which is the --cluster file's tenants file {tenants}"
    assert f"--out {out}: {named}" in err
    assert tenants.read_text() == "[vc-a]\ncells = { node = 1 }\n"
    assert [path.name for path in out.rglob("*") if path.is_file()] == [Path(output).name]  # nothing ran


def test_ctrl_c_while_a_runs_files_move_into_place_waits_until_all_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "decisions.jsonl.gz").write_text("an earlier run's")
    replace = os.replace

    def interrupted_midway(source: Path, target: Path) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C after the first move has begun
        replace(source, target)

    monkeypatch.setattr("silodcli.sim_outputs.os.replace", interrupted_midway)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a suite run in the background ignores it
    try:
        with pytest.raises(KeyboardInterrupt) as interrupt, staged_outputs(out, RUN_FILES) as staging:
            for name in ("jobs.csv", "summary.json", "timeline.csv"):
                (staging / name).write_text(name)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert contents(out) == {name: name.encode() for name in ("jobs.csv", "summary.json", "timeline.csv")}
    # What `silod` prints after "interrupted;": not the bare word, which left the user guessing what was written.
    assert str(interrupt.value) == f"the run was written to {out}/ whole before it stopped"


def test_only_a_command_with_run_directories_removes_earlier_ones_and_never_a_hidden_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for directory in (".silod-partial-another", "fifo-silod", "sjf-silod"):  # another command's staging, two runs
        (out / directory).mkdir()
        (out / directory / "jobs.csv").write_text("earlier")
    with staged_outputs(out, ["jobs.csv"]) as staging:  # `silod sim`: it writes no directory per run
        (staging / "jobs.csv").write_text("a run")
    assert contents(out)["sjf-silod/jobs.csv"] == b"earlier"
    with staged_outputs(out, ["fifo-silod/jobs.csv"], RUN_FILES) as staging:
        (staging / "fifo-silod").mkdir()
        (staging / "fifo-silod" / "jobs.csv").write_text("new")
    assert contents(out) == {
        "jobs.csv": b"a run",  # not in a directory: the names a command writes say which files it replaces
        ".silod-partial-another/jobs.csv": b"earlier",
        "fifo-silod/jobs.csv": b"new",
    }
