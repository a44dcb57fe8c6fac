"""Harmony's scheduling algorithm (its section IV-B3, B4): which jobs to co-locate and on how many machines, pure.

**Algorithm 1** (`schedule`). Over the candidate jobs in order (running, then paused, then profiled, each by
arrival), it considers the first k for k = 1, 2, ...: it picks the number of groups n_G* that balances CPU and
network use, groups the k jobs (`group_jobs`), gives the groups machines (`colocation.assign_machines`), and
keeps going while the cluster utilisation U (Eq. 4) improves. The jobs beyond the chosen k wait.

*When to stop* is where silod departs from the letter. The paper stops at the first k that does not improve U.
With the greedy grouping U is not monotone in k (one more job can reshuffle every group), and on `harmony-80`
stopping at the first dip ran 11 of 80 jobs at U_cpu 0.74, where U reaches 1.0 with more jobs (the paper: 27
jobs at once on average, 93 % CPU). silod evaluates every k and keeps the smallest whose U is within 5 % of
the best found: the paper's own rule for preferring fewer jobs ("selects the grouping decision with smaller
number of jobs, if the performance improvement of decisions with more number of jobs is less than 5 %").

**n_G*.** With every group on M / n machines, each job's COMP takes C_j n / M (Eq. 2), so the groups' summed
COMP and COMM balance when sum_j C_j n / M = sum_j T_net_j / n ... per group, i.e. n = M sum T_net / sum C.
Harmony says only that n_G* "balances the CPU and network usage the most"; silod tries the two whole numbers
around that ratio (within 1 and min(k, M)) and keeps the one whose grouping gives the better U.

**Grouping.** The paper: sort the jobs by iteration time, fill the groups one by one from the sorted list
"in a greedy manner to balance resource use" (jobs of similar iteration time together, against job-bound
groups), then swap jobs between the most imbalanced group and the most complementary one while a swap
lowers both groups' imbalance. Where it is silent, silod chooses:
- *Group sizes*: as even as the count allows ("assigns jobs J evenly"), larger groups first.
- *Greedy fill*: a group opens with the longest job left and then takes, one at a time, whichever of the
  next `size` jobs of the sorted list (those of nearly its iteration time) leaves the group's summed COMP and
  COMM closest.
- *Imbalance* of a group: |U_cpu - U_net| at the equal DoP M / n; the *most complementary* group to one that
  is CPU-heavy is the most network-heavy (and the reverse). A swap is made when it lowers the two groups'
  summed imbalance; the fine-tuning ends when the most imbalanced group has no complementary group or no
  such swap. Every swap lowers the total imbalance, so it ends.

**Regrouping** (`on_arrival`, `replacement_for`, `choose_regroup`): the 5 % thresholds of section IV-B4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from datamgr.scheduler.colocation import (
    Group,
    JobProfile,
    Utilisation,
    assign_machines,
    cluster_utilisation,
    resource_times,
)

# Harmony's one threshold (section IV-B4): jobs are "similar" within 5 %, a regrouping with more jobs must beat
# one with fewer by 5 %, and no regrouping is done for an expected benefit under 5 % of U.
THRESHOLD = 0.05


def group_count(jobs: Sequence[JobProfile], machines: int) -> float:
    """The real-valued n that balances the jobs' summed COMP and their COMM with every group on machines / n
    machines (see the module's docstring)."""
    cpu = sum(job.cpu_machine_seconds for job in jobs)
    return machines * sum(job.net_seconds for job in jobs) / cpu


def candidate_counts(jobs: Sequence[JobProfile], machines: int) -> list[int]:
    """The whole numbers of groups worth trying: those around `group_count`, within 1 and min(jobs, machines)."""
    top = min(len(jobs), machines)
    ideal = group_count(jobs, machines)
    counts = {min(top, max(1, math.floor(ideal))), min(top, max(1, math.ceil(ideal)))}
    return sorted(counts)


@dataclass(frozen=True, slots=True)
class _Terms:
    """One job's (or a group's summed) terms of Eq. 1 at the equal DoP the grouping assumes: the grouping
    compares thousands of candidate groups, so each job's terms are worked out once and added up."""

    cpu: float
    net: float
    longest: float

    def __add__(self, other: _Terms) -> _Terms:
        return _Terms(self.cpu + other.cpu, self.net + other.net, max(self.longest, other.longest))

    @property
    def lean(self) -> float:
        """> 0 for a group whose COMP outweighs its COMM, < 0 for the reverse, relative to T_g: U_cpu - U_net."""
        return (self.cpu - self.net) / max(self.cpu, self.net, self.longest)

    @property
    def imbalance(self) -> float:
        """|U_cpu - U_net|."""
        return abs(self.lean)


_NOTHING = _Terms(0.0, 0.0, 0.0)


def _terms(job: JobProfile, dop: float) -> _Terms:
    return _Terms(job.cpu_seconds(dop), job.net_seconds, job.iteration_seconds(dop))


def _total(terms: Sequence[_Terms]) -> _Terms:
    total = _NOTHING
    for term in terms:
        total = total + term
    return total


def group_sizes(jobs: int, groups: int) -> list[int]:
    """`jobs` split into `groups` counts as even as can be, the larger ones first."""
    base, extra = divmod(jobs, groups)
    return [base + 1 if index < extra else base for index in range(groups)]


def fill_groups(jobs: Sequence[JobProfile], groups: int, machines: int) -> list[list[JobProfile]]:
    """The greedy fill: the jobs sorted by their own iteration at the equal DoP, longest first (ties by id),
    each group opened with the longest left and topped up from the next few to balance COMP and COMM."""
    dop = machines / groups
    left = sorted(((job, _terms(job, dop)) for job in jobs), key=lambda entry: (-entry[1].longest, entry[0].job_id))
    filled: list[list[JobProfile]] = []
    for size in group_sizes(len(jobs), groups):
        first, tally = left.pop(0)
        group = [first]
        while len(group) < size:
            window = left[:size]
            best = min(range(len(window)), key=lambda index: (tally + window[index][1]).imbalance)
            job, terms = left.pop(best)
            group.append(job)
            tally = tally + terms
        filled.append(group)
    return filled


def fine_tune(groups: list[list[JobProfile]], dop: float) -> list[list[JobProfile]]:
    """Swaps between the most imbalanced group and its most complementary one while a swap helps (module
    docstring). Returns new lists; `groups` is left as it was."""
    terms = {job.job_id: _terms(job, dop) for group in groups for job in group}
    groups = [list(group) for group in groups]
    while len(groups) > 1:
        leans = [_total([terms[job.job_id] for job in group]).lean for group in groups]
        worst = max(range(len(groups)), key=lambda index: (abs(leans[index]), -index))
        others = [index for index in range(len(groups)) if leans[index] * leans[worst] < 0]
        if not others:
            break
        partner = max(others, key=lambda index: (abs(leans[index]), -index))
        first = [terms[job.job_id] for job in groups[worst]]
        second = [terms[job.job_id] for job in groups[partner]]
        swap = _best_swap(first, second)
        if swap is None:
            break
        a, b = swap
        groups[worst][a], groups[partner][b] = groups[partner][b], groups[worst][a]
    return groups


def _best_swap(first: Sequence[_Terms], second: Sequence[_Terms]) -> tuple[int, int] | None:
    """The pair (index in `first`, index in `second`) whose swap lowers the two groups' summed imbalance the
    most, or None when none lowers it."""
    first_total, second_total = _total(first), _total(second)
    now = first_total.imbalance + second_total.imbalance
    first_rest, second_rest = _longest_without(first), _longest_without(second)
    best: tuple[float, int, int] | None = None
    for a, out_a in enumerate(first):
        for b, out_b in enumerate(second):
            after_first = _Terms(
                first_total.cpu - out_a.cpu + out_b.cpu,
                first_total.net - out_a.net + out_b.net,
                max(first_rest[a], out_b.longest),
            )
            after_second = _Terms(
                second_total.cpu - out_b.cpu + out_a.cpu,
                second_total.net - out_b.net + out_a.net,
                max(second_rest[b], out_a.longest),
            )
            after = after_first.imbalance + after_second.imbalance
            if after < now - 1e-12 and (best is None or after < best[0]):
                best = (after, a, b)
    return None if best is None else (best[1], best[2])


def _longest_without(terms: Sequence[_Terms]) -> list[float]:
    """For each index, the longest own iteration among the other jobs (0 for a group of one)."""
    prefix = [0.0]
    for term in terms:
        prefix.append(max(prefix[-1], term.longest))
    suffix = [0.0]
    for term in reversed(terms):
        suffix.append(max(suffix[-1], term.longest))
    suffix.reverse()
    return [max(prefix[index], suffix[index + 1]) for index in range(len(terms))]


def group_jobs(jobs: Sequence[JobProfile], groups: int, machines: int) -> list[Group]:
    """The grouping algorithm (L7) and the machine distribution (L8) for `groups` groups on `machines`."""
    job_groups = fine_tune(fill_groups(jobs, groups, machines), machines / groups)
    counts = assign_machines(job_groups, machines)
    return [Group(tuple(members), count) for members, count in zip(job_groups, counts, strict=True)]


def best_grouping(jobs: Sequence[JobProfile], machines: int) -> list[Group]:
    """`group_jobs` at whichever of the `candidate_counts` gives the better U (the fewer groups on a tie)."""
    best: list[Group] | None = None
    for count in candidate_counts(jobs, machines):
        grouping = group_jobs(jobs, count, machines)
        if best is None or cluster_utilisation(grouping).better_than(cluster_utilisation(best)):
            best = grouping
    assert best is not None  # candidate_counts is never empty
    return best


@dataclass(frozen=True, slots=True)
class Schedule:
    """What Algorithm 1 chose: the groups to run and their U; every candidate job not in a group waits."""

    groups: tuple[Group, ...]
    utilisation: Utilisation

    @property
    def job_ids(self) -> frozenset[str]:
        return frozenset(job_id for group in self.groups for job_id in group.job_ids)


def schedule(candidates: Sequence[JobProfile], machines: int) -> Schedule:
    """Algorithm 1 over `candidates` in their order (module docstring): the fewest leading jobs whose grouping's
    U is within 5 % of the best any number of them reaches. No candidates: no groups."""
    if machines < 1:
        raise ValueError(f"Harmony needs at least one machine, not {machines}")
    options = []
    for count in range(1, len(candidates) + 1):
        grouping = best_grouping(candidates[:count], machines)
        options.append(Schedule(tuple(grouping), cluster_utilisation(grouping)))
    if not options:
        return Schedule((), Utilisation(0.0, 0.0))
    best = options[0]
    for option in options[1:]:
        if option.utilisation.better_than(best.utilisation):
            best = option
    return next(option for option in options if best.utilisation.gain_over(option.utilisation) < THRESHOLD)


def similar(first: Sequence[JobProfile], second: Sequence[JobProfile], machines: int) -> bool:
    """Harmony's test for replacing a finished job (section IV-B4): the summed iteration times, and the ratios
    of summed COMP to summed COMM, differ by at most 5 %, at the group's DoP."""
    a, b = resource_times(first, machines), resource_times(second, machines)
    time_a = sum(job.iteration_seconds(machines) for job in first)
    time_b = sum(job.iteration_seconds(machines) for job in second)
    return _within(time_a, time_b) and _within(_ratio(a.cpu, a.net), _ratio(b.cpu, b.net))


def _ratio(cpu: float, net: float) -> float:
    return cpu / net if net > 0 else float("inf")


def _within(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= THRESHOLD * max(abs(a), abs(b))


def replacement_for(
    finished: JobProfile, waiting: Sequence[JobProfile], machines: int
) -> tuple[JobProfile, ...] | None:
    """The waiting jobs to put in a finished job's place (section IV-B4), or None: the first single job similar
    to it, else the first pair "with equivalent characteristics" (silod reads Harmony's "bunch of jobs" as two;
    larger bunches are not searched). Order is `waiting`'s."""
    for job in waiting:
        if similar([job], [finished], machines):
            return (job,)
    for index, first in enumerate(waiting):
        for second in waiting[index + 1 :]:
            if similar([first, second], [finished], machines):
                return (first, second)
    return None


def best_addition(groups: Sequence[Group], job: JobProfile) -> int | None:
    """Which group a newly profiled job should join (section IV-B4 (1)): the one that maximises U, if U then
    beats today's by the 5 % threshold; None: the job waits."""
    now = cluster_utilisation(groups)
    best: tuple[Utilisation, int] | None = None
    for index, group in enumerate(groups):
        trial = [*groups[:index], Group((*group.jobs, job), group.machines), *groups[index + 1 :]]
        utilisation = cluster_utilisation(trial)
        if best is None or utilisation.better_than(best[0]):
            best = (utilisation, index)
    if best is None or best[0].gain_over(now) < THRESHOLD:
        return None
    return best[1]


def choose_regroup(options: Sequence[Schedule], now: Utilisation) -> Schedule | None:
    """Among regroupings involving more and more jobs (`options`, fewest jobs first), the one to apply: a
    regrouping with more jobs replaces the one with fewer only when it is 5 % better, and none is applied
    whose expected benefit is under 5 % of today's U (section IV-B4)."""
    chosen: Schedule | None = None
    for option in options:
        if chosen is None or option.utilisation.gain_over(chosen.utilisation) >= THRESHOLD:
            chosen = option
    if chosen is None or chosen.utilisation.gain_over(now) < THRESHOLD:
        return None
    return chosen
