"""How the data manager writes jobs, placements and tenants' VCs in its messages and change log.

One place for these forms, so that a refusal, the change log and the commands an operator types back
(`silod job add --workers`, `silod tenant add --cells`) all spell a value the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from datamgr.entities import HIGH_PRIORITY, Job, Tenant, Worker
from silodlib.units import format_rate, format_size


def workers_text(workers: Sequence[Worker]) -> str:
    """Workers as `--workers` takes them: `node-0:2,node-1:2`."""
    return ",".join(f"{w.node_id}:{w.count}" for w in workers)


def placement_text(placement: Mapping[str, int]) -> str:
    """A placement (node -> GPUs) in the workers' form, nodes in order."""
    return ",".join(f"{node_id}:{gpus}" for node_id, gpus in sorted(placement.items()))


def vc_text(tenant: Tenant) -> str:
    """A tenant's VC as `silod tenant add` takes it: `cells node=2, cache 1.9 TiB, remote IO 400.0 MB/s`."""
    cells = ",".join(f"{level}={count}" for level, count in sorted(tenant.cells.items()))
    return f"cells {cells}, cache {format_size(tenant.cache_bytes)}, remote IO {format_rate(tenant.io_bytes_per_sec)}"


def job_parameter(job: Job, name: str) -> str:
    """One registered parameter of a job, written as a registration gives it, and one it left out as left out (no
    tenant: `none`; no epochs: `unknown`; no grace period: `none`), not as the 0 that stands for it: "registered with
    epochs 2, not epochs unknown" tells an operator who re-ran a command without --epochs what happened."""
    if name == "workers":
        return workers_text(job.workers)
    if name == "tenant":
        return job.tenant or "none"
    if name == "epochs":
        return f"{job.epochs:g}" if job.epochs else "unknown"
    if name == "grace_seconds":
        return f"{job.grace_seconds:g} s" if job.grace_seconds else "none"
    return str(getattr(job, name))


def time_text(wall_time: float | None) -> str:
    """A wall-clock time for messages and the change log: UTC, to the second."""
    if wall_time is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_time))


def describe_job(job: Job) -> str:
    """A registered job for the change log: id, dataset, workers, and what it said about its training."""
    length = f"{job.epochs:g} epochs" if job.epochs else "length unknown"
    access = ", irregular access" if job.irregular else ""
    grace = f", {job.grace_seconds:g} s grace period" if job.grace_seconds else ""
    grace += f", tenant {job.tenant}" if job.tenant else ""
    grace += f", {job.priority} priority" if job.priority != HIGH_PRIORITY else ""
    where = f"waiting for {job.gpus} GPUs" if job.placed_by_policy else f"with workers {workers_text(job.workers)}"
    return f"{job.job_id} on {job.dataset_uri} {where} ({length}{access}, class {job.job_class}{grace})"


def vcs_of(tenants: Sequence[str]) -> str:
    """Whose VCs a message is about: `the VC of tenant a`, `the VCs of tenants a, b`."""
    if len(tenants) == 1:
        return f"the VC of tenant {tenants[0]}"
    return f"the VCs of tenants {', '.join(tenants)}"
