"""Simulator benchmark: how long a whole scenario takes to simulate, per policy.

Loads a shipped scenario (by default `cluster400`: 400 GPUs, 4 GB/s of remote IO, four weeks of synthetic
arrivals), then for every policy (by default every registered one) on each cache system (by default silod)
times one `simulate` run end to end without writing any output files, and prints a table of the seconds per
run, wall clock and this process's CPU time, against the 60 s goal with what the run amounted to (jobs
finished, average JCT, makespan). The goal is judged on CPU time: the run is single-threaded, so on an idle
machine the two agree, and CPU time does not count what other work on a shared machine takes from it.
Progress goes to stderr, the table to stdout. Exits 1 if a run misses the goal or cannot be built.

    PYTHONPATH=. .venv/bin/python bench/sim_scenario.py [--scenario NAME] [--policies P,..]
        [--cache-systems C,..] [--round SECONDS]
"""

from __future__ import annotations

import argparse
import sys
import time

from datamgr.cli.sim import ProgressLine
from datamgr.cli.tables import render_table
from datamgr.scheduler.registry import UnknownPolicy, available_policies, build_scheduler
from datamgr.scheduler.sim import report
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.fields import format_duration
from datamgr.scheduler.sim.model import SimConfig
from datamgr.scheduler.sim.scenarios import available_scenarios, load_scenario

GOAL_SECONDS = 60.0


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
    rows: list[tuple[str, ...]] = []
    failed = False
    for policy in args.policies.split(","):
        for cache_system in args.cache_systems.split(","):
            try:
                scheduler = build_scheduler(policy, cache_system)
            except (UnknownPolicy, ImportError) as exc:
                rows.append((policy, cache_system, "-", "-", "-", "-", "-", f"cannot build: {exc}"))
                failed = True
                continue
            progress = ProgressLine(scheduler.name)
            started, cpu_started = time.perf_counter(), time.process_time()
            result = simulate(scenario.trace, scenario.cluster, scheduler, config, progress=progress)
            seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
            progress.close()
            summary = report.summarize(result, scenario.cluster)
            met = cpu_seconds < GOAL_SECONDS
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
                    "yes" if met else "NO",
                )
            )
            print(f"{scheduler.name}: {seconds:.1f} s wall, {cpu_seconds:.1f} s CPU", file=sys.stderr)
    headers = ("POLICY", "CACHE", "FINISHED", "AVG JCT", "MAKESPAN", "WALL S", "CPU S", f"CPU < {GOAL_SECONDS:.0f} s")
    print(render_table(headers, rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
