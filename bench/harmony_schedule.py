"""Harmony benchmark: how long one run of Algorithm 1 takes as the cluster grows, and a whole `harmony-80` run.

Harmony's paper (its section V-F) reports 1.2 s on average per scheduling decision for 80 jobs on 100 machines
and 8K jobs on 10K machines "within 5 seconds". silod's Algorithm 1 evaluates every prefix of the candidates and
keeps the fewest jobs within 5 % of the best (docs/harmony.md), so one call grows faster than linearly with the
jobs; this prints where it stands. Jobs are `harmony-80`'s profiles repeated and shuffled (seeded). Then it
times `silod sim`'s co-location runs of `harmony-80` per policy, files included. CPU seconds of this process;
no goal is set, so it never fails on time. Progress goes to stderr, the tables to stdout.

    PYTHONPATH=. .venv/bin/python bench/harmony_schedule.py [--sizes 80:100,200:250,400:500]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from datamgr.scheduler import harmony
from datamgr.scheduler.registry import COLOCATION_POLICIES
from datamgr.scheduler.sim.harmony_workload import HarmonyWorkloadConfig, generate_harmony_workload
from datamgr.scheduler.sim.scenarios import load_colocation_scenario
from silodcli.sim_colocation import ColocationInputs, simulate_colocation_into
from silodcli.tables import render_table


def _sizes(text: str) -> list[tuple[int, int]]:
    pairs = []
    for part in text.split(","):
        jobs, _, machines = part.partition(":")
        pairs.append((int(jobs), int(machines)))
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_sizes, default=_sizes("80:100,200:250,400:500"), metavar="JOBS:MACHINES,..")
    args = parser.parse_args()

    profiles = [job.profile for job in generate_harmony_workload(HarmonyWorkloadConfig(seed=1))]
    rows = []
    for jobs, machines in args.sizes:
        print(f"Algorithm 1 on {jobs} jobs and {machines} machines", file=sys.stderr, flush=True)
        candidates = [replace(profiles[i % len(profiles)], job_id=f"j{i}") for i in range(jobs)]
        random.Random(jobs).shuffle(candidates)
        cpu_started = time.process_time()
        chosen = harmony.schedule(candidates, machines)
        cpu_seconds = time.process_time() - cpu_started
        rows.append((str(jobs), str(machines), f"{cpu_seconds:.2f}", str(len(chosen.job_ids)), str(len(chosen.groups))))
    print(render_table(("JOBS", "MACHINES", "CPU S", "JOBS RUN", "GROUPS"), rows))
    print("the paper: 1.2 s on average for 80 jobs on 100 machines, under 5 s for 8K jobs on 10K machines\n")

    scenario = load_colocation_scenario("harmony-80")
    inputs = ColocationInputs(scenario.name, scenario.cluster, scenario.trace)
    runs = []
    for policy in COLOCATION_POLICIES:
        print(f"harmony-80 under {policy}", file=sys.stderr, flush=True)
        started, cpu_started = time.perf_counter(), time.process_time()
        with tempfile.TemporaryDirectory() as out:
            run = simulate_colocation_into(inputs, policy, Path(out), show_progress=False)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        runs.append((policy, str(run.result.rounds), f"{seconds:.1f}", f"{cpu_seconds:.1f}"))
    print(render_table(("POLICY", "ROUNDS", "WALL S", "CPU S"), runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
