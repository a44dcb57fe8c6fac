"""Durable state for the data manager: an interface and its implementations (SQLite, the embedded default;
in memory, for tests and throwaway data managers)."""

from datamgr.store.base import Commit, StateStore, StoredState, StoreFull, StoreUnreadable, StoreUnwritable
from datamgr.store.memory import MemoryStore
from datamgr.store.sqlite import SQLiteStore

__all__ = [
    "Commit",
    "MemoryStore",
    "SQLiteStore",
    "StateStore",
    "StoreFull",
    "StoreUnreadable",
    "StoreUnwritable",
    "StoredState",
]
