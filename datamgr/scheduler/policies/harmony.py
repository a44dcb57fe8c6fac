"""`harmony`: Harmony's dynamic grouping of co-located jobs (its section IV-B), as a co-location policy.

Each round handles what triggered it, in the paper's order, touching as few jobs as it can:

1. **End of profiling.** A newly profiled job leaves its profiling group. If it is the only job waiting, it
   joins the group that maximises U, when that gains 5 %, else it waits; if others wait, it waits too ("the
   existence of those jobs means that Harmony already satisfies with the currently running jobs"). When it
   waits, the running groups are regrouped with the waiting jobs as after a finish (step 2), under the same
   5 % rules. The paper regroups only at finishes; taken literally, on `harmony-80` with arrivals 2 minutes
   apart, the first jobs' group held all 100 machines for 2.5 hours while up to 72 jobs waited, nothing
   finishing to trigger a regrouping. silod reads "Harmony does not perform regrouping when the expected
   benefit is less than 5 % of U" as applying at every round, not at finishes alone.
2. **A finish.** The finished job's group takes a similar waiting job (or a similar pair) in its place
   (`harmony.replacement_for`). Failing that, the group is regrouped with Algorithm 1 over its jobs and the
   waiting ones, then with the group of fewest jobs added, then the next, ...; the option with more jobs wins
   only when 5 % better, and none is applied whose benefit is under 5 % of U (`harmony.choose_regroup`).
3. **Idle machines** (a group emptied, or the cluster just started) are regrouped the same way, together with
   the waiting jobs: a machine is never left idle while a profiled job waits and Algorithm 1 would run it.
4. **Arrivals** are profiled: a new job joins the group with the fewest machines ("deploying to a job group
   with the smallest number of machines or a job group that is already profiling an another new job"); with
   idle machines it starts a profiling group on them instead (silod's choice: the paper does not say what an
   idle cluster does), which is how `harmony-80`'s 80 jobs, submitted at once, are profiled together.

A regrouping keeps a group's key (so its jobs do not move) when the new group is the old one's best match
(most jobs in common) on the same machines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from datamgr.scheduler import harmony
from datamgr.scheduler.colocation import Group, JobProfile, cluster_utilisation, group_iteration_seconds
from datamgr.scheduler.colocation_storage import DataNeed, StorageShare, fair_storage, silod_storage
from datamgr.scheduler.colocation_view import JobStatus, PlannedGroup, View


class HarmonyPolicy:
    """Harmony's grouping with its pipelined subtasks (Eq. 1). `storage_aware` makes it the SiloD variant
    (`harmony-silod`): it profiles each job's remote loading as a third resource when it groups jobs, and lets
    SiloD allocate the cache and remote IO (`colocation_storage.silod_storage`); otherwise it groups by COMP and
    COMM alone and the storage is shared fairly, as under any scheduler that does not manage it."""

    def __init__(self, storage_aware: bool = False) -> None:
        self.storage_aware = storage_aware
        self.name = "harmony-silod" if storage_aware else "harmony"

    def job_iteration_seconds(self, jobs: Sequence[JobProfile], machines: int) -> list[float]:
        return [group_iteration_seconds(jobs, machines)] * len(jobs)

    def allocate_storage(
        self, groups: Sequence[Group], needs: Mapping[str, DataNeed], cache_bytes: int, io_bytes_per_sec: float
    ) -> StorageShare:
        allocate = silod_storage if self.storage_aware else fair_storage
        return allocate(groups, needs, cache_bytes, io_bytes_per_sec)

    def plan(self, view: View) -> list[PlannedGroup]:
        return _Round(view, self.storage_aware).plan()


class _Round:
    """One round's working state: groups as (key, members, machines), `None` keys for new groups."""

    def __init__(self, view: View, storage_aware: bool) -> None:
        self.view = view
        self.profiles = {
            job_id: replace(job.profile, load_seconds=job.load_seconds) if storage_aware else job.profile
            for job_id, job in view.jobs.items()
        }
        self.groups: list[tuple[int | None, list[str], int]] = [
            (group.key, list(group.job_ids), group.machines) for group in view.groups
        ]
        self.waiting = [job.job_id for job in view.waiting()]

    def plan(self) -> list[PlannedGroup]:
        self._take_out_profiled()
        self._repair_finished()
        self._use_idle_machines()
        self._profile_new()
        return [PlannedGroup(key, tuple(members), machines) for key, members, machines in self.groups if members]

    # -- 1. end of profiling ---------------------------------------------------------------------------------

    def _take_out_profiled(self) -> None:
        profiled = list(self.view.profiled)
        for job_id in profiled:
            for _, members, _ in self.groups:
                if job_id in members:
                    members.remove(job_id)
        self._drop_empty()
        others_waiting = bool(self.waiting)
        for job_id in sorted(profiled, key=lambda j: (self.view.jobs[j].arrival, j)):
            if not others_waiting and len(profiled) == 1 and self.groups:
                index = harmony.best_addition(self._as_groups(self.groups), self.profiles[job_id])
                if index is not None:
                    self.groups[index][1].append(job_id)
                    continue
            self.waiting.append(job_id)
        if profiled and self.waiting and self.groups:
            self._regroup(must=[])

    # -- 2. finishes -----------------------------------------------------------------------------------------

    def _repair_finished(self) -> None:
        for profile, key in self.view.finished:
            index = next((i for i, group in enumerate(self.groups) if group[0] == key), None)
            if index is None:
                continue  # the group emptied: its machines are idle (step 3)
            _, members, machines = self.groups[index]
            replacement = harmony.replacement_for(profile, [self.profiles[j] for j in self.waiting], machines)
            if replacement is not None:
                for job in replacement:
                    members.append(job.job_id)
                    self.waiting.remove(job.job_id)
                continue
            self._regroup(must=[index])

    # -- 3. idle machines ------------------------------------------------------------------------------------

    def _use_idle_machines(self) -> None:
        if self.waiting and self._idle() > 0:
            self._regroup(must=[])

    def _idle(self) -> int:
        return self.view.machines - sum(machines for _, _, machines in self.groups)

    # -- 4. arrivals -----------------------------------------------------------------------------------------

    def _profile_new(self) -> None:
        new = sorted(
            (job for job in self.view.jobs.values() if job.status is JobStatus.NEW),
            key=lambda job: (job.arrival, job.job_id),
        )
        if not new:
            return
        idle = self._idle()
        if idle > 0:
            self.groups.append((None, [job.job_id for job in new], idle))
            return
        smallest = min(range(len(self.groups)), key=lambda i: (self.groups[i][2], len(self.groups[i][1]), i))
        self.groups[smallest][1].extend(job.job_id for job in new)

    # -- regrouping ------------------------------------------------------------------------------------------

    def _regroup(self, must: list[int]) -> None:
        """Algorithm 1 over the groups `must` (indexes), the idle machines and the waiting jobs, then with more
        groups added, fewest jobs first; the choice by Harmony's 5 % rules. Groups that are profiling a job
        take no part."""
        profiling = {i for i, (_, members, _) in enumerate(self.groups) if self._profiling(members)}
        base = [i for i in must if i not in profiling]
        extra = sorted(
            (i for i in range(len(self.groups)) if i not in base and i not in profiling),
            key=lambda i: (len(self.groups[i][1]), i),
        )
        now = cluster_utilisation(self._as_groups(self.groups))
        options: list[tuple[harmony.Schedule, list[int]]] = []
        for count in range(len(extra) + 1):
            selected = base + extra[:count]
            machines = sum(self.groups[i][2] for i in selected) + self._idle()
            if machines == 0:
                continue
            candidates = [job_id for i in selected for job_id in self.groups[i][1]] + self.waiting
            chosen = harmony.schedule([self.profiles[j] for j in candidates], machines)
            untouched = [group for i, group in enumerate(self.groups) if i not in selected]
            whole = harmony.Schedule(chosen.groups, cluster_utilisation([*self._as_groups(untouched), *chosen.groups]))
            options.append((whole, selected))
        decision = harmony.choose_regroup([option for option, _ in options], now)
        if decision is None:
            return
        selected = next(sel for option, sel in options if option is decision)
        self._replace(selected, decision.groups)

    def _replace(self, selected: list[int], groups: Sequence[Group]) -> None:
        old = [self.groups[i] for i in selected]
        kept = [group for i, group in enumerate(self.groups) if i not in selected]
        running = {job_id for group in groups for job_id in group.job_ids}
        candidates = {job_id for _, members, _ in old for job_id in members} | set(self.waiting)
        keys = _match_keys(old, groups)
        self.groups = kept + [
            (key, list(group.job_ids), group.machines) for key, group in zip(keys, groups, strict=True)
        ]
        self.waiting = sorted(candidates - running, key=lambda j: (self.view.jobs[j].arrival, j))

    # -- helpers ---------------------------------------------------------------------------------------------

    def _profiling(self, members: list[str]) -> bool:
        return any(self.view.jobs[j].status is JobStatus.PROFILING for j in members)

    def _as_groups(self, groups: Sequence[tuple[int | None, list[str], int]]) -> list[Group]:
        return [Group(tuple(self.profiles[j] for j in members), machines) for _, members, machines in groups if members]

    def _drop_empty(self) -> None:
        self.groups = [group for group in self.groups if group[1]]


def _match_keys(old: Sequence[tuple[int | None, list[str], int]], new: Sequence[Group]) -> list[int | None]:
    """Each new group's key: an old group's when it shares the most jobs with it and runs on the same machines
    (each old key once, the new groups in order); None for the rest."""
    free = [(key, set(members), machines) for key, members, machines in old if key is not None]
    keys: list[int | None] = []
    for group in new:
        members = set(group.job_ids)
        best = max(
            (entry for entry in free if entry[2] == group.machines and entry[1] & members),
            key=lambda entry: len(entry[1] & members),
            default=None,
        )
        if best is None:
            keys.append(None)
        else:
            free.remove(best)
            keys.append(best[0])
    return keys


def harmony_policy() -> HarmonyPolicy:
    return HarmonyPolicy()


def harmony_silod_policy() -> HarmonyPolicy:
    return HarmonyPolicy(storage_aware=True)
