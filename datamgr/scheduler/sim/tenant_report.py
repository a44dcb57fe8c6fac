"""HiveD's measures of sharing safety over simulation results (its section 5.2), pure: per tenant, the queueing
delay of its jobs over time as a moving average by submission time (its Figures 6 and 7), and, beside a run of
the `private` policy (each tenant alone on its VC), how much longer a shared run made each tenant wait: the
largest excess of its moving average over the private cluster's, and its multi-GPU regular jobs that waited more
than `EXCESS_THRESHOLD` longer than in the private cluster. The files are written here, the plots in `plots.py`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from itertools import groupby
from operator import attrgetter
from pathlib import Path

from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import JobOutcome, SimResult
from datamgr.scheduler.sim.report import (
    Summary,
    format_percent,
    format_share,
    format_time,
    markdown_table,
    mean_of,
    queueing_delay,
    write_csv,
)
from datamgr.scheduler.snapshot import LOW_PRIORITY

DELAY_WINDOW = 12 * 3600.0  # HiveD's Figures 6 and 7: the mean delay of the jobs submitted in a 12-hour window,
DELAY_STEP = 3600.0  # sampled every hour
EXCESS_THRESHOLD = 60.0  # a job waits beyond its private cluster's delay when by more than this (seconds)
# Moving averages closer than this (seconds) are equal: two runs' starts of one job can differ in the last bits
# of a float (2908.500000000029 against 2908.5), which read as an "excess" of 4e-12 s at some hour.
SAME_DELAY = 1e-6
PRIVATE_POLICY = "private"  # HiveD's private cluster (policies/hived.py): what sharing safety is measured against


@dataclass(frozen=True, slots=True)
class TenantDelay:
    """One point of a tenant's moving-average queueing delay (HiveD's Figures 6 and 7)."""

    time: float  # the end of the window: the jobs submitted in (time - DELAY_WINDOW, time]
    tenant: str
    jobs: int  # the tenant's finished regular jobs submitted in the window
    average_delay: float  # their mean queueing delay (seconds); NaN when there are none


@dataclass(frozen=True, slots=True)
class SharingSafety:
    """How one tenant fared in a shared run against the private cluster (HiveD's section 5.2)."""

    policy: str
    cache_system: str
    tenant: str
    # The largest amount (seconds) by which the run's moving-average delay exceeds the private run's at one
    # window end, and that window end; 0 and NaN when it never does.
    max_excess_delay: float
    max_excess_at: float
    multi_gpu_jobs: int  # the tenant's regular jobs of more than one GPU that finished in both runs
    delayed_jobs: int  # of those, the ones that waited more than EXCESS_THRESHOLD longer than in the private run
    delayed_share: float  # delayed_jobs / multi_gpu_jobs; NaN without multi-GPU jobs


def has_private(runs: Sequence[tuple[SimResult, Summary]]) -> bool:
    """Whether one of the runs is of the `private` policy, the one sharing safety is measured against."""
    return any(result.policy == PRIVATE_POLICY for result, _ in runs)


def is_regular(job: JobOutcome) -> bool:
    """A job the trace does not mark low priority: one its tenant's guarantee covers."""
    return job.priority != LOW_PRIORITY


def has_tenants(jobs: Iterable[JobOutcome]) -> bool:
    return any(j.tenant for j in jobs)


def delay_times(jobs: Iterable[JobOutcome], step: float = DELAY_STEP) -> list[float]:
    """The window ends of the moving averages: every multiple of `step` from the first at or after the earliest
    arrival of a tenant's regular job to the first at or after the latest, so that each such job is in some
    window (as long as `step` is at most the window)."""
    arrivals = [j.arrival for j in jobs if j.tenant and is_regular(j)]
    if not arrivals:
        return []
    first, last = math.ceil(min(arrivals) / step), math.ceil(max(arrivals) / step)
    return [k * step for k in range(first, last + 1)]


def tenant_delays(
    jobs: Iterable[JobOutcome], times: Sequence[float] | None = None, window: float = DELAY_WINDOW
) -> list[TenantDelay]:
    """Per tenant (in name order) and window end of `times` (default `delay_times`), the mean queueing delay of
    its finished regular jobs submitted in (time - window, time]: the moving average by submission time that
    HiveD plots. Jobs without a tenant, and low-priority ones (no guarantee covers them), are left out."""
    chosen = sorted((j for j in jobs if j.tenant and is_regular(j)), key=attrgetter("tenant", "arrival"))
    ends = delay_times(chosen) if times is None else times
    points: list[TenantDelay] = []
    for tenant, members in groupby(chosen, attrgetter("tenant")):
        own = list(members)
        arrivals = [j.arrival for j in own]
        delays = [queueing_delay(j) for j in own]
        for end in ends:
            low, high = bisect_right(arrivals, end - window), bisect_right(arrivals, end)
            points.append(TenantDelay(end, tenant, high - low, mean_of(delays[low:high])))
    return points


def sharing_safety(shared: SimResult, private: SimResult, threshold: float = EXCESS_THRESHOLD) -> list[SharingSafety]:
    """Each tenant of either run (in name order) in `shared` against `private`, the same trace on the tenants'
    private clusters: the largest excess of its moving-average queueing delay (`tenant_delays`, both on the window
    ends of both runs' jobs) over the private run's, and how many of its multi-GPU regular jobs that finished in
    both runs waited more than `threshold` seconds longer than they did in the private run."""
    times = delay_times([*shared.jobs, *private.jobs])
    theirs = {(p.tenant, p.time): p.average_delay for p in tenant_delays(private.jobs, times)}
    excess: dict[str, tuple[float, float]] = {}
    for point in tenant_delays(shared.jobs, times):
        difference = point.average_delay - theirs.get((point.tenant, point.time), math.nan)
        if difference > max(SAME_DELAY, excess.get(point.tenant, (0.0, math.nan))[0]):  # never NaN (a run lacks jobs)
            excess[point.tenant] = (difference, point.time)
    alone = {j.job_id: queueing_delay(j) for j in private.jobs if _multi_gpu_regular(j)}
    tenants = sorted({j.tenant for j in (*shared.jobs, *private.jobs) if j.tenant})
    rows = []
    for tenant in tenants:
        matched = [j for j in shared.jobs if j.tenant == tenant and j.job_id in alone and _multi_gpu_regular(j)]
        delayed = sum(queueing_delay(j) > alone[j.job_id] + threshold for j in matched)
        most, at = excess.get(tenant, (0.0, math.nan))
        rows.append(
            SharingSafety(
                policy=shared.policy,
                cache_system=shared.cache_system,
                tenant=tenant,
                max_excess_delay=most,
                max_excess_at=at,
                multi_gpu_jobs=len(matched),
                delayed_jobs=delayed,
                delayed_share=delayed / len(matched) if matched else math.nan,
            )
        )
    return rows


def _multi_gpu_regular(job: JobOutcome) -> bool:
    return job.gpus > 1 and bool(job.tenant) and is_regular(job)


def sharing_safety_runs(runs: Sequence[tuple[SimResult, Summary]]) -> list[tuple[SimResult, SimResult]]:
    """Each run of another policy paired with the `private` run on its cache system, in the order of `runs`."""
    private = {r.cache_system: r for r, _ in runs if r.policy == PRIVATE_POLICY}
    return [(r, private[r.cache_system]) for r, _ in runs if r.policy != PRIVATE_POLICY and r.cache_system in private]


def sharing_safety_rows(runs: Sequence[tuple[SimResult, Summary]]) -> list[SharingSafety]:
    """`sharing_safety` of every run paired with a private one (`sharing_safety_runs`)."""
    return [row for shared, private in sharing_safety_runs(runs) for row in sharing_safety(shared, private)]


def worst_tenant(rows: Iterable[SharingSafety]) -> str | None:
    """Of one run's rows, the tenant with the largest excess of its moving average over the private cluster's
    (then the most multi-GPU jobs delayed, then the first by name); None without tenants."""
    ranked = sorted(rows, key=lambda r: (-r.max_excess_delay, -r.delayed_jobs, r.tenant))
    return ranked[0].tenant if ranked else None


SAFETY_HEADERS = ("TENANT", "MAX EXCESS", "AT", "MULTI-GPU JOBS", "DELAYED", "SHARE")
CLUSTER_HEADERS = ("POLICY", "CACHE", "GPU UTILISATION", "REGULAR", "FRAGMENTATION", "PREEMPTED GPUS")


def sharing_safety_section(runs: Sequence[tuple[SimResult, Summary]]) -> list[str]:
    """compare.md's section on sharing safety: the cluster under each run (utilisation, fragmentation, preempted
    GPUs), then a table per run beside a `private` one, a row per tenant, and what the columns mean; no section
    when no run is of the `private` policy."""
    if not has_private(runs):
        return []
    cluster_rows = [
        (
            r.policy,
            r.cache_system,
            format_share(s.gpu_utilisation, 1.0),
            format_share(s.regular_gpu_utilisation, 1.0),
            format_share(s.fragmentation, 1.0),
            str(s.preempted_gpus),
        )
        for r, s in runs
    ]
    sections = ["## Sharing safety", markdown_table(CLUSTER_HEADERS, cluster_rows), _CLUSTER_NOTE]
    for shared, private in sharing_safety_runs(runs):
        rows = sharing_safety(shared, private)
        sections.append(f"### {shared.policy}/{shared.cache_system} against {private.policy}/{private.cache_system}")
        if not rows:
            sections.append("No job has a tenant: nothing to compare.")
            continue
        cells = [
            (
                row.tenant,
                format_time(row.max_excess_delay),
                format_time(row.max_excess_at),
                str(row.multi_gpu_jobs),
                str(row.delayed_jobs),
                format_percent(row.delayed_share),
            )
            for row in rows
        ]
        sections.append(markdown_table(SAFETY_HEADERS, cells))
    sections.append(_SAFETY_NOTE)
    return sections


_CLUSTER_NOTE = (
    "GPU UTILISATION: the mean share of the cluster's GPUs held by running jobs, over the timeline's samples from "
    "the first arrival on; REGULAR: by running regular jobs (not run preemptibly, as HiveD runs low-priority jobs); "
    "FRAGMENTATION: the mean share of nodes on which a regular job uses any GPU (not available for a whole-node "
    "regular job). PREEMPTED GPUS: each finished job's preemptions times its GPUs, summed."
)
_SAFETY_NOTE = (
    f"MAX EXCESS: the largest amount by which the run's moving-average queueing delay of the tenant (the mean delay "
    f"of its finished regular jobs submitted in the {format_duration(DELAY_WINDOW)} up to a time, every "
    f"{format_duration(DELAY_STEP)}) exceeds the private cluster's; 0s when it never does. AT: the end of that "
    f"window, from the trace start. MULTI-GPU JOBS: the tenant's regular jobs of 2 GPUs or more finished in both "
    f"runs; DELAYED: those whose queueing delay exceeds their delay in the private cluster by more than "
    f"{format_duration(EXCESS_THRESHOLD)}; SHARE: DELAYED / MULTI-GPU JOBS."
)


def write_tenant_delay_csv(path: Path, result: SimResult) -> None:
    """`tenant_delays` of the run, a row per tenant and window end: `TenantDelay`'s fields (seconds)."""
    names = [f.name for f in fields(TenantDelay)]
    write_csv(path, names, [[getattr(point, name) for name in names] for point in tenant_delays(result.jobs)])


def write_sharing_safety_csv(path: Path, rows: Sequence[SharingSafety]) -> None:
    """`SharingSafety`'s fields, a row per run beside a private one and tenant (seconds, a ratio)."""
    names = [f.name for f in fields(SharingSafety)]
    write_csv(path, names, [[getattr(row, name) for name in names] for row in rows])
