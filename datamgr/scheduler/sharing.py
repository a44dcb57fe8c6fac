"""Sharing a divisible resource (remote IO) among jobs without giving any more than it can use.

Max-min fair water-filling: every job gets an equal share; what a job cannot use (its cap) is shared again
among the others. This is the "fair-shared remote IO" of every baseline and the last step of SiloD's greedy
policy. Pure; results are whole bytes/s that never exceed the budget.
"""

from __future__ import annotations

from collections.abc import Mapping


def water_fill(caps: Mapping[str, float], budget: float, floor: Mapping[str, int] | None = None) -> dict[str, int]:
    """Shares of `budget` per key, each at most `caps[key]`, starting from `floor` (already granted, and
    counted inside the budget). Keys are served in sorted order so rounding is deterministic."""
    shares = {key: int((floor or {}).get(key, 0)) for key in caps}
    left = int(budget) - sum(shares.values())
    hungry = sorted(key for key in caps if shares[key] < caps[key])
    while left > 0 and hungry:
        share = max(1, left // len(hungry))
        for key in list(hungry):
            extra = min(share, int(caps[key]) - shares[key], left)
            shares[key] += extra
            left -= extra
            if shares[key] >= int(caps[key]):
                hungry.remove(key)
            if left == 0:
                break
    return shares
