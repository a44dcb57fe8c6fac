"""SQLite in the state directory: the embedded default store.

Write-ahead logging with `synchronous=FULL`, so a commit is on disk when `commit` returns and a SIGKILL or
power loss never loses an accepted change. The state directory is locked for one data manager at a time
and readable only by its owner, because dataset options may hold storage credentials. What the state dir's files
must be before SQLite opens them, and its lock: `statedir`; the state's rows, each checked as it is read: `rows`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from datamgr.store import wal
from datamgr.store.base import (
    DEFAULT_RETAINED_REVISIONS,
    Commit,
    StoredState,
    StoreFull,
    StoreUnreadable,
    StoreUnwritable,
    in_history,
    new_history,
)
from datamgr.store.rows import UnreadableRow, read_state, write_change
from datamgr.store.statedir import (
    CREATING_NAME,
    LOG_SUFFIXES,
    access_advice,
    check_files,
    check_not_dangling,
    lock_state_dir,
)
from datamgr.store.statedir import DATABASE_NAME as DATABASE_NAME  # where they were, for those who import them here
from datamgr.store.statedir import StateDirError as StateDirError
from silodlib.directories import fsync_directory, make_directory
from silodlib.units import format_size

SCHEMA_VERSION = 5
_PRUNE_EVERY = 1024
_BUSY_TIMEOUT_MS = 5000  # sqlite3.connect's default: how long a statement waits for a lock
_ERASE_WAIT_MS = 100  # how long emptying the log after a commit waits for readers, so that commits do not wait on one

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    uri TEXT PRIMARY KEY, options TEXT NOT NULL, size_bytes INTEGER NOT NULL, file_count INTEGER NOT NULL,
    item_count INTEGER NOT NULL, chunk_size_bytes INTEGER NOT NULL, manifest_digest TEXT NOT NULL,
    cache_quota_bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS manifests (uri TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, dataset_uri TEXT NOT NULL, ideal_bytes_per_sec INTEGER NOT NULL,
    workers TEXT NOT NULL, io_bytes_per_sec INTEGER NOT NULL, epochs REAL NOT NULL DEFAULT 0,
    irregular INTEGER NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0,
    job_class TEXT NOT NULL DEFAULT 'be', grace_seconds REAL NOT NULL DEFAULT 0,
    tenant TEXT NOT NULL DEFAULT '', priority TEXT NOT NULL DEFAULT 'high');
CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, address TEXT NOT NULL,
    cache_capacity_bytes INTEGER NOT NULL, gpus INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS job_histories (job_id TEXT PRIMARY KEY, history TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (name TEXT PRIMARY KEY, cells TEXT NOT NULL, cache_bytes INTEGER NOT NULL,
    io_bytes_per_sec INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events (revision INTEGER NOT NULL, node_id TEXT NOT NULL, payload BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_node ON events (node_id, revision);
CREATE TABLE IF NOT EXISTS histories (history INTEGER PRIMARY KEY, last_revision INTEGER NOT NULL);
"""

# Schema version -> the statements that bring a state dir written at that version to the next one. All the steps
# an upgrade takes run in one transaction with the version bump, so a crash leaves the old version or the new,
# never half; the data manager commits it only once its start goes ahead (`SQLiteStore.keep_upgrade`).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: jobs say how long they train and whether their access is irregular; jobs registered before did
    # not, so their length is unknown (0) and their access regular.
    1: (
        "ALTER TABLE jobs ADD COLUMN epochs REAL NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN irregular INTEGER NOT NULL DEFAULT 0",
    ),
    # 3: the policy may place jobs (registered with GPUs instead of workers) on nodes' GPUs, and every job has
    # a scheduling history. Jobs registered before were all placed by whoever registered them; their
    # registration time was never recorded, so their history starts (submitted and running) at the upgrade.
    2: (
        "ALTER TABLE jobs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nodes ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0",
        "WITH now(t) AS (SELECT (julianday('now') - 2440587.5) * 86400.0) INSERT OR IGNORE INTO job_histories "
        "SELECT job_id, json_object('job_id', job_id, 'submit_time', t, 'first_start_time', t, 'last_start_time', t) "
        "FROM jobs, now",
    ),
    # 4: jobs have a class (trial-and-error or best-effort) and a grace period, for policies such as FitGpp;
    # jobs registered before said neither, so they are best-effort and release their GPUs at once when
    # preempted. Histories gain `held` and `suspended_until`, which a history written before lacks and reads
    # as not suspending (`JobHistory`'s defaults): no statement needed.
    3: (
        "ALTER TABLE jobs ADD COLUMN job_class TEXT NOT NULL DEFAULT 'be'",
        "ALTER TABLE jobs ADD COLUMN grace_seconds REAL NOT NULL DEFAULT 0",
    ),
    # 5: tenants and their virtual clusters (a table `_SCHEMA` has already created, empty), and jobs that belong
    # to one with a priority, for policies such as HiveD. Jobs registered before belonged to no tenant and were
    # regular: high priority.
    4: (
        "ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN priority TEXT NOT NULL DEFAULT 'high'",
    ),
}
# What SQLite answers when the file system refuses its writes: an I/O error (EIO, or EROFS from a file system
# turned read-only under an open database), a read-only database, a file it cannot open.
_UNWRITABLE = frozenset({sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN})
_DISK_REFUSALS = _UNWRITABLE | {sqlite3.SQLITE_FULL}  # and no room
_UNREADABLE = frozenset({sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT})  # a read failed, or found damaged pages
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})  # damaged, or not a database at all
_FIX_THE_DISK = "free space on its disk (or repair the disk), then start the data manager again"


class SQLiteStore:
    """`StateStore` on one SQLite database file, `silod.db`, in `state_dir`.

    Its histories (`StateStore.history`): meta's `history` is the one the state dir's last revision belongs to
    (none before the first change written by a silod that keeps histories), and the table `histories` holds the
    earlier ones with the revision each ended at. The history drawn at an open is written with the first change
    after it, in the same transaction, so that a start that changes nothing writes nothing (a data manager starts
    on a full disk) and every revision on disk belongs to the history written beside it.

    A state database of an older schema is upgraded in a transaction the open begins and `keep_upgrade` (or the first
    `commit`) commits, once the start goes ahead: the store reads and serves the upgraded state meanwhile, and a
    start refused after the open (a row this silod cannot read, a port in use, cell levels that do not fit) closes
    it with the file left at its old schema, for the silod that wrote it.
    """

    def __init__(self, state_dir: Path, *, retained_revisions: int = DEFAULT_RETAINED_REVISIONS) -> None:
        refused = f"cannot use state dir {state_dir}"
        try:
            check_not_dangling(state_dir, refused, "start again")
            make_directory(state_dir, mode=0o700)
            self._lock = lock_state_dir(state_dir, "data manager")
        except OSError as exc:  # a path under /proc, a file in the way, a read-only file system, no permission
            raise StateDirError(f"{refused}: {access_advice(state_dir, exc)}") from None
        path = self._path = state_dir / DATABASE_NAME
        try:
            try:
                check_files(state_dir)  # before SQLite opens anything: it would roll a hot journal back, say
                with refusing_damage(path), refusing_disk_errors(refused, _FIX_THE_DISK):
                    self._open(path, refused)
            except OSError as exc:
                raise StateDirError(f"{refused}: {access_advice(state_dir, exc)}") from None
        except BaseException:
            self._lock.release()
            raise
        self._files = wal.files_of(path)  # a linked silod.db's log, and the disk it fills, are its volume's
        self._reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._retained = retained_revisions
        self._next_prune = _PRUNE_EVERY
        self._log_holds_forgotten = False  # the log's frames may hold forgotten events (see `_erase_forgotten`)
        self.history = new_history()

    def _open(self, path: Path, refused: str) -> None:
        """Open the writing connection to the state database at `path` (made if there is none) at the current schema,
        and read `_ended`. A database from a newer silod is refused before anything is written to it; one from an
        older silod is upgraded in a transaction left open (`_upgrading_from`) for `keep_upgrade`."""
        if not path.exists():
            _create(path)
        version = schema_version(path, refused)
        # One connection writes (from the committing thread), one reads (from the event loop): with WAL the
        # reader sees only committed transactions, never a batch that is still being written.
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000)
        self._upgrading_from: int | None = None  # the schema version found, while its upgrade is not committed
        try:
            db.execute("PRAGMA journal_mode=WAL")  # a silod of every schema made its database so: no change
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA secure_delete=ON")  # deleted rows' bytes zeroed: old options may be credentials
            wal.bound(db)
            if version is not None and version < SCHEMA_VERSION:
                begin_upgrade(db, version)
                self._upgrading_from = version
            else:  # current, or no tables yet (what a silod from before `_create` left): nothing to keep for anyone
                upgrade(db, version)
            self._db = db
            self._ended, self._history_written = self._earlier_histories(), False
        except BaseException:
            db.close()  # rolls back an upgrade it began
            raise

    def keep_upgrade(self) -> None:
        """Commit the upgrade of an older schema that the open began, once the data manager's start goes ahead (its
        checks passed, its ports bound), and log it: silods of the old schema refuse the state dir from then on.
        Nothing to do for a state dir that was at the current schema. StateDirError for a disk that refuses the
        commit (full, read-only): the file is left at its old schema, and the store is to be closed."""
        old = self._upgrading_from
        if old is None:
            return
        self._upgrading_from = None
        state_dir = self._path.parent
        try:
            with refusing_disk_errors(f"cannot use state dir {state_dir}", _FIX_THE_DISK):
                self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite rolls back by itself on some errors (SQLITE_FULL among them)
                self._db.execute("ROLLBACK")
            raise
        log.warning(
            "upgraded state dir %s from schema %d to %d: silods of schema %d and before refuse it now; to go back to "
            "one, restore a backup taken before this start (silod datamgr restore)",
            state_dir,
            old,
            SCHEMA_VERSION,
            SCHEMA_VERSION - 1,
        )

    def _earlier_histories(self) -> dict[int, int]:
        """The histories the state dir has been in, each with the last revision it holds: the one it was in until
        this open ends at the revision it was opened at."""
        ended = dict(self._db.execute("SELECT history, last_revision FROM histories").fetchall())
        previous = self._meta("history", None)
        if previous is not None:
            ended[previous] = self._meta("revision", 0)
        return ended

    def _meta(self, key: str, default: int | None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def _read_meta(self, key: str, default: int) -> Any:
        row = self._reader.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def load(self) -> StoredState:
        """The state, every row checked (`rows.read_state`): StateDirError naming the file, the table and the row
        for one this silod cannot read, as for a damaged database."""
        # The first read of every table: damage the schema steps missed.
        with refusing_damage(self._path), refusing_unreadable_rows(self._path):
            return read_state(self._db)

    def commit(self, commits: Sequence[Commit]) -> None:
        """Commit `commits` in one transaction; the first one keeps an upgrade the open began (a change accepted means
        the start went ahead), as `keep_upgrade` does. A disk full of what the write-ahead log holds is emptied of it
        and the commit tried once more (`_room_from_log`); on a disk short of room, the log is emptied after the
        commit (`_leave_room`)."""
        self.keep_upgrade()
        try:
            forgotten = self._write(commits)
        except StoreFull as full:
            self._room_from_log(full)
            forgotten = self._write(commits)
        self._history_written = True
        last = commits[-1].revision
        if last >= self._next_prune:
            self._next_prune = last + _PRUNE_EVERY
        if forgotten or self._log_holds_forgotten:
            self._erase_forgotten()
        self._leave_room()

    def _write(self, commits: Sequence[Commit]) -> bool:
        """Write `commits` in one transaction, rolled back whole if it fails (StoreFull, StoreUnwritable, or what
        else it failed with); whether it forgot events that retired options (`Change.forgets_earlier_events`)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        committing = False  # only COMMIT writes a transaction's commit record to the log
        try:
            if not self._history_written:  # the first change since the open: the revisions from here are new
                db.executemany("INSERT OR REPLACE INTO histories VALUES (?, ?)", self._ended.items())
                db.execute("INSERT OR REPLACE INTO meta VALUES ('history', ?)", (self.history,))
            forgotten = False
            for commit in commits:
                if commit.change.forgets_earlier_events:
                    self._forget_events(commit.revision - 1)
                    forgotten = True
                write_change(db, commit.change)
                db.executemany(
                    "INSERT INTO events VALUES (?, ?, ?)", ((commit.revision, n, p) for n, p in commit.events)
                )
            last = commits[-1].revision
            db.execute("INSERT OR REPLACE INTO meta VALUES ('revision', ?)", (last,))
            if last >= self._next_prune and last > self._retained:
                self._forget_events(last - self._retained)
            committing = True
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:  # SQLite rolls back by itself on some errors (SQLITE_FULL among them)
                db.execute("ROLLBACK")
            code = _result_code(exc)
            if code == sqlite3.SQLITE_FULL:
                raise StoreFull(
                    f"the state disk is full: no room to write {self._path} ({exc})",
                    advice=f"{self._where_to_free()} and call again",
                ) from exc
            if code in _UNWRITABLE:
                may_reappear = committing and _may_be_logged(exc) and not self._erase_log()
                reason = _why_unwritable(self._files.database.parent, exc)
                raise StoreUnwritable(f"{self._path}: {reason}", may_reappear=may_reappear) from exc
            raise
        return forgotten

    def _room_from_log(self, full: StoreFull) -> None:
        """Give the state disk back the room the write-ahead log holds, for a commit that found it full; returns once
        the log is empty, for the commit to be tried again. SQLite empties its log only at a checkpoint, which it
        runs only after a commit that succeeded, so a log that had filled the disk held it for good: every change
        was refused until a restart, with nothing the operator could delete. Raises `full` when the log held
        nothing, and a StoreFull naming the log when it could not be emptied: a reader holds it, or the database has
        no room for what the log moves into it."""
        file = self._files.log
        try:
            held = file.stat().st_size
        except FileNotFoundError:
            held = 0
        if held == 0:
            raise full
        why = wal.empty(self._db)
        if why is None:
            return
        into = self._files.database
        note = f"its write-ahead log {file} holds {format_size(held)} of it, which could not be moved into {into}"
        free = self._where_to_free()
        remedy = f"end the reader, or {free}," if why == wal.A_READER_HOLDS_IT else free
        raise StoreFull(f"{full}; {note} ({why})", advice=f"{note} ({why}): {remedy} and call again") from full

    def _leave_room(self) -> None:
        """Empty the write-ahead log after a commit on a state disk with less room left than the log may take before
        its next checkpoint (`wal.short_of_room`). A log that holds a disk's last room cannot be emptied: the
        checkpoint that would give that room back needs room of its own, for the pages the database grows by, so the
        log is kept from taking it. Costs a flush of the database per commit, on such a disk only."""
        if wal.short_of_room(self._files.log.parent):
            with self._waiting_at_most(_ERASE_WAIT_MS):
                wal.empty(self._db)

    def _where_to_free(self) -> str:
        """Where room is to be freed for a commit: the disk of the database and its log, which is that of the state
        dir unless its `silod.db` links to a database on another volume."""
        home = self._files.database.parent
        if home == Path(os.path.realpath(self._path.parent)):
            return "free space in its state dir"
        return f"free space on the disk of {home} (its database and write-ahead log are there, not in its state dir)"

    @contextlib.contextmanager
    def _waiting_at_most(self, milliseconds: int) -> Iterator[None]:
        """Within it, a statement of the writing connection waits at most `milliseconds` for other connections'
        locks (a checkpoint, for readers), not the busy timeout."""
        self._db.execute(f"PRAGMA busy_timeout={milliseconds}")
        try:
            yield
        finally:
            self._db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")

    def _forget_events(self, floor: int) -> None:
        """In the transaction under way, delete the events up to revision `floor` (and the histories that ended
        before it, which have no revision left to resume from): a node behind it resyncs from a snapshot. Their bytes
        are overwritten with zeros (`secure_delete`), as events can carry credentials
        (`Change.forgets_earlier_events`)."""
        if floor <= self._meta("event_floor", 0):
            return
        self._db.execute("DELETE FROM events WHERE revision <= ?", (floor,))
        self._db.execute("DELETE FROM histories WHERE last_revision < ?", (floor,))
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('event_floor', ?)", (floor,))

    def _erase_forgotten(self) -> None:
        """Empty the write-ahead log after events were forgotten: its older frames hold their pages as they were (old
        options, which may be credentials), and until a checkpoint has copied the zeroed pages over the database's,
        so does the database. A reader holding the database (an `sqlite3` shell, a backup of a large state) keeps
        both: then the log is emptied at a later commit, once the reader is done, with a WARNING now and a line when
        done. The try waits at most `_ERASE_WAIT_MS` for readers, so that commits do not wait on one."""
        with self._waiting_at_most(_ERASE_WAIT_MS):
            erased = self._erase_log()
        if erased and self._log_holds_forgotten:
            log.info("the state's write-ahead log %s no longer holds retired dataset options", self._files.log)
        elif not erased and not self._log_holds_forgotten:
            log.warning(
                "the state's write-ahead log %s, and %s, still hold retired dataset options (they may be "
                "credentials): a reader holds the database (an sqlite3 shell, a backup); they are overwritten at a "
                "later change once it is done",
                self._files.log,
                self._files.database.name,
            )
        self._log_holds_forgotten = not erased

    def _erase_log(self) -> bool:
        """Empty the write-ahead log, once what it holds that was committed is in the database (`wal.empty`); True if
        it is empty.

        Called after a COMMIT that failed once its commit record may have been written (its flush failed): SQLite
        has rolled the transaction back in memory but left it whole in the log, and a restart replays every
        complete transaction it finds there, flushed or not. The next successful commit overwrites it; until then
        only an empty log keeps a restart from bringing back a change its callers were told was refused. Fails
        (False) while the disk still fails, or while a reader holds the log for longer than the busy timeout."""
        return wal.empty(self._db) is None

    def events_since(self, node_id: str, revision: int, history: int = 0) -> list[bytes] | None:
        if not in_history(history, revision, self.history, self._ended):
            return None
        with self._reading():
            if not self._read_meta("event_floor", 0) <= revision <= self._read_meta("revision", 0):
                return None
            rows = self._reader.execute(
                "SELECT payload FROM events WHERE node_id = ? AND revision > ? ORDER BY revision",
                (node_id, revision),
            )
            return [payload for (payload,) in rows]

    def manifest(self, dataset_uri: str) -> bytes:
        """`StateStore.manifest`; StoreUnreadable, naming the file, for a dataset the file holds without its manifest:
        one is written and deleted with its dataset, so the disk lost it (which was a KeyError, a caller's UNKNOWN)."""
        with self._reading():
            row = self._reader.execute("SELECT data FROM manifests WHERE uri = ?", (dataset_uri,)).fetchone()
            if row is None and self._reader.execute("SELECT 1 FROM datasets WHERE uri = ?", (dataset_uri,)).fetchone():
                raise StoreUnreadable(
                    f"{self._path} holds dataset {dataset_uri} without its manifest (table manifests)"
                )
        if row is None:
            raise KeyError(dataset_uri)
        data: bytes = row[0]
        return data

    def _reading(self) -> contextlib.AbstractContextManager[None]:
        """A read of the running data manager's disk: an I/O error or damaged pages become StoreUnreadable, naming
        the file, rather than an error the caller cannot tell from a bug."""
        return _translating(_UNREADABLE, lambda exc: StoreUnreadable(f"{self._path}: {exc}"))

    def close(self) -> None:
        """Close the store and give its state dir back; an upgrade not kept is rolled back, leaving the file as the
        older silod wrote it."""
        self._reader.close()
        self._db.close()
        self._lock.release()


_REPAIR_STATE_DIR = (
    "nothing was changed: restore the state dir from a backup (silod datamgr restore), or move its silod.db aside "
    "to start with an empty one"
)


def _create(path: Path) -> None:
    """Make a fresh state database at `path`, whole: built under a temporary name readable by its owner only,
    flushed, then renamed into place and the directory flushed. So `silod.db` is never an empty or half-made file
    that silod left, and `check_files` can refuse an empty one as a file system's loss."""
    temp = path.with_name(CREATING_NAME)
    remove_database(temp)  # what a start killed while making it left: ours, since we hold the state dir
    try:
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        with contextlib.closing(sqlite3.connect(temp, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            upgrade(db, None)
        flush_file(temp)
        os.rename(temp, path)
    except BaseException:
        remove_database(temp)
        raise
    fsync_directory(path.parent)


def remove_database(path: Path) -> None:
    """Delete the database at `path` with its log and shared memory, those that exist."""
    for suffix in ("", *LOG_SUFFIXES):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


def flush_file(path: Path) -> None:
    """Flush the data of the file at `path` to disk (`fdatasync`: its bytes and size, as SQLite flushes its files).
    Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def read_only(path: Path, *, immutable: bool = False) -> sqlite3.Connection:
    """A read-only connection to the database at `path`; `immutable` for a file nothing writes and that has no
    log beside it (SQLite then reads the file alone, takes no locks and makes no shared-memory file)."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}", uri=True)


def schema_version(path: Path, refused: str) -> int | None:
    """The schema version of the state database at `path`, read without writing anything to it or beside it; None
    for a database with no tables yet (one a silod from before `_create` was killed while making). StateDirError,
    saying `refused` first, for a database from a newer silod (which this one could misread or destroy) and for
    one that is not silod's."""
    files = wal.files_of(path)  # a linked silod.db's log is beside the file the link names, as SQLite keeps it
    log, index = files.log, files.index
    had_index = index.exists()
    try:
        with contextlib.closing(read_only(path, immutable=not log.exists())) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            row = None
            if "meta" in tables:
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    finally:
        if not had_index:  # made to read the log: SQLite's reader leaves it behind
            with contextlib.suppress(FileNotFoundError):
                index.unlink()
    if tables and "meta" not in tables:
        raise StateDirError(
            f"{refused}: {path} is not a silod state database (it has tables, but not silod's); {_REPAIR_STATE_DIR}"
        )
    version = None if row is None else row[0]
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise StateDirError(
            f"{refused}: {path} is damaged or not a silod database (its schema version is {version!r}); "
            f"{_REPAIR_STATE_DIR}"
        )
    if version is not None and version > SCHEMA_VERSION:
        raise StateDirError(
            f"{refused}: {path} was written by a newer silod (schema {version} > {SCHEMA_VERSION}); nothing was "
            "changed; run that silod version (or newer)"
        )
    return version


def upgrade(db: sqlite3.Connection, version: int | None) -> None:
    """Give the database open as `db`, whose schema version is `version` (None: it has no tables yet), the current
    schema: create what it lacks, then bring what a silod of an older schema wrote to the current one, keeping its
    contents, in one transaction (`begin_upgrade`), committed here."""
    if version == SCHEMA_VERSION:
        db.executescript(_SCHEMA)  # creates what a damaged one lacks, if anything; alters nothing that exists
        return
    begin_upgrade(db, version)
    try:
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def begin_upgrade(db: sqlite3.Connection, version: int | None) -> None:
    """Bring the database open as `db`, whose schema version `version` is older than the current one (None: it has
    no tables yet), to the current schema in a transaction left open for the caller to commit or roll back: every
    step, the tables and the version bump in one (SQLite's schema changes are transactional), so that a crash, or
    a start refused before the commit, leaves the old version whole."""
    try:
        # BEGIN within the script: executescript() itself commits a transaction it finds open, never one it runs.
        db.executescript(f"BEGIN IMMEDIATE;\n{_SCHEMA}")  # creates what the older schema lacks; alters nothing
        if version is None:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            return
        for step in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[step]:
                db.execute(statement)
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


_NEWER_ROW = (
    "nothing was changed: if a newer silod wrote it, run that silod version (or newer); if not, restore the state "
    "dir from a backup (silod datamgr restore)"
)


@contextlib.contextmanager
def refusing_unreadable_rows(
    path: Path, refused: str | None = None, advice: str = _REPAIR_STATE_DIR, unknown_advice: str = _NEWER_ROW
) -> Iterator[None]:
    """Turn a row of `path` this silod cannot read (`rows.UnreadableRow`) into a StateDirError that names the file,
    the table and the row, says what was refused (by default: the state dir holding `path`) and what to do:
    `unknown_advice` for a field or value this silod does not know, which a newer silod may have written."""
    try:
        yield
    except UnreadableRow as row:
        refused = refused or f"cannot use state dir {path.parent}"
        raise StateDirError(
            f"{refused}: {path} holds a row this silod cannot read: {row}; {unknown_advice if row.unknown else advice}"
        ) from None


def refusing_damage(
    path: Path, refused: str | None = None, advice: str = _REPAIR_STATE_DIR
) -> contextlib.AbstractContextManager[None]:
    """Turn SQLite's "database disk image is malformed" or "file is not a database" about `path` into a
    StateDirError that says what was refused (by default: the state dir holding `path`) and what to do; SQLite
    has written nothing to such a file."""
    refused = refused or f"cannot use state dir {path.parent}"
    return _translating(
        _DAMAGED, lambda exc: StateDirError(f"{refused}: {path} is damaged or not a silod database ({exc}); {advice}")
    )


def refusing_disk_errors(refused: str, outcome: str) -> contextlib.AbstractContextManager[None]:
    """Turn SQLite's answer to a disk that fails it outside a commit ("database or disk is full", "disk I/O error",
    a read-only file system) into a StateDirError that says what was refused and what was left or is to be done,
    rather than a traceback: starting on a state dir, copying a backup in or out."""
    return _translating(_DISK_REFUSALS, lambda exc: StateDirError(f"{refused}: {exc}; {outcome}"))


@contextlib.contextmanager
def _translating(codes: frozenset[int], error: Callable[[sqlite3.DatabaseError], Exception]) -> Iterator[None]:
    """Raise SQLite's errors whose primary result code is one of `codes` as `error(exc)`; let any other pass."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if _result_code(exc) not in codes:
            raise
        raise error(exc) from None


def _why_unwritable(directory: Path, exc: BaseException) -> str:
    """SQLite's message with what the file system answers to a new file in `directory` ("disk I/O error
    (Read-only file system)"): SQLite reports the errno of a failed write only as "disk I/O error"."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as probe:
        return f"{exc} ({probe.strerror or probe})"
    return str(exc)


# An I/O error of COMMIT in a write of the log: SQLite writes the commit record last and checksums it whole, so a
# commit that failed there left no complete transaction in the log. Any other I/O error of COMMIT (a failed flush
# above all, or one in the shared-memory index after the flush) may come after the record is written.
_BEFORE_COMMIT_RECORD = frozenset({sqlite3.SQLITE_IOERR_WRITE})


def _may_be_logged(exc: BaseException) -> bool:
    """Whether a COMMIT that failed with `exc` may have left its whole transaction in the write-ahead log."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and int(code) & 0xFF == sqlite3.SQLITE_IOERR and code not in _BEFORE_COMMIT_RECORD


def _result_code(exc: BaseException) -> int | None:
    """SQLite's primary result code for an error SQLite itself reported (None for any other, such as a value
    the sqlite3 module could not bind)."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    return None if code is None else int(code) & 0xFF  # extended codes carry the primary one in their low byte
