"""Reading simulator input files (trace rows, cluster tables, scenario recipes) strictly, field by field.

Each reader takes the raw value as the file format gives it (a CSV cell is always a string, JSON and TOML
also give numbers) and returns it typed, or raises `ValueError` with the rule it broke; the file readers add
the file, the line and the field name and re-raise it as `SimInputError`. Sizes and rates use the same units
as the rest of silod (`silodlib.units`); durations accept s, m, h, d and w.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from silodlib.directories import make_directory
from silodlib.units import MAX_VALUE, UnitError, parse_rate, parse_size

if TYPE_CHECKING:
    from _csv import Reader as CsvReader

T = TypeVar("T")
N = TypeVar("N", int, float)
Reader = Callable[[object], T]  # raw value -> typed value, or ValueError stating the rule

DURATION_UNITS: dict[str, float] = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


class SimInputError(ValueError):
    """A simulator input that cannot be used as given; the message names the file, the line or key, the field
    and the rule it breaks. Nothing is returned from a file with an error in it."""


def shown(value: object) -> str:
    """`value` as a message quotes it: its repr, cut short past 40 characters (a 400-digit number, a field that
    swallowed the lines after it), so that the message stays one readable line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text):,} characters)"


def _as_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number, not {shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int past the largest float, as JSON and TOML give them (1 and 400 zeros)
        raise ValueError(f"{shown(value)} is too large a number") from None
    except ValueError:
        raise ValueError(f"{shown(value)} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{shown(value)} is not finite")
    return number


def positive_int(value: object) -> int:
    """A whole number above zero: 4, "4" (not 4.5, not -3, not true)."""
    number = _as_number(value)
    if number != int(number):
        raise ValueError(f"{value!r} is not a whole number")
    if number < 1:
        raise ValueError(f"{value!r} must be at least 1")
    return int(number)


def whole_number(value: object) -> int:
    """A whole number, zero or more: 0, "7"."""
    number = _as_number(value)
    if number != int(number) or number < 0:
        raise ValueError(f"{value!r} is not a whole number, zero or more")
    return int(number)


def positive_number(value: object) -> float:
    number = _as_number(value)
    if not number > 0:
        raise ValueError(f"{value!r} must be positive")
    return number


def fraction(value: object) -> float:
    """A share between 0 and 1 inclusive."""
    number = _as_number(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{value!r} must be between 0 and 1")
    return number


def text(value: object) -> str:
    """A non-empty string without surrounding blanks."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, not {value!r}")
    return value.strip()


def parse_duration(raw: str) -> float:
    """Seconds in `raw`: a plain number of seconds or a number with s, m, h, d or w ("90m", "2h", "4w"), finite
    ("1e400" is refused rather than read as infinity, which no time limit, arrival or wait can be)."""
    if raw.strip().startswith("-"):
        raise ValueError(f"duration {shown(raw)} must not be negative")
    match = _DURATION.match(raw)
    if not match or match.group(2) not in ("", *DURATION_UNITS):
        raise ValueError(f"duration {shown(raw)} is not a number of seconds or a number with s, m, h, d or w")
    seconds = float(match.group(1)) * DURATION_UNITS.get(match.group(2), 1.0)
    if not math.isfinite(seconds):
        raise ValueError(f"duration {shown(raw)} is too long to be a number of seconds")
    return seconds


def format_duration(seconds: float) -> str:
    """A short rendering for reports, in the largest unit up to days: "42s", "12.5m", "3.2h", "4.1d". A value the
    unit below would round up to a whole unit is shown in this one: 59.7 s is "1.0m", not "60s", and 86,399 s
    "1.0d", not "24.0h"."""
    for unit in ("d", "h", "m"):
        if abs(seconds) >= _SHOWN_FROM[unit]:
            return f"{seconds / DURATION_UNITS[unit]:.1f}{unit}"
    return f"{seconds:.0f}s"


# Where each unit takes over: the unit below shows seconds whole and minutes and hours to a tenth.
_SHOWN_FROM = {
    "m": DURATION_UNITS["m"] - 0.5,
    "h": DURATION_UNITS["h"] - 0.05 * DURATION_UNITS["m"],
    "d": DURATION_UNITS["d"] - 0.05 * DURATION_UNITS["h"],
}


def duration(value: object) -> float:
    """Seconds, zero or more: a number, or a string for `parse_duration`."""
    seconds = parse_duration(value) if isinstance(value, str) else _as_number(value)
    if seconds < 0:
        raise ValueError(f"{value!r} must not be negative")
    return seconds


def positive_duration(value: object) -> float:
    """Seconds, more than zero (a time limit of 0 would stop a run before anything happens)."""
    seconds = duration(value)
    if seconds == 0:
        raise ValueError(f"duration {value!r} must be longer than 0")
    return seconds


def at_most(read: Reader[N], high: N, bound: str) -> Reader[N]:
    """`read` that also refuses a value above `high`; `bound` says what the limit is and why, in words
    ("a day (86,400 s): ...") after "must be at most"."""

    def read_at_most(value: object) -> N:
        number = read(value)
        if number > high:
            raise ValueError(f"{shown(value)} must be at most {bound}")
        return number

    return read_at_most


def at_least(read: Reader[N], low: N, bound: str) -> Reader[N]:
    """`read` that also refuses a value below `low`; `bound` says what the limit is and why after "must be at
    least"."""

    def read_at_least(value: object) -> N:
        number = read(value)
        if number < low:
            raise ValueError(f"{shown(value)} must be at least {bound}")
        return number

    return read_at_least


def _with_units(parse: Callable[[str], int], unit: str, example: str) -> Callable[[object], int]:
    """A quantity in `unit` as the units module reads it from a string, or a plain number of `unit`, with the same
    bounds: not negative, a whole number of `unit` (`1.5` is refused as `"1.5"` and `"0.5B"` are, not rounded),
    at most `MAX_VALUE` (what silod takes everywhere, a 64-bit integer's range)."""

    def read(value: object) -> int:
        if isinstance(value, str):
            try:
                return parse(value)
            except UnitError as exc:
                raise ValueError(str(exc)) from None
        number = _as_number(value)  # an int is checked as given: a float holds 53 bits of it
        exact = value if isinstance(value, int) else number
        if exact < 0:
            raise ValueError(f"{value!r} must not be negative")
        if exact > MAX_VALUE:
            raise ValueError(f"{shown(value)} is more than the largest value silod takes ({MAX_VALUE:,} {unit})")
        if exact != int(exact):
            raise ValueError(
                f"{shown(value)} is not a whole number of {unit}: a fraction is refused, not rounded (a unit may "
                f"carry one: {example!r})"
            )
        return int(exact)

    return read


size = _with_units(parse_size, "bytes", "1.5TB")  # bytes: 1300000000000, "1.3TB", "500GiB"
rate = _with_units(parse_rate, "bytes/s", "1.5GB/s")  # bytes/s: 114000000, "114MB/s", "1Gbps"


def positive(read: Callable[[object], int]) -> Callable[[object], int]:
    """`read` that also refuses zero."""

    def read_positive(value: object) -> int:
        number = read(value)
        if number <= 0:
            raise ValueError(f"{value!r} must be positive")
        return number

    return read_positive


def check_keys(
    table: Collection[str], accepted: Collection[str], required: Collection[str], where: str, noun: str = "key"
) -> None:
    """Refuse, by name, a key of `table` that is not `accepted` or a `required` key it lacks.

    `where` prefixes the message (a file, a file and a section, a file and a line); `noun` is what the file
    format calls a key ("column", "field").
    """
    unknown = [key for key in table if key not in accepted]
    if unknown:
        raise SimInputError(f"{where}: unknown {noun} {unknown[0]!r}; accepted {noun}s: {', '.join(accepted)}")
    missing = [key for key in required if key not in table]
    if missing:
        raise SimInputError(f"{where}: missing required {noun} {missing[0]!r}")


def read_field(read: Reader[T], raw: object, where: str) -> T:
    """`read(raw)`, its complaint turned into a `SimInputError` that starts with `where`."""
    try:
        return read(raw)
    except ValueError as exc:
        raise SimInputError(f"{where}: {exc}") from None


def csv_rows(path: Path, columns: Collection[str], required: Collection[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """The rows of the CSV file at `path` after its header, each as (line number, column -> cell), blank lines
    skipped. The header must name each column once, only `columns` and every one of `required`, and a row must
    have a cell for every column; otherwise a `SimInputError` names the file, the line and the column. A UTF-8
    byte order mark (what spreadsheet programs write first) is not part of the first column's name."""
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        header = [name.strip() for name in _next_row(reader, path) or []]
        if not header:
            raise SimInputError(f"{path}: the trace has no header line")
        repeated = [name for index, name in enumerate(header) if name in header[:index]]
        if repeated:
            raise SimInputError(f"{path}:1: column {repeated[0]!r} appears twice")
        check_keys(header, columns, required, f"{path}:1", "column")
        while (cells := _next_row(reader, path)) is not None:
            if not cells:
                continue
            if len(cells) != len(header):
                raise SimInputError(
                    f"{path}:{reader.line_num}: {len(cells)} cells, but the header has {len(header)} columns"
                )
            yield reader.line_num, dict(zip(header, cells, strict=True))


def _next_row(reader: CsvReader, path: Path) -> list[str] | None:
    """The CSV reader's next row, None at the end; a row the csv module cannot read (a cell past its size limit, as
    a quote left open makes of the lines after it) is a `SimInputError` naming the line the row starts on."""
    start = reader.line_num + 1
    try:
        return next(reader, None)
    except csv.Error as exc:
        raise SimInputError(f'{path}:{start}: not valid CSV from here on ({exc}): is a quote (") left open?') from None


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Reading the text file at `path`: an unreadable file or one that is not UTF-8 is a `SimInputError`
    naming it (what every trace and cluster reader promises)."""
    try:
        yield
    except OSError as exc:
        raise SimInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SimInputError(f"{path}: not UTF-8 text") from None


def output_directory(path: Path) -> Path:
    """`path`, checked to be a directory that can take a run's files: refused as a `SimInputError` naming `--out`
    when it cannot be made (a file in the way, no permission), before any simulation has spent its time. One this
    check makes is removed again (its parents stay): the run makes it once its files are written
    (`silodcli.sim_outputs.staged_outputs`), so a run that never gets that far leaves no empty one. A symlink to a
    directory is written through (the files go where it leads, as `cp FILE LINK/` puts them); one that leads to no
    directory is refused naming where it leads (mkdir's own answer, "File exists", names neither)."""
    existed = path.is_dir()
    if path.is_symlink() and not existed:
        raise SimInputError(
            f"--out {path}: a symlink to {os.readlink(path)}, which is not a directory; make that directory, or give "
            "another --out"
        )
    try:
        make_directory(path)
        if not existed:
            path.rmdir()
    except OSError as exc:
        raise SimInputError(f"--out {path}: {exc.strerror or exc}") from None
    return path


def load_toml(path: Path) -> dict[str, Any]:
    """The TOML document at `path`; an unreadable file, one that is not UTF-8 (a byte order mark first is allowed)
    or bad TOML is a `SimInputError` naming the file (and the line, which tomllib's message ends with)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SimInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SimInputError(f"{path}:{line}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SimInputError(f"{path}: not valid TOML: {exc}") from None
    except ValueError:  # what tomllib lets through: an integer of more digits than Python converts
        raise SimInputError(f"{path}: not valid TOML: a number of more than 4,300 digits") from None
