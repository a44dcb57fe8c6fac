"""`silod sim sweep`: one policy on several cache systems across a knob, as the SiloD paper's Figures 14a and 15.

    silod sim sweep bandwidth (--trace FILE --cluster FILE | --scenario NAME) [--scales X,..] [--policy P]
        [--cache-systems C,..] [--jobs N] [--out DIR] [--seed N] [--round SECONDS] [--time-limit D]
    silod sim sweep sharing --scenario NAME [--fractions F,..] [--policy P] [--cache-systems C,..] [--jobs N] ...

Which runs a sweep makes and how their results become rows is `datamgr.scheduler.sim.sweep`; this module
parses, checks everything before the first run (exit 2 naming the option and the rule), runs them in worker
processes as `silod sim compare` does (`silodcli.processes`; exit 1 if one fails), and writes `sweep.csv`,
`sweep.md` and the plot.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from datamgr.scheduler.registry import CACHE_SYSTEMS, PAPER_CACHE_SYSTEMS, UnknownPolicy, build_scheduler
from datamgr.scheduler.sim import fields, sweep
from datamgr.scheduler.sim.cluster import with_remote_io_scale
from datamgr.scheduler.sim.decisions import InvalidDecision
from datamgr.scheduler.sim.engine import check_inputs
from datamgr.scheduler.sim.fields import SimInputError, format_duration
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, SimulationStalled, TraceJob
from datamgr.scheduler.sim.scenarios import available_scenarios, is_generated_scenario, load_scenario
from silodcli.args import argument_type, path_arg
from silodcli.config import ConfigurableParser
from silodcli.exits import EXIT_FAILED, fail
from silodcli.processes import add_jobs_option, in_workers, run_in_processes
from silodcli.sim import (
    _add_inputs,
    _add_run_options,
    _config,
    _inputs,
    _names,
    simulate_showing_progress,
)
from silodcli.tables import render_table

if TYPE_CHECKING:
    from datamgr.scheduler.sim.report import Summary

DEFAULT_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
DEFAULT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_CACHE_SYSTEMS: dict[sweep.Kind, tuple[str, ...]] = {
    "bandwidth": ("silod", "alluxio"),
    "sharing": PAPER_CACHE_SYSTEMS,
}


def _values(read: fields.Reader[float]) -> Callable[[str], list[float]]:
    """Comma-separated numbers, each checked by `read`, none given twice."""

    def parse(text: str) -> list[float]:
        values = [read(item.strip()) for item in text.split(",") if item.strip()]
        if not values:
            raise ValueError(f"{text!r} gives no values; give comma-separated numbers")
        repeated = sorted({f"{value:g}" for value in values if values.count(value) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} given more than once")
        return values

    return parse


def add_sweep_parser(actions: argparse._SubParsersAction[ConfigurableParser]) -> None:
    """Add `silod sim sweep bandwidth|sharing` to `silod sim`'s actions."""
    sweep_p = actions.add_parser(
        "sweep",
        help="run a policy on several cache systems across egress bandwidths or dataset sharing (paper Fig. 14a, 15)",
        description="Run one policy on several cache systems at each value of a knob, and write a table (CSV and "
        "Markdown) and a plot of average JCT and SiloD's speedup over the others against the knob. See the "
        "Sweeps section of docs/simulator.md.",
    )
    kinds = sweep_p.add_subparsers(dest="sweep_kind", required=True, metavar="KIND")
    bandwidth_p = kinds.add_parser(
        "bandwidth",
        help="scale the cluster's remote IO limit (the paper's Figure 14a)",
        description="Run the trace with the cluster's remote IO limit multiplied by each of --scales, on each "
        "cache system; plot average JCT and SiloD's JCT speedup against the limit. --remote-io-scale is what "
        "--scales sets, so it is refused here.",
    )
    _add_inputs(bandwidth_p)
    bandwidth_p.add_argument(
        "--scales", type=argument_type(_values(fields.positive_number), "scales"), default=list(DEFAULT_SCALES),
        metavar="X,..", help="multiply the remote IO limit by each (each > 0; default 0.25,0.5,1,2,4)",
    )  # fmt: skip
    _add_sweep_options(bandwidth_p, "bandwidth")
    sharing_p = kinds.add_parser(
        "sharing",
        help="regenerate a generated scenario's trace at several sharing fractions (the paper's Figure 15)",
        description="Regenerate a generated scenario's trace with its recipe's sharing set to each of "
        "--fractions (the same jobs, only moved onto shared datasets) and run each cache system on it; plot "
        "average JCT and SiloD's JCT speedup against the fraction. Needs --scenario NAME of a scenario with a "
        "[generate] recipe.",
    )
    _add_inputs(sharing_p)
    sharing_p.add_argument(
        "--fractions", type=argument_type(_values(fields.fraction), "fractions"), default=list(DEFAULT_FRACTIONS),
        metavar="F,..", help="share of jobs on shared datasets, each in [0, 1] (default 0,0.25,0.5,0.75,1)",
    )  # fmt: skip
    _add_sweep_options(sharing_p, "sharing")


def _add_sweep_options(parser: argparse.ArgumentParser, kind: sweep.Kind) -> None:
    parser.add_argument("--policy", default="fifo", metavar="NAME", help="scheduling policy (default %(default)s)")
    parser.add_argument(
        "--cache-systems", type=_names, default=list(DEFAULT_CACHE_SYSTEMS[kind]), metavar="C,..",
        help=f"default {','.join(DEFAULT_CACHE_SYSTEMS[kind])}; silod's speedup is reported over the others",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=path_arg, metavar="DIR", help=f"output directory (default ./sim-NAME-sweep-{kind})"
    )
    add_jobs_option(parser)
    _add_run_options(parser)
    parser.set_defaults(run=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    kind: sweep.Kind = args.sweep_kind
    command = f"sim sweep {kind}"
    try:
        _check_names(args.policy, args.cache_systems)
        name, points = _bandwidth_points(args) if kind == "bandwidth" else _sharing_points(args)
        out: Path = args.out or Path(f"sim-{name}-sweep-{kind}")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SimInputError(f"--out {out}: {exc.strerror or exc}") from None
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
    """Refuse an unknown policy or cache system, or one listed twice, before anything runs."""
    repeated = sorted({name for name in cache_systems if cache_systems.count(name) > 1})
    if repeated:
        raise SimInputError(f"--cache-systems: {', '.join(repeated)} given more than once")
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
    return inputs.name, sweep.bandwidth_points(inputs.trace, inputs.cluster, args.scales)


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
    points = sweep.sharing_points(scenario.recipe, cluster, args.fractions)
    for point in points:
        try:
            check_inputs(point.trace, point.cluster)
        except ValueError as exc:
            raise SimInputError(f"--scenario {scenario.name} at sharing {point.value:g}: {exc}") from None
    return scenario.name, points


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
