"""The policy interface: `schedule(snapshot, estimator) -> Decision`, pure and deterministic.

A decision has a compute part (GPU placements) and a storage part (cache bytes per dataset, remote IO per
job). A policy may leave either part undecided (`None`) for another policy to fill in:
`registry.FilledIn` pairs a policy with a compute and a storage policy, which is how every scheduler x
cache-system pair of the paper is built (FIFO compute + SiloD's greedy storage, vanilla Gavel + an
Alluxio-style cache, ...).

Policies import nothing from I/O code: the simulator and the live controller both hand them snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.snapshot import Snapshot

Placements = Mapping[str, Mapping[str, int]]  # job -> node -> GPUs

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Decision:
    """One round's allocation.

    `placements` lists every job that should hold GPUs after the round, each on all the GPUs it asks for (a
    running job left out is preempted). `cache_bytes` is the cache quota per dataset, shared by all its jobs;
    `job_cache_bytes` is cache private to one job (CoorDL-style copies), counted against the same capacity.
    `notes` carries the estimator inputs and outputs the policy based its choice on, for logs and `silod
    status`.

    What a policy remembers between rounds it hands back here rather than keeping in itself, so that it stays
    pure and the driver can persist, show and replay it: `job_states` is the new state of each job it names
    (`JobState.policy_state` in the next snapshot; jobs it leaves out keep theirs), and `wake_at` the time of
    the next round it needs whatever else happens (a demotion, a promotion, a grace period's end).
    """

    placements: Placements | None = None
    cache_bytes: Mapping[str, int] | None = None
    io_bytes_per_sec: Mapping[str, int] | None = None
    job_cache_bytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    notes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    job_states: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))
    wake_at: float | None = None

    @property
    def decides_compute(self) -> bool:
        return self.placements is not None

    @property
    def decides_storage(self) -> bool:
        return self.cache_bytes is not None and self.io_bytes_per_sec is not None


class Policy(Protocol):
    """A scheduling policy. `schedule` must not mutate the snapshot and must return the same decision for
    the same snapshot and estimator (randomness only from `snapshot.seed`).

    A round-based policy (one that decides on a fixed period, as Gavel does) also declares `round_seconds`,
    a class attribute: the simulator then runs its rounds every that many seconds only (`registry.Scheduler`).
    """

    @property
    def name(self) -> str:
        """The name the policy is registered and reported under."""
        ...

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision: ...


class LazyNotes(Mapping[str, str], Generic[T]):
    """Notes written out only when read: `describe(values[key])` for each key of `values`.

    A round's notes are read only when something logs or shows them (the simulator's decision log, `silod
    status`); in most rounds nothing does, and formatting a line per job every round was a measurable share
    of a simulated month. `values` must not change and `describe` must be pure, so reading the notes gives
    what formatting them at once would have.
    """

    __slots__ = ("_describe", "_values")

    def __init__(self, values: Mapping[str, T], describe: Callable[[T], str]) -> None:
        self._values = values
        self._describe = describe

    def __getitem__(self, key: str) -> str:
        return self._describe(self._values[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class MergedNotes(Mapping[str, str]):
    """`{**first, **second, ...}` that reads no note until asked (so `LazyNotes` stay unformatted): a key's
    note comes from the last mapping that has it, keys in the order they first appear."""

    __slots__ = ("_notes",)

    def __init__(self, *notes: Mapping[str, str]) -> None:
        self._notes = notes

    def __getitem__(self, key: str) -> str:
        for notes in reversed(self._notes):
            if key in notes:
                return notes[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(key for notes in self._notes for key in notes))

    def __len__(self) -> int:
        return len(dict.fromkeys(key for notes in self._notes for key in notes))


def current_placements(snapshot: Snapshot) -> dict[str, Mapping[str, int]]:
    """The placements the snapshot already has: what a storage-only policy leaves compute at."""
    return {job.job_id: job.placement for job in snapshot.running_jobs()}
