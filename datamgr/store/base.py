"""What the data manager needs from durable storage, independent of the database behind it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from datamgr.model import Dataset, Job, Node
from datamgr.state import Change


@dataclass(frozen=True, slots=True)
class StoredState:
    """Everything a restarted data manager serves, as of `revision`."""

    revision: int
    datasets: tuple[Dataset, ...]
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]


class StateStore(Protocol):
    """Durable allocations, manifests and the per-node change log that watch streams resume from.

    `commit` is atomic and durable when it returns: a change is either fully on disk or not at all.
    """

    def load(self) -> StoredState: ...

    def commit(self, revision: int, change: Change, events: Sequence[tuple[str, bytes]]) -> None:
        """Persist `change` as `revision`, with the serialized watch events for each affected node."""
        ...

    def events_since(self, node_id: str, revision: int) -> list[bytes] | None:
        """A node's events after `revision`, oldest first; None if the log no longer reaches back that far."""
        ...

    def manifest(self, dataset_uri: str) -> bytes:
        """The encoded manifest of a registered dataset (KeyError if there is none)."""
        ...

    def close(self) -> None: ...
