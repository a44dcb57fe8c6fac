"""Real disks a test can fill up or pull away: tmpfs file systems mounted for the test and unmounted after it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.storage_servers import missing_dependency

TmpfsFactory = Callable[[Path, str], Path]


@pytest.fixture
def tmpfs() -> Iterator[TmpfsFactory]:
    """`mount(path, size)` puts a tmpfs of `size` (mount's syntax: "512k", "16m") at `path` and returns it.

    Ask for this fixture before daemons that use the disk (`mount_factory`, a data manager), so that its
    teardown, which unmounts (lazily if the disk is still busy), runs after theirs.
    """
    if os.geteuid() != 0:
        missing_dependency("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        command = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            missing_dependency(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        if os.path.ismount(path) and subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)
