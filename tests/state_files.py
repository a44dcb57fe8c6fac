"""State dirs and database files as crashes leave them, for tests of the data manager's store, backups and restores:
made by real SQLite in a child process that is then killed with SIGKILL, not written by hand."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

from datamgr.entities import Node
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore

# A data manager's store that commits one node per revision, 1 to N, and is then killed: its database and
# write-ahead log are as a data manager killed with SIGKILL leaves them (the log holding the last commits).
_KILLED_STORE = """
import os, signal, sys
from pathlib import Path
from datamgr.entities import Node
from datamgr.state import Change
from datamgr.store import Commit, SQLiteStore

store = SQLiteStore(Path(sys.argv[1]))
for revision in range(1, int(sys.argv[2]) + 1):
    store.commit([Commit(revision, Change(nodes_put=(Node(f"killed{revision}", "h:1", 10),)))])
os.kill(os.getpid(), signal.SIGKILL)
"""

# SQLite copying a database into a new file in its default (rollback journal) mode, killed after a few steps with
# a page cache small enough that pages reach the file before the commit: the copy and its hot journal, as a restore
# by a silod from before restores copied to a temporary name left them when it was killed or lost power.
_KILLED_COPY = """
import os, signal, sqlite3, sys
source = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro&immutable=1", uri=True)
copy = sqlite3.connect(sys.argv[2])
copy.execute("PRAGMA cache_size=1")
steps = []

def progress(status, remaining, total):
    steps.append(remaining)
    if len(steps) == 3:
        os.kill(os.getpid(), signal.SIGKILL)

source.backup(copy, pages=5, progress=progress)
"""


def killed_state_dir(state_dir: Path, revisions: int) -> None:
    """A state dir whose data manager committed `revisions` revisions (node `killed<N>` registered at revision N)
    and was killed with SIGKILL, leaving `silod.db-wal` beside `silod.db`."""
    child = subprocess.run([sys.executable, "-c", _KILLED_STORE, str(state_dir), str(revisions)], timeout=60)
    assert child.returncode == -9, child
    assert Path(f"{state_dir}/silod.db-wal").stat().st_size > 0


def killed_copy(source: Path, target: Path) -> None:
    """`target`: a copy of the database `source` that SQLite was killed while writing, its hot journal beside it."""
    child = subprocess.run([sys.executable, "-c", _KILLED_COPY, str(source), str(target)], timeout=60)
    assert child.returncode == -9, child
    assert Path(f"{target}-journal").stat().st_size > 0


def state_of_nodes(state_dir: Path, count: int, prefix: str = "n") -> None:
    """A closed state dir at revision 1 whose database holds `count` nodes (some 100 bytes each)."""
    store = SQLiteStore(state_dir)
    store.commit(
        [Commit(1, Change(nodes_put=tuple(Node(f"{prefix}{i:04d}", "h1:7421", 10_000) for i in range(count))))]
    )
    store.close()


def revision_and_nodes(state_dir: Path) -> tuple[int, list[str]]:
    """What a data manager starting on `state_dir` would serve: its revision and its nodes' ids."""
    store = SQLiteStore(state_dir)
    try:
        state = store.load()
    finally:
        store.close()
    return state.revision, [node.node_id for node in state.nodes]


def files_of(directory: Path, *, but: tuple[str, ...] = ("lock",)) -> dict[str, bytes]:
    """Every file in `directory` (name -> bytes), but those named in `but`."""
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.name not in but}


def edit(database: Path, *statements: str) -> None:
    """Run `statements` on the closed database `database` and close it (its log folded back into it)."""
    with contextlib.closing(sqlite3.connect(database, isolation_level=None)) as db:
        for statement in statements:
            db.execute(statement)


def linked_state_dir(state_dir: Path, volume: Path) -> Path:
    """Make `state_dir` (private, as the data manager makes it) with its `silod.db` a symbolic link to
    `volume`/silod.db, a database on another volume, as docs/datamgr.md supports; returns the link."""
    state_dir.mkdir(mode=0o700)
    link = state_dir / "silod.db"
    link.symlink_to(volume / "silod.db")
    return link


def damage_log_header(state_dir: Path) -> None:
    """Flip a bit of a salt in the header of `state_dir`'s write-ahead log: SQLite's checksum of the header no longer
    matches, so SQLite would ignore the whole log."""
    log = state_dir / "silod.db-wal"
    data = bytearray(log.read_bytes())
    data[20] ^= 0xFF
    log.write_bytes(bytes(data))
