"""HiveD's pure core (the paper's section 3): the cell hierarchy and its ids, the feasibility of a VC
assignment (Eq. 2 with nothing allocated), Algorithm 1's split and merge with free cells kept at the highest
level, legality, Theorem 1 on random legal sequences, low-priority cells and the fewest-dirty-GPUs rule, and
the cells a job of some GPUs asks for."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from datamgr.scheduler.cells import MAX_CELL_GPUS, Cell, CellHierarchy, CellRequest, parse_levels
from datamgr.scheduler.hived import (
    CellAllocator,
    IllegalRequest,
    LowCell,
    VirtualCluster,
    check_feasible,
    infeasibility,
)
from datamgr.tenants import guarantee_lost

FIVE_LEVELS = [("gpu", 1), ("pcie", 2), ("socket", 2), ("node", 2), ("rack", 2)]  # 8-GPU nodes, 2 per rack
GPU, PCIE, SOCKET, NODE, RACK = 1, 2, 3, 4, 5
TWO_SMALL_NODES = [("gpu", 1), ("pcie", 2), ("node", 2)]  # the paper's Figure 2: 4-GPU nodes, 2 PCIe switches


def racks(count: int = 2, node_ids: list[str] | None = None) -> CellHierarchy:
    return CellHierarchy(FIVE_LEVELS, count, node_ids=node_ids)


def small_nodes() -> CellHierarchy:
    return CellHierarchy(TWO_SMALL_NODES, 2)


def initial_free(hierarchy: CellHierarchy) -> dict[int, tuple[Cell, ...]]:
    """Algorithm 1's initial state: only the top level has cells."""
    return {level: hierarchy.cells(level) if level == hierarchy.top else () for level in range(1, hierarchy.top + 1)}


def test_hierarchy_levels_gpus_and_stable_cell_ids() -> None:
    hierarchy = racks()
    assert [hierarchy.level(name) for name in ("gpu", "pcie", "socket", "node", "rack")] == [1, 2, 3, 4, 5]
    assert [hierarchy.gpus(level) for level in range(1, 6)] == [1, 2, 4, 8, 16]
    assert hierarchy.total_gpus == 32
    assert len(hierarchy.cells(GPU)) == 32 and hierarchy.cells(RACK) == ((0,), (1,))
    gpu = (1, 0, 1, 0, 1)
    assert hierarchy.name(gpu) == "rack1/node0/socket1/pcie0/gpu1"
    assert hierarchy.level_of(gpu) == GPU and hierarchy.level_of((1, 0)) == NODE
    assert hierarchy.buddies(gpu) == ((1, 0, 1, 0, 0),)
    assert [hierarchy.cell_at(NODE, hierarchy.index(node)) for node in hierarchy.cells(NODE)] == list(
        hierarchy.cells(NODE)
    )
    assert hierarchy.index(gpu) == 16 + 5 and hierarchy.cell_at(GPU, 21) == gpu
    with pytest.raises(ValueError, match=r"there are 4 cells of level 4 \(node\), so none at 4"):
        hierarchy.cell_at(NODE, 4)
    assert hierarchy.buddies((1,)) == ()  # top cells have no parent to merge into
    assert hierarchy.node_ids == ("rack0/node0", "rack0/node1", "rack1/node0", "rack1/node1")
    assert hierarchy.node_of(gpu) == "rack1/node0"
    with pytest.raises(ValueError, match="is no cell"):
        hierarchy.level_of((2, 0))
    with pytest.raises(ValueError, match="is no cell"):
        hierarchy.level_of((0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("levels", "top", "node_ids", "message"),
    [
        ([("gpu", 1), ("gpu", 2), ("node", 2)], 1, None, "level names repeat"),
        ([("gpu", 2), ("node", 2)], 1, None, "lowest level"),
        ([("gpu", 1), ("pcie", 2)], 1, None, "no level 'node'"),
        ([("gpu", 1), ("node", 0)], 1, None, "at least 1"),
        ([("gpu", 1), ("node", 4)], 0, None, "at least one top-level cell"),
        ([("gpu", 1), ("node", 4)], 2, ["a"], "1 node ids for 2 node cells"),
        ([("gpu", 1), ("node", 4)], 2, ["a", "a"], "node ids repeat"),
    ],
)
def test_a_bad_hierarchy_description_is_rejected(
    levels: list[tuple[str, int]], top: int, node_ids: list[str] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CellHierarchy(levels, top, node_ids=node_ids)


def test_placement_turns_a_jobs_cells_into_gpus_per_silod_node() -> None:
    hierarchy = racks(1, node_ids=["n0", "n1"])
    assert hierarchy.placement([(0, 1, 1, 0, 1)], 1) == {"n1": 1}
    assert hierarchy.placement([(0, 0, 1)], 3) == {"n0": 3}  # 3 GPUs of a 4-GPU socket cell
    assert hierarchy.placement([(0,)], 16) == {"n0": 8, "n1": 8}
    assert hierarchy.placement([(0, 1), (0, 0)], 12) == {"n1": 8, "n0": 4}  # filled in the cells' order
    with pytest.raises(ValueError, match="cells of 8 GPUs cannot hold a job of 9"):
        hierarchy.placement([(0, 1)], 9)
    with pytest.raises(ValueError, match="spans several nodes"):
        hierarchy.node_of((0,))


def test_a_hierarchy_over_silod_nodes_fills_whole_top_cells() -> None:
    nodes = [f"n{i}" for i in range(4)]
    hierarchy = CellHierarchy.over_nodes(FIVE_LEVELS, nodes)
    assert hierarchy.top_cells == 2 and hierarchy.node_of((1, 0)) == "n2"
    with pytest.raises(ValueError, match="3 nodes do not fill whole rack cells of 2 nodes"):
        CellHierarchy.over_nodes(FIVE_LEVELS, nodes[:3])


@pytest.mark.parametrize(
    ("spec", "message"),
    [("gpu:1,node", "'node' is not NAME:BUDDIES"), ("gpu:1,node:x", "'node:x'"), (":2", "':2'")],
)
def test_a_level_spec_that_cannot_be_read_is_quoted(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_levels(spec)
    assert parse_levels("gpu:1, pcie:2,node:2") == (("gpu", 1), ("pcie", 2), ("node", 2))


def test_an_infeasible_vc_assignment_names_the_highest_level_that_does_not_fit() -> None:
    hierarchy = racks()  # 2 racks, 32 GPUs
    # 16 + 16 + 4 GPUs: the rack and the two nodes fit, the socket finds nothing left.
    with pytest.raises(ValueError, match=r"does not fit at level 3 \(socket\).*reserve 1 cells there \(c: 1\)") as err:
        check_feasible(hierarchy, {"a": {RACK: 1}, "b": {NODE: 2}, "c": {SOCKET: 1}})
    assert "36 GPUs reserved" in str(err.value) and "on its own" not in str(err.value)
    with pytest.raises(ValueError, match=r"level 5 \(rack\).*\(a: 2, b: 1\).*2 are left"):
        check_feasible(hierarchy, {"a": {RACK: 2}, "b": {RACK: 1}})
    with pytest.raises(ValueError, match=r"level 4 \(node\).*on its own, the VC of tenant big does not fit"):
        CellAllocator(hierarchy, {"big": {NODE: 5}, "small": {GPU: 1}})
    check_feasible(hierarchy, {"a": {RACK: 1}, "b": {NODE: 1, SOCKET: 1, PCIE: 1, GPU: 2}})  # exactly 32 GPUs


@pytest.mark.parametrize(
    ("vcs", "message"),
    [({"a": {6: 1}}, "tenant a: no level 6"), ({"a": {0: 1}}, "no level 0"), ({"a": {GPU: -1}}, "-1 cells")],
)
def test_a_vc_with_an_unknown_level_or_a_negative_count_is_rejected(
    vcs: dict[str, dict[int, int]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_feasible(racks(), vcs)


@pytest.mark.parametrize("seed", range(5))
def test_feasible_exactly_when_the_reserved_gpus_fit_the_cluster(seed: int) -> None:
    """The closed form of Eq. 2 at the start: cell sizes divide one another, so only the GPUs count."""
    rng = random.Random(seed)
    hierarchy = racks()
    for _ in range(200):
        vcs = {tenant: {level: rng.randint(0, 3) for level in range(1, 6) if rng.random() < 0.5} for tenant in "abc"}
        reserved = sum(count * hierarchy.gpus(level) for vc in vcs.values() for level, count in vc.items())
        if reserved <= hierarchy.total_gpus:
            check_feasible(hierarchy, vcs)
        else:
            with pytest.raises(ValueError, match="does not fit"):
                check_feasible(hierarchy, vcs)


def test_with_cells_missing_the_vcs_must_fit_the_split_free_lists_not_merely_the_gpus() -> None:
    """A node gone from a rack leaves three node cells and no whole rack: a rack VC of 16 GPUs no longer fits, though
    24 GPUs are there."""
    hierarchy = racks()
    three_nodes = {NODE: 3}
    found = infeasibility(hierarchy, {"a": {RACK: 1}, "b": {NODE: 1}}, three_nodes)
    assert found is not None and (found.level, found.tenants) == (RACK, ("a",))
    assert found.reason.startswith("the VC assignment does not fit at level 5 (rack): the VCs reserve 1 cells there")
    assert "(16 GPUs reserved at this level and above, 24 in the cluster)" in found.reason  # the GPUs would fit
    assert infeasibility(hierarchy, {"a": {RACK: 1}, "b": {NODE: 1}}, {RACK: 1, NODE: 1}) is None
    assert infeasibility(hierarchy, {"a": {NODE: 3}, "b": {SOCKET: 1}}, three_nodes) is not None  # 28 GPUs
    assert infeasibility(hierarchy, {"a": {NODE: 2}, "b": {SOCKET: 2}}, three_nodes) is None
    assert infeasibility(hierarchy, {"a": {NODE: 2}}) is None  # by default every top cell is there


@pytest.mark.parametrize(
    ("cell_levels", "node_gpus", "vcs", "gone", "level"),
    [
        ("gpu:1,node:2", {"n1": 2, "n2": 2}, {"a": {"node": 2}}, {"n2"}, 2),
        ("gpu:1,node:2", {"n1": 2}, {"a": {"node": 1}}, {"n1"}, 2),  # no node left at all
        ("gpu:1,node:2,rack:2", {"n1": 2, "n2": 2, "n3": 2, "n4": 2}, {"a": {"rack": 1}, "b": {"node": 2}}, {"n1"}, 2),
        ("gpu:1,node:2", {"n1": 2, "n2": 2, "n3": 2}, {"a": {"node": 2}}, {"n2"}, None),  # the others hold it
        ("gpu:1,node:2", {"n1": 2, "n2": 2, "n3": 0}, {"a": {"node": 2}}, {"n3"}, None),  # a node without GPUs
        ("gpu:1,node:2", {"n1": 2, "n2": 2}, {"a": {"node": 3}}, {"n2"}, None),  # never fitted: nothing lost
        ("gpu:1,node:2", {"n1": 2, "n2": 2}, {}, {"n2"}, None),  # no tenants
        ("", {"n1": 4, "n2": 4}, {"a": {"node": 2}}, {"n2"}, 2),  # without levels a node is one cell
    ],
)
def test_a_guarantee_is_lost_only_when_the_vcs_fit_the_nodes_with_those_gone_and_not_without(
    cell_levels: str, node_gpus: dict[str, int], vcs: dict[str, dict[str, int]], gone: set[str], level: int | None
) -> None:
    """What the data manager checks when a node is unregistered or stops reporting (`datamgr.tenants`)."""
    lost = guarantee_lost(cell_levels, node_gpus, vcs, gone)
    assert (lost.level if lost is not None else None) == level


def test_a_request_splits_a_higher_cell_only_when_its_level_has_no_free_cell() -> None:
    alloc = CellAllocator(racks(1), {"a": {GPU: 2}})
    assert alloc.allocate("a", GPU).cell == (0, 0, 0, 0, 0)
    # The rack split down one path: one free buddy left at every level below it.
    assert alloc.free_cells() == {1: ((0, 0, 0, 0, 1),), 2: ((0, 0, 0, 1),), 3: ((0, 0, 1),), 4: ((0, 1),), 5: ()}
    assert alloc.allocate("a", GPU).cell == (0, 0, 0, 0, 1)  # the free buddy, nothing more split
    assert alloc.free_cells() == {1: (), 2: ((0, 0, 0, 1),), 3: ((0, 0, 1),), 4: ((0, 1),), 5: ()}


def test_releasing_merges_buddies_back_to_the_highest_level() -> None:
    hierarchy = racks()
    alloc = CellAllocator(hierarchy, {"a": {GPU: 2, SOCKET: 1}, "b": {NODE: 1, PCIE: 1}})
    first, second = alloc.allocate("a", GPU).cell, alloc.allocate("a", GPU).cell
    socket, node, pcie = (
        alloc.allocate("a", SOCKET).cell,
        alloc.allocate("b", NODE).cell,
        alloc.allocate("b", PCIE).cell,
    )
    alloc.release("a", first)
    assert first in alloc.free_cells()[GPU]  # its buddy is still held: no merge
    alloc.release("a", second)
    assert first not in alloc.free_cells()[GPU] and first[:-1] in alloc.free_cells()[PCIE]  # merged into their pcie
    for tenant, cell in (("a", socket), ("b", node), ("b", pcie)):
        alloc.release(tenant, cell)
    assert alloc.free_cells() == initial_free(hierarchy)
    assert alloc.low_free_cells() == initial_free(hierarchy)


def test_a_request_beyond_the_tenants_vc_at_that_level_is_refused() -> None:
    alloc = CellAllocator(racks(), {"a": {GPU: 1, NODE: 1}, "b": {NODE: 2}})
    cell = alloc.allocate("a", GPU).cell
    before = alloc.free_cells()
    assert not alloc.legal("a", GPU)
    with pytest.raises(IllegalRequest, match=r"tenant a holds 1 cells of level 1 \(gpu\) and its VC has 1"):
        alloc.allocate("a", GPU)
    with pytest.raises(IllegalRequest, match=r"level 3 \(socket\) and its VC has 0"):  # free sockets abound
        alloc.allocate("a", SOCKET)
    assert alloc.free_cells() == before and alloc.held("a")[GPU] == (cell,)
    assert alloc.legal("b", NODE, 2) and not alloc.legal("b", NODE, 3)
    with pytest.raises(ValueError, match="no tenant 'c'"):
        alloc.allocate("c", GPU)
    with pytest.raises(ValueError, match="tenant b holds no cell"):
        alloc.release("b", cell)
    alloc.release("a", cell)
    assert alloc.legal("a", GPU)


def test_one_tenants_small_jobs_never_fragment_anothers_node_cell() -> None:
    """The paper's Figure 2 under HiveD: A's 1-GPU and 2-GPU jobs stay in its own node cell whatever their
    order, so B's 4-GPU job finds a whole node, as in its private cluster."""
    alloc = CellAllocator(small_nodes(), {"a": {3: 1}, "b": {3: 1}})
    a, b = VirtualCluster(alloc, "a"), VirtualCluster(alloc, "b")
    singles = [a.allocate(1) for _ in range(4)]  # a1..a4
    assert all(piece is not None for piece in singles)
    a.release(singles[1].virtual)  # type: ignore[union-attr]  # a2 and a4 finish
    a.release(singles[3].virtual)  # type: ignore[union-attr]
    assert a.capacity(2) == 0 and a.allocate(2) is None  # a5 waits: its private node has no free switch either
    b1 = b.allocate(3)
    assert b1 is not None and b1.physical[0] != singles[0].physical[0]  # type: ignore[union-attr]
    assert {piece.physical[0] for piece in singles} == {singles[0].physical[0]}  # type: ignore[union-attr]


def test_a_vc_cell_is_bound_on_first_use_and_unbound_when_its_last_job_leaves() -> None:
    alloc = CellAllocator(racks(), {"a": {NODE: 2}, "b": {NODE: 1}})
    a = VirtualCluster(alloc, "a")
    first = a.allocate(GPU)
    assert first is not None and alloc.held("a")[NODE] == (first.physical[:2],)
    second = a.allocate(PCIE)
    assert second is not None and second.physical[:2] == first.physical[:2]  # packed into the bound node
    assert len(alloc.held("a")[NODE]) == 1 and a.capacity(NODE) == 1
    a.release(first.virtual)
    assert len(alloc.held("a")[NODE]) == 1  # the pair still runs there
    a.release(second.virtual)
    assert alloc.held("a")[NODE] == () and alloc.free_cells() == initial_free(alloc.hierarchy)
    assert alloc.low_free_cells() == initial_free(alloc.hierarchy)


def test_a_vc_job_preempts_the_low_priority_cells_it_needs_and_binds_clean_cells_first() -> None:
    alloc = CellAllocator(small_nodes(), {"a": {3: 1}})
    assert alloc.allocate_low("x", 1) == (0, 0, 0)
    a = VirtualCluster(alloc, "a")
    piece = a.allocate(1)
    assert piece is not None and piece.physical[0] == 1 and piece.preempted == ()  # node 1 is clean
    assert alloc.allocate_low("y", 1) == (0, 0, 1)
    assert alloc.allocate_low("z", 2) == (0, 1)
    assert alloc.allocate_low("w", 1) == (1, 0, 1)  # a low job in the idle GPU of a's bound node
    assert a.allocate(1) == ((0, 0, 1), (1, 0, 1), (LowCell("w", (1, 0, 1)),))
    assert a.capacity(2) == 1 and a.allocate(2) == ((0, 1), (1, 1), ())


def test_a_vc_rebuilt_from_its_pieces_is_the_vc_that_placed_them() -> None:
    alloc = CellAllocator(racks(), {"a": {NODE: 1, PCIE: 1}, "b": {NODE: 2}})
    a = VirtualCluster(alloc, "a")
    pieces = [a.allocate(level) for level in (GPU, PCIE, GPU, SOCKET)]
    assert all(piece is not None for piece in pieces)
    low = alloc.allocate_low("x", NODE)
    rebuilt = CellAllocator(racks(), {"a": {NODE: 1, PCIE: 1}, "b": {NODE: 2}})
    again = VirtualCluster(rebuilt, "a")
    for piece in pieces:
        assert again.restore(piece.virtual[0], piece.physical) == piece.virtual  # type: ignore[union-attr]
    assert low is not None
    rebuilt.take_low("x", low)
    assert rebuilt.free_cells() == alloc.free_cells() and rebuilt.low_free_cells() == alloc.low_free_cells()
    assert again.allocate(GPU) == a.allocate(GPU)
    with pytest.raises(ValueError, match="is not free"):
        again.restore(pieces[0].virtual[0], pieces[0].physical)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="VC has 2 cells, so no cell 5"):
        again.restore(5, (0,))
    with pytest.raises(ValueError, match="is larger than tenant a's VC cell 0"):
        again.restore(0, (0,))


@pytest.mark.parametrize("seed", range(10))
def test_sharing_safety_a_tenants_jobs_land_as_in_its_private_cluster(seed: int) -> None:
    """A tenant's random sequence of jobs, run in the shared cluster beside other tenants' and low-priority
    jobs and alone (its private cluster), is placed identically: same successes, same cells in its VC."""
    rng = random.Random(seed)
    hierarchy = racks()
    vcs = random_tight_vcs(rng, hierarchy, "abc")
    shared = CellAllocator(hierarchy, vcs)
    private = CellAllocator(hierarchy, {"a": vcs["a"]})
    in_shared = {tenant: VirtualCluster(shared, tenant) for tenant in "abc"}
    alone = VirtualCluster(private, "a")
    running: dict[str, list[Cell]] = {tenant: [] for tenant in "abc"}
    placed = 0
    for step in range(600):
        tenant, level = rng.choice("abcx"), rng.randint(1, hierarchy.top)
        if tenant == "x":  # low-priority work from anyone
            low = sorted(shared.low_cells())
            if low and rng.random() < 0.4:
                shared.release_low(rng.choice(low))
            else:
                shared.allocate_low(f"low{step}", level)
        elif running[tenant] and rng.random() < 0.45:
            virtual = running[tenant].pop(rng.randrange(len(running[tenant])))
            in_shared[tenant].release(virtual)
            if tenant == "a":
                alone.release(virtual)
        else:
            piece = in_shared[tenant].allocate(level)
            if tenant == "a":
                expected = alone.allocate(level)
                assert (piece is None) == (expected is None)
                assert piece is None or expected is None or piece.virtual == expected.virtual
                placed += piece is not None
            if piece is not None:
                running[tenant].append(piece.virtual)
        assert min(shared.slack().values()) >= 0
    assert placed > 10


def random_tight_vcs(rng: random.Random, hierarchy: CellHierarchy, tenants: str) -> dict[str, dict[int, int]]:
    """A VC assignment reserving every GPU of the cluster, in cells of random levels: the hardest feasible case."""
    vcs: dict[str, dict[int, int]] = {tenant: {} for tenant in tenants}
    left = hierarchy.total_gpus
    while left:
        level = rng.choice([level for level in range(1, hierarchy.top + 1) if hierarchy.gpus(level) <= left])
        vc = vcs[rng.choice(tenants)]
        vc[level] = vc.get(level, 0) + 1
        left -= hierarchy.gpus(level)
    return vcs


def gpus_in(hierarchy: CellHierarchy, cells: object) -> list[Cell]:
    assert isinstance(cells, list | tuple | set)
    return sorted(gpu for cell in cells for gpu in hierarchy.descendants(cell, GPU))


def assert_views_consistent(alloc: CellAllocator) -> None:
    """Free cells, high- and low-priority cells partition the GPUs in each view; no free cell could merge with
    its buddies (free cells stay at the highest level); Eq. 2 holds at every level."""
    hierarchy = alloc.hierarchy
    high = [cell for tenant in alloc.tenants for cells in alloc.held(tenant).values() for cell in cells]
    low = list(alloc.low_cells())
    everything = list(hierarchy.cells(GPU))
    for free, used in ((alloc.free_cells(), high), (alloc.low_free_cells(), high + low)):
        assert gpus_in(hierarchy, [cell for cells in free.values() for cell in cells] + used) == everything
        for level, cells in free.items():
            for cell in cells:
                assert level == hierarchy.top or not set(hierarchy.buddies(cell)) <= set(cells)
    assert min(alloc.slack().values()) >= 0


@pytest.mark.parametrize("seed", range(20))
def test_theorem_1_every_legal_request_is_satisfied(seed: int) -> None:
    rng = random.Random(seed)
    hierarchy = racks()
    tenants = "abc"
    vcs = random_tight_vcs(rng, hierarchy, tenants)
    alloc = CellAllocator(hierarchy, vcs)
    granted = 0
    for step in range(1000):
        tenant, level = rng.choice(tenants), rng.randint(1, hierarchy.top)
        held = alloc.held(tenant)[level]
        if rng.random() < 0.2:  # low-priority work comes and goes beside it
            low = sorted(alloc.low_cells())
            if low and rng.random() < 0.5:
                alloc.release_low(rng.choice(low))
            else:
                alloc.allocate_low(f"low{step}", level)
        elif alloc.legal(tenant, level) and (not held or rng.random() < 0.7):
            low_before = alloc.low_cells()
            grant = alloc.allocate(tenant, level)  # never fails: Theorem 1
            assert hierarchy.level_of(grant.cell) == level
            assert all(low_before[cell] == owner and cell not in alloc.low_cells() for owner, cell in grant.preempted)
            granted += 1
        elif held:
            alloc.release(tenant, rng.choice(held))
        else:
            with pytest.raises(IllegalRequest):
                alloc.allocate(tenant, level)
        assert_views_consistent(alloc)
    assert granted > 50
    for tenant in tenants:
        for cells in alloc.held(tenant).values():
            for cell in cells:
                alloc.release(tenant, cell)
    for cell in alloc.low_cells():
        alloc.release_low(cell)
    assert alloc.free_cells() == initial_free(hierarchy) == alloc.low_free_cells()


def test_low_priority_jobs_use_any_free_cell_and_are_preempted_by_a_high_priority_request() -> None:
    hierarchy = small_nodes()
    alloc = CellAllocator(hierarchy, {"a": {3: 1}})
    assert alloc.allocate_low("x", 3) == (0,)
    assert alloc.allocate_low("y", 3) == (1,)  # beyond any VC: low priority is not bound by one
    assert alloc.allocate_low("z", 1) is None  # nothing free in the low view
    assert alloc.free_cells() == initial_free(hierarchy)  # the high view does not see them
    grant = alloc.allocate("a", 3)
    assert grant.preempted == (LowCell("x", (0,)),)  # a tie on dirty GPUs: the lowest path
    assert alloc.low_cells() == {(1,): "y"}
    with pytest.raises(ValueError, match="no low-priority job holds node0"):
        alloc.release_low((0,))
    alloc.release("a", grant.cell)
    assert alloc.low_free_cells() == {1: (), 2: (), 3: ((0,),)}


def test_a_high_priority_request_takes_the_free_cell_with_fewest_low_priority_gpus() -> None:
    alloc = CellAllocator(small_nodes(), {"a": {2: 1, 1: 1}})
    placed = {owner: alloc.allocate_low(owner, level) for owner, level in (("x", 2), ("y", 1), ("z", 1), ("w", 1))}
    assert placed == {"x": (0, 0), "y": (0, 1, 0), "z": (0, 1, 1), "w": (1, 0, 0)}
    assert [alloc.low_gpus(pcie) for pcie in ((0, 0), (0, 1), (1, 0), (1, 1))] == [2, 2, 1, 0]
    grant = alloc.allocate("a", 2)
    assert grant == ((1, 1), ())
    # Algorithm 1 splits the free switch of node 1 (not node 0), and takes its GPU that w does not use.
    grant = alloc.allocate("a", 1)
    assert grant == ((1, 0, 1), ())
    alloc.release("a", (1, 1))
    assert alloc.allocate("a", 2) == ((1, 1), ())  # the clean switch again, though node 0 is higher
    assert alloc.low_cells() == {(0, 0): "x", (0, 1, 0): "y", (0, 1, 1): "z", (1, 0, 0): "w"}


def test_the_fewest_low_priority_rule_never_overrides_algorithm_1s_order() -> None:
    """A free cell of the requested level goes first, dirty or not: splitting a higher one instead could break
    Eq. 2 above, which Theorem 1 rests on."""
    alloc = CellAllocator(small_nodes(), {"a": {1: 2}})
    assert alloc.allocate_low("x", 1) == (0, 0, 0)
    assert alloc.allocate("a", 1) == ((0, 0, 1), ())  # node 0 split, away from x's GPU
    assert alloc.free_cells()[1] == ((0, 0, 0),)
    assert alloc.allocate("a", 1) == ((0, 0, 0), (LowCell("x", (0, 0, 0)),))  # though node 1 is clean


def test_the_allocator_keeps_its_own_copy_of_the_vcs() -> None:
    vcs = {"a": {GPU: 1}}
    alloc = CellAllocator(racks(), vcs)
    vcs["a"][GPU] = 5
    assert alloc.vc("a")[GPU] == 1 and not alloc.legal("a", GPU, 2)
    alloc.held("a")[GPU] += ((0, 0, 0, 0, 0),)
    assert alloc.held("a")[GPU] == ()


@pytest.mark.parametrize(
    ("gpus", "within", "asked"),
    [
        (1, None, CellRequest(GPU, 1)),
        (2, None, CellRequest(PCIE, 1)),
        (3, None, CellRequest(SOCKET, 1)),  # a 4-GPU cell: the smallest that holds 3 with affinity
        (4, None, CellRequest(SOCKET, 1)),
        (5, None, CellRequest(NODE, 1)),
        (8, None, CellRequest(NODE, 1)),
        (12, None, CellRequest(NODE, 2)),  # larger than a node: whole nodes
        (16, None, CellRequest(NODE, 2)),
        (32, None, CellRequest(NODE, 4)),
        (16, RACK, CellRequest(RACK, 1)),  # asked to stay in one rack
        (3, SOCKET, CellRequest(SOCKET, 1)),
    ],
)
def test_a_job_asks_for_the_smallest_cell_level_holding_its_gpus(
    gpus: int, within: int | None, asked: CellRequest
) -> None:
    assert racks().request_for(gpus, within=within) == asked


@pytest.mark.parametrize(
    ("gpus", "within", "message"),
    [
        (0, None, "0 GPUs does not fit"),
        (33, None, "33 GPUs does not fit a cluster of 32"),
        (3, PCIE, r"fits no single cell of level 2 \(pcie\) or below"),
        (17, RACK, r"fits no single cell of level 5 \(rack\)"),
    ],
)
def test_a_job_no_cell_can_hold_is_refused(gpus: int, within: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        racks().request_for(gpus, within=within)


def test_a_hierarchy_whose_cells_hold_more_than_a_million_gpus_is_refused_naming_the_level() -> None:
    with pytest.raises(ValueError, match=r"level node:2000000 makes cells of 2,000,000 GPUs; silod allows at most"):
        CellHierarchy([("gpu", 1), ("node", 2_000_000)], 1)
    with pytest.raises(ValueError, match=r"level rack:1000000000 makes cells of 2,000,000,000 GPUs"):
        CellHierarchy([("gpu", 1), ("node", 2), ("rack", 1_000_000_000)], 1)


def test_the_largest_hierarchy_allowed_enumerates_its_node_cells_only_when_asked() -> None:
    """2^20 one-GPU nodes to a rack: sizing its cells (as a check of --cell-levels does) enumerates none of them."""
    tracemalloc.start()
    try:
        hierarchy = CellHierarchy([("gpu", 1), ("node", 1), ("rack", MAX_CELL_GPUS)], 1)
        assert (hierarchy.gpus(3), hierarchy.total_gpus) == (MAX_CELL_GPUS, MAX_CELL_GPUS)
        assert tracemalloc.get_traced_memory()[1] < 1_000_000  # bytes at the peak: 2^20 node cells would be 100s of MB
    finally:
        tracemalloc.stop()
    assert CellHierarchy([("gpu", 1), ("node", 2), ("rack", 2)], 1).node_of((0, 1, 0)) == "rack0/node1"
