"""`silod sim sweep`: one policy on several cache systems across a knob, as the SiloD paper's Figures 14a and 15.

    silod sim sweep bandwidth (--trace FILE --cluster FILE | --scenario NAME) [--scales X,..] [--policy P]
        [--cache-systems C,..] [--jobs N] [--out DIR] [--tenants FILE] [silod sim's run options]
    silod sim sweep sharing --scenario NAME [--fractions F,..] [--policy P] [--cache-systems C,..] [--jobs N] ...

Which runs a sweep makes and how their results become rows is `datamgr.scheduler.sim.sweep`, and its command
line is `sim_parser`'s; this module checks everything before the first run (exit 2 naming the option and the
rule), runs them in worker processes as `silod sim compare` does (`silodcli.processes`; exit 1 if one fails),
and writes `sweep.csv`, `sweep.md` and the plot. Each run is the run `silod sim` would make at that point, built
by the same code (`silodcli.sim`'s `_inputs`, `_config` and `checked_runs`): the scenario's `[simulation]` and
`[policy]` tables, `--policy-option`, `--preemption-cost` and `--tenants` apply as they do there.
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
from datamgr.scheduler.sim.decisions import InvalidDecision
from datamgr.scheduler.sim.engine import check_inputs
from datamgr.scheduler.sim.fields import SimInputError, format_duration, output_directory
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, SimulationStalled, TraceJob
from datamgr.scheduler.sim.scenarios import available_scenarios, generator_kind, is_generated_scenario
from silodcli.exits import EXIT_FAILED, fail, refusing_unwritable_outputs
from silodcli.processes import in_workers, run_in_processes
from silodcli.sim import (
    RunPlan,
    SimInputs,
    _config,
    _inputs,
    checked_runs,
    scaled_cluster,
    simulate_showing_progress,
)
from silodcli.sim_outputs import input_files, refuse_overwriting_inputs, staged_outputs
from silodcli.tables import render_table

if TYPE_CHECKING:
    from datamgr.scheduler.sim.report import Summary


# Every file a sweep may write into --out: a bandwidth sweep removes an earlier sharing sweep's plot, and so on.
SWEEP_FILES = ("sweep.csv", "sweep.md", *(f"{kind}.png" for kind in sweep.KINDS))


def _command(args: argparse.Namespace) -> str:
    return f"sim sweep {args.sweep_kind}"


@refusing_unwritable_outputs(_command)
def run_sweep(args: argparse.Namespace) -> int:
    kind: sweep.Kind = args.sweep_kind
    command = _command(args)
    try:
        _check_names(args.policy, args.cache_systems)
        inputs, points = _bandwidth_points(args) if kind == "bandwidth" else _sharing_points(args)
        plans = {plan.cache_system: plan for plan in checked_runs(args, inputs, [args.policy], args.cache_systems)}
        out = output_directory(args.out or Path(f"sim-{inputs.name}-sweep-{kind}"))
        refuse_overwriting_inputs(out, SWEEP_FILES, input_files(args))
    except (SimInputError, UnknownPolicy) as exc:
        return fail(command, exc)

    runs = sweep.sweep_runs(kind, points, args.policy, args.cache_systems)
    at = {point.value: point for point in points}
    config = _config(args, inputs)
    one_at_a_time = not in_workers(len(runs), args.jobs)
    calls = [
        partial(
            _summarize_run,
            at[run.value].trace,
            at[run.value].cluster,
            plans[run.cache_system],
            config,
            run.label if one_at_a_time else None,
        )
        for run in runs
    ]

    def finished(index: int, count: int, summary: Summary) -> None:
        jct = "-" if summary.finished == 0 else format_duration(summary.average_jct)
        print(f"[{count}/{len(runs)}] {runs[index].label}: avg JCT {jct}", file=sys.stderr, flush=True)

    try:
        with staged_outputs(out, SWEEP_FILES) as staging:
            summaries = run_in_processes(calls, args.jobs, finished)
            rows = sweep.sweep_rows(runs, summaries)
            title = f"{kind} sweep: {inputs.name}, {args.policy}"
            (staging / "sweep.csv").write_text(sweep.csv_text(kind, rows), encoding="utf-8")
            (staging / "sweep.md").write_text(sweep.markdown_text(title, kind, rows), encoding="utf-8")
            sweep.plot_sweep(staging / f"{kind}.png", title, kind, rows)
    except (SimulationStalled, InvalidDecision) as exc:
        return fail(command, exc, EXIT_FAILED)

    print(render_table(sweep.table_headers(kind), sweep.table_rows(kind, rows)))
    print(sweep.speedup_note(kind, rows))
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


def _bandwidth_points(args: argparse.Namespace) -> tuple[SimInputs, list[sweep.Point]]:
    """The inputs as `silod sim` reads them, and the trace on their cluster at each scale of its remote IO."""
    if args.remote_io_scale != 1.0:
        raise SimInputError("--remote-io-scale: the bandwidth sweep scales the remote IO limit by --scales; give those")
    inputs = _inputs(args)
    for scale in args.scales:  # each refused naming --scales and the scale: a limit no rate, or too slow for the trace
        scaled_cluster(inputs.trace, inputs.cluster, scale, "--scales")
    return inputs, sweep.bandwidth_points(inputs.trace, inputs.cluster, args.scales)


def _sharing_points(args: argparse.Namespace) -> tuple[SimInputs, list[sweep.Point]]:
    """The scenario as `silod sim` reads it (its cluster with `--remote-io-scale` and `--tenants`), and its trace
    redrawn at each fraction; only a Philly-like recipe has a sharing knob to set."""
    if args.trace is not None or args.cluster is not None or args.scenario is None:
        raise SimInputError(
            "the sharing sweep regenerates a scenario's trace at each fraction, so it takes --scenario NAME of a "
            f"generated scenario ({', '.join(_generated_scenarios())}), not --trace or --cluster"
        )
    kind = generator_kind(args.scenario)  # read from the file: generating a refused scenario's trace costs seconds
    if kind != "philly":
        what = (
            "it replays a trace file, which cannot be regenerated with more sharing"
            if kind is None
            else f'its [generate] recipe is of kind "{kind}", which has no sharing knob to set (only a Philly-like '
            "recipe draws jobs onto shared or private copies of datasets)"
        )
        raise SimInputError(
            f"--scenario {args.scenario}: {what}; give a scenario with a Philly-like [generate] recipe: "
            f"{', '.join(_generated_scenarios())}"
        )
    inputs = _inputs(args)
    assert inputs.scenario is not None and inputs.scenario.recipe is not None  # a Philly-like recipe's scenario
    return inputs, _checked(
        inputs.name, "sharing", sweep.sharing_points(inputs.scenario.recipe, inputs.cluster, args.fractions)
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
    trace: list[TraceJob], cluster: ClusterSpec, plan: RunPlan, config: SimConfig, progress_label: str | None
) -> Summary:
    """One run of a sweep, summarized (no decision log, no files): what a worker process runs. The summary, not
    the whole result, travels back from the worker."""
    from datamgr.scheduler.sim import report

    result = simulate_showing_progress(trace, cluster, plan.scheduler(), config, progress_label)
    return report.summarize(result, cluster)
