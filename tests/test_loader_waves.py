"""The GPU benchmarks' timing window (bench/loader_waves.py) against a model of how a DataLoader's workers
deliver batches: the window must time exactly the batches loaded inside it."""

from __future__ import annotations

import pytest

from bench.loader_waves import PREFETCH, fewest_batches, steady_window


def arrivals(batches: int, workers: int, load_seconds: float) -> list[float]:
    """When each batch reaches the training loop, for a DataLoader whose workers each take `load_seconds` per
    batch: batch i goes to worker i mod `workers`; each worker starts with `PREFETCH` batches and is handed
    batch i + workers x PREFETCH when batch i is taken; batches are delivered in order, and the loop takes each
    at once."""
    free_at = [0.0] * workers  # when each worker is done with what it was handed
    ready: dict[int, float] = {}

    def hand(index: int, at: float) -> None:
        worker = index % workers
        free_at[worker] = max(free_at[worker], at) + load_seconds
        ready[index] = free_at[worker]

    for index in range(min(batches, workers * PREFETCH)):
        hand(index, 0.0)
    times: list[float] = []
    for index in range(batches):
        arrived = max(ready[index], times[-1] if times else 0.0)
        times.append(arrived)
        if index + workers * PREFETCH < batches:
            hand(index + workers * PREFETCH, arrived)
    return times


@pytest.mark.parametrize(("batches", "workers"), [(156, 16), (156, 12), (117, 16), (40, 4), (6, 2), (9, 1)])
def test_the_window_times_the_loaders_own_rate(batches: int, workers: int) -> None:
    load = 2.0  # seconds per batch per worker: the loaders deliver workers / load batches a second
    times = arrivals(batches, workers, load)
    first, last = steady_window(batches, workers)
    rate = (last - first) / (times[last] - times[first])
    assert rate == pytest.approx(workers / load, rel=1e-12)
    assert (last - first) % workers == 0 and last < batches


def test_a_clock_started_inside_a_wave_reads_fast() -> None:
    # What the window avoids: the rest of the wave the clock starts in was loaded before it started.
    batches, workers, load = 117, 16, 2.0
    times = arrivals(batches, workers, load)
    first, _ = steady_window(batches, workers)
    naive = (batches - 1 - (first + 1)) / (times[-1] - times[first + 1])
    assert naive > 1.04 * workers / load


def test_an_epoch_too_short_to_time_is_refused_naming_the_shortest() -> None:
    assert fewest_batches(16) == 48
    assert steady_window(48, 16) == (31, 47)
    with pytest.raises(
        ValueError, match="an epoch of 47 batches is too short to time with 16 workers: it needs at least 48"
    ):
        steady_window(47, 16)
    with pytest.raises(ValueError, match="at least one worker"):
        steady_window(100, 0)
