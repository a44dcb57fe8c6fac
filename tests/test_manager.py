"""Manager paths that need precise interleaving, driven directly on one event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

from datamgr.listing import freeze_manifest
from datamgr.manager import DataManager
from datamgr.store import SQLiteStore
from silodlib.manifest import Manifest
from tests.datamgr_fixtures import allocations, done_bytes, make_local_dataset, owned_manager, read


def test_two_registrations_racing_through_the_listing_create_the_dataset_once(tmp_path: Path) -> None:
    uri = make_local_dataset(tmp_path / "ds")
    both_listing = threading.Barrier(2, timeout=10)

    def listing_in_lockstep(uri: str, options: Mapping[str, str], chunk_size: int) -> Manifest:
        both_listing.wait()  # neither listing finishes before the other has started
        return freeze_manifest(uri, options, chunk_size)

    async def scenario() -> list[tuple[bool, int]]:
        manager = DataManager(SQLiteStore(tmp_path / "state"), freeze=listing_in_lockstep)
        replies = await asyncio.gather(*(manager.register_dataset(uri, {}, 0) for _ in range(2)))
        await manager.close()
        assert len(manager.state.datasets) == 1
        return [(created, revision) for _, created, revision in replies]

    outcomes = asyncio.run(scenario())
    assert sorted(outcomes) == [(False, 1), (True, 1)]


# ---- what a job has read, across its runs ----


def test_what_a_job_read_is_counted_once_across_reports_in_flight_resumptions_migrations_and_agent_restarts(
    tmp_path: Path,
) -> None:
    """Each node's agent counts a job's reads from when it mounts the job, and again from 0 when it mounts it anew or
    restarts; its reports may arrive after the job left it. Nothing is counted twice, and what is lost is at most
    what a node reported after the job left it."""

    async def scenario() -> None:
        async with owned_manager(tmp_path, "fixed") as (manager, _):
            place = allocations(manager).place
            await manager.register_node("n1", "h1:1", 10_000, gpus=2)
            await manager.register_node("n2", "h2:1", 10_000, gpus=2)
            dataset, _, _ = await manager.register_dataset(make_local_dataset(tmp_path / "a", 10, 1000), {}, 0)
            await manager.register_job("A", dataset.uri, 1000, [], gpus=2)
            await place("A", {"n1": 2})
            manager.report_usage("n1", [], read("A", 3000))
            await place("A", {})
            await place("A", {"n1": 2})  # resumed before n1's agent heard of the preemption
            assert done_bytes(manager, "A") == 3000
            manager.report_usage("n1", [], read("A", 3400))  # sent before it did: the first run's, not banked yet
            assert done_bytes(manager, "A") == 3400
            manager.report_usage("n1", [], read("A", 200))  # the second run's count, from 0: less than the last
            assert done_bytes(manager, "A") == 3600
            manager.report_usage("n1", [], read("A", 700))
            manager.report_usage("n1", [], read("A", 100))  # n1's agent restarted
            assert done_bytes(manager, "A") == 4200
            await place("A", {"n1": 1, "n2": 1})  # n1 keeps it (and its count), n2 mounts it
            manager.report_usage("n2", [], read("A", 300))
            manager.report_usage("n1", [], read("A", 150))
            assert done_bytes(manager, "A") == 4550
            await place("A", {"n2": 2})  # n1 left: the 1250 it reported of its run since the resumption banked
            manager.report_usage("n1", [], read("A", 180))  # in flight: lost, not counted
            manager.report_usage("n1", [], [])
            manager.report_usage("n2", [], read("A", 400))
            assert done_bytes(manager, "A") == 4650
            await place("A", {})
            assert manager.history("A").bytes_read_before == 4650
            await manager.finish_job("A")
            manager.report_usage("n2", [], read("A", 450))  # in flight as A finished
            await manager.register_job("A", dataset.uri, 1000, [], gpus=2)  # another A, which has read nothing
            await place("A", {"n2": 2})
            assert done_bytes(manager, "A") == 0

    asyncio.run(scenario())
