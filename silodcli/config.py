"""Settings from a TOML config file (`--config`, `SILOD_CONFIG`) and `SILOD_*` environment variables.

Precedence: a command-line flag, else its environment variable, else the config file, else the built-in
default. Nothing here lists the settings: a parser marks the flags that a file section may set with
`settings(...)`, and the keys, the variable names and the value conversion all come from those argparse
actions. The values become the parsers' defaults before the command line is parsed, so a flag still wins,
and a required flag given a value stops being required.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from silodcli.args import PATH_TYPES, QuantityParser, path_arg

CONFIG_FLAG = "--config"
CONFIG_ENV = "SILOD_CONFIG"
ENV_PREFIX = "SILOD_"
# A section sets the global flags it takes (--log-level) as this command's default_<dest>: the command line's
# global flag, or its variable, still wins.
COMMAND_DEFAULT_PREFIX = "default_"
# The attribute of a flag's action holding its setting's own check (`check_setting`).
_SETTING_CHECK = "silod_setting_check"
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class ConfigError(Exception):
    """A bad config file or variable; the message names the file, the section and key, or the variable."""


class ConfigurableParser(QuantityParser):
    """A `QuantityParser` that remembers which of its flags are settings; its subparsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_section: str | None = None
        self.config_actions: list[argparse.Action] = []
        self.config_takes_globals = False


@contextmanager
def settings(parser: ConfigurableParser, section: str | None = None, *, with_globals: bool = False) -> Iterator[None]:
    """The flags added to `parser` inside the block are settings of the file's `[section]`, and of their
    `SILOD_*` variables. On the root parser (section None) they are global flags: their variables apply to every
    command, and a section `with_globals` takes them as keys too."""
    start = len(parser._actions)
    yield
    parser.config_section = section
    parser.config_actions.extend(parser._actions[start:])
    parser.config_takes_globals = parser.config_takes_globals or with_globals


def check_setting(action: argparse.Action, check: Callable[[object], None]) -> None:
    """Check the value of `action`'s setting, from its variable or the config file, with `check` (which raises
    ValueError saying what is wrong), for a flag that takes any text and whose command checks its value when it
    runs, naming the flag (the data manager's `--listen` and `--policy`). A bad value from elsewhere would
    otherwise pass every other command unseen, and be refused by its own naming a flag nobody typed."""
    setattr(action, _SETTING_CHECK, check)


@dataclass(frozen=True)
class _Setting:
    key: str  # the long flag without its dashes
    parser: argparse.ArgumentParser  # the one holding `action`, which converts and checks the value
    action: argparse.Action
    target: argparse.ArgumentParser  # whose default `dest` the value becomes
    dest: str

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.key.upper().replace("-", "_")

    def convert(self, value: object) -> object:
        """The value as the flag would parse it; raises ValueError with the flag's own reason."""
        if self.action.nargs == 0:  # a switch such as --allow-other
            if isinstance(value, str):
                value = _BOOLEANS.get(value.strip().lower(), value)
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, not {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"expected a string or a number, not {value!r}")
        if self.action.type in PATH_TYPES and not isinstance(value, str):  # `state-dir = 5` is no path "5"
            raise ValueError(f"expected a path, a string, not {value!r}")
        try:
            converted = self.parser._get_value(self.action, str(value))
            self.parser._check_value(self.action, converted)
        except argparse.ArgumentError as exc:
            raise ValueError(exc.message) from None
        check: Callable[[object], None] | None = getattr(self.action, _SETTING_CHECK, None)
        if check is not None:
            check(converted)
        return converted

    def apply(self, value: object) -> None:
        self.target.set_defaults(**{self.dest: value})
        if self.target is self.parser:
            self.action.required = False


def _key(action: argparse.Action) -> str:
    return next(s for s in action.option_strings if s.startswith("--")).removeprefix("--")


def _parsers(parser: ConfigurableParser) -> Iterator[ConfigurableParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                if isinstance(child, ConfigurableParser):
                    yield from _parsers(child)


def _collect(root: ConfigurableParser) -> tuple[list[_Setting], dict[str, list[_Setting]]]:
    """The settings that variables set (global flags on the root, every section's flags on their parser),
    and each section's settings."""
    variables = [_Setting(_key(a), root, a, root, a.dest) for a in root.config_actions]
    sections: dict[str, list[_Setting]] = {}
    for parser in _parsers(root):
        if parser is root or parser.config_section is None:
            continue
        own = [_Setting(_key(a), parser, a, parser, a.dest) for a in parser.config_actions]
        variables += own
        section = sections.setdefault(parser.config_section, [])
        section += own
        if parser.config_takes_globals:
            section += [
                _Setting(_key(a), root, a, parser, COMMAND_DEFAULT_PREFIX + a.dest) for a in root.config_actions
            ]
    return variables, sections


def config_file(argv: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    """`--config FILE` from the command line, else `SILOD_CONFIG`, else None."""
    early = argparse.ArgumentParser(prog="silod", add_help=False)
    early.add_argument(CONFIG_FLAG, type=path_arg)
    path: Path | None = early.parse_known_args(argv)[0].config
    if path is None and environ.get(CONFIG_ENV):
        path = Path(environ[CONFIG_ENV])
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:  # its message ends with the line and column
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _apply_file(path: Path, sections: Mapping[str, list[_Setting]]) -> None:
    """Every section and key is checked, whichever command runs, so a typo never goes unnoticed."""
    names = ", ".join(f"[{name}]" for name in sorted(sections))
    for name, table in _read(path).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {name!r} is outside any section; put it under one of {names}")
        if name not in sections:
            raise ConfigError(f"{path}: unknown section [{name}]; the sections are {names}")
        by_key: dict[str, list[_Setting]] = {}
        for setting in sections[name]:
            by_key.setdefault(setting.key, []).append(setting)
        for key, value in table.items():
            if key not in by_key:
                accepted = ", ".join(sorted(by_key))
                raise ConfigError(f"{path}: unknown key {key!r} in [{name}]; accepted keys: {accepted}")
            for setting in by_key[key]:
                try:
                    setting.apply(setting.convert(value))
                except ValueError as exc:
                    raise ConfigError(f"{path}: [{name}] {key}: {exc}") from None


def _apply_environment(variables: list[_Setting], environ: Mapping[str, str]) -> None:
    """An empty variable counts as unset."""
    for setting in variables:
        text = environ.get(setting.variable)
        if text:
            try:
                setting.apply(setting.convert(text))
            except ValueError as exc:
                raise ConfigError(f"{setting.variable}: {exc}") from None


def apply(root: ConfigurableParser, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Set the parsers' defaults from the config file, then from the environment over it. Raises ConfigError."""
    environ = os.environ if environ is None else environ
    variables, sections = _collect(root)
    path = config_file(argv, environ)
    if path is not None:
        _apply_file(path, sections)
    _apply_environment(variables, environ)
