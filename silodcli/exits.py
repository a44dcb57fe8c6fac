"""How `silod` commands end: the exit codes `main` returns, and the one-line refusal on stderr."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from collections.abc import Callable

EXIT_FAILED = 1  # the run was refused midway (a simulation that stalls, a policy whose decision cannot run)
EXIT_REJECTED = 1  # the data manager refused the call
EXIT_USAGE = 2  # a bad command line or bad input, refused before anything runs
EXIT_UNREACHABLE = 3  # the data manager could not be reached
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # stdout's reader went away: what a shell reports for a tool SIGPIPE killed
EXIT_INTERRUPTED = 128 + signal.SIGINT  # Ctrl-C: what a shell reports for a tool SIGINT killed


def fail(command: str, exc: Exception, code: int = EXIT_USAGE) -> int:
    """Say on stderr why `silod COMMAND` stops (`exc`'s message names what was wrong) and return `code`."""
    print(f"silod {command}: {exc}", file=sys.stderr)
    return code


Command = Callable[[argparse.Namespace], int]


def refusing_unwritable_outputs(command: str | Callable[[argparse.Namespace], str]) -> Callable[[Command], Command]:
    """Decorate a command that writes output files into `args.out` (a simulation's): an OSError while it runs (a
    full disk, a directory turned read-only, in this process or a worker's) ends it with EXIT_FAILED and one line
    naming where and the system's answer, not a traceback. Its inputs are read and checked before it writes.
    `command` is the name it goes by in that line, or what gives it from the arguments."""

    def decorate(run: Command) -> Command:
        @functools.wraps(run)
        def guarded(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except OSError as exc:
                where = exc.filename or args.out or "its output directory"  # a failed write names no file
                said = f"cannot write its outputs ({where}): {exc.strerror or exc}"
                return fail(command(args) if callable(command) else command, RuntimeError(said), EXIT_FAILED)

        return guarded

    return decorate
