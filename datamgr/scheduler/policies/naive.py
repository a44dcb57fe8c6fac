"""`naive`: Harmony's "naively co-located" baseline (its section V-A), as a co-location policy.

"The naively co-located baseline naively shares resources between the co-located jobs", the approach of
Gandiva, "which has no fine coordination between co-located jobs and an analytical basis for job grouping".
Two things set it apart from Harmony, and silod models both:

- *Grouping without a model.* Jobs are paired in arrival order, as Gandiva packs two jobs where one ran: a
  job starts on its own machines at the isolated baseline's DoP (`isolated.isolated_dop`) when they are idle,
  and otherwise joins a running group of one job, whatever its resource use: the one whose machines are
  closest to its own DoP, keeping that group's machines. The paper ran "all possible" pairings and reported
  their average, best and worst; silod runs this one.
- *Contention instead of pipelining.* Without subtasks each job runs its own iterations at its own pace, and
  its COMP and COMM phases collide at random with the others' phases of the same kind, sharing the resource
  while they do (processor sharing). silod models that with mean-field contention: job j's phase on resource
  r is stretched by 1 plus the share of time the other jobs of its group use r,
      T_j = sum_r t_jr (1 + sum_{k != j} t_kr / T_k),
  solved by fixed-point iteration, and then, as a resource cannot be more than busy, every T_j is scaled up by
  the largest sum_j t_jr / T_j above 1 (two CPU-only jobs then take 2x as long, as processor sharing gives).
  No knob: it is the expected collision of independent phases, not a fitted number. Unlike Harmony's groups
  a short-iteration job does not wait for a long one; it is only slowed by it.
"""

from __future__ import annotations

from collections.abc import Sequence

from datamgr.scheduler.colocation import JobProfile
from datamgr.scheduler.colocation_storage import ObliviousStorage
from datamgr.scheduler.colocation_view import JobView, PlannedGroup, View
from datamgr.scheduler.policies.isolated import start_first_fit

GROUP_SIZE = 2  # Gandiva packs two jobs


class NaivePolicy(ObliviousStorage):
    """Pairs of jobs co-located in arrival order, contending (module docstring)."""

    name = "naive"

    def job_iteration_seconds(self, jobs: Sequence[JobProfile], machines: int) -> list[float]:
        return contended_iterations(jobs, machines)

    def plan(self, view: View) -> list[PlannedGroup]:
        return start_first_fit(view, join_a_single_job)


def join_a_single_job(planned: list[PlannedGroup], job: JobView, dop: int) -> None:
    """Puts `job` in the running group of one job whose machines are closest to its own DoP, if there is one."""
    open_groups = [i for i, group in enumerate(planned) if len(group.job_ids) < GROUP_SIZE]
    if open_groups:
        index = min(open_groups, key=lambda i: (abs(planned[i].machines - dop), i))
        group = planned[index]
        planned[index] = PlannedGroup(group.key, (*group.job_ids, job.job_id), group.machines)


def contended_iterations(jobs: Sequence[JobProfile], machines: int, rounds: int = 200) -> list[float]:
    """Each job's iteration under mean-field contention (module docstring). `rounds` bounds the fixed-point
    iteration, which converges to 1e-12 relative within a few dozen rounds for groups of a few jobs."""
    phases = [(job.cpu_seconds(machines), job.net_seconds) for job in jobs]
    times = [sum(phase) for phase in phases]
    for _ in range(rounds):
        shares = [[phase[r] / time for r in range(2)] for phase, time in zip(phases, times, strict=True)]
        totals = [sum(share[r] for share in shares) for r in range(2)]
        updated = [
            sum(phase[r] * (1 + totals[r] - share[r]) for r in range(2))
            for phase, share in zip(phases, shares, strict=True)
        ]
        converged = all(abs(new - old) <= 1e-12 * old for new, old in zip(updated, times, strict=True))
        times = updated
        if converged:
            break
    busiest = max(sum(phase[r] / time for phase, time in zip(phases, times, strict=True)) for r in range(2))
    # remote loading is prefetched at the job's own IO rate, as under Harmony (colocation.py)
    return [max(time * max(1.0, busiest), job.load_seconds) for time, job in zip(times, jobs, strict=True)]


def naive_policy() -> NaivePolicy:
    return NaivePolicy()
