"""Synthetic multi-tenant traces shaped as HiveD's evaluation: its tenants, quotas and job-size mixes.

HiveD's section 5 replays a two-month trace of a 2,232-GPU cluster (279 8-GPU nodes) shared by 11 tenants.
It gives each tenant's quota as a share of the cluster (its Table 1) and each tenant's jobs by GPU count (its
Table 2), and assigns each tenant "a set of node-level (8-GPU) cells with a total number of GPUs equal to its
quota". What it does not give, and what is chosen here:

- **VCs on a smaller cluster.** Node cells in proportion to the quotas by largest remainder, at least one per
  tenant (a VC of no cell runs no regular job): on 50 nodes the five smallest research tenants, 0.37 % to 1.83 %
  of the paper's cluster (1 to 5 of its nodes), get one node each.
- **Job sizes.** Each tenant's Table 2 row as its distribution of GPUs per job, "≥ 16" read as 16. A job larger
  than its tenant's VC could never run in the tenant's private cluster, so it is cut to the VC's size (a
  16-GPU job of a one-node tenant asks for 8): sharing safety compares with that private cluster.
- **Durations.** The trace's are not published; the paper says they span "from 1 minute to tens of hours".
  They are drawn as `generator.py` draws Philly's (log-uniform bands, median about an hour, a heavy tail).
- **Arrivals.** Each tenant's jobs arrive as a Poisson process over a span that makes `jobs` jobs in all, at a
  rate that offers its VC `load` times the utilisation its regular jobs reached in the paper's 279-node
  simulation (Table 4: from 16 % for res-d to 79 % for prod-c). The trace's own loads are not published; these
  are what HiveD's VCs carried of them (a lower bound: demand beyond a VC ran at low priority). `load` =
  279/200 is the paper's busier simulation, the same trace on 200 nodes. Tenants thus differ as in the paper:
  some, like prod-a, rarely fill their VC, others often exceed it, and the heavy-tailed durations make each
  one's demand fluctuate (the paper's Figure 3).
- **Data.** Storage never limits a job in HiveD's world: each job reads its own small dataset slowly.

Every tenant draws from a generator of its own seeded by the recipe's seed and its name, so its sequence of
jobs stays the same when another tenant's profile changes (only the span they are drawn over may).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from datamgr.scheduler.sim.generator import DURATION_BANDS, pick_weighted
from datamgr.scheduler.sim.model import TraceJob
from datamgr.scheduler.tenancy import TenantShare

MB = 10**6
GB = 10**9
RATE_PER_GPU = 10 * MB  # f* per GPU: never slowed by a scenario's ample remote IO
DATASET_BYTES = 10 * GB


@dataclass(frozen=True, slots=True)
class TenantProfile:
    """A tenant of HiveD's trace: its quota as a share of the cluster (Table 1), its jobs by GPUs (Table 2) and
    the share of its VC its regular jobs kept busy in the paper's 279-node simulation (Table 4)."""

    name: str
    quota: float
    jobs_by_gpus: tuple[tuple[int, int], ...]
    utilisation: float


def _row(name: str, quota_percent: float, utilisation_percent: float, *jobs: int) -> TenantProfile:
    """A tenant from its quota and utilisation in percent and its jobs of 1, 2, 4, 8 and 16 or more GPUs."""
    sizes = tuple(zip((1, 2, 4, 8, 16), jobs, strict=True))
    return TenantProfile(name, quota_percent / 100, sizes, utilisation_percent / 100)


# HiveD's Tables 1, 4 and 2, tenant by tenant: quota %, utilisation %, jobs of 1, 2, 4, 8 and >= 16 GPUs.
PAPER_TENANTS: tuple[TenantProfile, ...] = (
    _row("res-a", 0.37, 57.6, 429, 14, 260, 625, 40),
    _row("res-b", 0.73, 74.8, 18_319, 1_593, 931, 148, 238),
    _row("res-c", 0.73, 74.9, 3_285, 161, 716, 185, 0),
    _row("res-d", 1.47, 16.1, 1_754, 0, 0, 0, 0),
    _row("res-e", 1.83, 52.3, 2_682, 110, 3_005, 0, 0),
    _row("res-f", 28.57, 45.1, 8_181, 88, 618, 1_337, 559),
    _row("prod-a", 8.79, 25.3, 227, 54, 23, 1_132, 138),
    _row("prod-b", 10.62, 44.8, 16_446, 67, 605, 1_344, 22),
    _row("prod-c", 11.36, 78.6, 4_692, 301, 1_905, 4_415, 1_206),
    _row("prod-d", 15.75, 47.0, 781, 6, 545, 650, 95),
    _row("prod-e", 19.78, 60.0, 58_407, 532, 2_118, 959, 2),
)


@dataclass(frozen=True, slots=True)
class TenantTraceConfig:
    jobs: int
    seed: int
    load: float  # each tenant's offered load over its Table 4 utilisation (279/200: the paper's busier cluster)

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")
        if not self.load > 0:
            raise ValueError(f"load must be positive, not {self.load!r}")


def vc_nodes(profiles: Sequence[TenantProfile], nodes: int) -> dict[str, int]:
    """Node cells per tenant: `nodes` split in proportion to the quotas by largest remainder, at least one each."""
    if nodes < len(profiles):
        raise ValueError(f"{nodes} nodes cannot give each of {len(profiles)} tenants a node cell")
    total = sum(p.quota for p in profiles)
    exact = {p.name: nodes * p.quota / total for p in profiles}
    given = {name: max(1, math.floor(share)) for name, share in exact.items()}
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] - math.floor(exact[name])), name))
    while sum(given.values()) < nodes:
        name = by_remainder.pop(0)
        if given[name] == math.floor(exact[name]):
            given[name] += 1
        by_remainder.append(name)
    while sum(given.values()) > nodes:  # the minimum of one overshot: take from the largest
        largest = max(given, key=lambda name: (given[name], name))
        given[largest] -= 1
    return given


def tenant_shares(node_cells: dict[str, int]) -> dict[str, TenantShare]:
    return {name: TenantShare(cells={"node": count}) for name, count in node_cells.items()}


def _mean_duration() -> float:
    """Seconds: the mean of `generator.DURATION_BANDS`' log-uniform minutes."""
    ln10 = math.log(10)
    return sum(share * 60 * (10**high - 10**low) / ((high - low) * ln10) for share, low, high in DURATION_BANDS)


def generate_tenant_trace(
    config: TenantTraceConfig, gpus_per_node: int, node_cells: dict[str, int],
    profiles: Sequence[TenantProfile] = PAPER_TENANTS,
) -> list[TraceJob]:  # fmt: skip
    """The trace `config` describes for tenants with these VCs, in arrival order."""
    sizes = {p.name: _sizes(p, node_cells[p.name] * gpus_per_node) for p in profiles}
    mean_gpus = {name: sum(g * w for g, w in mix) for name, mix in sizes.items()}
    rates = {  # jobs per second that offer `load` x the VC's GPUs
        p.name: config.load
        * p.utilisation
        * node_cells[p.name]
        * gpus_per_node
        / (mean_gpus[p.name] * _mean_duration())
        for p in profiles
    }
    span = config.jobs / sum(rates.values())
    jobs: list[tuple[float, str, int, float]] = []
    for profile in profiles:
        rng = random.Random(f"{config.seed}:{profile.name}")
        clock = 0.0
        while True:
            clock += -math.log(1.0 - rng.random()) / rates[profile.name]
            if clock > span:
                break
            gpus = pick_weighted(rng.random(), sizes[profile.name])
            _, low, high = pick_weighted(rng.random(), [(band, band[0]) for band in DURATION_BANDS])
            jobs.append((float(round(clock)), profile.name, gpus, 60.0 * 10 ** (low + (high - low) * rng.random())))
    jobs.sort()
    width = len(str(len(jobs) - 1))
    return [_job(f"job-{i:0{width}d}", *job) for i, job in enumerate(jobs)]


def _sizes(profile: TenantProfile, vc_gpus: int) -> list[tuple[int, float]]:
    """GPUs per job and their probabilities: the Table 2 row, each size cut to what the VC holds."""
    total = sum(count for _, count in profile.jobs_by_gpus)
    mix: dict[int, float] = {}
    for gpus, count in profile.jobs_by_gpus:
        if count:
            size = min(gpus, vc_gpus)
            mix[size] = mix.get(size, 0.0) + count / total
    return sorted(mix.items())


def _job(job_id: str, arrival: float, tenant: str, gpus: int, seconds: float) -> TraceJob:
    rate = RATE_PER_GPU * gpus
    return TraceJob(
        job_id=job_id,
        arrival=arrival,
        gpus=gpus,
        model="dl",
        ideal_bytes_per_sec=float(rate),
        dataset=f"data/{job_id}",
        dataset_bytes=DATASET_BYTES,
        epochs=float(f"{seconds * rate / DATASET_BYTES:.6g}"),
        tenant=tenant,
    )
