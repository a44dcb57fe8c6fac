"""Sweeps: one policy on several cache systems at each value of one knob, as the SiloD paper's evaluation
varies egress bandwidth (its Figure 14a) and dataset sharing (its Figure 15).

- A **bandwidth** sweep runs the same trace on the cluster with its remote IO limit multiplied by each scale
  (`cluster.with_remote_io_scale`).
- A **sharing** sweep regenerates a generated scenario's trace with its recipe's `sharing` set to each fraction
  and nothing else changed: the generator draws the same jobs at every fraction and only moves some onto
  shared datasets, so the runs differ in sharing alone.

This module is the pure part: which runs a sweep consists of, what each runs on, and how their summaries
become rows (with SiloD's speedup over each baseline at the same value), CSV and Markdown text and a plot.
Running them is the command's business (`silodcli/sim_sweep.py`). Nothing here imports matplotlib until a
plot is drawn, since `silod` loads this module for its command line.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from datamgr.scheduler.sim.cluster import with_remote_io_scale
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.generator import GeneratorConfig, generate
from datamgr.scheduler.sim.model import ClusterSpec, TraceJob
from datamgr.scheduler.sim.report import markdown_table
from silodlib.units import format_rate

Kind = Literal["bandwidth", "sharing"]
KINDS: tuple[Kind, ...] = ("bandwidth", "sharing")
SILOD = "silod"  # the cache system whose speedup over the others a sweep reports


@dataclass(frozen=True, slots=True)
class Point:
    """One value of the swept knob and the inputs a run at it gets."""

    value: float  # the remote IO scale, or the sharing fraction
    trace: list[TraceJob]
    cluster: ClusterSpec


@dataclass(frozen=True, slots=True)
class SweepRun:
    """One simulation of a sweep: the policy on one cache system at one value of the knob."""

    kind: Kind
    value: float
    policy: str
    cache_system: str

    @property
    def label(self) -> str:
        """`fifo/alluxio at 2x`, `fifo/alluxio at sharing 0.5`: how progress lines name the run."""
        return f"{self.policy}/{self.cache_system} at {value_text(self.kind, self.value)}"


def value_text(kind: Kind, value: float) -> str:
    """The knob's value as the table shows it: a scale `2x`, a fraction `sharing 0.5`."""
    return f"{value:g}x" if kind == "bandwidth" else f"sharing {value:g}"


def bandwidth_points(trace: list[TraceJob], cluster: ClusterSpec, scales: Sequence[float]) -> list[Point]:
    """The trace on the cluster with its remote IO limit multiplied by each scale (each > 0)."""
    return [Point(scale, trace, with_remote_io_scale(cluster, scale)) for scale in scales]


def sharing_points(recipe: GeneratorConfig, cluster: ClusterSpec, fractions: Sequence[float]) -> list[Point]:
    """The recipe's trace regenerated with `sharing` at each fraction (each in [0, 1]), on the same cluster."""
    return [Point(fraction, generate(replace(recipe, sharing=fraction)), cluster) for fraction in fractions]


def sweep_runs(kind: Kind, points: Sequence[Point], policy: str, cache_systems: Sequence[str]) -> list[SweepRun]:
    """Every cache system at every point, point by point, in the order given."""
    return [SweepRun(kind, point.value, policy, cache_system) for point in points for cache_system in cache_systems]


class RunNumbers(Protocol):
    """What a row takes from a run's summary; `report.Summary` has these (seconds, bytes/s, NaN if unmeasured)."""

    @property
    def jobs(self) -> int: ...
    @property
    def finished(self) -> int: ...
    @property
    def average_jct(self) -> float: ...
    @property
    def makespan(self) -> float: ...
    @property
    def remote_io_limit(self) -> float: ...


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One run of a sweep in numbers: times in seconds, rates in bytes/s, NaN where nothing was measured."""

    value: float
    remote_io_limit: float
    policy: str
    cache_system: str
    jobs: int
    finished: int
    average_jct: float
    makespan: float
    silod_speedup: float  # this run's average JCT / silod's at the same value: silod's speedup over it

    @property
    def cut(self) -> bool:
        """Whether a time limit stopped the run before every job finished (its averages cover the survivors)."""
        return self.finished < self.jobs


def sweep_rows(runs: Sequence[SweepRun], summaries: Sequence[RunNumbers]) -> list[SweepRow]:
    """A row per run, in the runs' order. `silod_speedup` is the run's average JCT over the average JCT of the
    silod run at the same value (and with the same policy), so a baseline's row says how many times faster
    SiloD finishes jobs than it does; NaN where there is no silod run or no finished job to average, and where a
    time limit left jobs of the run or of the silod run unfinished: the two averages are then over different jobs,
    each run's survivors (`report.jct_speedups` has the same rule)."""
    silod = {
        (run.value, run.policy): summary
        for run, summary in zip(runs, summaries, strict=True)
        if run.cache_system == SILOD
    }

    def speedup(run: SweepRun, summary: RunNumbers) -> float:
        base = silod.get((run.value, run.policy))
        if base is None or base.finished < base.jobs or summary.finished < summary.jobs:
            return math.nan
        return summary.average_jct / base.average_jct

    return [
        SweepRow(
            value=run.value,
            remote_io_limit=summary.remote_io_limit,
            policy=run.policy,
            cache_system=run.cache_system,
            jobs=summary.jobs,
            finished=summary.finished,
            average_jct=summary.average_jct,
            makespan=summary.makespan,
            silod_speedup=speedup(run, summary),
        )
        for run, summary in zip(runs, summaries, strict=True)
    ]


def table_headers(kind: Kind) -> tuple[str, ...]:
    """The printed table's columns; a sharing sweep's remote IO limit is the same on every row, so it is left out."""
    if kind == "bandwidth":
        return ("SCALE", "REMOTE IO", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "SILOD SPEEDUP")
    return ("SHARING", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "SILOD SPEEDUP")


def table_rows(kind: Kind, rows: Sequence[SweepRow]) -> list[tuple[str, ...]]:
    """The rows in human units, under `table_headers(kind)`."""

    def time(seconds: float) -> str:
        return "-" if math.isnan(seconds) else format_duration(seconds)

    def cells(row: SweepRow) -> tuple[str, ...]:
        value = (f"{row.value:g}x", format_rate(row.remote_io_limit)) if kind == "bandwidth" else (f"{row.value:g}",)
        speedup = "-" if math.isnan(row.silod_speedup) else f"{row.silod_speedup:.2f}x"
        return (
            *value,
            row.cache_system,
            f"{row.finished}/{row.jobs}",
            time(row.average_jct),
            time(row.makespan),
            speedup,
        )

    return [cells(row) for row in rows]


def speedup_note(kind: Kind, rows: Sequence[SweepRow]) -> str:
    """What the SILOD SPEEDUP column means, printed under the table, and why it is `-` on a cut run."""
    at = "scale" if kind == "bandwidth" else "sharing fraction"
    note = f"SILOD SPEEDUP: average JCT of the cache system / silod's at the same {at} (above 1: silod is faster)"
    if any(row.cut for row in rows):
        note += (
            "; - where this run or silod's left jobs unfinished (a time limit): each average is over the jobs that "
            "run finished, not the same jobs"
        )
    return note


def csv_text(kind: Kind, rows: Sequence[SweepRow]) -> str:
    """The rows in plain units (seconds, bytes/s): the knob's value under its own name (`scale`, `sharing`)."""
    header = (
        "scale" if kind == "bandwidth" else "sharing",
        "remote_io_bytes_per_sec",
        "policy",
        "cache_system",
        "jobs",
        "finished",
        "average_jct",
        "makespan",
        "silod_jct_speedup",
    )
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(
        (
            r.value,
            r.remote_io_limit,
            r.policy,
            r.cache_system,
            r.jobs,
            r.finished,
            r.average_jct,
            r.makespan,
            r.silod_speedup,
        )
        for r in rows
    )
    return buffer.getvalue()


def markdown_text(title: str, kind: Kind, rows: Sequence[SweepRow]) -> str:
    """The printed table as a Markdown document: a heading, the table (as `compare.md` has its), and what the
    speedup means."""
    table = markdown_table(table_headers(kind), table_rows(kind, rows))
    return "\n".join([f"# {title}", "", table, "", speedup_note(kind, rows), ""])


def plot_sweep(path: Path, title: str, kind: Kind, rows: Sequence[SweepRow]) -> None:
    """Two panels over the swept knob: average JCT per cache system (left), and silod's JCT speedup over each
    baseline with a line at 1 (right). A bandwidth sweep's x axis is the remote IO limit in GB/s, on a log scale
    (the scales are factors); a sharing sweep's is the fraction. A colour per cache system in both panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    def x(row: SweepRow) -> float:
        return row.remote_io_limit / 1e9 if kind == "bandwidth" else row.value

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    jct_ax, speedup_ax = figure.subplots(1, 2, sharex=True)
    for index, cache_system in enumerate(dict.fromkeys(row.cache_system for row in rows)):
        points = sorted((row for row in rows if row.cache_system == cache_system), key=x)
        style = {"color": f"C{index % 10}", "marker": "o", "label": cache_system}
        jct_ax.plot([x(r) for r in points], [r.average_jct / 3600 for r in points], **style)
        if cache_system != SILOD:
            speedup_ax.plot([x(r) for r in points], [r.silod_speedup for r in points], **style)
    speedup_ax.axhline(1.0, color="grey", linestyle=":")
    jct_ax.set_ylabel("average JCT (hours)")
    jct_ax.set_ylim(bottom=0)
    speedup_ax.set_ylabel("silod's JCT speedup over the baseline")
    values = sorted({x(row) for row in rows})
    for ax in (jct_ax, speedup_ax):
        if kind == "bandwidth":
            ax.set_xscale("log")
            ax.set_xlabel("remote IO limit (GB/s)")
        else:
            ax.set_xlabel("share of jobs on shared datasets")
        ax.set_xticks(values, labels=[f"{value:g}" for value in values])  # the swept values, not 10^k
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    figure.suptitle(title)
    figure.savefig(path, format="png", dpi=100)
