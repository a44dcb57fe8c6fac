"""The storage servers the suite (and `make bench`) start: each dies with the process that started it, even one
killed without running its finalizers, and keeps to the CPUs it is given; started without a `preexec_fn`, so
that no Python runs in a child forked while an in-process data manager's gRPC threads are busy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from datamgr.devservers import dying_with_parent
from tests import polling

STARTER = (
    "import subprocess, sys, time; from datamgr.devservers import dying_with_parent; "
    "server = subprocess.Popen(dying_with_parent(['sleep', '600'], {0})); "
    "print(server.pid, flush=True); time.sleep(600)"
)


def _command_line(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline") as cmdline:
        return cmdline.read().split("\x00")[:-1]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_dies_with_the_process_that_started_it_and_keeps_to_its_cpus() -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER], stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    assert starter.stdout is not None
    server = int(starter.stdout.readline())
    try:
        polling.eventually(lambda: _command_line(server) == ["sleep", "600"], what="the server's exec")
        assert os.sched_getaffinity(server) == {0}
    finally:
        starter.send_signal(signal.SIGKILL)  # no finalizer runs
        starter.wait()
    polling.eventually(lambda: not _alive(server), what="the server gone with its parent", timeout=10)


def test_the_server_is_started_through_setpriv_and_taskset_not_a_preexec_fn() -> None:
    assert dying_with_parent(["srv", "-p", "1"], {2, 0}) == [
        "setpriv", "--pdeathsig", "TERM", "taskset", "--cpu-list", "0,2", "srv", "-p", "1",
    ]  # fmt: skip
    assert dying_with_parent(["srv"]) == ["setpriv", "--pdeathsig", "TERM", "srv"]
