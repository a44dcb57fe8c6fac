"""Control characters in text that reaches a terminal, a log line or a table cell.

A value a user or an older silod stored (a Secret file's trailing newline, a trace label with a line break, an
escape sequence) must not split a line or drive the terminal it is shown on: it is shown escaped, as Python writes
it in a string literal, so that the reader still sees what is there.
"""

from __future__ import annotations

import re

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1


def escape_control_chars(text: str) -> str:
    """`text` with each control character escaped (`\\n`, `\\x1b`); any other text as it is."""
    return CONTROL_CHARS.sub(_escaped, text)


def _escaped(control: re.Match[str]) -> str:
    return repr(control.group())[1:-1]
