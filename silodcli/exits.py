"""How `silod` commands end: the exit codes `main` returns, and the one-line refusal on stderr."""

from __future__ import annotations

import sys

EXIT_FAILED = 1  # the run was refused midway (a simulation that stalls, a policy whose decision cannot run)
EXIT_REJECTED = 1  # the data manager refused the call
EXIT_USAGE = 2  # a bad command line or bad input, refused before anything runs
EXIT_UNREACHABLE = 3  # the data manager could not be reached


def fail(command: str, exc: Exception, code: int = EXIT_USAGE) -> int:
    """Say on stderr why `silod COMMAND` stops (`exc`'s message names what was wrong) and return `code`."""
    print(f"silod {command}: {exc}", file=sys.stderr)
    return code
