"""`silod status --watch`: frames until Ctrl-C (exit 0), each one showing what changed since the last, and the
data manager being unreachable shown rather than ending the watch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from tests.datamgr_fixtures import SILOD, RunningDataManager
from tests.test_logs import read_lines

HEADER = "Every 0.5s: silod status"


@contextmanager
def watching(address: str, *args: str) -> Iterator[tuple[IO[bytes], subprocess.Popen[bytes]]]:
    """`silod status --watch 0.5 ARGS` with stdout a pipe (not a TTY); ended with SIGINT, as Ctrl-C would."""
    env = {**os.environ, "SILOD_DATAMGR": address}
    process = subprocess.Popen(
        [*SILOD, "status", "--watch", "0.5", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        assert process.stdout is not None
        yield process.stdout, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.wait(timeout=15)


def interrupt(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=15) == 0
    assert process.stderr is not None
    assert "Traceback" not in process.stderr.read().decode()


def test_each_frame_shows_the_current_tables(datamgr: RunningDataManager) -> None:
    with watching(datamgr.address) as (stdout, process):
        read_lines(stdout, HEADER)
        datamgr.client.register_node("n-watched", "h:1", 2**30)
        first = read_lines(stdout, HEADER)  # the rest of frame 1, then the header of frame 2
        second = read_lines(stdout, HEADER)
        interrupt(process)
    assert "0 nodes" in "".join(first) and "n-watched" not in "".join(first)
    assert first[-2] == "\n", "frames are separated by a blank line"
    assert "1 nodes (1 available)" in "".join(second) and "n-watched" in "".join(second)
    assert "\033[" not in "".join(first + second), "no screen clearing when stdout is not a terminal"


def test_json_watch_prints_one_document_per_line(datamgr: RunningDataManager) -> None:
    with watching(datamgr.address, "--json") as (stdout, process):
        first = json.loads(read_lines(stdout, "\n")[-1])
        datamgr.client.register_node("n-watched", "h:1", 2**30)
        second = json.loads(read_lines(stdout, "\n")[-1])
        interrupt(process)
    assert first["nodes"] == [] and [n["node_id"] for n in second["nodes"]] == ["n-watched"]


def test_an_unreachable_data_manager_does_not_end_the_watch() -> None:
    with watching("127.0.0.1:1", "--json") as (stdout, process):
        errors = [json.loads(read_lines(stdout, "\n")[-1]) for _ in range(2)]
        interrupt(process)
    for error in errors:
        assert "cannot reach the data manager at 127.0.0.1:1" in error["error"] and error["time"]
