"""Plain-text tables for `silod status` and the `show` commands."""

from __future__ import annotations

from collections.abc import Sequence

from datamgr.units import format_rate, format_size
from silodpb.v1 import datamgr_pb2 as pb


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; `(none)` under the header when there are no rows."""
    cells = [[str(c) for c in row] for row in rows]
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
    return (
        f"revision {summary.revision} | {summary.dataset_count} datasets, {summary.job_count} jobs, "
        f"{summary.node_count} nodes ({summary.nodes_available} available) | remote IO {io_of} | "
        f"cache quota {format_size(summary.cache_allocated_bytes)} of {format_size(summary.cache_capacity_bytes)}"
    )


def datasets_table(datasets: Sequence[pb.Dataset]) -> str:
    rows = [
        (
            d.uri,
            format_size(d.size_bytes),
            d.file_count,
            d.item_count,
            format_size(d.cache_quota_bytes),
            format_size(sum(u.cached_bytes for u in d.usage)),
            ",".join(d.job_ids) or "-",
        )
        for d in datasets
    ]
    return render_table(("DATASET", "SIZE", "FILES", "ITEMS", "QUOTA/NODE", "CACHED", "JOBS"), rows)


def jobs_table(jobs: Sequence[pb.Job]) -> str:
    rows = [
        (
            j.job_id,
            j.dataset_uri,
            format_rate(j.ideal_bytes_per_sec),
            format_rate(j.io_bytes_per_sec),
            ",".join(f"{w.node_id}:{w.count}" for w in j.workers),
            format_size(sum(u.bytes_read for u in j.usage)),
        )
        for j in jobs
    ]
    return render_table(("JOB", "DATASET", "IDEAL", "REMOTE IO", "WORKERS", "READ"), rows)


def nodes_table(nodes: Sequence[pb.Node]) -> str:
    rows = [
        (
            n.node_id,
            n.address,
            format_size(n.cache_capacity_bytes),
            format_size(n.cache_allocated_bytes),
            "available" if n.available else f"unavailable ({n.seconds_since_seen:.0f}s silent)",
            ",".join(n.job_ids) or "-",
        )
        for n in nodes
    ]
    return render_table(("NODE", "ADDRESS", "CACHE", "QUOTA", "STATE", "JOBS"), rows)
