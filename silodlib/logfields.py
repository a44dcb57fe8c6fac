"""The ids a log line is about, as structured fields: `job_id`, `dataset_uri` and `node_id`.

One spelling for both daemons, so that JSON logs (`--log-json`, `datamgr.logs.JsonFormatter`) can be filtered by
job, dataset or node whichever component wrote the line. The human format shows only the message, so messages
keep naming the ids too.

A node agent serves one node for its whole life, so its node id is a field of every line it writes
(`set_process_ids`, `ProcessIds`), not an argument threaded down to every module that logs: the cache, the read
path and the failed-read log wrote lines without it, and a cluster's logs filtered by node missed them.
"""

from __future__ import annotations

import logging

# The ids every line of this process carries (`set_process_ids`): set once, then only read, from any thread.
_process_ids: dict[str, str] = {}


def log_ids(*, job_id: str | None = None, dataset_uri: str | None = None, node_id: str | None = None) -> dict[str, str]:
    """The given ids as the `extra=` of a logging call; an id left None is not a field."""
    ids = {"job_id": job_id, "dataset_uri": dataset_uri, "node_id": node_id}
    return {name: value for name, value in ids.items() if value is not None}


def set_process_ids(*, node_id: str) -> None:
    """Make `node_id` a field of every line this process logs from now on, through a handler that has `ProcessIds`
    (`datamgr.logs.setup_logging` gives its handler one): the node agent's, as it starts. Kept for the rest of the
    process, so that the line saying why the agent stopped carries it too. A standalone mount serves no node and
    sets none."""
    _process_ids.update(log_ids(node_id=node_id))


class ProcessIds(logging.Filter):
    """A handler's filter giving each record the process's ids (`set_process_ids`) that it lacks; one a call gave
    in `extra=` stays. Process-wide rather than a context variable: the node agent logs from trio tasks, from trio's
    worker threads (which copy the context) and from plain threads (the cache's background deletions, the backends'
    read deadlines, the metrics server), which start with an empty context, so a line from one of those would go
    without. A handler's filter, not a logger's, because only the handler sees the records of every logger. It
    never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _process_ids.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
