"""The per-job token bucket: rate and burst bounds, FIFO service, live rate changes, rate 0 (and the one report of
each stretch at it) and cancellation.

Every test runs under trio's MockClock with autojump, so simulated seconds pass instantly and grant times are
exact up to floating-point rounding.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from fuseclient.throttle import DEFAULT_BURST_SECONDS, ThrottleStats, TokenBucket, default_burst


def run(main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def drained(rate: float, burst: int) -> TokenBucket:
    """A bucket that has just granted its whole initial burst (at time 0)."""
    bucket = TokenBucket(rate, burst)
    await bucket.consume(burst)
    return bucket


def test_a_new_bucket_is_full_and_grants_its_burst_without_waiting() -> None:
    async def main() -> None:
        bucket = TokenBucket(100, 500)
        await bucket.consume(300)
        await bucket.consume(200)
        assert trio.current_time() == 0
        assert bucket.statistics() == ThrottleStats(100.0, 500, 500, 0.0, 0)

    run(main)


def test_a_request_waits_for_exactly_the_missing_tokens_at_the_rate() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        await bucket.consume(50)
        assert trio.current_time() == pytest.approx(0.5)
        await bucket.consume(100)
        assert trio.current_time() == pytest.approx(1.5)
        stats = bucket.statistics()
        assert stats.granted_bytes == 250
        assert stats.waited_seconds == pytest.approx(1.5)

    run(main)


def test_tokens_stop_accruing_at_the_burst() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        await trio.sleep(10)  # would be 1000 tokens without the cap
        await bucket.consume(100)
        await bucket.consume(100)
        assert trio.current_time() == pytest.approx(11.0)

    run(main)


def test_consumers_are_served_in_arrival_order_so_a_big_request_is_not_starved() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        grants: list[tuple[str, float]] = []

        async def take(name: str, nbytes: int) -> None:
            await bucket.consume(nbytes)
            grants.append((name, trio.current_time()))

        async with trio.open_nursery() as nursery:
            for name, nbytes in [("big", 100), ("small-1", 10), ("small-2", 10), ("small-3", 10)]:
                nursery.start_soon(take, name, nbytes)
                await trio.testing.wait_all_tasks_blocked()
            assert bucket.statistics().waiting == 4

        assert [name for name, _ in grants] == ["big", "small-1", "small-2", "small-3"]
        assert [t for _, t in grants] == pytest.approx([1.0, 1.1, 1.2, 1.3])

    run(main)


@pytest.mark.parametrize(
    ("new_rate", "granted_at"),
    [
        (50, 1.5),  # lowered: 50 tokens at t=0.5, the other 50 at 50 B/s take 1 s more
        (200, 0.75),  # raised: the other 50 at 200 B/s take 0.25 s more
    ],
)
def test_a_rate_change_reschedules_a_waiting_consumer_at_once(new_rate: float, granted_at: float) -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        granted: list[float] = []

        async def take() -> None:
            await bucket.consume(100)  # due at t=1.0 at the old rate
            granted.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            await trio.sleep(0.5)
            bucket.set_rate(new_rate)
        assert granted == pytest.approx([granted_at])
        assert bucket.rate == new_rate

    run(main)


def test_a_lowered_burst_caps_the_tokens_already_held() -> None:
    async def main() -> None:
        bucket = TokenBucket(100, 1000)
        bucket.set_rate(100, burst=200)
        assert bucket.burst == 200
        await bucket.consume(200)
        assert trio.current_time() == 0
        await bucket.consume(100)
        assert trio.current_time() == pytest.approx(1.0)

    run(main)


def test_rate_zero_blocks_until_a_positive_rate_is_set_and_keeps_the_tokens() -> None:
    async def main() -> None:
        bucket = TokenBucket(0, 100)
        granted: list[float] = []

        async def take() -> None:
            await bucket.consume(100)
            granted.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            await trio.sleep(1000)
            assert granted == []
            assert bucket.statistics().waiting == 1
            assert bucket.statistics().waited_seconds == pytest.approx(1000)
            bucket.set_rate(10)
        assert granted == [1000.0]  # the full bucket held while blocked is granted at once

    run(main)


class Watcher:
    """What a bucket told of its stretches at a rate of 0, and when (trio's time, to 6 digits)."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def held(self) -> None:
        self.told.append(f"held at {trio.current_time():.6g}")

    def resumed(self, seconds: float) -> None:
        self.told.append(f"resumed at {trio.current_time():.6g} after {seconds:.6g} s")


def test_a_stretch_at_rate_zero_is_told_once_however_many_requests_wait_or_retry_and_once_as_it_ends() -> None:
    # Before, nothing told of it: a job's reads held at 0 hung, and the node's log said nothing.
    async def main() -> None:
        bucket, watcher = TokenBucket(0, 100), Watcher()
        async with trio.open_nursery() as nursery:
            for _ in range(1000):
                nursery.start_soon(bucket.consume, 10, watcher)
            await trio.sleep(10)
            with trio.move_on_after(5):  # a reader that gives up and retries, and its retry
                await bucket.consume(10, watcher)
            nursery.start_soon(bucket.consume, 10, watcher)
            await trio.sleep(5)
            assert watcher.told == ["held at 0"]
            assert bucket.statistics().waiting == 1001
            bucket.set_rate(100_000)
        assert watcher.told == ["held at 0", "resumed at 20 after 20 s"]  # the 100 tokens held grant at once
        assert bucket.statistics().granted_bytes == 10_010

    run(main)


def test_a_rate_lowered_to_zero_under_a_waiting_request_is_told_and_so_is_each_later_stretch() -> None:
    async def main() -> None:
        bucket, watcher = await drained(100, 100), Watcher()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bucket.consume, 100, watcher)  # waits at a positive rate: nothing to tell
            await trio.sleep(0.5)
            assert watcher.told == []
            bucket.set_rate(0)
            await trio.sleep(10)
            bucket.set_rate(100)  # the other 50 tokens take 0.5 s
        await bucket.consume(100, watcher)  # 1 s at 100 B/s, told nothing
        bucket.set_rate(0)
        with trio.move_on_after(3):
            await bucket.consume(100, watcher)
        assert watcher.told == ["held at 0.5", "resumed at 11 after 10.5 s", "held at 12"]

    run(main)


def test_setting_rate_zero_stops_a_waiting_consumer() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        granted: list[float] = []

        async def take() -> None:
            await bucket.consume(100)
            granted.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            await trio.sleep(0.5)
            bucket.set_rate(0)
            await trio.sleep(100)
            assert granted == []
            bucket.set_rate(100)  # 50 tokens kept from before the stop, 50 more take 0.5 s
        assert granted == pytest.approx([101.0])

    run(main)


@pytest.mark.parametrize("position", ["holding the turn", "queued behind another consumer"])
def test_a_cancelled_consumer_takes_no_tokens_and_leaves_the_line(position: str) -> None:
    async def main() -> None:
        bucket = TokenBucket(0, 100)
        granted: list[str] = []

        async def take(name: str) -> None:
            await bucket.consume(100)
            granted.append(name)

        async with trio.open_nursery() as nursery:
            names = ["victim", "other"] if position == "holding the turn" else ["other", "victim"]
            scopes: dict[str, trio.CancelScope] = {}
            for name in names:
                scopes[name] = trio.CancelScope()

                async def scoped(name: str = name) -> None:
                    with scopes[name]:
                        await take(name)

                nursery.start_soon(scoped)
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(5)
            scopes["victim"].cancel()
            await trio.testing.wait_all_tasks_blocked()
            stats = bucket.statistics()
            assert (stats.waiting, stats.granted_bytes) == (1, 0)
            bucket.set_rate(100)
        # The full bucket went to the survivor at once: the victim took nothing.
        assert granted == ["other"]
        assert trio.current_time() == 5
        assert bucket.statistics().waiting == 0

    run(main)


def test_a_request_larger_than_the_burst_waits_for_a_full_bucket_and_leaves_a_debt() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        await bucket.consume(300)
        assert trio.current_time() == pytest.approx(1.0)
        await bucket.consume(100)  # the 200-byte debt and then a full burst: 300 tokens at 100 B/s
        assert trio.current_time() == pytest.approx(4.0)
        # The documented bound for oversized requests: rate * t + max(burst, n).
        assert bucket.statistics().granted_bytes <= 100 * 4.0 + max(100, 300)

    run(main)


def test_granted_bytes_never_exceed_burst_plus_rate_times_time_over_a_random_schedule() -> None:
    rate, burst = 1000.0, 400

    async def main() -> None:
        rng = random.Random(7)
        bucket = TokenBucket(rate, burst)
        start = trio.current_time()
        samples: list[tuple[float, int]] = []

        async def consumer() -> None:
            for _ in range(60):
                await trio.sleep(rng.choice([0, 0, 0.01, 0.3, 2.0]))
                await bucket.consume(rng.randint(1, burst))
                samples.append((trio.current_time() - start, bucket.statistics().granted_bytes))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(consumer)

        assert len(samples) == 300
        slack = [burst + rate * t - granted for t, granted in samples]
        assert min(slack) >= -1e-6
        assert min(slack) < burst  # the schedule did exhaust the burst: the bound was tested, not vacuous

    run(main)


def test_concurrent_consumers_with_excess_demand_get_the_configured_rate() -> None:
    rate, item, seconds = 10_000.0, 1000, 10

    async def main() -> None:
        bucket = TokenBucket(rate, default_burst(rate, item))

        async def hammer() -> None:
            while True:
                await bucket.consume(item)

        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(hammer)
        stats = bucket.statistics()
        assert rate * seconds - item <= stats.granted_bytes <= rate * seconds + stats.burst_bytes
        assert stats.waiting == 0

    run(main)


def test_waited_seconds_sums_the_waits_of_concurrent_consumers() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(bucket.consume, 100)  # granted at 1 s and 2 s
        assert bucket.statistics().waited_seconds == pytest.approx(3.0)

    run(main)


def test_a_zero_byte_request_is_granted_immediately_even_from_an_empty_bucket() -> None:
    async def main() -> None:
        bucket = await drained(100, 100)
        await bucket.consume(0)
        assert trio.current_time() == 0
        assert bucket.statistics().granted_bytes == 100

    run(main)


@pytest.mark.parametrize(
    ("rate", "item_size", "burst"),
    [
        (10_000_000, 4096, 1_000_000),  # a tenth of a second at the rate
        (1000, 4096, 4096),  # but never less than one item
        (0, 0, 1),  # and at least one byte
        (25.0, 1, 2),  # rounded down
    ],
)
def test_default_burst_is_a_tenth_of_a_second_but_at_least_one_item(rate: float, item_size: int, burst: int) -> None:
    assert DEFAULT_BURST_SECONDS == 0.1
    assert default_burst(rate, item_size) == burst


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda b: TokenBucket(-1, 10), "rate"),
        (lambda b: TokenBucket(float("nan"), 10), "rate"),
        (lambda b: TokenBucket(10, 0), "burst"),
        (lambda b: b.set_rate(-5), "rate"),
        (lambda b: b.set_rate(5, burst=0), "burst"),
        (lambda b: default_burst(-1, 10), "rate"),
        (lambda b: default_burst(1, -10), "item_size"),
    ],
)
def test_invalid_arguments_are_refused_by_name(call: Callable[[TokenBucket], object], argument: str) -> None:
    async def main() -> None:
        bucket = TokenBucket(100, 100)
        with pytest.raises(ValueError, match=f"^{argument} must be"):
            call(bucket)
        assert (bucket.rate, bucket.burst) == (100, 100)

    run(main)


def test_a_negative_request_is_refused_by_name() -> None:
    async def main() -> None:
        bucket = TokenBucket(100, 100)
        with pytest.raises(ValueError, match=r"^nbytes must be"):
            await bucket.consume(-1)
        assert bucket.statistics() == ThrottleStats(100.0, 100, 0, 0.0, 0)

    run(main)
