"""What a simulation run amounts to: summary numbers, comparison rows, CSV, JSON and Markdown files, PNG plots.

Definitions (the numbers `silod sim` prints). Each is over the finished jobs or over time: on a run a time limit
stopped before every job finished, the first kind covers the jobs that finished in time (its survivors), the
second the whole run to the limit, unfinished jobs included.
- average JCT: the mean over finished jobs of finish - arrival; its percentiles (`percentile`) alongside;
- queueing delay: start - arrival, `start` being the first time the job ran, over finished jobs;
- slowdown: FitGpp's slowdown rate (its Eq. 5, `JobOutcome.slowdown`): 1 + the time a job waited in all (before
  it first ran, after each preemption, its grace periods included) / the rest of its stay (training and
  restoring checkpoints), at the 50th, 95th and 99th percentiles over finished jobs;
- groups: the same JCT, queueing and slowdown numbers over the finished jobs of each GPU count, and of each value
  of a label column (`tenant`, `class`) that any finished job has: the class groups are FitGpp's Table 1;
- preemptions: their count and restore time over finished jobs; the share of finished jobs preempted at least
  once (FitGpp's Table 3) and exactly once, twice, three times or more (its Table 4); and the re-scheduling
  interval, from a preemption to the restart after it (`JobOutcome.restart_seconds`), at the 50th, 75th, 95th
  and 99th percentiles over every preemption of a finished job (its Table 2: a job never preempted adds none);
- makespan: the last finish - the first arrival; none (NaN) for a run a time limit stopped before every job
  finished, whose last finish lies beyond the limit;
- speedup (`jct_speedups`): the baseline run's average JCT over the run's; none (NaN) where a time limit left jobs of
  either unfinished, since each average is then over its own run's survivors;
- fairness: Gavel's ratio over each finished job's stay (`JobOutcome.fairness`: the bytes it read over the
  bytes an equal share of the cluster would have read from its arrival to its finish, waiting included),
  its 5th percentile over the jobs (the FAIRNESS column: the worst-off jobs, which Gavel's max-min
  objective is about) and its median. Not the minimum, one job of thousands; not the mean, which the few jobs
  that ran alone while a long queue shrank everyone's equal share dominate with ratios in the hundreds (a
  crowded cluster's equal share is small, so a job that runs at full speed there scores far above 1, while
  on an uncrowded one it scores 1 at best). The timeline plots the per-sample ratio of the running jobs;
- remote IO: the mean from the first arrival (of any job, finished or not: a time limit leaves some unfinished)
  to the end of the run, and the peak, against the cluster's limit, from the engine's ledger of every change of
  the cluster's remote rate; and the share of the time with jobs running in which their demand with no cache (f*
  summed) exceeded the limit (`io_bound_share`, from the engine's integrals, `model.Usage`);
- hit ratio: cached bytes read / bytes read, over all finished jobs;
- effective cache: the share of cached bytes that the jobs reading them can still hit this epoch (cache is
  only effective from the epoch after it is filled), weighted by cached bytes over the samples: a sample mean,
  which depends on the sample period and can be biased where the run's changes line up with the sample grid;
- GPU utilisation: the time average from the first arrival (of any job) to the end of the run of the share of the
  cluster's GPUs that running jobs hold, and that running regular jobs hold (those not marked as run preemptibly:
  HiveD's low-priority jobs are not regular); fragmentation: the time-average share of nodes on which a regular job
  uses any GPU, the nodes not available for a whole-node regular job (HiveD's fragmentation level, its Figures 7
  and 9). All exact, from the engine's integrals (`model.Usage`), not the samples' means;
- preempted GPUs: each finished job's preemptions times its GPUs, summed (HiveD's Figure 8);
- tenant queueing delay and sharing safety (HiveD's Figures 6 and 7, its section 5.2): `tenant_report.py`.

The plots are in `plots.py`.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import TypeVar

from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import (
    NOT_ARRIVED,
    RUNNING,
    WAITING,
    ClusterSpec,
    JobOutcome,
    Sample,
    SimResult,
    Usage,
)
from datamgr.scheduler.sim.trace import LABELS
from silodlib.units import format_rate

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
    median_slowdown: float
    p95_slowdown: float
    p99_slowdown: float


@dataclass(frozen=True, slots=True)
class Summary:
    """One run in numbers; times in seconds, rates in bytes/s, NaN where nothing was there to measure."""

    label: str
    jobs: int
    finished: int
    # The jobs a time limit stopped the run before they finished, by where they stood then (`model.UnfinishedJob`).
    unfinished_running: int
    unfinished_waiting: int  # arrived, not running: queued or preempted
    unfinished_not_arrived: int
    average_jct: float
    median_jct: float
    p95_jct: float
    p99_jct: float
    average_queueing_delay: float
    median_queueing_delay: float
    p95_queueing_delay: float
    median_slowdown: float  # FitGpp's slowdown rate (`JobOutcome.slowdown`): 1 + waiting / executing
    p95_slowdown: float
    p99_slowdown: float
    makespan: float
    fairness_median: float  # per-job fairness (`JobOutcome.fairness`) of the typical job
    fairness_p5: float  # and of the worst-off jobs, the ones Gavel's max-min objective is about
    remote_io_mean: float
    remote_io_peak: float
    remote_io_limit: float
    io_bound_share: float  # of the time with jobs running, the share in which their IO demand exceeded the limit
    hit_ratio: float  # over the finished jobs
    effective_cache: float  # a mean over the samples
    gpu_utilisation: float  # time-average share of the GPUs held by running jobs, from the first arrival
    regular_gpu_utilisation: float  # the same for running regular jobs (not marked as run preemptibly)
    fragmentation: float  # time-average share of the nodes on which a regular job uses any GPU (HiveD's Fig. 7, 9)
    preemptions: int  # over the finished jobs
    preempted_gpus: int  # each finished job's preemptions times its GPUs, summed (HiveD's Figure 8)
    preemption_overhead: float  # seconds the finished jobs spent restoring checkpoints after preemptions
    preempted_share: float  # of the finished jobs, the share preempted at least once (FitGpp's Table 3)
    preempted_once_share: float  # exactly once, twice, three times or more (its Table 4)
    preempted_twice_share: float
    preempted_3_plus_share: float
    # From a preemption to the restart after it, over every preemption of a finished job (FitGpp's Table 2).
    median_rescheduling_interval: float
    p75_rescheduling_interval: float
    p95_rescheduling_interval: float
    p99_rescheduling_interval: float
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
    low, high = ordered[below], ordered[min(below + 1, len(ordered) - 1)]
    # On a rank, or between equal values, the value itself: an infinite slowdown must not interpolate to NaN.
    return low if rank == below or low == high else low + (rank - below) * (high - low)


def mean_of(values: Collection[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def average_jct(jobs: Sequence[JobOutcome]) -> float:
    return mean_of([j.jct for j in jobs])


def queueing_delay(job: JobOutcome) -> float:
    """How long the job waited before it first ran."""
    return job.start - job.arrival


def slowdowns(jobs: Iterable[JobOutcome]) -> list[float]:
    """Each job's slowdown (`JobOutcome.slowdown`: 1 + time waiting / time executing)."""
    return [j.slowdown for j in jobs]


def preemption_shares(jobs: Sequence[JobOutcome]) -> tuple[float, float, float, float]:
    """Of `jobs`, the shares preempted at least once, exactly once, exactly twice and three times or more
    (NaN for no jobs)."""
    if not jobs:
        return (math.nan,) * 4
    counts = [j.preemptions for j in jobs]
    at_least_once = sum(c >= 1 for c in counts)
    once, twice = counts.count(1), counts.count(2)
    n = len(jobs)
    return at_least_once / n, once / n, twice / n, (at_least_once - once - twice) / n


def rescheduling_intervals(jobs: Iterable[JobOutcome]) -> list[float]:
    """Every re-scheduling interval of `jobs`: from each preemption to the restart after it."""
    return [seconds for j in jobs for seconds in j.restart_seconds]


def io_bound_share(usage: Usage) -> float:
    """Of the time with jobs running, the share in which what they would read at full speed without a cache
    exceeded the remote IO limit: how much of the run sat in the regime where storage allocation matters (the
    paper's Figure 2), exactly (`model.Usage`). NaN if no job ever ran."""
    return usage.io_bound_seconds / usage.running_seconds if usage.running_seconds > 0 else math.nan


def first_arrival(result: SimResult) -> float:
    """The earliest arrival of the run's jobs, finished or not: where the run's measures over time start (NaN
    for a run without jobs)."""
    arrivals = [*(j.arrival for j in result.jobs), *(j.arrival for j in result.unfinished_jobs)]
    return min(arrivals) if arrivals else math.nan


def gpu_use(result: SimResult, cluster: ClusterSpec) -> tuple[float, float, float]:
    """The time averages, from the first arrival (of any job, finished or not) to the end of the run, of the
    share of the cluster's GPUs held by running jobs, of the share held by running regular jobs, and of the share
    of nodes on which a regular job uses any GPU: exact, from the engine's integrals (`model.Usage`), unfinished
    jobs included on a run a time limit stopped. NaN for a run without jobs, or one stopped at or before the first
    arrival (no time to average over)."""
    usage = result.usage
    span = usage.end - first_arrival(result)  # nothing runs before the first arrival
    if not span > 0:  # NaN too, without jobs
        return math.nan, math.nan, math.nan
    gpu_time, node_time = cluster.total_gpus * span, cluster.nodes * span
    return (
        usage.gpu_seconds / gpu_time,
        usage.regular_gpu_seconds / gpu_time,
        usage.fragmented_node_seconds / node_time,
    )


def makespan(jobs: Sequence[JobOutcome]) -> float:
    """From the first arrival to the last finish of `jobs`, all of them finished."""
    return max(j.finish for j in jobs) - min(j.arrival for j in jobs) if jobs else math.nan


def run_makespan(result: SimResult) -> float:
    """The run's makespan; NaN when a time limit stopped it before every job finished: its last finish lies
    beyond the limit, and the finished jobs' last finish would understate it by an unknown amount."""
    return math.nan if result.unfinished_jobs else makespan(result.jobs)


def summarize(result: SimResult, cluster: ClusterSpec) -> Summary:
    jobs = result.jobs
    read = sum(j.bytes_read for j in jobs)
    cached = sum(s.cached_bytes for s in result.samples)
    jcts = [j.jct for j in jobs]
    delays = [queueing_delay(j) for j in jobs]
    slowdown = slowdowns(jobs)
    fairness = [j.fairness for j in jobs if not math.isnan(j.fairness)]
    preempted, once, twice, more = preemption_shares(jobs)
    intervals = rescheduling_intervals(jobs)
    utilisation, regular_utilisation, fragmentation = gpu_use(result, cluster)
    states = [j.state for j in result.unfinished_jobs]
    return Summary(
        label=f"{result.policy}/{result.cache_system}",
        jobs=len(jobs) + len(result.unfinished_jobs),
        finished=len(jobs),
        unfinished_running=states.count(RUNNING),
        unfinished_waiting=states.count(WAITING),
        unfinished_not_arrived=states.count(NOT_ARRIVED),
        average_jct=average_jct(jobs),
        median_jct=percentile(jcts, 50),
        p95_jct=percentile(jcts, 95),
        p99_jct=percentile(jcts, 99),
        average_queueing_delay=mean_of(delays),
        median_queueing_delay=percentile(delays, 50),
        p95_queueing_delay=percentile(delays, 95),
        median_slowdown=percentile(slowdown, 50),
        p95_slowdown=percentile(slowdown, 95),
        p99_slowdown=percentile(slowdown, 99),
        makespan=run_makespan(result),
        fairness_median=percentile(fairness, 50),
        fairness_p5=percentile(fairness, 5),
        remote_io_mean=mean_remote_io(result),
        remote_io_peak=remote_io_peak(result),
        remote_io_limit=cluster.remote_io_bytes_per_sec,
        io_bound_share=io_bound_share(result.usage),
        hit_ratio=sum(j.hit_bytes for j in jobs) / read if read else math.nan,
        effective_cache=sum(s.effective_cached_bytes for s in result.samples) / cached if cached else math.nan,
        gpu_utilisation=utilisation,
        regular_gpu_utilisation=regular_utilisation,
        fragmentation=fragmentation,
        preemptions=sum(j.preemptions for j in jobs),
        preempted_gpus=sum(j.preemptions * j.gpus for j in jobs),
        preemption_overhead=sum(j.overhead_seconds for j in jobs),
        preempted_share=preempted,
        preempted_once_share=once,
        preempted_twice_share=twice,
        preempted_3_plus_share=more,
        median_rescheduling_interval=percentile(intervals, 50),
        p75_rescheduling_interval=percentile(intervals, 75),
        p95_rescheduling_interval=percentile(intervals, 95),
        p99_rescheduling_interval=percentile(intervals, 99),
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
        slowdown = slowdowns(members)
        return GroupSummary(
            kind=kind,
            value=str(value),
            finished=len(members),
            average_jct=average_jct(members),
            p95_jct=percentile((j.jct for j in members), 95),
            average_queueing_delay=mean_of([queueing_delay(j) for j in members]),
            median_slowdown=percentile(slowdown, 50),
            p95_slowdown=percentile(slowdown, 95),
            p99_slowdown=percentile(slowdown, 99),
        )

    return [summary(value, list(members)) for value, members in groupby(sorted(jobs, key=key), key)]


def mean_remote_io(result: SimResult) -> float:
    """Remote bytes fetched from the first arrival to the end of the run, over that time (from the engine's
    ledger of every rate change, so short bursts between samples count); NaN when no time passed in between (no
    job, or a time limit before the first arrival)."""
    start, end = first_arrival(result), result.remote_io.end
    return result.remote_io.bytes_between(start, end) / (end - start) if end > start else math.nan


def remote_io_peak(result: SimResult) -> float:
    """The highest total remote rate of the run (NaN when it ended before any job arrived: nothing to measure)."""
    return result.remote_io.peak() if result.remote_io.end >= first_arrival(result) else math.nan


def format_time(seconds: float) -> str:
    return "-" if math.isnan(seconds) else format_duration(seconds)


def _ratio(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else format_rate(value)


def format_share(value: float, of: float) -> str:
    return "-" if math.isnan(value) or of <= 0 else f"{100 * value / of:.0f}%"


def format_percent(share: float) -> str:
    """A share as a percentage to three significant digits: FitGpp's Tables 3 and 4 go down to 0.0098 %."""
    return "-" if math.isnan(share) else f"{100 * share:.3g}%"


def _slowdown(value: float) -> str:
    """Three significant digits as FitGpp's Table 1 has them (1.00, 9.38, 33.4), whole numbers from 100."""
    if math.isnan(value):
        return "-"
    return f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f}"


def summary_text(summary: Summary) -> str:
    """The lines `silod sim` prints for one run."""
    return "\n".join(
        [
            f"{summary.label}: {summary.finished} of {summary.jobs} jobs finished" + _unfinished(summary),
            f"  average JCT   {format_time(summary.average_jct)} (median {format_time(summary.median_jct)}, "
            f"p95 {format_time(summary.p95_jct)}, p99 {format_time(summary.p99_jct)})",
            f"  queueing      {format_time(summary.average_queueing_delay)} average (median "
            f"{format_time(summary.median_queueing_delay)}, p95 {format_time(summary.p95_queueing_delay)}) "
            "from arrival to first start",
            f"  slowdown      {_slowdown(summary.median_slowdown)} median (p95 {_slowdown(summary.p95_slowdown)}, "
            f"p99 {_slowdown(summary.p99_slowdown)}): 1 + time waiting / time executing",
            f"  makespan      {format_time(summary.makespan)}",
            f"  fairness      {_ratio(summary.fairness_p5, 3)} p5, {_ratio(summary.fairness_median)} median "
            "over jobs (bytes read / an equal share's over the job's stay)",
            f"  remote IO     {_rate(summary.remote_io_mean)} mean "
            f"({format_share(summary.remote_io_mean, summary.remote_io_limit)}), {_rate(summary.remote_io_peak)} peak "
            f"({format_share(summary.remote_io_peak, summary.remote_io_limit)}) of {_rate(summary.remote_io_limit)}; "
            f"demand with no cache above it {format_share(summary.io_bound_share, 1.0)} of the busy time",
            f"  cache         {_ratio(summary.hit_ratio)} hit ratio, "
            f"{format_share(summary.effective_cache, 1.0)} of cached bytes effective",
            f"  GPUs          {format_share(summary.gpu_utilisation, 1.0)} busy on average, "
            f"{format_share(summary.regular_gpu_utilisation, 1.0)} by regular jobs; "
            f"{format_share(summary.fragmentation, 1.0)} of nodes fragmented (a regular job on them)",
            f"  preemptions   {summary.preemptions}"
            + (f" ({summary.preempted_gpus} GPUs)" if summary.preemptions else "")
            + f", {format_time(summary.preemption_overhead)} restoring checkpoints in all"
            + (_preempted_jobs(summary) if summary.preemptions else ""),
            *([_rescheduling(summary)] if summary.preemptions else []),
        ]
    )


def _unfinished(summary: Summary) -> str:
    """Where the jobs a time limit left unfinished stood when it stopped the run (nothing when none was left)."""
    counts = (
        (summary.unfinished_running, "running"),
        (summary.unfinished_waiting, "waiting (queued or preempted)"),
        (summary.unfinished_not_arrived, "not yet arrived"),
    )
    parts = [f"{count} {state}" for count, state in counts if count]
    return f" ({summary.jobs - summary.finished} unfinished when the run stopped: {', '.join(parts)})" if parts else ""


def _preempted_jobs(summary: Summary) -> str:
    return (
        f"; {format_percent(summary.preempted_share)} of jobs preempted "
        f"({format_percent(summary.preempted_once_share)} once, {format_percent(summary.preempted_twice_share)} twice, "
        f"{format_percent(summary.preempted_3_plus_share)} 3+ times)"
    )


def _rescheduling(summary: Summary) -> str:
    return (
        f"  rescheduling  {format_time(summary.median_rescheduling_interval)} median "
        f"(p75 {format_time(summary.p75_rescheduling_interval)}, p95 {format_time(summary.p95_rescheduling_interval)}, "
        f"p99 {format_time(summary.p99_rescheduling_interval)}) from a preemption to the restart after it"
    )


SLOWDOWN_HEADERS = ("P50 SLOWDOWN", "P95 SLOWDOWN", "P99 SLOWDOWN")
GROUP_HEADERS = ("JOBS", "AVG JCT", "P95 JCT", "AVG QUEUEING", *SLOWDOWN_HEADERS)


def group_rows(summary: Summary, kind: str) -> list[tuple[str, ...]]:
    """The groups of one `kind` as table rows: the group's value, then the cells under `GROUP_HEADERS`."""
    return [
        (
            g.value,
            str(g.finished),
            format_time(g.average_jct),
            format_time(g.p95_jct),
            format_time(g.average_queueing_delay),
            *_slowdown_cells(g),
        )
        for g in summary.groups
        if g.kind == kind
    ]


def _slowdown_cells(numbers: Summary | GroupSummary) -> tuple[str, str, str]:
    return _slowdown(numbers.median_slowdown), _slowdown(numbers.p95_slowdown), _slowdown(numbers.p99_slowdown)


def has_classes(jobs: Iterable[JobOutcome]) -> bool:
    """Whether some job has a class label: the report then breaks slowdown down by class (FitGpp's TE and BE)."""
    return any(j.job_class for j in jobs)


COMPARISON_HEADERS = ("POLICY", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "FAIRNESS", "REMOTE IO", "SPEEDUP")
# What compare.md adds to the printed table: the distributions of JCTs, queueing delays and slowdowns.
DETAIL_HEADERS = (
    "P50 JCT",
    "P95 JCT",
    "P99 JCT",
    "AVG QUEUEING",
    "P50 QUEUEING",
    "P95 QUEUEING",
    *SLOWDOWN_HEADERS,
    "PREEMPTIONS",
)
# compare.md's sections for FitGpp's tables: slowdown by class (Table 1), preemptions (Tables 2 to 4).
CLASS_HEADERS = ("POLICY", "CACHE", "CLASS", "JOBS", *SLOWDOWN_HEADERS)
PREEMPTION_HEADERS = (
    "POLICY",
    "CACHE",
    "PREEMPTIONS",
    "PREEMPTED GPUS",
    "PREEMPTED",
    "ONCE",
    "TWICE",
    "3+ TIMES",
    "P50 INTERVAL",
    "P75 INTERVAL",
    "P95 INTERVAL",
    "P99 INTERVAL",
)


def speedup_note(baseline_cache_system: str, runs: Sequence[tuple[SimResult, Summary]]) -> str:
    """What SPEEDUP means, under the table, and why it is `-` where a time limit cut a run or its baseline."""
    note = f"SPEEDUP: average JCT of the same policy on {baseline_cache_system} / this run's"
    if any(is_cut(summary) for _, summary in runs):
        note += (
            f"; - where this run or its {baseline_cache_system} run left jobs unfinished (a time limit): each average "
            "is over the jobs that run finished, not the same jobs"
        )
    return note


def is_cut(summary: Summary) -> bool:
    """Whether a time limit stopped the run before every job finished: its averages over finished jobs cover the
    jobs that finished in time, which another run's need not (a run that finished fewer lost its slowest)."""
    return summary.finished < summary.jobs


def comparison_rows(runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str) -> list[tuple[str, ...]]:
    """One row per run for the `compare` table; SPEEDUP is the average JCT of the same policy's run on
    `baseline_cache_system` divided by this run's (above 1: faster than the baseline), `-` where either run was
    cut short (`jct_speedups`)."""
    speedups = jct_speedups(runs, baseline_cache_system)
    return [
        (
            result.policy,
            result.cache_system,
            f"{summary.finished}/{summary.jobs}",
            format_time(summary.average_jct),
            format_time(summary.makespan),
            _ratio(summary.fairness_p5, 3),
            f"{_rate(summary.remote_io_mean)} ({format_share(summary.remote_io_mean, summary.remote_io_limit)})",
            "-" if math.isnan(speedup) else f"{speedup:.2f}x",
        )
        for (result, summary), speedup in zip(runs, speedups, strict=True)
    ]


def jct_speedups(runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str) -> list[float]:
    """Per run, the baseline's average JCT over its own. NaN without a baseline run for its policy, and where a
    time limit left jobs of the run or of its baseline unfinished (`is_cut`): the two averages are then over
    different jobs, each run's survivors, so their ratio can favour the run that finished fewer (it dropped its
    slowest jobs), as the makespan of such a run is none for the same reason."""
    baseline = {r.policy: s for r, s in runs if r.cache_system == baseline_cache_system}

    def speedup(result: SimResult, summary: Summary) -> float:
        base = baseline.get(result.policy)
        if base is None or is_cut(base) or is_cut(summary):
            return math.nan
        return base.average_jct / summary.average_jct

    return [speedup(r, s) for r, s in runs]


def write_comparison_csv(path: Path, runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str) -> None:
    """The comparison in plain units (seconds, bytes/s): `Summary`'s single numbers and the JCT speedup (the
    groups are in each run's groups.csv)."""
    speedups = jct_speedups(runs, baseline_cache_system)
    write_csv(
        path,
        ("policy", "cache_system", *_SCALARS, f"jct_speedup_vs_{baseline_cache_system}"),
        [
            (r.policy, r.cache_system, *(getattr(s, name) for name in _SCALARS), speedup)
            for (r, s), speedup in zip(runs, speedups, strict=True)
        ],
    )


def write_comparison_markdown(
    path: Path, runs: Sequence[tuple[SimResult, Summary]], baseline_cache_system: str, extra: Sequence[str] = ()
) -> None:
    """The printed comparison table as a GitHub-flavoured Markdown document, with the JCT, queueing and slowdown
    percentiles it has no room for, and what SPEEDUP and the percentiles mean: a table to paste into an issue
    or keep beside the CSV. When some job has a class, a section of slowdowns by class (FitGpp's Table 1), and
    when some run preempted, one of preemptions (its Tables 2 to 4). `extra` sections go last (the sharing
    safety of `tenant_report.sharing_safety_section`)."""
    rows = [
        (*row, *_detail_cells(summary))
        for row, (_, summary) in zip(comparison_rows(runs, baseline_cache_system), runs, strict=True)
    ]
    notes = [
        speedup_note(baseline_cache_system, runs),
        "QUEUEING: time from a job's arrival to its first start. Percentiles over finished jobs, by linear "
        "interpolation between closest ranks.",
        "FAIRNESS: the 5th percentile over finished jobs of Gavel's ratio over a job's stay (bytes it read / bytes "
        "an equal share of the cluster would have read from its arrival to its finish).",
        _SLOWDOWN_NOTE,
    ]
    sections = [markdown_table((*COMPARISON_HEADERS, *DETAIL_HEADERS), rows), *notes]
    if any(has_classes(result.jobs) for result, _ in runs):
        sections += ["## Slowdown by class", markdown_table(CLASS_HEADERS, class_rows(runs)), _CLASS_NOTE]
    if any(summary.preemptions for _, summary in runs):
        sections += ["## Preemptions", markdown_table(PREEMPTION_HEADERS, preemption_rows(runs)), _PREEMPTION_NOTE]
    sections += extra
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")


_SLOWDOWN_NOTE = (
    "SLOWDOWN: 1 + time waiting / time executing (FitGpp's Eq. 5), waiting being all the time a job was not "
    "running, before it first ran and after preemptions (grace periods included). Percentiles over finished jobs."
)
_CLASS_NOTE = (
    "SLOWDOWN as above, over the finished jobs of each class (FitGpp's Table 1 for TE and BE); a class left empty "
    "holds the jobs without one."
)
_PREEMPTION_NOTE = (
    "PREEMPTED GPUS: each finished job's preemptions times its GPUs, summed. PREEMPTED: the share of finished "
    "jobs preempted at least once; ONCE, TWICE, 3+ TIMES: the shares preempted "
    "that many times. INTERVAL: from a preemption to the restart after it (FitGpp's re-scheduling interval), "
    "percentiles over every preemption of a finished job; - where there was none."
)


def class_rows(runs: Sequence[tuple[SimResult, Summary]]) -> list[tuple[str, ...]]:
    """Per run, a row for each class of its jobs (the jobs without one under ""): slowdown percentiles, as
    FitGpp's Table 1 has them for TE and BE."""
    return [
        (result.policy, result.cache_system, group.value, str(group.finished), *_slowdown_cells(group))
        for result, summary in runs
        for group in summary.groups
        if group.kind == "class"
    ]


def preemption_rows(runs: Sequence[tuple[SimResult, Summary]]) -> list[tuple[str, ...]]:
    """Per run, its preemptions: the count, the shares of jobs preempted (FitGpp's Tables 3 and 4) and the
    re-scheduling interval's percentiles (its Table 2)."""

    def row(result: SimResult, s: Summary) -> tuple[str, ...]:
        shares = (s.preempted_share, s.preempted_once_share, s.preempted_twice_share, s.preempted_3_plus_share)
        intervals = (
            s.median_rescheduling_interval,
            s.p75_rescheduling_interval,
            s.p95_rescheduling_interval,
            s.p99_rescheduling_interval,
        )
        cells = (*(format_percent(share) for share in shares), *(format_time(seconds) for seconds in intervals))
        return (result.policy, result.cache_system, str(s.preemptions), str(s.preempted_gpus), *cells)

    return [row(result, summary) for result, summary in runs]


def _detail_cells(summary: Summary) -> tuple[str, ...]:
    times = (
        summary.median_jct,
        summary.p95_jct,
        summary.p99_jct,
        summary.average_queueing_delay,
        summary.median_queueing_delay,
        summary.p95_queueing_delay,
    )
    return (*(format_time(seconds) for seconds in times), *_slowdown_cells(summary), str(summary.preemptions))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table of one line per row, whatever the cells hold (a label is free text): a
    `|` inside a cell is escaped so it cannot split the cell, and a line break becomes `<br>`, which GitHub shows as
    a line break inside the cell, so it cannot split the row."""
    return "\n".join([_markdown_row(headers), _markdown_row(["---"] * len(headers)), *map(_markdown_row, rows)])


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(_LINE_BREAK.sub("<br>", cell.replace("|", "\\|")) for cell in cells) + " |"


_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what ends a line of Markdown (CommonMark's line endings)


def write_summary_json(path: Path, summary: Summary) -> None:
    """`Summary` as a JSON object for scripts (seconds, bytes/s, ratios; `groups` a list of objects with
    `GroupSummary`'s fields). Strict JSON: a number with nothing to measure (NaN) is null, and so is an infinite
    one (the slowdown of a job that never executed), which JSON cannot write."""
    path.write_text(json.dumps(_finite_or_null(asdict(summary)), indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _finite_or_null(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value


def write_groups_csv(path: Path, summary: Summary) -> None:
    """One row per group of `summary.groups`: `GroupSummary`'s fields (seconds)."""
    names = [f.name for f in fields(GroupSummary)]
    write_csv(path, names, [[getattr(group, name) for name in names] for group in summary.groups])


# jobs.csv names a label by its trace column ("class"), not by the Python field that holds it ("job_class").
_JOB_COLUMNS = {name: column for column, name in LABELS.items()}


def write_jobs_csv(path: Path, result: SimResult) -> None:
    """One row per finished job: `JobOutcome`'s fields (seconds, bytes; labels under their trace column names;
    a tuple such as `restart_seconds` as its numbers joined by ";", empty when it has none) and its JCT."""
    names = [f.name for f in fields(JobOutcome)]
    write_csv(
        path,
        (*(_JOB_COLUMNS.get(name, name) for name in names), "jct"),
        [(*(_cell(getattr(j, name)) for name in names), j.jct) for j in result.jobs],
    )


def _cell(value: object) -> object:
    """A CSV cell: a tuple as its items joined by ";" (one cell, whatever the count), anything else as is."""
    return ";".join(str(item) for item in value) if isinstance(value, tuple) else value


def write_timeline_csv(path: Path, result: SimResult) -> None:
    """The engine's samples, one row each: `Sample`'s fields, as the timeline plots draw them."""
    names = [f.name for f in fields(Sample)]
    write_csv(path, names, [[getattr(sample, name) for name in names] for sample in result.samples])


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
