"""The PNG plots of a simulation run or comparison: JCT and slowdown CDFs, the timeline, fairness, and HiveD's
tenant plots (queueing delay by tenant against utilisation and fragmentation, sharing safety), and Harmony's
utilisation over time.

Plots are drawn on matplotlib `Figure` objects with the Agg canvas, so no display and no pyplot global state
are involved; importing this module loads matplotlib, which the numbers in `report.py` do not need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter

from datamgr.scheduler.sim.colocation_model import ColocationResult, ColocationSample
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import ClusterSpec, Sample, SimResult
from datamgr.scheduler.sim.report import slowdowns
from datamgr.scheduler.sim.tenant_report import (
    DELAY_WINDOW,
    SharingSafety,
    TenantDelay,
    delay_times,
    is_regular,
    tenant_delays,
    worst_tenant,
)

_LINE_STYLES = ("-", "--", ":", "-.")
# A policy's look: one of the four line styles, from the fifth policy on with a marker too (the next marker every
# four policies). With matplotlib's ten default colours (C0 to C9), 32 policies on ten cache systems, or 320 runs
# in a row, each look different.
_MARKERS = ("", "o", "s", "^", "D", "v", "x", "+")
_COLOURS = 10
_STYLES = len(_LINE_STYLES) * len(_MARKERS)
# A CDF line's markers sit at this fraction of the axes' diagonal apart, not on each of its thousands of steps.
_MARK_EVERY = 0.1


class _LineStyle(NamedTuple):
    """How one run's line is drawn: what tells it apart from the other runs' (`_run_styles`)."""

    color: str
    linestyle: str
    marker: str  # "": none


_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 50, not 5 x 10^1, on log axes
# Plain labels on a few minor ticks (2, 3, 5, 20, ...) where the axis spans under two decades, none beyond: every one
# of them labelled crowds into its neighbours across three decades.
_SOME_MINOR = LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5))


def plot_jct_cdf(path: Path, runs: Mapping[str, SimResult]) -> Figure:
    """The cumulative distribution of job completion times, one line per run, coloured and styled by
    `_run_styles` (log time axis: JCTs span minutes to weeks); returns the figure it saved."""
    style = _run_styles(runs.values())

    def draw(ax: Axes) -> None:
        for label, result in runs.items():
            _cdf(ax, [j.jct / 3600 for j in result.jobs], label, style(result))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.xaxis.set_minor_formatter(_PLAIN)
        ax.set_xlabel("job completion time (hours)")
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        if runs:
            ax.legend(fontsize="small")

    return _save(path, "JCT CDF", [draw])


def plot_slowdown_cdf(path: Path, runs: Mapping[str, SimResult]) -> Figure:
    """The cumulative distribution of slowdowns (FitGpp's Eq. 5), a panel per job class (FitGpp's TE and BE; the
    jobs without a class, if any, in a panel of their own) and a line per run, coloured and styled as in
    `plot_jct_cdf`: the picture of FitGpp's Figure 3. Log slowdown axis from 1: a TE job that never waited sits
    at 1, a queued one can reach hundreds. A job that never executed (infinite slowdown) counts in its class's
    total but has no point on the axis, so the line ends below 1. Returns the figure it saved."""
    classes = sorted({j.job_class for result in runs.values() for j in result.jobs}) or [""]
    style = _run_styles(runs.values())
    finite = [s for result in runs.values() for s in slowdowns(result.jobs) if math.isfinite(s)]
    right = max(10.0, 1.2 * max(finite, default=1.0))  # a decade at least, for a labelled tick past 1

    def panel(job_class: str) -> Callable[[Axes], None]:
        def draw(ax: Axes) -> None:
            for label, result in runs.items():
                _cdf(ax, slowdowns(j for j in result.jobs if j.job_class == job_class), label, style(result))
            ax.set_xscale("log")
            ax.set_xlim(1.0, right)
            ax.xaxis.set_major_formatter(_PLAIN)
            ax.xaxis.set_minor_formatter(_SOME_MINOR)
            ax.set_title(f"class {job_class}" if job_class else "no class", fontsize="medium")
            ax.set_ylabel("fraction of jobs")
            ax.set_ylim(0, 1)
            ax.grid(True, alpha=0.3)
            if runs and job_class == classes[0]:
                ax.legend(fontsize="small")
            if job_class == classes[-1]:
                ax.set_xlabel("slowdown (1 + time waiting / time executing)")

        return draw

    return _save(path, "slowdown CDF by job class", [panel(job_class) for job_class in classes])


def _run_styles(runs: Iterable[SimResult]) -> Callable[[SimResult], _LineStyle]:
    """A run's colour, line style and marker among `runs`, different for every run (every policy and cache system
    pair): a colour per cache system and a style per policy, so a policy x cache system matrix stays readable (the
    first four policies a line style each, the next four the same styles with a marker, and so on); on a single
    cache system (or on more than ten, or with more than 32 policies), the runs in order, a colour each, the style
    moving on every ten. Distinct for up to 320 runs."""
    results = list(runs)
    cache_systems = list(dict.fromkeys(r.cache_system for r in results))
    policies = list(dict.fromkeys(r.policy for r in results))
    pairs = list(dict.fromkeys((r.policy, r.cache_system) for r in results))
    by_cache_system = 1 < len(cache_systems) <= _COLOURS and len(policies) <= _STYLES

    def style(result: SimResult) -> _LineStyle:
        if by_cache_system:
            colour, kind = cache_systems.index(result.cache_system), policies.index(result.policy)
        else:
            index = pairs.index((result.policy, result.cache_system))
            colour, kind = index % _COLOURS, index // _COLOURS
        kind %= _STYLES
        marker, linestyle = divmod(kind, len(_LINE_STYLES))
        return _LineStyle(f"C{colour % _COLOURS}", _LINE_STYLES[linestyle], _MARKERS[marker])

    return style


def _cdf(ax: Axes, values: Sequence[float], label: str, style: _LineStyle) -> None:
    """The empirical CDF of `values` as a step line; values that cannot be drawn (infinite) count in the total."""
    drawn = sorted(v for v in values if math.isfinite(v))
    shares = [i / len(values) for i in range(len(drawn) + 1)] if values else []
    ax.step(
        drawn[:1] + drawn,
        shares,
        where="post",
        label=label,
        color=style.color,
        linestyle=style.linestyle,
        marker=style.marker,
        markevery=_MARK_EVERY,
        markersize=4,
    )


def plot_timeline(path: Path, result: SimResult, cluster: ClusterSpec) -> None:
    """Cluster training throughput and remote IO over time, the IO limit drawn as a line; then the GPUs busy
    and the nodes fragmented (`_gpu_panel`)."""
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
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)

    gpus = _gpu_panel(result.samples, cluster, 3600.0, "time (hours)")
    _save(path, f"{result.policy}/{result.cache_system}: throughput, remote IO and GPUs", [throughput, remote_io, gpus])


def _gpu_panel(samples: Sequence[Sample], cluster: ClusterSpec, unit: float, xlabel: str) -> Callable[[Axes], None]:
    """A panel of the share of GPUs busy (all running jobs, and regular ones only) and of the nodes a regular job
    uses any GPU of (HiveD's fragmentation level), in percent, over time in `unit` seconds."""

    def draw(ax: Axes) -> None:
        times = [s.time / unit for s in samples]
        gpus, nodes = cluster.total_gpus, cluster.nodes
        ax.plot(times, [100 * s.busy_gpus / gpus for s in samples], label="GPUs busy", alpha=0.6)
        ax.plot(times, [100 * s.regular_busy_gpus / gpus for s in samples], label="GPUs busy with regular jobs")
        ax.plot(times, [100 * s.fragmented_nodes / nodes for s in samples], label="nodes fragmented (a regular job)")
        ax.set_ylabel("%")
        ax.set_ylim(0, 105)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)

    return draw


def _time_unit(seconds: float) -> tuple[float, str]:
    """Seconds per unit and an axis label for a time axis spanning `seconds`: hours up to three days, then days
    (HiveD plots weeks of trace in days)."""
    return (86400.0, "time (days)") if seconds > 3 * 86400 else (3600.0, "time (hours)")


_MOST_TENANTS = 8  # lines of a tenant delay plot: the tenants with the most finished regular jobs


def plot_tenant_delay(path: Path, result: SimResult, cluster: ClusterSpec) -> Figure:
    """HiveD's Figure 7: each tenant's moving-average queueing delay (`tenant_report.tenant_delays`, in minutes), the
    `_MOST_TENANTS` tenants with the most finished regular jobs, over the GPUs busy and the nodes fragmented;
    returns the figure it saved."""
    counts: dict[str, int] = {}
    for job in result.jobs:
        if job.tenant and is_regular(job):
            counts[job.tenant] = counts.get(job.tenant, 0) + 1
    shown = sorted(sorted(counts, key=lambda tenant: -counts[tenant])[:_MOST_TENANTS])
    points = tenant_delays(result.jobs)
    unit, xlabel = _time_unit(max([p.time for p in points] + [s.time for s in result.samples], default=0.0))

    def delays(ax: Axes) -> None:
        for tenant in shown:
            _delay_line(ax, [p for p in points if p.tenant == tenant], unit, tenant)
        ax.set_ylabel(f"queueing delay (minutes), {DELAY_WINDOW / 3600:g}-hour mean")
        ax.grid(True, alpha=0.3)
        if shown:
            ax.legend(fontsize="small")

    title = f"{result.policy}/{result.cache_system}: queueing delay by tenant, utilisation and fragmentation"
    return _save(path, title, [delays, _gpu_panel(result.samples, cluster, unit, xlabel)])


def plot_sharing_safety(
    path: Path, pairs: Sequence[tuple[SimResult, SimResult]], rows: Sequence[SharingSafety]
) -> None:
    """HiveD's Figure 6 in spirit: for each shared run of `pairs` (shared, private), the tenant with the largest
    excess of its moving-average queueing delay over the private cluster's (`tenant_report.worst_tenant` of its `rows`),
    in a panel with that tenant's curve under every shared run on the same cache system and under private (dashed
    black). A tenant that is the worst under several runs gets one panel, naming them all."""
    panels: dict[tuple[str, str], list[str]] = {}  # (cache system, tenant) -> "policy (its excess)" it is worst under
    for shared, _ in pairs:
        own = [r for r in rows if (r.policy, r.cache_system) == (shared.policy, shared.cache_system)]
        tenant = worst_tenant(own)
        if tenant is not None:
            excess = next(r.max_excess_delay for r in own if r.tenant == tenant)
            panels.setdefault((shared.cache_system, tenant), []).append(f"{shared.policy} ({format_duration(excess)})")
    everything = [j for shared, private in pairs for j in (*shared.jobs, *private.jobs)]
    times = delay_times(everything)
    unit, xlabel = _time_unit(max(times, default=0.0))

    def panel(cache_system: str, tenant: str, worst_under: list[str]) -> Callable[[Axes], None]:
        def draw(ax: Axes) -> None:
            private = next(p for s, p in pairs if p.cache_system == cache_system)
            for index, shared in enumerate(s for s, _ in pairs if s.cache_system == cache_system):
                curve = [p for p in tenant_delays(shared.jobs, times) if p.tenant == tenant]
                _delay_line(ax, curve, unit, shared.policy, color=f"C{index % 10}")
            curve = [p for p in tenant_delays(private.jobs, times) if p.tenant == tenant]
            _delay_line(ax, curve, unit, private.policy, color="black", linestyle="--")
            ax.set_title(
                f"tenant {tenant} on {cache_system}: the largest excess under {', '.join(worst_under)}",
                fontsize="medium",
            )
            ax.set_ylabel("queueing delay (minutes)")
            ax.set_xlabel(xlabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")

        return draw

    draws = [panel(cache_system, tenant, under) for (cache_system, tenant), under in panels.items()]
    title = f"sharing safety: {DELAY_WINDOW / 3600:g}-hour moving-average queueing delay against the private cluster"
    _save(path, title, draws or [_nothing])


def _nothing(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no job has a tenant", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _delay_line(
    ax: Axes, points: Sequence[TenantDelay], unit: float, label: str, color: str | None = None, linestyle: str = "-"
) -> None:
    """A moving-average delay curve in minutes; a window without jobs (NaN) leaves a gap. A point with no
    neighbour to draw a line to (a tenant's only window, or one between two gaps) gets a marker, which a line alone
    would not show."""
    times, minutes = [p.time / unit for p in points], [p.average_delay / 60 for p in points]
    ax.plot(times, minutes, label=label, color=color, linestyle=linestyle, marker="o", markevery=_isolated(minutes))


def _isolated(values: Sequence[float]) -> list[int]:
    """The indices of the finite values whose neighbours on both sides are NaN or missing: a line joins none."""

    def finite(index: int) -> bool:
        return 0 <= index < len(values) and not math.isnan(values[index])

    return [i for i in range(len(values)) if finite(i) and not finite(i - 1) and not finite(i + 1)]


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


def _save(path: Path, title: str, panels: Sequence[Callable[[Axes], None]]) -> Figure:
    """The `panels` stacked on a shared x axis under `title`, saved as a PNG at `path`; returns the figure."""
    figure = Figure(figsize=(8, 3 + 2.5 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, draw in zip(axes, panels, strict=True):
        draw(ax)
    figure.suptitle(title)
    figure.savefig(path, format="png", dpi=100)
    return figure


def plot_utilisation(path: Path, runs: Mapping[str, ColocationResult]) -> None:
    """Harmony's Figure 11: CPU and network utilisation of the whole cluster (Eq. 4, idle machines at 0) over
    time, one line per run, and the jobs running at once (and the remote IO, where jobs read remote data); the
    samples are exact steps, drawn as such."""

    def panel(value: Callable[[ColocationSample], float], label: str, share: bool) -> Callable[[Axes], None]:
        def draw(ax: Axes) -> None:
            for index, (name, result) in enumerate(runs.items()):
                samples = result.samples
                if not samples:
                    continue
                times = [sample.time / 3600 for sample in samples]
                ax.step(times, [value(sample) for sample in samples], where="post", label=name, color=f"C{index % 10}")
            ax.set_ylabel(label)
            if share:
                ax.set_ylim(0, 1.05)
            ax.grid(True, alpha=0.3)
            if runs:
                ax.legend(fontsize="small")

        return draw

    panels = [
        panel(lambda sample: sample.cpu, "CPU utilisation", True),
        panel(lambda sample: sample.net, "network utilisation", True),
        panel(lambda sample: sample.running_jobs, "jobs running", False),
    ]
    if any(sample.remote_io_bytes_per_sec for result in runs.values() for sample in result.samples):
        panels.append(panel(lambda sample: sample.remote_io_bytes_per_sec / 1e6, "remote IO (MB/s)", False))
    _save(path, "Utilisation over time (hours)", panels)
