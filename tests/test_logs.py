"""`--log-json`: one JSON object per line with ts, level, logger, msg, the `extra=` fields and `exc`; and the
chatty HTTP libraries kept at WARNING unless DEBUG."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from datamgr.client import DataManagerClient
from datamgr.embedded import EmbeddedDataManager
from datamgr.entities import Job, Worker
from datamgr.journal import JournalEntry, log_fields
from datamgr.logs import GRPC_CORE_LOGGER, NOISY_LOGGERS, JsonFormatter, setup_logging
from datamgr.server import ServerConfig
from datamgr.state import Change
from tests.datamgr_fixtures import SILOD
from tests.polling import read_lines


def test_the_data_manager_logs_json_lines(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [*SILOD, "--log-json", "datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")],
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        lines = read_lines(process.stderr, "listening on")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    entries = [json.loads(line) for line in lines]
    for entry in entries:
        assert {"ts", "level", "logger", "msg"} <= entry.keys()
        assert datetime.fromisoformat(entry["ts"]).utcoffset() is not None
    assert entries[-1]["level"] == "INFO" and "data manager listening on 127.0.0.1:" in entries[-1]["msg"]


def format_one(log: logging.Logger, emit: str) -> dict[str, object]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    try:
        if emit == "extra":
            log.warning("job %s slow", "j1", extra={"job_id": "j1", "dataset_uri": "s3://b/p", "node_id": "n1"})
        else:
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                log.exception("failed")
    finally:
        log.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    entry: dict[str, object] = json.loads(line)
    return entry


@pytest.mark.expected_warnings
def test_extra_fields_and_exceptions_are_fields() -> None:
    log = logging.getLogger("silod.test.logs")
    entry = format_one(log, "extra")
    assert entry["msg"] == "job j1 slow" and entry["level"] == "WARNING" and entry["logger"] == "silod.test.logs"
    assert (entry["job_id"], entry["dataset_uri"], entry["node_id"]) == ("j1", "s3://b/p", "n1")
    assert "exc" not in entry and str(entry["ts"]).endswith("Z")
    failure = format_one(log, "exception")
    assert failure["msg"] == "failed" and "RuntimeError: boom" in str(failure["exc"])


@pytest.fixture
def noisy_levels() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("noisy_levels")
def test_http_libraries_stay_at_warning_unless_debug() -> None:
    setup_logging("INFO")
    for name in NOISY_LOGGERS:
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
    assert not logging.getLogger("azure.core.pipeline.policies.http_logging_policy").isEnabledFor(logging.INFO)
    setup_logging("DEBUG")
    assert logging.getLogger("azure").level == logging.NOTSET


def test_state_changes_are_logged_with_their_ids_as_fields(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [*SILOD, "--log-json", "datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")],
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        listening = json.loads(read_lines(process.stderr, "listening on")[-1])
        address = listening["msg"].split("listening on ")[1].split(" ")[0]
        with DataManagerClient(address) as client:
            client.register_node("n1", "h:1", 1000)
        lines = read_lines(process.stderr, "registered node n1")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    entry = json.loads(lines[-1])
    assert entry["node_id"] == "n1" and entry["revision"] == 1


def test_a_change_that_touches_several_ids_logs_them_as_a_list() -> None:
    jobs = tuple(Job(job_id, "file:///data/a,b", 1000, (Worker("n1", 1),)) for job_id in ("j1", "j2"))
    entry = JournalEntry(7, Change(jobs_put=jobs), Change(), {}, "placed jobs j1, j2")
    assert log_fields(entry) == {"revision": 7, "job_id": ["j1", "j2"]}
    one = JournalEntry(8, Change(datasets_deleted=("file:///data/a,b",)), Change(), {}, "unregistered")
    assert log_fields(one) == {"revision": 8, "dataset_uri": "file:///data/a,b"}


@pytest.mark.expected_warnings  # the ERROR that is not grpcio's write to a client gone stays one
def test_grpcios_error_for_a_message_written_to_a_client_gone_is_one_info_line_record_as_grpcio_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A launcher or node agent frozen until keepalive dropped it made the data manager log `ERROR
    grpc._cython.cygrpc: ExecuteBatchError raised in core by servicer method [/silod.v1.DataManager/WatchDecisions]`
    and a traceback. The record is made here as grpcio makes it (`_LOGGER.exception`), with a running data manager's
    filter: grpcio raises it only for a peer gone mid-write, which a test cannot time."""
    caplog.set_level(logging.INFO)
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", 10**9, 30.0)
    with EmbeddedDataManager(config):
        core = logging.getLogger(GRPC_CORE_LOGGER)
        for method in ("/silod.v1.DataManager/WatchDecisions", "/silod.v1.DataManager/WatchAllocations"):
            try:
                raise RuntimeError('Failed "execute_batch": (<SendMessageOperation>,)')
            except RuntimeError:
                core.exception("ExecuteBatchError raised in core by servicer method [%s]", method)
        try:
            raise RuntimeError("a servicer's own bug")
        except RuntimeError:
            core.exception("Unexpected [RuntimeError] raised by servicer method [/silod.v1.DataManager/GetJob]")
    records = [(r.levelname, r.getMessage(), r.exc_info is None) for r in caplog.records if r.name == GRPC_CORE_LOGGER]
    gone = "a stream's client went away while a message was being written to it"
    assert records == [
        ("INFO", f"{gone}: [/silod.v1.DataManager/WatchDecisions]", True),
        ("INFO", f"{gone}: [/silod.v1.DataManager/WatchAllocations]", True),
        ("ERROR", "Unexpected [RuntimeError] raised by servicer method [/silod.v1.DataManager/GetJob]", False),
    ]


def json_records(stderr: str) -> list[dict[str, object]]:
    """Every line of `stderr` as a JSON log record: a line that is not one fails the test."""
    records = [json.loads(line) for line in stderr.splitlines()]
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= record.keys(), record
    return records


@pytest.mark.parametrize(
    ("flags", "env"), [(["--log-json"], {}), ([], {"SILOD_LOG_JSON": "1"})], ids=["flag", "variable"]
)
def test_a_data_manager_logging_json_writes_why_it_cannot_start_as_a_critical_record(
    tmp_path: Path, flags: list[str], env: dict[str, str]
) -> None:
    # The one line that said why it stopped was plain text ("silod: --metrics-port ...") among the JSON ones.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        serve = ["datamgr", "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
        result = subprocess.run(
            [*SILOD, *flags, *serve, "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=60,
        )
    assert result.returncode == 2
    *_, last = json_records(result.stderr)
    busy = "the port is in use (another program, or another silod daemon, listens there)"
    assert last["msg"] == f"silod: --metrics-port {port}: cannot serve /metrics on 127.0.0.1: {busy}"
    assert last["level"] == "CRITICAL" and last["logger"] == "silod"


@pytest.mark.parametrize("command", ["mount", "node"])
def test_a_mount_or_node_logging_json_writes_its_refused_arguments_as_a_critical_record(
    tmp_path: Path, command: str
) -> None:
    # A refusal before the daemon starts was the one plain-text line of a daemon told to log JSON.
    mountpoint, cache_dir = tmp_path / "mnt", tmp_path / "mnt" / "cache"
    cache_dir.mkdir(parents=True)
    where = [str(mountpoint)] if command == "mount" else ["--node-id", "n1", "--mountpoint", str(mountpoint)]
    rest = ["--job", f"j=file://{tmp_path}"] if command == "mount" else []
    result = subprocess.run(
        [*SILOD, "--log-json", command, *where, "--cache-dir", str(cache_dir), *rest, "--foreground"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    (record,) = json_records(result.stderr)
    inside = "MOUNTPOINT" if command == "mount" else "--mountpoint"
    hidden = "the mount would hide it; give a directory outside it"
    assert record["msg"] == f"silod {command}: --cache-dir {cache_dir} is inside {inside} {mountpoint}: {hidden}"
    assert record["level"] == "CRITICAL" and record["logger"] == "silod"
