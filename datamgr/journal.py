"""Group commit: the data manager's accepted changes written to the store in batches, each caller answered
once its change is durable.

The data manager applies a change in memory at once (so the next call is validated against it) and hands
it here as a `JournalEntry`. The contract, pinned by tests/test_journal.py:
- `write` returns once its entry is durable, or raises what its batch failed with (a full state disk as
  `ResourceExhausted`, one that refuses writes as `StateDiskUnwritable`, anything else as it is). A caller
  that goes away does not cancel the shared write.
- Entries are written in the order given. One writer commits every entry waiting when it starts a batch,
  so concurrent callers share one store commit (one fsync).
- An entry's watch events are published (and its `on_durable` called), and its change logged, only once its
  batch is durable.
- A batch that fails fails every waiting entry (it and every later one, which were applied on top of it):
  `rollback` gets them newest first, before any of their callers hears, so that nothing that reached no disk
  stays applied. None of them was acknowledged or sent to a node. When the store says the disk may still hold
  them (`StoreUnwritable.may_reappear`: a flush failed and the store could not erase what it wrote), their
  callers and the log are told that a restart may bring them back, rather than that nothing changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from datamgr.entities import ResourceExhausted, StateDiskUnwritable
from datamgr.state import Change
from datamgr.store import Commit, StateStore, StoreFull, StoreUnwritable
from silodpb.v1 import datamgr_pb2 as pb

log = logging.getLogger(__name__)


@dataclass(slots=True)
class JournalEntry:
    """A change applied in memory as `revision`, with what undoes it and the watch event of each node it
    affects; `description` is its line in the change log."""

    revision: int
    change: Change
    undo: Change
    events: dict[str, pb.WatchEvent]
    description: str
    durable: asyncio.Future[None] | None = field(default=None, repr=False)
    on_durable: Callable[[], None] | None = field(default=None, repr=False)  # other publishing (decisions)


class GroupCommitJournal:
    def __init__(
        self,
        store: StateStore,
        publish: Callable[[str, pb.WatchEvent], None],
        rollback: Callable[[Sequence[JournalEntry]], None],
    ) -> None:
        self._store = store
        self._publish = publish
        self._rollback = rollback
        self._pending: list[JournalEntry] = []
        self._writer: asyncio.Task[None] | None = None

    async def write(self, entry: JournalEntry) -> None:
        loop = asyncio.get_running_loop()
        entry.durable = loop.create_future()
        self._pending.append(entry)
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_batches())
        await asyncio.shield(entry.durable)  # a caller that goes away must not cancel a shared commit

    def oldest_pending(self) -> int | None:
        """The revision of the oldest entry not yet durable; None when every entry is."""
        return self._pending[0].revision if self._pending else None

    async def settled(self) -> None:
        """Return once every entry written so far is durable; raise what the last one failed with, if it did
        (whatever the caller read from the state may have been part of it)."""
        if self._pending:
            last = self._pending[-1].durable
            assert last is not None
            await asyncio.shield(last)

    async def close(self) -> None:
        """Wait for the entries written so far (call before closing the store)."""
        if self._writer is not None:
            await asyncio.wait([self._writer])

    async def _write_batches(self) -> None:
        while self._pending:
            batch = list(self._pending)
            commits = [
                Commit(e.revision, e.change, [(n, event.SerializeToString()) for n, event in e.events.items()])
                for e in batch
            ]
            try:
                await asyncio.to_thread(self._store.commit, commits)
            except Exception as exc:
                self._fail_pending(exc)
                return
            del self._pending[: len(batch)]
            for entry in batch:
                for node_id, event in entry.events.items():
                    self._publish(node_id, event)
                if entry.on_durable is not None:
                    entry.on_durable()
                log.info("revision %d: %s", entry.revision, entry.description, extra=log_fields(entry))
                assert entry.durable is not None
                entry.durable.set_result(None)

    def _fail_pending(self, exc: Exception) -> None:
        failed = list(reversed(self._pending))
        self._pending.clear()
        log.error(
            "could not persist revisions %d-%d: %s%s",
            failed[-1].revision,
            failed[0].revision,
            exc,
            "; the disk may still hold them: a restart before the next successful write may bring them back"
            if isinstance(exc, StoreUnwritable) and exc.may_reappear
            else "",
        )
        self._rollback(failed)
        for entry in failed:
            assert entry.durable is not None
            entry.durable.set_exception(_refusal(exc))


def _refusal(exc: Exception) -> Exception:
    """What a caller whose change could not be written is told. A full state disk, and one that refuses writes,
    are refusals with their own status (RESOURCE_EXHAUSTED, FAILED_PRECONDITION) that say what to repair; any
    other failure is passed on as it is."""
    if isinstance(exc, StoreFull):
        return ResourceExhausted(f"the data manager's state disk is full: nothing was changed; {exc.advice}")
    if isinstance(exc, StoreUnwritable):
        outcome = _MAY_REAPPEAR if exc.may_reappear else "nothing was changed"
        return StateDiskUnwritable(
            f"the data manager cannot write its state disk: {exc}; {outcome}; repair the disk, then restart the "
            "data manager if its file system had to be remounted"
        )
    return exc


_MAY_REAPPEAR = (
    "the change is not applied, but the disk may still hold it (it failed while being flushed and could not be "
    "erased): a restart of the data manager before its next successful write may bring it back, so check the "
    "state after one"
)


def log_fields(entry: JournalEntry) -> dict[str, object]:
    """The ids a change touches, as structured log fields: the id where it touches one, the list of them where it
    touches several (one round's placements, say). They were joined with commas, which a `file://` URI may hold."""
    change = entry.change
    fields: dict[str, object] = {"revision": entry.revision}
    for name, keys in (
        ("dataset_uri", [d.uri for d in change.datasets_put] + list(change.datasets_deleted)),
        ("job_id", [j.job_id for j in change.jobs_put] + list(change.jobs_deleted)),
        ("node_id", [n.node_id for n in change.nodes_put] + list(change.nodes_deleted)),
    ):
        if keys:
            fields[name] = keys[0] if len(keys) == 1 else keys
    return fields
