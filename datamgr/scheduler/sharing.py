"""Sharing a divisible resource (remote IO, cache) among claimants without giving any more than they can use.

Max-min fair water-filling: every job gets an equal share; what a job cannot use (its cap) is shared again
among the others. `fill_needs_then_caps` does it twice, first up to what each job needs now, then up to what
it could ever use: the remote IO of SiloD's greedy policy and of every baseline. Strict priority
(`fill_in_order`) is the other way: each claimant in turn takes all it can. Cache a policy leaves idle goes
by priority to the most cache-efficient datasets (`fill_idle_cache`). Pure; results are whole units that
never exceed the budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from datamgr.scheduler import perf
from datamgr.scheduler.snapshot import JobState


def water_fill(caps: Mapping[str, float], budget: float, floor: Mapping[str, int] | None = None) -> dict[str, int]:
    """Shares of `budget` per key, each at most `caps[key]`, starting from `floor` (already granted, and
    counted inside the budget). Keys are served in sorted order so rounding is deterministic.

    The filling goes in passes: each hungry key in turn gets an equal share of what is left (at least one
    unit), or what it still has room for. While there is at least a unit per hungry key, a pass cannot run
    out midway, so its outcome does not depend on the order: those passes are done on the keys sorted by
    room, giving the keys that fill up their room and the others the share, in time proportional to the
    keys that fill up (`_whole_passes`). The last passes, which run out midway, go key by key.
    Every baseline splits remote IO over every running job with it each round: clamps are comparisons."""
    shares = {key: int(floor.get(key, 0)) for key in caps} if floor else dict.fromkeys(caps, 0)
    left = int(budget) - sum(shares.values())
    if left <= 0:
        return shares
    limits = {key: int(cap) for key, cap in caps.items() if shares[key] < cap}
    left = _whole_passes(shares, limits, left)
    hungry = sorted(key for key in limits if shares[key] < limits[key])
    while left > 0 and hungry:
        share = max(1, left // len(hungry))
        still_hungry = []
        for key in hungry:
            room = limits[key] - shares[key]
            extra = min(min(share, room), left)  # two-argument min compiles to comparisons; three would not
            shares[key] += extra
            left -= extra
            if shares[key] < limits[key]:
                still_hungry.append(key)
            if left == 0:
                break
        hungry = still_hungry
    return shares


def _whole_passes(shares: dict[str, int], limits: Mapping[str, int], left: int) -> int:
    """`water_fill`'s passes while `left` holds a unit for every key below its limit, applied to `shares`;
    returns what is left."""
    room = {key: limit - shares[key] for key, limit in limits.items()}
    by_room = sorted(room, key=room.__getitem__)
    full = 0  # by_room[:full] have reached their limits
    level = 0  # what each of by_room[full:] has been given so far
    while full < len(by_room) and left >= len(by_room) - full > 0:
        share = left // (len(by_room) - full)
        while full < len(by_room) and room[by_room[full]] - level <= share:
            left -= room[by_room[full]] - level
            shares[by_room[full]] = limits[by_room[full]]
            full += 1
        left -= share * (len(by_room) - full)
        level += share
    for key in by_room[full:]:
        shares[key] += level
    return left


def fill_needs_then_caps(needs: Mapping[str, float], caps: Mapping[str, float], budget: float) -> dict[str, int]:
    """Shares of `budget`: max-min fair up to `needs` (what each key can use now), then what is left max-min
    fair up to `caps` (the most it could ever use; every cap at least its need).

    Work-conserving: while the needs add up to more than the budget, all of it goes out and no key gets
    more than it needs, so a key that needs little (a job whose cache serves most of its reads) does not
    hold a fair share it would leave idle. Only once every need is met does the rest go further, which is
    harmless for remote IO (a job fetches only what it misses) and covers a need that grows before the
    next allocation."""
    return water_fill(caps, budget, floor=water_fill(needs, budget))


def fill_in_order(caps: Mapping[str, float], budget: float, floor: Mapping[str, int] | None = None) -> dict[str, int]:
    """Shares of `budget` by strict priority in the order of `caps`: each key takes all it can, up to its cap,
    before the next gets any. `floor` is already granted (to these keys or others) and counted inside the
    budget."""
    shares = {key: int((floor or {}).get(key, 0)) for key in caps}
    left = int(budget) - sum((floor or {}).values())
    for key, cap in caps.items():
        if left <= 0:
            break  # the budget is spent: the keys after this one keep their floors
        extra = int(cap) - shares[key]
        if extra > 0:
            extra = min(extra, left)
            shares[key] += extra
            left -= extra
    return shares


def fill_idle_cache(cache: Mapping[str, int], running: Iterable[JobState], capacity: int) -> dict[str, int]:
    """`cache` with the capacity it leaves idle given to the datasets of `running` jobs (jobs that will run,
    on their whole gang), most cache-efficient first (Algorithm 2's order: f*/d summed over the dataset's
    readers), each up to its size.

    Idle cache saves no remote IO; cached, it lowers what the jobs need and frees IO for the others."""
    running = list(running)
    sizes = {job.dataset_uri: job.dataset_bytes for job in running}
    efficiency = perf.cache_efficiencies(((j.dataset_uri, perf.ideal_rate(j, j.gpus)) for j in running), sizes)
    by_efficiency = {uri: sizes[uri] for uri in sorted(sizes, key=lambda uri: (-efficiency[uri], uri))}
    return dict(cache) | fill_in_order(by_efficiency, capacity, floor=cache)
