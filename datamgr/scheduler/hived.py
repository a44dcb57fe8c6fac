"""HiveD's virtual private clusters: cells, buddy cell allocation, and low-priority cells (pure).

HiveD (the paper's section 3) gives each tenant a virtual cluster (VC) of *cells*: affinitised groups of GPUs
at the levels of the hardware hierarchy (GPU, PCIe switch, socket, node, rack). A level-k cell is h_k
*buddy* level-(k-1) cells, the same way everywhere (hierarchical uniform composability), so any free level-k
cell serves any request for one. A VC is the number of cells r_{t,k} tenant t holds at each level k; a
request is *legal* when a_{t,k} < r_{t,k} (a the cells it holds). Logical cells are bound to physical ones
only while in use (dynamic binding).

Algorithm 1 (buddy cell allocation) keeps one global free list per level, free cells always at the highest
level they can be: allocating a level-k cell takes a free one, or splits a free cell of the lowest level
above k that has one, recursively, until a level-k cell is free; releasing a cell merges it with its buddies
while they are all free, recursively. Theorem 1: if the VC assignment is feasible, every legal request is
satisfied. Its proof keeps, for every level k (f_k the free level-k cells, k^ the top level),

    F_k = (f_{k+1} + F_{k+1} - (r_{k+1} - a_{k+1})) h_{k+1}   for k < k^,   F_k^ = 0        Eq. 1
    r_k - a_k <= f_k + F_k                                                                Eq. 2

**Feasibility.** At the start a = 0 and only the T top cells are free, so Eq. 2 reads r_k <= S_k with
S_k^ = T and S_k = (S_{k+1} - r_{k+1}) h_{k+1}: the cells left at level k once every higher level's
reservations are set aside. As a level-k cell holds g_k = h_1...h_k GPUs (h_1 = 1) and the g_k divide one
another, S_k g_k = T g_k^ - sum_{j>k} r_j g_j, so the condition is, for every k, sum_{j>=k} r_j g_j <= T g_k^:
the GPUs reserved at level k and above fit in the cluster. (The k = 1 case implies the others, so a VC
assignment is feasible exactly when its GPUs fit; the check still walks Eq. 1 so that it can name the
highest level where the top-down packing of the paper's proof fails.) This is also the paper's definition, a
one-to-one mapping from logical to physical cells: with sizes dividing one another, packing the largest
cells first never strands a GPU. A cluster missing some GPUs (a node gone from its rack) starts with split free
lists instead of whole top cells; Eq. 2 over those lists is then the condition, and counting GPUs is not.

**Low priority (section 3.2).** Two views of the same cells, both run by Algorithm 1. The high-priority view
holds the cells bound to VCs (legality checked); the low-priority view holds the cells jobs use. A
low-priority request is served in the low view alone (any cell no job uses, VCs regardless) and makes the
high view's cells "dirty"; a high-priority job's cell is taken in the low view too, preempting the
low-priority cells that overlap it. Among the free cells Algorithm 1 may hand out, a high-priority request
takes the one with the fewest GPUs used by low-priority jobs.

**A tenant's own jobs (`VirtualCluster`).** The paper states legality per level: a tenant asks for a level-k
cell while it holds fewer than r_{t,k}. Its evaluation gives VCs of node cells only, yet its tenants run
1-GPU jobs, and its section 5.3 says a tenant with only level-4 cells "has to use a level-4 cell to run its
1-GPU job". So a tenant's VC is run as its private cluster would be: a forest of the cells it reserves, in
which Algorithm 1 places the tenant's jobs, splitting its cells for smaller jobs; a VC cell is bound to a
physical one (a legal request, satisfied by Theorem 1) when its first job arrives and unbound when its last
job leaves. Whatever sequence of jobs the tenant's private cluster of those cells could place, its VC places
the same way, however the other tenants behave: sharing safety. Low-priority jobs may use the idle GPUs of a
bound cell until the owner's jobs need them.

Choices where the paper is silent:
- *Which free cell.* Algorithm 1 pops any. The candidates here are exactly Algorithm 1's: the free level-k
  cells, or (none) the level-k cells inside the free cells of the lowest level above k that has any; among
  them, fewest low-priority GPUs first (section 3.2), then the lowest path. The dirt rule never overrides
  Algorithm 1's order: splitting a higher cell while a level-k one is free could break Eq. 2 at the higher
  level, which Theorem 1's proof relies on. Inside a VC, a cell already bound goes before one that is not
  (the tenant packs its jobs as in its private cluster), then the lowest path: nothing outside the VC may
  steer where a tenant's job lands in it, or its private cluster would no longer predict it. Low-priority
  requests take the lowest path.
- *What a preemption reports.* The low-priority cells overlapping the occupied cell, each with the owner the
  caller gave it (a job id, say), already released from the low view. A low-priority job on several cells
  is the caller's to stop whole: it releases the job's other cells with `release_low`.
- *How many low-priority cells a tenant gets.* The paper uses weighted max-min fairness; that is a policy
  above this module, which serves any low-priority request that finds free cells.
- *A job's cells* (`CellHierarchy.request_for`): one cell of the smallest level that holds its GPUs (a
  3-GPU job holds a 4-GPU cell, one GPU idle, for the affinity a cell promises); a job larger than a node
  takes ceil(g / node GPUs) node cells, as in the paper's evaluation, whose VCs hold node cells only and
  whose 16-GPU jobs still ran.
- *Scope.* One hierarchy is one pool: a heterogeneous cluster is split into homogeneous pools (as the paper
  says), each with its own allocator. Top-level cells never merge (there is no cell above them). Cell
  exchange and more than two priorities are not modelled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from datamgr.scheduler.cells import Cell, CellHierarchy, FreeLists

Vcs = Mapping[str, Mapping[int, int]]
"""The VC assignment r: tenant -> level (1 = GPU, as the paper numbers them) -> number of cells."""


class LowCell(NamedTuple):
    """A cell held by a low-priority job, with the owner its caller named."""

    owner: str
    cell: Cell


class Grant(NamedTuple):
    """A high-priority cell, and the low-priority cells taken from their owners to make it free."""

    cell: Cell
    preempted: tuple[LowCell, ...]


class IllegalRequest(ValueError):
    """A tenant asked for a cell beyond its VC: it already holds r_{t,k} cells of that level."""


def slack(hierarchy: CellHierarchy, free: Mapping[int, int], unallocated: Mapping[int, int]) -> dict[int, int]:
    """Eq. 2's gap per level, f_k + F_k - (r_k - a_k) with F_k from Eq. 1, given the free cells f_k and the
    cells r_k - a_k the VCs may still ask for: negative where Theorem 1's invariant fails. Since
    F_k = gap_{k+1} h_{k+1}, one pass from the top computes it."""
    gaps: dict[int, int] = {}
    above = 0  # F_k^ = 0
    for level in range(hierarchy.top, 0, -1):
        gaps[level] = free.get(level, 0) + above - unallocated.get(level, 0)
        above = gaps[level] * hierarchy.levels[level - 1].buddies
    return gaps


class Infeasible(NamedTuple):
    """Why a VC assignment does not fit: the highest level where Eq. 2 fails, the tenants that reserve cells
    there (whose jobs, with the others', compete for too few cells), and a message naming both."""

    level: int
    tenants: tuple[str, ...]
    reason: str


def check_feasible(hierarchy: CellHierarchy, vcs: Vcs) -> None:
    """Raise ValueError unless the VC assignment fits the cluster (Eq. 2 with nothing allocated), naming the
    highest level that does not fit, what each tenant reserves there, and any tenant whose VC alone fails."""
    found = infeasibility(hierarchy, vcs)
    if found is not None:
        raise ValueError(found.reason)


def infeasibility(hierarchy: CellHierarchy, vcs: Vcs, free: Mapping[int, int] | None = None) -> Infeasible | None:
    """Why the VC assignment does not fit the cells there are (Eq. 2 with nothing allocated), None if it fits.
    `free` is the whole cells per level: by default every top cell of the hierarchy; fewer where GPUs are missing
    (a node gone leaves the cells above it split), and then the GPUs alone no longer decide, Eq. 2 over those free
    lists does. A ValueError for a VC naming a level the hierarchy lacks or a negative count."""
    for tenant, vc in vcs.items():
        for level, count in vc.items():
            if not 1 <= level <= hierarchy.top:
                raise ValueError(f"tenant {tenant}: no level {level}; the levels are 1..{hierarchy.top}")
            if count < 0:
                raise ValueError(f"tenant {tenant}: {count} cells of {hierarchy.describe(level)}")
    cells = {hierarchy.top: hierarchy.top_cells} if free is None else free
    failing = _highest_failing(hierarchy, cells, vcs.values())
    if failing is None:
        return None
    reserved = sum(vc.get(failing, 0) for vc in vcs.values())
    room = slack(hierarchy, cells, _reserved(vcs.values()))[failing] + reserved
    tenants = tuple(tenant for tenant, vc in vcs.items() if vc.get(failing, 0))
    by_tenant = ", ".join(f"{tenant}: {vcs[tenant][failing]}" for tenant in tenants)
    above = sum(count * hierarchy.gpus(level) for vc in vcs.values() for level, count in vc.items() if level >= failing)
    there = sum(count * hierarchy.gpus(level) for level, count in cells.items())
    reason = (
        f"the VC assignment does not fit at {hierarchy.describe(failing)}: the VCs reserve {reserved} cells there"
        f" ({by_tenant}), and {max(room, 0)} are left once the higher levels' are set aside"
        f" ({above} GPUs reserved at this level and above, {there} in the cluster)"
    )
    alone = [tenant for tenant, vc in vcs.items() if _highest_failing(hierarchy, cells, [vc]) is not None]
    if alone:
        reason += "; on its own, the VC of " + ", ".join(f"tenant {tenant}" for tenant in alone) + " does not fit"
    return Infeasible(failing, tenants, reason)


def _reserved(vcs: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """r_k: the cells of each level all the VCs reserve."""
    total: dict[int, int] = {}
    for vc in vcs:
        for level, count in vc.items():
            total[level] = total.get(level, 0) + count
    return total


def _highest_failing(hierarchy: CellHierarchy, free: Mapping[int, int], vcs: Iterable[Mapping[int, int]]) -> int | None:
    gaps = slack(hierarchy, free, _reserved(vcs))
    return max((level for level, gap in gaps.items() if gap < 0), default=None)


class CellAllocator:
    """HiveD's physical cells for one pool: the VCs' bindings (the high-priority view), the cells jobs use
    (the low-priority view), and who holds what.

    The high view holds the cells bound to tenants' VCs (`bind`), whole, whatever part of them runs jobs;
    Algorithm 1 runs in it with the VC legality check. The low view holds the cells jobs actually use: those
    of high-priority jobs (`occupy`, always inside a bound cell) and those of low-priority jobs
    (`allocate_low`, in any cell no job uses, bound or not). Occupying a cell preempts the low-priority cells
    that overlap it. Its methods change only its own state; the VC assignment is copied at construction.
    An infeasible assignment is a ValueError naming the level, unless `require_feasible` is false (a cluster
    that lost nodes after its VCs were checked): then Theorem 1 no longer holds, and a legal `bind` may find
    no free cell (RuntimeError).
    """

    def __init__(self, hierarchy: CellHierarchy, vcs: Vcs, *, require_feasible: bool = True) -> None:
        if require_feasible:
            check_feasible(hierarchy, vcs)
        self.hierarchy = hierarchy
        levels = range(1, hierarchy.top + 1)
        self._gpus = [hierarchy.gpus(level) for level in levels]
        self._vcs = {tenant: {level: vc.get(level, 0) for level in levels} for tenant, vc in vcs.items()}
        self._high = FreeLists.physical(hierarchy)
        self._low_view = FreeLists.physical(hierarchy)
        self._held: dict[str, dict[int, set[Cell]]] = {tenant: {level: set() for level in levels} for tenant in vcs}
        self._holder: dict[Cell, str] = {}
        self._low: dict[Cell, str] = {}
        self._low_under: dict[Cell, int] = {}  # per cell, the GPUs of low-priority cells at or below it
        self._excluded: set[Cell] = set()

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(self._vcs)

    def vc(self, tenant: str) -> dict[int, int]:
        """r_{t,k} for every level."""
        return dict(self._tenant(tenant))

    def held(self, tenant: str) -> dict[int, tuple[Cell, ...]]:
        """The physical cells bound to the tenant's logical cells now, per level (a_{t,k} is their number)."""
        self._tenant(tenant)
        return {level: tuple(sorted(cells)) for level, cells in self._held[tenant].items()}

    def legal(self, tenant: str, level: int, count: int = 1) -> bool:
        """Whether the tenant may ask for `count` more cells of `level`: a_{t,k} + count <= r_{t,k}."""
        reserved = self._tenant(tenant)
        self.hierarchy.check_level(level)
        return len(self._held[tenant][level]) + count <= reserved[level]

    def bind(self, tenant: str, level: int) -> Cell:
        """Bind one of the tenant's level-`level` logical cells to a physical cell (Algorithm 1): among the
        cells Algorithm 1 may hand out, the one with the fewest GPUs low-priority jobs use, then the lowest
        path. IllegalRequest when the tenant holds its VC's number of cells of that level already; a legal
        request always succeeds (Theorem 1)."""
        self._check_legal(tenant, level)
        candidates = self._high.candidates(level)
        if not candidates:  # Theorem 1 says this cannot happen for a feasible assignment
            raise RuntimeError(f"no free cell of {self.hierarchy.describe(level)} for a legal request of {tenant}")
        cell = min(candidates, key=lambda cell: (self.low_gpus(cell), cell))
        self._bind(tenant, cell)
        return cell

    def bind_cell(self, tenant: str, cell: Cell) -> None:
        """Bind a logical cell of the tenant to this physical cell, as a bind before had (to rebuild state);
        IllegalRequest beyond its VC, ValueError if the cell is not free in the high view."""
        self._check_legal(tenant, self.hierarchy.level_of(cell))
        self._bind(tenant, cell)

    def unbind(self, tenant: str, cell: Cell) -> None:
        """Return a bound cell; it merges with its free buddies in the high view."""
        if self._holder.get(cell) != tenant:
            raise ValueError(f"tenant {tenant} holds no cell {self.hierarchy.name(cell)}")
        del self._holder[cell]
        self._held[tenant][self.hierarchy.level_of(cell)].remove(cell)
        self._high.give(cell)

    def occupy(self, cell: Cell) -> tuple[LowCell, ...]:
        """A high-priority job uses `cell` (inside a bound cell): the low-priority cells overlapping it are
        preempted, released and returned, each with its owner. A low-priority job on several cells is the
        caller's to stop whole: it releases the job's other cells with `release_low`. RuntimeError, changing
        nothing, if the cell holds an excluded GPU."""
        if any(excluded[: len(cell)] == cell or cell[: len(excluded)] == excluded for excluded in self._excluded):
            raise RuntimeError(f"{self.hierarchy.name(cell)} holds GPUs no job may use")
        overlapping = sorted(low for low in self._low if low[: len(cell)] == cell or cell[: len(low)] == low)
        preempted = tuple(LowCell(self._low[low], low) for low in overlapping)
        for low in overlapping:
            self._drop_low(low)
        self._low_view.take(cell)
        return preempted

    def vacate(self, cell: Cell) -> None:
        """A high-priority job no longer uses `cell`."""
        self._low_view.give(cell)

    def allocate(self, tenant: str, level: int) -> Grant:
        """Algorithm 1 as the paper states it: bind a cell of `level` and use all of it."""
        cell = self.bind(tenant, level)
        return Grant(cell, self.occupy(cell))

    def release(self, tenant: str, cell: Cell) -> None:
        """Undo `allocate`."""
        self.vacate(cell)
        self.unbind(tenant, cell)

    def allocate_low(self, owner: str, level: int) -> Cell | None:
        """A low-priority cell of `level` for `owner` (whatever the caller names jobs by), from any cell no job
        uses, VCs regardless: Algorithm 1's first candidate in path order; None when there is none."""
        self.hierarchy.check_level(level)
        candidates = self._low_view.candidates(level)
        if not candidates:
            return None
        self.take_low(owner, candidates[0])
        return candidates[0]

    def take_low(self, owner: str, cell: Cell) -> None:
        """A low-priority job holds this cell, as an `allocate_low` before had (to rebuild state); a
        ValueError if some of it is in use."""
        self._low_view.take(cell)
        self._low[cell] = owner
        self._mark_low(cell, +1)

    def exclude(self, cell: Cell) -> None:
        """Take a cell no job may use (a GPU a node lacks, or one held outside HiveD) out of both views, where
        it is free; the VCs' guarantee then covers less than they reserve, and a legal request may fail."""
        if self._high.covering(cell) is not None:
            self._high.take(cell)
        self._low_view.take(cell)
        self._excluded.add(cell)

    def bindable(self, level: int) -> list[Cell]:
        """The cells of `level` a `bind` could take now (Algorithm 1's candidates in the high view)."""
        return self._high.candidates(level)

    def low_free(self, cell: Cell) -> bool:
        """Whether no job uses any of `cell`."""
        return self._low_view.covering(cell) is not None

    def low_capacity(self, level: int) -> int:
        """How many low-priority cells of `level` could be allocated now."""
        return self._low_view.capacity(level, self._gpus)

    def release_low(self, cell: Cell) -> None:
        """Free a low-priority cell (not one already preempted: `occupy` released those)."""
        if cell not in self._low:
            raise ValueError(f"no low-priority job holds {self.hierarchy.name(cell)}")
        self._drop_low(cell)

    def low_cells(self) -> dict[Cell, str]:
        """The low-priority cells and their owners."""
        return dict(self._low)

    def low_gpus(self, cell: Cell) -> int:
        """The GPUs in `cell` low-priority jobs use: what using it would preempt ("dirty" GPUs)."""
        if any(cell[:depth] in self._low for depth in range(1, len(cell))):
            return self.hierarchy.gpus(self.hierarchy.level_of(cell))
        return self._low_under.get(cell, 0)

    def free_cells(self) -> dict[int, tuple[Cell, ...]]:
        """The high-priority view's free lists: every cell no VC has bound, at its highest level."""
        return self._high.lists()

    def low_free_cells(self) -> dict[int, tuple[Cell, ...]]:
        """The low-priority view's free lists: every cell no job uses, at its highest level."""
        return self._low_view.lists()

    def slack(self) -> dict[int, int]:
        """Eq. 2's gap per level in the high view now; never negative (Theorem 1's invariant)."""
        unallocated = {
            level: sum(vc[level] - len(self._held[tenant][level]) for tenant, vc in self._vcs.items())
            for level in range(1, self.hierarchy.top + 1)
        }
        return slack(self.hierarchy, self._high.counts(), unallocated)

    def _tenant(self, tenant: str) -> dict[int, int]:
        if tenant not in self._vcs:
            raise ValueError(f"no tenant {tenant!r}; the tenants are {sorted(self._vcs)}")
        return self._vcs[tenant]

    def _check_legal(self, tenant: str, level: int) -> None:
        if not self.legal(tenant, level):
            raise IllegalRequest(
                f"tenant {tenant} holds {len(self._held[tenant][level])} cells of {self.hierarchy.describe(level)}"
                f" and its VC has {self._vcs[tenant][level]}: one more is not a legal request"
            )

    def _bind(self, tenant: str, cell: Cell) -> None:
        self._high.take(cell)
        self._held[tenant][self.hierarchy.level_of(cell)].add(cell)
        self._holder[cell] = tenant

    def _drop_low(self, cell: Cell) -> None:
        del self._low[cell]
        self._mark_low(cell, -1)
        self._low_view.give(cell)

    def _mark_low(self, cell: Cell, sign: int) -> None:
        gpus = self.hierarchy.gpus(self.hierarchy.level_of(cell))
        for depth in range(1, len(cell) + 1):
            above = cell[:depth]
            self._low_under[above] = self._low_under.get(above, 0) + sign * gpus
            if not self._low_under[above]:
                del self._low_under[above]


class Piece(NamedTuple):
    """A cell a tenant's job uses: where it lies in the tenant's VC (`virtual`: the index of one of the VC's
    cells, then the path inside it), the physical cell it is bound to, and the low-priority cells its use
    preempted."""

    virtual: Cell
    physical: Cell
    preempted: tuple[LowCell, ...] = ()


class VirtualCluster:
    """One tenant's virtual private cluster: the cells its VC reserves, run as the tenant's private cluster.

    The VC's cells are the roots of a forest (largest first, then by level order), and the tenant's jobs are
    placed in it by Algorithm 1 exactly as they would be in a private cluster made of those cells: a free
    cell of the level asked for, else one split from the lowest level above that has a free cell. A VC cell is
    bound to a physical cell (`CellAllocator.bind`, legal by construction) when a job first uses part of it
    and unbound when its last job leaves (dynamic binding); the parts a job uses are occupied in the low view,
    preempting low-priority jobs there. Among Algorithm 1's candidates, a cell of a VC cell already bound goes
    first (the tenant packs its own jobs, as in its private cluster, and binds no more physical cells than it
    needs), then the lowest path. The choice reads nothing outside the VC (not even which GPUs low-priority
    jobs use), so the tenant's jobs land in its VC exactly where they would in its private cluster, whatever
    the other tenants do; the fewest-low-priority rule acts where a VC cell is bound to a physical one.
    """

    def __init__(self, allocator: CellAllocator, tenant: str, *, least_preemption: bool = False) -> None:
        self.tenant = tenant
        self._allocator = allocator
        self._least_preemption = least_preemption
        hierarchy = allocator.hierarchy
        vc = allocator.vc(tenant)
        self._gpus = [hierarchy.gpus(level) for level in range(1, hierarchy.top + 1)]
        self._root_levels = [level for level in sorted(vc, reverse=True) for _ in range(vc[level])]
        self._free = FreeLists(self._root_levels, [level.buddies for level in hierarchy.levels])
        self._bound: dict[int, Cell] = {}

    def capacity(self, level: int) -> int:
        """How many cells of `level` the VC can give its jobs now (what its private cluster could)."""
        return self._free.capacity(level, self._gpus)

    def whole_capacity(self, level: int) -> int:
        """How many cells of `level` the VC could give its jobs with none of them running: a request for more can
        never be met in it."""
        return sum(self._gpus[root - 1] // self._gpus[level - 1] for root in self._root_levels if root >= level)

    def allocate(self, level: int) -> Piece | None:
        """A cell of `level` for one of the tenant's jobs, bound and occupied; None if the VC has none free.
        RuntimeError, changing nothing, when no physical cell can serve it (only where cells are excluded)."""
        if self._least_preemption:
            return self._allocate_least_preemption(level)
        candidates = self._free.candidates(level)
        if not candidates:
            return None
        return self._take(min(candidates, key=self._preference))

    def _allocate_least_preemption(self, level: int) -> Piece | None:
        """A YARN-like choice: of every free cell of `level`, the one whose low-priority GPUs are fewest (the
        fewest preemptions), then one of a cell already bound (packing), then the lowest path. An unbound VC
        cell counts the low-priority GPUs of the cleanest physical cell a bind could take."""
        candidates = self._free.every(level)
        if not candidates:
            return None
        unbound = min(
            (self._allocator.low_gpus(cell) for cell in self._allocator.bindable(max(self._root_levels))), default=0
        )

        def cost(virtual: Cell) -> tuple[int, bool, Cell]:
            bound = virtual[0] in self._bound
            return (self._allocator.low_gpus(self._physical(virtual)) if bound else unbound, not bound, virtual)

        return self._take(min(candidates, key=cost))

    def _take(self, virtual: Cell) -> Piece:
        root = virtual[0]
        newly_bound = root not in self._bound
        if newly_bound:
            self._bound[root] = self._allocator.bind(self.tenant, self._root_levels[root])
        physical = self._physical(virtual)
        try:
            preempted = self._allocator.occupy(physical)
        except RuntimeError:
            if newly_bound:
                self._allocator.unbind(self.tenant, self._bound.pop(root))
            raise
        self._free.take(virtual)
        return Piece(virtual, physical, preempted)

    def restore(self, root: int, physical: Cell) -> Cell:
        """Mark in use the piece of VC cell `root` bound at `physical`, as an `allocate` before had placed it
        (to rebuild state each round), and return its virtual cell; a ValueError when that contradicts what
        is already restored or the VC has no such cell."""
        if not 0 <= root < len(self._root_levels):
            raise ValueError(f"tenant {self.tenant}'s VC has {len(self._root_levels)} cells, so no cell {root}")
        depth = self._allocator.hierarchy.top - self._root_levels[root] + 1  # the root's path length
        if len(physical) < depth:
            raise ValueError(f"{physical} is larger than tenant {self.tenant}'s VC cell {root}")
        root_cell, virtual = physical[:depth], (root, *physical[depth:])
        if root not in self._bound:
            self._allocator.bind_cell(self.tenant, root_cell)
            self._bound[root] = root_cell
        elif self._bound[root] != root_cell:
            raise ValueError(f"tenant {self.tenant}'s VC cell {root} is bound to {self._bound[root]}, not {root_cell}")
        self._free.take(virtual)
        self._allocator.occupy(physical)
        return virtual

    def release(self, virtual: Cell) -> None:
        """A job leaves a piece; the VC cell is unbound once none of it is used."""
        self._allocator.vacate(self._physical(virtual))
        self._free.give(virtual)
        root = virtual[0]
        if self._free.is_free((root,)):
            self._allocator.unbind(self.tenant, self._bound.pop(root))

    def _physical(self, virtual: Cell) -> Cell:
        return self._bound[virtual[0]] + virtual[1:]

    def _preference(self, virtual: Cell) -> tuple[bool, Cell]:
        return (virtual[0] not in self._bound, virtual)
