"""`silod sim sweep`: one policy on several cache systems across a knob, as the SiloD paper's Figures 14a and 15.

    silod sim sweep bandwidth (--trace FILE --cluster FILE | --scenario NAME) [--scales X,..] [--policy P]
        [--cache-systems C,..] [--jobs N] [--out DIR] [--seed N] [--round SECONDS] [--time-limit D]
    silod sim sweep sharing --scenario NAME [--fractions F,..] [--policy P] [--cache-systems C,..] [--jobs N] ...

Which runs a sweep makes and how their results become rows is `datamgr.scheduler.sim.sweep`, and its command
line is `sim_parser`'s; this module checks everything before the first run (exit 2 naming the option and the
rule), runs them in worker processes as `silod sim compare` does (`silodcli.processes`; exit 1 if one fails),
and writes `sweep.csv`, `sweep.md` and the plot.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from datamgr.scheduler.registry import CACHE_SYSTEMS, UnknownPolicy, build_scheduler
from datamgr.scheduler.sim import sweep
from datamgr.scheduler.sim.cluster import with_remote_io_scale
from datamgr.scheduler.sim.decisions import InvalidDecision
from datamgr.scheduler.sim.engine import check_inputs
from datamgr.scheduler.sim.fields import SimInputError, format_duration, output_directory
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, SimulationStalled, TraceJob
from datamgr.scheduler.sim.scenarios import available_scenarios, is_generated_scenario, load_scenario
from silodcli.exits import EXIT_FAILED, fail, refusing_unwritable_outputs
from silodcli.processes import in_workers, run_in_processes
from silodcli.sim import (
    _config,
    _inputs,
    simulate_showing_progress,
)
from silodcli.tables import render_table

if TYPE_CHECKING:
    from datamgr.scheduler.sim.report import Summary


def _command(args: argparse.Namespace) -> str:
    return f"sim sweep {args.sweep_kind}"


@refusing_unwritable_outputs(_command)
def run_sweep(args: argparse.Namespace) -> int:
    kind: sweep.Kind = args.sweep_kind
    command = _command(args)
    try:
        _check_names(args.policy, args.cache_systems)
        name, points = _bandwidth_points(args) if kind == "bandwidth" else _sharing_points(args)
        out = output_directory(args.out or Path(f"sim-{name}-sweep-{kind}"))
    except SimInputError as exc:
        return fail(command, exc)

    runs = sweep.sweep_runs(kind, points, args.policy, args.cache_systems)
    at = {point.value: point for point in points}
    config = _config(args, None)
    one_at_a_time = not in_workers(len(runs), args.jobs)
    calls = [
        partial(
            _summarize_run,
            at[run.value].trace,
            at[run.value].cluster,
            run.policy,
            run.cache_system,
            config,
            run.label if one_at_a_time else None,
        )
        for run in runs
    ]

    def finished(index: int, count: int, summary: Summary) -> None:
        jct = "-" if summary.finished == 0 else format_duration(summary.average_jct)
        print(f"[{count}/{len(runs)}] {runs[index].label}: avg JCT {jct}", file=sys.stderr, flush=True)

    try:
        summaries = run_in_processes(calls, args.jobs, finished)
    except (SimulationStalled, InvalidDecision) as exc:
        return fail(command, exc, EXIT_FAILED)

    rows = sweep.sweep_rows(runs, summaries)
    title = f"{kind} sweep: {name}, {args.policy}"
    (out / "sweep.csv").write_text(sweep.csv_text(kind, rows), encoding="utf-8")
    (out / "sweep.md").write_text(sweep.markdown_text(title, kind, rows), encoding="utf-8")
    sweep.plot_sweep(out / f"{kind}.png", title, kind, rows)
    print(render_table(sweep.table_headers(kind), sweep.table_rows(kind, rows)))
    print(sweep.speedup_note(kind))
    print(f"wrote {out}/: sweep.csv, sweep.md, {kind}.png")
    return 0


def _check_names(policy: str, cache_systems: Sequence[str]) -> None:
    """Refuse an unknown policy or cache system before anything runs (the parser refuses one listed twice)."""
    for cache_system in cache_systems:
        if cache_system not in CACHE_SYSTEMS:
            raise SimInputError(
                f"--cache-systems: unknown cache system {cache_system!r}; known: {', '.join(CACHE_SYSTEMS)}"
            )
    try:
        build_scheduler(policy, cache_systems[0])
    except UnknownPolicy as exc:
        raise SimInputError(f"--policy: {exc}") from None


def _bandwidth_points(args: argparse.Namespace) -> tuple[str, list[sweep.Point]]:
    if args.remote_io_scale != 1.0:
        raise SimInputError("--remote-io-scale: the bandwidth sweep scales the remote IO limit by --scales; give those")
    inputs = _inputs(args)
    return inputs.name, _checked(
        inputs.name, "bandwidth", sweep.bandwidth_points(inputs.trace, inputs.cluster, args.scales)
    )


def _sharing_points(args: argparse.Namespace) -> tuple[str, list[sweep.Point]]:
    """A generated scenario's trace at each fraction; a trace file cannot be re-drawn with more sharing."""
    if args.trace is not None or args.cluster is not None or args.scenario is None:
        raise SimInputError(
            "the sharing sweep regenerates a scenario's trace at each fraction, so it takes --scenario NAME of a "
            f"generated scenario ({', '.join(_generated_scenarios())}), not --trace or --cluster"
        )
    scenario = load_scenario(args.scenario)
    if scenario.recipe is None:
        raise SimInputError(
            f"--scenario {scenario.name}: it replays a trace file, which cannot be regenerated with more sharing; "
            f"give a generated scenario (one with a [generate] recipe): {', '.join(_generated_scenarios())}"
        )
    cluster = with_remote_io_scale(scenario.cluster, args.remote_io_scale)
    return scenario.name, _checked(
        scenario.name, "sharing", sweep.sharing_points(scenario.recipe, cluster, args.fractions)
    )


def _checked(name: str, kind: sweep.Kind, points: list[sweep.Point]) -> list[sweep.Point]:
    """`points`, each a trace its cluster can run (a point's trace or cluster is the knob's, not the one checked
    already); raises SimInputError naming the point, before any run starts."""
    for point in points:
        try:
            check_inputs(point.trace, point.cluster)
        except ValueError as exc:
            raise SimInputError(f"{name} at {sweep.value_text(kind, point.value)}: {exc}") from None
    return points


def _generated_scenarios() -> list[str]:
    return [name for name in available_scenarios() if is_generated_scenario(name)]


def _summarize_run(
    trace: list[TraceJob],
    cluster: ClusterSpec,
    policy: str,
    cache_system: str,
    config: SimConfig,
    progress_label: str | None,
) -> Summary:
    """One run of a sweep, summarized (no decision log, no files): what a worker process runs. The summary, not
    the whole result, travels back from the worker."""
    from datamgr.scheduler.sim import report

    scheduler = build_scheduler(policy, cache_system)
    result = simulate_showing_progress(trace, cluster, scheduler, config, progress_label)
    return report.summarize(result, cluster)
