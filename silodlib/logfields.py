"""The ids a log line is about, as structured fields: `job_id`, `dataset_uri` and `node_id`.

One spelling for both daemons, so that JSON logs (`--log-json`, `datamgr.logs.JsonFormatter`) can be filtered by
job, dataset or node whichever component wrote the line. The human format shows only the message, so messages
keep naming the ids too.
"""

from __future__ import annotations


def log_ids(*, job_id: str | None = None, dataset_uri: str | None = None, node_id: str | None = None) -> dict[str, str]:
    """The given ids as the `extra=` of a logging call; an id left None is not a field."""
    ids = {"job_id": job_id, "dataset_uri": dataset_uri, "node_id": node_id}
    return {name: value for name, value in ids.items() if value is not None}
