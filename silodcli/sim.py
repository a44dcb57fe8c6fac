"""`silod sim`: run a trace through a policy and a cache system, compare the matrix, or generate a trace.

    silod sim (--trace FILE --cluster FILE | --scenario NAME) [--policy P] [--cache-system C] [--out DIR] ...
    silod sim compare (--trace FILE --cluster FILE | --scenario NAME) [--policies P,..] [--cache-systems C,..]
        [--jobs N]
    silod sim generate --out FILE (--jobs N | --duration D) [--sharing F] [--seed N] ...

Bad input (a file, a name, a missing option, a job the cluster cannot run) exits 2 with a message naming
it, before anything runs; a run the engine has to stop (a stalled trace, a policy breaking a resource limit)
exits 1. The plotting code loads only when a simulation runs: matplotlib alone takes a third of a second to
import, which no other `silod` command should pay.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from datamgr.scheduler.policies.options import PolicyOptions
from datamgr.scheduler.registry import (
    CACHE_SYSTEMS,
    COLOCATION_POLICIES,
    DEFAULT_COLOCATION_POLICIES,
    PAPER_CACHE_SYSTEMS,
    Scheduler,
    UnknownPolicy,
    accepts_options,
    build_scheduler,
    option_keys,
)
from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.cluster import load_cluster, with_remote_io_scale, with_tenants
from datamgr.scheduler.sim.decisions import InvalidDecision
from datamgr.scheduler.sim.engine import check_inputs, simulate
from datamgr.scheduler.sim.fields import SimInputError, format_duration
from datamgr.scheduler.sim.generator import GeneratorConfig, generate
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, SimResult, SimulationStalled, TraceJob
from datamgr.scheduler.sim.scenarios import Scenario, available_scenarios, load_scenario
from datamgr.scheduler.sim.tenants import load_tenants
from datamgr.scheduler.sim.trace import load_trace, write_trace
from silodcli.args import argument_type, key_value, path_arg, positive_seconds
from silodcli.config import ConfigurableParser
from silodcli.exits import EXIT_FAILED, fail
from silodcli.processes import add_jobs_option, in_workers, run_in_processes, say_when_done
from silodcli.progress import ProgressLine
from silodcli.sim_colocation import ColocationInputs, colocation_inputs, run_colocation_compare, run_colocation_sim
from silodcli.tables import render_table

if TYPE_CHECKING:
    from datamgr.scheduler.sim.report import Summary

DEFAULT_POLICIES = ("fifo", "sjf", "gavel")
# The cache systems of the paper's comparisons: what `compare` and the sharing sweep run unless told otherwise.
# A variant registered beside them (`quiver-stable`) is opt-in: it answers a question the paper does not ask.
DECISION_LOG = "decisions.jsonl.gz"
SLOWDOWN_CDF = "slowdown_cdf.png"  # written only when some job has a class label
TENANT_DELAY = ("tenant_delay.csv", "tenant_delay.png")  # only when some job has a tenant
SHARING_SAFETY = ("sharing_safety.csv", "sharing_safety.png")  # compare's, only beside a `private` run


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing; give comma-separated names")
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
    sim_p.set_defaults(run=run_sim)

    actions = sim_p.add_subparsers(dest="sim_action", metavar="ACTION", action=_ActionAfterItsOptions)
    _add_compare_parser(actions)
    from silodcli.sim_sweep import add_sweep_parser  # here, not at the top: sim_sweep imports this module

    add_sweep_parser(actions)
    _add_generate_parser(actions)


class _ActionAfterItsOptions(argparse._SubParsersAction):  # type: ignore[type-arg]
    """`silod sim`'s actions, refusing options given before the action's name.

    `silod sim --seed 5 compare ...` would otherwise run with compare's default seed: argparse lets the
    action's own defaults overwrite whatever `sim` parsed before it, silently.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list)
        name = values[0]
        given = [
            action.option_strings[-1]
            for action in parser._actions
            if action.option_strings
            and action.default is not argparse.SUPPRESS  # --help
            and getattr(namespace, action.dest) != parser.get_default(action.dest)
        ]
        if given:
            parser.error(
                f"{', '.join(given)} given before {name!r}: options before an action belong to a plain `silod sim` "
                f"run; give them after {name!r} (see `silod sim {name} --help`)"
            )
        super().__call__(parser, namespace, values, option_string)


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
    compare_p.set_defaults(run=run_compare)


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
        "--duration", type=argument_type(fields.duration, "duration"), metavar="D", help="arrivals within D, e.g. 4w"
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
    generate_p.set_defaults(run=run_generate)


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
        help="longest time between policy rounds; arrivals and finishes start one at once (default: the scenario's, "
        f"else {SimConfig().round_seconds:g})",
    )  # fmt: skip
    parser.add_argument(
        "--preemption-cost", dest="preemption_seconds", type=argument_type(fields.duration, "duration"), metavar="D",
        help="time a preempted job spends restoring its checkpoint when it resumes, holding its GPUs, e.g. 60s "
        "(default: the scenario's, else 0)",
    )  # fmt: skip
    parser.add_argument(
        "--policy-option", dest="policy_options", type=key_value, action="append", default=[],
        metavar="KEY=VALUE",
        help="a knob of the policies that take knobs (Tiresias: queues=1h or 1h,2h or continuous, promote_knob, "
        "pack_limit, history); repeat for more; overrides the scenario's [policy] table",
    )  # fmt: skip

    parser.add_argument(
        "--time-limit", type=argument_type(fields.duration, "duration"), metavar="D",
        help="stop the run at this simulated time, e.g. 2w; unfinished jobs are counted (default: run to the end)",
    )  # fmt: skip


@dataclass(frozen=True)
class SimInputs:
    name: str  # the scenario, or the trace file's stem: names the default output directory
    cluster: ClusterSpec
    trace: list[TraceJob]
    scenario: Scenario | None = None  # the scenario named, with its simulation settings and policy knobs


def _inputs(args: argparse.Namespace) -> SimInputs:
    """The cluster and trace the arguments name; raises SimInputError."""
    if args.scenario is not None:
        if args.trace is not None or args.cluster is not None:
            raise SimInputError("--scenario replaces --trace and --cluster; give one or the other")
        scenario = load_scenario(args.scenario)
        inputs = SimInputs(scenario.name, scenario.cluster, scenario.trace, scenario)
    elif args.trace is None or args.cluster is None:
        raise SimInputError("give --trace FILE and --cluster FILE, or --scenario NAME")
    else:
        inputs = SimInputs(args.trace.stem, load_cluster(args.cluster), load_trace(args.trace))
    cluster = with_remote_io_scale(inputs.cluster, args.remote_io_scale)
    if args.tenants is not None:
        cluster = with_tenants(cluster, load_tenants(args.tenants), str(args.tenants))
    try:
        check_inputs(inputs.trace, cluster)
    except ValueError as exc:
        raise SimInputError(str(exc)) from None
    return SimInputs(inputs.name, cluster, inputs.trace, inputs.scenario)


def _config(args: argparse.Namespace, inputs: SimInputs | None = None) -> SimConfig:
    """The run's settings: the command line's, else the scenario's, else the simulator's defaults."""
    scenario = None if inputs is None else inputs.scenario
    default = SimConfig()
    return SimConfig(
        round_seconds=_first_given(
            args.round_seconds, None if scenario is None else scenario.round_seconds, default.round_seconds
        ),
        seed=args.seed,
        time_limit=args.time_limit,
        preemption_seconds=_first_given(
            args.preemption_seconds,
            None if scenario is None else scenario.preemption_seconds,
            default.preemption_seconds,
        ),
    )


def _first_given(given: float | None, from_scenario: float | None, default: float) -> float:
    """A setting from the command line, else the scenario, else the default (0 counts as given)."""
    return given if given is not None else from_scenario if from_scenario is not None else default


def knobs_for(args: argparse.Namespace, inputs: SimInputs | None, policy: str) -> PolicyOptions | None:
    """The knobs `policy` runs with: the scenario's `[policy]` table overridden by `--policy-option`, each
    knob only if the policy takes it (a scenario's or a comparison's knobs are for the policies that take
    them: Tiresias's do not reach FitGpp); None for a policy that takes none."""
    keys = option_keys(policy)
    scenario = None if inputs is None else inputs.scenario
    options = {**(scenario.policy_options if scenario is not None else {}), **dict(args.policy_options)}
    taken = {key: value for key, value in options.items() if keys is None or key in keys}
    return taken or None


def check_policy_options(args: argparse.Namespace, policies: Sequence[str]) -> None:
    """Refuse a `--policy-option` that no policy of the run takes: it would change nothing (a typo, or the
    wrong policy)."""
    for key, _ in args.policy_options:
        takers = [policy for policy in policies if _takes(policy, key)]
        if not takers:
            accepted = sorted({k for policy in policies for k in option_keys(policy) or ()})
            raise SimInputError(
                f"--policy-option: none of {', '.join(policies)} takes {key!r}"
                + (f"; they take: {', '.join(accepted)}" if accepted else "")
            )


def _takes(policy: str, key: str) -> bool:
    keys = option_keys(policy)
    return accepts_options(policy) if keys is None else key in keys


def with_gpu_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the GPU simulator's defaults for what was not given: policy fifo and cache system silod for a
    run, the paper's policies and cache systems for a comparison. The parser leaves them unset (None) so that a
    co-location run can tell them given (and refuse them) from absent."""
    for name, default in (
        ("policy", "fifo"),
        ("cache_system", "silod"),
        ("policies", list(DEFAULT_POLICIES)),
        ("cache_systems", list(PAPER_CACHE_SYSTEMS)),
    ):
        if hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, default)
    return args


def _on_colocation_inputs(
    args: argparse.Namespace, command: str, run: Callable[[argparse.Namespace, ColocationInputs], int]
) -> int | None:
    """`run`'s exit code when the arguments name co-location inputs (Harmony's machines); None when they name
    GPU inputs, whose defaults are then filled in (`with_gpu_defaults`)."""
    try:
        inputs = colocation_inputs(args)
    except SimInputError as exc:
        return fail(command, exc)
    if inputs is not None:
        return run(args, inputs)
    with_gpu_defaults(args)
    return None


def run_sim(args: argparse.Namespace) -> int:
    if (code := _on_colocation_inputs(args, "sim", run_colocation_sim)) is not None:
        return code
    try:
        inputs = _inputs(args)
        check_policy_options(args, [args.policy])
        scheduler = build_scheduler(args.policy, args.cache_system, knobs_for(args, inputs, args.policy))
    except (SimInputError, UnknownPolicy) as exc:
        return fail("sim", exc)
    from datamgr.scheduler.sim import report

    out = args.out or Path(f"sim-{inputs.name}-{args.policy}-{args.cache_system}")
    try:
        run = simulate_into(inputs, scheduler, _config(args, inputs), out, args.decision_log)
    except (SimulationStalled, InvalidDecision) as exc:
        return fail("sim", exc, EXIT_FAILED)
    print(report.summary_text(run.summary))
    gpu_table = render_table(("GPUS", *report.GROUP_HEADERS), report.group_rows(run.summary, "gpus"))
    print(textwrap.indent(gpu_table, "  "))
    bin_table = render_table(("BIN", *report.GROUP_HEADERS), report.group_rows(run.summary, "bin"))
    print(textwrap.indent(bin_table, "  "))
    if report.has_classes(run.result.jobs):  # FitGpp's TE and BE: its Table 1
        class_table = render_table(("CLASS", *report.GROUP_HEADERS), report.group_rows(run.summary, "class"))
        print(textwrap.indent(class_table, "  "))
    print(f"wrote {out}/: {', '.join(run.files)}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    if (code := _on_colocation_inputs(args, "sim compare", run_colocation_compare)) is not None:
        return code
    baseline = args.baseline or args.cache_systems[0]
    try:
        if baseline not in args.cache_systems:
            raise SimInputError(f"--baseline {baseline} is not one of --cache-systems {','.join(args.cache_systems)}")
        inputs = _inputs(args)
        check_policy_options(args, args.policies)
        pairs = [(p, c, knobs_for(args, inputs, p)) for p in args.policies for c in args.cache_systems]
        for pair in pairs:
            build_scheduler(*pair)  # refuse an unknown name or knob before anything runs
    except (SimInputError, UnknownPolicy) as exc:
        return fail("sim compare", exc)
    from datamgr.scheduler.sim import plots, report, tenant_report

    out = args.out or Path(f"sim-{inputs.name}-compare")
    try:
        simulated = _simulate_pairs(inputs, pairs, _config(args, inputs), out, args.decision_log, args.jobs)
    except (SimulationStalled, InvalidDecision) as exc:
        return fail("sim compare", exc, EXIT_FAILED)
    runs = [(run.result, run.summary) for run in simulated]
    print(render_table(report.COMPARISON_HEADERS, report.comparison_rows(runs, baseline)))
    print(report.speedup_note(baseline))
    report.write_comparison_csv(out / "compare.csv", runs, baseline)
    safety_section = tenant_report.sharing_safety_section(runs)
    report.write_comparison_markdown(out / "compare.md", runs, baseline, safety_section)
    plotted = {summary.label: result for result, summary in runs}
    plots.plot_jct_cdf(out / "jct_cdf.png", plotted)
    files = ["compare.csv", "compare.md", "jct_cdf.png"]
    if any(report.has_classes(result.jobs) for result, _ in runs):
        plots.plot_slowdown_cdf(out / SLOWDOWN_CDF, plotted)
        files.append(SLOWDOWN_CDF)
    else:
        (out / SLOWDOWN_CDF).unlink(missing_ok=True)  # an earlier compare's, which would pass for this one's
    if tenant_report.has_private(runs):
        csv_name, png_name = SHARING_SAFETY
        safety = tenant_report.sharing_safety_rows(runs)
        tenant_report.write_sharing_safety_csv(out / csv_name, safety)
        plots.plot_sharing_safety(out / png_name, tenant_report.sharing_safety_runs(runs), safety)
        files.extend(SHARING_SAFETY)
    else:
        for name in SHARING_SAFETY:
            (out / name).unlink(missing_ok=True)
    per_run = ", ".join(simulated[0].files)
    print(f"wrote {out}/: {', '.join(files)}, and in each POLICY-CACHE/: {per_run}")
    return 0


@dataclass(frozen=True)
class _Run:
    """One simulation's result and summary, and the names of the files it wrote into its directory."""

    result: SimResult
    summary: Summary
    files: tuple[str, ...]


def _simulate_pairs(
    inputs: SimInputs,
    runs: Sequence[tuple[str, str, PolicyOptions | None]],
    config: SimConfig,
    out: Path,
    decision_log: bool,
    processes: int,
) -> list[_Run]:
    """Each (policy, cache system, knobs) run, its outputs in a subdirectory of `out`, in the order of `runs`
    (names, not schedulers, go to the workers: they build their own).

    With `processes` > 1 the runs go to that many worker processes (`run_in_processes`) and a line reports each
    as it ends; one at a time, each shows its own progress line. The first run to fail stops the rest."""
    workers = in_workers(len(runs), processes)
    calls = [partial(_simulate_pair, inputs, run, config, out, decision_log, not workers) for run in runs]
    labels = [f"{policy}/{cache_system}" for policy, cache_system, _ in runs]
    return run_in_processes(calls, processes, say_when_done(labels, workers))


def _simulate_pair(
    inputs: SimInputs,
    run: tuple[str, str, PolicyOptions | None],
    config: SimConfig,
    out: Path,
    decision_log: bool,
    show_progress: bool,
) -> _Run:
    """`simulate_into` of one pair into a subdirectory of `out` named after it: what a `compare` worker runs."""
    scheduler = build_scheduler(*run)
    return simulate_into(inputs, scheduler, config, out / scheduler.name.replace("/", "-"), decision_log, show_progress)


def simulate_into(
    inputs: SimInputs,
    scheduler: Scheduler,
    config: SimConfig,
    out: Path,
    decision_log: bool,
    show_progress: bool = True,
) -> _Run:
    """One run, its outputs written into `out`: per-job, per-group and timeline CSVs, the summary as JSON,
    plots, and with `decision_log` the gzipped decision log. Without it, a log an earlier run left in `out`
    is removed, so that every file there describes this run."""
    from datamgr.scheduler.sim import plots, report, tenant_report

    out.mkdir(parents=True, exist_ok=True)
    log_path = out / DECISION_LOG
    if not decision_log:
        log_path.unlink(missing_ok=True)
    label = scheduler.name if show_progress else None
    with _gzip_text(log_path) if decision_log else contextlib.nullcontext() as log:
        result = simulate_showing_progress(inputs.trace, inputs.cluster, scheduler, config, label, log)
    summary = report.summarize(result, inputs.cluster)
    writers: list[tuple[str, Callable[[Path], None]]] = [
        ("jobs.csv", lambda path: report.write_jobs_csv(path, result)),
        ("groups.csv", lambda path: report.write_groups_csv(path, summary)),
        ("summary.json", lambda path: report.write_summary_json(path, summary)),
        ("timeline.csv", lambda path: report.write_timeline_csv(path, result)),
        ("jct_cdf.png", lambda path: plots.plot_jct_cdf(path, {scheduler.name: result})),
        ("timeline.png", lambda path: plots.plot_timeline(path, result, inputs.cluster)),
        ("fairness.png", lambda path: plots.plot_fairness(path, result)),
    ]
    if report.has_classes(result.jobs):
        writers.append((SLOWDOWN_CDF, lambda path: plots.plot_slowdown_cdf(path, {scheduler.name: result})))
    else:
        (out / SLOWDOWN_CDF).unlink(missing_ok=True)  # as the decision log: every file in `out` is this run's
    if tenant_report.has_tenants(result.jobs):  # HiveD's Figure 7: each tenant's queueing delay over time
        csv_name, png_name = TENANT_DELAY
        writers.append((csv_name, lambda path: tenant_report.write_tenant_delay_csv(path, result)))
        writers.append((png_name, lambda path: plots.plot_tenant_delay(path, result, inputs.cluster)))
    else:
        for name in TENANT_DELAY:
            (out / name).unlink(missing_ok=True)
    for name, write in writers:
        write(out / name)
    files = [name for name, _ in writers] + ([DECISION_LOG] if decision_log else [])
    return _Run(result, summary, tuple(files))


def simulate_showing_progress(
    trace: list[TraceJob],
    cluster: ClusterSpec,
    scheduler: Scheduler,
    config: SimConfig,
    progress_label: str | None,
    decision_log: TextIO | None = None,
) -> SimResult:
    """`engine.simulate`, with a `ProgressLine` named `progress_label` unless that is None (a run in a worker
    process, whose lines would garble the parent's)."""
    progress = ProgressLine(progress_label) if progress_label is not None else None
    result = simulate(trace, cluster, scheduler, config, decision_log=decision_log, progress=progress)
    if progress is not None:
        progress.close()
    return result


def _gzip_text(path: Path) -> TextIO:
    """A text file that `path` receives gzip-compressed, at gzip's default level 6: the rounds of a decision
    log repeat long runs of keys that only lazy matching (levels 4 and up) finds, so on cluster400's sjf/coordl
    log (416 MB) level 1 leaves 53 MB and level 6 26 MB, for 3 s more CPU in a run of over a minute. The
    header carries no time stamp, so equal runs write equal bytes."""
    return io.TextIOWrapper(gzip.GzipFile(path, "wb", compresslevel=6, mtime=0), encoding="utf-8")


def run_generate(args: argparse.Namespace) -> int:
    config = GeneratorConfig(
        jobs=args.jobs,
        duration_seconds=args.duration,
        arrivals_per_hour=args.arrivals_per_hour,
        sharing=args.sharing,
        gpu_speed_scale=args.gpu_speed_scale,
        irregular=args.irregular,
        seed=args.seed,
    )
    trace = generate(config)
    try:
        if not trace:
            raise SimInputError(f"no job arrives within {format_duration(args.duration)} at this arrival rate")
        write_trace(args.out, trace)
    except (SimInputError, OSError) as exc:
        return fail("sim generate", exc)
    print(f"wrote {len(trace)} jobs arriving over {format_duration(trace[-1].arrival)} to {args.out}")
    return 0
