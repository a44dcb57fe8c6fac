"""Human units for sizes and rates, strict enough that an operator's typo never becomes a wrong quota.

Sizes: a plain number of bytes, or a number with a byte unit: B, kB/KB, MB, GB, TB, PB (powers of 1000) or
KiB, MiB, GiB, TiB, PiB (powers of 1024). Rates: a plain number of bytes per second, a size unit followed by
"/s" ("200MB/s", "1.5GiB/s"), or a bit rate: bps, kbps/Kbps, Mbps, Gbps, Tbps (powers of 1000 bits/s).

Rejected as ambiguous: a bare prefix ("1G", "500M": bytes or bits? binary or decimal?), a lowercase "b"
after a prefix in a size ("5Mb": megabits are not a size), a size unit without "/s" where a rate is
expected, and lowercase multi-letter prefixes other than k ("1mb": milli?). So are fractions of a byte
("0.5B", "1.5"), which no quota can hold, and values beyond what a request carries (a signed 64-bit count).
"""

from __future__ import annotations

import re
from decimal import Decimal

_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}

SIZE_UNITS: dict[str, int] = {"B": 1}
SIZE_UNITS.update({prefix + "B": factor for prefix, factor in (_DECIMAL | _BINARY).items()})
BIT_RATE_BITS: dict[str, int] = {"bps": 1}  # bits per second each unit counts
BIT_RATE_BITS.update({prefix + "bps": factor for prefix, factor in _DECIMAL.items()})

_NUMBER_AND_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z/]*)\s*$")
_SIZE_HELP = "use a number of bytes or a unit such as 500GiB, 1.5TB, 4MiB, 100kB"
_RATE_HELP = "use a number of bytes/s or a unit such as 200MB/s, 1.5GiB/s, 1Gbps"


MAX_VALUE = 2**63 - 1  # what a request's int64 field carries


class UnitError(ValueError):
    """A size or rate that cannot be read without guessing."""


def _split(text: str, what: str, help_text: str) -> tuple[Decimal, str]:
    """The number (exact: decimal, so "0.1kB" is 100 bytes, not 100.00000000000001) and the unit."""
    if text.strip().startswith("-"):
        raise UnitError(f"{what} {text!r} is negative; {help_text}")
    match = _NUMBER_AND_UNIT.match(text)
    if not match:
        raise UnitError(f"{what} {text!r} is not a number with a unit; {help_text}")
    return Decimal(match.group(1)), match.group(2)


def _whole(amount: Decimal, text: str, what: str, unit: str) -> int:
    """`amount` as an int, refusing a fraction (silently rounded, "0.5B" would become 0) or an overflow."""
    if amount != amount.to_integral_value():
        raise UnitError(f"{what} {text!r} is {amount.normalize():f} {unit}, not a whole number of {unit}")
    if amount > MAX_VALUE:
        raise UnitError(f"{what} {text!r} is larger than the largest a request can carry ({MAX_VALUE:,} {unit})")
    return int(amount)


def _ambiguity_hint(unit: str) -> str:
    """Why an unknown unit was refused, for the units operators plausibly mean."""
    bare = unit.removesuffix("/s")
    prefixes = _DECIMAL | _BINARY
    if bare in prefixes:
        letter = bare[0].upper()
        return f" ({bare!r} is ambiguous: say {letter}B or {letter}iB for bytes)"
    if bare.endswith("b") and bare[:-1] in prefixes:
        return f" ({bare!r} means bits; say {bare[:-1]}B for bytes)"
    same_letters = [u for u in SIZE_UNITS if u.lower() == bare.lower()]
    if same_letters:
        return f" (units are case-sensitive: did you mean {same_letters[-1]}?)"
    return ""


def parse_size(text: str) -> int:
    """Bytes in `text`, e.g. "500GiB" -> 536870912000. Raises UnitError naming the problem."""
    value, unit = _split(text, "size", _SIZE_HELP)
    if unit == "":
        factor = 1
    elif unit in SIZE_UNITS:
        factor = SIZE_UNITS[unit]
    elif unit.endswith("/s") or unit in BIT_RATE_BITS:
        raise UnitError(f"size {text!r} is a rate; {_SIZE_HELP}")
    else:
        raise UnitError(f"size {text!r} has an unknown unit{_ambiguity_hint(unit)}; {_SIZE_HELP}")
    return _whole(value * factor, text, "size", "bytes")


def parse_rate(text: str) -> int:
    """Bytes per second in `text`, e.g. "200MB/s" -> 200000000, "1Gbps" -> 125000000."""
    value, unit = _split(text, "rate", _RATE_HELP)
    if unit == "":
        return _whole(value, text, "rate", "bytes/s")
    if unit in BIT_RATE_BITS:
        return _whole(value * BIT_RATE_BITS[unit] / 8, text, "rate", "bytes/s")
    if unit.endswith("/s") and unit[:-2] in SIZE_UNITS:
        return _whole(value * SIZE_UNITS[unit[:-2]], text, "rate", "bytes/s")
    if unit in SIZE_UNITS:
        raise UnitError(f"rate {text!r} has no time unit: did you mean {text.strip()}/s?")
    raise UnitError(f"rate {text!r} has an unknown unit{_ambiguity_hint(unit)}; {_RATE_HELP}")


def _scaled(value: float, base: int, units: tuple[str, ...]) -> str:
    """`value` in the first unit it is shown below `base` in, as rounded for showing: 1,048,575 bytes are
    "1.0 MiB", not "1024.0 KiB"."""
    for unit in units[:-1]:
        digits = 0 if unit == units[0] else 1
        if abs(round(value, digits)) < base:
            return f"{value:.{digits}f} {unit}"
        value /= base
    return f"{value:.1f} {units[-1]}"


def format_size(num_bytes: int | float) -> str:
    """A short binary-unit rendering for tables: 1536 -> "1.5 KiB"."""
    return _scaled(float(num_bytes), 1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"))


def format_rate(bytes_per_sec: int | float) -> str:
    """A short decimal-unit rendering for tables: 200_000_000 -> "200.0 MB/s"."""
    return _scaled(float(bytes_per_sec), 1000, ("B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"))
