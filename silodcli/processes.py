"""Running `silod sim`'s independent simulations, one at a time or in worker processes.

`silod sim compare` and `silod sim sweep` both run a list of simulations that share nothing: each is a
single-threaded call, so on a machine with several cores they go to as many worker processes. Both take the
number of processes as `--jobs N` (`sim_parser.add_jobs_option`) and report each run as it ends in their own words (the
`finished` callback of `run_in_processes`). Ctrl-C is the parent's to handle: the workers ignore it (a terminal sends
it to all of them, and each would print a traceback), and the parent ends them when it stops waiting, and waits
until they have ended (`_stop`).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any, TypeVar

T = TypeVar("T")


def in_workers(calls: int, processes: int) -> bool:
    """Whether `run_in_processes` runs this many calls in worker processes, rather than one at a time in this
    process: only then may a call not draw on the terminal (a progress line redrawn in place)."""
    return processes > 1 and calls > 1


def say_when_done(labels: Sequence[str], workers: bool) -> Callable[[int, int, object], None]:
    """A `finished` callback for `run_in_processes` that, when the runs go to worker processes (`workers`), says on
    stderr which run ended, how many have, and the seconds since this call (one at a time, each run shows its own
    progress line instead)."""
    started = time.monotonic()

    def finished(index: int, count: int, _result: object) -> None:
        if workers:
            seconds = time.monotonic() - started
            print(f"{labels[index]} done ({count} of {len(labels)}, {seconds:.0f} s)", file=sys.stderr, flush=True)

    return finished


def run_in_processes(
    calls: Sequence[Callable[[], T]], processes: int, finished: Callable[[int, int, T], None]
) -> list[T]:
    """Each call's result, in the order of `calls`; `finished(index, count, result)` is told of each as it ends
    (`count` of them so far).

    Runs are independent and single-threaded, so with `processes` > 1 they go to that many worker processes,
    started afresh (spawned, not forked from a process that may hold threads); the calls must pickle (a
    `functools.partial` of a module-level function does). The first call to fail stops the rest and raises; so
    does Ctrl-C (KeyboardInterrupt), which the workers ignore: the parent ends them, their calls unfinished, rather
    than wait for calls whose results nobody will read."""
    if not in_workers(len(calls), processes):
        results: list[T] = []
        for index, call in enumerate(calls):
            results.append(call())
            finished(index, len(results), results[-1])
        return results
    processes = min(processes, len(calls))
    print(f"running {len(calls)} simulations, {processes} at a time", file=sys.stderr, flush=True)
    context = _SpawningWorkers()
    with ProcessPoolExecutor(max_workers=processes, mp_context=context, initializer=_ignore_interrupts) as pool:
        futures: dict[Future[T], int] = {pool.submit(call): index for index, call in enumerate(calls)}
        try:
            for count, future in enumerate(as_completed(futures), start=1):
                finished(futures[future], count, future.result())  # a failed call raises here
        except BaseException:
            _stop(pool, context.workers)
            raise
        return [future.result() for future in futures]


class _SpawningWorkers(SpawnContext):
    """The spawn start method, keeping every process it starts: a pool's workers, for `_stop` to end and wait for.

    A pool starts its workers through its context's `Process`, which is what the context it takes is for, and
    offers no public list of them: `ProcessPoolExecutor.terminate_workers` (Python 3.14) ends them without waiting,
    and the pool forgets them on `shutdown(wait=False)`, so that waiting needs a list of our own. Keeping it here
    leaves the pool's private attributes alone on every Python."""

    def __init__(self) -> None:
        super().__init__()
        self.workers: list[SpawnProcess] = []

    # typeshed has `Process` a class; a method that makes one is the same to the pool, which only calls it
    def Process(self, *args: Any, **kwargs: Any) -> SpawnProcess:  # type: ignore[override]
        worker = SpawnProcess(*args, **kwargs)
        self.workers.append(worker)
        return worker


def _ignore_interrupts() -> None:
    """A worker's first act: leave Ctrl-C (SIGINT) to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(pool: ProcessPoolExecutor, workers: Sequence[SpawnProcess]) -> None:
    """End the pool's `workers` now, their calls unfinished, and wait until they have: none may write anything after
    this (a run's files would appear in a directory its command has removed).

    The pool's own thread also waits for a worker that ends, and of two threads waiting for one process only one
    learns its exit: a `join` here racing the pool's thread returned while the worker still read as alive (about half
    the time under load). So the workers are ended first and the pool's thread is waited for (`shutdown(wait=True)`:
    it finds the pool broken, waits for every worker and ends) before any `join` here, which then finds each exit
    known."""
    for worker in workers:
        worker.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    for worker in workers:
        worker.join()
