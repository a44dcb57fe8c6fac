"""argparse types that keep our own error messages (argparse would replace them with its generic one)."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from datamgr.defaults import EXTERNAL_POLICY
from datamgr.entities import JOB_CLASSES, PRIORITIES
from datamgr.scheduler.registry import unknown_policy
from datamgr.scheduler.sim.fields import parse_duration
from datamgr.tenants import check_cell_levels
from datamgr.validation import (
    MAX_CELLS,
    MAX_CHUNK_SIZE,
    MAX_EPOCHS,
    MAX_GRACE_SECONDS,
    MAX_WORKERS,
    MIN_CHUNK_SIZE,
)
from silodlib.listening import host_and_port
from silodlib.manifest import DEFAULT_CHUNK_SIZE
from silodlib.units import format_size, parse_rate, parse_size

T = TypeVar("T")


# argparse reads a token that starts with "-" as a flag unless it is a plain negative number ("-5"), so a negative
# quantity with a unit ("-5MB/s", "-1GiB", "-3m") never reached the value's own check: argparse said instead that a
# required value was missing, or that a flag expected one. No silod flag starts with "-" and a digit.
NEGATIVE_QUANTITY = re.compile(r"^-\.?\d[\w.,/]*$")


class QuantityParser(argparse.ArgumentParser):
    """An ArgumentParser that takes a negative quantity with a unit as a value, as it takes a plain negative
    number, so that the value's type can say what is wrong with it, and refuses a value that is not valid UTF-8
    but for a path; its subparsers are of its class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_QUANTITY

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """Every value of the command line, or of a setting (`config`), passes here before its type sees it. One
        with bytes that are not UTF-8 (which Python holds as lone surrogates, "\\udcff") is refused naming the
        argument: an ID, a URI or an address ends up in a request to the data manager, which cannot encode it (a
        traceback), or in its state. A path is the exception: the file system takes any bytes but `/` and NUL."""
        checked = not isinstance(action, argparse._SubParsersAction) and action.type not in PATH_TYPES
        if checked and not is_utf8(arg_string):
            raise argparse.ArgumentError(action, f"{arg_string!r} is not valid UTF-8")
        return super()._get_value(action, arg_string)


def is_utf8(text: str) -> bool:
    """Whether `text` is valid Unicode text: not bytes that were not UTF-8, decoded as surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ActionAfterItsOptions(argparse._SubParsersAction):  # type: ignore[type-arg]  # generic in typeshed only
    """A command's actions (`silod sim compare`, `silod node remove`), which replace the command's plain run:
    the command's own options given before the action's name are refused, and its required ones stop being
    required (`silod node remove` needs none of the agent's --node-id, --mountpoint, --cache-dir).

    `silod sim --seed 5 compare ...` would otherwise run with compare's default seed: argparse lets the
    action's own defaults overwrite whatever the command parsed before it, silently. An option set by the
    config file or the environment is a default, not one given. argparse checks a parser's required options
    after its action has parsed, hence the change here rather than a check of our own.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list)
        name = values[0]
        given = [
            action.option_strings[-1]
            for action in parser._actions
            if action.option_strings
            and action.default is not argparse.SUPPRESS  # --help
            and getattr(namespace, action.dest) != parser.get_default(action.dest)
        ]
        if given:
            parser.error(
                f"{', '.join(given)} given before {name!r}: options before an action belong to a plain "
                f"`{parser.prog}` run; give them after {name!r} (see `{parser.prog} {name} --help`)"
            )
        for action in parser._actions:
            action.required = False
        super().__call__(parser, namespace, values, option_string)


class CommandLineError(Exception):
    """Bad input that a command finds only once it runs (in a file an option names): exit 2, as a bad command line
    is, before anything is sent."""


def argument_type(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """An argparse `type` from a parser that raises ValueError: argparse then shows the parser's own message
    (which says what is wrong and what is accepted) instead of a generic "invalid value"."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def path_arg(text: str) -> Path:
    """A path that is not empty. `Path("")` is the working directory, which nobody means by an empty value
    (typically a shell variable that was never set), so it is refused rather than written into."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path is not a path; give a directory or file name")
    return Path(text)


def backup_file_arg(text: str) -> Path:
    """The path of the new file `silod datamgr backup` writes: not one that names a directory by its spelling
    ("DIR/", "DIR/.", ".."), which `Path` would turn into the directory's own name ("DIR"), making a file where a
    directory was meant. A directory named without a slash is refused where the file is made (`back_up`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty path names no file: give the backup's path (such as silod-backup.db)"
        )
    if os.path.basename(text) in ("", ".", ".."):
        raise argparse.ArgumentTypeError(
            f"{text} names a directory, and a backup is a new file: give the file's path (such as "
            f"{os.path.join(text, 'silod-backup.db')})"
        )
    return path_arg(text)


# The types of the arguments that are paths, which may hold any bytes (`QuantityParser._get_value`).
PATH_TYPES = (path_arg, backup_file_arg)

size_arg = argument_type(parse_size, "size")
rate_arg = argument_type(parse_rate, "rate")


def _chunk_size(text: str) -> int:
    """A dataset's item size for large files, in the range the data manager accepts. The request carries 0 for
    "the default" (the flag left out), so a 0 typed here would silently become 4 MiB: it is refused as any size
    out of range is."""
    size = parse_size(text)
    if not MIN_CHUNK_SIZE <= size <= MAX_CHUNK_SIZE:
        raise ValueError(
            f"chunk size {text!r} must be from {format_size(MIN_CHUNK_SIZE)} to {format_size(MAX_CHUNK_SIZE)} "
            f"(leave the flag out for {format_size(DEFAULT_CHUNK_SIZE)})"
        )
    return size


chunk_size_arg = argument_type(_chunk_size, "size")


def _egress_cap(text: str) -> int:
    """A cluster's remote IO limit: a rate above 0. A cap of 0 would let no job read remotely while `silod status`
    shows no cap at all (its summary carries 0 for none), which an operator who typed it for "no limit" would
    never notice."""
    rate = parse_rate(text)
    if rate == 0:
        raise ValueError(f"rate {text!r} is 0, which lets no job read remotely; leave the flag out for no limit")
    return rate


egress_cap_arg = argument_type(_egress_cap, "rate")


# The shortest and longest interval a daemon or `silod status --watch` takes (--round, --node-timeout,
# --report-interval, --stats-interval, --watch). Each tick logs, prints or sends something, so a tick of a
# nanosecond (--round 1e-9) floods the log and burns a core; the tests' shortest is 0.1 s. Beyond a day an
# interval is a typo, and `inf` would reach the sleeps that time them (and "every infs" the log). `silod sim
# --round` takes the same shortest (the simulator's `model.MIN_ROUND_SECONDS`, for its scenarios' rounds), and no
# longest: a simulated round costs nothing while nothing happens.
MIN_INTERVAL_SECONDS = 0.1
MAX_INTERVAL_SECONDS = 86_400.0


def positive_seconds(text: str) -> float:
    """A finite number of seconds, MIN_INTERVAL_SECONDS or more (a simulated interval: `silod sim --round`, the
    longest time between two policy rounds, which a live data manager takes from MIN_INTERVAL_SECONDS too: a round
    of a nanosecond would run hours of rounds for a simulated minute)."""
    return _seconds(text, MIN_INTERVAL_SECONDS, math.inf)


def interval_seconds(text: str) -> float:
    """How often a daemon or a watch acts, or how long it waits: from MIN_INTERVAL_SECONDS to a day."""
    return _seconds(text, MIN_INTERVAL_SECONDS, MAX_INTERVAL_SECONDS)


def _seconds(text: str, low: float, high: float) -> float:
    """A finite number of seconds above 0, from `low` to `high`, refused naming those bounds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0 and low <= value <= high):
        bounds = f" of at least {low:g}" if high == math.inf else f" from {low:g} to {high:,.0f} (a day)"
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds{bounds}")
    return value


def epochs_arg(text: str) -> float:
    """A job's length in epochs: a finite number, 0 or more (0: unknown), fractions allowed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of epochs") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_EPOCHS):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of epochs from 0 (unknown) to {MAX_EPOCHS:,.0f}")
    return value


def worker_arg(text: str) -> tuple[str, int]:
    """NODE_ID[:COUNT], e.g. "node-1:4"; the count defaults to 1."""
    node_id, sep, count = text.partition(":")
    if not sep:
        return node_id, 1
    if not count.isdigit() or not 1 <= int(count) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"worker {text!r}: COUNT must be a whole number from 1 to {MAX_WORKERS:,}")
    return node_id, int(count)


def gpus_arg(text: str) -> int:
    """A node's GPUs for the policy: a whole number from 0 (none) to MAX_WORKERS."""
    if not text.isdigit() or int(text) > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"GPUs {text!r} must be a whole number from 0 to {MAX_WORKERS:,}")
    return int(text)


def job_gpus_arg(text: str) -> int:
    """A job's GPU demand for the policy to place: at least one GPU. `--gpus 0` would register no job the policy
    can place, and none with workers either (the data manager would ask for workers the command line never sent)."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"GPUs {text!r} must be a whole number from 1 to {MAX_WORKERS:,}: a job the policy places runs on at "
            "least one GPU (give --worker for a job that runs where you say)"
        )
    return int(text)


def job_class_arg(text: str) -> str:
    """A job's class: te (trial-and-error) or be (best-effort)."""
    if text not in JOB_CLASSES:
        raise argparse.ArgumentTypeError(f"{text!r} must be te (trial-and-error) or be (best-effort)")
    return text


def priority_arg(text: str) -> str:
    """A job's priority: high (regular) or low (preemptible)."""
    if text not in PRIORITIES:
        raise argparse.ArgumentTypeError(f"{text!r} must be high (regular) or low (preemptible)")
    return text


def cells_arg(text: str) -> dict[str, int]:
    """A virtual cluster's cells, LEVEL=COUNT[,LEVEL=COUNT...]: "node=2", "node=2,gpu=1"."""
    cells: dict[str, int] = {}
    for part in text.split(","):
        level, equals, count = (piece.strip() for piece in part.partition("="))
        if not equals or not level or not count.isdigit() or int(count) > MAX_CELLS:
            raise argparse.ArgumentTypeError(
                f"cells {text!r}: {part.strip()!r} is not LEVEL=COUNT with a whole COUNT from 0 to {MAX_CELLS:,} "
                "(such as node=2,gpu=1)"
            )
        if level in cells:
            raise argparse.ArgumentTypeError(f"cells {text!r}: level {level!r} is given twice")
        cells[level] = int(count)
    return cells


def cell_levels_arg(text: str) -> str:
    """The GPUs' affinity hierarchy bottom up, NAME:BUDDIES,...: checked as the data manager would, and written
    back without spaces ("gpu:1,pcie:2,node:2")."""
    try:
        levels = check_cell_levels(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}; give the levels bottom up as NAME:BUDDIES, from one GPU to a node and above, such as "
            "gpu:1,pcie:2,socket:2,node:2"
        ) from None
    return ",".join(f"{name}:{buddies}" for name, buddies in levels)


def grace_arg(text: str) -> float:
    """A grace period: seconds, or a number with s, m, h ("90s", "3m", "1h"), from 0 to a day."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not (math.isfinite(seconds) and seconds <= MAX_GRACE_SECONDS):
        raise argparse.ArgumentTypeError(f"duration {text!r} must be at most a day ({MAX_GRACE_SECONDS:,.0f}s)")
    return seconds


def option_arg(text: str) -> tuple[str, str]:
    """KEY=VALUE for a backend option."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"option {text!r} must be KEY=VALUE")
    return key, value


def option_env_arg(text: str) -> tuple[str, str]:
    """KEY=ENV_VAR: a backend option whose value (a secret, typically) comes from the environment."""
    key, variable = option_arg(text)
    if variable not in os.environ:
        raise argparse.ArgumentTypeError(f"option {key}: environment variable {variable} is not set")
    if not is_utf8(os.environ[variable]):  # not shown: a secret, typically
        raise argparse.ArgumentTypeError(f"option {key}: environment variable {variable} is not valid UTF-8")
    return key, os.environ[variable]


def option_key_arg(text: str) -> str:
    """The KEY of a backend option to remove (`--remove-option`): not empty, as no option has an empty key."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"option {text!r} names no option: give the KEY of the one to remove")
    return text


class AppendOptionOnce(argparse.Action):
    """Append a backend option, KEY=VALUE of `--option` or `--option-env`, refusing a key that either gave
    before: of `--option a=b --option a=c` only the last counted, without a word. The values are not shown (a
    secret, typically)."""

    FLAGS: ClassVar[dict[str, str]] = {"option": "--option", "option_env": "--option-env"}

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, tuple)
        key = values[0]
        for dest, flag in self.FLAGS.items():
            if any(given == key for given, _ in getattr(namespace, dest, None) or []):
                also = "" if dest == self.dest else f" (by {flag} and {option_string})"
                parser.error(f"argument {option_string}: option {key!r} is given twice{also}; give each key once")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])


def _datamgr_address(text: str) -> str:
    """Where a client finds the data manager: HOST:PORT, the port one it can listen on (not 0, "any free port")."""
    host_and_port(text, lowest_port=1)
    return text


datamgr_address_arg = argument_type(_datamgr_address, "address")


def check_policy_name(name: object) -> None:
    """Refuse a name that is neither `external`, a built-in policy nor an installed plugin's (ValueError, listing
    the known ones): `SILOD_POLICY` and a config file's `policy`, which are checked whichever command runs (a
    setting's check, `config.check_setting`). The registry is loaded with the command line already (`sim_parser`).
    The data manager checks `--policy` itself when it starts."""
    unknown = unknown_policy(name, EXTERNAL_POLICY)
    if unknown is not None:
        raise unknown


def listen_address(text: object) -> None:
    """Refuse a data manager's `--listen` that is not HOST:PORT (port 0: any free port), with the reason
    (ValueError). A setting's check (`config.check_setting`): the data manager checks the flag's own value."""
    host_and_port(str(text))


def port_arg(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return int(text)


def key_value(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (a policy knob, `--policy-option`), both sides stripped and non-empty."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value.strip()


class AppendKeyOnce(argparse.Action):
    """Append a `key_value` pair, refusing a key given before: of `--policy-option queues=1h --policy-option
    queues=2h` only the last counted, without a word, so one of two values the user typed was dropped."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, tuple)
        given: list[tuple[str, str]] = list(getattr(namespace, self.dest) or [])
        key, value = values
        earlier = next((v for k, v in given if k == key), None)
        if earlier is not None:
            parser.error(f"argument {option_string}: {key} given twice ({key}={earlier}, {key}={value}); give it once")
        setattr(namespace, self.dest, [*given, (key, value)])
