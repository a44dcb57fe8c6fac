"""Finding policies and cache systems by name, and pairing them into a scheduler.

Built-in policies are listed here; a site adds its own by installing a package that declares an entry point
in the `silod.policies` group whose object is a zero-argument callable returning a `Policy` (a class with
a no-argument constructor is one); a factory with a parameter named `options` also takes knobs from a scenario
or the command line (`policies/options.py`). A cache system is the storage side of the paper's comparisons: `silod`
lets the policy allocate cache and remote IO with SiloDPerf (falling back to SiloD's greedy storage when
the policy decides compute only), keeping irregular jobs in a storage partition of their own
(`partition.py`); the baselines run the policy cache-oblivious (vanilla estimator) and allocate storage
their own way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import entry_points

from datamgr.scheduler.colocation_view import ColocationPolicy
from datamgr.scheduler.partition import IrregularPartition
from datamgr.scheduler.perf import Estimator, SiloDPerf, VanillaPerf
from datamgr.scheduler.policies.options import PolicyOptions, declared_keys
from datamgr.scheduler.policy import Decision, MergedNotes, Policy, current_placements
from datamgr.scheduler.snapshot import Snapshot
from silodlib.imports import import_named

ENTRY_POINT_GROUP = "silod.policies"

PolicyFactory = Callable[..., Policy]  # no arguments, or `options` (a `PolicyOptions`) where it takes knobs

# name -> "module:attribute" of a zero-argument factory; imported on first use.
BUILTIN_POLICIES: dict[str, str] = {
    "fifo": "datamgr.scheduler.policies.fifo:FifoPolicy",
    "greedy": "datamgr.scheduler.policies.greedy:GreedyStorage",
    "sjf": "datamgr.scheduler.policies.sjf:MultiResourceSJF",
    "gavel": "datamgr.scheduler.policies.gavel:GavelMaxMin",
    "tiresias-las": "datamgr.scheduler.policies.tiresias:tiresias_las",
    "tiresias-gittins": "datamgr.scheduler.policies.tiresias:tiresias_gittins",
    "tiresias-silod": "datamgr.scheduler.policies.tiresias:tiresias_silod",
    "yarn-cs": "datamgr.scheduler.policies.yarn:yarn_cs",
    "best-effort": "datamgr.scheduler.policies.yarn:best_effort",
    "srtf": "datamgr.scheduler.policies.remaining:srtf",
    "srsf": "datamgr.scheduler.policies.remaining:srsf",
    "fitgpp": "datamgr.scheduler.policies.fitgpp:fitgpp",
    "lrtp": "datamgr.scheduler.policies.fitgpp:lrtp",
    "rand": "datamgr.scheduler.policies.fitgpp:rand",
    "fitgpp-silod": "datamgr.scheduler.policies.fitgpp:fitgpp_silod",
    "fitgpp-fifo": "datamgr.scheduler.policies.fitgpp:fitgpp_fifo",
    "hived": "datamgr.scheduler.policies.hived:hived",
    "quota": "datamgr.scheduler.policies.hived:quota",
    "private": "datamgr.scheduler.policies.hived:private",
    "hived-silod": "datamgr.scheduler.policies.hived_silod:hived_silod",
}

# Co-location policies (Harmony's world: job groups on machines, `colocation_view.ColocationPolicy`), run by
# the co-location simulator on a co-location scenario; name -> "module:attribute" of a zero-argument factory.
COLOCATION_POLICIES: dict[str, str] = {
    "harmony": "datamgr.scheduler.policies.harmony:harmony_policy",
    "harmony-silod": "datamgr.scheduler.policies.harmony:harmony_silod_policy",
    "isolated": "datamgr.scheduler.policies.isolated:isolated_policy",
    "naive": "datamgr.scheduler.policies.naive:naive_policy",
}
# What `silod sim compare` runs on a co-location scenario unless told otherwise; Isolated is the paper's baseline.
DEFAULT_COLOCATION_POLICIES = ("isolated", "naive", "harmony")

# cache system -> the storage policy its baseline allocates with ("silod": the policy's own, SiloDPerf).
CACHE_SYSTEMS: dict[str, str | None] = {
    "silod": None,
    "alluxio": "datamgr.scheduler.baselines:AlluxioStorage",
    "coordl": "datamgr.scheduler.baselines:CoorDLStorage",
    "quiver": "datamgr.scheduler.baselines:QuiverStorage",
    "quiver-stable": "datamgr.scheduler.baselines:stable_quiver",
}
# The cache systems the paper compares: what `silod sim compare` and the sharing sweep run unless told otherwise.
# A variant registered beside them (`quiver-stable`) is opt-in: it answers a question the paper does not ask.
PAPER_CACHE_SYSTEMS = ("silod", "alluxio", "coordl", "quiver")


class UnknownPolicy(ValueError):
    """A policy or cache-system name that nothing registers (the message lists the known ones), or options a
    policy does not take (the message names the policy and the option)."""


def _import(target: str) -> PolicyFactory:
    factory: PolicyFactory = import_named(target)
    return factory


def _entry_point_factories() -> dict[str, Callable[[], PolicyFactory]]:
    return {ep.name: ep.load for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_policies() -> list[str]:
    """Every policy name `load_policy` accepts: the built-ins and the installed entry points."""
    return sorted(set(BUILTIN_POLICIES) | set(_entry_point_factories()))


def unknown_policy(name: object, *also: str) -> UnknownPolicy | None:
    """Why `name` names no policy, listing the known ones (`also` first: names a caller takes besides, such as the
    data manager's `external`), or None if it names one. Only a name that is no built-in one costs a look at the
    installed packages' entry points, which imports none of them."""
    if name in also or name in BUILTIN_POLICIES:
        return None
    known = available_policies()
    if name in known:
        return None
    listed = ", ".join([*also, *known])
    if name in COLOCATION_POLICIES:
        return UnknownPolicy(_colocation_refusal(name, listed))
    return UnknownPolicy(f"{name!r} is unknown; known policies: {listed}")


def _colocation_refusal(name: str, listed: str) -> str:
    """Harmony's policies place jobs on machines' CPUs, RAM and GPUs, which only the simulator's co-location model
    has (docs/harmony.md): named where a policy of the cluster model is wanted, they are not unknown."""
    return (
        f"{name!r} is a co-location policy, which only `silod sim` runs, on a co-location scenario; known policies: "
        f"{listed}"
    )


def load_policy(name: str, options: PolicyOptions | None = None) -> Policy:
    """A fresh policy object by name; a built-in wins over an entry point of the same name. `options` go to a
    factory that takes them (a parameter named `options`); giving them to one that does not is an error."""
    if name in BUILTIN_POLICIES:
        factory = _import(BUILTIN_POLICIES[name])
    else:
        plugins = _entry_point_factories()
        if name not in plugins:
            listed = ", ".join(available_policies())
            if name in COLOCATION_POLICIES:
                raise UnknownPolicy(_colocation_refusal(name, listed))
            raise UnknownPolicy(f"unknown policy {name!r}; known policies: {listed}")
        factory = plugins[name]()
    if not options:
        return factory()
    if not takes_options(factory):
        raise UnknownPolicy(f"policy {name!r} takes no options (given {', '.join(sorted(options))})")
    try:
        return factory(options)
    except ValueError as exc:
        raise UnknownPolicy(f"policy {name!r}: {exc}") from None


def load_colocation_policy(name: str) -> ColocationPolicy:
    """A fresh co-location policy by name; raises `UnknownPolicy` listing the known ones."""
    if name not in COLOCATION_POLICIES:
        known = ", ".join(COLOCATION_POLICIES)
        raise UnknownPolicy(f"{name!r} is not a co-location policy; co-location policies: {known}")
    factory: Callable[[], ColocationPolicy] = import_named(COLOCATION_POLICIES[name])
    return factory()


def takes_options(factory: Callable[..., object]) -> bool:
    """Whether a policy factory accepts knobs (`policies/options.py`)."""
    return "options" in inspect.signature(factory).parameters


def accepts_options(name: str) -> bool:
    """Whether the policy `name` accepts knobs."""
    factory = _factory(name)
    return factory is not None and takes_options(factory)


def option_keys(name: str) -> tuple[str, ...] | None:
    """The knobs the policy `name` declares it takes (`options.takes_keys`): () for one that takes none, None
    for one that takes knobs without declaring which (it is given every knob)."""
    factory = _factory(name)
    if factory is None or not takes_options(factory):
        return ()
    return declared_keys(factory)


def _factory(name: str) -> PolicyFactory | None:
    if name in BUILTIN_POLICIES:
        return _import(BUILTIN_POLICIES[name])
    plugins = _entry_point_factories()
    return plugins[name]() if name in plugins else None


@dataclass(frozen=True)
class Scheduler:
    """A policy bound to the estimator and storage side of one cache system: what the simulator and the
    live controller run each round."""

    policy: Policy
    estimator: Estimator
    cache_system: str
    # The policy's own round length when it is a round-based scheduler (it declares `round_seconds`, as Gavel
    # does): the simulator then decides only every that many seconds. None: at every arrival and finish.
    round_seconds: float | None = None

    @property
    def name(self) -> str:
        return f"{self.policy.name}/{self.cache_system}"

    def decide(self, snapshot: Snapshot) -> Decision:
        return self.policy.schedule(snapshot, self.estimator)


def build_scheduler(policy_name: str, cache_system: str = "silod", options: PolicyOptions | None = None) -> Scheduler:
    """Pair a policy with a cache system, as the paper evaluates every scheduler x cache-system pair.

    A policy that decides storage only (such as `greedy`) gets FIFO compute, so it can drive a simulation.
    Under `silod`, irregular jobs, when there are any, get a storage partition of their own
    (`partition.IrregularPartition`).
    """
    if cache_system not in CACHE_SYSTEMS:
        raise UnknownPolicy(f"unknown cache system {cache_system!r}; known: {', '.join(CACHE_SYSTEMS)}")
    policy = load_policy(policy_name, options)
    compute = load_policy("fifo")
    baseline = CACHE_SYSTEMS[cache_system]
    if baseline is None:
        filled_in = FilledIn(policy, compute, load_policy("greedy"), False)
        return Scheduler(IrregularPartition(filled_in), SiloDPerf(), cache_system, _round_seconds(policy))
    storage = _import(baseline)()
    return Scheduler(FilledIn(policy, compute, storage, True), VanillaPerf(), cache_system, _round_seconds(policy))


def _round_seconds(policy: Policy) -> float | None:
    """The fixed round length a round-based policy declares (`round_seconds`), or None."""
    seconds = getattr(policy, "round_seconds", None)
    return None if seconds is None else float(seconds)


@dataclass(frozen=True)
class FilledIn:
    """A policy's decision with the parts it leaves open decided by others.

    Compute comes from `compute` when the policy leaves it undecided. Storage comes from `storage` when the
    policy leaves it undecided, or always when `storage_overrides` (a cache-system baseline allocates
    storage its own way whatever the scheduler would have chosen). A policy that declares
    `storage_only = True` (it never decides compute) is then not run at all: nothing of its decision would
    be used.
    """

    policy: Policy
    compute: Policy
    storage: Policy
    storage_overrides: bool

    @property
    def name(self) -> str:
        return self.policy.name

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        if self.storage_overrides and getattr(self.policy, "storage_only", False):
            decision = Decision()  # all it could decide is storage, which `storage` decides instead
        else:
            decision = self.policy.schedule(snapshot, estimator)
        placements = decision.placements
        if placements is None:
            placements = self.compute.schedule(snapshot, estimator).placements or current_placements(snapshot)
        if decision.decides_storage and not self.storage_overrides:
            return replace(decision, placements=placements)
        storage = self.storage.schedule(snapshot.with_placements(placements), estimator)
        return replace(
            storage,
            placements=placements,
            notes=MergedNotes(decision.notes, storage.notes),
            job_states=decision.job_states,
            wake_at=decision.wake_at,
        )
