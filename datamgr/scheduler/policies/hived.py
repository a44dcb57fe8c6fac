"""HiveD and its baselines as policies: tenants share a cluster of cells, each guaranteed its virtual cluster.

Three policies over the same cells (`cells.py`, `hived.py`), the VCs the snapshot's tenants reserve
(`Snapshot.tenants`) and its cell hierarchy (`Snapshot.cell_levels`):

- `hived`: each tenant's regular jobs run in its VC (`VirtualCluster`), which places them as its private
  cluster would and binds VC cells to physical ones by buddy cell allocation; low-priority jobs (and, with
  `overflow`, regular jobs its VC has no room for) take any cell no job uses, and are preempted when a
  tenant's job needs the cell.
- `quota`: the quota-based scheme the paper compares against, its YARN-CS "optimized for GPU affinity by
  packing jobs" that preempts low-priority jobs "based on the affinity requirement of the job to be
  scheduled". One pool of cells for every tenant; a job gets a cell of the level that holds its GPUs (the same
  affinity as under `hived`), the free one where the fewest low-priority GPUs must be preempted, then one in a
  node already running regular jobs (packing); a tenant's regular jobs are bounded by a GPU quota (its VC's
  GPUs) but by no cell structure; low-priority jobs and overflow as in `hived`.
- `private`: each tenant alone on its VC's cells: the private cluster the sharing safety condition compares
  with. A tenant's regular jobs land exactly as they would in `hived`'s VC; its low-priority jobs run in its
  VC as regular ones (nothing else could use a private cluster's idle cells), nobody else's.

Inside a tenant, jobs start first come, first served (FIFO, the tenant's default scheduler): the first of its
regular jobs its VC (or quota) cannot hold blocks its later regular jobs, as in a private cluster. A regular job
its VC could not hold even empty (more GPUs than its quota, a cell larger than any of its VC's, more node cells
than it has, or no cell of the cluster) blocks nothing: a private cluster's scheduler refuses such a job rather
than queue it, and queued it would block its tenant's later jobs for good. It runs only as a low-priority job
(with `overflow`), and the decision's note for it says why. A tenant
whose `TenantShare.scheduler` is "tiresias" runs Tiresias's 2D-LAS inside its VC instead (`_tiresias_round`). Regular
jobs of all tenants are started first, in submission order, then low-priority ones (and the regular jobs
overflowing their VC), in submission order, each where the low-priority view has room. A low-priority job
whose cells a regular job needs is preempted whole, and waits again.

Where the paper is silent, and what silod does:
- *Which low-priority jobs run* when there is not room for all: submission order, passing over a job that does
  not fit (scavenging backfills), rather than the paper's weighted max-min fairness among tenants.
- *Overflow* (`overflow`, default true): a regular job its VC cannot hold now runs as a low-priority job if
  cells are free ("giving it chances to run low-priority jobs" when a tenant "runs out of its own capacity",
  the paper's section 5.2.1), and keeps its place in its tenant's queue: when its turn in the VC comes (when
  its private cluster would have started it) it moves into the VC and is no longer preemptible. The simulator
  counts a move as no preemption and charges it nothing, as it charges a preemption nothing by default.
  Preempted before its turn, it waits at its place again. `overflow=false` runs as low-priority jobs only
  those the trace marks so.
- *Jobs without a VC* (no tenant, or one the snapshot does not know) run only as low-priority jobs.
- *Jobs HiveD did not place* (live: running before the policy was switched) keep running; their GPUs are
  taken as low-priority cells where free, so the policy plans around them and may preempt them.

What the policy remembers is the cells of each running job, handed back in `Decision.job_states`
(`policy_state`: `level`, `cells`, `c0`, `c1`, ... the cells' positions at that level, `v0`, ... the VC cell
each lies in for a job in a VC, and `opportunistic` 1 for a low-priority one); every round rebuilds the
allocator from them, so the policy is pure and a restarted data manager resumes where it was.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from datamgr.scheduler.cells import Cell, CellHierarchy, CellRequest, parse_levels
from datamgr.scheduler.hived import CellAllocator, LowCell, VirtualCluster
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policies.options import PolicyOptions, read_options, takes_keys
from datamgr.scheduler.policy import Decision
from datamgr.scheduler.snapshot import LOW_PRIORITY, OPPORTUNISTIC, JobState, Snapshot

MODES = ("hived", "quota", "private")
SHARED = ""  # the quota scheme's one pool, as a tenant of the allocator
ABSENT = "<absent node>#"  # the ids of the nodes that pad a hierarchy to whole top cells (no silod node id has "<")
_NO_STATE: Mapping[str, float] = MappingProxyType({})


@functools.lru_cache(maxsize=8)
def cell_hierarchy(cell_levels: str, node_gpus: tuple[tuple[str, int], ...]) -> CellHierarchy:
    """The hierarchy of `cell_levels` over the nodes (id, GPUs), in id order; without levels a node is one
    cell of as many GPUs as the largest node has. Nodes that do not fill the last top cell (live, while they
    register) are padded with absent ones, and a node may have fewer GPUs than a node cell: `_Round` excludes
    the GPUs that are not there. A node may also show more GPUs than a node cell: the data manager refuses to
    register such a node, but not more workers on a node than its GPUs, and a snapshot counts those; the
    hierarchy holds a node cell of it, and the jobs on the GPUs beyond hold no cell (`_adopt`), rather than
    every round failing until enough of them finish."""
    largest = max((gpus for _, gpus in node_gpus), default=1)
    levels = parse_levels(cell_levels) if cell_levels else (("gpu", 1), ("node", max(largest, 1)))
    probe = CellHierarchy(levels, 1)
    per_top = probe.gpus(probe.top) // probe.gpus(probe.node_level)
    missing = -len(node_gpus) % per_top if node_gpus else per_top
    return CellHierarchy.over_nodes(levels, [node for node, _ in node_gpus] + [f"{ABSENT}{i}" for i in range(missing)])


# By default regular jobs their VC (quota) cannot hold run as low-priority jobs where cells are free. A module
# constant, not read through the class: a compiled class's attribute default is not a class attribute.
OVERFLOW_BY_DEFAULT = True


@dataclass(frozen=True)
class HivedConfig:
    overflow: bool = OVERFLOW_BY_DEFAULT

    @classmethod
    def from_options(cls, options: PolicyOptions) -> HivedConfig:
        reader = read_options(options, ("overflow",))
        return cls(reader.choice("overflow", {"true": True, "false": False}, OVERFLOW_BY_DEFAULT))


class _Round:
    """One round's cells: the allocator and the VCs rebuilt from the running jobs, and what the round does."""

    def __init__(self, snapshot: Snapshot, mode: str) -> None:
        self.snapshot = snapshot
        self.mode = mode
        nodes = tuple(sorted((node_id, node.gpus) for node_id, node in snapshot.nodes.items()))
        self.hierarchy = cell_hierarchy(snapshot.cell_levels, nodes)
        vcs = {
            tenant: {self.hierarchy.level(level): count for level, count in share.cells.items()}
            for tenant, share in snapshot.tenants.items()
        }
        self.quota = {
            tenant: sum(n * self.hierarchy.gpus(level) for level, n in vc.items()) for tenant, vc in vcs.items()
        }
        if mode == "quota":
            vcs = {SHARED: {self.hierarchy.node_level: len(self.hierarchy.node_ids)}}
        # The VCs were checked when they were given (the simulator's inputs, live registration); nodes can go
        # since, or have their GPUs cut (the irregular-job storage partition): a VC cell finding no physical
        # cell then leaves its job waiting (`start_regular`).
        self.allocator = CellAllocator(self.hierarchy, vcs, require_feasible=False)
        # The quota scheme places as YARN-CS does, where it preempts least, then packing; a VC as a private cluster.
        least_preemption = mode == "quota"
        self.vcs = {tenant: VirtualCluster(self.allocator, tenant, least_preemption=least_preemption) for tenant in vcs}
        self.regular_gpus = {tenant: 0 for tenant in self.quota}  # in use by its regular jobs (the quota's count)
        self.placements: dict[str, Mapping[str, int]] = {}
        self.states: dict[str, Mapping[str, float]] = {}
        self.notes: dict[str, str] = {}
        self.low_cells: dict[str, list[Cell]] = {}  # running low-priority job -> its cells
        self.preempted: set[str] = set()  # jobs this round preempted
        self.pieces: dict[str, list[Cell]] = {}  # a regular job running in its VC -> its VC cells
        self.vc_pairs: dict[str, list[tuple[int, Cell]]] = {}  # the same jobs -> (VC cell, physical cell) pairs
        self._rebuild()
        self._exclude_unusable_gpus()

    def _exclude_unusable_gpus(self) -> None:
        """GPUs no job may use: those a node lacks (it has fewer than a node cell, as a node may in a snapshot
        without `cell_levels`, or in the storage partition `partition.py` cuts to the GPUs its jobs hold; an
        absent node padding the hierarchy lacks them all),
        and those a suspending job still holds (HiveD suspends none; a policy switched live may leave some).
        They are taken out of both views where they are free, from the node's last GPUs; the VCs then cover
        less than they reserve, and a regular job that finds no physical cell waits (`start_regular`)."""
        nodes = self.snapshot.nodes
        unusable = {
            node_id: len(self.hierarchy.node_gpus(node_id)) - (nodes[node_id].gpus if node_id in nodes else 0)
            for node_id in self.hierarchy.node_ids
        }
        for job in self.snapshot.suspending_jobs():
            for node_id, count in job.held.items():
                unusable[node_id] = unusable.get(node_id, 0) + count
        for node_id, count in sorted(unusable.items()):
            if count > 0 and node_id in self.hierarchy.node_ids:
                free = [gpu for gpu in self.hierarchy.node_gpus(node_id) if self.allocator.low_free(gpu)]
                for gpu in free[-count:]:
                    self.allocator.exclude(gpu)

    def _rebuild(self) -> None:
        """Take the cells every running job's state records, regular jobs' first; a job whose state records
        none that still hold it (`_recorded`), or cells another job's state took first, is adopted as one
        HiveD did not place."""
        running = self.snapshot.running_jobs()
        recorded = {job.job_id: _recorded(self.hierarchy, job) for job in running}
        foreign = []
        for job in running:
            self.placements[job.job_id] = job.placement
            cells = recorded[job.job_id]
            if cells is not None and cells.roots is not None and self._restore_regular(job, cells.roots, cells.cells):
                continue
            if cells is None or cells.roots is not None:
                foreign.append(job)
        for job in running:
            cells = recorded[job.job_id]
            if cells is not None and cells.roots is None and not self._restore_low(job, cells.cells):
                foreign.append(job)
        for job in foreign:
            self._adopt(job)

    def runs_low(self, job: JobState) -> bool:
        """Whether the job runs as a low-priority one now (preemptible)."""
        return job.job_id in self.low_cells

    def has_vc(self, job: JobState) -> bool:
        """Whether the job's tenant has a VC (or, for `quota`, a quota) its regular jobs run in."""
        return self._vc_of(job) is not None

    def never_in_vc(self, job: JobState, request: CellRequest | None) -> str | None:
        """Why the job can never run in its tenant's VC (or quota), however many of the tenant's jobs finish;
        None if it can. `request` is its cells (`_request`), None if no cell of the cluster holds it."""
        if request is None:
            return f"no cell of the cluster holds a job of {job.gpus} GPUs"
        if self.mode == "quota":
            quota = self.quota[job.tenant]
            return None if job.gpus <= quota else f"its {job.gpus} GPUs exceed tenant {job.tenant}'s quota of {quota}"
        vc = self.vcs[job.tenant]
        if vc.whole_capacity(request.level) >= request.number:
            return None
        cells = "a cell" if request.number == 1 else f"{request.number} cells"
        return (
            f"tenant {job.tenant}'s VC has no room for {cells} of {self.hierarchy.describe(request.level)} "
            f"({job.gpus} GPUs) even with none of its jobs running"
        )

    def _vc_of(self, job: JobState) -> VirtualCluster | None:
        if self.mode == "quota":
            return self.vcs[SHARED] if job.tenant in self.quota else None
        return self.vcs.get(job.tenant)

    def _restore_regular(self, job: JobState, roots: list[int], cells: list[Cell]) -> bool:
        """Put a regular job back on its recorded cells in its VC; False, taking nothing, if it has no VC now
        or the VC cannot hold them (a VC re-registered smaller, cells another job's state took first)."""
        vc = self._vc_of(job)
        if vc is None:
            return False
        pairs = list(zip(roots, cells, strict=True))
        pieces = _restored(vc, pairs)
        if pieces is None:
            return False
        self._hold(job, pieces, pairs)
        return True

    def set_aside(self, job: JobState) -> list[tuple[int, Cell]]:
        """Free the cells of a regular job running in its VC, tentatively (Tiresias's round may keep it where
        it is: `put_back`); its (VC cell, physical cell) pairs."""
        vc = self._vc_of(job)
        assert vc is not None
        pairs = self.vc_pairs.pop(job.job_id)
        for virtual in self.pieces.pop(job.job_id):
            vc.release(virtual)
        self.regular_gpus[job.tenant] -= job.gpus
        return pairs

    def put_back(self, job: JobState, pairs: list[tuple[int, Cell]]) -> bool:
        """Keep a job set aside on its cells if they are all still free in its VC; else it is preempted."""
        vc = self._vc_of(job)
        assert vc is not None
        restored = _restored(vc, pairs)
        if restored is None:
            del self.placements[job.job_id]
            self.states[job.job_id] = _NO_STATE
            self.notes[job.job_id] = (
                f"preempted in the VC of tenant {job.tenant}: jobs of higher priority need its cells"
            )
            return False
        self._hold(job, restored, pairs)
        return True

    def _hold(self, job: JobState, pieces: list[Cell], pairs: list[tuple[int, Cell]]) -> None:
        """Record a regular job as running in its VC on `pieces`, its (VC cell, physical cell) `pairs`."""
        self.pieces[job.job_id] = pieces
        self.vc_pairs[job.job_id] = pairs
        self.regular_gpus[job.tenant] += job.gpus

    def _restore_low(self, job: JobState, cells: list[Cell]) -> bool:
        """Give a low-priority job these cells; False, taking none, if another job holds some of them."""
        taken: list[Cell] = []
        try:
            for cell in cells:
                self.allocator.take_low(job.job_id, cell)
                taken.append(cell)
        except ValueError:
            for cell in taken:
                self.allocator.release_low(cell)
            return False
        self.low_cells[job.job_id] = cells
        return True

    def _adopt(self, job: JobState) -> None:
        """A running job without HiveD's cells: its GPUs become low-priority GPU cells where they are free."""
        cells: list[Cell] = []
        for node, gpus in sorted(job.placement.items()):
            if node in self.hierarchy.node_ids:
                cells.extend([gpu for gpu in self.hierarchy.node_gpus(node) if self.allocator.low_free(gpu)][:gpus])
        self._restore_low(job, cells)
        self.states[job.job_id] = _encode(self.hierarchy, cells, None)

    def start_regular(self, job: JobState, request: CellRequest) -> bool:
        """Start the job in its tenant's VC (or, for `quota`, the shared pool within its quota); False if
        there is no room there now."""
        vc = self._vc_of(job)
        if vc is None or vc.capacity(request.level) < request.number:
            return False
        if self.mode == "quota" and self.regular_gpus[job.tenant] + job.gpus > self.quota[job.tenant]:
            return False
        for cell in self.low_cells.pop(job.job_id, ()):  # moving in from low-priority cells: leave them
            self.allocator.release_low(cell)
        cells: list[Cell] = []
        roots: list[int] = []
        pieces = []
        try:
            for _ in range(request.number):
                piece = vc.allocate(request.level)
                if piece is None:  # the capacity said there was room: cannot happen
                    raise RuntimeError(f"tenant {job.tenant}'s VC lost room for job {job.job_id}")
                pieces.append(piece)
                self._preempt(piece.preempted, job)  # before the next piece, which may preempt the same job's cells
                cells.append(piece.physical)
                roots.append(piece.virtual[0])
        except RuntimeError:  # no physical cell for a VC cell: only where GPUs are excluded
            for piece in pieces:
                vc.release(piece.virtual)
            return False
        self.regular_gpus[job.tenant] += job.gpus
        self.pieces[job.job_id] = [piece.virtual for piece in pieces]
        self._start(job, cells, roots)
        return True

    def start_low(self, job: JobState, request: CellRequest) -> bool:
        """Start the job on cells no job uses; False if there are not enough."""
        if self.allocator.low_capacity(request.level) < request.number:
            return False
        cells = [self.allocator.allocate_low(job.job_id, request.level) for _ in range(request.number)]
        taken = [cell for cell in cells if cell is not None]
        self.low_cells[job.job_id] = taken
        self._start(job, taken, None)
        return True

    def _start(self, job: JobState, cells: list[Cell], roots: list[int] | None) -> None:
        moved = job.job_id in self.placements
        self.placements[job.job_id] = self.hierarchy.placement(cells, job.gpus)
        self.states[job.job_id] = _encode(self.hierarchy, cells, roots)
        kind = "low priority" if roots is None else f"in the VC of tenant {job.tenant}"
        if self.mode == "quota" and roots is not None:
            kind = f"in tenant {job.tenant}'s quota"
        where = ", ".join(self.hierarchy.name(cell) for cell in cells)
        self.notes[job.job_id] = f"{'moved ' if moved else ''}{kind} on {where}"

    def _preempt(self, taken: Sequence[LowCell], by: JobState) -> None:
        """Stop whole the low-priority jobs that lost cells to `by`: release their other cells (those `taken`
        are released already, and one job may lose several, such as an adopted job's GPUs to a node cell)."""
        released = {cell for _, cell in taken}
        for owner, cell in taken:
            if owner not in self.low_cells:
                continue
            for other in self.low_cells.pop(owner):
                if other not in released:
                    self.allocator.release_low(other)
            del self.placements[owner]
            self.preempted.add(owner)
            self.states[owner] = _NO_STATE
            self.notes[owner] = f"preempted: tenant {by.tenant}'s job {by.job_id} needs {self.hierarchy.name(cell)}"


def _restored(vc: VirtualCluster, pairs: Sequence[tuple[int, Cell]]) -> list[Cell] | None:
    """The VC cells `pairs` (VC cell, physical cell) take in `vc`; None, taking none, if it cannot hold them all."""
    pieces: list[Cell] = []
    try:
        for root, cell in pairs:
            pieces.append(vc.restore(root, cell))
    except ValueError:
        for virtual in pieces:
            vc.release(virtual)
        return None
    return pieces


def _encode(hierarchy: CellHierarchy, cells: list[Cell], roots: list[int] | None) -> Mapping[str, float]:
    state: dict[str, float] = {OPPORTUNISTIC: 1.0 if roots is None else 0.0, "cells": float(len(cells))}
    if cells:
        state["level"] = float(hierarchy.level_of(cells[0]))
    for index, cell in enumerate(cells):
        state[f"c{index}"] = float(hierarchy.index(cell))
        if roots is not None:
            state[f"v{index}"] = float(roots[index])
    return MappingProxyType(state)


class _Recorded(NamedTuple):
    """The cells a running job's state records: physical cells, and for a regular job the VC cell of each."""

    cells: list[Cell]
    roots: list[int] | None  # None: a low-priority job


def _recorded(hierarchy: CellHierarchy, job: JobState) -> _Recorded | None:
    """The cells the job's policy state records, if they still hold it exactly where it runs; else None.

    The state is only a memo of where HiveD put the job, written against the hierarchy of its round. The
    hierarchy changes under it: a node cell is as large as the largest node without `--cell-levels`, and a
    node counts the workers registered on it when they outnumber its GPUs, so a node cell shrinks when such
    jobs finish; node ids that sort before the others shift every later node's cells; and a state another
    policy wrote (a policy switch on a state dir written before the controller kept only a policy's own) is
    no HiveD state at all. Replaying such a state would fail every round. A job it no longer places is still
    running where it runs, so it is treated as a job HiveD did not place (`_adopt`: its GPUs taken as
    low-priority cells, and a regular job moved into its VC when its turn comes), which the paper's logic
    allows: a running job outside its VC is preemptible until it moves in."""
    state = job.policy_state
    opportunistic = state.get(OPPORTUNISTIC)
    if opportunistic not in (0.0, 1.0):
        return None
    try:
        count = int(state["cells"])
        level = int(state["level"])
        cells = [hierarchy.cell_at(level, int(state[f"c{index}"])) for index in range(count)]
        roots = None if opportunistic == 1.0 else [int(state[f"v{index}"]) for index in range(count)]
        where = hierarchy.placement(cells, job.gpus)
    except (KeyError, ValueError, OverflowError):  # a key missing, a number out of range
        return None
    return _Recorded(cells, roots) if where == dict(job.placement) else None


class HivedScheduler:
    """`hived`, `quota` or `private` (`MODES`): compute only; the cache system decides storage."""

    def __init__(self, name: str, mode: str, config: HivedConfig = HivedConfig()) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        self.name = name
        self.mode = mode
        self.config = config

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        cells = _Round(snapshot, self.mode)
        jobs = snapshot.schedulable_jobs()
        blocked: set[str] = set()  # tenants whose first waiting regular job has no room: FIFO within a tenant
        low: set[str] = set()  # waiting jobs to run as low-priority ones if cells are free
        by_tiresias = {name for name, share in snapshot.tenants.items() if share.scheduler == "tiresias"}
        regular: dict[str, list[JobState]] = {}
        for job in jobs:
            if job.tenant in by_tiresias and self._guaranteed(job, cells):
                regular.setdefault(job.tenant, []).append(job)
        for tenant, own in sorted(regular.items()):
            low |= self._tiresias_round(cells, own, cells.quota[tenant])
        for job in jobs:
            placed = job.job_id in cells.placements
            if placed and not cells.runs_low(job):
                continue  # a regular job in its VC (or quota) stays where it is
            if job.tenant in by_tiresias and self._guaranteed(job, cells):
                continue  # its tenant's Tiresias round placed it, or not
            if not self._guaranteed(job, cells):
                if not placed:
                    low.add(job.job_id)
            elif job.tenant not in blocked:  # waiting, or overflowing its VC: its turn in the VC is now
                request = _request(cells.hierarchy, job)
                if request is not None and cells.start_regular(job, request):
                    continue
                never = cells.never_in_vc(job, request)
                if never is None:
                    blocked.add(job.tenant)
                elif not placed:
                    overflows = self.config.overflow and self.mode != "private"
                    where = "waits for free cells as a low-priority job" if overflows else "never runs"
                    cells.notes[job.job_id] = f"{never}: it {where}"
                if self.config.overflow and not placed:
                    low.add(job.job_id)
        if self.mode != "private":
            _start_low_where_free(cells, [job for job in jobs if job.job_id in low or job.job_id in cells.preempted])
        return Decision(placements=cells.placements, job_states=cells.states, notes=cells.notes)

    def _guaranteed(self, job: JobState, cells: _Round) -> bool:
        """Whether the job runs in its tenant's VC (or quota) when it runs as it should: a regular job of a
        tenant with one (in a private cluster, a low-priority job too)."""
        return (job.priority != LOW_PRIORITY or self.mode == "private") and cells.has_vc(job)

    def _tiresias_round(self, cells: _Round, jobs: list[JobState], budget: int) -> set[str]:
        """Tiresias inside one tenant's VC (2D-LAS, the paper's defaults): the tenant's regular jobs ranked by
        queue (attained service below or above `TIRESIAS_THRESHOLD`), then by first start (jobs that never ran
        last), then submission; walking the ranking, every job whose GPUs fit in what is left of the VC's
        (`budget`) is kept and the rest skipped (no head-of-line blocking). Kept jobs running in the VC stay where
        they are; kept waiting (or overflowing) ones are placed in the VC in rank order; a running job that was
        skipped is preempted only if a placed job took its cells. Returns the jobs that may overflow."""
        ranked = sorted(jobs, key=_tiresias_rank)
        kept: list[JobState] = []
        left = budget
        for job in ranked:
            if job.gpus <= left:
                kept.append(job)
                left -= job.gpus
        in_vc = [job for job in jobs if job.job_id in cells.placements and not cells.runs_low(job)]
        kept_ids = {job.job_id for job in kept}
        aside = {job.job_id: cells.set_aside(job) for job in in_vc if job.job_id not in kept_ids}
        overflow: set[str] = set()
        for job in kept:
            if job.job_id in cells.placements and not cells.runs_low(job):
                continue
            request = _request(cells.hierarchy, job)
            if (request is None or not cells.start_regular(job, request)) and job.job_id not in cells.placements:
                overflow.add(job.job_id)
        for job in in_vc:
            if job.job_id in aside:
                cells.put_back(job, aside[job.job_id])
        waiting = {job.job_id for job in ranked if job.job_id not in kept_ids and job.job_id not in cells.placements}
        return overflow | waiting if self.config.overflow and self.mode != "private" else set()


TIRESIAS_THRESHOLD = 3600.0  # GPU-seconds: the paper's simulation default, K = 2 queues split at 1 GPU-hour


def _tiresias_rank(job: JobState) -> tuple[int, float, float, str]:
    """2D-LAS's order: the queue of the job's attained service, then when it first started (its start-time
    order within a queue, the time it entered a lower queue approximated by its first start), never-run jobs
    last, by submission."""
    queue = 0 if job.attained_gpu_seconds < TIRESIAS_THRESHOLD else 1
    started = job.first_start_time if job.first_start_time is not None else float("inf")
    return (queue, started, job.submit_time, job.job_id)


def _start_low_where_free(cells: _Round, waiting: Sequence[JobState]) -> None:
    """Start each of `waiting`, in order, as a low-priority job where free cells hold it.

    This pass only takes cells, so the free room only shrinks while it runs: a request refused at a level is
    refused again for as many cells of that level or more, and such jobs are passed over without recounting
    the free cells. Under a long queue (thousands of waiting jobs each round, few of which fit) that count per
    job was most of a round; the starts are the same."""
    requests: dict[int, CellRequest | None] = {}  # by GPUs: a request depends on nothing else
    refused: dict[int, int] = {}  # level -> the fewest cells of it a request was refused
    for job in waiting:
        if job.gpus not in requests:
            requests[job.gpus] = _request(cells.hierarchy, job)
        request = requests[job.gpus]
        if request is None or request.number >= refused.get(request.level, request.number + 1):
            continue
        if not cells.start_low(job, request):
            refused[request.level] = request.number


def _request(hierarchy: CellHierarchy, job: JobState) -> CellRequest | None:
    """The cells the job asks for; None for a job no cell of the cluster can hold (it never runs)."""
    try:
        return hierarchy.request_for(job.gpus)
    except ValueError:
        return None


@takes_keys("overflow")
def hived(options: PolicyOptions | None = None) -> HivedScheduler:
    return HivedScheduler("hived", "hived", HivedConfig.from_options(options or {}))


@takes_keys("overflow")
def quota(options: PolicyOptions | None = None) -> HivedScheduler:
    return HivedScheduler("quota", "quota", HivedConfig.from_options(options or {}))


def private() -> HivedScheduler:
    return HivedScheduler("private", "private")
