"""`silod status --watch`: frames until Ctrl-C (exit 0), each one showing what changed since the last, redrawn in
place on a terminal and appended to a pipe, and the data manager being unreachable shown rather than ending the
watch."""

from __future__ import annotations

import codecs
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from datamgr.embedded import EmbeddedDataManager
from datamgr.server import ServerConfig
from silodcli.commands import CLEAR_SCREEN
from tests.datamgr_fixtures import REMOTE_IO_LIMIT, SILOD, STILL_ALIVE_SECONDS, RunningDataManager
from tests.polling import read_lines

HEADER = "Every 0.5s: silod status"


def interruptible(command: list[str]) -> list[str]:
    """`command` with Ctrl-C's SIGINT back to its default first. A suite started in the background (`make test
    &`) has SIGINT ignored, the child inherits that, and Python then never raises KeyboardInterrupt. A small
    Python process resets it and execs the command: not a `preexec_fn`, which runs Python in the child between
    fork and exec, where the gRPC threads of the in-process data manager can leave it broken (the child then
    exited at once, now and then)."""
    reset = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", reset, *command]


@contextmanager
def watching(address: str, *args: str) -> Iterator[tuple[IO[bytes], subprocess.Popen[bytes]]]:
    """`silod status --watch 0.5 ARGS` with stdout a pipe (not a TTY); ended with SIGINT, as Ctrl-C would."""
    env = {**os.environ, "SILOD_DATAMGR": address}
    process = subprocess.Popen(
        interruptible([*SILOD, "status", "--watch", "0.5", *args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
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


class Terminal:
    """A pseudo-terminal: a child writes to `slave`, which is a TTY to it; the test reads what it shows."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.output = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)

    def frames(self) -> list[str]:
        """The complete frames shown so far: what each clear-screen is followed by, up to the next one."""
        return self.output.split(CLEAR_SCREEN)[1:-1]

    def wait_for(self, done: Callable[[list[str]], bool], timeout: float = 15.0) -> list[str]:
        """Read the terminal until `done(frames)`, within `timeout`."""
        deadline = time.monotonic() + timeout
        while not done(self.frames()):
            remaining = deadline - time.monotonic()
            ready = remaining > 0 and select.select([self.master], [], [], remaining)[0]
            assert ready, f"not shown within {timeout} s: {self.output!r}"
            self.output += self._decoder.decode(os.read(self.master, 65536))
        return self.frames()


def test_on_a_terminal_each_frame_clears_the_screen_and_shows_the_current_tables(datamgr: RunningDataManager) -> None:
    terminal = Terminal()
    env = {**os.environ, "SILOD_DATAMGR": datamgr.address}
    try:
        process = subprocess.Popen(
            interruptible([*SILOD, "status", "--watch", "0.5"]),
            stdin=subprocess.DEVNULL,
            stdout=terminal.slave,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            (before,) = terminal.wait_for(lambda frames: len(frames) >= 1)
            datamgr.client.register_node("n-watched", "h:1", 2**30)
            frames = terminal.wait_for(lambda frames: "n-watched" in frames[-1] if frames else False)
        finally:
            interrupt(process)
    finally:
        terminal.close()
    assert terminal.output.startswith(CLEAR_SCREEN + HEADER), "the first frame clears the screen too"
    assert "0 nodes" in before and "n-watched" not in before
    assert "1 nodes (1 available)" in frames[-1] and frames[-1].startswith(HEADER)
    assert all(frame.startswith(HEADER) for frame in frames), "every frame is drawn from the top of a clear screen"


def test_json_frames_carry_their_time_and_the_first_after_an_outage_since_when(tmp_path: Path) -> None:
    # A JSON frame said nothing of when it was taken, the error frames gave their time in a format for people, and
    # the first frame after an outage did not say there had been one (the tables say "reachable again").
    config = ServerConfig("127.0.0.1:0", tmp_path / "state", REMOTE_IO_LIMIT, STILL_ALIVE_SECONDS)
    with EmbeddedDataManager(config) as dm:
        address = dm.address  # the port the data manager comes back on, once it is down
    started = datetime.now(UTC).replace(microsecond=0)
    with watching(address, "--json") as (stdout, process):
        down = json.loads(read_lines(stdout, "\n")[-1])
        with EmbeddedDataManager(replace(config, listen=address)):
            back = json.loads(read_lines(stdout, "\n")[-1])
            while "error" in back:  # frames taken before it listened
                back = json.loads(read_lines(stdout, "\n")[-1])
            after = json.loads(read_lines(stdout, "\n")[-1])
        interrupt(process)
    assert "cannot reach the data manager" in down["error"]
    times = [datetime.strptime(frame["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for frame in (down, back)]
    assert started <= times[0] <= times[1] <= datetime.now(UTC)
    assert back["unreachable_since"] == down["time"] and "summary" in back
    assert "unreachable_since" not in after and after["time"] >= back["time"]
