"""Command-line start-up benchmark: what a `silod` command costs before and around its own work.

Every `silod` command builds the whole command line, and what it loads to do so is paid by each call an
operator, a script or a launcher makes (the suite alone starts `silod` about 300 times). This runs each
command below `--runs` times as a fresh process and prints the median wall time and CPU time of one call,
and both as a multiple of the interpreter's own start (`python -c pass`), the floor no command gets under:

- `silod --help`: building the command line and nothing else;
- `silod status` against a live data manager (started here, empty): a client command, gRPC included;
- `silod umount` of a directory that is no mount: the FUSE client's code, refused at once;
- `silod sim generate --jobs 1`: the simulator's trace generator.

    PYTHONPATH=. .venv/bin/python bench/cli_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from silodcli.tables import render_table
from tests.datamgr_fixtures import SILOD, DataManagerProcess


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(command: Sequence[str], runs: int, env: dict[str, str]) -> tuple[float, float, set[int]]:
    """The median wall and CPU seconds of one run of `command`, and the exit codes it gave."""
    walls: list[float] = []
    cpus: list[float] = []
    codes: set[int] = set()
    for _ in range(runs):
        cpu, wall = child_cpu_seconds(), time.perf_counter()
        result = subprocess.run(command, capture_output=True, env=env, timeout=120)
        walls.append(time.perf_counter() - wall)
        cpus.append(child_cpu_seconds() - cpu)
        codes.add(result.returncode)
    return statistics.median(walls), statistics.median(cpus), codes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (default %(default)s)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, not {args.runs}")
    with tempfile.TemporaryDirectory(prefix="silod-bench-") as tmp:
        root = Path(tmp)
        server = DataManagerProcess(root / "state", root / "datamgr.log").start()
        try:
            env = {**os.environ, "SILOD_DATAMGR": server.address}
            (root / "not-a-mount").mkdir()
            commands: list[tuple[str, list[str], int]] = [  # label, command line, the exit code it should give
                ("python -c pass", [sys.executable, "-c", "pass"], 0),
                ("silod --help", [*SILOD, "--help"], 0),
                ("silod status", [*SILOD, "status"], 0),
                ("silod umount (no mount)", [*SILOD, "umount", str(root / "not-a-mount")], 1),
                ("silod sim generate --jobs 1", [*SILOD, "sim", "generate", "--jobs", "1", "--out", f"{tmp}/t.csv"], 0),
            ]
            rows: list[list[object]] = []
            floor_wall = 0.0  # the first command's: the interpreter alone
            for label, command, expected in commands:
                print(f"timing {label} ({args.runs} runs)", file=sys.stderr, flush=True)
                wall, cpu, codes = time_command(command, args.runs, env)
                if codes != {expected}:
                    print(f"{label} exited with {sorted(codes)}, not {expected}", file=sys.stderr)
                    return 1
                floor_wall = floor_wall or wall
                rows.append([label, f"{wall * 1000:.0f}", f"{cpu * 1000:.0f}", f"{wall / floor_wall:.1f}x"])
        finally:
            server.stop()
    print(render_table(["COMMAND", "WALL MS", "CPU MS", "WALL / PYTHON"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
