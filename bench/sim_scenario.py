"""Simulator benchmark: how long a whole scenario takes to simulate and write out, per policy.

Loads a shipped scenario (by default `cluster400`: 400 GPUs, 4 GB/s of remote IO, four weeks of synthetic
arrivals), then for every policy (by default every registered one) on each cache system (by default silod)
times one run as `silod sim` makes it: the simulation, then every file it writes (CSV, JSON, plots; no
decision log) into a temporary directory. It prints a table of the CPU seconds of the simulation and of the
whole run, with the wall clock and what the run amounted to (jobs finished, average JCT, makespan), against
the goal: 20 s for the fastest policies (fifo and greedy, which do no more than place in order and size
storage), 40 s for the others. The goal is judged on this process's CPU time: the run is single-threaded, so
on an idle machine it agrees with the wall clock, and it does not count what other work on a shared machine
takes. Progress goes to stderr, the table to stdout. Exits 1 if a run misses its goal or cannot be built.

    PYTHONPATH=. .venv/bin/python bench/sim_scenario.py [--scenario NAME] [--policies P,..]
        [--cache-systems C,..] [--round SECONDS]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from datamgr.scheduler.registry import UnknownPolicy, available_policies, build_scheduler
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import SimConfig
from datamgr.scheduler.sim.scenarios import available_scenarios, load_scenario
from silodcli.sim import SimInputs, simulate_into
from silodcli.tables import render_table

FASTEST_POLICIES = frozenset({"fifo", "greedy"})
FAST_GOAL_SECONDS = 20.0
GOAL_SECONDS = 40.0


def goal_seconds(policy: str) -> float:
    """The CPU seconds one whole run of `policy` should take at most."""
    return FAST_GOAL_SECONDS if policy in FASTEST_POLICIES else GOAL_SECONDS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="cluster400", choices=available_scenarios())
    parser.add_argument("--policies", default=",".join(available_policies()), help="default: every registered one")
    parser.add_argument("--cache-systems", default="silod")
    parser.add_argument("--round", type=float, default=SimConfig().round_seconds, metavar="SECONDS")
    args = parser.parse_args()

    scenario = load_scenario(args.scenario)
    gpus = scenario.cluster.total_gpus
    print(f"{args.scenario}: {len(scenario.trace)} jobs on {gpus} GPUs; {scenario.description}", file=sys.stderr)
    config = SimConfig(round_seconds=args.round)
    inputs = SimInputs(args.scenario, scenario.cluster, scenario.trace)
    rows: list[tuple[str, ...]] = []
    failed = False
    for policy in args.policies.split(","):
        for cache_system in args.cache_systems.split(","):
            try:
                scheduler = build_scheduler(policy, cache_system)
            except (UnknownPolicy, ImportError) as exc:
                rows.append((policy, cache_system, "-", "-", "-", "-", "-", "-", f"cannot build: {exc}"))
                failed = True
                continue
            goal = goal_seconds(policy)
            started, cpu_started = time.perf_counter(), time.process_time()
            with tempfile.TemporaryDirectory() as out:
                run = simulate_into(inputs, scheduler, config, Path(out), decision_log=False)
            seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
            summary = run.summary
            met = cpu_seconds < goal
            failed = failed or not met
            rows.append(
                (
                    policy,
                    cache_system,
                    f"{summary.finished}/{summary.jobs}",
                    format_duration(summary.average_jct),
                    format_duration(summary.makespan),
                    f"{seconds:.1f}",
                    f"{cpu_seconds:.1f}",
                    f"{goal:.0f}",
                    "yes" if met else "NO",
                )
            )
            print(f"{scheduler.name}: {seconds:.1f} s wall, {cpu_seconds:.1f} s CPU", file=sys.stderr)
    headers = ("POLICY", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "WALL S", "CPU S", "GOAL S", "MET")
    print(render_table(headers, rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
