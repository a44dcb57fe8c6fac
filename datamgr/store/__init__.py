"""Durable state for the data manager: an interface and its SQLite implementation."""

from datamgr.store.base import StateStore, StoredState
from datamgr.store.sqlite import SQLiteStore

__all__ = ["SQLiteStore", "StateStore", "StoredState"]
