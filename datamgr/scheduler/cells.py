"""HiveD's cells (its section 3): the levels of a GPU cluster's affinity hierarchy, and buddy free lists.

A level-k cell is h_k *buddy* level-(k-1) cells, the same way everywhere (hierarchical uniform composability):
`[("gpu", 1), ("pcie", 2), ("socket", 2), ("node", 2), ("rack", 4)]` is 8-GPU nodes of two sockets of two PCIe
switches of two GPUs, four to a rack. A cell is named by its path of indices from the top: with 2 racks a GPU
is (rack, node, socket, pcie, gpu), a node (rack, node), a rack (rack,). Paths are stable across runs,
hashable and ordered, so every choice made among them is deterministic.

`FreeLists` is Algorithm 1's `free_cells` over a *forest* of root cells: the physical cluster (roots: its top
cells) or a tenant's virtual cluster (roots: the cells its VC reserves, at whatever levels), with free cells
always kept at the highest level they can be.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

Cell = tuple[int, ...]

# The most GPUs one cell may hold, this code's choice: 2^20, more than any single cluster has, and few enough
# that a hierarchy's free lists and node maps stay small. `--cell-levels gpu:1,node:2,rack:1000000000` would
# otherwise describe billions of node cells that a round, or even a check of the levels, could never hold.
MAX_CELL_GPUS = 1 << 20


class Level(NamedTuple):
    """A level of the hierarchy: its name and h_k, how many buddy cells of the level below make one of it."""

    name: str
    buddies: int


class CellRequest(NamedTuple):
    """What a job asks for: `number` cells of `level`."""

    level: int
    number: int


def parse_levels(spec: str) -> tuple[tuple[str, int], ...]:
    """ "gpu:1,pcie:2,socket:2,node:2,rack:4" (bottom up, NAME:BUDDIES) as (name, h_k) pairs; a ValueError that
    quotes the part it cannot read."""
    levels: list[tuple[str, int]] = []
    for part in (part.strip() for part in spec.split(",")):
        name, _, count = part.partition(":")
        if not name.strip() or not count.strip().isdigit():
            raise ValueError(f"cell level {part!r} is not NAME:BUDDIES (such as 'socket:2')")
        levels.append((name.strip(), int(count)))
    return tuple(levels)


def _cell_gpus(levels: Sequence[Level]) -> tuple[int, ...]:
    """g_k for every level bottom up; a ValueError naming the first level whose cell holds more than
    `MAX_CELL_GPUS` GPUs (checked before anything is enumerated)."""
    gpus: list[int] = []
    for level in levels:
        held = (gpus[-1] if gpus else 1) * level.buddies
        if held > MAX_CELL_GPUS:
            raise ValueError(
                f"level {level.name}:{level.buddies} makes cells of {held:,} GPUs; silod allows at most "
                f"{MAX_CELL_GPUS:,} GPUs in one cell"
            )
        gpus.append(held)
    return tuple(gpus)


class _NodeMaps(NamedTuple):
    """A hierarchy's node cells: the silod node ids in path order, and both ways between cell and id."""

    ids: tuple[str, ...]
    node_of: dict[Cell, str]
    node_cell: dict[str, Cell]


class CellHierarchy:
    """The physical cells of one homogeneous pool, and how they map to silod's nodes. Immutable.

    `levels` lists the levels bottom up as (name, h_k); the first level is one GPU (h_1 = 1). `top_cells` is
    how many cells of the top level there are. The level named `node_level` is silod's node: `node_ids` names
    its cells in path order (their cell names by default), which `placement` uses to turn cells into GPUs per
    node. A level whose cell would hold more than `MAX_CELL_GPUS` GPUs is a ValueError naming it. The node
    cells are enumerated only when first needed, so a hierarchy built to check levels or to size cells
    (`CellHierarchy(levels, 1)`) costs nothing however many nodes a top cell has.
    """

    def __init__(
        self,
        levels: Sequence[tuple[str, int]],
        top_cells: int,
        *,
        node_level: str = "node",
        node_ids: Sequence[str] | None = None,
    ) -> None:
        self.levels = tuple(Level(name, buddies) for name, buddies in levels)
        self.top_cells = top_cells
        names = [level.name for level in self.levels]
        if not self.levels:
            raise ValueError("a cell hierarchy needs at least one level")
        if len(set(names)) != len(names):
            raise ValueError(f"level names repeat: {names}")
        if self.levels[0].buddies != 1:
            raise ValueError(
                f"the lowest level ({names[0]}) is one GPU, so it is made of 1, not {self.levels[0].buddies}"
            )
        for level in self.levels:
            if level.buddies < 1:
                raise ValueError(f"level {level.name} is made of {level.buddies} cells; at least 1 is needed")
        if top_cells < 1:
            raise ValueError(f"a hierarchy needs at least one top-level cell, not {top_cells}")
        self.top = len(self.levels)
        self.node_level = self.level(node_level)
        self._gpus = _cell_gpus(self.levels)
        nodes = top_cells * self._gpus[-1] // self._gpus[self.node_level - 1]
        ids = tuple(node_ids) if node_ids is not None else None
        if ids is not None and len(ids) != nodes:
            raise ValueError(f"{len(ids)} node ids for {nodes} {node_level} cells")
        if ids is not None and len(set(ids)) != len(ids):
            raise ValueError("node ids repeat")
        self._given_ids = ids
        self._nodes: _NodeMaps | None = None

    @classmethod
    def over_nodes(cls, levels: Sequence[tuple[str, int]], node_ids: Sequence[str]) -> CellHierarchy:
        """The hierarchy of `levels` over exactly these nodes, in the order given: as many top cells as the
        nodes fill, which they must fill whole."""
        probe = cls(levels, 1)
        per_top = probe.gpus(probe.top) // probe.gpus(probe.node_level)
        if len(node_ids) % per_top:
            raise ValueError(
                f"{len(node_ids)} nodes do not fill whole {probe.level_name(probe.top)} cells of {per_top} nodes"
            )
        return cls(levels, len(node_ids) // per_top, node_ids=node_ids)

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The silod node of each node cell, in path order."""
        return self._node_maps().ids

    def _node_maps(self) -> _NodeMaps:
        """The node cells and their silod nodes, enumerated on first use."""
        if self._nodes is None:
            cells = self.cells(self.node_level)
            ids = self._given_ids if self._given_ids is not None else tuple(self.name(cell) for cell in cells)
            self._nodes = _NodeMaps(ids, dict(zip(cells, ids, strict=True)), dict(zip(ids, cells, strict=True)))
        return self._nodes

    @property
    def total_gpus(self) -> int:
        return self.top_cells * self.gpus(self.top)

    def level(self, name: str) -> int:
        """The level called `name`, numbered as the paper does: 1 for the lowest (GPU)."""
        for number, level in enumerate(self.levels, start=1):
            if level.name == name:
                return number
        raise ValueError(f"no level {name!r}; the levels are {[level.name for level in self.levels]}")

    def level_name(self, level: int) -> str:
        self.check_level(level)
        return self.levels[level - 1].name

    def describe(self, level: int) -> str:
        """`level 3 (socket)`, for messages."""
        return f"level {level} ({self.level_name(level)})"

    def check_level(self, level: int) -> None:
        if not 1 <= level <= self.top:
            raise ValueError(f"no level {level}; the levels are 1..{self.top}")

    def gpus(self, level: int) -> int:
        """g_k: the GPUs in a cell of `level` (h_1 h_2 ... h_k)."""
        self.check_level(level)
        return self._gpus[level - 1]

    def buddies_at(self, level: int) -> int:
        """h_k: the cells of the level below one cell of `level` splits into."""
        return self.levels[level - 1].buddies

    def level_of(self, cell: Cell) -> int:
        if not 1 <= len(cell) <= self.top:
            raise ValueError(f"{cell} is no cell: a path from the top has 1..{self.top} indices")
        for depth, index in enumerate(cell):
            bound = self.top_cells if depth == 0 else self.levels[self.top - depth].buddies
            if not 0 <= index < bound:
                raise ValueError(f"{cell} is no cell: index {index} at depth {depth} is not below {bound}")
        return self.top - len(cell) + 1

    def name(self, cell: Cell) -> str:
        """The cell's stable name, e.g. `rack0/node3/socket1/pcie0/gpu1`."""
        self.level_of(cell)
        return "/".join(f"{self.levels[self.top - depth - 1].name}{index}" for depth, index in enumerate(cell))

    def cells(self, level: int) -> tuple[Cell, ...]:
        """Every physical cell of `level`, in path order."""
        self.check_level(level)
        ranges = [range(self.top_cells)] + [range(self.levels[k - 1].buddies) for k in range(self.top, level, -1)]
        return tuple(itertools.product(*ranges))

    def index(self, cell: Cell) -> int:
        """The cell's position among the cells of its level in path order (`cell_at` inverts it)."""
        self.level_of(cell)
        position = cell[0]
        for depth, index in enumerate(cell[1:], start=1):
            position = position * self.levels[self.top - depth].buddies + index
        return position

    def cell_at(self, level: int, position: int) -> Cell:
        """The `position`-th cell of `level` in path order."""
        self.check_level(level)
        count = self.top_cells * self.gpus(self.top) // self.gpus(level)
        if not 0 <= position < count:
            raise ValueError(f"there are {count} cells of {self.describe(level)}, so none at {position}")
        path: list[int] = []
        for k in range(level + 1, self.top + 1):
            position, index = divmod(position, self.levels[k - 1].buddies)
            path.append(index)
        return (position, *reversed(path))

    def descendants(self, cell: Cell, level: int) -> Iterator[Cell]:
        """The cells of `level` inside `cell` (`cell` itself at its own level), in path order."""
        own = self.level_of(cell)
        if not 1 <= level <= own:
            raise ValueError(f"{self.describe(level)} is not at or below {self.name(cell)}")
        for rest in itertools.product(*(range(self.levels[k - 1].buddies) for k in range(own, level, -1))):
            yield cell + rest

    def buddies(self, cell: Cell) -> tuple[Cell, ...]:
        """The other cells its parent splits into; none for a top-level cell, which has no parent."""
        level = self.level_of(cell)
        if level == self.top:
            return ()
        return tuple((*cell[:-1], i) for i in range(self.buddies_at(level + 1)) if i != cell[-1])

    def node_of(self, cell: Cell) -> str:
        """The silod node holding a cell at or below the node level."""
        if self.level_of(cell) > self.node_level:
            raise ValueError(f"{self.name(cell)} spans several nodes")
        return self._node_maps().node_of[cell[: self.top - self.node_level + 1]]

    def node_cell(self, node_id: str) -> Cell:
        """The node-level cell of a silod node."""
        node_cell = self._node_maps().node_cell
        if node_id not in node_cell:
            raise ValueError(f"no node {node_id!r} in the cell hierarchy")
        return node_cell[node_id]

    def node_gpus(self, node_id: str) -> list[Cell]:
        """The GPU cells of a silod node, in path order."""
        return list(self.descendants(self.node_cell(node_id), 1))

    def nodes_in(self, cell: Cell) -> list[str]:
        """The silod nodes a cell covers, in path order: one for a cell at or below the node level."""
        level = self.level_of(cell)
        if level <= self.node_level:
            return [self.node_of(cell)]
        node_of = self._node_maps().node_of
        return [node_of[node] for node in self.descendants(cell, self.node_level)]

    def placement(self, cells: Iterable[Cell], gpus: int) -> dict[str, int]:
        """A job of `gpus` GPUs on `cells`, as silod places jobs (GPUs per node): the cells' GPUs taken in path
        order until the job has its GPUs. A job that needs fewer GPUs than its cell (3 in a 4-GPU socket) holds
        the whole cell but uses only its GPUs."""
        placement: dict[str, int] = {}
        left = gpus
        for cell in cells:
            level = self.level_of(cell)
            per_node = self.gpus(min(level, self.node_level))
            for node in self.nodes_in(cell):
                used = min(per_node, left)
                if used:
                    placement[node] = placement.get(node, 0) + used
                    left -= used
        if left:
            raise ValueError(f"cells of {gpus - left} GPUs cannot hold a job of {gpus}")
        return placement

    def request_for(self, gpus: int, *, within: int | None = None) -> CellRequest:
        """The cells a job of `gpus` GPUs asks for: one cell of the smallest level that holds them all; or,
        for a job larger than a node, ceil(gpus / node GPUs) node cells. `within` asks for all of them in one
        cell no higher than that level (a rack, say); a ValueError when no such cell holds them."""
        if not 1 <= gpus <= self.total_gpus:
            raise ValueError(f"a job of {gpus} GPUs does not fit a cluster of {self.total_gpus}")
        if within is not None:
            self.check_level(within)
        node_gpus = self.gpus(self.node_level)
        if gpus > node_gpus and within is None:
            return CellRequest(self.node_level, math.ceil(gpus / node_gpus))
        fitting = [level for level in range(1, self.top + 1) if self.gpus(level) >= gpus]
        if not fitting or (within is not None and fitting[0] > within):
            bound = self.describe(within if within is not None else self.top)
            raise ValueError(f"a job of {gpus} GPUs fits no single cell of {bound} or below")
        return CellRequest(fitting[0], 1)


class FreeLists:
    """Algorithm 1's `free_cells` over a forest: root `i` is a cell of level `root_levels[i]`, a cell is a
    path `(i, index, index, ...)` down from its root, and `buddies[k - 1]` (h_k) cells of level k - 1 make
    one of level k. Free cells are always at the highest level they can be: a cell is split only along the
    path down to the cell taken, and a freed cell merges with its buddies while they are all free."""

    def __init__(self, root_levels: Sequence[int], buddies: Sequence[int]) -> None:
        self._roots = tuple(root_levels)
        self._buddies = tuple(buddies)
        self._free: dict[int, set[Cell]] = {level: set() for level in range(1, len(buddies) + 1)}
        for root, level in enumerate(self._roots):
            self._free[level].add((root,))

    @classmethod
    def physical(cls, hierarchy: CellHierarchy) -> FreeLists:
        """The physical cluster's free lists: every top cell free, paths as `CellHierarchy` names them."""
        return cls([hierarchy.top] * hierarchy.top_cells, [level.buddies for level in hierarchy.levels])

    def level_of(self, cell: Cell) -> int:
        return self._roots[cell[0]] - len(cell) + 1

    def lists(self) -> dict[int, tuple[Cell, ...]]:
        return {level: tuple(sorted(cells)) for level, cells in self._free.items()}

    def counts(self) -> dict[int, int]:
        return {level: len(cells) for level, cells in self._free.items()}

    def is_free(self, cell: Cell) -> bool:
        """Whether `cell` is one of the free cells as they stand (not merely inside one)."""
        return cell in self._free[self.level_of(cell)]

    def capacity(self, level: int, gpus_of: Sequence[int]) -> int:
        """How many cells of `level` the free cells can give, splitting as needed (`gpus_of[k - 1]`: g_k)."""
        return sum(len(cells) * (gpus_of[k - 1] // gpus_of[level - 1]) for k, cells in self._free.items() if k >= level)

    def candidates(self, level: int) -> list[Cell]:
        """The level-`level` cells Algorithm 1 may hand out next, in path order: the free ones, or (none) those
        inside the free cells of the lowest level above that has any; [] if there are none."""
        for above in range(level, len(self._buddies) + 1):
            if self._free[above]:
                return [part for cell in sorted(self._free[above]) for part in self._inside(cell, above, level)]
        return []

    def every(self, level: int) -> list[Cell]:
        """Every free cell of `level`, split from a free cell above or not, in path order."""
        above = range(level, len(self._buddies) + 1)
        return sorted(part for k in above for cell in self._free[k] for part in self._inside(cell, k, level))

    def _inside(self, cell: Cell, own: int, level: int) -> Iterator[Cell]:
        for rest in itertools.product(*(range(self._buddies[k - 1]) for k in range(own, level, -1))):
            yield cell + rest

    def covering(self, cell: Cell) -> Cell | None:
        """The free cell that `cell` is, or lies inside; None when some of it is in use."""
        for depth in range(len(cell), 0, -1):
            if cell[:depth] in self._free[self.level_of(cell[:depth])]:
                return cell[:depth]
        return None

    def take(self, cell: Cell) -> None:
        """Mark `cell` in use, splitting the free cell around it (Algorithm 1's Split, down its path); a
        ValueError if some of it is in use already."""
        around = self.covering(cell)
        if around is None:
            raise ValueError(f"cell {cell} is not free")
        self._free[self.level_of(around)].remove(around)
        for depth in range(len(around), len(cell)):
            level = self.level_of(cell[:depth])
            for index in range(self._buddies[level - 1]):
                if index != cell[depth]:
                    self._free[level - 1].add((*cell[:depth], index))

    def give(self, cell: Cell) -> None:
        """Free `cell`, merging it with its buddies while they are all free (Algorithm 1's ReleaseCell)."""
        level = self.level_of(cell)
        while len(cell) > 1:
            parent = cell[:-1]
            buddies = [(*parent, i) for i in range(self._buddies[level]) if i != cell[-1]]
            if not all(buddy in self._free[level] for buddy in buddies):
                break
            self._free[level].difference_update(buddies)
            cell, level = parent, level + 1
        self._free[level].add(cell)
