"""`silod sim`: run a trace through a policy and a cache system, compare the matrix, or generate a trace.

    silod sim (--trace FILE --cluster FILE | --scenario NAME) [--policy P] [--cache-system C] [--out DIR] ...
    silod sim compare (--trace FILE --cluster FILE | --scenario NAME) [--policies P,..] [--cache-systems C,..]
        [--jobs N]
    silod sim generate --out FILE (--jobs N | --duration D) [--sharing F] [--seed N] ...

Bad input (a file, a name, a missing option or knob, a job the cluster cannot run, an output that would replace
an input) exits 2 with a message naming it, before anything runs; a run the engine has to stop (a stalled trace,
a policy breaking a resource limit) exits 1. Each run is built the same way by `silod sim`, `compare` and `sweep`:
the inputs with `_inputs`, the settings with `_config`, each policy's knobs and scheduler with `checked_runs`. The
files go into `--out` all at once when a command has written them all (`sim_outputs`). The command line is
`sim_parser`'s, which loads none of this. The plotting code loads only when a simulation runs: matplotlib alone
takes a third of a second to import, which `silod sim generate` should not pay.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from datamgr.scheduler.policies.options import PolicyOptions
from datamgr.scheduler.registry import (
    PAPER_CACHE_SYSTEMS,
    Scheduler,
    UnknownPolicy,
    accepts_options,
    build_scheduler,
    option_keys,
)
from datamgr.scheduler.sim.cluster import load_cluster, with_remote_io_scale, with_tenants
from datamgr.scheduler.sim.decisions import InvalidDecision
from datamgr.scheduler.sim.engine import check_inputs, simulate
from datamgr.scheduler.sim.fields import SimInputError, format_duration, output_directory
from datamgr.scheduler.sim.generator import GeneratorConfig, KnobError, generate_jobs, trace_size
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, SimResult, SimulationStalled, TraceJob
from datamgr.scheduler.sim.scenarios import Scenario, load_scenario
from datamgr.scheduler.sim.tenants import load_tenants
from datamgr.scheduler.sim.trace import load_trace, trace_format, write_jobs, writing_trace
from silodcli.exits import EXIT_FAILED, fail, refusing_unwritable_outputs
from silodcli.processes import in_workers, run_in_processes, say_when_done
from silodcli.progress import ProgressLine
from silodcli.sim_colocation import ColocationInputs, colocation_inputs, run_colocation_compare, run_colocation_sim
from silodcli.sim_outputs import input_files, refuse_overwriting_inputs, staged_outputs
from silodcli.sim_parser import DECISION_LOG, DEFAULT_POLICIES
from silodcli.tables import render_table

if TYPE_CHECKING:
    from datamgr.scheduler.sim.report import Summary

SLOWDOWN_CDF = "slowdown_cdf.png"  # written only when some job has a class label
TENANT_DELAY = ("tenant_delay.csv", "tenant_delay.png")  # only when some job has a tenant
SHARING_SAFETY = ("sharing_safety.csv", "sharing_safety.png")  # compare's, only beside a `private` run
# Every file a run may write into its directory, and a compare into its own: the files a run replaces, or removes
# when it does not write them, so that none is left from an earlier run (`sim_outputs.staged_outputs`); a directory
# in a compare's --out holding only RUN_FILES is an earlier compare's run, removed unless this compare makes it.
RUN_FILES = (
    "jobs.csv",
    "groups.csv",
    "summary.json",
    "timeline.csv",
    "jct_cdf.png",
    "timeline.png",
    "fairness.png",
    SLOWDOWN_CDF,
    *TENANT_DELAY,
    DECISION_LOG,
)
COMPARE_FILES = ("compare.csv", "compare.md", "jct_cdf.png", SLOWDOWN_CDF, *SHARING_SAFETY)


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
    cluster = inputs.cluster
    if args.tenants is not None:
        cluster = with_tenants(cluster, load_tenants(args.tenants), str(args.tenants))
    try:
        check_inputs(inputs.trace, cluster)
    except ValueError as exc:
        raise SimInputError(str(exc)) from None
    cluster = scaled_cluster(inputs.trace, cluster, args.remote_io_scale, "--remote-io-scale")
    return SimInputs(inputs.name, cluster, inputs.trace, inputs.scenario)


def scaled_cluster(trace: Sequence[TraceJob], cluster: ClusterSpec, scale: float, option: str) -> ClusterSpec:
    """`cluster` (which runs `trace`: `check_inputs`) with its remote IO limit multiplied by `scale`, checked again:
    a limit that is no rate, less than its tenants reserve or too slow for the trace is a SimInputError that names
    `option` and `scale` (`--remote-io-scale 1e-12: ...`), the input that made it, not the cluster file's
    remote_io, which was fine as given."""
    if scale == 1:
        return cluster
    try:
        scaled = with_remote_io_scale(cluster, scale)
        check_inputs(trace, scaled, remote_io_hint=f"give a larger {option}")
    except ValueError as exc:
        raise SimInputError(f"{option} {scale:g}: {exc}") from None
    return scaled


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


@dataclass(frozen=True)
class RunPlan:
    """One run's policy, cache system and knobs, checked (`checked_runs`): what a worker process builds its
    scheduler from (names and knobs pickle; a scheduler need not)."""

    policy: str
    cache_system: str
    knobs: PolicyOptions | None
    label: str  # the scheduler's name, `fifo/silod`

    def scheduler(self) -> Scheduler:
        return build_scheduler(self.policy, self.cache_system, self.knobs)

    @property
    def directory(self) -> str:
        """The name of the run's directory in a comparison's `--out`: `fifo-silod`."""
        return self.label.replace("/", "-")


def checked_runs(
    args: argparse.Namespace, inputs: SimInputs, policies: Sequence[str], cache_systems: Sequence[str]
) -> list[RunPlan]:
    """Every policy on every cache system, policy by policy, each with the knobs it runs with (`knobs_for`: the
    scenario's `[policy]` table under `--policy-option`), each scheduler built once so that an unknown name, a
    `--policy-option` no policy takes or a knob's bad value is refused before anything runs (SimInputError,
    UnknownPolicy). `silod sim`, `compare` and `sweep` all build their runs here."""
    check_policy_options(args, policies)
    plans = []
    for policy in policies:
        knobs = knobs_for(args, inputs, policy)
        for cache_system in cache_systems:
            plans.append(RunPlan(policy, cache_system, knobs, build_scheduler(policy, cache_system, knobs).name))
    return plans


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


@refusing_unwritable_outputs("sim")
def run_sim(args: argparse.Namespace) -> int:
    if (code := _on_colocation_inputs(args, "sim", run_colocation_sim)) is not None:
        return code
    try:
        inputs = _inputs(args)
        (plan,) = checked_runs(args, inputs, [args.policy], [args.cache_system])
        out = output_directory(args.out or Path(f"sim-{inputs.name}-{args.policy}-{args.cache_system}"))
        refuse_overwriting_inputs(out, RUN_FILES, input_files(args))
    except (SimInputError, UnknownPolicy) as exc:
        return fail("sim", exc)
    from datamgr.scheduler.sim import report

    try:
        with staged_outputs(out, RUN_FILES) as staging:
            run = simulate_into(inputs, plan.scheduler(), _config(args, inputs), staging, args.decision_log)
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


@refusing_unwritable_outputs("sim compare")
def run_compare(args: argparse.Namespace) -> int:
    if (code := _on_colocation_inputs(args, "sim compare", run_colocation_compare)) is not None:
        return code
    baseline = args.baseline or args.cache_systems[0]
    try:
        if baseline not in args.cache_systems:
            raise SimInputError(f"--baseline {baseline} is not one of --cache-systems {','.join(args.cache_systems)}")
        inputs = _inputs(args)
        plans = checked_runs(args, inputs, args.policies, args.cache_systems)
        out = output_directory(args.out or Path(f"sim-{inputs.name}-compare"))
        names = [*COMPARE_FILES, *(f"{plan.directory}/{name}" for plan in plans for name in RUN_FILES)]
        refuse_overwriting_inputs(out, names, input_files(args))
    except (SimInputError, UnknownPolicy) as exc:
        return fail("sim compare", exc)
    from datamgr.scheduler.sim import report

    try:
        with staged_outputs(out, names, RUN_FILES) as staging:
            simulated = _simulate_pairs(inputs, plans, _config(args, inputs), staging, args.decision_log, args.jobs)
            runs = [(run.result, run.summary) for run in simulated]
            files = _write_comparison(staging, runs, baseline)
    except (SimulationStalled, InvalidDecision) as exc:
        return fail("sim compare", exc, EXIT_FAILED)
    print(render_table(report.COMPARISON_HEADERS, report.comparison_rows(runs, baseline)))
    print(report.speedup_note(baseline, runs))
    per_run = ", ".join(simulated[0].files)
    print(f"wrote {out}/: {', '.join(files)}, and in each POLICY-CACHE/: {per_run}")
    return 0


def _write_comparison(out: Path, runs: Sequence[tuple[SimResult, Summary]], baseline: str) -> list[str]:
    """A comparison's own files in `out` (a fresh directory: `staged_outputs`); the names of those written."""
    from datamgr.scheduler.sim import plots, report, tenant_report

    report.write_comparison_csv(out / "compare.csv", runs, baseline)
    safety_section = tenant_report.sharing_safety_section(runs)
    report.write_comparison_markdown(out / "compare.md", runs, baseline, safety_section)
    plotted = {summary.label: result for result, summary in runs}
    plots.plot_jct_cdf(out / "jct_cdf.png", plotted)
    files = ["compare.csv", "compare.md", "jct_cdf.png"]
    if any(report.has_classes(result.jobs) for result, _ in runs):
        plots.plot_slowdown_cdf(out / SLOWDOWN_CDF, plotted)
        files.append(SLOWDOWN_CDF)
    if tenant_report.has_private(runs):
        csv_name, png_name = SHARING_SAFETY
        safety = tenant_report.sharing_safety_rows(runs)
        tenant_report.write_sharing_safety_csv(out / csv_name, safety)
        plots.plot_sharing_safety(out / png_name, tenant_report.sharing_safety_runs(runs), safety)
        files.extend(SHARING_SAFETY)
    return files


@dataclass(frozen=True)
class _Run:
    """One simulation's result and summary, and the names of the files it wrote into its directory."""

    result: SimResult
    summary: Summary
    files: tuple[str, ...]


def _simulate_pairs(
    inputs: SimInputs,
    plans: Sequence[RunPlan],
    config: SimConfig,
    out: Path,
    decision_log: bool,
    processes: int,
) -> list[_Run]:
    """Each run, its outputs in a subdirectory of `out` (`RunPlan.directory`), in the order of `plans`
    (plans, not schedulers, go to the workers: they build their own).

    With `processes` > 1 the runs go to that many worker processes (`run_in_processes`) and a line reports each
    as it ends; one at a time, each shows its own progress line. The first run to fail stops the rest."""
    workers = in_workers(len(plans), processes)
    calls = [partial(_simulate_pair, inputs, plan, config, out, decision_log, not workers) for plan in plans]
    return run_in_processes(calls, processes, say_when_done([plan.label for plan in plans], workers))


def _simulate_pair(
    inputs: SimInputs, plan: RunPlan, config: SimConfig, out: Path, decision_log: bool, show_progress: bool
) -> _Run:
    """`simulate_into` of one run into its subdirectory of `out`: what a `compare` worker runs."""
    return simulate_into(inputs, plan.scheduler(), config, out / plan.directory, decision_log, show_progress)


def simulate_into(
    inputs: SimInputs,
    scheduler: Scheduler,
    config: SimConfig,
    out: Path,
    decision_log: bool,
    show_progress: bool = True,
) -> _Run:
    """One run, its outputs written into `out`, a fresh directory (`staged_outputs` clears those of an earlier run
    that this one does not write): per-job, per-group and timeline CSVs, the summary as JSON, plots, and with
    `decision_log` the gzipped decision log; `RUN_FILES` are all it may write."""
    from datamgr.scheduler.sim import plots, report, tenant_report

    out.mkdir(parents=True, exist_ok=True)
    log_path = out / DECISION_LOG
    label = scheduler.name if show_progress else None
    with _gzip_text(log_path) if decision_log else contextlib.nullcontext() as log:
        result = simulate_showing_progress(inputs.trace, inputs.cluster, scheduler, config, label, log)
    summary = report.summarize(result, inputs.cluster)
    writers: list[tuple[str, Callable[[Path], object]]] = [
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
    if tenant_report.has_tenants(result.jobs):  # HiveD's Figure 7: each tenant's queueing delay over time
        csv_name, png_name = TENANT_DELAY
        writers.append((csv_name, lambda path: tenant_report.write_tenant_delay_csv(path, result)))
        writers.append((png_name, lambda path: plots.plot_tenant_delay(path, result, inputs.cluster)))
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
    try:
        return simulate(trace, cluster, scheduler, config, decision_log=decision_log, progress=progress)
    finally:
        if progress is not None:
            progress.close()  # a line of its own, interrupted or not: what follows must not overwrite it


def _gzip_text(path: Path) -> TextIO:
    """A text file that `path` receives gzip-compressed, at gzip's default level 6: the rounds of a decision
    log repeat long runs of keys that only lazy matching (levels 4 and up) finds, so on cluster400's sjf/coordl
    log (416 MB) level 1 leaves 53 MB and level 6 26 MB, for 3 s more CPU in a run of over a minute. The
    header carries no time stamp, so equal runs write equal bytes."""
    return io.TextIOWrapper(gzip.GzipFile(path, "wb", compresslevel=6, mtime=0), encoding="utf-8")


def run_generate(args: argparse.Namespace) -> int:
    """Write the synthetic trace the options describe, job by job (in the same memory at any length). Everything
    is checked before a job is made: the file's extension and path (the file is made at once, and becomes `--out`
    only once whole), then the knobs' bounds, on average and then on the arrivals themselves (`trace_size`)."""
    try:
        with writing_trace(args.out) as file:
            config = GeneratorConfig(
                jobs=args.jobs,
                duration_seconds=args.duration,
                arrivals_per_hour=args.arrivals_per_hour,
                sharing=args.sharing,
                gpu_speed_scale=args.gpu_speed_scale,
                irregular=args.irregular,
                seed=args.seed,
            )
            count, last = trace_size(config)
            if not count:
                raise SimInputError(f"no job arrives within {format_duration(args.duration)} at this arrival rate")
            write_jobs(file, trace_format(args.out), generate_jobs(config, count))
    except SimInputError as exc:
        return fail("sim generate", exc)
    except KnobError as exc:  # named by the options that set the knobs
        options = ", ".join(f"--{knob.replace('_', '-')}" for knob in exc.knobs)
        return fail("sim generate", SimInputError(f"{options}: {exc.rule}"))
    except OSError as exc:
        where = f"{args.out} (a symlink to {os.readlink(args.out)})" if args.out.is_symlink() else args.out
        return fail("sim generate", SimInputError(f"cannot write {where}: {exc.strerror or exc}"))
    print(f"wrote {count} jobs arriving over {format_duration(last)} to {args.out}")
    return 0
