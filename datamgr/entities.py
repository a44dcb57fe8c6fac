"""The data manager's entities and the errors its operations raise.

Entities are immutable values: an accepted change replaces them whole, which keeps undo, persistence and
the per-node diffs simple. Errors carry the class of failure; the gRPC layer maps each to a status code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field, fields


class DataManagerError(Exception):
    """A rejected call: nothing was changed. The message names the field and the rule."""

    # A tag for refusals a client acts on without reading the message (sent as the trailing metadata
    # `silod-refusal`: REFUSAL_KEY): a node agent stops for these rather than wait, as it waits out a state disk
    # that refuses writes, whose status code is the same. "": none.
    refusal = ""


REFUSAL_KEY = "silod-refusal"


class InvalidArgument(DataManagerError):
    """The request is malformed whatever the state."""


class NotFound(DataManagerError):
    """The request names a dataset, job, node or tenant that is not registered."""


class AlreadyExists(DataManagerError):
    """The request registers an id that exists with different parameters."""


class FailedPrecondition(DataManagerError):
    """The request is well-formed but the current state does not allow it (capacity, limits, users)."""


class PermissionDenied(DataManagerError):
    """The storage backend refused the data manager's credentials."""


class Unavailable(DataManagerError):
    """The storage backend could not be reached; the same call may succeed later."""


class ResourceExhausted(DataManagerError):
    """The data manager has no room to record the change (its state disk is full). Retrying does not help
    until an operator frees space; then the same call succeeds, without a restart."""


class StateDiskUnwritable(DataManagerError):
    """The data manager's state disk refuses writes (read-only, or I/O errors), so it can record no change.
    Retrying does not help until an operator repairs the disk; calls that only read are still served."""


class StateDiskUnreadable(DataManagerError):
    """The data manager's state disk fails a read of what only the disk holds (a dataset's manifest): I/O errors
    or damaged pages. Retrying helps only if the fault was transient; an operator should repair the disk."""


@dataclass(frozen=True, slots=True)
class Dataset:
    """A registered dataset: its frozen manifest's summary and its per-node cache quota."""

    uri: str
    options: Mapping[str, str]
    size_bytes: int
    file_count: int
    item_count: int
    chunk_size_bytes: int
    manifest_digest: str
    cache_quota_bytes: int = 0

    def registration_differences(self, options: Mapping[str, str], chunk_size_bytes: int) -> list[str]:
        """What a repeated RegisterDataset asks for that this dataset is not registered with, in words (none: the
        call is idempotent). Options are named by key only, since their values may be secrets. A chunk size of 0 (the
        call asks for none: `silod dataset add` without --chunk-size) matches any: the default applies to a dataset
        registered by this call, and a repeated command must not be refused for a flag it left out."""
        differences = []
        if chunk_size_bytes and self.chunk_size_bytes != chunk_size_bytes:
            differences.append(f"with chunk size {self.chunk_size_bytes}, not {chunk_size_bytes}")
        changed = {key for key in options.keys() & self.options.keys() if options[key] != self.options[key]}
        for what, keys in (
            ("without option", options.keys() - self.options.keys()),
            ("with option", self.options.keys() - options.keys()),
            ("with another value of option", changed),
        ):
            differences.extend(f"{what} {key!r}" for key in sorted(keys))
        return differences


@dataclass(frozen=True, slots=True)
class Worker:
    """`count` workers of a job run on `node_id`."""

    node_id: str
    count: int


TRIAL_AND_ERROR = "te"  # short and latency-sensitive: a policy may preempt best-effort jobs for it (FitGpp)
BEST_EFFORT = "be"  # long; may be preempted for trial-and-error jobs
JOB_CLASSES = (TRIAL_AND_ERROR, BEST_EFFORT)

HIGH_PRIORITY = "high"  # regular: runs in its tenant's virtual cluster, which guarantees it (HiveD)
LOW_PRIORITY = "low"  # preemptible: runs on GPUs no tenant's regular job needs now
PRIORITIES = (HIGH_PRIORITY, LOW_PRIORITY)


@dataclass(frozen=True, slots=True)
class Job:
    """A training job reading one dataset, with its remote IO allocation.

    `epochs` (passes over the dataset, 0 when unknown) and `irregular` (its access is not uniform once per
    epoch) are what the job's registration tells a policy about it: how much work is left, and whether
    SiloDPerf describes it.

    A job is placed one of two ways. Registered with its `workers` (`gpus` 0), it runs where whoever registered
    it put it, from registration to finish. Registered with `gpus` instead, the data manager's policy places it:
    `workers` is then the policy's latest placement (none while it waits), not part of its registration.

    `job_class` (`TRIAL_AND_ERROR` or `BEST_EFFORT`) and `grace_seconds` are what policies such as FitGpp tell
    jobs apart by: a trial-and-error job may preempt best-effort ones, and a job the policy preempts keeps its
    GPUs for its grace period (it suspends, `JobHistory.suspended_until`) before they go to another job.

    `tenant` (a registered `Tenant`, or "" for none) and `priority` (`HIGH_PRIORITY` or `LOW_PRIORITY`) are
    what policies that share the cluster among tenants (HiveD) place it by: a regular job in its tenant's
    virtual cluster, a low-priority one preemptibly on GPUs nobody's guarantee needs.
    """

    job_id: str
    dataset_uri: str
    ideal_bytes_per_sec: int
    workers: tuple[Worker, ...]
    io_bytes_per_sec: int = 0
    _: KW_ONLY
    epochs: float = 0.0
    irregular: bool = False
    gpus: int = 0  # the GPUs it asks the policy for; 0: placed by whoever registered it (`workers`)
    job_class: str = BEST_EFFORT  # or TRIAL_AND_ERROR
    grace_seconds: float = 0.0  # how long it keeps its GPUs, suspending, once the policy preempts it
    tenant: str = ""  # the tenant it belongs to; "": none
    priority: str = HIGH_PRIORITY  # or LOW_PRIORITY

    @property
    def placed_by_policy(self) -> bool:
        return self.gpus > 0

    def registration_differences(self, other: Job) -> list[str]:
        """The registered parameters (every field but the id and the allocation, and the workers of a job the
        policy places) in which `other` differs from this job: a repeated RegisterJob is idempotent when there
        are none."""
        unregistered = (
            ("job_id", "io_bytes_per_sec", "workers") if self.placed_by_policy else ("job_id", "io_bytes_per_sec")
        )
        return [
            f.name
            for f in fields(self)
            if f.name not in unregistered and getattr(self, f.name) != getattr(other, f.name)
        ]

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(w.node_id for w in self.workers)

    def node_rates(self) -> dict[str, int]:
        """The job's rate split equally among its workers and summed per node.

        Shares are whole bytes/s and add up exactly to the job's rate: the remainder of the integer
        division goes, one byte/s each, to the nodes in worker order, so no node is ever short by more
        than one byte/s of its exact share.
        """
        total_workers = sum(w.count for w in self.workers)
        shares = {w.node_id: self.io_bytes_per_sec * w.count // total_workers for w in self.workers}
        remainder = self.io_bytes_per_sec - sum(shares.values())
        for worker in self.workers[:remainder]:
            shares[worker.node_id] += 1
        return shares


@dataclass(frozen=True, slots=True)
class Node:
    """A FUSE client host and the local cache space it offers."""

    node_id: str
    address: str
    cache_capacity_bytes: int
    gpus: int = 0  # the GPUs the policy may place jobs on; 0: none (it runs registered workers only)


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant sharing the cluster, and its virtual cluster (HiveD's VC): the cells it is guaranteed, per level
    of the data manager's cell hierarchy by level name ({"node": 2}), and the cache bytes and remote IO bytes/s
    reserved for its jobs. Its jobs name it (`Job.tenant`), so it cannot go while it has any."""

    name: str
    cells: Mapping[str, int]
    cache_bytes: int = 0
    io_bytes_per_sec: int = 0

    def same_registration(self, other: Tenant) -> bool:
        """Whether a repeated RegisterTenant asks for exactly this tenant (then it is idempotent)."""
        return (dict(self.cells), self.cache_bytes, self.io_bytes_per_sec) == (
            dict(other.cells),
            other.cache_bytes,
            other.io_bytes_per_sec,
        )


@dataclass(frozen=True, slots=True)
class JobHistory:
    """A job's scheduling history: what a preemptive policy's snapshot needs (`JobState`'s fields of the same
    names) and what it handed back last round (`policy_state`). Kept with the job and persisted with it, so a
    restarted data manager ranks its jobs as before: times are seconds since the Unix epoch, not a monotonic
    clock. Attained service is `attained_gpu_seconds_before` plus the GPUs held since `last_start_time` while
    the job runs (`datamgr.lifecycle`), so the record changes only when the job starts or stops, or its
    policy state changes, not as time passes.

    A job preempted with a grace period suspends: it holds `held` (node -> GPUs, the placement it was preempted
    from) until `suspended_until`, when the data manager releases them; both are persisted, so a restart
    neither loses the hold nor ends it early.

    What the job has read is `bytes_read_before` plus what the nodes of its current placement have reported of
    their run of it (`DataManager.bytes_read`): a node counts a job's reads from when it mounts the job, so the
    counts of the nodes a job leaves (a preemption, a suspension, a migration) are banked here as it leaves them,
    and a job's progress survives its preemption, its resumption elsewhere and a restart."""

    job_id: str
    submit_time: float
    first_start_time: float | None = None
    last_start_time: float | None = None
    pending_since: float | None = None  # None while it runs
    queued_seconds_before: float = 0.0  # waited before `pending_since`
    attained_gpu_seconds_before: float = 0.0  # GPU time held before `last_start_time` (all of it while stopped)
    preemptions: int = 0
    policy_state: Mapping[str, float] = field(default_factory=dict)
    # The policy that handed `policy_state` back: a state dir outlives a policy (`--policy` may change at any
    # restart), and one policy's state means nothing to another. "" in a history written before it was kept.
    policy_state_by: str = ""
    held: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs still held while it suspends
    suspended_until: float | None = None  # when its grace period ends; None unless it suspends
    bytes_read_before: int = 0  # what it read on nodes it has since left, banked at each stop and migration

    @property
    def suspending(self) -> bool:
        return self.suspended_until is not None


@dataclass(frozen=True, slots=True)
class NodeJobView:
    """What one node enforces for one job: the node's share of the job's rate."""

    job: Job
    workers: int
    io_bytes_per_sec: int


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node's whole slice of the allocations; watch events are diffs between two of these."""

    datasets: Mapping[str, Dataset] = field(default_factory=dict)
    jobs: Mapping[str, NodeJobView] = field(default_factory=dict)
