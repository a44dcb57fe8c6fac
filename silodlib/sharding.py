"""How a job's items are dealt among its nodes: one rule for the node that tracks its share of each pass and
the data manager that reads the nodes' progress through it."""

from __future__ import annotations


def pass_share(node_workers: int, job_workers: int) -> float:
    """The part of a job's items one node reads each pass: its workers over all of the job's, as PyTorch's
    DistributedSampler deals the items to ranks; all of them when either count is not known (0)."""
    if node_workers <= 0 or job_workers <= 0:
        return 1.0
    return min(1.0, node_workers / job_workers)
