"""Shipped scenarios: a cluster and a trace under one name (`silod sim --scenario NAME`).

Each scenario is a `NAME.toml` in this package: a `description`, a `[cluster]` table (the keys of a cluster
file) and either `trace = "FILE"` (a trace file next to it) or a `[generate]` table, a generator recipe whose
keys are `GeneratorConfig`'s fields (`duration` takes "4w"-style durations, `gpu_demand` is a table of GPU
count to probability) and whose seed makes it reproducible; with `kind = "te-be"` it is instead a recipe of
FitGpp's trial-and-error and best-effort jobs (`te_be.TeBeConfig`'s fields: jobs, seed, te_share, load,
grace_scale, workloads, and min_duration for `min_seconds`), generated on the scenario's cluster; with
`kind = "tenants"` a recipe of HiveD's tenants (`tenant_trace.TenantTraceConfig`'s fields: jobs, seed, load),
whose VCs (node cells by the tenants' quotas) become the cluster's tenants.
A scenario with `model = "colocation"` is instead one of Harmony's machine clusters and job profiles, for the
co-location simulator (`colocation_inputs.py` gives its keys; `load_colocation_scenario` reads it).
Optional: a `[simulation]` table (`round`, the longest time between rounds, and `preemption_cost`, both
durations), and a `[policy]` table of knobs for the policies that take them (`policies/options.py`); the
command line overrides both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TypeVar

from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.cluster import cluster_from_table, with_tenants
from datamgr.scheduler.sim.colocation_inputs import (
    ColocationScenario,
    colocation_scenario_from_document,
    is_colocation_document,
    shipped_document,
)
from datamgr.scheduler.sim.fields import SimInputError, check_keys, read_field
from datamgr.scheduler.sim.generator import GPU_DEMAND, GeneratorConfig, generate
from datamgr.scheduler.sim.model import MAX_PREEMPTION_SECONDS, MIN_ROUND_SECONDS, ClusterSpec, TraceJob
from datamgr.scheduler.sim.te_be import TeBeConfig, generate_te_be
from datamgr.scheduler.sim.tenant_trace import (
    PAPER_TENANTS,
    TenantTraceConfig,
    generate_tenant_trace,
    tenant_shares,
    vc_nodes,
)
from datamgr.scheduler.sim.trace import load_trace

U = TypeVar("U")
_KEYS = ("description", "cluster", "trace", "generate", "simulation", "policy")
_RECIPE_REQUIRED = ("arrivals_per_hour", "sharing", "gpu_speed_scale", "irregular", "seed")
_GENERATE_KEYS = ("kind", "jobs", "duration", "gpu_demand", *_RECIPE_REQUIRED)
_KINDS = ("philly", "te-be", "tenants")
_TE_BE_REQUIRED = ("kind", "jobs", "seed", "te_share", "load")
_TE_BE_KEYS = (*_TE_BE_REQUIRED, "grace_scale", "min_duration", "workloads")
_TENANTS_KEYS = ("kind", "jobs", "seed", "load")
_SIMULATION_KEYS = ("round", "preemption_cost")
# `[simulation]`'s settings, read as `silod sim --round` and `--preemption-cost` read theirs (model.py says why
# they are bounded).
ROUND = fields.at_least(
    fields.positive_duration, MIN_ROUND_SECONDS, f"{MIN_ROUND_SECONDS:g} s, the live data manager's"
)
PREEMPTION_COST = fields.at_most(
    fields.duration,
    MAX_PREEMPTION_SECONDS,
    f"a day ({MAX_PREEMPTION_SECONDS:,.0f} s): it is paid at every preemption, and checkpoints restore in minutes",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    cluster: ClusterSpec
    trace: list[TraceJob]
    recipe: GeneratorConfig | None = None  # how a Philly-like trace was generated; None for any other trace
    round_seconds: float | None = None  # None: the simulator's default
    preemption_seconds: float | None = None
    policy_options: Mapping[str, object] = field(default_factory=dict)


def available_scenarios() -> list[str]:
    """The names `load_scenario` accepts."""
    names = (entry.name for entry in resources.files(__name__).iterdir())
    return sorted(name.removesuffix(".toml") for name in names if name.endswith(".toml"))


def load_scenario(name: str) -> Scenario:
    """The shipped scenario `name`, its trace read or generated. Raises `SimInputError` for an unknown name."""
    if name not in available_scenarios():
        raise SimInputError(f"unknown scenario {name!r}; known scenarios: {', '.join(available_scenarios())}")
    with resources.as_file(resources.files(__name__)) as directory:
        return _load(name, directory / f"{name}.toml")


def is_colocation_scenario(name: str) -> bool:
    """Whether the shipped scenario `name` is a co-location one (Harmony's machines and job profiles)."""
    document = shipped_document(name)
    return document is not None and is_colocation_document(document)


def is_generated_scenario(name: str) -> bool:
    """Whether the shipped scenario `name` draws a Philly-like trace from a recipe (its `Scenario.recipe`, which a
    sharing sweep redraws), read from its file without generating the trace: listing the generated scenarios in
    an error message must not cost seconds of trace generation."""
    return generator_kind(name) == "philly"


def generator_kind(name: str) -> str | None:
    """The kind of the shipped GPU scenario `name`'s `[generate]` recipe (`philly`, `te-be`, `tenants`), read from
    its file without generating the trace; None for a scenario that replays a trace file, a co-location scenario
    or an unknown name."""
    document = shipped_document(name)
    if document is None or is_colocation_document(document):
        return None
    generate = document.get("generate")
    return None if generate is None else _kind(generate, f"scenario {name}: [generate]")


def load_colocation_scenario(name: str) -> ColocationScenario:
    """The shipped co-location scenario `name`, its jobs generated. Raises `SimInputError` for any other name."""
    document = shipped_document(name)
    if document is None or not is_colocation_document(document):
        known = [n for n in available_scenarios() if is_colocation_scenario(n)]
        raise SimInputError(f"no co-location scenario {name!r}; co-location scenarios: {', '.join(known)}")
    return colocation_scenario_from_document(name, document, f"scenario {name}")


def _load(name: str, path: Path) -> Scenario:
    document = fields.load_toml(path)
    where = str(path)
    if is_colocation_document(document):
        raise SimInputError(
            f"scenario {name!r} models co-located CPU jobs on machines (Harmony), not GPUs: run it with a co-location "
            "policy (silod sim --scenario NAME --policy harmony, isolated or naive)"
        )
    check_keys(document, _KEYS, ("description", "cluster"), where)
    if ("trace" in document) == ("generate" in document):
        raise SimInputError(f"{where}: give either trace or [generate], not both or neither")
    cluster = document["cluster"]
    if not isinstance(cluster, dict):
        raise SimInputError(f"{where}: cluster: expected a [cluster] table")
    simulation = _table(document.get("simulation", {}), f"{where}: [simulation]")
    check_keys(simulation, _SIMULATION_KEYS, (), f"{where}: [simulation]")
    spec = cluster_from_table(cluster, f"{where}: [cluster]", path.parent)
    recipe = None
    if "trace" in document:
        trace = load_trace(path.parent / read_field(fields.text, document["trace"], f"{where}: trace"))
    elif _kind(document["generate"], f"{where}: [generate]") == "tenants":
        spec, trace = _tenants_scenario(document["generate"], spec, f"{where}: [generate]")
    elif _kind(document["generate"], f"{where}: [generate]") == "te-be":
        try:
            trace = generate_te_be(_te_be_recipe(document["generate"], f"{where}: [generate]"), spec)
        except ValueError as exc:
            raise SimInputError(f"{where}: [generate]: {exc}") from None
    else:
        recipe = _recipe(document["generate"], f"{where}: [generate]")
        trace = generate(recipe)

    def setting(key: str, read: fields.Reader[float]) -> float | None:
        raw = simulation.get(key)
        return None if raw is None else read_field(read, raw, f"{where}: [simulation] {key}")

    return Scenario(
        name=name,
        description=read_field(fields.text, document["description"], f"{where}: description"),
        cluster=spec,
        trace=trace,
        recipe=recipe,
        round_seconds=setting("round", ROUND),
        preemption_seconds=setting("preemption_cost", PREEMPTION_COST),
        policy_options=_table(document.get("policy", {}), f"{where}: [policy]"),
    )


def _table(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise SimInputError(f"{where}: expected a table")
    return value


class _Recipe:
    """A `[generate]` table's keys read typed, a bad value refused naming the table and the key."""

    def __init__(self, table: Mapping[str, object], where: str) -> None:
        self._table = table
        self._where = where

    def need(self, key: str, read: fields.Reader[fields.T]) -> fields.T:
        return read_field(read, self._table[key], f"{self._where}: {key}")

    def get(self, key: str, read: fields.Reader[fields.T], otherwise: U) -> fields.T | U:
        """The key's value, or `otherwise` when the table leaves it out."""
        return self.need(key, read) if key in self._table else otherwise


def _kind(value: object, where: str) -> str:
    kind = _table(value, where).get("kind", "philly")
    if kind not in _KINDS:
        raise SimInputError(f"{where}: kind: {kind!r} is not one of {', '.join(_KINDS)}")
    return str(kind)


def _gpu_demand(value: object, where: str) -> tuple[tuple[int, float], ...]:
    """`{1 = 0.5, 2 = 0.1, ...}`: GPU counts (as TOML keys) to probabilities."""
    table = _table(value, where)
    return tuple(
        (read_field(fields.positive_int, gpus, where), read_field(fields.fraction, share, f"{where}: {gpus}"))
        for gpus, share in table.items()
    )


def _recipe(table: object, where: str) -> GeneratorConfig:
    """Every knob is spelled out (only one of jobs and duration), so a change of the generator's defaults
    cannot silently change a shipped scenario."""
    if not isinstance(table, dict):
        raise SimInputError(f"{where}: expected a table")
    check_keys(table, _GENERATE_KEYS, _RECIPE_REQUIRED, where)
    recipe = _Recipe(table, where)
    try:
        return GeneratorConfig(
            jobs=recipe.get("jobs", fields.positive_int, None),
            duration_seconds=recipe.get("duration", fields.duration, None),
            arrivals_per_hour=recipe.need("arrivals_per_hour", fields.positive_number),
            sharing=recipe.need("sharing", fields.fraction),
            gpu_speed_scale=recipe.need("gpu_speed_scale", fields.positive_number),
            irregular=recipe.need("irregular", fields.fraction),
            seed=recipe.need("seed", fields.whole_number),
            gpu_demand=_gpu_demand(table["gpu_demand"], f"{where}: gpu_demand")
            if "gpu_demand" in table
            else GPU_DEMAND,
        )
    except ValueError as exc:
        raise SimInputError(f"{where}: {exc}") from None


def _tenants_scenario(table: dict[str, object], cluster: ClusterSpec, where: str) -> tuple[ClusterSpec, list[TraceJob]]:
    """HiveD's tenants on `cluster`: their VCs (node cells in proportion to their quotas) and their jobs."""
    check_keys(table, _TENANTS_KEYS, _TENANTS_KEYS, where)
    recipe = _Recipe(table, where)
    try:
        config = TenantTraceConfig(
            jobs=recipe.need("jobs", fields.positive_int),
            seed=recipe.need("seed", fields.whole_number),
            load=recipe.need("load", fields.positive_number),
        )
        cells = vc_nodes(PAPER_TENANTS, cluster.nodes)
    except ValueError as exc:
        raise SimInputError(f"{where}: {exc}") from None
    shared = with_tenants(cluster, tenant_shares(cells), where)
    return shared, generate_tenant_trace(config, cluster.gpus_per_node, cells)


def _te_be_recipe(table: dict[str, object], where: str) -> TeBeConfig:
    check_keys(table, _TE_BE_KEYS, _TE_BE_REQUIRED, where)
    recipe, default = _Recipe(table, where), TeBeConfig(jobs=1, seed=0)
    try:
        return TeBeConfig(
            jobs=recipe.need("jobs", fields.positive_int),
            seed=recipe.need("seed", fields.whole_number),
            te_share=recipe.need("te_share", fields.fraction),
            load=recipe.need("load", fields.positive_number),
            grace_scale=recipe.get("grace_scale", fields.positive_number, default.grace_scale),
            min_seconds=recipe.get("min_duration", fields.duration, default.min_seconds),
            workloads=recipe.get("workloads", fields.text, default.workloads),
        )
    except ValueError as exc:
        raise SimInputError(f"{where}: {exc}") from None
