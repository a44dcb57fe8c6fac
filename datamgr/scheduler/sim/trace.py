"""Trace files: the jobs a simulation replays, one per CSV row or JSONL line (chosen by the file's extension).

Fields (CSV header names, JSON keys):

| field | required | meaning |
| --- | --- | --- |
| `job_id` | yes | unique within the trace |
| `arrival` | yes | submission time from the trace start: seconds, or a duration such as "90m", "2h", "1.5d" |
| `gpus` | yes | GPUs the job gangs on, a whole number >= 1 |
| `model` | yes | a label for reports ("resnet50") |
| `ideal_rate` | yes | f* on all its GPUs: the rate it consumes data at when IO keeps up ("114MB/s", bytes/s) |
| `dataset` | yes | dataset name; jobs naming the same dataset share its cache, and must agree on its size |
| `dataset_size` | yes | "1.3TB", "143GB", bytes |
| `epochs` | either | passes over the dataset, fractional allowed (0.07) |
| `steps`, `step_bytes` | or both | training steps and the data one step reads ("256MB") |
| `flags` | no | names separated by spaces or ";", or a JSON list: `irregular` (not uniform access) |
| `tenant`, `class` | no | free-form labels ("vc-a", "be") the report breaks its numbers down by (1) |
| `priority` | no | `high` (the default: a regular job) or `low` (preemptible, HiveD's low-priority jobs); a label too |
| `cpus`, `ram` | no | CPUs (4, 0.5) and RAM ("16GB") the job holds besides its GPUs, on one node (2) |
| `grace_period` | no | how long it keeps its resources, suspending, once preempted ("3m", at most a day; default 0) |

(1) FitGpp's policies read class `te` (any case) as trial-and-error and any other as best-effort.
(2) The cluster must then give CPUs and RAM per node (`cluster.py`).

An empty CSV cell or a JSON null is an absent field. Any error names the file, the line, the field and the
rule, and nothing of a file with an error is returned.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.fields import SimInputError, check_keys, read_field
from datamgr.scheduler.sim.model import TraceJob
from datamgr.validation import MAX_GRACE_SECONDS
from silodlib.units import SIZE_UNITS, parse_rate, parse_size

REQUIRED = ("job_id", "arrival", "gpus", "model", "ideal_rate", "dataset", "dataset_size")
# Optional label column -> its TraceJob/JobOutcome field.
LABELS = {"tenant": "tenant", "class": "job_class", "priority": "priority"}
PRIORITIES = ("high", "low")
HOST = ("cpus", "ram", "grace_period")  # optional columns of FitGpp's jobs, written only when some job has them
COLUMNS = (*REQUIRED, "epochs", "steps", "step_bytes", "flags", *LABELS, *HOST)
FLAGS = ("irregular",)
FORMATS = (".csv", ".jsonl")
# A grace period is held again at every preemption: bounded as the data manager bounds a live job's
# (`model.MAX_PREEMPTION_SECONDS` says why).
_GRACE_PERIOD = fields.at_most(
    fields.duration, MAX_GRACE_SECONDS, f"a day ({MAX_GRACE_SECONDS:,.0f} s), as the data manager takes a job's"
)


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    values: Mapping[str, object]  # absent fields left out


def load_trace(path: Path) -> list[TraceJob]:
    """The jobs of the trace at `path`, in file order. Raises `SimInputError` naming the file, line, field
    and rule of the first problem."""
    rows = _jsonl_rows(path) if trace_format(path) == ".jsonl" else _csv_rows(path)
    jobs: list[TraceJob] = []
    lines: dict[str, int] = {}
    sizes: dict[str, tuple[int, int]] = {}  # dataset -> (size, line that set it)
    with fields.reading(path):
        for row in rows:
            where = f"{path}:{row.line}"
            job = _job(row.values, where)
            if job.job_id in lines:
                raise SimInputError(f"{where}: job_id: {job.job_id!r} is already used on line {lines[job.job_id]}")
            size, first = sizes.setdefault(job.dataset, (job.dataset_bytes, row.line))
            if size != job.dataset_bytes:
                raise SimInputError(
                    f"{where}: dataset_size: dataset {job.dataset!r} is {job.dataset_bytes} bytes here "
                    f"but {size} bytes on line {first}"
                )
            lines[job.job_id] = row.line
            jobs.append(job)
    if not jobs:
        raise SimInputError(f"{path}: the trace has no jobs")
    return jobs


def trace_format(path: Path) -> str:
    """The format of the trace file at `path`, by its extension: ".csv" or ".jsonl"; `SimInputError` for another."""
    if path.suffix not in FORMATS:
        raise SimInputError(f"{path}: a trace file must end in {' or '.join(FORMATS)}")
    return path.suffix


def _csv_rows(path: Path) -> Iterator[_Row]:
    for line, cells in fields.csv_rows(path, COLUMNS, REQUIRED):
        yield _Row(line, {name: cell for name, cell in cells.items() if cell.strip()})  # a blank cell is absent


def _jsonl_rows(path: Path) -> Iterator[_Row]:
    with path.open(encoding="utf-8-sig") as file:  # a byte order mark first is not part of the first line
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SimInputError(f"{path}:{number}: not valid JSON: {exc.msg} (column {exc.colno})") from None
            except ValueError:  # what json lets through: an integer of more digits than Python converts
                raise SimInputError(f"{path}:{number}: not valid JSON: a number of more than 4,300 digits") from None
            if not isinstance(record, dict):
                raise SimInputError(f"{path}:{number}: expected a JSON object, not {type(record).__name__}")
            yield _Row(number, {key: value for key, value in record.items() if value is not None})


def _job(values: Mapping[str, object], where: str) -> TraceJob:
    check_keys(values, COLUMNS, REQUIRED, where, "field")

    def read(field: str, reader: fields.Reader[fields.T]) -> fields.T:
        return read_field(reader, values[field], f"{where}: {field}")

    dataset_bytes = read("dataset_size", fields.positive(fields.size))
    job = TraceJob(
        job_id=read("job_id", fields.text),
        arrival=read("arrival", fields.duration),
        gpus=read("gpus", fields.positive_int),
        model=read("model", fields.text),
        ideal_bytes_per_sec=read("ideal_rate", fields.positive(fields.rate)),
        dataset=read("dataset", fields.text),
        dataset_bytes=dataset_bytes,
        epochs=_epochs(values, dataset_bytes, where),
        irregular="irregular" in read_field(_flags, values.get("flags", ""), f"{where}: flags"),
        cpus=read("cpus", fields.positive_number) if "cpus" in values else 0.0,
        ram_bytes=read("ram", fields.positive(fields.size)) if "ram" in values else 0,
        grace_seconds=read("grace_period", _GRACE_PERIOD) if "grace_period" in values else 0.0,
        **{name: read(column, fields.text) for column, name in LABELS.items() if column in values},
    )
    if job.priority not in ("", *PRIORITIES):
        raise SimInputError(f"{where}: priority: {job.priority!r} is not one of {', '.join(PRIORITIES)}")
    return job


def _epochs(values: Mapping[str, object], dataset_bytes: int, where: str) -> float:
    """The job's work in passes over its dataset, from `epochs` or from `steps` x `step_bytes`."""
    by_steps = "steps" in values or "step_bytes" in values
    if "epochs" in values:
        if by_steps:
            raise SimInputError(f"{where}: epochs: give either epochs or steps and step_bytes, not both")
        return read_field(fields.positive_number, values["epochs"], f"{where}: epochs")
    if not by_steps:
        raise SimInputError(f"{where}: epochs: missing; give epochs, or steps and step_bytes")
    for field in ("steps", "step_bytes"):
        if field not in values:
            raise SimInputError(f"{where}: {field}: missing; steps and step_bytes go together")
    steps = read_field(fields.positive_int, values["steps"], f"{where}: steps")
    step_bytes = read_field(fields.positive(fields.size), values["step_bytes"], f"{where}: step_bytes")
    return steps * step_bytes / dataset_bytes


def _flags(value: object) -> set[str]:
    if isinstance(value, str):
        names = value.replace(";", " ").split()
    elif isinstance(value, list) and all(isinstance(name, str) for name in value):
        names = list(value)
    else:
        raise ValueError(f"expected names separated by spaces or ';', or a list of names, not {value!r}")
    unknown = [name for name in names if name not in FLAGS]
    if unknown:
        raise ValueError(f"unknown flag {unknown[0]!r}; known flags: {', '.join(FLAGS)}")
    return set(names)


def write_trace(path: Path, jobs: Sequence[TraceJob]) -> None:
    """Write `jobs` as a trace file (CSV or JSONL by `path`'s extension) that `load_trace` reads back equal:
    sizes and rates in the largest decimal unit that keeps them exact ("1.3TB", "114MB/s"). A label column no
    job uses is left out, so an unlabelled trace (every generated one) has only the columns it needs."""
    with writing_trace(path) as file:
        write_jobs(file, trace_format(path), jobs, optional_columns(jobs))


@contextlib.contextmanager
def writing_trace(path: Path) -> Iterator[TextIO]:
    """A file for `write_jobs` to write the trace at `path` into, made at once: a bad extension is a
    `SimInputError` and a path that cannot be written an OSError before any job is made. It is written beside `path`
    (as `.NAME.partial`) and becomes `path` only when the block ends without an exception; otherwise it is removed,
    and what was at `path` stays as it was, so a refused or interrupted trace never passes for a whole one. A
    symlink at `path` is written through, as a shell's `>` and cp write through one: the file it points to (made if
    missing) is written beside and replaced, and the link stays a link; a loop of links is an OSError."""
    trace_format(path)
    target = _written_through(path)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    partial = target.with_name(f".{target.name}.partial")
    try:
        with partial.open("w", newline="", encoding="utf-8") as file:
            yield file
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _written_through(path: Path) -> Path:
    """The file that writing to `path` writes: `path`, or where the symlink at `path` leads (a rename onto the link
    would replace the link itself)."""
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # where realpath gave up: a loop
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
    return target


def optional_columns(jobs: Iterable[TraceJob]) -> tuple[str, ...]:
    """The label and host columns some job of `jobs` has a value in, in the order a trace file gives them."""
    jobs = list(jobs)
    labels = [column for column, name in LABELS.items() if any(getattr(job, name) for job in jobs)]
    return (*labels, *(column for column in HOST if any(_host(job)[column] for job in jobs)))


def write_jobs(file: TextIO, suffix: str, jobs: Iterable[TraceJob], optional: Sequence[str] = ()) -> int:
    """Write `jobs` into `file` one at a time as `write_trace` writes them into a `suffix` (".csv", ".jsonl") file,
    with the `optional` label and host columns in CSV, and return how many it wrote: a trace of any length in
    the same memory (the generator's). A job with a value in a column left out is a ValueError, as that value would
    be lost."""
    if suffix == ".jsonl":
        count = 0
        for job in jobs:
            file.write(json.dumps(_json_record(job)) + "\n")
            count += 1
        return count
    left_out = [column for column in (*LABELS, *HOST) if column not in optional]
    writer = csv.DictWriter(file, fieldnames=[*REQUIRED, "epochs", "flags", *optional], extrasaction="ignore")
    writer.writeheader()
    count = 0
    for job in jobs:
        record = _record(job)
        lost = [column for column in left_out if record[column]]
        if lost:
            raise ValueError(f"job {job.job_id!r} has a {lost[0]}, a column this trace leaves out")
        writer.writerow(record)
        count += 1
    return count


def _record(job: TraceJob) -> dict[str, str]:
    return {
        "job_id": job.job_id,
        "arrival": _number(job.arrival),
        "gpus": str(job.gpus),
        "model": job.model,
        "ideal_rate": _exact(round(job.ideal_bytes_per_sec), "/s", parse_rate),
        "dataset": job.dataset,
        "dataset_size": _exact(job.dataset_bytes, "", parse_size),
        "epochs": _number(job.epochs),
        "flags": "irregular" if job.irregular else "",
        **{column: getattr(job, name) for column, name in LABELS.items()},
        **_host(job),
    }


def _host(job: TraceJob) -> dict[str, str]:
    """Its CPU, RAM and grace-period cells, empty where it has none."""
    return {
        "cpus": _number(job.cpus) if job.cpus else "",
        "ram": _exact(job.ram_bytes, "", parse_size) if job.ram_bytes else "",
        "grace_period": _number(job.grace_seconds) if job.grace_seconds else "",
    }


def _json_record(job: TraceJob) -> dict[str, object]:
    """The CSV record with JSON numbers and a flag list; flags and labels are left out when empty."""
    record: dict[str, object] = {**_record(job), "arrival": job.arrival, "gpus": job.gpus, "epochs": job.epochs}
    flags = record.pop("flags")
    if flags:
        record["flags"] = [flags]
    for column, number in (("cpus", job.cpus), ("grace_period", job.grace_seconds)):
        if number:
            record[column] = number
    return {key: value for key, value in record.items() if (key not in LABELS and key not in HOST) or value}


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


_DECIMAL_UNITS = sorted(((u, f) for u, f in SIZE_UNITS.items() if "i" not in u and f > 1), key=lambda uf: -uf[1])


def _exact(value: int, suffix: str, parse: Callable[[str], int]) -> str:
    """`value` in the largest decimal unit that reads back as exactly `value`, else as a plain number."""
    for unit, factor in _DECIMAL_UNITS:
        if value >= factor:
            rendered = f"{value / factor:.12g}{unit}{suffix}"
            if parse(rendered) == value:
                return rendered
    return str(value)
