"""What a backend read's deadline costs per try (silodlib/backends/deadline.py), against a try without one.

Each try of a remote read runs under a deadline the watchdog thread keeps (a set insertion and removal under a
lock, a thread-local), and its connection registers the socket the answer comes on (`Watchdog.watch`; once more
when the connection is new, as it opens). This times `--tries` tries of the same shape
as the S3 backend's, on a real socket that never needs cutting, with the deadline (`min_read_rate` 64KiB/s, the
default) and without it (`min_read_rate` 0), alternating `--rounds` times so that both see the same machine.
Compare the difference with the CPU a mount spends per file read from remote (docs/benchmarks.md).

    PYTHONPATH=. .venv/bin/python bench/read_deadline.py [--tries N] [--rounds N]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

from silodlib.backends.base import DEFAULT_MIN_READ_RATE
from silodlib.backends.deadline import WATCHDOG, ReadDeadline

ITEM_BYTES = 110_000  # the small-file benchmark's files (bench/epoch_read.py)


def per_try_us(deadline: ReadDeadline, answer: socket.socket, tries: int) -> float:
    """Microseconds per try of `tries` tries that each register `answer` under `deadline`."""
    started = time.perf_counter()
    for _ in range(tries):
        with deadline.of_read("s3://bench/item", ITEM_BYTES):
            WATCHDOG.watch(answer)
    return (time.perf_counter() - started) / tries * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    answer, peer = socket.socketpair()
    with answer, peer:
        with_deadline, without = ReadDeadline(30.0, DEFAULT_MIN_READ_RATE), ReadDeadline(30.0, 0)
        timed: dict[str, list[float]] = {"with the deadline": [], "without (min_read_rate 0)": []}
        for _ in range(args.rounds):
            timed["with the deadline"].append(per_try_us(with_deadline, answer, args.tries))
            timed["without (min_read_rate 0)"].append(per_try_us(without, answer, args.tries))
    for name, runs in timed.items():
        print(f"{name:28} median {statistics.median(runs):6.2f} us per try (runs {min(runs):.2f}-{max(runs):.2f})")
    cost = statistics.median(timed["with the deadline"]) - statistics.median(timed["without (min_read_rate 0)"])
    print(f"-> the deadline costs {cost:.2f} us per try of a read")


if __name__ == "__main__":
    main()
