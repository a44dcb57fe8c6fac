"""What a simulation run amounts to: summary numbers, comparison rows, CSV, JSON and Markdown files, PNG plots.

Definitions (the numbers `silod sim` prints):
- average JCT: the mean over finished jobs of finish - arrival; its percentiles (`percentile`) alongside;
- queueing delay: start - arrival, `start` being the first time the job ran, over finished jobs;
- groups: the same JCT and queueing numbers over the finished jobs of each GPU count, and of each value of a
  label column (`tenant`, `class`) that any finished job has;
- makespan: the last finish - the first arrival;
- fairness: Gavel's ratio over each finished job's stay (`JobOutcome.fairness`: the bytes it read over the
  bytes an equal share of the cluster would have read from its arrival to its finish, waiting included),
  its 5th percentile over the jobs (the FAIRNESS column: the worst-off jobs, which Gavel's max-min
  objective is about) and its median. Not the minimum, one job of thousands; not the mean, which the few jobs
  that ran alone while a long queue shrank everyone's equal share dominate with ratios in the hundreds (a
  crowded cluster's equal share is small, so a job that runs at full speed there scores far above 1, while
  on an uncrowded one it scores 1 at best). The timeline plots the per-sample ratio of the running jobs;
- remote IO: the mean from the first arrival to the end of the run, and the peak, against the cluster's
  limit, from the engine's ledger of every change of the cluster's remote rate; and the share of the time
  with jobs running in which their demand with no cache (f* summed) exceeded the limit (`io_bound_share`);
- hit ratio: cached bytes read / bytes read, over all finished jobs;
- effective cache: the share of cached bytes that the jobs reading them can still hit this epoch (cache is
  only effective from the epoch after it is filled), weighted by cached bytes over the samples.

Plots are drawn on matplotlib `Figure` objects with the Agg canvas, so no display and no pyplot global state
are involved.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import TypeVar

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, Sample, SimResult
from datamgr.scheduler.sim.trace import LABELS
from silodlib.units import format_rate

_LINE_STYLES = ("-", "--", ":", "-.")
_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 50, not 5 x 10^1, on log axes
_Key = TypeVar("_Key", int, str)


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """The finished jobs of one group, as `Summary` has them for the run: the groups show whether a policy's
    average hides a class of jobs (the 8-GPU jobs, a tenant) that waits or runs much longer than the rest."""

    kind: str  # "gpus", "bin" (Tiresias's small/large x short/long), or a label column: "tenant", "class"
    value: str  # the GPU count or the label ("" for the jobs without one)
    finished: int
    average_jct: float
    p95_jct: float
    average_queueing_delay: float


@dataclass(frozen=True, slots=True)
class Summary:
    """One run in numbers; times in seconds, rates in bytes/s, NaN where nothing was there to measure."""

    label: str
    jobs: int
    finished: int
    average_jct: float
    median_jct: float
    p95_jct: float
    p99_jct: float
    average_queueing_delay: float
    median_queueing_delay: float
    p95_queueing_delay: float
    makespan: float
    fairness_median: float  # per-job fairness (`JobOutcome.fairness`) of the typical job
    fairness_p5: float  # and of the worst-off jobs, the ones Gavel's max-min objective is about
    remote_io_mean: float
    remote_io_peak: float
    remote_io_limit: float
    io_bound_share: float  # of the samples with jobs running, the share whose IO demand exceeded the limit
    hit_ratio: float
    effective_cache: float
    preemptions: int  # over the finished jobs
    preemption_overhead: float  # seconds the finished jobs spent restoring checkpoints after preemptions
    groups: tuple[GroupSummary, ...]  # by GPU count, by bin, then by each label column in use


# The single numbers of a `Summary`: the columns of compare.csv.
_SCALARS = tuple(f.name for f in fields(Summary) if f.name not in ("label", "groups"))


def percentile(values: Iterable[float], percent: float) -> float:
    """The `percent` (0 to 100) percentile of `values` by linear interpolation between closest ranks (numpy's
    default, Hyndman and Fan's definition 7): in the sorted values x[0] <= ... <= x[n-1], the value at rank
    h = (n - 1) x percent / 100, interpolated between x[floor(h)] and x[floor(h) + 1]. The 50th percentile is
    the median as `statistics.median` has it, the 0th and 100th the extremes, and unlike nearest rank a
    percentile moves smoothly as jobs are added; NaN when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * percent / 100
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (rank - below) * (ordered[above] - ordered[below])


def _mean(values: Collection[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def average_jct(jobs: Sequence[JobOutcome]) -> float:
    return _mean([j.jct for j in jobs])


def queueing_delay(job: JobOutcome) -> float:
    """How long the job waited before it first ran."""
    return job.start - job.arrival


def io_bound_share(samples: Sequence[Sample], limit: float) -> float:
    """Of the samples with jobs running, the share in which what they would read at full speed without a
    cache exceeded the remote IO limit: how much of the run sat in the regime where storage allocation
    matters (the paper's Figure 2). NaN if no job ever ran."""
    busy = [s for s in samples if s.running_jobs > 0]
    return sum(s.demand_bytes_per_sec > limit for s in busy) / len(busy) if busy else math.nan


def makespan(jobs: Sequence[JobOutcome]) -> float:
    """From the first arrival to the last finish."""
    return max(j.finish for j in jobs) - min(j.arrival for j in jobs) if jobs else math.nan


def summarize(result: SimResult, cluster: ClusterSpec) -> Summary:
    jobs = result.jobs
    read = sum(j.bytes_read for j in jobs)
    cached = sum(s.cached_bytes for s in result.samples)
    jcts = [j.jct for j in jobs]
    delays = [queueing_delay(j) for j in jobs]
    fairness = [j.fairness for j in jobs if not math.isnan(j.fairness)]
    return Summary(
        label=f"{result.policy}/{result.cache_system}",
        jobs=len(jobs) + len(result.unfinished),
        finished=len(jobs),
        average_jct=average_jct(jobs),
        median_jct=percentile(jcts, 50),
        p95_jct=percentile(jcts, 95),
        p99_jct=percentile(jcts, 99),
        average_queueing_delay=_mean(delays),
        median_queueing_delay=percentile(delays, 50),
        p95_queueing_delay=percentile(delays, 95),
        makespan=makespan(jobs),
        fairness_median=percentile(fairness, 50),
        fairness_p5=percentile(fairness, 5),
        remote_io_mean=mean_remote_io(result),
        remote_io_peak=result.remote_io.peak() if jobs else math.nan,
        remote_io_limit=cluster.remote_io_bytes_per_sec,
        io_bound_share=io_bound_share(result.samples, cluster.remote_io_bytes_per_sec),
        hit_ratio=sum(j.hit_bytes for j in jobs) / read if read else math.nan,
        effective_cache=sum(s.effective_cached_bytes for s in result.samples) / cached if cached else math.nan,
        preemptions=sum(j.preemptions for j in jobs),
        preemption_overhead=sum(j.overhead_seconds for j in jobs),
        groups=group_summaries(jobs),
    )


SMALL_GPUS = 8  # Tiresias's bins (its Table 3, for the production trace): small up to an 8-GPU machine,
SHORT_SECONDS = 4 * 3600.0  # short if it trains under 4 hours (here: its work at full speed)


def job_bin(job: JobOutcome) -> str:
    """Tiresias's bin of a job: S or L by GPUs, then S or L by training time ("SS" small and short, ...)."""
    size = "S" if job.gpus <= SMALL_GPUS else "L"
    return size + ("S" if job.ideal_seconds < SHORT_SECONDS else "L")


def group_summaries(jobs: Sequence[JobOutcome]) -> tuple[GroupSummary, ...]:
    """The jobs by GPU count (ascending), by Tiresias's bin (`job_bin`), then by each label column that some
    job has a value of (in label order, the jobs without one under "")."""
    groups = _groups("gpus", jobs, attrgetter("gpus")) + _groups("bin", jobs, job_bin)
    for column, name in LABELS.items():
        label: Callable[[JobOutcome], str] = attrgetter(name)
        if any(label(j) for j in jobs):
            groups += _groups(column, jobs, label)
    return tuple(groups)


def _groups(kind: str, jobs: Sequence[JobOutcome], key: Callable[[JobOutcome], _Key]) -> list[GroupSummary]:
    def summary(value: _Key, members: list[JobOutcome]) -> GroupSummary:
        return GroupSummary(
            kind=kind,
            value=str(value),
            finished=len(members),
            average_jct=average_jct(members),
            p95_jct=percentile((j.jct for j in members), 95),
            average_queueing_delay=_mean([queueing_delay(j) for j in members]),
        )

    return [summary(value, list(members)) for value, members in groupby(sorted(jobs, key=key), key)]


def mean_remote_io(result: SimResult) -> float:
    """Remote bytes fetched from the first arrival to the end of the run, over that time (from the engine's
    ledger of every rate change, so short bursts between samples count)."""
    arrivals = [j.arrival for j in result.jobs]
    if not arrivals:
        return math.nan
    start, end = min(arrivals), result.remote_io.end
    return result.remote_io.bytes_between(start, end) / (end - start) if end > start else 0.0


def _time(seconds: float) -> str:
    return "-" if math.isnan(seconds) else format_duration(seconds)


def _ratio(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else format_rate(value)


def _share(value: float, of: float) -> str:
    return "-" if math.isnan(value) or of <= 0 else f"{100 * value / of:.0f}%"


def summary_text(summary: Summary) -> str:
    """The lines `silod sim` prints for one run."""
    unfinished = summary.jobs - summary.finished
    return "\n".join(
        [
            f"{summary.label}: {summary.finished} of {summary.jobs} jobs finished"
            + (f" ({unfinished} still running when the run stopped)" if unfinished else ""),
            f"  average JCT   {_time(summary.average_jct)} (median {_time(summary.median_jct)}, "
            f"p95 {_time(summary.p95_jct)}, p99 {_time(summary.p99_jct)})",
            f"  queueing      {_time(summary.average_queueing_delay)} average (median "
            f"{_time(summary.median_queueing_delay)}, p95 {_time(summary.p95_queueing_delay)}) "
            "from arrival to first start",
            f"  makespan      {_time(summary.makespan)}",
            f"  fairness      {_ratio(summary.fairness_p5, 3)} p5, {_ratio(summary.fairness_median)} median "
            "over jobs (bytes read / an equal share's over the job's stay)",
            f"  remote IO     {_rate(summary.remote_io_mean)} mean "
            f"({_share(summary.remote_io_mean, summary.remote_io_limit)}), {_rate(summary.remote_io_peak)} peak "
            f"({_share(summary.remote_io_peak, summary.remote_io_limit)}) of {_rate(summary.remote_io_limit)}; "
            f"demand with no cache above it {_share(summary.io_bound_share, 1.0)} of the busy time",
            f"  cache         {_ratio(summary.hit_ratio)} hit ratio, "
            f"{_share(summary.effective_cache, 1.0)} of cached bytes effective",
            f"  preemptions   {summary.preemptions}, {_time(summary.preemption_overhead)} restoring checkpoints in all",
        ]
    )


GROUP_HEADERS = ("JOBS", "AVG JCT", "P95 JCT", "AVG QUEUEING")


def group_rows(summary: Summary, kind: str) -> list[tuple[str, ...]]:
    """The groups of one `kind` as table rows: the group's value, then the cells under `GROUP_HEADERS`."""
    return [
        (g.value, str(g.finished), _time(g.average_jct), _time(g.p95_jct), _time(g.average_queueing_delay))
        for g in summary.groups
        if g.kind == kind
    ]


COMPARISON_HEADERS = ("POLICY", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "FAIRNESS", "REMOTE IO", "SPEEDUP")
# What compare.md adds to the printed table: the distribution of JCTs and of queueing delays.
DETAIL_HEADERS = ("P50 JCT", "P95 JCT", "P99 JCT", "AVG QUEUEING", "P50 QUEUEING", "P95 QUEUEING", "PREEMPTIONS")


def speedup_note(baseline_cache_system: str) -> str:
    """What SPEEDUP means, under the table."""
    return f"SPEEDUP: average JCT of the same policy on {baseline_cache_system} / this run's"


def comparison_rows(runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str) -> list[tuple[str, ...]]:
    """One row per run for the `compare` table; SPEEDUP is the average JCT of the same policy's run on
    `baseline_cache_system` divided by this run's (above 1: faster than the baseline)."""
    speedups = jct_speedups(runs, baseline_cache_system)
    return [
        (
            result.policy,
            result.cache_system,
            f"{summary.finished}/{summary.jobs}",
            _time(summary.average_jct),
            _time(summary.makespan),
            _ratio(summary.fairness_p5, 3),
            f"{_rate(summary.remote_io_mean)} ({_share(summary.remote_io_mean, summary.remote_io_limit)})",
            "-" if math.isnan(speedup) else f"{speedup:.2f}x",
        )
        for (result, summary), speedup in zip(runs, speedups, strict=True)
    ]


def jct_speedups(runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str) -> list[float]:
    """Per run, the baseline's average JCT over its own (NaN without a baseline run for its policy)."""
    baseline = {r.policy: s.average_jct for r, s in runs if r.cache_system == baseline_cache_system}
    return [baseline.get(r.policy, math.nan) / s.average_jct for r, s in runs]


def write_comparison_csv(path: Path, runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str) -> None:
    """The comparison in plain units (seconds, bytes/s): `Summary`'s single numbers and the JCT speedup (the
    groups are in each run's groups.csv)."""
    speedups = jct_speedups(runs, baseline_cache_system)
    _write_csv(
        path,
        ("policy", "cache_system", *_SCALARS, f"jct_speedup_vs_{baseline_cache_system}"),
        [
            (r.policy, r.cache_system, *(getattr(s, name) for name in _SCALARS), speedup)
            for (r, s), speedup in zip(runs, speedups, strict=True)
        ],
    )


def write_comparison_markdown(
    path: Path, runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str
) -> None:
    """The printed comparison table as a GitHub-flavoured Markdown document, with the JCT and queueing
    percentiles it has no room for, and what SPEEDUP and the percentiles mean: a table to paste into an issue
    or keep beside the CSV."""
    rows = [
        (*row, *_detail_cells(summary))
        for row, (_, summary) in zip(comparison_rows(runs, baseline_cache_system), runs, strict=True)
    ]
    notes = [
        speedup_note(baseline_cache_system),
        "QUEUEING: time from a job's arrival to its first start. Percentiles over finished jobs, by linear "
        "interpolation between closest ranks.",
        "FAIRNESS: the 5th percentile over finished jobs of Gavel's ratio over a job's stay (bytes it read / bytes "
        "an equal share of the cluster would have read from its arrival to its finish).",
    ]
    table = markdown_table((*COMPARISON_HEADERS, *DETAIL_HEADERS), rows)
    path.write_text("\n\n".join([table, *notes]) + "\n", encoding="utf-8")


def _detail_cells(summary: Summary) -> tuple[str, ...]:
    times = (
        summary.median_jct,
        summary.p95_jct,
        summary.p99_jct,
        summary.average_queueing_delay,
        summary.median_queueing_delay,
        summary.p95_queueing_delay,
    )
    return (*(_time(seconds) for seconds in times), str(summary.preemptions))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table; a `|` inside a cell is escaped so it cannot split the cell."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(headers), line(["---"] * len(headers)), *(line(row) for row in rows)])


def write_summary_json(path: Path, summary: Summary) -> None:
    """`Summary` as a JSON object for scripts (seconds, bytes/s, ratios; `groups` a list of objects with
    `GroupSummary`'s fields). Strict JSON: a number with nothing to measure (NaN) is null."""
    path.write_text(json.dumps(_without_nan(asdict(summary)), indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _without_nan(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(item) for item in value]
    return value


def write_groups_csv(path: Path, summary: Summary) -> None:
    """One row per group of `summary.groups`: `GroupSummary`'s fields (seconds)."""
    names = [f.name for f in fields(GroupSummary)]
    _write_csv(path, names, [[getattr(group, name) for name in names] for group in summary.groups])


# jobs.csv names a label by its trace column ("class"), not by the Python field that holds it ("job_class").
_JOB_COLUMNS = {name: column for column, name in LABELS.items()}


def write_jobs_csv(path: Path, result: SimResult) -> None:
    """One row per finished job: `JobOutcome`'s fields (seconds, bytes; labels under their trace column names)
    and its JCT."""
    names = [f.name for f in fields(JobOutcome)]
    _write_csv(
        path,
        (*(_JOB_COLUMNS.get(name, name) for name in names), "jct"),
        [(*(getattr(j, name) for name in names), j.jct) for j in result.jobs],
    )


def write_timeline_csv(path: Path, result: SimResult) -> None:
    """The engine's samples, one row each: `Sample`'s fields, as the timeline plots draw them."""
    names = [f.name for f in fields(Sample)]
    _write_csv(path, names, [[getattr(sample, name) for name in names] for sample in result.samples])


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)


def plot_jct_cdf(path: Path, runs: Mapping[str, SimResult]) -> None:
    """The cumulative distribution of job completion times, one line per run: a colour per cache system and a
    line style per policy, so a policy x cache system matrix stays readable (log time axis: JCTs span minutes
    to weeks)."""
    cache_systems = list(dict.fromkeys(r.cache_system for r in runs.values()))
    policies = list(dict.fromkeys(r.policy for r in runs.values()))

    def draw(ax: Axes) -> None:
        for label, result in runs.items():
            jcts = sorted(j.jct / 3600 for j in result.jobs)
            shares = [i / len(jcts) for i in range(len(jcts) + 1)]
            ax.step(
                jcts[:1] + jcts,
                shares,
                where="post",
                label=label,
                color=f"C{cache_systems.index(result.cache_system) % 10}",
                linestyle=_LINE_STYLES[policies.index(result.policy) % len(_LINE_STYLES)],
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.xaxis.set_minor_formatter(_PLAIN)
        ax.set_xlabel("job completion time (hours)")
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        if runs:
            ax.legend(fontsize="small")

    _save(path, "JCT CDF", [draw])


def plot_timeline(path: Path, result: SimResult, cluster: ClusterSpec) -> None:
    """Cluster training throughput and remote IO over time, the IO limit drawn as a line."""
    hours = [s.time / 3600 for s in result.samples]

    def throughput(ax: Axes) -> None:
        ax.plot(hours, [s.throughput_bytes_per_sec / 1e9 for s in result.samples], label="training throughput")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)

    def remote_io(ax: Axes) -> None:
        spans = result.remote_io.spans()
        if spans:
            starts = [start / 3600 for start, _, _ in spans]
            rates = [rate / 1e9 for _, _, rate in spans]
            ax.step([*starts, spans[-1][1] / 3600], [*rates, rates[-1]], where="post", label="remote IO")
        demand = [s.demand_bytes_per_sec / 1e9 for s in result.samples]
        ax.plot(hours, demand, color="grey", alpha=0.6, label="demand with no cache (f* of the running jobs)")
        ax.axhline(cluster.remote_io_bytes_per_sec / 1e9, color="red", linestyle="--", label="remote IO limit")
        ax.set_ylabel("GB/s")
        ax.set_xlabel("time (hours)")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)

    _save(path, f"{result.policy}/{result.cache_system}: throughput and remote IO", [throughput, remote_io])


def plot_fairness(path: Path, result: SimResult) -> None:
    """Gavel's fairness ratio over time: the minimum and the mean over running jobs."""
    busy = [s for s in result.samples if s.running_jobs > 0]

    def draw(ax: Axes) -> None:
        hours = [s.time / 3600 for s in busy]
        ax.plot(hours, [s.fairness_min for s in busy], label="min over running jobs")
        ax.plot(hours, [s.fairness_mean for s in busy], label="mean over running jobs", alpha=0.7)
        ax.axhline(1.0, color="grey", linestyle=":")
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("rate / equal-share rate")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)

    _save(path, f"{result.policy}/{result.cache_system}: fairness", [draw])


def _save(path: Path, title: str, panels: Sequence[Callable[[Axes], None]]) -> None:
    figure = Figure(figsize=(8, 3 + 2.5 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, draw in zip(axes, panels, strict=True):
        draw(ax)
    figure.suptitle(title)
    figure.savefig(path, format="png", dpi=100)
