"""What a co-location run measured (Harmony's section V metrics), as numbers, text, CSV and JSON.

Average JCT (submission to finish), makespan ("the time to complete all jobs from the start of the first job"),
the CPU and network utilisation of Eq. 4 over all machines (idle ones count 0) averaged over the makespan, the
jobs and groups running at once, and what regrouping cost: migrations, pauses and the share of job time spent
starting, resuming and migrating (the paper: "the regrouping overhead is below 2 % of the overall makespan").
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from datamgr.scheduler.sim.colocation_model import ColocationResult, ColocationSample
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.report import markdown_table, write_csv
from silodlib.units import format_rate


@dataclass(frozen=True, slots=True)
class ColocationSummary:
    policy: str
    jobs: int
    average_jct: float
    makespan: float
    cpu_utilisation: float
    net_utilisation: float
    running_jobs: float
    groups: float
    migrations: int
    pauses: int
    overhead_share: float  # of all jobs' time in the system
    rounds: int
    remote_io_bytes_per_sec: float = 0.0  # read from remote storage, averaged over the makespan


def time_averages(samples: Sequence[ColocationSample], start: float, end: float) -> list[float]:
    """CPU, network, running jobs, groups and remote IO, each averaged over [start, end] of the piecewise-constant
    samples."""
    totals = [0.0] * 5
    if end <= start:
        return totals
    for sample, following in zip(samples, [*samples[1:], None], strict=True):
        lo = max(start, sample.time)
        hi = min(end, following.time if following is not None else end)
        if hi > lo:
            values = (sample.cpu, sample.net, sample.running_jobs, sample.groups, sample.remote_io_bytes_per_sec)
            for index, value in enumerate(values):
                totals[index] += value * (hi - lo)
    return [total / (end - start) for total in totals]


def summarize_colocation(result: ColocationResult) -> ColocationSummary:
    """The summary of a finished run (every job of its trace finished)."""
    jobs = result.jobs
    if not jobs:
        raise ValueError("a run with no finished job has nothing to summarise")
    start = min(job.arrival for job in jobs)
    end = max(job.finish for job in jobs)
    cpu, net, running, groups, remote = time_averages(result.samples, start, end)
    in_system = sum(job.jct for job in jobs)
    return ColocationSummary(
        policy=result.policy,
        jobs=len(jobs),
        average_jct=statistics.fmean(job.jct for job in jobs),
        makespan=end - start,
        cpu_utilisation=cpu,
        net_utilisation=net,
        running_jobs=running,
        groups=groups,
        migrations=sum(job.migrations for job in jobs),
        pauses=sum(job.pauses for job in jobs),
        overhead_share=sum(job.overhead_seconds for job in jobs) / in_system if in_system > 0 else 0.0,
        rounds=result.rounds,
        remote_io_bytes_per_sec=remote,
    )


def summary_text(summary: ColocationSummary) -> str:
    return (
        f"{summary.policy}: {summary.jobs} jobs, average JCT {format_duration(summary.average_jct)}, "
        f"makespan {format_duration(summary.makespan)}\n"
        f"  utilisation (Eq. 4, over the makespan): CPU {summary.cpu_utilisation:.1%}, "
        f"network {summary.net_utilisation:.1%}\n"
        f"  at once: {summary.running_jobs:.1f} jobs in {summary.groups:.1f} groups; "
        f"{summary.migrations} migrations, {summary.pauses} pauses, "
        f"{summary.overhead_share:.1%} of job time starting, resuming or migrating; {summary.rounds} rounds"
        + _remote_io_line(summary)
    )


def _remote_io_line(summary: ColocationSummary) -> str:
    """A line for runs whose jobs read remote data (the SiloD variant's scenarios); nothing for Harmony's own."""
    if not summary.remote_io_bytes_per_sec:
        return ""
    return f"\n  remote IO: {format_rate(summary.remote_io_bytes_per_sec)} on average over the makespan"


COMPARISON_HEADERS = (
    "POLICY", "AVG JCT", "MAKESPAN", "JCT SPEEDUP", "MAKESPAN SPEEDUP", "CPU", "NET", "REMOTE IO", "JOBS AT ONCE",
    "GROUPS", "MIGRATIONS", "OVERHEAD",
)  # fmt: skip


def comparison_rows(summaries: Sequence[ColocationSummary], baseline: str) -> list[tuple[str, ...]]:
    """One row per run, speedups over the run of policy `baseline` (the paper normalises by Isolated)."""
    base = next(summary for summary in summaries if summary.policy == baseline)
    return [
        (
            summary.policy,
            format_duration(summary.average_jct),
            format_duration(summary.makespan),
            f"{base.average_jct / summary.average_jct:.2f}x",
            f"{base.makespan / summary.makespan:.2f}x",
            f"{summary.cpu_utilisation:.1%}",
            f"{summary.net_utilisation:.1%}",
            format_rate(summary.remote_io_bytes_per_sec),
            f"{summary.running_jobs:.1f}",
            f"{summary.groups:.1f}",
            str(summary.migrations),
            f"{summary.overhead_share:.1%}",
        )
        for summary in summaries
    ]


def write_summary_json(path: Path, summary: ColocationSummary) -> None:
    path.write_text(json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8")


JOB_COLUMNS = (
    "job_id", "app", "dataset", "arrival", "start", "finish", "jct", "migrations", "pauses", "overhead_seconds",
)  # fmt: skip


def write_jobs_csv(path: Path, result: ColocationResult) -> None:
    rows = [
        (
            job.job_id, job.app, job.dataset, f"{job.arrival:.3f}", f"{job.start:.3f}", f"{job.finish:.3f}",
            f"{job.jct:.3f}", job.migrations, job.pauses, f"{job.overhead_seconds:.3f}",
        )
        for job in result.jobs
    ]  # fmt: skip
    write_csv(path, JOB_COLUMNS, rows)


TIMELINE_COLUMNS = ("time", "cpu", "net", "running_jobs", "groups", "waiting_jobs", "remote_io_bytes_per_sec")


def write_timeline_csv(path: Path, result: ColocationResult) -> None:
    """Every sample: the state from its time until the next row's."""
    rows = [
        (
            f"{sample.time:.3f}", f"{sample.cpu:.4f}", f"{sample.net:.4f}", sample.running_jobs, sample.groups,
            sample.waiting_jobs, f"{sample.remote_io_bytes_per_sec:.0f}",
        )
        for sample in result.samples
    ]  # fmt: skip
    write_csv(path, TIMELINE_COLUMNS, rows)


def write_comparison(path_csv: Path, path_md: Path, summaries: Sequence[ColocationSummary], baseline: str) -> None:
    rows = comparison_rows(summaries, baseline)
    write_csv(path_csv, COMPARISON_HEADERS, rows)
    path_md.write_text(
        f"Speedups are over `{baseline}` (the paper's Figure 10 normalises by Isolated). Utilisation is Eq. 4 over "
        "all machines, averaged over the makespan.\n\n" + markdown_table(COMPARISON_HEADERS, rows) + "\n",
        encoding="utf-8",
    )
