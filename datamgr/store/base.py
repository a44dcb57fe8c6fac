"""What the data manager needs from durable storage, independent of the database behind it."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from datamgr.entities import Dataset, Job, JobHistory, Node, Tenant
from datamgr.state import Change

# How many revisions back a store's event log reaches by default: a node further behind resyncs from a snapshot.
DEFAULT_RETAINED_REVISIONS = 100_000


def new_history() -> int:
    """A history for a store opened now (`StateStore.history`): random, so that no other copy of the state, however
    it was made, draws the same one; never 0, which on the wire means "not known"."""
    return secrets.randbelow(2**63 - 1) + 1


def in_history(history: int, revision: int, current: int, ended: Mapping[int, int]) -> bool:
    """Whether `revision` of `history` is a revision of a store whose history is `current` and whose earlier ones
    ended at the revisions `ended` holds: the same number then names the same change. 0: a history not known (a
    node from before histories), which the revision alone has to do for."""
    return history in (0, current) or revision <= ended.get(history, -1)


FREE_SPACE = "free space in its state dir and call again"


class StoreFull(Exception):
    """The state's file system has no room for a commit. The commit was rolled back whole: none of it is on disk,
    and the store takes the next commit as if this one had never been tried.

    `advice`: what the caller is to do, said after "nothing was changed": by default to free space, and where the
    store's own log holds the room and could not give it back, why not and what would let it."""

    def __init__(self, message: str, *, advice: str = FREE_SPACE) -> None:
        super().__init__(message)
        self.advice = advice


class StoreUnwritable(Exception):
    """The state's file system refused a commit for another reason than room: it is read-only (as ext4 turns
    itself after an I/O error, `errors=remount-ro`) or it answered an I/O error. The commit was rolled back
    whole, as for `StoreFull`; the message names the state file and what its file system says.

    `may_reappear`: the commit got as far as the disk before the error (its flush failed) and the store could not
    erase it there, so a restart before the store's next successful commit may find it, although it was refused
    and is not served meanwhile. False when it never reached the disk or was erased: it is gone for good."""

    def __init__(self, message: str, *, may_reappear: bool = False) -> None:
        super().__init__(message)
        self.may_reappear = may_reappear


class StoreUnreadable(Exception):
    """The state's file system failed a read of what only the disk holds (a manifest, the event log): an I/O error,
    or pages found damaged. The message names the state file and SQLite's answer."""


@dataclass(frozen=True, slots=True)
class StoredState:
    """Everything a restarted data manager serves, as of `revision`."""

    revision: int
    datasets: tuple[Dataset, ...]
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]
    histories: tuple[JobHistory, ...] = ()  # one per job, with the job's scheduling history
    tenants: tuple[Tenant, ...] = ()


@dataclass(frozen=True, slots=True)
class Commit:
    """One accepted change as `revision`, with the serialized watch event for each node it affects."""

    revision: int
    change: Change
    events: Sequence[tuple[str, bytes]] = ()


class StateStore(Protocol):
    """Durable allocations, manifests and the per-node change log that watch streams resume from.

    `commit` may be called from a worker thread while the other methods are called from the event loop;
    those only ever see committed data.
    """

    @property
    def history(self) -> int:
        """The history of the state that the revisions after this store was opened belong to: new at every open
        (`new_history`). The same revision number names different changes in two copies of a state dir once
        both have been served and changed (a state dir restored from a backup, or copied back by hand, after the
        original went further), and every such copy is opened before it is served: so a revision names one change
        only together with its history, and a node that saw another history's revision needs a snapshot."""
        ...

    def load(self) -> StoredState: ...

    def commit(self, commits: Sequence[Commit]) -> None:
        """Persist `commits`, in order, atomically and durably: all are on disk when it returns, or none (and it
        raises; StoreFull when the state's file system has no room left, StoreUnwritable when it refuses
        writes)."""
        ...

    def events_since(self, node_id: str, revision: int, history: int = 0) -> list[bytes] | None:
        """A node's events after `revision` of `history`, oldest first; None if the log no longer reaches back that
        far, or if `revision` is not this store's (a revision it never had, or one of a history it does not share:
        `in_history`). StoreUnreadable if the disk fails the read."""
        ...

    def manifest(self, dataset_uri: str) -> bytes:
        """The encoded manifest of a registered dataset (KeyError if there is none). StoreUnreadable if the disk
        fails the read, or lost the manifest of a dataset it holds."""
        ...

    def close(self) -> None: ...
