"""Plain-text tables for `silod status` and the `show` commands."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from datamgr.defaults import EXTERNAL_POLICY
from datamgr.scheduler.perf import hit_ratio
from silodlib.control_chars import escape_control_chars
from silodlib.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; `(none)` under the header when there are no rows. A cell's
    control characters are shown escaped (`\\n`, `\\x1b`): a free-text label (a trace's tenant or class) holding
    a line break would otherwise split its row, and an escape sequence would reach the terminal."""
    cells = [[escape_control_chars(str(c)) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if not cells:
        lines.append("(none)")
    return "\n".join(lines)


def summary_line(summary: pb.ClusterSummary) -> str:
    limit = summary.remote_io_limit_bytes_per_sec
    io = format_rate(summary.remote_io_allocated_bytes_per_sec)
    io_of = f"{io} of {format_rate(limit)}" if limit else f"{io} (no limit)"
    if limit and summary.remote_io_allocated_bytes_per_sec > limit:  # a limit lowered at a restart
        io_of += " (over the limit: lower the allocations)"
    return (
        f"revision {summary.revision} | {summary.dataset_count} datasets, {summary.job_count} jobs, "
        f"{summary.node_count} nodes ({summary.nodes_available} available) | remote IO {io_of} | "
        f"cache quota {format_size(summary.cache_allocated_bytes)} of {format_size(summary.cache_capacity_bytes)}"
    )


def controller_line(controller: pb.ControllerStatus) -> str:
    """Who allocates, and what the policy's last round did."""
    if controller.policy in ("", EXTERNAL_POLICY):  # "": a data manager older than the controller
        return "allocations: external (AllocateCacheSize / AllocateRemoteIO callers such as silod alloc)"
    line = f"allocations: policy {controller.policy}, a round at least every {controller.round_seconds:g}s"
    if not controller.rounds:
        return line + " | no round yet"
    line += (
        f" | round {controller.rounds} {controller.seconds_since_last_round:.0f}s ago "
        f"({controller.last_round_trigger}): {controller.last_round_changes} changes, "
        f"cache budget {format_size(controller.cache_budget_bytes)}/node"
    )
    for refusal in controller.last_round_refusals:
        line += f"\n  refused, retried next round: {refusal}"
    if controller.last_round_error:
        line += f"\n  round failed, retried next round: {controller.last_round_error}"
    return line


def estimate_line(job: pb.Job) -> str:
    """The estimator inputs the policy chose for a job and the throughput it expected."""
    e = job.estimate
    return (
        f"expected by round {e.round}: f* {format_rate(e.ideal_bytes_per_sec)}, cache {format_size(e.cache_bytes)} "
        f"of {format_size(e.dataset_bytes)} (c/d {hit_ratio(e.cache_bytes, e.dataset_bytes):.2f}), "
        f"remote IO {format_rate(e.io_bytes_per_sec)} -> {format_rate(e.throughput_bytes_per_sec)}"
    )


def datasets_table(datasets: Sequence[pb.Dataset]) -> str:
    rows = [
        (
            d.uri,
            format_size(d.size_bytes),
            d.file_count,
            d.item_count,
            format_size(d.cache_quota_bytes),
            cached_per_node_text(d),
            ",".join(d.job_ids) or "-",
        )
        for d in datasets
    ]
    return render_table(("DATASET", "SIZE", "FILES", "ITEMS", "QUOTA/NODE", "CACHED/NODE", "JOBS"), rows)


def cached_per_node_text(dataset: pb.Dataset) -> str:
    """What the nodes that reported the dataset cache, each, beside its per-node quota: one size where they agree,
    else the least and the most ("48.8 KiB..97.7 KiB"); their sum once stood there, above the quota and the size."""
    cached = sorted({u.cached_bytes for u in dataset.usage}) or [0]
    least, most = format_size(cached[0]), format_size(cached[-1])
    return least if least == most else f"{least}..{most}"


def epochs_text(job: pb.Job) -> str:
    """How long the job trains, as registered: `0.07`, `90`; `-` when its registration did not say."""
    return f"{job.epochs:g}" if job.epochs else "-"


def access_text(job: pb.Job) -> str:
    """`irregular` for a job registered as such (SiloDPerf does not describe it), else `uniform`."""
    return "irregular" if job.irregular else "uniform"


def training_text(job: pb.Job) -> str:
    """What a job's registration said about its training, as a phrase: `0.07 epochs, irregular access`."""
    length = f"{job.epochs:g} epochs" if job.epochs else "length unknown"
    return f"{length}, {access_text(job)} access"


CLASS_NAMES = {pb.JOB_CLASS_TRIAL_AND_ERROR: "te", pb.JOB_CLASS_BEST_EFFORT: "be", pb.JOB_CLASS_UNSPECIFIED: "be"}


def class_text(job: pb.Job) -> str:
    """`te` (trial-and-error) or `be` (best-effort; also from a data manager that does not say)."""
    return CLASS_NAMES.get(job.job_class, "-")


def gpu_hours_text(gpu_seconds: float) -> str:
    """GPU time in hours, three significant digits below 1,000 and whole hours from there ("1,520", where "%.3g"
    writes "1.52e+03")."""
    hours = gpu_seconds / 3600
    return f"{hours:.3g}" if hours < 999.5 else f"{hours:,.0f}"


def duration_text(seconds: float) -> str:
    """A duration as `--grace-period` takes one, in the largest unit that keeps it whole: `90s`, `3m`, `1h`;
    `-` for none."""
    if seconds <= 0:
        return "-"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def class_phrase(job: pb.Job) -> str:
    """The class and grace period a job registered, as a phrase: `trial-and-error`, `best-effort, 3m grace`."""
    name = "trial-and-error" if class_text(job) == "te" else "best-effort"
    return f"{name}, {duration_text(job.grace_seconds)} grace" if job.grace_seconds else name


PHASE_NAMES = {
    pb.JOB_PHASE_PENDING: "pending",
    pb.JOB_PHASE_RUNNING: "running",
    pb.JOB_PHASE_PREEMPTED: "preempted",
    pb.JOB_PHASE_SUSPENDING: "suspending",
}


def phase_text(job: pb.Job) -> str:
    """`running`, `pending`, `preempted`, or `suspending until HH:MM:SS UTC` for a job preempted with a grace
    period that still holds its GPUs; `-` from a data manager that does not say."""
    name = PHASE_NAMES.get(job.schedule.phase, "-")
    if job.schedule.phase == pb.JOB_PHASE_SUSPENDING:
        return f"{name} until {time.strftime('%H:%M:%S UTC', time.gmtime(job.schedule.suspended_until))}"
    return name


def suspending_line(job: pb.Job) -> str | None:
    """For a suspending job, what it holds and until when; None for any other."""
    if job.schedule.phase != pb.JOB_PHASE_SUSPENDING:
        return None
    held = ",".join(f"{w.node_id}:{w.count}" for w in job.schedule.held) or "nothing"
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(job.schedule.suspended_until))
    return f"suspending through its grace period: holds {held} until {until}, then waits to resume"


PRIORITY_NAMES = {pb.JOB_PRIORITY_HIGH: "high", pb.JOB_PRIORITY_LOW: "low", pb.JOB_PRIORITY_UNSPECIFIED: "high"}


def priority_text(job: pb.Job) -> str:
    """`high` (regular; also from a data manager that does not say) or `low` (preemptible)."""
    return PRIORITY_NAMES.get(job.priority, "-")


def tenant_phrase(job: pb.Job) -> str:
    """The tenant and priority a job registered, as a phrase: `tenant prod-a, high priority`, `no tenant, low
    priority (preemptible)`."""
    owner = f"tenant {job.tenant}" if job.tenant else "no tenant"
    priority = priority_text(job)
    return f"{owner}, {priority} priority" + (" (preemptible)" if priority == "low" else "")


def cells_text(cells: Mapping[str, int]) -> str:
    """A VC's cells as `silod tenant add --cells` takes them: `node=2,gpu=1`."""
    return ",".join(f"{level}={count}" for level, count in sorted(cells.items())) or "-"


def vc_text(tenant: pb.Tenant) -> str:
    """A tenant's VC as a phrase: `cells node=2 (4 GPUs), cache 1.8 TiB, remote IO 400.0 MB/s`."""
    gpus = f" ({tenant.vc_gpus} GPUs)" if tenant.vc_gpus else ""
    return (
        f"cells {cells_text(tenant.cells)}{gpus}, cache {format_size(tenant.cache_bytes)}, "
        f"remote IO {format_rate(tenant.io_bytes_per_sec)}"
    )


def tenants_table(tenants: Sequence[pb.Tenant]) -> str:
    """One row per tenant: its VC (cells, their GPUs, `-` while the data manager cannot size them, storage) and
    what its jobs use now: GPUs of its regular and of its low-priority (preemptible) running jobs, and its jobs
    waiting for the policy."""
    rows = [
        (
            t.name,
            cells_text(t.cells),
            t.vc_gpus or "-",
            format_size(t.cache_bytes),
            format_rate(t.io_bytes_per_sec),
            t.regular_gpus,
            t.low_priority_gpus,
            t.jobs_queued,
            len(t.job_ids),
        )
        for t in tenants
    ]
    headers = ("TENANT", "CELLS", "VC GPUS", "CACHE", "REMOTE IO", "REGULAR GPUS", "LOW-PRI GPUS", "QUEUED", "JOBS")
    return render_table(headers, rows)


def queue_text(job: pb.Job) -> str:
    """The queue the policy keeps the job in, numbered from 1 as the papers do (its policy state's `queue`,
    which Tiresias counts from 0); `-` if none."""
    queue = job.schedule.policy_state.get("queue")
    return "-" if queue is None else f"{queue + 1:g}"


def workers_text(job: pb.Job) -> str:
    placed = ",".join(f"{w.node_id}:{w.count}" for w in job.workers)
    return f"{placed or 'none'} (of {job.gpus})" if job.gpus else placed


def jobs_table(jobs: Sequence[pb.Job]) -> str:
    """One row per job: its registration (class, grace period, tenant and priority included), allocation, where it
    stands with the policy (state, queue, GPU-hours attained, preemptions) and what the policy expects of it."""
    rows = [
        (
            j.job_id,
            j.dataset_uri,
            format_rate(j.ideal_bytes_per_sec),
            epochs_text(j),
            access_text(j),
            class_text(j),
            duration_text(j.grace_seconds),
            j.tenant or "-",
            priority_text(j),
            format_rate(j.io_bytes_per_sec),
            workers_text(j),
            phase_text(j),
            queue_text(j),
            gpu_hours_text(j.schedule.attained_gpu_seconds),
            j.schedule.preemptions,
            read_text(j),
            format_rate(j.estimate.throughput_bytes_per_sec) if j.HasField("estimate") else "-",
        )
        for j in jobs
    ]
    headers = (
        "JOB",
        "DATASET",
        "IDEAL",
        "EPOCHS",
        "ACCESS",
        "CLASS",
        "GRACE",
        "TENANT",
        "PRIORITY",
        "REMOTE IO",
        "WORKERS",
        "STATE",
        "QUEUE",
        "GPU-H",
        "PREEMPTED",
        "READ",
        "EXPECTED",
    )
    return render_table(headers, rows)


def unopened_lines(datasets: Sequence[pb.Dataset], jobs: Sequence[pb.Job]) -> str:
    """A line under the jobs table for each dataset a node reports it cannot open (`DatasetUsage.open_error`), naming
    the node, the dataset, the jobs that wait for it there and the node's reason: those jobs show as running, their
    workers placed, while their directories are missing on that node. "" when every node opens its datasets."""
    lines = []
    for dataset in datasets:
        for usage in dataset.usage:
            if not usage.open_error:
                continue
            waiting = [
                j.job_id
                for j in jobs
                if j.dataset_uri == dataset.uri and any(w.node_id == usage.node_id for w in j.workers)
            ]
            line = f"  node {usage.node_id} cannot open {dataset.uri}{_waiting_text(waiting)}: {usage.open_error}"
            lines.append(escape_control_chars(line))
    return "".join(f"\n{line}" for line in lines)


def stale_options_lines(datasets: Sequence[pb.Dataset]) -> str:
    """A line under the datasets table for each dataset a node reads with its previous options, since it cannot open
    the ones last set (`DatasetUsage.options_error`): its jobs read on, with credentials that may be about to expire.
    "" when every node reads with the options last set."""
    lines = [
        f"  node {usage.node_id} reads {dataset.uri} with its previous options, since it cannot open the ones last "
        f"set: {usage.options_error}"
        for dataset in datasets
        for usage in dataset.usage
        if usage.options_error
    ]
    return "".join(f"\n{escape_control_chars(line)}" for line in lines)


def usage_problem(usage: pb.DatasetUsage) -> str:
    """What keeps a node from serving a dataset as set, as its report says (`silod dataset show`); "-" for nothing."""
    if usage.open_error:
        return f"cannot open it: {usage.open_error}"
    if usage.options_error:
        return f"reads with its previous options, since it cannot open the ones last set: {usage.options_error}"
    return "-"


def _waiting_text(job_ids: Sequence[str]) -> str:
    """`, so job j1 waits there`, `, so jobs j1, j2 wait there`; "" for none (a report older than the job's end)."""
    if len(job_ids) == 1:
        return f", so job {job_ids[0]} waits there"
    return f", so jobs {', '.join(job_ids)} wait there" if job_ids else ""


def nodes_table(nodes: Sequence[pb.Node]) -> str:
    rows = [
        (
            n.node_id,
            n.address,
            n.gpus,
            format_size(n.cache_capacity_bytes),
            format_size(n.cache_allocated_bytes),
            "available" if n.available else f"unavailable ({n.seconds_since_seen:.0f}s silent)",
            agent_text(n),
            ",".join(n.job_ids) or "-",
        )
        for n in nodes
    ]
    return render_table(("NODE", "ADDRESS", "GPUS", "CACHE", "QUOTA", "STATE", "AGENT", "JOBS"), rows)


def agent_text(node: pb.Node) -> str:
    """Where the agent serving the node calls from ("-": no agent's watch stream is open): the host and port of
    its stream, which tell two agents started with one --node-id apart."""
    if not node.HasField("agent"):
        return "-"
    peer = node.agent.peer
    scheme, _, address = peer.partition(":")
    return address if scheme in ("ipv4", "ipv6") and address else peer or "unknown address"


def read_text(job: pb.Job) -> str:
    """What the job has read in all its runs, and the reads that failed when some did (`1.2 GB`, `0 B, 40 failed (40
    denied)`): the summary's one sign of a job whose storage refuses its reads, running and counting epochs all the
    same. The data manager's count, which a preemption does not reset; from an older data manager, which has none,
    what its nodes report of their current run, as `silod job show` gives them per node. Failed reads are the
    nodes' counts since their agents started."""
    read = format_size(job.bytes_read if job.HasField("bytes_read") else sum(u.bytes_read for u in job.usage))
    failed = sum(u.failed_reads for u in job.usage)
    if not failed:
        return read
    denied = sum(u.denied_reads for u in job.usage)
    return f"{read}, {failed} failed" + (f" ({denied} denied)" if denied else "")


def failed_reads_text(usage: pb.JobUsage) -> str:
    """`0`, `12`, or `12 (12 denied)` when storage refused some: a job whose credentials expired fails every read
    its cache cannot serve, while its node stays available and its epochs go on."""
    if not usage.denied_reads:
        return str(usage.failed_reads)
    return f"{usage.failed_reads} ({usage.denied_reads} denied)"
