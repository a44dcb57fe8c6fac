"""Standard output that a reader closes early (`silod status | head -1`) or that cannot be written (a full disk,
`> /dev/full`): told apart from every other OSError, so that `main` ends the command as a Unix tool would
instead of with a traceback, and without a second error when Python flushes the stream at exit."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast


class StdoutError(Exception):
    """Writing standard output failed; `error` is the system's answer (a BrokenPipeError: the reader is gone)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.error = error


class _CheckedStream:
    """`stream` with its write and flush errors raised as StdoutError; everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def checked_stdout() -> Iterator[None]:
    """Within: a failed write to sys.stdout raises StdoutError, also when what was printed is flushed on leaving
    (output to a pipe or a file is buffered, so most commands' only write is that flush)."""
    original = sys.stdout
    sys.stdout = cast(TextIO, _CheckedStream(original))  # quacks as the stream it wraps
    try:
        try:
            yield
        finally:
            sys.stdout.flush()
    finally:
        sys.stdout = original


def discard_stdout() -> None:
    """Send what is left of standard output to /dev/null once writing it failed: Python flushes sys.stdout at
    exit, which would fail again and print "Exception ignored" (the Python docs' advice for SIGPIPE)."""
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture): nothing is flushed to a descriptor at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)
