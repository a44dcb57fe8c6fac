"""`silod demo`, what `make run` runs: it completes and shows the allocations reaching the node and
surviving a restart."""

from __future__ import annotations

import re

from tests.datamgr_fixtures import silod_cli


def test_demo_allocates_pushes_and_survives_a_restart() -> None:
    result = silod_cli("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[watch node-1]" in out and "snapshot" in out
    assert re.search(r"\[watch node-1\] r\d+ job effnetb1 rate [1-9]", out), out
    restart = re.search(r"revision after restart: (\d+) \(was (\d+) before\)", out)
    assert restart is not None and restart.group(1) == restart.group(2), out
    assert "2 datasets, 2 jobs, 1 nodes (1 available)" in out
    assert "WARNING" not in result.stderr and "Traceback" not in result.stderr
