"""Where to time a PyTorch DataLoader's epoch so that its rate is the loaders' own (no torch needed here, so the
suite can test it).

A DataLoader hands batch i to worker i mod W, and each worker starts the epoch with `PREFETCH` batches: the
workers load in step, and a wave of W batches arrives almost at once, a whole load after the wave before. A
clock started at a batch inside a wave counts the rest of that wave, loaded before it started, as if it had
come at once. The steady-state window therefore starts at the last batch of the workers' first prefetches and
spans whole waves: it counts exactly the batches whose loading it times.
"""

from __future__ import annotations

PREFETCH = 2  # batches each worker loads ahead: the DataLoader's default prefetch_factor, set explicitly


def fewest_batches(workers: int) -> int:
    """The shortest epoch, in batches, that `steady_window` can time with `workers` workers: the first
    prefetches and one wave after them."""
    return workers * PREFETCH + workers


def steady_window(batches: int, workers: int) -> tuple[int, int]:
    """The steady state of an epoch of `batches` batches: the batch indices (first, last) between whose arrivals
    the batches after `first` up to `last` were loaded, and nothing else. Raises ValueError for an epoch shorter
    than `fewest_batches`."""
    if workers < 1:
        raise ValueError(f"a loader needs at least one worker to time, not {workers}")
    first = workers * PREFETCH - 1
    waves = (batches - 1 - first) // workers
    if waves < 1:
        raise ValueError(
            f"an epoch of {batches} batches is too short to time with {workers} workers: "
            f"it needs at least {fewest_batches(workers)}"
        )
    return first, first + waves * workers
