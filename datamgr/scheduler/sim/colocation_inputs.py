"""Files of the co-location simulator: job profiles (CSV), a machine cluster (TOML), and shipped scenarios.

A co-location trace is a CSV file with one job per row:

| column | meaning |
| --- | --- |
| `job_id` | unique within the trace |
| `arrival` | submission time from the trace start: seconds, or a duration such as "8m", "2h" |
| `app`, `dataset` | labels for the report ("lda", "pubmed") |
| `cpu_machine_seconds` | COMP time of one iteration times the DoP it was profiled at (Harmony's Eq. 2 constant) |
| `net_seconds` | COMM (PULL + PUSH) time of one iteration, the same at any DoP |
| `iterations` | iterations to convergence (fractional allowed) |
| `model_size`, `input_size` | "12GB", bytes: what a checkpoint, a restore and an input reload move |
| `read_size` | optional: bytes read from remote storage per iteration, through the cache ("400MB"; SiloD variant) |

The input is the job's dataset (`dataset`, of `input_size`); jobs naming the same dataset share its cache.

A co-location cluster file has `machines` (required), `machine_bandwidth` (what one machine moves a
checkpoint or input at, "1.1Gbps" by default, Harmony's m4.2xlarge), `profile_iterations` (iterations of
profiling per new job, default 2), and for jobs that read remote data `remote_io` (the egress limit the
cluster shares, "200MB/s"; default unlimited) and `cache` (all machines' cache together, "100GB"; default 0).
At most `MAX_MACHINES` machines, as a GPU cluster has at most `model.MAX_NODES` nodes: Harmony hands machines out
one at a time at every regrouping, so a run's cost grows with them whatever the trace.
A cluster file with `machines` and no `nodes` is a co-location cluster; that is how `silod sim --trace
--cluster` tells the two simulators apart.

A shipped co-location scenario is a TOML file in the scenarios package with `model = "colocation"`, a
`description`, a `[cluster]` table of the keys above and a `[generate]` table: `kind = "harmony"`, `seed`,
`mean_gap` (a duration; "0s" submits every job at once) and optionally `epoch_iterations` (each job then reads
its whole input from remote storage once per that many iterations) for `harmony_workload`.
Every error names the file, the line or key, and the rule.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from datamgr.scheduler.sim import fields
from datamgr.scheduler.sim.colocation_model import ColocationCluster, ColocationJob
from datamgr.scheduler.sim.fields import SimInputError, check_keys, read_field
from datamgr.scheduler.sim.harmony_workload import HarmonyWorkloadConfig, generate_harmony_workload
from datamgr.scheduler.sim.model import MAX_NODES

REQUIRED = (
    "job_id",
    "arrival",
    "app",
    "dataset",
    "cpu_machine_seconds",
    "net_seconds",
    "iterations",
    "model_size",
    "input_size",
)
COLUMNS = (*REQUIRED, "read_size")
CLUSTER_KEYS = ("machines", "machine_bandwidth", "profile_iterations", "remote_io", "cache")
_SCENARIO_KEYS = ("model", "description", "cluster", "generate")
_GENERATE_REQUIRED = ("kind", "seed", "mean_gap")
_GENERATE_KEYS = (*_GENERATE_REQUIRED, "epoch_iterations")
MODEL = "colocation"
MAX_MACHINES = MAX_NODES  # harmony on harmony-80's 80 jobs: 9 s of CPU on 100 machines, 35 s on 1,000
_WHY_BOUNDED = "a run's cost grows with the cluster's size, whatever the trace"
_MACHINES = fields.at_most(fields.positive_int, MAX_MACHINES, f"{MAX_MACHINES:,}: {_WHY_BOUNDED}")


@dataclass(frozen=True)
class ColocationScenario:
    name: str
    description: str
    cluster: ColocationCluster
    trace: list[ColocationJob]


def load_colocation_trace(path: Path) -> list[ColocationJob]:
    """The jobs of the CSV trace at `path`, in file order; raises `SimInputError` naming the line and column."""
    if path.suffix != ".csv":
        raise SimInputError(f"{path}: a co-location trace must be a .csv file")
    jobs: list[ColocationJob] = []
    lines: dict[str, int] = {}
    with fields.reading(path):
        for line, cells in fields.csv_rows(path, COLUMNS, REQUIRED):
            where = f"{path}:{line}"
            job = _job(cells, where)
            if job.job_id in lines:
                raise SimInputError(f"{where}: job_id: {job.job_id!r} is already used on line {lines[job.job_id]}")
            lines[job.job_id] = line
            jobs.append(job)
    if not jobs:
        raise SimInputError(f"{path}: the trace has no jobs")
    return jobs


def _job(values: Mapping[str, str], where: str) -> ColocationJob:
    def read(column: str, reader: fields.Reader[fields.T]) -> fields.T:
        return read_field(reader, values[column], f"{where}: {column}")

    read_bytes = read("read_size", fields.size) if values.get("read_size", "").strip() else 0
    return ColocationJob(  # every field read and checked above: the constructor's own checks cannot fail
        job_id=read("job_id", fields.text),
        arrival=read("arrival", fields.duration),
        app=read("app", fields.text),
        dataset=read("dataset", fields.text),
        cpu_machine_seconds=read("cpu_machine_seconds", fields.positive_number),
        net_seconds=read("net_seconds", fields.duration),
        iterations=read("iterations", fields.positive_number),
        model_bytes=read("model_size", fields.size),
        input_bytes=read("input_size", fields.size),
        read_bytes_per_iteration=read_bytes,
    )


def write_colocation_trace(path: Path, jobs: Sequence[ColocationJob]) -> None:
    """`jobs` as a trace `load_colocation_trace` reads back unchanged."""
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        for job in jobs:
            writer.writerow(
                (
                    job.job_id,
                    _plain(job.arrival),
                    job.app,
                    job.dataset,
                    _plain(job.cpu_machine_seconds),
                    _plain(job.net_seconds),
                    _plain(job.iterations),
                    job.model_bytes,
                    job.input_bytes,
                    job.read_bytes_per_iteration,
                )
            )


def _plain(number: float) -> str:
    """`number` in positional notation with every digit `repr` keeps ("0.00001", not "1e-05", which a duration
    cell does not take), so that it reads back as the same float."""
    return format(Decimal(repr(number)), "f")


def is_colocation_cluster(table: Mapping[str, Any]) -> bool:
    """Whether a cluster file's table describes machines for the co-location simulator."""
    return "machines" in table and "nodes" not in table


def colocation_cluster_from_table(table: Mapping[str, Any], where: str) -> ColocationCluster:
    check_keys(table, CLUSTER_KEYS, ("machines",), where)
    default = ColocationCluster(1)
    return ColocationCluster(
        machines=read_field(_MACHINES, table["machines"], f"{where}: machines"),
        machine_bytes_per_sec=read_field(
            fields.positive(fields.rate),
            table.get("machine_bandwidth", default.machine_bytes_per_sec),
            f"{where}: machine_bandwidth",
        ),
        profile_iterations=read_field(
            fields.whole_number,
            table.get("profile_iterations", default.profile_iterations),
            f"{where}: profile_iterations",
        ),
        remote_io_bytes_per_sec=(
            read_field(fields.positive(fields.rate), table["remote_io"], f"{where}: remote_io")
            if "remote_io" in table
            else default.remote_io_bytes_per_sec
        ),
        cache_bytes=read_field(fields.size, table.get("cache", 0), f"{where}: cache"),
    )


def load_colocation_cluster(path: Path) -> ColocationCluster:
    return colocation_cluster_from_table(fields.load_toml(path), str(path))


def is_colocation_document(document: Mapping[str, Any]) -> bool:
    return document.get("model") == MODEL


def colocation_scenario_from_document(name: str, document: Mapping[str, Any], where: str) -> ColocationScenario:
    """A shipped scenario's TOML document (`model = "colocation"`) with its trace generated."""
    check_keys(document, _SCENARIO_KEYS, ("description", "cluster", "generate"), where)
    cluster = colocation_cluster_from_table(document["cluster"], f"{where} [cluster]")
    recipe = document["generate"]
    check_keys(recipe, _GENERATE_KEYS, _GENERATE_REQUIRED, f"{where} [generate]")
    if recipe["kind"] != "harmony":
        raise SimInputError(f"{where} [generate]: kind: {recipe['kind']!r} is not a co-location recipe ('harmony')")
    config = HarmonyWorkloadConfig(
        seed=read_field(fields.whole_number, recipe["seed"], f"{where} [generate]: seed"),
        mean_gap_seconds=read_field(fields.duration, recipe["mean_gap"], f"{where} [generate]: mean_gap"),
        epoch_iterations=read_field(
            fields.whole_number, recipe.get("epoch_iterations", 0), f"{where} [generate]: epoch_iterations"
        ),
    )
    return ColocationScenario(name, str(document["description"]), cluster, generate_harmony_workload(config))


def shipped_document(name: str) -> dict[str, Any] | None:
    """The TOML document of the shipped scenario `name`, or None when there is none by that name."""
    resource = resources.files("datamgr.scheduler.sim.scenarios").joinpath(f"{name}.toml")
    if not resource.is_file():
        return None
    with resources.as_file(resource) as path:
        return fields.load_toml(path)
