"""The command line of `silod sim` and its actions (`compare`, `sweep`, `generate`); `sim` and `sim_sweep` run them.

Apart from them so that `silod`'s other commands do not load the simulator, numpy with it, to build theirs
(`deferred`): this module imports only the policy registry's names, the scenarios' names and the defaults
the help shows.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from datamgr.scheduler.registry import (
    CACHE_SYSTEMS,
    COLOCATION_POLICIES,
    DEFAULT_COLOCATION_POLICIES,
    PAPER_CACHE_SYSTEMS,
)
from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.generator import GeneratorConfig
from datamgr.scheduler.sim.model import SimConfig
from datamgr.scheduler.sim.scenarios import PREEMPTION_COST, available_scenarios
from silodcli.args import (
    ActionAfterItsOptions,
    AppendKeyOnce,
    argument_type,
    key_value,
    path_arg,
    positive_seconds,
)
from silodcli.config import ConfigurableParser
from silodcli.deferred import Deferred

if TYPE_CHECKING:
    from datamgr.scheduler.sim.sweep import Kind as SweepKind

DEFAULT_POLICIES = ("fifo", "sjf", "gavel")
DECISION_LOG = "decisions.jsonl.gz"
DEFAULT_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
DEFAULT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_CACHE_SYSTEMS: dict[SweepKind, tuple[str, ...]] = {
    "bandwidth": ("silod", "alluxio"),
    "sharing": PAPER_CACHE_SYSTEMS,
}


def _names(text: str) -> list[str]:
    """Comma-separated names, each once: a name given twice would run the same pair twice, both writing into
    one directory at once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing; give comma-separated names")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given more than once")
    return names


def add_sim_parser(sub: argparse._SubParsersAction[ConfigurableParser]) -> None:
    """Add `silod sim` and its actions to the `silod` command line; each sets `run` as main dispatches."""
    sim_p = sub.add_parser(
        "sim",
        help="simulate scheduling policies and cache systems on a trace",
        description="Run a trace through a policy and a cache system on a modelled cluster and report JCT, "
        "makespan, fairness and remote IO, with CSV and JSON files and plots in --out. `compare` runs a policy x cache "
        "system matrix; `generate` writes a synthetic trace. See docs/simulator.md.",
    )
    _add_inputs(sim_p)
    sim_p.add_argument(
        "--policy", metavar="NAME",
        help="scheduling policy (default fifo; harmony on a co-location scenario, whose policies are "
        f"{', '.join(COLOCATION_POLICIES)})",
    )  # fmt: skip
    sim_p.add_argument(
        "--cache-system", choices=list(CACHE_SYSTEMS),
        help="storage side (default silod; none on a co-location scenario)",
    )  # fmt: skip
    sim_p.add_argument("--out", type=path_arg, metavar="DIR", help="output directory (default ./sim-NAME-POLICY-CACHE)")
    _add_decision_log_option(sim_p)
    _add_run_options(sim_p)
    sim_p.set_defaults(run=Deferred("silodcli.sim:run_sim"))

    actions = sim_p.add_subparsers(dest="sim_action", metavar="ACTION", action=ActionAfterItsOptions)
    _add_compare_parser(actions)
    add_sweep_parser(actions)
    _add_generate_parser(actions)


def _add_compare_parser(actions: argparse._SubParsersAction[ConfigurableParser]) -> None:
    compare_p = actions.add_parser(
        "compare",
        help="run every policy x cache system pair and print one table",
        description="Run every pair of --policies and --cache-systems on the same inputs; print a table of "
        "average JCT, makespan, fairness and remote IO with each run's JCT speedup over --baseline, and write "
        "the table as CSV and as Markdown (with JCT, queueing and slowdown percentiles, and slowdowns by job class "
        "and preemptions where there are any), an overlaid JCT CDF (and slowdown CDFs by class), and each run's "
        "outputs in a subdirectory of --out. With the `private` policy among --policies, also each tenant's sharing "
        "safety under the other policies (HiveD's excessive queueing delay against the private cluster).",
    )
    _add_inputs(compare_p)
    compare_p.add_argument(
        "--policies", type=_names, metavar="P,..",
        help=f"default {','.join(DEFAULT_POLICIES)}; on a co-location scenario {','.join(DEFAULT_COLOCATION_POLICIES)}",
    )  # fmt: skip
    compare_p.add_argument(
        "--cache-systems", type=_names, metavar="C,..",
        help=f"default {','.join(PAPER_CACHE_SYSTEMS)}, the paper's; known: {', '.join(CACHE_SYSTEMS)}",
    )  # fmt: skip
    compare_p.add_argument(
        "--baseline", metavar="CACHE", help="speedups are over this cache system (default the first listed)"
    )
    compare_p.add_argument("--out", type=path_arg, metavar="DIR", help="output directory (default ./sim-NAME-compare)")
    _add_decision_log_option(compare_p)
    add_jobs_option(compare_p)
    _add_run_options(compare_p)
    compare_p.set_defaults(run=Deferred("silodcli.sim:run_compare"))


def _add_generate_parser(actions: argparse._SubParsersAction[ConfigurableParser]) -> None:
    generate_p = actions.add_parser(
        "generate",
        help="write a synthetic trace (Philly-like durations, Poisson arrivals, the paper's models)",
        description="Write a synthetic trace; the same options and seed always give the same file.",
    )
    generate_p.add_argument("--out", type=path_arg, required=True, metavar="FILE", help="trace file, .csv or .jsonl")
    size = generate_p.add_mutually_exclusive_group(required=True)
    size.add_argument("--jobs", type=argument_type(fields.positive_int, "count"), metavar="N", help="this many jobs")
    size.add_argument(
        "--duration",
        type=argument_type(fields.positive_duration, "duration"),
        metavar="D",
        help="arrivals within D, e.g. 4w",
    )
    defaults = GeneratorConfig(jobs=1)
    generate_p.add_argument(
        "--arrivals-per-hour", type=argument_type(fields.positive_number, "rate"), default=defaults.arrivals_per_hour,
        metavar="R", help="Poisson arrival rate (default %(default)g)",
    )  # fmt: skip
    generate_p.add_argument(
        "--sharing", type=argument_type(fields.fraction, "fraction"), default=defaults.sharing, metavar="F",
        help="share of jobs reading the shared copy of their dataset (default %(default)g)",
    )  # fmt: skip
    generate_p.add_argument(
        "--gpu-speed-scale", type=argument_type(fields.positive_number, "scale"), default=defaults.gpu_speed_scale,
        metavar="X", help="multiply every job's f* (faster GPUs, same epochs; default %(default)g)",
    )  # fmt: skip
    generate_p.add_argument(
        "--irregular", type=argument_type(fields.fraction, "fraction"), default=defaults.irregular, metavar="F",
        help="share of jobs flagged irregular (default %(default)g)",
    )  # fmt: skip
    generate_p.add_argument(
        "--seed", type=argument_type(fields.whole_number, "seed"), default=defaults.seed, help="default %(default)s"
    )
    generate_p.set_defaults(run=Deferred("silodcli.sim:run_generate"))


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=path_arg, metavar="FILE", help="trace file (.csv or .jsonl)")
    parser.add_argument("--cluster", type=path_arg, metavar="FILE", help="cluster file (TOML)")
    parser.add_argument(
        "--scenario", choices=available_scenarios(), help="a shipped cluster and trace instead of the two files"
    )
    parser.add_argument(
        "--remote-io-scale", type=argument_type(fields.positive_number, "scale"), default=1.0, metavar="X",
        help="multiply the cluster's remote IO limit (default %(default)g)",
    )  # fmt: skip
    parser.add_argument(
        "--tenants", type=path_arg, metavar="FILE",
        help="the tenants' VCs (a TOML file of [NAME] tables: cells, cache, remote_io), replacing the cluster's",
    )  # fmt: skip


def _add_decision_log_option(parser: argparse.ArgumentParser) -> None:
    """Off by default: a cluster400 run logs hundreds of MB of rounds, which few readers of a run need."""
    parser.add_argument(
        "--decision-log", action="store_true",
        help=f"also write every policy round's decision as a JSON line into {DECISION_LOG} (gzip; read with zcat)",
    )  # fmt: skip


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seed", type=argument_type(fields.whole_number, "seed"), default=SimConfig().seed,
        help="seed of the policies' randomness (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--round", dest="round_seconds", type=positive_seconds, metavar="SECONDS",
        help="longest time between policy rounds, at least 0.1; arrivals and finishes start one at once (default: "
        f"the scenario's, else {SimConfig().round_seconds:g})",
    )  # fmt: skip
    parser.add_argument(
        "--preemption-cost", dest="preemption_seconds", type=argument_type(PREEMPTION_COST, "duration"), metavar="D",
        help="time a preempted job spends restoring its checkpoint when it resumes, holding its GPUs, e.g. 60s; at "
        "most a day (default: the scenario's, else 0)",
    )  # fmt: skip
    parser.add_argument(
        "--policy-option", dest="policy_options", type=key_value, action=AppendKeyOnce, default=[],
        metavar="KEY=VALUE",
        help="a knob of the policies that take knobs (Tiresias: queues=1h or 1h,2h or continuous, promote_knob, "
        "pack_limit, history); repeat for more, each key once; overrides the scenario's [policy] table",
    )  # fmt: skip

    parser.add_argument(
        "--time-limit", type=argument_type(fields.positive_duration, "duration"), metavar="D",
        help="stop the run at this simulated time, e.g. 2w; unfinished jobs are counted (default: run to the end)",
    )  # fmt: skip


def add_jobs_option(parser: argparse.ArgumentParser) -> None:
    """`--jobs N`, the number of runs at once (`args.jobs`), for `run_in_processes`."""
    parser.add_argument(
        "--jobs", type=argument_type(fields.positive_int, "count"), default=os.cpu_count() or 1, metavar="N",
        help="runs at once, each in a process of its own (default: the CPU count, %(default)s)",
    )  # fmt: skip


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


def _add_sweep_options(parser: argparse.ArgumentParser, kind: SweepKind) -> None:
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
    parser.set_defaults(run=Deferred("silodcli.sim_sweep:run_sweep"))
