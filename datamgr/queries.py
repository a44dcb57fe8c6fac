"""What the data manager's read-only calls answer: its state and the nodes' soft state rendered as messages.

Kept apart from `manager` (which changes state) and from `convert` (which maps one entity to one message):
each function here gathers what a message needs from the state and from liveness, then renders it, and a
listing that can outgrow one message (`ListJobs`) is cut into pages.
"""

from __future__ import annotations

import base64
import binascii
import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import Message

from datamgr import convert, lifecycle, tenants
from datamgr.entities import LOW_PRIORITY, InvalidArgument, Job
from datamgr.manager import DataManager
from datamgr.scheduler.snapshot import OPPORTUNISTIC
from silodpb.v1 import datamgr_pb2 as pb


def cluster_summary(manager: DataManager) -> pb.ClusterSummary:
    state, nodes = manager.state, manager.state.nodes
    return pb.ClusterSummary(
        revision=state.revision,
        dataset_count=len(state.datasets),
        job_count=len(state.jobs),
        node_count=len(nodes),
        nodes_available=sum(manager.liveness.available(n) for n in nodes),
        remote_io_limit_bytes_per_sec=manager.remote_io_limit or 0,
        remote_io_allocated_bytes_per_sec=state.io_allocated_bytes_per_sec,
        cache_capacity_bytes=sum(n.cache_capacity_bytes for n in nodes.values()),
        cache_allocated_bytes=sum(state.node_cache_allocated(n) for n in nodes),
        cell_levels=manager.cell_levels,
        tenant_count=len(state.tenants),
    )


def dataset_info(manager: DataManager, uri: str) -> pb.Dataset:
    dataset = manager.dataset("uri", uri)
    return convert.dataset_message(
        dataset, manager.state.jobs_of_dataset(dataset.uri), manager.liveness.dataset_usage(dataset.uri)
    )


def job_info(manager: DataManager, job_id: str) -> pb.Job:
    job = manager.job(job_id)
    schedule = convert.job_schedule(job, manager.history(job_id), manager.wall_clock())
    return convert.job_message(job, manager.liveness.job_usage(job_id), schedule, manager.bytes_read(job_id))


def node_info(manager: DataManager, node_id: str) -> pb.Node:
    node = manager.node("node_id", node_id)
    return convert.node_message(
        node,
        cache_allocated=manager.state.node_cache_allocated(node_id),
        available=manager.liveness.available(node_id),
        seconds_since_seen=manager.liveness.seconds_since_seen(node_id),
        job_ids=manager.state.jobs_on_node(node_id),
        start_grace=manager.liveness.in_start_grace(node_id),
        agent=manager.node_agents.holder(node_id),
    )


def list_datasets(manager: DataManager) -> list[pb.Dataset]:
    return [dataset_info(manager, uri) for uri in sorted(manager.state.datasets)]


def list_nodes(manager: DataManager) -> list[pb.Node]:
    return [node_info(manager, node_id) for node_id in sorted(manager.state.nodes)]


def list_tenants(manager: DataManager) -> list[pb.Tenant]:
    by_tenant: dict[str, list[str]] = {}
    for job_id, job in sorted(manager.state.jobs.items()):  # one pass, however many tenants
        if job.tenant:
            by_tenant.setdefault(job.tenant, []).append(job_id)
    return [_tenant_message(manager, name, by_tenant.get(name, [])) for name in sorted(manager.state.tenants)]


def tenant_info(manager: DataManager, name: str) -> pb.Tenant:
    return _tenant_message(manager, manager.tenant("name", name).name, manager.state.jobs_of_tenant(name))


def _tenant_message(manager: DataManager, name: str, job_ids: list[str]) -> pb.Tenant:
    """The tenant's VC with what its jobs (`job_ids`) use now: GPUs of its running regular and low-priority jobs,
    and its jobs waiting for the policy to place them."""
    tenant = manager.state.tenants[name]
    gpus_per_cell = tenants.cell_gpus(manager.cell_levels, manager.state.nodes.values())
    message = convert.tenant_message(tenant, tenants.vc_gpus(tenant, gpus_per_cell))
    for job_id in job_ids:
        job = manager.state.jobs[job_id]
        message.job_ids.append(job_id)
        held = sum(w.count for w in job.workers)
        if held and _preemptible(manager, job):
            message.low_priority_gpus += held
        elif held:
            message.regular_gpus += held
        elif job.placed_by_policy and lifecycle.phase(job, manager.history(job_id)) != lifecycle.Phase.SUSPENDING:
            message.jobs_queued += 1
    return message


def _preemptible(manager: DataManager, job: Job) -> bool:
    """Whether a running job runs preemptibly: registered low priority, or a regular job that the policy runs as
    a low-priority one because its tenant's VC is full (HiveD's overflow marks it in its policy state)."""
    state = lifecycle.policy_state_of(manager.history(job.job_id), manager.policy or "")
    return job.priority == LOW_PRIORITY or state.get(OPPORTUNISTIC) == 1.0


# ---- pages of a listing (Google's AIP-158) ----

# At most MAX_PAGE_SIZE entries, and a page ends once it holds PAGE_BYTES, half gRPC's default 4 MiB limit on a
# message, so that any client reads one (the entry that takes a page past it is rarely large).
MAX_PAGE_SIZE = 5_000
PAGE_BYTES = 2 * 1024 * 1024

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Page:
    """The page of a listing a call asks for: at most `size` entries (0: all of them, as before pages) whose keys
    follow `after` ("": from the first)."""

    size: int
    after: str


def page(page_size: int, page_token: str) -> Page:
    """The page that `page_size` and `page_token` ask for; a size over MAX_PAGE_SIZE counts as that (AIP-158)."""
    if page_size < 0:
        raise InvalidArgument(f"page_size {page_size} must not be negative (0: every entry in one answer)")
    return Page(min(page_size, MAX_PAGE_SIZE), _key_after(page_token))


def page_of(keys: Sequence[str], wanted: Page, render: Callable[[str], M]) -> tuple[list[M], str]:
    """The entries of the sorted `keys` that `wanted` asks for, each rendered, and the token of the page after them
    ("": none). A page of a size ends early once it holds PAGE_BYTES, after the entry that took it there."""
    start = bisect.bisect_right(keys, wanted.after)
    stop = start + wanted.size if wanted.size else len(keys)
    entries: list[M] = []
    held = 0
    for key in keys[start:stop]:
        entries.append(render(key))
        held += entries[-1].ByteSize()
        if wanted.size and held >= PAGE_BYTES:
            break
    end = start + len(entries)
    return entries, _token_after(keys[end - 1]) if wanted.size and end < len(keys) else ""


def _token_after(key: str) -> str:
    """The page token of the entries after `key`: the key itself, encoded, so that a token outlives restarts and
    the entries that come and go between pages. Opaque to clients all the same, to leave its form free."""
    return base64.urlsafe_b64encode(key.encode()).decode()


def _key_after(token: str) -> str:
    if not token:
        return ""
    try:
        return base64.b64decode(token, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        shown = repr(token) if len(token) <= 200 else f"of {len(token):,} characters"
        raise InvalidArgument(
            f"page_token {shown} is not one this data manager gave: send a next_page_token back as it came, "
            "or none for the first page"
        ) from None
