"""The state store: atomic durable commits, the resumable event log, and one owner per state dir.

The contract tests (`store` fixture) run over both implementations, SQLite and in memory; what only a
database on disk can do (survive a reopen, lock its state dir, migrate a schema) is tested on SQLite alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field, fields, make_dataclass, replace
from pathlib import Path

import pytest

from datamgr.entities import Dataset, Job, JobHistory, Node, StateDiskUnreadable, Tenant, Worker
from datamgr.manager import DataManager
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore, StateStore
from datamgr.store.backup import back_up
from datamgr.store.memory import MemoryStore
from datamgr.store.sqlite import SCHEMA_VERSION, StateDirError
from datamgr.store.statedir import lock_state_dir
from silodlib.backends.base import ObjectInfo
from silodlib.manifest import Manifest, build_manifest
from tests.datamgr_fixtures import damage_tables
from tests.disks import TmpfsFactory
from tests.state_files import (
    edit,
    files_of,
    killed_state_dir,
    linked_state_dir,
    revision_and_nodes,
    state_of_nodes,
)

DATASET = Dataset("s3://bkt/train", {"region": "eu-west-1"}, 1000, 3, 4, 4 << 20, "d1", 500)
NODE = Node("n1", "h1:7421", 10_000)
JOB = Job("j1", DATASET.uri, 100, (Worker("n1", 2),), 50, epochs=0.07, irregular=True)


StoreFactory = Callable[..., StateStore]


@pytest.fixture(params=["sqlite", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """`make_store(**options)`: a fresh store of the parametrized kind (options: `retained_revisions`)."""
    made: list[StateStore] = []

    def make(**options: int) -> StateStore:
        store: StateStore = SQLiteStore(tmp_path, **options) if request.param == "sqlite" else MemoryStore(**options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_what_is_committed_is_what_load_returns(make_store: StoreFactory) -> None:
    store = make_store()
    store.commit([Commit(1, Change(nodes_put=(NODE,), datasets_put=(DATASET,), manifest=(DATASET.uri, b"M")), [])])
    store.commit([Commit(2, Change(jobs_put=(JOB,)), [("n1", b"event-2")])])
    state = store.load()
    assert (state.revision, state.datasets, state.jobs, state.nodes) == (2, (DATASET,), (JOB,), (NODE,))
    assert store.manifest(DATASET.uri) == b"M"
    assert store.events_since("n1", 1) == [b"event-2"]
    store.commit([Commit(3, Change(jobs_deleted=(JOB.job_id,), nodes_deleted=(NODE.node_id,)))])
    assert (store.load().revision, store.load().jobs, store.load().nodes) == (3, (), ())


def test_commits_survive_reopening_the_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(nodes_put=(NODE,), datasets_put=(DATASET,), manifest=(DATASET.uri, b"M")), [])])
    store.commit([Commit(2, Change(jobs_put=(JOB,)), [("n1", b"event-2")])])
    store.close()
    reopened = SQLiteStore(tmp_path)
    state = reopened.load()
    assert (state.revision, state.datasets, state.jobs, state.nodes) == (2, (DATASET,), (JOB,), (NODE,))
    assert reopened.manifest(DATASET.uri) == b"M"
    assert reopened.events_since("n1", 1) == [b"event-2"]
    reopened.close()


# A state dir as silod wrote it at schema version 1, before jobs said how long they train: the tables exactly
# as that version created them, and rows as it wrote them. Frozen here, not derived from the current code.
_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE datasets (
    uri TEXT PRIMARY KEY, options TEXT NOT NULL, size_bytes INTEGER NOT NULL, file_count INTEGER NOT NULL,
    item_count INTEGER NOT NULL, chunk_size_bytes INTEGER NOT NULL, manifest_digest TEXT NOT NULL,
    cache_quota_bytes INTEGER NOT NULL);
CREATE TABLE manifests (uri TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY, dataset_uri TEXT NOT NULL, ideal_bytes_per_sec INTEGER NOT NULL,
    workers TEXT NOT NULL, io_bytes_per_sec INTEGER NOT NULL);
CREATE TABLE nodes (node_id TEXT PRIMARY KEY, address TEXT NOT NULL, cache_capacity_bytes INTEGER NOT NULL);
CREATE TABLE events (revision INTEGER NOT NULL, node_id TEXT NOT NULL, payload BLOB NOT NULL);
CREATE INDEX events_by_node ON events (node_id, revision);
INSERT INTO meta VALUES ('schema_version', 1), ('revision', 3);
INSERT INTO datasets VALUES ('s3://bkt/train', '{"region": "eu-west-1"}', 1000, 3, 4, 4194304, 'd1', 500);
INSERT INTO manifests VALUES ('s3://bkt/train', X'4d');
INSERT INTO nodes VALUES ('n1', 'h1:7421', 10000);
INSERT INTO jobs VALUES ('j1', 's3://bkt/train', 100, '[["n1", 2]]', 50);
INSERT INTO events VALUES (3, 'n1', X'65');
"""


@pytest.mark.expected_warnings  # the upgrade's, kept by the first commit
def test_a_state_dir_of_schema_1_opens_with_its_jobs_of_unknown_length_and_regular_access(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "silod.db")
    db.executescript(_SCHEMA_V1)
    db.close()

    store = SQLiteStore(tmp_path)
    state = store.load()
    assert (state.revision, state.datasets, state.nodes) == (3, (DATASET,), (NODE,))
    assert state.jobs == (Job("j1", DATASET.uri, 100, (Worker("n1", 2),), 50, epochs=0.0, irregular=False),)
    (history,) = state.histories  # schema 3: its history starts, running, at the upgrade
    assert history.job_id == "j1" and history.first_start_time == history.submit_time > 0
    assert (store.manifest(DATASET.uri), store.events_since("n1", 2)) == (b"M", [b"e"])
    store.commit([Commit(4, Change(jobs_put=(replace(JOB, job_id="j2"),)))])  # the new columns take values
    store.close()

    reopened = SQLiteStore(tmp_path)  # already current: opens without migrating again
    assert [(j.job_id, j.epochs, j.irregular) for j in reopened.load().jobs] == [("j1", 0.0, False), ("j2", 0.07, True)]
    reopened.close()
    db = sqlite3.connect(tmp_path / "silod.db")
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (SCHEMA_VERSION,)
    db.close()


# A state dir as silod wrote it at schema version 3, before jobs had a class and a grace period: its jobs
# table without them, and a history without `held` and `suspended_until`. Frozen here, as _SCHEMA_V1.
_SCHEMA_V3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE datasets (
    uri TEXT PRIMARY KEY, options TEXT NOT NULL, size_bytes INTEGER NOT NULL, file_count INTEGER NOT NULL,
    item_count INTEGER NOT NULL, chunk_size_bytes INTEGER NOT NULL, manifest_digest TEXT NOT NULL,
    cache_quota_bytes INTEGER NOT NULL);
CREATE TABLE manifests (uri TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY, dataset_uri TEXT NOT NULL, ideal_bytes_per_sec INTEGER NOT NULL,
    workers TEXT NOT NULL, io_bytes_per_sec INTEGER NOT NULL, epochs REAL NOT NULL DEFAULT 0,
    irregular INTEGER NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0);
CREATE TABLE nodes (node_id TEXT PRIMARY KEY, address TEXT NOT NULL,
    cache_capacity_bytes INTEGER NOT NULL, gpus INTEGER NOT NULL DEFAULT 0);
CREATE TABLE job_histories (job_id TEXT PRIMARY KEY, history TEXT NOT NULL);
CREATE TABLE events (revision INTEGER NOT NULL, node_id TEXT NOT NULL, payload BLOB NOT NULL);
CREATE INDEX events_by_node ON events (node_id, revision);
INSERT INTO meta VALUES ('schema_version', 3), ('revision', 5);
INSERT INTO datasets VALUES ('s3://bkt/train', '{"region": "eu-west-1"}', 1000, 3, 4, 4194304, 'd1', 500);
INSERT INTO manifests VALUES ('s3://bkt/train', X'4d');
INSERT INTO nodes VALUES ('n1', 'h1:7421', 10000, 4);
INSERT INTO jobs VALUES ('p1', 's3://bkt/train', 100, '[]', 0, 2.0, 0, 2);
INSERT INTO job_histories VALUES ('p1', '{"attained_gpu_seconds_before": 20.0, "first_start_time": 10.0, "job_id": "p1",
    "last_start_time": 10.0, "pending_since": 20.0, "policy_state": {"queue": 1.0}, "preemptions": 1,
    "queued_seconds_before": 3.0, "submit_time": 7.0}');
"""


@pytest.mark.expected_warnings  # the upgrade's, kept by the first commit
def test_a_state_dir_of_schema_3_opens_with_best_effort_jobs_without_grace_that_are_not_suspending(
    tmp_path: Path,
) -> None:
    db = sqlite3.connect(tmp_path / "silod.db")
    db.executescript(_SCHEMA_V3)
    db.close()

    store = SQLiteStore(tmp_path)
    state = store.load()
    assert state.jobs == (Job("p1", DATASET.uri, 100, (), 0, epochs=2.0, gpus=2, job_class="be", grace_seconds=0.0),)
    (history,) = state.histories
    assert (history.preemptions, history.pending_since, dict(history.policy_state)) == (1, 20.0, {"queue": 1.0})
    assert (dict(history.held), history.suspended_until, history.suspending) == ({}, None, False)
    assert history.bytes_read_before == 0  # what it read before its preemption is unknown: none banked
    suspending = replace(history, held={"n1": 2}, suspended_until=80.0)
    te = replace(JOB, job_id="te", job_class="te", grace_seconds=90.0)
    store.commit([Commit(6, Change(jobs_put=(te,), histories_put=(suspending,)))])  # the new fields take values
    store.close()

    reopened = SQLiteStore(tmp_path)
    state = reopened.load()
    assert [(j.job_id, j.job_class, j.grace_seconds) for j in state.jobs] == [("p1", "be", 0.0), ("te", "te", 90.0)]
    assert state.histories == (suspending,)
    reopened.close()


# A state dir as silod wrote it at schema version 4, before tenants: no tenants table, and jobs without a tenant
# or a priority. Frozen here, as _SCHEMA_V1.
_SCHEMA_V4 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE datasets (
    uri TEXT PRIMARY KEY, options TEXT NOT NULL, size_bytes INTEGER NOT NULL, file_count INTEGER NOT NULL,
    item_count INTEGER NOT NULL, chunk_size_bytes INTEGER NOT NULL, manifest_digest TEXT NOT NULL,
    cache_quota_bytes INTEGER NOT NULL);
CREATE TABLE manifests (uri TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY, dataset_uri TEXT NOT NULL, ideal_bytes_per_sec INTEGER NOT NULL,
    workers TEXT NOT NULL, io_bytes_per_sec INTEGER NOT NULL, epochs REAL NOT NULL DEFAULT 0,
    irregular INTEGER NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0,
    job_class TEXT NOT NULL DEFAULT 'be', grace_seconds REAL NOT NULL DEFAULT 0);
CREATE TABLE nodes (node_id TEXT PRIMARY KEY, address TEXT NOT NULL,
    cache_capacity_bytes INTEGER NOT NULL, gpus INTEGER NOT NULL DEFAULT 0);
CREATE TABLE job_histories (job_id TEXT PRIMARY KEY, history TEXT NOT NULL);
CREATE TABLE events (revision INTEGER NOT NULL, node_id TEXT NOT NULL, payload BLOB NOT NULL);
CREATE INDEX events_by_node ON events (node_id, revision);
INSERT INTO meta VALUES ('schema_version', 4), ('revision', 6);
INSERT INTO datasets VALUES ('s3://bkt/train', '{"region": "eu-west-1"}', 1000, 3, 4, 4194304, 'd1', 500);
INSERT INTO manifests VALUES ('s3://bkt/train', X'4d');
INSERT INTO nodes VALUES ('n1', 'h1:7421', 10000, 4);
INSERT INTO jobs VALUES ('p1', 's3://bkt/train', 100, '[["n1", 2]]', 0, 2.0, 0, 2, 'te', 30.0);
INSERT INTO job_histories VALUES ('p1', '{"job_id": "p1", "submit_time": 7.0, "first_start_time": 9.0,
    "last_start_time": 9.0}');
"""
TENANT = Tenant("prod-a", {"node": 2, "gpu": 1}, 2 * 10**12, 400_000_000)


def write_schema_4_state_dir(state_dir: Path) -> Path:
    """Make `state_dir` hold a database as a silod of schema 4 left it (`_SCHEMA_V4`, in write-ahead-log mode as every
    silod made its database, closed); returns the database's path."""
    state_dir.mkdir(mode=0o700, exist_ok=True)
    path = state_dir / "silod.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(_SCHEMA_V4)
    return path


def schema_of(database: Path) -> int:
    with contextlib.closing(sqlite3.connect(database)) as db:
        (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(version)


@pytest.mark.expected_warnings  # the upgrade's
def test_a_state_dir_of_schema_4_opens_without_tenants_and_with_regular_jobs_of_no_tenant(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_schema_4_state_dir(tmp_path)

    store = SQLiteStore(tmp_path)
    state = store.load()
    (job,) = state.jobs
    assert (job.job_id, job.job_class, job.grace_seconds, job.tenant, job.priority) == ("p1", "te", 30.0, "", "high")
    assert (state.revision, state.tenants, len(state.histories)) == (6, (), 1)
    low = replace(JOB, job_id="low", tenant=TENANT.name, priority="low")
    store.commit([Commit(7, Change(tenants_put=(TENANT,), jobs_put=(low,)))])  # the new table and columns take values
    store.close()

    reopened = SQLiteStore(tmp_path)
    state = reopened.load()
    assert state.tenants == (TENANT,)
    assert [(j.job_id, j.tenant, j.priority) for j in state.jobs] == [("low", "prod-a", "low"), ("p1", "", "high")]
    reopened.close()
    assert schema_of(tmp_path / "silod.db") == SCHEMA_VERSION == 5
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"upgraded state dir {tmp_path} from schema 4 to 5: silods of schema 4 and before refuse it now; to go back "
        "to one, restore a backup taken before this start (silod datamgr restore)"
    ]  # once: the reopened store found it current


def test_a_store_closed_before_it_keeps_the_upgrade_of_a_schema_4_state_dir_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    """A start refused after the open (a port in use, cell levels that do not fit): the file stays the old silod's,
    which refused it as written by a newer silod when the open had committed the upgrade at once."""
    path = write_schema_4_state_dir(tmp_path)
    before = files_of(tmp_path)

    store = SQLiteStore(tmp_path)
    state = store.load()  # served upgraded meanwhile: tenants and each job's tenant and priority
    assert (state.revision, state.tenants, [(j.tenant, j.priority) for j in state.jobs]) == (6, (), [("", "high")])
    store.close()

    assert files_of(tmp_path) == before and schema_of(path) == 4
    (SQLiteStore(tmp_path)).close()  # and the next start upgrades it again
    assert files_of(tmp_path) == before


@pytest.mark.expected_warnings  # the upgrade's
def test_keep_upgrade_commits_the_upgrade_of_a_schema_4_state_dir_and_logs_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_schema_4_state_dir(tmp_path)
    store = SQLiteStore(tmp_path)
    store.keep_upgrade()
    store.keep_upgrade()  # once kept, nothing more to do
    store.close()
    assert schema_of(path) == 5
    reopened = SQLiteStore(tmp_path)
    reopened.keep_upgrade()  # current: nothing to keep, nothing logged
    assert reopened.load().revision == 6
    reopened.close()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"upgraded state dir {tmp_path} from schema 4 to 5: silods of schema 4 and before refuse it now; to go back "
        "to one, restore a backup taken before this start (silod datamgr restore)"
    ]


def test_a_schema_4_state_dir_holding_a_row_this_silod_cannot_read_is_refused_and_left_at_schema_4(
    tmp_path: Path,
) -> None:
    """The refusal says "nothing was changed": the upgrade the open began is rolled back with it, so the silod that
    wrote the file (or a backup of it) can still open it."""
    path = write_schema_4_state_dir(tmp_path)
    edit(path, 'UPDATE datasets SET options = \'{"region": "eu-west-1"\'')
    before = files_of(tmp_path)

    with pytest.raises(StateDirError, match=r"holds a row this silod cannot read: table datasets.*nothing was changed"):
        opened = SQLiteStore(tmp_path)
        try:
            opened.load()
        finally:
            opened.close()

    assert files_of(tmp_path) == before and schema_of(path) == 4


def test_tenants_are_committed_replaced_and_deleted_with_their_jobs_tenant_and_priority(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    low = replace(JOB, tenant=TENANT.name, priority="low")
    store.commit([Commit(1, Change(datasets_put=(DATASET,), nodes_put=(NODE,), tenants_put=(TENANT,)))])
    store.commit([Commit(2, Change(jobs_put=(low,)))])
    assert (store.load().tenants, store.load().jobs) == ((TENANT,), (low,))
    smaller = replace(TENANT, cells={"node": 1}, cache_bytes=0)
    other = Tenant("prod-b", {"node": 1})
    store.commit([Commit(3, Change(tenants_put=(smaller, other)))])
    assert store.load().tenants == (smaller, other)  # by name
    store.commit([Commit(4, Change(jobs_deleted=(low.job_id,), tenants_deleted=(TENANT.name,)))])
    assert (store.load().tenants, store.load().jobs) == ((other,), ())


def test_deleting_a_dataset_deletes_its_manifest(make_store: StoreFactory) -> None:
    store = make_store()
    store.commit([Commit(1, Change(datasets_put=(DATASET,), manifest=(DATASET.uri, b"M")), [])])
    store.commit([Commit(2, Change(datasets_deleted=(DATASET.uri,)), [])])
    assert store.load().datasets == ()
    with pytest.raises(KeyError):
        store.manifest(DATASET.uri)


def test_a_failing_batch_writes_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    store.commit([Commit(1, Change(nodes_put=(NODE,)))])
    unstorable: Sequence[tuple[str, bytes]] = [("n1", object())]  # type: ignore[list-item]
    batch = [Commit(2, Change(datasets_put=(DATASET,))), Commit(3, Change(jobs_put=(JOB,)), unstorable)]
    with pytest.raises((sqlite3.Error, TypeError)):
        store.commit(batch)
    state = store.load()
    assert (state.revision, state.datasets, state.jobs) == (1, (), ())
    assert store.events_since("n1", 1) == []


def test_event_log_answers_only_for_revisions_it_still_holds(make_store: StoreFactory) -> None:
    store = make_store(retained_revisions=100)
    for revision in range(1, 2049):
        store.commit([Commit(revision, Change(), [("n1", str(revision).encode())])])
    assert store.events_since("n1", 2040) == [str(r).encode() for r in range(2041, 2049)]
    assert store.events_since("n1", 2048) == []
    assert store.events_since("n1", 2049) is None  # ahead of the store: the node must resync
    assert store.events_since("n1", 10) is None  # pruned
    assert store.events_since("n2", 2040) == []


def test_a_change_that_retires_options_forgets_the_events_before_it_and_only_those(make_store: StoreFactory) -> None:
    """The events before it may set the dataset on a node with its old options (credentials): a node behind it
    resyncs from a snapshot; one at the revision just before it still resumes from the log."""
    store = make_store()
    store.commit([Commit(1, Change(datasets_put=(DATASET,), manifest=(DATASET.uri, b"M")), [("n1", b"old-options")])])
    store.commit([Commit(2, Change(), [("n1", b"2"), ("n2", b"2")])])
    rotated = replace(DATASET, options={"region": "eu-west-2"})
    store.commit(
        [
            Commit(3, Change(), [("n1", b"3")]),
            Commit(4, Change(datasets_put=(rotated,), forgets_earlier_events=True), [("n1", b"new-options")]),
            Commit(5, Change(), [("n1", b"5")]),
        ]
    )
    assert store.events_since("n1", 3) == [b"new-options", b"5"]
    assert store.events_since("n1", 0) is None and store.events_since("n1", 2) is None
    assert store.events_since("n2", 2) is None  # every node's: the log cannot tell which events carry them
    assert store.load().datasets == (rotated,)


def test_options_a_change_retires_leave_no_byte_in_the_state_dir_files(tmp_path: Path) -> None:
    """Deleted rows are zeroed and the write-ahead log emptied: the log kept the pages as they were before (an SQLite
    built without SECURE_DELETE, unlike Debian's, would also keep a deleted row's bytes in the database file)."""
    secret = b"sv=2026-11-28&sig=0ld5ecret"
    store = SQLiteStore(tmp_path)
    leaked = replace(DATASET, options={"sas_token": secret.decode()})
    store.commit([Commit(1, Change(datasets_put=(leaked,), manifest=(DATASET.uri, b"M")), [("n1", b"set " + secret)])])
    store.commit([Commit(2, Change(nodes_put=(NODE,), jobs_put=(JOB,)), [("n1", b"2")])])
    assert any(secret in data for data in files_of(tmp_path).values())

    store.commit([Commit(3, Change(datasets_put=(DATASET,), forgets_earlier_events=True), [("n1", b"set new")])])

    assert [name for name, data in files_of(tmp_path).items() if secret in data] == []
    assert store.events_since("n1", 2) == [b"set new"]
    store.close()
    assert SQLiteStore(tmp_path).load().datasets == (DATASET,)


@pytest.mark.expected_warnings
def test_retired_options_a_reader_keeps_in_the_log_are_erased_at_a_later_commit_once_it_is_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader holding the database (an sqlite3 shell, a backup) kept the log from being emptied, and nothing
    tried again: the retired secret stayed in silod.db-wal for good, without a word."""
    secret = b"sv=2026-11-28&sig=0ld5ecret"
    store = SQLiteStore(tmp_path)
    leaked = replace(DATASET, options={"sas_token": secret.decode()})
    store.commit([Commit(1, Change(datasets_put=(leaked,), manifest=(DATASET.uri, b"M")), [("n1", b"set " + secret)])])
    reader = sqlite3.connect(f"{(tmp_path / 'silod.db').as_uri()}?mode=ro", uri=True, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchone()  # holds the log as of revision 1

    store.commit([Commit(2, Change(datasets_put=(DATASET,), forgets_earlier_events=True), [("n1", b"set new")])])
    assert "still hold retired dataset options" in caplog.text
    assert any(secret in data for data in files_of(tmp_path).values())
    store.commit([Commit(3, Change(), [("n1", b"3")])])  # the reader still holds it: tried again, quietly
    assert caplog.text.count("still hold retired dataset options") == 1

    reader.execute("COMMIT")
    reader.close()
    store.commit([Commit(4, Change(), [("n1", b"4")])])
    assert [name for name, data in files_of(tmp_path).items() if secret in data] == []
    assert "no longer holds retired dataset options" in caplog.text
    store.close()


def test_a_revision_of_another_history_is_not_resumed_from_the_log(make_store: StoreFactory) -> None:
    store = make_store()
    store.commit([Commit(1, Change(nodes_put=(NODE,)), [("n1", b"event-1")])])
    store.commit([Commit(2, Change(), [("n1", b"event-2")])])
    assert store.history != 0  # 0 on the wire means "not known"
    assert store.events_since("n1", 1, store.history) == [b"event-2"]
    assert store.events_since("n1", 1, 1 if store.history != 1 else 2) is None  # the same number, another change
    assert store.events_since("n1", 1) == [b"event-2"]  # a node from before histories: the revision alone decides


def _commit_events(store: SQLiteStore, revisions: range, tag: str) -> None:
    for revision in revisions:
        store.commit([Commit(revision, Change(), [("n1", f"{tag}{revision}".encode())])])


def test_a_copy_of_the_state_dir_shares_its_revisions_up_to_the_copy_and_none_after(tmp_path: Path) -> None:
    """An operator copies the state dir (a backup, a volume snapshot, by hand); the original goes on to revision 7;
    the copy, at revision 4, is put back and goes on to 8 itself. Revisions 5 to 7 of the two name different changes:
    a node at the original's 7 must not resume from the copy's log, which would send it the copy's 8 alone."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    store = SQLiteStore(original)
    _commit_events(store, range(1, 5), "")
    copied_in = store.history
    store.close()
    shutil.copytree(original, copy)
    store = SQLiteStore(original)
    _commit_events(store, range(5, 8), "")
    went_on_in = store.history
    store.close()

    restarted = SQLiteStore(original)  # a restart stays in the same history: its nodes resume from the log
    assert restarted.events_since("n1", 7, went_on_in) == []
    assert restarted.events_since("n1", 3, copied_in) == [b"4", b"5", b"6", b"7"]
    restarted.close()
    restored = SQLiteStore(copy)
    _commit_events(restored, range(5, 9), "copy-")
    assert restored.events_since("n1", 7, went_on_in) is None  # the original's revision 7: a snapshot
    assert restored.events_since("n1", 5, went_on_in) is None
    assert restored.events_since("n1", 4, copied_in) == [b"copy-5", b"copy-6", b"copy-7", b"copy-8"]
    assert restored.events_since("n1", 5, copied_in) is None  # that history ended at 4 in this copy
    assert restored.events_since("n1", 7, restored.history) == [b"copy-8"]
    restored.close()


def test_an_open_that_changes_nothing_writes_nothing_and_its_history_is_not_resumed_after_it(tmp_path: Path) -> None:
    """A data manager starts on a full state disk: the history drawn at the open is written with the first change
    only. A node told that history before any change gets a snapshot after the next start, never a wrong log."""
    store = SQLiteStore(tmp_path)
    _commit_events(store, range(1, 3), "")
    store.close()
    database = (tmp_path / "silod.db").read_bytes()
    idle = SQLiteStore(tmp_path)
    unwritten = idle.history
    assert idle.events_since("n1", 1, unwritten) == [b"2"]
    idle.close()
    assert (tmp_path / "silod.db").read_bytes() == database
    reopened = SQLiteStore(tmp_path)
    assert reopened.events_since("n1", 1, unwritten) is None
    reopened.close()


def test_a_second_owner_of_the_state_dir_is_refused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    with pytest.raises(StateDirError) as refused:
        SQLiteStore(tmp_path)
    assert str(refused.value) == (
        f"state dir {tmp_path} is in use by another data manager (pid {os.getpid()}); nothing was changed: stop it, "
        "then start again"
    )
    store.close()
    SQLiteStore(tmp_path).close()  # free again once closed


def test_a_state_dir_a_restore_holds_is_refused_saying_a_restore_holds_it(tmp_path: Path) -> None:
    """It said "in use by another data manager" whatever held it: the lock file now says what its holder is."""
    restore = lock_state_dir(tmp_path, "restore")
    try:
        with pytest.raises(StateDirError) as refused:
            SQLiteStore(tmp_path)
    finally:
        restore.release()
    assert str(refused.value) == (
        f"state dir {tmp_path} is in use by a restore (pid {os.getpid()}); nothing was changed: wait for it to "
        "finish, then start again"
    )


# A process that holds a state dir as a restore does, with the copy a restore writes beside its database, until its
# standard input closes.
_RESTORING = """
import sys
from pathlib import Path
from datamgr.store.statedir import lock_state_dir
state_dir = Path(sys.argv[1])
lock = lock_state_dir(state_dir, "restore")
(state_dir / "silod.db.restoring").write_bytes(b"")
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_backup_while_a_restore_runs_is_refused_saying_it_runs_not_that_it_was_interrupted(tmp_path: Path) -> None:
    """It said "a restore into it was interrupted ... run the restore again" while the restore was still copying."""
    state_of_nodes(tmp_path, 1)
    with subprocess.Popen(
        [sys.executable, "-c", _RESTORING, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as restore:
        assert restore.stdout is not None and restore.stdout.readline() == "holding\n"
        with pytest.raises(StateDirError) as refused:
            back_up(tmp_path, tmp_path.parent / f"{tmp_path.name}-backup.db")
        restore.communicate("")
    assert str(refused.value).startswith(
        f"cannot back up state dir {tmp_path}: a restore into it is under way (pid {restore.pid}; "
        f"{tmp_path / 'silod.db.restoring'} is its copy, not yet whole); nothing was changed: wait for it to finish"
    )


def test_the_log_and_index_of_a_linked_database_are_made_private_to_their_owner(tmp_path: Path) -> None:
    """The start made the log and shared-memory index beside the link private, where there are none, and left those
    beside the file the link names readable by everyone (dataset options may hold credentials)."""
    volume, state_dir = tmp_path / "volume", tmp_path / "state"
    killed_state_dir(volume, 2)
    (volume / "lock").unlink()
    for name in ("silod.db-wal", "silod.db-shm"):
        (volume / name).chmod(0o644)
    linked_state_dir(state_dir, volume)

    store = SQLiteStore(state_dir)
    try:
        modes = {name: (volume / name).stat().st_mode & 0o777 for name in ("silod.db-wal", "silod.db-shm")}
    finally:
        store.close()
    assert modes == {"silod.db-wal": 0o600, "silod.db-shm": 0o600}


def test_a_linked_database_on_a_small_volume_takes_every_change_its_log_never_holding_the_volumes_last_room(
    tmpfs: TmpfsFactory, tmp_path: Path
) -> None:
    """The log is emptied after each commit on a disk short of room: the state dir's disk was checked, not the
    volume's that holds the database and its log, so the log filled the volume and changes were refused as "state
    disk is full", with nothing to delete."""
    volume, state_dir = tmpfs(tmp_path / "volume", "512k"), tmp_path / "state"
    state_of_nodes(volume, 1500)  # some 200 KiB: less room left than the log takes before its next checkpoint
    (volume / "lock").unlink()
    linked_state_dir(state_dir, volume)
    store = SQLiteStore(state_dir)
    try:
        for revision in range(2, 302):
            store.commit([Commit(revision, Change(nodes_put=(Node(f"n{revision:04d}", "h1:7421", revision),)))])
    finally:
        store.close()
    assert revision_and_nodes(state_dir) == (301, [f"n{i:04d}" for i in range(1500)])


def test_a_state_dir_from_a_newer_silod_is_refused(tmp_path: Path) -> None:
    SQLiteStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / "silod.db")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    with pytest.raises(StateDirError, match="newer silod"):
        SQLiteStore(tmp_path)


# What a newer silod's data manager would have written: the schema version it brings, and a table this one would
# create again if it went on to open the file (one the newer schema dropped).
_NEWER_SCHEMA = (f"UPDATE meta SET value = {SCHEMA_VERSION + 1} WHERE key = 'schema_version'", "DROP TABLE tenants")

# The same, by a newer data manager killed with SIGKILL: its changes are in the write-ahead log, not the database.
_KILLED_NEWER_SILOD = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
for statement in sys.argv[2:]:
    db.execute(statement)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("left", ["closed", "killed with its log"])
def test_a_state_dir_from_a_newer_silod_is_refused_with_every_byte_as_it_was(tmp_path: Path, left: str) -> None:
    """The version is read first, without writing: before, the open switched the journal mode and created the
    tables it missed (here `tenants`) in the newer silod's file before it refused it."""
    SQLiteStore(tmp_path).close()
    path = tmp_path / "silod.db"
    if left == "closed":
        edit(path, "PRAGMA journal_mode=DELETE", *_NEWER_SCHEMA)
    else:
        child = subprocess.run([sys.executable, "-c", _KILLED_NEWER_SILOD, str(path), *_NEWER_SCHEMA], timeout=60)
        assert child.returncode == -9 and Path(f"{path}-wal").stat().st_size > 0
    before = files_of(tmp_path, but=("lock", "silod.db-shm"))  # the shared memory is SQLite's scratch index

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(tmp_path)

    assert str(refused.value) == (
        f"cannot use state dir {tmp_path}: {path} was written by a newer silod (schema {SCHEMA_VERSION + 1} > "
        f"{SCHEMA_VERSION}); nothing was changed; run that silod version (or newer)"
    )
    assert files_of(tmp_path, but=("lock", "silod.db-shm")) == before
    assert (tmp_path / "silod.db-shm").exists() == (left != "closed")


_NEWER_HISTORY = json.dumps({"job_id": "j1", "submit_time": 100.0, "priority_boost": 2})


@pytest.mark.parametrize(
    ("row", "statement", "table", "key", "problem", "advice"),
    [
        (
            "a changed byte in a dataset's options",
            """UPDATE datasets SET options = '{"region": "eu-west-1"' """,
            "datasets",
            DATASET.uri,
            "column options is not valid JSON (Expecting ',' delimiter: line 1 column 23 (char 22))",
            "nothing was changed: restore the state dir from a backup (silod datamgr restore), or move its silod.db "
            "aside to start with an empty one",
        ),
        (
            "a history field from a newer silod",
            f"UPDATE job_histories SET history = '{_NEWER_HISTORY}'",
            "job_histories",
            "j1",
            "its history has the field 'priority_boost', which this silod does not know",
            "nothing was changed: if a newer silod wrote it, run that silod version (or newer); if not, restore the "
            "state dir from a backup (silod datamgr restore)",
        ),
        (
            "a number turned text",
            "UPDATE nodes SET cache_capacity_bytes = 'l0000'",
            "nodes",
            "n1",
            "cache_capacity_bytes is 'l0000', not a whole number",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a negative count of bytes read",
            """UPDATE job_histories SET history = '{"job_id": "j1", "submit_time": 100.0, "bytes_read_before": -5}'""",
            "job_histories",
            "j1",
            "its history's field 'bytes_read_before' holds -5",
            "nothing was changed: restore the state dir from a backup",
        ),
        # Rows of the right types that the API would never have taken, or that name what is not there: they were
        # served, and broke calls with UNKNOWN and a traceback (the exception each raised, after the colon).
        (
            "a worker count of 0: ZeroDivisionError",
            """UPDATE jobs SET workers = '[["n1", 0]]'""",
            "jobs",
            "j1",
            "workers[0].count 0 must be between 1 and 1000000",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a rate above int64: ValueError",
            "UPDATE jobs SET io_bytes_per_sec = 9223372036854775807",
            "jobs",
            "j1",
            "io_bytes_per_sec 9223372036854775807 is over the sanity limit of 1.0 PB/s",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a negative rate",
            "UPDATE jobs SET io_bytes_per_sec = -1000000",
            "jobs",
            "j1",
            "io_bytes_per_sec -1000000 must be zero or more",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a negative quota",
            "UPDATE datasets SET cache_quota_bytes = -5",
            "datasets",
            DATASET.uri,
            "cache_quota_bytes -5 must not be negative",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a byte changed in a job's dataset: KeyError",
            "UPDATE jobs SET dataset_uri = 's3://bkt/trahn'",
            "jobs",
            "j1",
            "its dataset 's3://bkt/trahn' is not registered (table datasets has no such row)",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a job of a tenant that is not registered",
            "UPDATE jobs SET tenant = 't0'",
            "jobs",
            "j1",
            "its tenant 't0' is not registered (table tenants has no such row)",
            "nothing was changed: restore the state dir from a backup",
        ),
        (
            "a worker on a node that is not registered",
            """UPDATE jobs SET workers = '[["n0", 2]]'""",
            "jobs",
            "j1",
            "its node 'n0' is not registered (table nodes has no such row)",
            "nothing was changed: restore the state dir from a backup",
        ),
    ],
    ids=[
        "a changed byte in a dataset's options",
        "a history field from a newer silod",
        "a number turned text",
        "a negative count of bytes read",
        "a worker count of 0",
        "a rate above int64",
        "a negative rate",
        "a negative quota",
        "a byte changed in a job's dataset",
        "a job of a tenant that is not registered",
        "a worker on a node that is not registered",
    ],
)
def test_a_row_this_silod_cannot_read_is_refused_naming_the_file_table_and_row_and_left_as_it_was(
    tmp_path: Path, row: str, statement: str, table: str, key: str, problem: str, advice: str
) -> None:
    """A byte a failing disk changed inside a row (SQLite finds the pages whole), or a field a newer silod wrote,
    found after a downgrade: the start used to end in a JSONDecodeError or TypeError traceback (exit 1). A value out
    of the API's ranges, or a job naming a dataset, tenant or node that is not there, was served, and broke calls."""
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(nodes_put=(NODE,), datasets_put=(DATASET,)))])
    store.commit([Commit(2, Change(jobs_put=(JOB,), histories_put=(JobHistory("j1", 100.0),)))])
    store.close()
    path = tmp_path / "silod.db"
    edit(path, statement)
    before = path.read_bytes()

    with pytest.raises(StateDirError) as refused:
        opened = SQLiteStore(tmp_path)
        try:
            opened.load()
        finally:
            opened.close()

    assert str(refused.value).startswith(
        f"cannot use state dir {tmp_path}: {path} holds a row this silod cannot read: table {table}, row {key!r}: "
        f"{problem}; {advice}"
    ), row
    assert path.read_bytes() == before


# JobHistory as a silod of schema 5 from before `policy_state_by` (commit f1474bb) had it, and how it read a stored
# history: `JobHistory(**json.loads(history))`, a field it lacked its default, a field it did not know a TypeError.
_JobHistoryBeforePolicyStateBy = make_dataclass(
    "JobHistory",
    [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
        for f in fields(JobHistory)
        if f.name != "policy_state_by"
    ],
    frozen=True,
)


def _stored_history(tmp_path: Path, history: JobHistory) -> str:
    """The JSON the SQLite store writes for `history` (committed with its job, then read back from the file)."""
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(nodes_put=(NODE,), datasets_put=(DATASET,)))])
    store.commit([Commit(2, Change(jobs_put=(JOB,), histories_put=(history,)))])
    store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "silod.db")) as db:
        (text,) = db.execute("SELECT history FROM job_histories WHERE job_id = ?", (history.job_id,)).fetchone()
    return str(text)


def test_a_history_is_stored_without_the_fields_at_their_default_so_a_silod_of_schema_5_before_them_reads_it(
    tmp_path: Path,
) -> None:
    """Histories gain fields without a new schema version. Every history was written with every field, so a silod
    of schema 5 from before `policy_state_by` met `"policy_state_by": ""` in all of them after a downgrade and
    failed with a TypeError; a field at its default is now left out, and read back as its default."""
    running = JobHistory(JOB.job_id, 100.0, first_start_time=110.0, last_start_time=110.0)

    text = _stored_history(tmp_path, running)

    older = _JobHistoryBeforePolicyStateBy(**json.loads(text))  # was: TypeError, unexpected 'policy_state_by'
    assert (older.job_id, older.first_start_time, older.preemptions, older.held) == ("j1", 110.0, 0, {})
    written = {"job_id": "j1", "submit_time": 100.0, "first_start_time": 110.0, "last_start_time": 110.0}
    assert json.loads(text) == written


# A value other than its default for every field of JobHistory that has one (a falsy one where a default is None).
_NOT_DEFAULT: dict[str, object] = {
    "first_start_time": 0.0,
    "last_start_time": 120.0,
    "pending_since": 130.0,
    "queued_seconds_before": 3.5,
    "attained_gpu_seconds_before": 20.0,
    "preemptions": 2,
    "policy_state": {"queue": 0.0},
    "policy_state_by": "tiresias",
    "held": {"n1": 2},
    "suspended_until": 200.0,
    "bytes_read_before": 12_345,
}
assert _NOT_DEFAULT.keys() == {f.name for f in fields(JobHistory)} - {"job_id", "submit_time"}, "a field untested"


@pytest.mark.parametrize("name", ["none", *_NOT_DEFAULT, "all"])
def test_a_history_reads_back_as_it_was_committed_whichever_fields_hold_their_default(
    tmp_path: Path, name: str
) -> None:
    values = _NOT_DEFAULT if name == "all" else {k: v for k, v in _NOT_DEFAULT.items() if k == name}
    history = JobHistory(JOB.job_id, 100.0, **values)  # type: ignore[arg-type]

    text = _stored_history(tmp_path, history)

    assert json.loads(text).keys() == {"job_id", "submit_time", *values}
    reopened = SQLiteStore(tmp_path)
    (read,) = reopened.load().histories
    reopened.close()
    assert read == history
    assert [type(getattr(read, f)) for f in values] == [type(v) for v in values.values()]


def test_an_empty_state_database_is_refused_as_lost_contents_and_left_as_it_was(tmp_path: Path) -> None:
    """What ext4 or XFS can leave of a file after a power loss: 0 bytes. SQLite opens it as an empty database, and
    the data manager served an empty cluster at revision 0 without a word. silod never leaves one: a fresh state
    dir's database is made whole under another name, then renamed."""
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(nodes_put=(NODE,)))])
    store.close()
    path = tmp_path / "silod.db"
    os.truncate(path, 0)

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(tmp_path)

    assert str(refused.value) == (
        f"cannot use state dir {tmp_path}: {path} is empty (0 bytes), as silod never leaves it (it makes a database "
        "whole before naming it so): the file system lost its contents (a power loss before the disk wrote them, a "
        "disk fault); nothing was changed: restore the state dir from a backup (silod datamgr restore), or delete "
        f"{path} to start with an empty state"
    )
    assert path.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["lock", "silod.db"]
    path.unlink()
    fresh = SQLiteStore(tmp_path)
    assert fresh.load().revision == 0
    fresh.close()


@pytest.mark.parametrize("damage", ["not a database", "cut short", "tables overwritten"])
def test_a_damaged_state_database_is_refused_naming_it_and_left_as_it_was(tmp_path: Path, damage: str) -> None:
    """A state dir restored from a broken backup, a disk that lost pages: the data manager must not start on it
    (exit 2 through StateDirError) nor touch it, and the state dir is free for the operator to repair."""
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(nodes_put=tuple(Node(f"n{i:04d}", "h1:7421", 10_000) for i in range(2000))))])
    store.close()
    path = tmp_path / "silod.db"
    if damage == "not a database":
        path.write_bytes(b"garbage\n" * 1000)
    elif damage == "cut short":
        path.write_bytes(path.read_bytes()[:5000])
    else:
        damage_tables(path)
    before = path.read_bytes()

    with pytest.raises(StateDirError) as refused:
        opened = SQLiteStore(tmp_path)  # refused here when the schema cannot be read, else by the first load
        try:
            opened.load()
        finally:
            opened.close()
    assert str(refused.value).startswith(f"cannot use state dir {tmp_path}: {path} is damaged or not a silod database")
    assert "nothing was changed: restore the state dir from a backup" in str(refused.value)
    assert path.read_bytes() == before
    path.rename(tmp_path / "silod.db.damaged")  # moved aside: the state dir opens empty, its lock given back
    fresh = SQLiteStore(tmp_path)
    assert fresh.load().revision == 0
    fresh.close()


def test_a_database_linked_to_a_file_that_is_not_there_is_refused_naming_the_link_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    """`silod.db` a symbolic link to a database on a volume that is not mounted: the data manager took the state dir
    for a fresh one, served an empty cluster at revision 0, and renamed a new database over the link, so the state
    was no longer used once the volume came back."""
    volume, state_dir = tmp_path / "volume", tmp_path / "state"
    state_of_nodes(volume, 3)
    state_dir.mkdir(mode=0o700)
    (state_dir / "silod.db").symlink_to(volume / "silod.db")
    volume.rename(tmp_path / "unmounted")

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(state_dir)

    assert str(refused.value) == (
        f"cannot use state dir {state_dir}: {state_dir / 'silod.db'} is a symbolic link to {volume / 'silod.db'}, "
        "which does not exist (on a volume that is not mounted?); nothing was changed: mount the volume (or put back "
        "the file it names), then start again; or delete the link to start with an empty state"
    )
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock", "silod.db"]  # the lock taken, and given back
    assert (state_dir / "silod.db").readlink() == volume / "silod.db"
    (tmp_path / "unmounted").rename(volume)  # the volume is back
    assert revision_and_nodes(state_dir) == (1, ["n0000", "n0001", "n0002"])


def test_a_state_dir_that_is_a_link_to_nothing_is_refused_naming_the_link(tmp_path: Path) -> None:
    """It was refused with only "File exists", naming neither the link nor where it points."""
    state_dir = tmp_path / "state"
    state_dir.symlink_to(tmp_path / "unmounted" / "state")

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(state_dir)

    assert str(refused.value) == (
        f"cannot use state dir {state_dir}: {state_dir} is a symbolic link to {tmp_path / 'unmounted' / 'state'}, "
        "which does not exist (on a volume that is not mounted?); nothing was changed: mount the volume it is on (or "
        "make the directory it names), then start again"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_the_file_it_names_left_as_it_was(tmp_path: Path) -> None:
    """The data manager opened DIR/lock following links, then truncated the file and wrote its pid into it: a link
    there cost the file it named its contents."""
    state_dir, victim = tmp_path / "state", tmp_path / "victim.conf"
    state_of_nodes(state_dir, 1)
    victim.write_text("important = true\n")
    (state_dir / "lock").unlink()
    (state_dir / "lock").symlink_to(victim)

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(state_dir)

    lock = state_dir / "lock"
    assert str(refused.value) == (
        f"cannot use state dir {state_dir}: {lock} is a symbolic link (to {victim}), not the lock file silod makes, "
        "and the data manager writes its pid into its lock file, which would overwrite the file it names; nothing "
        f"was changed: delete the link {lock} (silod makes the lock file itself), then start again"
    )
    assert victim.read_text() == "important = true\n" and lock.readlink() == victim
    lock.unlink()
    assert revision_and_nodes(state_dir) == (1, ["n0000"])


def _reseal(log: Path, offset: int, value: int) -> None:
    """Put `value` in the 32-bit field at `offset` of the log's header and the header's checksum over it, as SQLite
    computes it (its file format, "WAL File Format": sums of the header's first 24 bytes as 32-bit words, in pairs,
    little-endian for the magic number 0x377f0682): a header whose only fault is that field."""
    header = bytearray(log.read_bytes()[:32])
    assert header[:4] == bytes.fromhex("377f0682")
    header[offset : offset + 4] = value.to_bytes(4, "big")
    first = second = 0
    for i in range(0, 24, 8):
        first = (first + int.from_bytes(header[i : i + 4], "little") + second) & 0xFFFFFFFF
        second = (second + int.from_bytes(header[i + 4 : i + 8], "little") + first) & 0xFFFFFFFF
    header[24:32] = first.to_bytes(4, "big") + second.to_bytes(4, "big")
    with log.open("r+b") as file:
        file.write(header)


def _overwrite(log: Path, offset: int, data: bytes) -> None:
    with log.open("r+b") as file:
        file.seek(offset)
        file.write(data)


_HEADER_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "its salt changed": (
        lambda log: _overwrite(log, 16, b"\xff" * 8),
        "its header's checksum does not match the header",
    ),
    "its magic number changed": (
        lambda log: _overwrite(log, 0, b"\x00\x00\x00\x00"),
        "its header's magic number is 0x00000000, not SQLite's 0x377f0682 or 0x377f0683",
    ),
    "a page size no database has": (
        lambda log: _reseal(log, 8, 1000),
        "its header gives a page size of 1000 bytes, which no SQLite database has",
    ),
    "a format version SQLite does not read": (
        lambda log: _reseal(log, 4, 3007001),
        "its header gives the format version 3007001, not 3007000, the one SQLite reads",
    ),
}


@pytest.mark.parametrize("damage", list(_HEADER_DAMAGE))
def test_a_log_whose_header_is_damaged_is_refused_naming_it_and_every_file_left_as_it_was(
    tmp_path: Path, damage: str
) -> None:
    """A data manager killed with SIGKILL leaves every change since the last checkpoint in its log alone. SQLite
    ignores a log whose header it does not take: the start served what the database held without it (here an empty
    cluster at revision 0), without a word, and its first change overwrote the log (a format version SQLite does not
    read failed the start with "unable to open database file" instead)."""
    killed_state_dir(tmp_path, 5)
    log = tmp_path / "silod.db-wal"
    damage_it, problem = _HEADER_DAMAGE[damage]
    damage_it(log)
    before = files_of(tmp_path)

    with pytest.raises(StateDirError) as refused:
        SQLiteStore(tmp_path)

    database = tmp_path / "silod.db"
    assert str(refused.value) == (
        f"cannot use state dir {tmp_path}: {log}, the write-ahead log of {database}, is damaged: {problem}; SQLite "
        "would not replay the changes it holds (every change since the log was last folded into silod.db) and would "
        "serve an older state; nothing was changed: restore the state dir from a backup (silod datamgr restore), or "
        f"move {log} aside to start from what {database} alone holds"
    )
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("log", ["its last frame torn", "a header alone, not SQLite's"])
def test_a_log_that_holds_no_whole_change_it_would_lose_is_taken_as_sqlite_takes_it(tmp_path: Path, log: str) -> None:
    """What a crash leaves: the last frame half written (SQLite drops the transaction it belonged to, which no caller
    was told was done), or a log of a header and no frame (SQLite reads nothing from it). Neither is refused."""
    killed_state_dir(tmp_path, 5)
    path = tmp_path / "silod.db-wal"
    if log == "its last frame torn":
        os.truncate(path, path.stat().st_size - 1000)
        expected = (4, [f"killed{r}" for r in range(1, 5)])
    else:
        SQLiteStore(tmp_path).close()  # folds the log into the database and deletes it
        path.write_bytes(b"\xff" * 32)
        expected = (5, [f"killed{r}" for r in range(1, 6)])

    assert revision_and_nodes(tmp_path) == expected


def test_a_dataset_whose_manifest_the_disk_lost_is_refused_its_manifest_as_a_read_the_disk_failed(
    tmp_path: Path,
) -> None:
    """A dataset is written and deleted with its manifest, so a dataset without one is the disk's loss: GetManifest
    answered UNKNOWN with a KeyError traceback; it is FAILED_PRECONDITION naming the file, as for a failed read."""
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(datasets_put=(DATASET,), manifest=(DATASET.uri, b"M")))])
    store.close()
    edit(tmp_path / "silod.db", "DELETE FROM manifests")
    manager = DataManager(SQLiteStore(tmp_path), remote_io_limit=1000)

    with pytest.raises(StateDiskUnreadable) as refused:
        manager.manifest(DATASET.uri)

    assert str(refused.value) == (
        f"the data manager cannot read the manifest of {DATASET.uri} from its state disk: {tmp_path / 'silod.db'} "
        f"holds dataset {DATASET.uri} without its manifest (table manifests); repair the disk (calls that need no "
        "manifest are still served)"
    )
    asyncio.run(manager.close())


def test_the_write_ahead_log_is_folded_in_often_and_cut_back_after_a_large_change(tmp_path: Path) -> None:
    """SQLite's defaults fold the log into the database every 1000 pages (4 MiB) and never cut the file back: most
    of a small state disk, which the log filled (tests/test_datamgr_faults.py), and a large change (a big dataset's
    manifest) kept its size there for good."""
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(datasets_put=(DATASET,), manifest=(DATASET.uri, os.urandom(3 << 20))))])
    log = tmp_path / "silod.db-wal"
    assert log.stat().st_size > 3 << 20
    sizes = []
    for revision in range(2, 302):
        store.commit([Commit(revision, Change(nodes_put=(replace(NODE, node_id=f"n{revision}"),)))])
        sizes.append(log.stat().st_size)
    store.close()
    assert max(sizes) <= 1 << 20  # 1 MiB, what a log is cut back to


def test_state_files_are_private_to_their_owner(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "state").close()
    assert (tmp_path / "state").stat().st_mode & 0o077 == 0
    assert (tmp_path / "state" / "silod.db").stat().st_mode & 0o077 == 0


class _CountingStore:
    """The real SQLite store, counting its transactions."""

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner
        self.batches: list[list[int]] = []
        self.load = inner.load
        self.history = inner.history
        self.events_since = inner.events_since
        self.manifest = inner.manifest
        self.close = inner.close

    def commit(self, commits: Sequence[Commit]) -> None:
        self.batches.append([c.revision for c in commits])
        self.inner.commit(commits)


def _seeded_store(tmp_path: Path) -> SQLiteStore:
    store = SQLiteStore(tmp_path)
    store.commit([Commit(1, Change(nodes_put=(NODE,), datasets_put=(DATASET,))), Commit(2, Change(jobs_put=(JOB,)))])
    return store


def test_concurrent_changes_share_a_transaction_and_each_returns_once_durable(tmp_path: Path) -> None:
    counting = _CountingStore(_seeded_store(tmp_path))

    async def scenario() -> list[int]:
        manager = DataManager(counting, remote_io_limit=10**9)
        replies = await asyncio.gather(*(manager.allocate_remote_io("j1", rate) for rate in range(100, 110)))
        await manager.close()
        return [revision for _, revision in replies]

    revisions = asyncio.run(scenario())
    assert revisions == list(range(3, 13))
    assert sorted(r for batch in counting.batches for r in batch) == revisions
    assert len(counting.batches) < len(revisions)  # group commit: fewer fsyncs than changes
    assert counting.inner.load().jobs[0].io_bytes_per_sec == 109
    counting.close()


class _FailingStoreFake(_CountingStore):
    """The real store, but its disk fails on commit: a fault no real SQLite file produces on demand."""

    def commit(self, commits: Sequence[Commit]) -> None:
        raise OSError("disk on fire")


@pytest.mark.expected_warnings
def test_a_failed_commit_undoes_every_pending_change_with_failing_store_fake(tmp_path: Path) -> None:
    failing = _FailingStoreFake(_seeded_store(tmp_path))

    async def scenario() -> DataManager:
        manager = DataManager(failing, remote_io_limit=1000)
        results = await asyncio.gather(
            manager.allocate_remote_io("j1", 70),
            manager.allocate_cache_size(DATASET.uri, 900),
            manager.allocate_remote_io("j1", 80),
            return_exceptions=True,
        )
        assert all(isinstance(r, OSError) and "disk on fire" in str(r) for r in results), results
        return manager

    manager = asyncio.run(scenario())
    assert manager.state.jobs["j1"].io_bytes_per_sec == 50
    assert manager.state.io_allocated_bytes_per_sec == 50
    assert manager.state.datasets[DATASET.uri].cache_quota_bytes == 500
    assert failing.inner.load().revision == 2
    failing.close()


def test_an_imagenet_sized_manifest_is_stored_compactly_and_read_back(tmp_path: Path) -> None:
    """1.28 M files with real-looking (random MD5) ETags: one compact blob, not a row per file."""
    files = 1_281_167
    etags = random.Random(0).randbytes(16 * files).hex()  # MD5-like: incompressible
    objects = (
        ObjectInfo(
            f"train/n{i // 1300:08d}/n{i // 1300:08d}_{i}.JPEG", 110_000 + i % 5000, etags[32 * i : 32 * i + 32], i
        )
        for i in range(files)
    )
    manifest = build_manifest(objects)
    encoded = manifest.encode()
    store = SQLiteStore(tmp_path)
    dataset = replace(DATASET, file_count=files, item_count=manifest.item_count, manifest_digest=manifest.digest)
    store.commit([Commit(1, Change(datasets_put=(dataset,), manifest=(dataset.uri, encoded)))])
    store.close()
    reopened = SQLiteStore(tmp_path)
    restored = Manifest.decode(reopened.manifest(dataset.uri))
    reopened.close()
    assert restored.digest == manifest.digest
    assert (restored.file_count, restored.item_count) == (files, files)
    assert restored.file(files - 1).first_item == files - 1
    assert len(encoded) / files < 40  # bytes per file, ETag included
    assert (tmp_path / "silod.db").stat().st_size < 2 * len(encoded)
