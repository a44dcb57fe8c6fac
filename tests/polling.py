"""Waiting for something a test can observe (a file, a mount, a registration) with a bounded poll."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
