"""The state's entities as rows of the SQLite store, and back.

Reading checks every row it turns into an entity: its columns' types, the JSON it holds, the names and values this
silod knows, that its values are within the ranges the API takes (`datamgr.validation`), and that what it names is
there (a job's dataset, tenant and nodes). A row it cannot read (a byte a failing disk changed in a row SQLite still
finds whole; a field or value a newer silod wrote, found after a downgrade) is refused by table and key
(`UnreadableRow`), so that a start stops with a message rather than a traceback (or a call's UNKNOWN later: a worker
count of 0 divided by zero, a rate above int64 overflowed a reply, a job of a dataset that is not there raised
KeyError), and never serves a value it misread or writes back a record without the fields it did not know
(docs/datamgr.md, "Durability")."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, fields
from functools import partial
from typing import Any, TypeVar

from datamgr.entities import JOB_CLASSES, PRIORITIES, Dataset, InvalidArgument, Job, JobHistory, Node, Tenant, Worker
from datamgr.state import Change
from datamgr.store.base import StoredState
from datamgr.validation import (
    check_address,
    check_bytes,
    check_cells,
    check_chunk_size,
    check_epochs,
    check_gpus,
    check_grace_seconds,
    check_id,
    check_rate,
    check_worker_count,
)

_DATASET_COLUMNS = (
    "uri, options, size_bytes, file_count, item_count, chunk_size_bytes, manifest_digest, cache_quota_bytes"
)
_JOB_COLUMNS = (
    "job_id, dataset_uri, ideal_bytes_per_sec, workers, io_bytes_per_sec, epochs, irregular, gpus, job_class, "
    "grace_seconds, tenant, priority"
)
_TENANT_COLUMNS = "name, cells, cache_bytes, io_bytes_per_sec"
_NODE_COLUMNS = "node_id, address, cache_capacity_bytes, gpus"

T = TypeVar("T")
V = TypeVar("V")


class UnreadableRow(Exception):
    """A row of `table`, whose key is `key`, that this silod cannot read: `problem` says why. `unknown`: it holds
    a field or value this silod does not know, as one a newer silod wrote would (or a changed byte may)."""

    def __init__(self, table: str, key: object, problem: str, *, unknown: bool = False) -> None:
        super().__init__(f"table {table}, row {key!r}: {problem}")
        self.unknown = unknown


class _Bad(Exception):
    """One value of a row that cannot be read; `UnreadableRow` once the row is known."""

    def __init__(self, problem: str, *, unknown: bool = False) -> None:
        super().__init__(problem)
        self.unknown = unknown


def read_state(db: sqlite3.Connection) -> StoredState:
    """Everything the connection's database (at the current schema) holds for a data manager to serve; raises
    UnreadableRow for the first row it cannot read."""
    datasets = _rows(db, "datasets", f"SELECT {_DATASET_COLUMNS} FROM datasets ORDER BY uri", _dataset)
    jobs = _rows(db, "jobs", f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY job_id", _job)
    nodes = _rows(db, "nodes", f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY node_id", _node)
    histories = _rows(db, "job_histories", "SELECT job_id, history FROM job_histories ORDER BY job_id", _history)
    tenants = _rows(db, "tenants", f"SELECT {_TENANT_COLUMNS} FROM tenants ORDER BY name", _tenant)
    row = db.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()
    revision = 0 if row is None else row[0]
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        raise UnreadableRow("meta", "revision", f"the revision is {revision!r}, not a number of revisions")
    _check_references(jobs, datasets, nodes, tenants)
    return StoredState(revision, datasets, jobs, nodes, histories, tenants)


def _check_references(
    jobs: Iterable[Job], datasets: Iterable[Dataset], nodes: Iterable[Node], tenants: Iterable[Tenant]
) -> None:
    """Raise UnreadableRow for the first job that names a dataset, tenant or node the state does not hold: the data
    manager never writes one (unregistering what a job uses is refused), so a disk changed it."""
    registered = {
        "datasets": {d.uri for d in datasets},
        "nodes": {n.node_id for n in nodes},
        "tenants": {t.name for t in tenants},
    }
    for job in jobs:
        named = [("datasets", "dataset", job.dataset_uri), *(("nodes", "node", w.node_id) for w in job.workers)]
        if job.tenant:
            named.append(("tenants", "tenant", job.tenant))
        for table, what, key in named:
            if key not in registered[table]:
                raise UnreadableRow(
                    "jobs", job.job_id, f"its {what} {key!r} is not registered (table {table} has no such row)"
                )


def _rows(db: sqlite3.Connection, table: str, query: str, entity: Callable[[tuple[Any, ...]], T]) -> tuple[T, ...]:
    read = []
    for row in db.execute(query):
        try:
            read.append(entity(row))
        except _Bad as bad:
            raise UnreadableRow(table, row[0], str(bad), unknown=bad.unknown) from None
    return tuple(read)


def _dataset(row: tuple[Any, ...]) -> Dataset:
    uri, options, size, files, items, chunk, digest, quota = row
    options = _json_object(options, "options")
    for key, value in options.items():
        _text(value, f"option {key!r}")
    return Dataset(
        _text(uri, "uri"),
        options,
        _integer(size, "size_bytes"),
        _integer(files, "file_count"),
        _integer(items, "item_count"),
        _whole(check_chunk_size, chunk, "chunk_size_bytes"),
        _text(digest, "manifest_digest"),
        _whole(check_bytes, quota, "cache_quota_bytes"),
    )


def _job(row: tuple[Any, ...]) -> Job:
    """A job as `_job_row` wrote it, in `_JOB_COLUMNS` order."""
    job_id, uri, ideal, workers, rate, epochs, irregular, gpus, job_class, grace_seconds, tenant, priority = row
    placement = _json(workers, "workers")
    if not isinstance(placement, list) or not all(isinstance(w, list) and len(w) == 2 for w in placement):
        raise _Bad(f"column workers holds {workers!r}, not a list of [node, count] pairs")
    return Job(
        _id(job_id, "job_id"),
        _text(uri, "dataset_uri"),
        _whole(partial(check_rate, positive=True), ideal, "ideal_bytes_per_sec"),
        tuple(_worker(i, node, count) for i, (node, count) in enumerate(placement)),
        _whole(check_rate, rate, "io_bytes_per_sec"),
        epochs=_valid(check_epochs, _number(epochs, "epochs"), "epochs"),
        irregular=bool(_integer(irregular, "irregular")),
        gpus=_whole(partial(check_gpus, allow_zero=True), gpus, "gpus"),
        job_class=_known(_text(job_class, "job_class"), JOB_CLASSES, "job class"),
        grace_seconds=_valid(check_grace_seconds, _number(grace_seconds, "grace_seconds"), "grace_seconds"),
        tenant=_text(tenant, "tenant"),
        priority=_known(_text(priority, "priority"), PRIORITIES, "priority"),
    )


def _worker(index: int, node: object, count: object) -> Worker:
    """The `index`th of a job's workers, named as the API names them (`workers[0].count`)."""
    field = f"workers[{index}]"
    return Worker(
        _id(node, f"{field}.node_id"),
        _whole(check_worker_count, count, f"{field}.count"),
    )


def _node(row: tuple[Any, ...]) -> Node:
    node_id, address, capacity, gpus = row
    return Node(
        _id(node_id, "node_id"),
        _valid(check_address, _text(address, "address"), "address"),
        _whole(check_bytes, capacity, "cache_capacity_bytes"),
        _whole(partial(check_gpus, allow_zero=True), gpus, "gpus"),
    )


def _tenant(row: tuple[Any, ...]) -> Tenant:
    name, cells, cache_bytes, io_bytes_per_sec = row
    levels = _json_object(cells, "cells")
    counts = {level: _integer(count, f"cells of level {level!r}") for level, count in levels.items()}
    return Tenant(
        _id(name, "name"),
        _valid(check_cells, counts, "cells"),
        _whole(check_bytes, cache_bytes, "cache_bytes"),
        _whole(check_rate, io_bytes_per_sec, "io_bytes_per_sec"),
    )


# JobHistory's fields, each with what its JSON value may be (`_history_json` writes those not at their default).
_OPTIONAL_TIME = (int, float, type(None))
_HISTORY_FIELDS: dict[str, tuple[type, ...]] = {
    "job_id": (str,),
    "submit_time": (int, float),
    "first_start_time": _OPTIONAL_TIME,
    "last_start_time": _OPTIONAL_TIME,
    "pending_since": _OPTIONAL_TIME,
    "queued_seconds_before": (int, float),
    "attained_gpu_seconds_before": (int, float),
    "preemptions": (int,),
    "policy_state": (dict,),
    "policy_state_by": (str,),
    "held": (dict,),
    "suspended_until": _OPTIONAL_TIME,
    "bytes_read_before": (int,),
}
_REQUIRED_HISTORY_FIELDS = {f.name for f in fields(JobHistory) if f.default is MISSING and f.default_factory is MISSING}
assert _HISTORY_FIELDS.keys() == {f.name for f in fields(JobHistory)}, "a JobHistory field without its JSON type"


def _history(row: tuple[Any, ...]) -> JobHistory:
    """A job's history as `_history_json` wrote it. A field it lacks reads as its default (one written at its
    default, or before the field was added); a field this silod does not know is refused, not dropped: a newer
    silod wrote it, and reading on without it would misschedule the job and write the history back without it."""
    job_id, text = row
    values = _json_object(text, "history")
    unknown = sorted(values.keys() - _HISTORY_FIELDS.keys())
    if unknown:
        raise _Bad(f"its history has the field {unknown[0]!r}, which this silod does not know", unknown=True)
    missing = sorted(_REQUIRED_HISTORY_FIELDS - values.keys())
    if missing:
        raise _Bad(f"its history lacks the field {missing[0]!r}")
    for name, value in values.items():
        kinds = _HISTORY_FIELDS[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise _Bad(f"its history's field {name!r} holds {value!r}")
    if values["job_id"] != job_id:
        raise _Bad(f"its history is of job {values['job_id']!r}")
    for key, value in values.get("policy_state", {}).items():
        _number(value, f"its policy state {key!r}")
    for node, count in values.get("held", {}).items():
        _integer(count, f"the GPUs it holds on {node!r}")
    if values.get("bytes_read_before", 0) < 0:
        raise _Bad(f"its history's field 'bytes_read_before' holds {values['bytes_read_before']!r}")
    return JobHistory(**values)


def _json(text: object, column: str) -> Any:
    if not isinstance(text, str):
        raise _Bad(f"column {column} holds {text!r}, not JSON text")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _Bad(f"column {column} is not valid JSON ({exc})") from None


def _json_object(text: object, column: str) -> dict[str, Any]:
    value = _json(text, column)
    if not isinstance(value, dict):
        raise _Bad(f"column {column} holds {text!r}, not a JSON object")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{what} is {value!r}, not text")
    return value


def _integer(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"{what} is {value!r}, not a whole number")
    return value


def _number(value: object, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _Bad(f"{what} is {value!r}, not a number")
    return float(value)


def _valid(check: Callable[[str, V], object], value: V, field: str) -> V:
    """`value` of `field` if the API's own check of it (`datamgr.validation`) takes it: the data manager writes no
    other, and serving one it would refuse broke calls (a worker count of 0 divided by zero)."""
    try:
        check(field, value)
    except InvalidArgument as exc:
        raise _Bad(str(exc)) from None
    return value


def _id(value: object, field: str) -> str:
    """The id `value` of `field` (a job, node or tenant), if the API's rule for ids takes it (`_valid`)."""
    return _valid(check_id, _text(value, field), field)


def _whole(check: Callable[[str, int], object], value: object, field: str) -> int:
    """The whole number `value` of `field`, if the API's own check of it takes it (`_valid`)."""
    return _valid(check, _integer(value, field), field)


def _known(value: str, known: Sequence[str], what: str) -> str:
    if value not in known:
        raise _Bad(f"its {what} {value!r} is none this silod knows ({', '.join(known)})", unknown=True)
    return value


def write_change(db: sqlite3.Connection, change: Change) -> None:
    """Write `change` in the connection's open transaction."""
    statements: list[tuple[str, Sequence[tuple[object, ...]]]] = [
        ("DELETE FROM jobs WHERE job_id = ?", [(j,) for j in change.jobs_deleted]),
        ("DELETE FROM datasets WHERE uri = ?", [(u,) for u in change.datasets_deleted]),
        ("DELETE FROM manifests WHERE uri = ?", [(u,) for u in change.datasets_deleted]),
        ("DELETE FROM nodes WHERE node_id = ?", [(n,) for n in change.nodes_deleted]),
        ("DELETE FROM job_histories WHERE job_id = ?", [(j,) for j in change.histories_deleted]),
        ("DELETE FROM tenants WHERE name = ?", [(t,) for t in change.tenants_deleted]),
        (
            f"INSERT OR REPLACE INTO datasets ({_DATASET_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [_dataset_row(d) for d in change.datasets_put],
        ),
        ("INSERT OR REPLACE INTO manifests VALUES (?, ?)", [change.manifest] if change.manifest else []),
        (
            f"INSERT OR REPLACE INTO jobs ({_JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_job_row(j) for j in change.jobs_put],
        ),
        (
            f"INSERT OR REPLACE INTO nodes ({_NODE_COLUMNS}) VALUES (?, ?, ?, ?)",
            [(n.node_id, n.address, n.cache_capacity_bytes, n.gpus) for n in change.nodes_put],
        ),
        (
            "INSERT OR REPLACE INTO job_histories VALUES (?, ?)",
            [(h.job_id, _history_json(h)) for h in change.histories_put],
        ),
        (
            f"INSERT OR REPLACE INTO tenants ({_TENANT_COLUMNS}) VALUES (?, ?, ?, ?)",
            [_tenant_row(t) for t in change.tenants_put],
        ),
    ]
    for sql, rows in statements:
        if rows:
            db.executemany(sql, rows)


def _dataset_row(d: Dataset) -> tuple[object, ...]:
    options = json.dumps(dict(d.options), sort_keys=True)
    return (
        d.uri,
        options,
        d.size_bytes,
        d.file_count,
        d.item_count,
        d.chunk_size_bytes,
        d.manifest_digest,
        d.cache_quota_bytes,
    )


def _job_row(j: Job) -> tuple[object, ...]:
    workers = json.dumps([[w.node_id, w.count] for w in j.workers])
    return (
        j.job_id,
        j.dataset_uri,
        j.ideal_bytes_per_sec,
        workers,
        j.io_bytes_per_sec,
        j.epochs,
        j.irregular,
        j.gpus,
        j.job_class,
        j.grace_seconds,
        j.tenant,
        j.priority,
    )


def _tenant_row(t: Tenant) -> tuple[object, ...]:
    """A tenant's VC as a row: its cells, by level name, as one JSON object (never queried alone)."""
    return (t.name, json.dumps(dict(t.cells), sort_keys=True), t.cache_bytes, t.io_bytes_per_sec)


def _history_json(h: JobHistory) -> str:
    """A job's history as one JSON object: its fields change together, and none is ever queried alone.

    A field that holds its default is left out, as every reader (`_history`, and silods before the row checks,
    `JobHistory(**values)`) reads a missing field as its default: a field added since a silod of the same schema
    (histories gain fields without a new schema version) is then written only by a history that uses it, and that
    silod reads the others (one from before `policy_state_by` failed with a TypeError on every history)."""
    values: dict[str, Any] = {}
    for f in fields(h):
        value = getattr(h, f.name)
        if isinstance(value, Mapping):
            value = dict(value)
        if f.name in _REQUIRED_HISTORY_FIELDS or value != _default(f):
            values[f.name] = value
    return json.dumps(values, sort_keys=True)


def _default(f: Field[Any]) -> Any:
    """The value a field of a dataclass takes when it is not given."""
    return f.default_factory() if f.default_factory is not MISSING else f.default
