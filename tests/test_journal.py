"""The group-commit journal's contract (datamgr/journal.py), on the in-memory store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from datamgr.entities import Node, ResourceExhausted, StateDiskUnwritable
from datamgr.journal import GroupCommitJournal, JournalEntry
from datamgr.state import Change
from datamgr.store import Commit, MemoryStore, StoreFull, StoreUnwritable
from silodpb.v1 import datamgr_pb2 as pb


class _RecordingStore(MemoryStore):
    """The in-memory store, recording the revisions of each batch it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def commit(self, commits: Sequence[Commit]) -> None:
        self.batches.append([c.revision for c in commits])
        super().commit(commits)


class _FailingStoreFake(_RecordingStore):
    """Fails every commit with `error`: a disk fault a real store does not produce on demand."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def commit(self, commits: Sequence[Commit]) -> None:
        self.batches.append([c.revision for c in commits])
        raise self.error


def entry(revision: int, node_id: str = "n1") -> JournalEntry:
    node = Node(f"node{revision}", "h:1", 100)
    undo = Change(nodes_deleted=(node.node_id,))
    return JournalEntry(revision, Change(nodes_put=(node,)), undo, {node_id: pb.WatchEvent(revision=revision)}, "")


class Journaled:
    """A journal over `store` that records what it publishes and rolls back."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.published: list[tuple[str, int, int]] = []  # node, event revision, store revision when published
        self.rolled_back: list[int] = []
        self.journal = GroupCommitJournal(store, self._publish, self._rollback)

    def _publish(self, node_id: str, event: pb.WatchEvent) -> None:
        self.published.append((node_id, event.revision, self.store.load().revision))

    def _rollback(self, entries: Sequence[JournalEntry]) -> None:
        self.rolled_back.extend(e.revision for e in entries)


def test_concurrent_writes_share_a_commit_and_each_returns_once_durable() -> None:
    journaled = Journaled(_RecordingStore())

    async def write(revision: int) -> int:
        await journaled.journal.write(entry(revision))
        return journaled.store.load().revision

    async def scenario() -> list[int]:
        durable_at_return = await asyncio.gather(*(write(r) for r in range(1, 9)))
        await journaled.journal.close()
        return list(durable_at_return)

    durable_at_return = asyncio.run(scenario())
    assert all(durable >= revision for revision, durable in enumerate(durable_at_return, start=1))
    batches = journaled.store.batches  # type: ignore[attr-defined]
    assert [r for batch in batches for r in batch] == list(range(1, 9))  # in order, each once
    assert len(batches) < 8  # group commit: fewer store commits than writes
    assert journaled.published == [
        ("n1", r, durable) for r, durable in zip(range(1, 9), durable_at_return, strict=True)
    ]
    assert all(event <= durable for _, event, durable in journaled.published)  # never before it is on disk
    assert journaled.journal.oldest_pending() is None


@pytest.mark.expected_warnings
@pytest.mark.parametrize(
    ("error", "refusal"),
    [
        (OSError("disk on fire"), OSError),
        (StoreFull("no room"), ResourceExhausted),
        (StoreUnwritable("read-only"), StateDiskUnwritable),
    ],
)
def test_a_failed_batch_rolls_back_every_waiting_entry_newest_first_and_fails_their_callers(
    error: Exception, refusal: type[Exception]
) -> None:
    journaled = Journaled(_FailingStoreFake(error))
    heard_after_rollback: list[bool] = []

    async def write(revision: int) -> None:
        try:
            await journaled.journal.write(entry(revision))
        except refusal:
            heard_after_rollback.append(revision in journaled.rolled_back)
            raise

    async def scenario() -> list[BaseException | None]:
        results = await asyncio.gather(*(write(r) for r in (4, 5, 6)), return_exceptions=True)
        return list(results)

    results = asyncio.run(scenario())
    assert all(isinstance(result, refusal) for result in results), results
    assert journaled.rolled_back == [6, 5, 4]
    assert heard_after_rollback == [True, True, True]
    assert journaled.published == [] and journaled.store.load().revision == 0


@pytest.mark.expected_warnings
@pytest.mark.parametrize(("may_reappear", "told"), [(False, "nothing was changed"), (True, "may bring it back")])
def test_a_caller_is_told_whether_a_restart_may_bring_back_its_refused_change(may_reappear: bool, told: str) -> None:
    journaled = Journaled(_FailingStoreFake(StoreUnwritable("silod.db: disk I/O error", may_reappear=may_reappear)))

    async def scenario() -> BaseException | None:
        (result,) = await asyncio.gather(journaled.journal.write(entry(1)), return_exceptions=True)
        return result

    refusal = asyncio.run(scenario())
    assert isinstance(refusal, StateDiskUnwritable), refusal
    assert told in str(refusal) and "silod.db: disk I/O error" in str(refusal)
    assert ("nothing was changed" in str(refusal)) is not may_reappear


def test_a_caller_that_goes_away_does_not_cancel_the_shared_write() -> None:
    journaled = Journaled(_RecordingStore())

    async def scenario() -> None:
        abandoned = asyncio.create_task(journaled.journal.write(entry(1)))
        await asyncio.sleep(0)  # the write is under way
        abandoned.cancel()
        await journaled.journal.close()

    asyncio.run(scenario())
    assert journaled.store.load().revision == 1 and [n for n, _, _ in journaled.published] == ["n1"]


@pytest.mark.expected_warnings
def test_settled_waits_for_what_was_written_and_raises_if_it_failed() -> None:
    async def settle(journaled: Journaled) -> int:
        writing = asyncio.create_task(journaled.journal.write(entry(1)))
        await asyncio.sleep(0)
        assert journaled.journal.oldest_pending() == 1
        try:
            await journaled.journal.settled()
        finally:
            await asyncio.gather(writing, return_exceptions=True)
        return journaled.store.load().revision

    assert asyncio.run(settle(Journaled(_RecordingStore()))) == 1
    with pytest.raises(OSError, match="disk on fire"):
        asyncio.run(settle(Journaled(_FailingStoreFake(OSError("disk on fire")))))
