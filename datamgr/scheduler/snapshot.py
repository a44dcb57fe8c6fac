"""What a policy sees: an immutable picture of the cluster at one instant.

The same snapshot is built by the simulator (from its model) and by the live controller (from the data
manager's state), so a policy cannot tell which one drives it. Sizes are bytes, rates bytes/s, times
seconds on the driver's clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from types import MappingProxyType
from typing import NamedTuple

from datamgr.scheduler.tenancy import TenantShare


@dataclass(frozen=True, slots=True)
class NodeState:
    """A machine: its GPUs and the local cache space it contributes; its CPUs and RAM where the driver models
    them (0: not modelled, no job asks for any)."""

    node_id: str
    gpus: int
    cache_bytes: int
    cpus: float = 0.0
    ram_bytes: int = 0


class JobState(NamedTuple):
    """A submitted, unfinished job and what it holds now.

    `ideal_bytes_per_sec` is f* on the job's full GPU demand (`gpus`); `total_bytes` is the training data
    the job consumes over its life (epochs x dataset size, or steps x step size) and `done_bytes` how much
    of it is consumed, so `remaining_bytes / rate` is its remaining time. `irregular` marks jobs whose
    access is not uniform (curriculum learning and the like), for which SiloDPerf does not hold.

    A named tuple, not a frozen dataclass: as immutable, and five times cheaper to build, which matters
    because the simulator builds one per running job every round (millions in a simulated month). Change
    one with `_replace`.
    """

    job_id: str
    submit_time: float
    gpus: int
    dataset_uri: str
    dataset_bytes: int
    ideal_bytes_per_sec: float
    total_bytes: float
    done_bytes: float = 0.0
    attained_gpu_seconds: float = 0.0
    irregular: bool = False
    placement: Mapping[str, int] = MappingProxyType({})  # node -> GPUs; empty if queued
    io_bytes_per_sec: float = 0.0  # current remote IO allocation
    epoch_hit_ratio: float | None = None  # share of the rest of this epoch's reads the cache serves; None: unknown
    # Its history, for policies that preempt (Tiresias, FitGpp): when it first and last started (None: never),
    # since when it has waited (None while running; its submit time until it first runs), how long it waited
    # before that, and how often it was preempted.
    first_start_time: float | None = None
    last_start_time: float | None = None
    pending_since: float | None = None
    queued_seconds_before: float = 0.0
    preemptions: int = 0
    # What the policy handed back for this job last round (`Decision.job_states`): state it carries from round
    # to round, such as Tiresias's queue. Empty until the policy first sets it.
    policy_state: Mapping[str, float] = MappingProxyType({})
    skew: float = 0.0  # its model's largest tensor over the model's size (Tiresias's placement); 0: unknown
    # While it suspends after a preemption (FitGpp's grace period) it still holds these GPUs, node -> GPUs, and
    # can be placed again only once they are released; empty otherwise. Its placement is empty meanwhile.
    held: Mapping[str, int] = MappingProxyType({})
    job_class: str = ""  # "te" (trial-and-error) or anything else (best-effort), for policies that tell them apart
    cpus: float = 0.0  # besides its GPUs, on its one node; 0: not asked for
    ram_bytes: int = 0
    grace_seconds: float = 0.0  # how long it suspends, holding its resources, once preempted
    tenant: str = ""  # who submitted it, for policies that share a cluster among tenants (HiveD); "": none
    priority: str = ""  # "low": preemptible, runs only on resources nobody's guarantee needs; else regular

    @property
    def running(self) -> bool:
        return bool(self.placement)

    @property
    def allocated_gpus(self) -> int:
        return sum(self.placement.values())

    @property
    def remaining_bytes(self) -> float:
        return max(0.0, self.total_bytes - self.done_bytes)

    def queued_seconds(self, now: float) -> float:
        """How long it has waited in all, up to `now`: before it first ran and after each preemption."""
        waiting = 0.0 if self.pending_since is None else max(0.0, now - self.pending_since)
        return self.queued_seconds_before + waiting


LOW_PRIORITY = "low"
# The policy-state key a policy sets to 1.0 for a job it runs preemptibly, on resources others are guaranteed
# (HiveD's low-priority jobs and the regular jobs overflowing their VC), and to 0.0 for a regular one: what the
# simulator's fragmentation and regular utilisation and `silod status` count by.
OPPORTUNISTIC = "opportunistic"


@dataclass(frozen=True, slots=True)
class DatasetState:
    """A dataset some job reads: its size and the cache it holds now (quota and bytes actually cached)."""

    uri: str
    size_bytes: int
    cache_quota_bytes: int = 0
    cached_bytes: int | None = None  # None: not known (the quota is taken as filled, the steady state)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as one policy round sees it; `seed` makes randomized policies reproducible."""

    time: float
    nodes: Mapping[str, NodeState]
    remote_io_bytes_per_sec: float
    datasets: Mapping[str, DatasetState]
    jobs: Mapping[str, JobState]
    seed: int = 0
    cache_capacity_bytes: int = field(default=-1)  # -1: the sum of the nodes' cache
    tenants: Mapping[str, TenantShare] = field(default_factory=lambda: MappingProxyType({}))  # by tenant name
    # The GPUs' affinity hierarchy bottom up as NAME:BUDDIES ("gpu:1,pcie:2,socket:2,node:2,rack:4", `cells.py`);
    # "": each node is one cell of its GPUs.
    cell_levels: str = ""
    total_gpus: int = field(default=0, init=False, compare=False)  # the nodes' GPUs, summed once
    # The jobs in submission order, sorted once: a round asks for it (or its running or queued part) many times.
    _by_submission: tuple[JobState, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cache_capacity_bytes < 0:
            object.__setattr__(self, "cache_capacity_bytes", sum(n.cache_bytes for n in self.nodes.values()))
        object.__setattr__(self, "total_gpus", sum(n.gpus for n in self.nodes.values()))
        jobs = tuple(self.jobs.values())
        if not _in_submission_order(jobs):
            jobs = tuple(sorted(jobs, key=_submission_order))
        object.__setattr__(self, "_by_submission", jobs)

    def running_jobs(self) -> list[JobState]:
        """Jobs holding GPUs, in submission order (ties by id), the order every policy iterates in.

        Read `placement` (`JobState.running`) directly: a round filters every job, queued ones included, a few
        times, and a property call per job is most of that."""
        return [j for j in self._by_submission if j.placement]

    def queued_jobs(self) -> list[JobState]:
        """Jobs a policy may start: neither running nor still suspending (`held`), in submission order."""
        return [j for j in self._by_submission if not j.placement and not j.held]

    def schedulable_jobs(self) -> list[JobState]:
        """Jobs a policy may place: running or queued, not suspending, in submission order (what a policy that
        ranks every job and walks the ranking should rank)."""
        return [j for j in self._by_submission if not j.held]

    def suspending_jobs(self) -> list[JobState]:
        """Preempted jobs still holding their resources through their grace period, in submission order."""
        return [j for j in self._by_submission if j.held]

    def jobs_by_submission(self) -> list[JobState]:
        return list(self._by_submission)

    def usable_cache_bytes(self, job: JobState, quota_bytes: float) -> float:
        """The cache a job can hit now under a dataset quota of `quota_bytes`.

        A quota is only a limit: the cache fills as the job's misses are fetched, and an item cached during
        an epoch helps only from the next one. So the remote IO a job needs right now follows from the
        cache it can actually hit (`cache_within_reach`), not from the quota; allocating IO from quotas
        alone would starve a job while its cache is still filling.
        """
        reach = self.cache_within_reach(job)
        return quota_bytes if reach is None else min(quota_bytes, reach)

    def cache_within_reach(self, job: JobState) -> float | None:
        """The cached bytes a job can hit now whatever its quota: its effective cache (its epoch hit ratio
        times its dataset), else the bytes its dataset has cached; None when neither is known (then the
        quota is taken as filled, the steady state)."""
        if job.epoch_hit_ratio is not None:
            return job.epoch_hit_ratio * job.dataset_bytes
        dataset = self.datasets.get(job.dataset_uri)
        if dataset is None or dataset.cached_bytes is None:
            return None
        return float(dataset.cached_bytes)

    def jobs_of(self, dataset_uri: str, jobs: Iterable[JobState] | None = None) -> list[JobState]:
        """The jobs (by default all of them) that read `dataset_uri`."""
        pool = self.jobs_by_submission() if jobs is None else jobs
        return [j for j in pool if j.dataset_uri == dataset_uri]

    def free_gpus(self, placements: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, int]:
        """GPUs left per node once `placements` (by default the current ones) are taken, and what suspending
        jobs still hold, which no decision can move."""
        if placements is None:
            placements = {j.job_id: j.placement for j in self.jobs.values()}
        free = {node_id: node.gpus for node_id, node in self.nodes.items()}
        for placement in [*placements.values(), *(j.held for j in self.suspending_jobs())]:
            for node_id, gpus in placement.items():
                free[node_id] -= gpus
        return free

    def with_placements(self, placements: Mapping[str, Mapping[str, int]]) -> Snapshot:
        """This snapshot with job placements replaced (jobs missing from `placements` become queued).

        Only the jobs `placements` names and the running jobs it leaves out are looked at: the rest of a long
        queue stays queued, the same objects."""
        jobs = dict(self.jobs)
        for job_id, placement in placements.items():
            job = jobs.get(job_id)
            if job is not None:
                jobs[job_id] = _placed(job, placement)
        for job in self.running_jobs():
            if job.job_id not in placements:
                jobs[job.job_id] = _placed(job, {})
        return replace(self, jobs=jobs)

    def restricted(self, job_ids: Iterable[str], cache_capacity_bytes: int, remote_io_bytes_per_sec: float) -> Snapshot:
        """A partition of the cluster: only `job_ids`, their datasets, and the given storage capacities.

        Nodes (GPUs) are kept whole; partitions split storage, not compute.
        """
        wanted = set(job_ids)
        jobs = {job_id: job for job_id, job in self.jobs.items() if job_id in wanted}
        uris = {job.dataset_uri for job in jobs.values()}
        datasets = {uri: ds for uri, ds in self.datasets.items() if uri in uris}
        return replace(
            self,
            jobs=jobs,
            datasets=datasets,
            cache_capacity_bytes=cache_capacity_bytes,
            remote_io_bytes_per_sec=remote_io_bytes_per_sec,
        )


def _placed(job: JobState, placement: Mapping[str, int]) -> JobState:
    """`job` on `placement`: the same object when it is already there (most jobs, most rounds)."""
    if placement is job.placement or job.placement == placement:
        return job
    return job._replace(placement=MappingProxyType(dict(placement)))


_submission_order = attrgetter("submit_time", "job_id")  # a job's (submit time, id); a C call, not a Python one


def _in_submission_order(jobs: tuple[JobState, ...]) -> bool:
    """Whether `jobs` already run in submission order (ties by id), so that sorting them would change nothing.

    The simulator hands its jobs over in arrival order, which is submission order but for ties, and
    `with_placements` keeps the order it was given: checking costs one pass of comparisons, where sorting
    builds a key tuple per job and was a twentieth of a HiveD run, whose queue holds some 2,000 jobs. The
    fields are read by index (1: `submit_time`, 0: `job_id`), which compiles to a tuple lookup."""
    for index in range(1, len(jobs)):
        before, after = jobs[index - 1], jobs[index]
        if before[1] > after[1] or (before[1] == after[1] and before[0] > after[0]):
            return False
    return True
