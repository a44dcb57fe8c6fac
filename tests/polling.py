"""Waiting for something a test can observe (a file, a mount, a registration, a line a child process writes),
bounded by a deadline."""

from __future__ import annotations

import selectors
import threading
import time
from collections.abc import Callable
from typing import IO, Any


def eventually(
    check: Callable[[], Any],
    *,
    what: str | Callable[[], str] = "condition",
    timeout: float = 20.0,
    interval: float = 0.05,
    ignore: Callable[[Exception], bool] = lambda exc: False,
) -> Any:
    """Poll `check` until it returns something truthy and return that; an exception for which `ignore` is true
    means "not yet". Fails naming `what` (a callable is asked at failure time) once `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:
            if not ignore(exc):
                raise
        if time.monotonic() >= deadline:
            description = what() if callable(what) else what
            raise AssertionError(f"{description} not reached within {timeout} s")
        time.sleep(interval)  # polling observable state, bounded by the deadline


def read_lines(stream: IO[bytes], until: str, timeout: float = 15.0) -> list[str]:
    """Lines from a child's pipe up to and including the first containing `until`, within `timeout`."""
    lines: list[str] = []
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while not lines or until not in lines[-1]:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and selector.select(remaining), f"no {until!r} within {timeout}s: {lines}"
            line = stream.readline()
            assert line, f"the stream ended before {until!r}: {lines}"
            lines.append(line.decode())
    return lines


def outcome_within(seconds: float, call: Callable[[], object]) -> dict[str, object]:
    """Run `call` in a daemon thread, so that a call that hangs fails the test instead of hanging it: {"result":
    what it returned} or {"error": the exception it raised}, or {"hung": True} if it had not ended within
    `seconds` (it is left running)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:  # the caller's assertions report it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return {"hung": True} if thread.is_alive() else outcome
