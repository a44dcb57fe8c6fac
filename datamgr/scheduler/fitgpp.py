"""Which best-effort jobs to preempt for a trial-and-error job: FitGpp's rule and its baselines' (pure).

FitGpp (Fitting Grace Period Preemption) runs two classes of single-node jobs: TE (trial-and-error, short,
latency-sensitive) and BE (best-effort, long). When a TE job finds no node with room, running BE jobs are
preempted; a preempted job keeps its resources for its grace period (GP) while it suspends, then frees them.
The paper's rule (its Eqs. 1-4):

    Size(D)  = sqrt((C / C_cap)^2 + (R / R_cap)^2 + (G / G_cap)^2)            demand over its node's capacity
    Score(j) = Size(D_j) / max Size + s x GP_j / max GP                       over the running BE jobs
    j*       = argmin { Score(j) | D_TE <= D_j + N_j  and  preemptions_j < P }

where N_j is what is unallocated on j's node, and s = 4, P = 1 by default. One victim that frees enough on
its own node, small and quick to suspend, and never a job preempted P times already. When no running BE job
qualifies the paper preempts "a random BE job"; here random BE jobs are preempted until some node has room,
as the baselines do, and only among jobs preempted fewer than P times: the paper calls P a guarantee that no
BE job starves, which a fallback ignoring it would break. With every GP zero the
GP term is 0 rather than 0/0 (all jobs rewind alike). Scores depend on ratios only, so they do not change
with the units demands are given in.

The baselines preempt until some node has room for the TE job, in their own order: LRTP the running BE job
with the longest remaining time first (with perfect knowledge), RAND at random. P bounds them too (the caller
passes only jobs below it): the paper's Table 3 reports them "when P = 1", and preempts more distinct jobs
there than with P infinite (Table 4), as a limit spreading preemptions would. The grace period is not part
of the choice here: the driver keeps a victim's resources until its GP has passed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import NamedTuple


class Resources(NamedTuple):
    """A demand or an amount free: CPUs, RAM bytes, GPUs, and remote IO in bytes/s where a rule weighs it
    (FitGpp-SiloD; 0 otherwise). IO is the cluster's, not a node's: a node's `io` is what the whole cluster
    has left."""

    cpus: float
    ram_bytes: float
    gpus: float
    io: float = 0.0

    def plus(self, other: Resources) -> Resources:
        """Element-wise sum (a tuple's `+` concatenates)."""
        return Resources(*(mine + theirs for mine, theirs in zip(self, other, strict=True)))

    def minus(self, other: Resources) -> Resources:
        return Resources(*(mine - theirs for mine, theirs in zip(self, other, strict=True)))

    def meet(self, other: Resources) -> Resources:
        """Element-wise minimum: what both leave room for."""
        return Resources(*(min(mine, theirs) for mine, theirs in zip(self, other, strict=True)))

    def covers(self, demand: Resources) -> bool:
        """Element-wise `demand <= self` (the paper's Eq. 2)."""
        return all(wanted <= has for wanted, has in zip(demand, self, strict=True))


class RunningBe(NamedTuple):
    """A running BE job as the preemption rules see it."""

    job_id: str
    node: str
    demand: Resources
    grace_seconds: float
    preemptions: int
    remaining_seconds: float  # LRTP's perfect knowledge; FitGpp never reads it


def size(demand: Resources, capacity: Resources) -> float:
    """Eq. 1: the demand as a length in units of its node's capacity (remote IO in units of the cluster's)."""
    return math.sqrt(sum(_share(amount, of) ** 2 for amount, of in zip(demand, capacity, strict=True)))


def _share(amount: float, capacity: float) -> float:
    """`amount` over `capacity`; 0 for a resource not weighed (a capacity of 0 or infinity)."""
    return amount / capacity if 0 < capacity < math.inf else 0.0


def best_fit(demand: Resources, room: Mapping[str, Resources], capacity: Mapping[str, Resources]) -> str | None:
    """The node with room for `demand` that it leaves least room on (by Eq. 1's size, ties by node id), or
    None. The papers do not say how FitGpp's FIFO picks a node; best fit keeps large holes for large jobs."""
    fitting = [node for node, free in room.items() if free.covers(demand)]
    if not fitting:
        return None
    return min(fitting, key=lambda node: (size(room[node].minus(demand), capacity[node]), node))


def scores(running: Sequence[RunningBe], capacity: Mapping[str, Resources], s: float) -> dict[str, float]:
    """Eq. 3 for every running BE job: its size and its grace period, each over the largest of them."""
    sizes = {job.job_id: size(job.demand, capacity[job.node]) for job in running}
    largest_size = max(sizes.values(), default=0.0)
    longest_grace = max((job.grace_seconds for job in running), default=0.0)
    return {
        job.job_id: (sizes[job.job_id] / largest_size if largest_size > 0 else 0.0)
        + (s * job.grace_seconds / longest_grace if longest_grace > 0 else 0.0)
        for job in running
    }


def best_victim(
    te_demand: Resources,
    running: Sequence[RunningBe],
    free: Mapping[str, Resources],
    capacity: Mapping[str, Resources],
    *,
    s: float = 4.0,
    limit: float = 1,
) -> str | None:
    """Eq. 4: the running BE job of lowest score (Eq. 3, over all of `running`, the jobs at the limit
    included) that frees enough on its own node and was preempted fewer than `limit` times; None if none."""
    score = scores(running, capacity, s)
    qualifying = [
        job for job in running if job.preemptions < limit and free[job.node].plus(job.demand).covers(te_demand)
    ]
    if not qualifying:
        return None
    return min(qualifying, key=lambda job: (score[job.job_id], job.job_id)).job_id


def fitgpp_victims(
    te_demand: Resources,
    running: Sequence[RunningBe],
    free: Mapping[str, Resources],
    capacity: Mapping[str, Resources],
    *,
    s: float = 4.0,
    limit: float = 1,
    rng: random.Random,
) -> list[str]:
    """The BE jobs FitGpp preempts to make room for a TE job of `te_demand`, given what is `free` per node:
    the one of Eq. 4, or (none qualifying) random ones below the limit until it fits; [] if nothing could
    make room."""
    chosen = best_victim(te_demand, running, free, capacity, s=s, limit=limit)
    if chosen is not None:
        return [chosen]
    return rand_victims(te_demand, [job for job in running if job.preemptions < limit], free, rng=rng)


def victims_until_fit(te_demand: Resources, ordered: Sequence[RunningBe], free: Mapping[str, Resources]) -> list[str]:
    """Preempt `ordered` jobs in turn until some node has room for the TE job; [] if even all of them would not
    make room (then preempting any would only hurt)."""
    room = dict(free)
    victims: list[str] = []
    for job in ordered:
        if job.demand.io:  # the cluster's IO, free for a job on any node
            room = {node: left._replace(io=left.io + job.demand.io) for node, left in room.items()}
        room[job.node] = room[job.node].plus(job.demand._replace(io=0.0))
        victims.append(job.job_id)
        if room[job.node].covers(te_demand):
            return victims
    return []


def lrtp_victims(te_demand: Resources, running: Sequence[RunningBe], free: Mapping[str, Resources]) -> list[str]:
    """LRTP (Big-C's rule): the longest remaining time first, until the TE job fits (ties by id)."""
    ordered = sorted(running, key=lambda job: (-job.remaining_seconds, job.job_id))
    return victims_until_fit(te_demand, ordered, free)


def rand_victims(
    te_demand: Resources, running: Sequence[RunningBe], free: Mapping[str, Resources], *, rng: random.Random
) -> list[str]:
    """RAND: running BE jobs in random order until the TE job fits (`rng` seeded by the snapshot's seed)."""
    ordered = sorted(running, key=lambda job: job.job_id)
    rng.shuffle(ordered)
    return victims_until_fit(te_demand, ordered, free)
