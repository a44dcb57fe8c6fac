"""Checks on request fields. Each failure names the field, the value and the rule it broke."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from datamgr.entities import JOB_CLASSES, PRIORITIES, FailedPrecondition, InvalidArgument
from silodlib.backends.uri import InvalidDatasetURI, parse_dataset_uri
from silodlib.units import format_rate, format_size

ID_RULE = "[A-Za-z0-9._-]{1,128}"
_ID = re.compile(ID_RULE)
# Larger values are typos or unit mix-ups, not real clusters.
MAX_BYTES = 2**60  # 1 EiB
MAX_BYTES_PER_SEC = 10**15  # 1 PB/s
MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 1024**3
MAX_WORKERS = 1_000_000
MAX_EPOCHS = 1_000_000.0  # a million passes over a dataset is already no real job
MAX_CELLS = 1_000_000  # cells of one level in a tenant's virtual cluster
MAX_GRACE_SECONDS = 86_400.0  # a day: FitGpp's grace periods are minutes (a mean of 3, at most 20)
_ADDRESS = re.compile(r"[^\s]{1,255}")


def check_id(field: str, value: str) -> str:
    """Job and node ids become directory names on every node, so they are kept path-safe."""
    if not _ID.fullmatch(value) or value in (".", ".."):
        shown = repr(value) if len(value) <= 200 else f"of {len(value):,} characters"
        raise InvalidArgument(f"{field} {shown} must match {ID_RULE} and not be '.' or '..'")
    return value


def check_bytes(field: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(f"{field} {value} must not be negative")
    if value > MAX_BYTES:
        raise InvalidArgument(f"{field} {value} is over the sanity limit of {format_size(MAX_BYTES)}")
    return value


def check_rate(field: str, value: int, *, positive: bool = False) -> int:
    if value < 0 or (positive and value == 0):
        raise InvalidArgument(f"{field} {value} must be {'positive' if positive else 'zero or more'}")
    if value > MAX_BYTES_PER_SEC:
        raise InvalidArgument(f"{field} {value} is over the sanity limit of {format_rate(MAX_BYTES_PER_SEC)}")
    return value


def check_chunk_size(field: str, value: int) -> int:
    if not MIN_CHUNK_SIZE <= value <= MAX_CHUNK_SIZE:
        raise InvalidArgument(
            f"{field} {value} must be between {format_size(MIN_CHUNK_SIZE)} and {format_size(MAX_CHUNK_SIZE)}"
        )
    return value


def check_worker_count(field: str, value: int) -> int:
    if not 1 <= value <= MAX_WORKERS:
        raise InvalidArgument(f"{field} {value} must be between 1 and {MAX_WORKERS}")
    return value


def check_gpus(field: str, value: int, *, allow_zero: bool = False) -> int:
    """A job's GPU demand (at least one) or a node's GPUs for the policy (0: none)."""
    low = 0 if allow_zero else 1
    if not low <= value <= MAX_WORKERS:
        raise InvalidArgument(f"{field} {value} must be between {low} and {MAX_WORKERS}")
    return value


def check_epochs(field: str, value: float) -> float:
    """A job's length in passes over its dataset: any finite amount, fractions included (a fine-tuning job may
    train for 0.07 epochs); 0 means unknown."""
    if not (math.isfinite(value) and 0 <= value <= MAX_EPOCHS):
        raise InvalidArgument(f"{field} {value} must be a number of epochs from 0 (unknown) to {MAX_EPOCHS:,.0f}")
    return value


def check_job_class(field: str, value: str) -> str:
    """A job's class: "te" (trial-and-error) or "be" (best-effort)."""
    if value not in JOB_CLASSES:
        raise InvalidArgument(f"{field} {value!r} must be te (trial-and-error) or be (best-effort)")
    return value


def check_priority(field: str, value: str) -> str:
    """A job's priority: "high" (regular) or "low" (preemptible)."""
    if value not in PRIORITIES:
        raise InvalidArgument(f"{field} {value!r} must be high (regular) or low (preemptible)")
    return value


def check_cells(field: str, cells: Mapping[str, int]) -> dict[str, int]:
    """A virtual cluster's cells: at least one level, each named as ids are and given a count from 0; by name.
    Whether the names are levels of the data manager's hierarchy is `datamgr.tenants`' to say."""
    if not cells:
        raise InvalidArgument(f"{field} must give at least one level and its number of cells, such as node=2")
    for name, count in sorted(cells.items()):
        if not _ID.fullmatch(name):
            raise InvalidArgument(f"{field}: level name {name!r} must match {ID_RULE}")
        if not 0 <= count <= MAX_CELLS:
            raise InvalidArgument(f"{field}: {name}={count} must be a number of cells from 0 to {MAX_CELLS:,}")
    return dict(sorted(cells.items()))


def check_grace_seconds(field: str, value: float) -> float:
    """How long a preempted job keeps its GPUs: from 0 (released at once) to a day."""
    if not (math.isfinite(value) and 0 <= value <= MAX_GRACE_SECONDS):
        raise InvalidArgument(
            f"{field} {value:g} must be a number of seconds from 0 to {MAX_GRACE_SECONDS:,.0f} (a day)"
        )
    return value


def check_address(field: str, value: str) -> str:
    if not _ADDRESS.fullmatch(value):
        raise InvalidArgument(f"{field} {value!r} must be a non-empty host:port without spaces")
    return value


def check_dataset_uri(field: str, value: str) -> str:
    """The canonical form of a dataset URI, so that `s3://b/p/` and `s3://b/p` are one dataset."""
    try:
        return str(parse_dataset_uri(value))
    except InvalidDatasetURI as exc:
        raise InvalidArgument(f"{field}: {exc}") from None


def check_option_update(
    current: Mapping[str, str], options: Mapping[str, str], removed: Sequence[str]
) -> dict[str, str]:
    """A dataset's options after an update: `current` with `options` set (added or replaced) and the keys `removed`
    gone. Refused: an update that asks for nothing, a key both set and removed (which of the two was meant?), and
    the removal of a key that is not set (a typo would pass for a removal). Messages name keys, never values, which
    may be secrets. Whether the backend takes the result is the backend's to say."""
    if not options and not removed:
        raise InvalidArgument("options, remove_options: give at least one option to set or to remove")
    both = sorted(options.keys() & set(removed))
    if both:
        raise InvalidArgument(f"options, remove_options: {', '.join(both)} both set and removed; give each once")
    unset = sorted(set(removed) - current.keys())
    if unset:
        held = ", ".join(sorted(current)) or "none"
        raise FailedPrecondition(f"remove_options: {', '.join(unset)} not set on the dataset (its options: {held})")
    updated = {key: value for key, value in current.items() if key not in removed}
    return dict(sorted({**updated, **options}.items()))
