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
from tests.datamgr_fixtures import make_local_dataset


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
