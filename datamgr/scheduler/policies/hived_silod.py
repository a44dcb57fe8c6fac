"""`hived-silod`: HiveD's compute with storage guarantees per tenant.

Compute is HiveD's (`policies/hived.py`, mode "hived"): each tenant's jobs run in its VC's cells, the rest on
idle cells at low priority. Storage is `tenant_storage.TenantStorage` over the jobs that run after that
decision: each tenant gets the cache and remote IO its VC reserves whenever its running jobs can use them,
SiloD's greedy allocation runs inside each tenant's share, and idle shares are lent to the others and taken
back the round their owner needs them. So the guarantee HiveD gives a tenant's GPUs covers the data that feeds
them too: another tenant's scans cannot evict its cache or take its remote IO (the shared-cache anomaly,
`docs/hived.md`).
"""

from __future__ import annotations

from dataclasses import dataclass

from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policies.hived import HivedConfig, HivedScheduler
from datamgr.scheduler.policies.options import PolicyOptions, takes_keys
from datamgr.scheduler.policy import Decision, MergedNotes, current_placements
from datamgr.scheduler.snapshot import Snapshot
from datamgr.scheduler.tenant_storage import TenantStorage


@dataclass(frozen=True)
class HivedSiloD:
    """HiveD's placements (`compute`) with each tenant's storage share (`storage`) for the jobs they run."""

    name: str
    compute: HivedScheduler
    storage: TenantStorage

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        compute = self.compute.schedule(snapshot, estimator)
        placements = compute.placements if compute.placements is not None else current_placements(snapshot)
        storage = self.storage.schedule(snapshot.with_placements(placements), estimator)
        return Decision(
            placements=placements,
            cache_bytes=storage.cache_bytes,
            io_bytes_per_sec=storage.io_bytes_per_sec,
            job_cache_bytes=storage.job_cache_bytes,
            notes=MergedNotes(compute.notes, storage.notes),
            job_states=compute.job_states,
            wake_at=compute.wake_at,
        )


@takes_keys("overflow")
def hived_silod(options: PolicyOptions | None = None) -> HivedSiloD:
    """HiveD (knob `overflow`, as `hived` takes it) with storage guarantees per tenant."""
    config = HivedConfig.from_options(options or {})
    return HivedSiloD("hived-silod", HivedScheduler("hived-silod", "hived", config), TenantStorage())
