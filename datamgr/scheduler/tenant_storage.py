"""Storage guarantees per tenant: cache bytes and remote IO partitioned by tenant, idle shares lent and taken back.

HiveD guarantees each tenant the GPU cells of its virtual cluster (VC); `Snapshot.tenants` also reserves it
cache bytes and remote IO (`TenantShare.cache_bytes`, `io_bytes_per_sec`). `TenantStorage` honours those
reservations the way `partition.py` keeps irregular jobs apart: the cluster's storage is split into one share
per tenant, and a storage policy (by default SiloD's greedy allocation, `GreedyStorage`, with irregular jobs
kept in their own partition inside the share, `IrregularPartition`) runs inside each share, over the tenant's
running jobs alone (`Snapshot.restricted`). Each round, over the running jobs of the snapshot it is handed:

1. *Groups.* Each tenant of `snapshot.tenants` is a group of its running jobs, whatever their compute priority
   (HiveD's low-priority jobs included: the reservation is the tenant's, and its storage policy weighs all its
   jobs, as it would in a private cluster). Jobs without a tenant, or of a tenant the snapshot has no VC for,
   form one more group, the shared pool, with no reservation: they run on what the tenants leave (as HiveD
   runs such jobs at low priority only).
2. *What a group can use.* Cache: its running jobs' datasets, each whole (no cache beyond a dataset's size
   helps). Remote IO: what its jobs need now with the cache they can hit under their quotas, f* (1 - c/d) per
   job with f* on the GPUs it holds (irregular jobs, whose reads SiloDPerf cannot predict, count at f*); and
   at most f* per job.
3. *Guarantees.* Each group gets its reservation or what it can use, whichever is less. Reservations that add
   up to more than the capacity (a storage partition: under `registry.build_scheduler` the irregular
   partition runs this policy on the regular jobs' share) are scaled down in proportion to fit it.
4. *Lending.* What the guarantees leave (reservations the owners cannot use this round, and whatever no
   tenant reserved) is shared max-min fairly among the groups that can use more, each up to what it can use:
   HiveD shares idle cells among tenants by (weighted) max-min fairness, and equal weights are the only ones
   the pool of jobs without a tenant could have (it has no VC to weigh by). Remote IO goes first up to the
   groups' needs, then up to f*, as SiloD's greedy allocation gives it to jobs.
5. *Inside a share* the storage policy runs on the group's jobs with the group's cache and remote IO as the
   capacities; its decisions are merged. A dataset read by the jobs of several groups holds the sum of what
   each group's policy gives it, up to its size: each tenant pays for the part it caches and every reader hits
   the whole (uniform caching: one hit ratio c/d for all readers), so no tenant gets less than its own share
   buys it. Parts that add up beyond the dataset's size are left idle that round. Inside a share the irregular
   partition splits it by GPUs as `partition.py` splits the cluster, so, as there, a side whose jobs cannot use
   all of its part leaves the rest idle rather than give it to the other side.

*Taking back.* Nothing is remembered between rounds: each round recomputes the shares, so a tenant whose jobs
need its reservation again gets it back in the first round they run, whoever borrowed it. The borrower's
quotas shrink, which evicts uniformly at random down to the new quota (the cache's shrink rule, invariant 1:
its remaining items stay hits at c/d), and the owner's quota grows, which evicts nothing; the returned space
is empty and fills with the owner's misses (an item cached in an epoch helps from the next one). Remote IO
returns at once.

Pure: no I/O, deterministic (groups and claimants in sorted order), the snapshot untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from datamgr.scheduler import perf
from datamgr.scheduler.partition import IrregularPartition
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policies.greedy import GreedyStorage
from datamgr.scheduler.policy import Decision, MergedNotes, Policy
from datamgr.scheduler.sharing import water_fill
from datamgr.scheduler.snapshot import JobState, Snapshot

POOL = "pool"  # the group of jobs without a VC; tenants' groups are keyed "tenant:NAME", so no name collides


def group_key(tenant: str | None) -> str:
    """The key of a tenant's group (None: the shared pool's)."""
    return POOL if tenant is None else f"tenant:{tenant}"


@dataclass(frozen=True, slots=True)
class Group:
    """A tenant (None: the shared pool) with its running jobs and its reservation, fitted to the capacity."""

    tenant: str | None
    jobs: tuple[JobState, ...]
    reserved_cache_bytes: int = 0
    reserved_io_bytes_per_sec: int = 0

    @property
    def key(self) -> str:
        return group_key(self.tenant)

    @property
    def label(self) -> str:
        return "jobs without a VC" if self.tenant is None else f"tenant {self.tenant}"

    def cache_demand(self) -> int:
        """The most cache its jobs can use: each dataset they read, whole."""
        return sum({job.dataset_uri: job.dataset_bytes for job in self.jobs}.values())

    def io_ceiling(self) -> float:
        """The most remote IO its jobs can use: f* on the GPUs each holds."""
        return sum(perf.ideal_rate(job, job.allocated_gpus) for job in self.jobs)


@dataclass(frozen=True, slots=True)
class Share:
    """What one group gets this round, and of it what its reservation guarantees (the rest is lent to it)."""

    cache_bytes: int
    io_bytes_per_sec: int
    guaranteed_cache_bytes: int
    guaranteed_io_bytes_per_sec: int


def fitted(reserved: Mapping[str, float], capacity: float) -> dict[str, int]:
    """Reservations as whole units; scaled down in proportion (rounded down) where they add up to more than
    `capacity`, so they always fit it."""
    total = sum(reserved.values())
    if total <= capacity:
        return {key: int(amount) for key, amount in reserved.items()}
    return {key: int(amount * capacity / total) for key, amount in reserved.items()}


def tenant_groups(snapshot: Snapshot) -> list[Group]:
    """One group per tenant of the snapshot (those with no running job too: their reservation is idle) and,
    if any running job has no VC, the shared pool; in key order."""
    cache = fitted({name: share.cache_bytes for name, share in snapshot.tenants.items()}, snapshot.cache_capacity_bytes)
    io = fitted(
        {name: share.io_bytes_per_sec for name, share in snapshot.tenants.items()}, snapshot.remote_io_bytes_per_sec
    )
    members: dict[str | None, list[JobState]] = {name: [] for name in snapshot.tenants}
    for job in snapshot.running_jobs():
        members.setdefault(job.tenant if job.tenant in snapshot.tenants else None, []).append(job)
    groups = [
        Group(tenant, tuple(jobs))
        if tenant is None
        else Group(tenant, tuple(jobs), cache.get(tenant, 0), io.get(tenant, 0))
        for tenant, jobs in members.items()
    ]
    return sorted(groups, key=lambda group: group.key)


def share_cache(groups: Sequence[Group], capacity: int) -> dict[str, int]:
    """Cache per group: its reservation or its demand, whichever is less; the rest max-min fair among the
    groups that can use more, up to their demand."""
    demand = {group.key: group.cache_demand() for group in groups}
    guaranteed = {group.key: min(group.reserved_cache_bytes, demand[group.key]) for group in groups}
    return water_fill(demand, capacity, floor=guaranteed)


def share_io(
    groups: Sequence[Group], needs: Mapping[str, float], ceilings: Mapping[str, float], limit: float
) -> tuple[dict[str, int], dict[str, int]]:
    """Remote IO per group, and of it the guaranteed part: its reservation or its need, whichever is less;
    then the rest max-min fair up to each group's need, then up to its ceiling (f*)."""
    guaranteed = {group.key: min(group.reserved_io_bytes_per_sec, int(needs[group.key])) for group in groups}
    to_needs = water_fill(needs, limit, floor=guaranteed)
    return water_fill(ceilings, limit, floor=to_needs), guaranteed


def remote_need(snapshot: Snapshot, job: JobState, quota_bytes: float) -> float:
    """What the job fetches now at full speed under a dataset quota of `quota_bytes`: f* (1 - c/d), c the
    cache it can hit now; an irregular job, whose reads SiloDPerf cannot predict, at f*."""
    ideal = perf.ideal_rate(job, job.allocated_gpus)
    if job.irregular:
        return ideal
    return perf.remote_demand(ideal, snapshot.usable_cache_bytes(job, quota_bytes), job.dataset_bytes)


def default_inner() -> Policy:
    """SiloD's greedy storage, irregular jobs in a partition of their own: what runs inside each share."""
    return IrregularPartition(GreedyStorage())


@dataclass(frozen=True)
class TenantStorage:
    """Storage only: each tenant's share of cache and remote IO, `inner` run inside each (module docstring).

    `inner` is a policy whose storage decision is used (any placements it returns are ignored); it is asked
    twice per group, once with the whole remote IO limit to learn the quotas it would set (and from them the
    IO the group needs), once with the group's IO."""

    inner: Policy = field(default_factory=default_inner)
    name: str = "tenant-storage"
    storage_only = True  # never decides placements (`registry.FilledIn` relies on it)

    def shares(self, snapshot: Snapshot, estimator: Estimator) -> list[tuple[Group, Share]]:
        """Each group (in key order) with the cache and remote IO it gets this round."""
        groups = tenant_groups(snapshot)
        cache = share_cache(groups, snapshot.cache_capacity_bytes)
        needs = dict.fromkeys((group.key for group in groups), 0.0)
        for group in (group for group in groups if group.jobs):
            probe = self._inside(snapshot, group, cache[group.key], snapshot.remote_io_bytes_per_sec, estimator)
            quotas = probe.cache_bytes or {}
            needs[group.key] = sum(remote_need(snapshot, job, quotas.get(job.dataset_uri, 0)) for job in group.jobs)
        ceilings = {group.key: group.io_ceiling() for group in groups}
        io, guaranteed_io = share_io(groups, needs, ceilings, snapshot.remote_io_bytes_per_sec)
        return [
            (
                group,
                Share(
                    cache[group.key],
                    io[group.key],
                    min(group.reserved_cache_bytes, group.cache_demand()),
                    guaranteed_io[group.key],
                ),
            )
            for group in groups
        ]

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        quotas: dict[str, int] = {}
        rates: dict[str, int] = {}
        private: dict[str, int] = {}
        notes: list[Mapping[str, str]] = []
        described: dict[str, str] = {}
        sizes: dict[str, int] = {}
        for group, share in self.shares(snapshot, estimator):
            described[group.label] = _describe(group, share)
            if not group.jobs:
                continue
            decision = self._inside(snapshot, group, share.cache_bytes, share.io_bytes_per_sec, estimator)
            for uri, quota in (decision.cache_bytes or {}).items():
                quotas[uri] = quotas.get(uri, 0) + quota
            rates.update(decision.io_bytes_per_sec or {})
            private.update(decision.job_cache_bytes)
            notes.append(decision.notes)
            sizes.update((job.dataset_uri, job.dataset_bytes) for job in group.jobs)
        return Decision(
            cache_bytes={uri: min(quota, sizes.get(uri, quota)) for uri, quota in quotas.items()},
            io_bytes_per_sec=rates,
            job_cache_bytes=private,
            notes=MergedNotes(*notes, described),
        )

    def _inside(self, snapshot: Snapshot, group: Group, cache: int, io: float, estimator: Estimator) -> Decision:
        """`inner`'s decision on the group's running jobs alone, with the group's share as the capacities."""
        partition = snapshot.restricted([job.job_id for job in group.jobs], cache, io)
        return self.inner.schedule(partition, estimator)


def _describe(group: Group, share: Share) -> str:
    return (
        f"{len(group.jobs)} running job(s); cache {share.cache_bytes} B: {share.guaranteed_cache_bytes} B of its "
        f"{group.reserved_cache_bytes} B reserved, {share.cache_bytes - share.guaranteed_cache_bytes} B borrowed; "
        f"remote IO {share.io_bytes_per_sec} B/s: {share.guaranteed_io_bytes_per_sec} B/s of its "
        f"{group.reserved_io_bytes_per_sec} B/s reserved, "
        f"{share.io_bytes_per_sec - share.guaranteed_io_bytes_per_sec} B/s borrowed"
    )
