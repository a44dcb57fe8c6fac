"""Knobs a policy takes from a scenario (`[policy]` in its TOML) or the command line (`--policy-option K=V`).

Values arrive as TOML gives them (numbers, strings, lists) or as command-line strings; a policy reads each
knob it accepts through `read_options`, and any other key, or a value its reader refuses, is a ValueError
that names the key, so a typo never runs a simulation with a default the user meant to change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TypeVar

from datamgr.scheduler.sim.fields import duration

PolicyOptions = Mapping[str, object]
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


# The knobs each factory declared, kept here rather than as an attribute of the factory: a function compiled
# with mypyc (`setup.py`) takes no attributes.
_DECLARED_KEYS: dict[Callable[..., object], tuple[str, ...]] = {}


def takes_keys(*keys: str) -> Callable[[F], F]:
    """Declare the knobs a policy factory takes (`declared_keys` reads them), so that a run of several
    policies can hand each only the knobs it takes: a scenario's Tiresias knobs do not reach FitGpp."""

    def declare(factory: F) -> F:
        _DECLARED_KEYS[factory] = keys
        return factory

    return declare


def declared_keys(factory: Callable[..., object]) -> tuple[str, ...] | None:
    """The knobs `factory` declared with `takes_keys`; None if it declared none (it gets every knob given)."""
    return _DECLARED_KEYS.get(factory)


class OptionReader:
    """Typed access to a policy's options; every method returns the default when the key is absent."""

    def __init__(self, options: PolicyOptions) -> None:
        self._options = options

    def text(self, key: str) -> str | None:
        value = self._options.get(key)
        return None if value is None else str(value)

    def number(self, key: str, default: float) -> float:
        value = self._options.get(key)
        if value is None:
            return default
        try:
            number = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else math.nan
        except ValueError:
            number = math.nan
        if math.isnan(number):
            raise ValueError(f"option {key}: {value!r} is not a number")
        return number

    def choice(self, key: str, choices: Mapping[str, T], default: T) -> T:
        """One of `choices` by its name (case-insensitive; a TOML boolean reads as "true" or "false")."""
        value = self._options.get(key)
        if value is None:
            return default
        name = str(value).lower()
        if name not in choices:
            raise ValueError(f"option {key}: {value!r} is not one of {', '.join(choices)}")
        return choices[name]

    def durations(self, key: str) -> tuple[float, ...]:
        """A list of durations (a TOML list, or comma-separated: "1h,2h"); each a number of seconds or with a unit."""
        value = self._options.get(key)
        items = value if isinstance(value, list) else str(value).split(",")
        try:
            return tuple(duration(item.strip() if isinstance(item, str) else item) for item in items)
        except ValueError as exc:
            raise ValueError(f"option {key}: {exc}") from None

    def durations_or_file(self, key: str) -> tuple[float, ...] | None:
        """`durations`, or those in a file named by the value (one per line, # comments) if it names one."""
        value = self._options.get(key)
        if value is None:
            return None
        if isinstance(value, str) and Path(value).is_file():
            return _durations_in_file(key, Path(value))
        if isinstance(value, str) and "/" in value:  # no duration has a slash: a path to a file that is not there
            raise ValueError(f"option {key}: {value!r} is no file (nor a list of durations)")
        return self.durations(key)


def _durations_in_file(key: str, path: Path) -> tuple[float, ...]:
    """The durations in `path`, one per line (# comments); a line that is none is refused naming its number."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"option {key}: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"option {key}: cannot read {path}: {exc.strerror or exc}") from None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if item:
            try:
                found.append(duration(item))
            except ValueError as exc:
                raise ValueError(f"option {key}: {path}, line {number}: {exc}") from None
    return tuple(found)


def read_options(options: PolicyOptions, accepted: Collection[str]) -> OptionReader:
    """A reader over `options`, once every key is known to be one of `accepted`."""
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; accepted options: {', '.join(accepted)}")
    return OptionReader(options)
