"""`isolated`: Harmony's baseline of dedicated machines per job (its section V-A), as a co-location policy.

"The isolated baseline allocates disjoint sets of resources for each distinct job ... we try to maximize the
CPU utilization rates, as it determines the actual training progress of each job, by reducing the network
overheads" (as Optimus and SLAQ do). A job alone alternates COMP (C / m at DoP m, Eq. 2) and COMM (T_net), so
its speed is 1 / (C/m + T_net) and its CPU utilisation (C/m) / (C/m + T_net): more machines make it faster
and its CPU idler. silod gives each job the DoP that maximises their product, speed times CPU utilisation,
(C/m) / (C/m + T_net)^2, whose maximum is at C/m = T_net: the DoP at which its computation takes as long as its
communication (of the two whole numbers around C / T_net, the better; at least 1, at most the cluster). The
paper gives no formula; this is the point past which a machine buys less speed than it wastes CPU.

Jobs start in arrival order, each as soon as its DoP fits the idle machines; a job that does not fit lets a
later one that does go first (first fit, silod's choice; with every job of `harmony-80` submitted at once,
strict FIFO would leave machines idle behind a wide job). A running job keeps its machines to its finish.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from datamgr.scheduler.colocation import JobProfile, group_iteration_seconds
from datamgr.scheduler.colocation_storage import ObliviousStorage
from datamgr.scheduler.colocation_view import JobView, PlannedGroup, View


def isolated_dop(job: JobProfile, machines: int) -> int:
    """The DoP the isolated baseline runs `job` at on a cluster of `machines` (module docstring)."""
    if job.net_seconds == 0:
        return machines  # never waits on the network: every machine is pure speed-up

    def score(dop: int) -> float:
        cpu = job.cpu_seconds(dop)
        return cpu / (cpu + job.net_seconds) ** 2

    ideal = job.cpu_machine_seconds / job.net_seconds
    options = {min(machines, max(1, math.floor(ideal))), min(machines, max(1, math.ceil(ideal)))}
    return max(sorted(options), key=score)


class IsolatedPolicy(ObliviousStorage):
    """Each job alone on its own machines, at `isolated_dop`."""

    name = "isolated"

    def job_iteration_seconds(self, jobs: Sequence[JobProfile], machines: int) -> list[float]:
        return [group_iteration_seconds(jobs, machines)] * len(jobs)

    def plan(self, view: View) -> list[PlannedGroup]:
        return start_first_fit(view)


# What to do with a queued job whose DoP does not fit the idle machines: change `planned` in place, or not.
Unfit = Callable[[list[PlannedGroup], JobView, int], None]


def start_first_fit(view: View, unfit: Unfit | None = None) -> list[PlannedGroup]:
    """The running groups kept as they are, and the queued jobs in arrival order, each started alone at its
    `isolated_dop` where that fits the idle machines, else handed to `unfit` (if given) with its DoP."""
    planned = [PlannedGroup(group.key, group.job_ids, group.machines) for group in view.groups]
    idle = view.idle_machines()
    queued = sorted((job for job in view.jobs.values() if job.group is None), key=lambda job: (job.arrival, job.job_id))
    for job in queued:
        dop = isolated_dop(job.profile, view.machines)
        if dop <= idle:
            planned.append(PlannedGroup(None, (job.job_id,), dop))
            idle -= dop
        elif unfit is not None:
            unfit(planned, job, dop)
    return planned


def isolated_policy() -> IsolatedPolicy:
    return IsolatedPolicy()
