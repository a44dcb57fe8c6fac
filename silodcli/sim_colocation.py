"""`silod sim` and `silod sim compare` on co-location inputs: Harmony's job groups on machines.

The same commands as for GPU clusters; what tells them apart is the input: a shipped scenario with
`model = "colocation"` (`harmony-80`, `harmony-80-poisson`), or a cluster file with `machines` and no `nodes`
beside a co-location trace. Options that only mean something on GPU clusters (cache systems, rounds,
preemption cost, policy knobs, tenants, remote IO scale, time limit, decision log) are refused by name rather
than ignored.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from datamgr.scheduler.registry import (
    COLOCATION_POLICIES,
    DEFAULT_COLOCATION_POLICIES,
    UnknownPolicy,
    load_colocation_policy,
)
from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.colocation_engine import InvalidPlan, simulate_colocation
from datamgr.scheduler.sim.colocation_inputs import (
    is_colocation_cluster,
    load_colocation_cluster,
    load_colocation_trace,
)
from datamgr.scheduler.sim.colocation_model import ColocationCluster, ColocationJob, ColocationResult
from datamgr.scheduler.sim.colocation_report import ColocationSummary
from datamgr.scheduler.sim.fields import SimInputError
from datamgr.scheduler.sim.model import SimulationStalled
from datamgr.scheduler.sim.scenarios import is_colocation_scenario, load_colocation_scenario
from silodcli.exits import EXIT_FAILED, fail
from silodcli.processes import in_workers, run_in_processes, say_when_done
from silodcli.progress import ProgressLine
from silodcli.sim_outputs import input_files, refuse_overwriting_inputs, staged_outputs
from silodcli.tables import render_table

# option -> (its attribute, what it is when not given): the GPU-only options a co-location run refuses.
_GPU_ONLY: dict[str, tuple[str, object]] = {
    "--round": ("round_seconds", None),
    "--preemption-cost": ("preemption_seconds", None),
    "--policy-option": ("policy_options", []),
    "--time-limit": ("time_limit", None),
    "--decision-log": ("decision_log", False),
    "--tenants": ("tenants", None),
    "--remote-io-scale": ("remote_io_scale", 1.0),
    "--seed": ("seed", 0),  # the co-location policies draw nothing at random; a scenario's jobs have their own seed
}


RUN_FILES = ("jobs.csv", "timeline.csv", "summary.json", "utilisation.png")  # what a run writes into its --out
COMPARE_FILES = ("compare.csv", "compare.md", "utilisation.png")  # a comparison's own, beside a directory per run


@dataclass(frozen=True)
class ColocationInputs:
    name: str  # the scenario, or the trace file's stem: names the default output directory
    cluster: ColocationCluster
    trace: list[ColocationJob]


def colocation_inputs(args: argparse.Namespace) -> ColocationInputs | None:
    """The co-location scenario or files the arguments name, or None when they name GPU inputs (or none)."""
    if args.scenario is not None:
        if not is_colocation_scenario(args.scenario):
            return None
        if args.trace is not None or args.cluster is not None:
            raise SimInputError("--scenario replaces --trace and --cluster; give one or the other")
        scenario = load_colocation_scenario(args.scenario)
        return ColocationInputs(scenario.name, scenario.cluster, scenario.trace)
    if args.cluster is None or not is_colocation_cluster(fields.load_toml(args.cluster)):
        return None
    if args.trace is None:
        raise SimInputError("give --trace FILE with the co-location --cluster FILE")
    return ColocationInputs(args.trace.stem, load_colocation_cluster(args.cluster), load_colocation_trace(args.trace))


def _refuse_gpu_options(args: argparse.Namespace, cache_option: str | None) -> None:
    """Refuses, by name, the GPU-only options given; `cache_option` names the cache-system option if one was."""
    given = [option for option, (attribute, unset) in _GPU_ONLY.items() if getattr(args, attribute, unset) != unset]
    if cache_option is not None:
        given.append(cache_option)
    if given:
        raise SimInputError(
            f"{', '.join(given)}: not used by the co-location simulator (options of the GPU simulator; Harmony's "
            "policies decide when to regroup and draw nothing at random, and a co-location cluster file gives its "
            "remote IO and cache); leave them out"
        )


def run_colocation_sim(args: argparse.Namespace, inputs: ColocationInputs) -> int:
    """`silod sim` on co-location inputs: one policy's run, its summary printed and its files written."""
    try:
        _refuse_gpu_options(args, None if args.cache_system is None else "--cache-system")
        policy_name = args.policy or "harmony"
        if policy_name not in COLOCATION_POLICIES:
            _refuse_policy(policy_name)
        out = fields.output_directory(args.out or Path(f"sim-{inputs.name}-{policy_name}"))
        refuse_overwriting_inputs(out, RUN_FILES, input_files(args))
    except (SimInputError, UnknownPolicy) as exc:
        return fail("sim", exc)
    try:
        with staged_outputs(out, RUN_FILES) as staging:
            run = simulate_colocation_into(inputs, policy_name, staging, show_progress=True)
    except (SimulationStalled, InvalidPlan) as exc:
        return fail("sim", exc, EXIT_FAILED)
    from datamgr.scheduler.sim import colocation_report

    print(colocation_report.summary_text(run.summary))
    print(f"wrote {out}/: {', '.join(run.files)}")
    return 0


def run_colocation_compare(args: argparse.Namespace, inputs: ColocationInputs) -> int:
    """`silod sim compare` on co-location inputs: every policy on the same jobs (by default isolated, naive and
    harmony), speedups over `isolated` (the paper's baseline) or --baseline."""
    policies: list[str] = list(args.policies or DEFAULT_COLOCATION_POLICIES)
    baseline = args.baseline or ("isolated" if "isolated" in policies else policies[0])
    try:
        _refuse_gpu_options(args, None if args.cache_systems is None else "--cache-systems")
        for name in policies:
            if name not in COLOCATION_POLICIES:
                _refuse_policy(name)
        if baseline not in policies:
            raise SimInputError(f"--baseline {baseline} is not one of --policies {','.join(policies)}")
        out = fields.output_directory(args.out or Path(f"sim-{inputs.name}-compare"))
        names = [*COMPARE_FILES, *(f"{policy}/{name}" for policy in policies for name in RUN_FILES)]
        refuse_overwriting_inputs(out, names, input_files(args))
    except (SimInputError, UnknownPolicy) as exc:
        return fail("sim compare", exc)
    from datamgr.scheduler.sim import colocation_report, plots

    workers = in_workers(len(policies), args.jobs)
    try:
        with staged_outputs(out, names, RUN_FILES) as staging:
            calls = [partial(simulate_colocation_into, inputs, name, staging / name, not workers) for name in policies]
            runs = run_in_processes(calls, args.jobs, say_when_done(policies, workers))
            summaries = [run.summary for run in runs]
            colocation_report.write_comparison(staging / "compare.csv", staging / "compare.md", summaries, baseline)
            plots.plot_utilisation(staging / "utilisation.png", {run.result.policy: run.result for run in runs})
    except (SimulationStalled, InvalidPlan) as exc:
        return fail("sim compare", exc, EXIT_FAILED)
    print(render_table(colocation_report.COMPARISON_HEADERS, colocation_report.comparison_rows(summaries, baseline)))
    print(f"speedups are over {baseline}")
    print(f"wrote {out}/: compare.csv, compare.md, utilisation.png, and in each POLICY/: {', '.join(runs[0].files)}")
    return 0


@dataclass(frozen=True)
class ColocationRun:
    result: ColocationResult
    summary: ColocationSummary
    files: tuple[str, ...]


def simulate_colocation_into(
    inputs: ColocationInputs, policy_name: str, out: Path, show_progress: bool
) -> ColocationRun:
    """One policy's run on `inputs`, its files written into `out`: what a `compare` worker runs."""
    from datamgr.scheduler.sim import colocation_report, plots

    policy = load_colocation_policy(policy_name)
    progress = ProgressLine(policy_name) if show_progress else None
    result = simulate_colocation(inputs.trace, inputs.cluster, policy, progress)
    if progress is not None:
        progress.close()
    summary = colocation_report.summarize_colocation(result)
    out.mkdir(parents=True, exist_ok=True)
    colocation_report.write_jobs_csv(out / "jobs.csv", result)
    colocation_report.write_timeline_csv(out / "timeline.csv", result)
    colocation_report.write_summary_json(out / "summary.json", summary)
    plots.plot_utilisation(out / "utilisation.png", {policy_name: result})
    return ColocationRun(result, summary, RUN_FILES)


def _refuse_policy(name: str) -> str:
    raise UnknownPolicy(
        f"{name!r} is not a co-location policy, and these inputs are a co-location cluster; "
        f"co-location policies: {', '.join(COLOCATION_POLICIES)}"
    )
