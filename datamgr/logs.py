"""Logging for the `silod` commands: the human format, or one JSON object per line (`--log-json`).

An event about a job, dataset or node carries its ids as fields (`extra=silodlib.logfields.log_ids(...)`:
`job_id`, `dataset_uri`, `node_id`), which the JSON format shows next to the message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries that log every HTTP request (with its headers) at INFO: quiet unless the operator asks for DEBUG.
NOISY_LOGGERS = ("azure", "botocore", "urllib3")
# What every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`ts` (ISO 8601, UTC), `level`, `logger`, `msg`, the `extra=` fields, and `exc` for an exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES:
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str, *, json_lines: bool = False, stream: TextIO | None = None) -> None:
    """Log at `level` to `stream` (stderr) unless logging is already set up; keep NOISY_LOGGERS at WARNING
    below DEBUG."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(HUMAN_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)
