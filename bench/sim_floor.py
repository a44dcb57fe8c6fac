"""The simulator's floor: what a whole run costs when its policy costs nothing.

For each policy (default fifo, the one with the tightest goal; on the `silod` cache system) it simulates a
scenario (default `cluster400`) three times:

- as `silod sim` does, recording every decision the policy makes (not timed);
- replaying those decisions, timed: the policy is replaced by one that hands back, round by round, the
  decision the real policy made for the same snapshot. The engine still builds every snapshot, checks every
  decision and applies it, integrates progress, models the cache and takes the timeline samples; only the
  policy's own work is gone. The replay checks that each round falls at the recorded time, so it retraces
  the same run, and that the runs end with the same outcomes;
- as `silod sim` does again, timed, without recording.

The table gives, in CPU seconds of the simulation alone (no files written): the whole run, the replay (the
engine's floor: what any policy round contract that hands the policy a whole snapshot and takes back a whole
decision costs on this scenario), the policy's share (the difference), the rounds, the jobs present and running
per round, the share of the running jobs whose allocation (placement or remote IO) a round's decision changes,
and the floor per present job per round, against the goals of `sim_scenario.py` (20 s for fifo and greedy, 40 s
for the others). A floor above its goal means no policy, however fast, meets it without the engine's rounds
themselves getting cheaper; the CHANGED share is how much cheaper an engine that touched only the jobs a round
changes could make them, since it must still apply each of those.

Both timed runs start with the garbage collector's generations frozen (`gc.freeze`), so that the recorded
decisions held in memory cost neither of them collection work. Progress goes to stderr, the table to stdout.
Exits 1 if a replay strays from its recording.

    PYTHONPATH=. .venv/bin/python bench/sim_floor.py [--scenario NAME] [--policies P,..] [--cache-system C]
        [--days DAYS]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from bench.sim_scenario import goal_seconds
from datamgr.scheduler.perf import Estimator
from datamgr.scheduler.policy import Decision, Policy
from datamgr.scheduler.registry import Scheduler, build_scheduler
from datamgr.scheduler.sim.engine import simulate
from datamgr.scheduler.sim.model import SimConfig, SimResult
from datamgr.scheduler.sim.scenarios import available_scenarios, load_scenario
from datamgr.scheduler.snapshot import Snapshot
from silodcli.tables import render_table

DEFAULT_POLICIES = "fifo"  # three whole runs each; gavel and hived take minutes apiece


class ReplayDiverged(RuntimeError):
    """The replayed run left its recording: a round the recording does not have, a recorded round it never
    reached, or jobs finishing otherwise."""


class Allocations:
    """The running jobs' placements and remote IO as the decisions so far leave them: what `changed` compares a
    round's decision with."""

    def __init__(self) -> None:
        self.placements: dict[str, Mapping[str, int]] = {}
        self.io: dict[str, float] = {}

    def changed(self, decision: Decision) -> tuple[int, int]:
        """Take `decision` and say (jobs it runs, jobs whose placement or IO allocation it changes): those it
        starts, stops, moves or gives another rate. The second is the least any engine that applies per-job
        allocations must touch in the round, however incrementally it keeps the rest."""
        placements = self.placements if decision.placements is None else decision.placements
        running = {job_id: placement for job_id, placement in placements.items() if placement}
        io = decision.io_bytes_per_sec or {}
        rates = {job_id: float(io.get(job_id, 0)) for job_id in running}
        changed = sum(
            1
            for job_id in running.keys() | self.placements.keys()
            if running.get(job_id) != self.placements.get(job_id) or rates.get(job_id) != self.io.get(job_id)
        )
        self.placements, self.io = running, rates
        return len(running), changed


class _Recording:
    """The real policy, keeping each round's time and decision, and counting the jobs present, running and
    changed."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.rounds: deque[tuple[float, Decision]] = deque()
        self.present = 0  # jobs present, summed over the rounds
        self.running = 0  # jobs the decisions run, summed over the rounds
        self.changed = 0  # jobs whose allocation a decision changes, summed over the rounds
        self.allocations = Allocations()

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        decision = self.policy.schedule(snapshot, estimator)
        self.rounds.append((snapshot.time, decision))
        self.present += len(snapshot.jobs)
        running, changed = self.allocations.changed(decision)
        self.running += running
        self.changed += changed
        return decision


class _Replay:
    """A policy that costs nothing: it hands back the recorded decisions in order."""

    def __init__(self, name: str, rounds: deque[tuple[float, Decision]]) -> None:
        self.name = name
        self.rounds = rounds

    def schedule(self, snapshot: Snapshot, estimator: Estimator) -> Decision:
        if not self.rounds:
            raise ReplayDiverged(f"a round at t={snapshot.time:g}s after the last recorded one")
        when, decision = self.rounds.popleft()
        if when != snapshot.time:
            raise ReplayDiverged(f"a round at t={snapshot.time:g}s where the recording has t={when:g}s")
        return decision


@dataclass(frozen=True)
class Floor:
    policy: str
    full_cpu: float
    replay_cpu: float
    rounds: int
    job_rounds: int  # jobs present, summed over the rounds
    running_rounds: int  # jobs running, summed over the rounds
    changed_rounds: int  # jobs whose allocation a round's decision changes, summed over the rounds

    @property
    def present_per_round(self) -> float:
        return self.job_rounds / self.rounds if self.rounds else 0.0

    @property
    def running_per_round(self) -> float:
        return self.running_rounds / self.rounds if self.rounds else 0.0

    @property
    def changed_share(self) -> float:
        """The share of the running jobs whose allocation a round changes (`Allocations.changed`)."""
        return self.changed_rounds / self.running_rounds if self.running_rounds else 0.0

    @property
    def floor_per_job_round(self) -> float:
        """CPU seconds of the floor per present job per round."""
        return self.replay_cpu / self.job_rounds if self.job_rounds else 0.0


def _timed(run: Callable[[], SimResult]) -> tuple[SimResult, float]:
    gc.collect()
    gc.freeze()
    started = time.process_time()
    try:
        result = run()
    finally:
        elapsed = time.process_time() - started
        gc.unfreeze()
    return result, elapsed


def _outcomes(result: SimResult) -> list[tuple[str, float]]:
    return [(job.job_id, job.finish) for job in result.jobs]


def measure(scheduler: Scheduler, run: Callable[[Scheduler], SimResult]) -> Floor:
    """Record, replay and time one policy (see the module docstring)."""
    recording = _Recording(scheduler.policy)
    recorded = _outcomes(run(replace(scheduler, policy=recording)))
    rounds = len(recording.rounds)
    replay_cpu = _replay(scheduler, recording.rounds, recorded, run)  # empties the recording as it goes
    _, full_cpu = _timed(lambda: run(scheduler))
    return Floor(scheduler.name, full_cpu, replay_cpu, rounds, recording.present, recording.running, recording.changed)


def _replay(
    scheduler: Scheduler,
    rounds: deque[tuple[float, Decision]],
    recorded: list[tuple[str, float]],
    run: Callable[[Scheduler], SimResult],
) -> float:
    """The CPU seconds of `scheduler`'s run with its policy replaced by `rounds`; raises ReplayDiverged unless
    it uses every recorded round and finishes the same jobs at the same times."""
    replay = _Replay(scheduler.policy.name, rounds)
    replayed, cpu = _timed(lambda: run(replace(scheduler, policy=replay)))
    if rounds or _outcomes(replayed) != recorded:
        raise ReplayDiverged(f"{scheduler.name}: the replay ended differently from its recording")
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="cluster400", choices=available_scenarios())
    parser.add_argument("--policies", default=DEFAULT_POLICIES)
    parser.add_argument("--cache-system", default="silod")
    parser.add_argument("--days", type=float, default=None, help="cut each run short at this many days")
    args = parser.parse_args()

    scenario = load_scenario(args.scenario)
    config = SimConfig() if args.days is None else SimConfig(time_limit=args.days * 86_400.0)
    print(f"{args.scenario}: {len(scenario.trace)} jobs; {scenario.description}", file=sys.stderr)

    def run(scheduler: Scheduler) -> SimResult:
        return simulate(scenario.trace, scenario.cluster, scheduler, config)

    rows: list[tuple[str, ...]] = []
    for policy in args.policies.split(","):
        scheduler = build_scheduler(policy, args.cache_system)
        print(f"{scheduler.name}: recording, replaying, then timing the real run ...", file=sys.stderr)
        try:
            floor = measure(scheduler, run)
        except ReplayDiverged as exc:
            print(f"sim_floor: {exc}", file=sys.stderr)
            return 1
        goal = goal_seconds(policy)
        rows.append(
            (
                floor.policy,
                f"{floor.full_cpu:.1f}",
                f"{floor.replay_cpu:.1f}",
                f"{floor.full_cpu - floor.replay_cpu:.1f}",
                f"{floor.rounds:,}",
                f"{floor.present_per_round:,.0f}",
                f"{floor.running_per_round:,.0f}",
                f"{floor.changed_share:.0%}",
                f"{floor.floor_per_job_round * 1e6:.2f}",
                f"{goal:.0f}",
            )
        )
        print(f"{floor.policy}: run {floor.full_cpu:.1f} s, floor {floor.replay_cpu:.1f} s CPU", file=sys.stderr)
    headers = (
        "SCHEDULER", "RUN CPU S", "FLOOR CPU S", "POLICY CPU S", "ROUNDS", "PRESENT", "RUNNING", "CHANGED",
        "FLOOR US/JOB", "GOAL S",
    )  # fmt: skip
    print(render_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
