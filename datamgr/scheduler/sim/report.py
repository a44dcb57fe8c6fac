"""What a simulation run amounts to: summary numbers, comparison rows, CSV files and PNG plots.

Definitions (the numbers `silod sim` prints):
- average JCT: the mean over finished jobs of finish - arrival;
- makespan: the last finish - the first arrival;
- fairness: Gavel's ratio, a job's rate over its rate under an equal share of the cluster; each timeline
  sample holds the minimum over running jobs, and the summary is its mean over the samples with jobs running
  (samples are evenly spaced, so that is the time average) and its worst;
- remote IO: the mean from the first arrival to the end of the run, and the peak, against the cluster's
  limit, from the engine's ledger of every change of the cluster's remote rate;
- hit ratio: cached bytes read / bytes read, over all finished jobs;
- effective cache: the share of cached bytes that the jobs reading them can still hit this epoch (cache is
  only effective from the epoch after it is filled), weighted by cached bytes over the samples.

Plots are drawn on matplotlib `Figure` objects with the Agg canvas, so no display and no pyplot global state
are involved.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import ClusterSpec, JobOutcome, Sample, SimResult
from datamgr.units import format_rate

_LINE_STYLES = ("-", "--", ":", "-.")
_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 50, not 5 x 10^1, on log axes


@dataclass(frozen=True, slots=True)
class Summary:
    """One run in numbers; times in seconds, rates in bytes/s, NaN where nothing was there to measure."""

    label: str
    jobs: int
    finished: int
    average_jct: float
    median_jct: float
    makespan: float
    fairness_mean: float
    fairness_worst: float
    remote_io_mean: float
    remote_io_peak: float
    remote_io_limit: float
    hit_ratio: float
    effective_cache: float


def average_jct(jobs: Sequence[JobOutcome]) -> float:
    return statistics.fmean(j.jct for j in jobs) if jobs else math.nan


def makespan(jobs: Sequence[JobOutcome]) -> float:
    """From the first arrival to the last finish."""
    return max(j.finish for j in jobs) - min(j.arrival for j in jobs) if jobs else math.nan


def summarize(result: SimResult, cluster: ClusterSpec) -> Summary:
    jobs = result.jobs
    busy = [s for s in result.samples if s.running_jobs > 0]
    read = sum(j.bytes_read for j in jobs)
    cached = sum(s.cached_bytes for s in result.samples)
    return Summary(
        label=f"{result.policy}/{result.cache_system}",
        jobs=len(jobs) + len(result.unfinished),
        finished=len(jobs),
        average_jct=average_jct(jobs),
        median_jct=statistics.median(j.jct for j in jobs) if jobs else math.nan,
        makespan=makespan(jobs),
        fairness_mean=statistics.fmean(s.fairness_min for s in busy) if busy else math.nan,
        fairness_worst=min((s.fairness_min for s in busy), default=math.nan),
        remote_io_mean=mean_remote_io(result),
        remote_io_peak=result.remote_io.peak() if jobs else math.nan,
        remote_io_limit=cluster.remote_io_bytes_per_sec,
        hit_ratio=sum(j.hit_bytes for j in jobs) / read if read else math.nan,
        effective_cache=sum(s.effective_cached_bytes for s in result.samples) / cached if cached else math.nan,
    )


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
            f"  average JCT   {_time(summary.average_jct)} (median {_time(summary.median_jct)})",
            f"  makespan      {_time(summary.makespan)}",
            f"  fairness      {_ratio(summary.fairness_mean)} mean, {_ratio(summary.fairness_worst)} worst "
            "(min over running jobs of rate / equal-share rate)",
            f"  remote IO     {_rate(summary.remote_io_mean)} mean "
            f"({_share(summary.remote_io_mean, summary.remote_io_limit)}), {_rate(summary.remote_io_peak)} peak "
            f"({_share(summary.remote_io_peak, summary.remote_io_limit)}) of {_rate(summary.remote_io_limit)}",
            f"  cache         {_ratio(summary.hit_ratio)} hit ratio, "
            f"{_share(summary.effective_cache, 1.0)} of cached bytes effective",
        ]
    )


COMPARISON_HEADERS = ("POLICY", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "FAIRNESS", "REMOTE IO", "SPEEDUP")


def comparison_rows(
    runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str
) -> list[tuple[str, str, str, str, str, str, str, str]]:
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
            _ratio(summary.fairness_mean),
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
    """The comparison in plain units (seconds, bytes/s): `Summary`'s fields and the JCT speedup."""
    names = [f.name for f in fields(Summary) if f.name != "label"]
    speedups = jct_speedups(runs, baseline_cache_system)
    _write_csv(
        path,
        ("policy", "cache_system", *names, f"jct_speedup_vs_{baseline_cache_system}"),
        [
            (r.policy, r.cache_system, *(getattr(s, name) for name in names), speedup)
            for (r, s), speedup in zip(runs, speedups, strict=True)
        ],
    )


def write_jobs_csv(path: Path, result: SimResult) -> None:
    """One row per finished job: `JobOutcome`'s fields (seconds, bytes) and its JCT."""
    names = [f.name for f in fields(JobOutcome)]
    _write_csv(path, (*names, "jct"), [(*(getattr(j, name) for name in names), j.jct) for j in result.jobs])


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
