"""Durable state for the data manager: an interface and its SQLite implementation."""

from datamgr.store.base import Commit, StateStore, StoredState, StoreFull
from datamgr.store.sqlite import SQLiteStore

__all__ = ["Commit", "SQLiteStore", "StateStore", "StoreFull", "StoredState"]
