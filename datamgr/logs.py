"""Logging for the `silod` commands: the human format, or one JSON object per line (`--log-json`).

An event about a job, dataset or node carries its ids as fields (`extra=silodlib.logfields.log_ids(...)`:
`job_id`, `dataset_uri`, `node_id`), which the JSON format shows next to the message; every line of a node agent
carries its `node_id` (`silodlib.logfields.set_process_ids`).

No secret reaches the log at any level: the handler scrubs every record (`ScrubSecrets`, `silodlib.scrub`)
before it is written, so the SDKs' DEBUG dumps of requests and headers are safe to turn on.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from silodlib.logfields import ProcessIds
from silodlib.scrub import scrub

HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries that log every HTTP request (with its headers, scrubbed like every record) at INFO or DEBUG: quiet
# unless the operator asks for DEBUG.
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
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # set, scrubbed, by ScrubSecrets
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class ScrubSecrets(logging.Filter):
    """Rewrites each record so that nothing `silodlib.scrub` knows as secret is written: its message (with its
    arguments merged in), its traceback, its stack and its `extra=` strings. A handler filter, not a logger's,
    because records from every logger (the SDKs' included) pass through the handler and only some through any
    one logger. It never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            scrubbed = scrub(message)
        except Exception:  # a bad format or argument: logging would print both, unscrubbed, as a "Logging error"
            message, scrubbed = "", scrub(f"unformattable log message {record.msg!r} with arguments {record.args!r}")
        if scrubbed != message:
            record.msg, record.args = scrubbed, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _RECORD_ATTRIBUTES and isinstance(value, str):
                setattr(record, key, scrub(value))
        return True


class ClientGoneWrites(logging.Filter):
    """For grpcio's asyncio server's logger (`GRPC_CORE_LOGGER`): its ERROR with a traceback when a server-streaming
    method yields a message to a client that has gone (the connection reset, or dropped by keepalive: a node agent or
    launcher killed or frozen) becomes one INFO line naming the method. Nothing is wrong with the data manager, and
    the stream's end is all there is to it; an operator who saw the traceback looked for a bug."""

    _PREFIX = "ExecuteBatchError raised in core by servicer method "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno != logging.ERROR or not message.startswith(self._PREFIX):
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = "a stream's client went away while a message was being written to it: %s"
        record.args = (message.removeprefix(self._PREFIX),)
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)  # its level was checked as an ERROR's


GRPC_CORE_LOGGER = "grpc._cython.cygrpc"
# The logger of a daemon's fatal error (`log_fatal`): one name for a log pipeline to watch, whichever daemon it is.
FATAL_LOGGER = "silod"


def log_fatal(line: str) -> None:
    """Write `line`, why a daemon (`silod datamgr serve`, `silod node`, `silod mount`) cannot start or serve on,
    as its log is written: with `--log-json`, one CRITICAL record of FATAL_LOGGER whose `msg` is the line, since
    a log pipeline that parses JSON lines would skip a text line, and this is the one it most needs; else the line
    itself on stderr, as every command's refusals are written."""
    if _logs_json_lines():
        logging.getLogger(FATAL_LOGGER).critical("%s", line)
    else:
        print(line, file=sys.stderr)


def _logs_json_lines() -> bool:
    """Whether this process logs JSON lines (`setup_logging` with `json_lines`)."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)


def setup_logging(level: str, *, json_lines: bool = False, stream: TextIO | None = None) -> None:
    """Log at `level` to `stream` (stderr), secrets scrubbed and the process's ids (`ProcessIds`: a node agent's
    node id) on every line, unless logging is already set up; keep NOISY_LOGGERS at WARNING below DEBUG."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(HUMAN_FORMAT))
    handler.addFilter(ProcessIds())
    handler.addFilter(ScrubSecrets())
    logging.basicConfig(level=level, handlers=[handler])
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)
