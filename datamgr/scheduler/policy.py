"""The policy interface: `schedule(snapshot, estimator) -> Decision`, pure and deterministic.

A decision has a compute part (GPU placements) and a storage part (cache bytes per dataset, remote IO per
job). A policy may leave either part undecided (`None`) for another policy to fill in:
`registry.FilledIn` pairs a policy with a compute and a storage policy, which is how every scheduler x
cache-system pair of the paper is built (FIFO compute + SiloD's greedy storage, vanilla Gavel + an
Alluxio-style cache, ...).

Policies import nothing from I/O code: the simulator and the live controller both hand them snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.snapshot import Snapshot

Placements = Mapping[str, Mapping[str, int]]  # job -> node -> GPUs


@dataclass(frozen=True, slots=True)
class Decision:
    """One round's allocation.

    `placements` lists every job that should hold GPUs after the round (a running job left out is
    preempted). `cache_bytes` is the cache quota per dataset, shared by all its jobs; `job_cache_bytes` is
    cache private to one job (CoorDL-style copies), counted against the same capacity. `notes` carries the
    estimator inputs and outputs the policy based its choice on, for logs and `silod status`.
    """

    placements: Placements | None = None
    cache_bytes: Mapping[str, int] | None = None
    io_bytes_per_sec: Mapping[str, int] | None = None
    job_cache_bytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    notes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def decides_compute(self) -> bool:
        return self.placements is not None

    @property
    def decides_storage(self) -> bool:
        return self.cache_bytes is not None and self.io_bytes_per_sec is not None


class Policy(Protocol):
    """A scheduling policy. `schedule` must not mutate the snapshot and must return the same decision for
    the same snapshot and estimator (randomness only from `snapshot.seed`)."""

    @property
    def name(self) -> str:
        """The name the policy is registered and reported under."""
        ...

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision: ...


def current_placements(snapshot: Snapshot) -> dict[str, Mapping[str, int]]:
    """The placements the snapshot already has: what a storage-only policy leaves compute at."""
    return {job.job_id: job.placement for job in snapshot.running_jobs()}
