"""Durable state for the data manager: an interface and its SQLite implementation."""

from datamgr.store.base import Commit, StateStore, StoredState
from datamgr.store.sqlite import SQLiteStore

__all__ = ["Commit", "SQLiteStore", "StateStore", "StoredState"]
