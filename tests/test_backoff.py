"""The one backoff everything that retries waits by (silodlib/backoff.py): its caps and its jitter."""

from __future__ import annotations

import random

import pytest

from fuseclient.agent import RECONNECT
from silodlib.backends.retry import RetryPolicy
from silodlib.backoff import Backoff


def test_the_cap_doubles_from_the_base_delay_up_to_the_maximum_and_never_overflows() -> None:
    backoff = Backoff(base_delay=0.5, max_delay=3.0)
    assert [backoff.cap(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.cap(10_000) == 3.0


@pytest.mark.parametrize("floor", [0.0, 0.5, 1.0])
def test_a_wait_is_drawn_between_its_floor_share_of_the_cap_and_the_cap(floor: float) -> None:
    backoff, rng = Backoff(base_delay=1.0, max_delay=8.0, floor=floor), random.Random(3)
    for failures in range(1, 8):
        cap = backoff.cap(failures)
        waits = [backoff.delay(failures, rng) for _ in range(200)]
        assert all(floor * cap <= wait <= cap for wait in waits)
        if floor < 1.0:  # jittered: spread over the range, not one value
            assert max(waits) - min(waits) > 0.5 * (1 - floor) * cap


def test_storage_retries_and_node_reconnects_both_keep_half_of_the_cap() -> None:
    assert RetryPolicy().backoff.floor == 0.5
    assert (RECONNECT.base_delay, RECONNECT.max_delay, RECONNECT.floor) == (0.2, 10.0, 0.5)


@pytest.mark.parametrize(
    ("arguments", "named"), [((-1.0, 1.0, 0.0), "delays"), ((1.0, -1.0, 0.0), "delays"), ((1.0, 2.0, 1.5), "floor")]
)
def test_a_bad_backoff_is_refused_by_name(arguments: tuple[float, float, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Backoff(*arguments)
