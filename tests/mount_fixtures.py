"""A real `silod mount --foreground` process for tests, and helpers to drive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import polling
from tests.datamgr_fixtures import SILOD

START_TIMEOUT = 60.0


class MountProcess:
    """`silod mount` (or, with `node()`, `silod node`) in the foreground under `root`; `start()` returns once
    the mount is live."""

    def __init__(
        self,
        root: Path,
        jobs: dict[str, str],
        *extra: str,
        stats_interval: float | None = 0.2,
        launcher: Sequence[str] = (),
    ) -> None:
        self.mountpoint = root / "mnt"
        self.cache_dir = root / "cache"
        self.log_path = root / "mount.log"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        job_args = [a for job_id, uri in jobs.items() for a in ("--job", f"{job_id}={uri}")]
        stats = () if stats_interval is None else ("--stats-interval", str(stats_interval))  # None: writes none
        self.argv = [
            *launcher, *SILOD, "mount", str(self.mountpoint), "--cache-dir", str(self.cache_dir), "--foreground",
            *stats, *job_args, *extra,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def node(cls, root: Path, datamgr: str, node_id: str, *extra: str) -> MountProcess:
        """A node agent following the data manager at `datamgr`, reporting every half second."""
        agent = cls(root, {})
        agent.argv = [
            *SILOD, "node", "--datamgr", datamgr, "--node-id", node_id, "--mountpoint", str(agent.mountpoint),
            "--cache-dir", str(agent.cache_dir), "--foreground", "--report-interval", "0.5",
            "--stats-interval", "0.1", *extra,
        ]  # fmt: skip
        return agent

    def start(self) -> MountProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=log)
        process = self.process

        def live() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the mount exited before it came up:\n{self.log_path.read_text()}")
            return is_live_mount(self.mountpoint)

        polling.eventually(live, what=lambda: f"the mount up:\n{self.log_path.read_text()}", timeout=START_TIMEOUT)
        return self

    def job_dir(self, job_id: str) -> Path:
        return self.mountpoint / job_id

    def log_lines(self, containing: str) -> list[str]:
        """The lines of the daemon's log that contain `containing`, oldest first."""
        return [line for line in self.log_path.read_text().splitlines() if containing in line]

    def stats(self) -> dict[str, Any]:
        """The daemon's latest statistics (written every stats interval)."""
        data: dict[str, Any] = json.loads((self.cache_dir / "stats.json").read_text())
        return data

    def wait_for_stats(self, predicate: Any, timeout: float = 30.0) -> dict[str, Any]:
        """The first statistics `predicate` accepts (a stats file not written yet, or half written, is "not yet")."""

        def matching() -> dict[str, Any] | None:
            stats = self.stats()
            return stats if predicate(stats) else None

        result: dict[str, Any] = polling.eventually(
            matching,
            what=lambda: f"statistics matching; last log:\n{self.log_path.read_text()[-3000:]}",
            timeout=timeout,
            interval=0.1,
            ignore=lambda exc: isinstance(exc, (FileNotFoundError, json.JSONDecodeError)),
        )
        return result

    def kill(self) -> None:
        """SIGKILL, leaving the mount dead as a crash would: the next daemon must cope with it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """Unmount with `silod umount`, falling back to a lazy fusermount3, and reap the process."""
        if self.process is None:
            return
        if self.process.poll() is not None:  # killed: a dead mount may be left behind
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False)
        elif os.path.ismount(self.mountpoint):
            result = subprocess.run([*SILOD, "umount", str(self.mountpoint)], capture_output=True, check=False)
            if result.returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def is_live_mount(path: Path) -> bool:
    """Mounted and answering: a dead FUSE mount (its daemon killed) still looks mounted to `ismount`."""
    try:
        return os.path.ismount(path) and os.listdir(path) is not None
    except OSError:
        return False


MountFactory = Callable[..., MountProcess]


@pytest.fixture
def mount_factory(tmp_path: Path) -> Iterator[MountFactory]:
    """`start(jobs, *extra_args, name=...)` -> a live MountProcess, stopped at teardown."""
    started: list[MountProcess] = []

    def start(
        jobs: dict[str, str],
        *extra: str,
        name: str = "m",
        stats_interval: float | None = 0.2,
        launcher: Sequence[str] = (),
    ) -> MountProcess:
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        mount = MountProcess(root, jobs, *extra, stats_interval=stats_interval, launcher=launcher)
        started.append(mount)
        return mount.start()

    yield start
    for mount in started:
        mount.stop()


def options_args(options: dict[str, str]) -> Sequence[str]:
    return [a for key, value in options.items() for a in ("--option", f"{key}={value}")]
