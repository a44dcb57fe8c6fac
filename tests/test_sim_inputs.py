"""The simulator's inputs: trace files, cluster files, the synthetic trace generator and the shipped scenarios.

Bad input must fail whole, with a message naming the file, the line (or key), the field and the rule.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from datamgr.scheduler.sim.cluster import load_cluster, with_remote_io_scale
from datamgr.scheduler.sim.engine import check_inputs
from datamgr.scheduler.sim.fields import SimInputError, format_duration, parse_duration
from datamgr.scheduler.sim.generator import WORKLOADS, GeneratorConfig, generate
from datamgr.scheduler.sim.model import ClusterSpec, SimConfig, TraceJob
from datamgr.scheduler.sim.scenarios import (
    _load,
    available_scenarios,
    is_colocation_scenario,
    is_generated_scenario,
    load_scenario,
)
from datamgr.scheduler.sim.tenants import load_tenants
from datamgr.scheduler.sim.trace import load_trace, write_trace
from datamgr.scheduler.tenancy import TenantShare

HEADER = "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs"
GOOD_ROW = "a,0,1,resnet50,114MB/s,imagenet-1k,143GB,2"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def job(job_id: str = "a", **changes: object) -> TraceJob:
    base = TraceJob(job_id, 0.0, 1, "resnet50", 114e6, "imagenet-1k", 143 * 10**9, 2.0)
    return replace(base, **changes)  # type: ignore[arg-type]


# --- trace files -----------------------------------------------------------------------------------------------


def test_a_csv_trace_reads_units_durations_steps_and_flags(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.csv",
        "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs,steps,step_bytes,flags\n"
        "r50,90,1,resnet50,114MB/s,imagenet-1k,143GB,13,,,\n"
        "bert,2h,4,bert,8MB/s,websearch,20.9TB,,1000,20.9GB,irregular\n",
    )
    r50, bert = load_trace(trace)
    assert r50 == TraceJob("r50", 90.0, 1, "resnet50", 114_000_000, "imagenet-1k", 143 * 10**9, 13.0)
    assert bert.arrival == 7200.0
    assert bert.ideal_bytes_per_sec == 8_000_000
    assert bert.dataset_bytes == 20_900 * 10**9
    assert bert.epochs == pytest.approx(1000 * 20.9e9 / 20.9e12)  # steps x step_bytes / dataset
    assert bert.irregular and not r50.irregular


def test_a_jsonl_trace_takes_numbers_lists_and_nulls(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "t.jsonl",
        '{"job_id": "a", "arrival": 1.5, "gpus": 2, "model": "m", "ideal_rate": 1000, "dataset": "d",'
        ' "dataset_size": "1kB", "epochs": 0.5, "flags": ["irregular"], "steps": null}\n'
        "\n"
        '{"job_id": "b", "arrival": "1d", "gpus": "1", "model": "m", "ideal_rate": "8Mbps", "dataset": "d",'
        ' "dataset_size": 1000, "epochs": 3}\n',
    )
    a, b = load_trace(trace)
    assert (a.arrival, a.gpus, a.ideal_bytes_per_sec, a.dataset_bytes, a.epochs, a.irregular) == (
        1.5, 2, 1000, 1000, 0.5, True,
    )  # fmt: skip
    assert (b.arrival, b.gpus, b.ideal_bytes_per_sec, b.irregular) == (86400.0, 1, 1_000_000, False)


def test_tenant_and_class_are_optional_labels_in_csv_and_jsonl(tmp_path: Path) -> None:
    csv_trace = write(
        tmp_path / "t.csv",
        HEADER + ",tenant,class\n" + GOOD_ROW + ", vc-a ,best-effort\nb,0,1,m,1MB/s,d,1TB,1,,\n",
    )
    labelled, unlabelled = load_trace(csv_trace)
    assert (labelled.tenant, labelled.job_class) == ("vc-a", "best-effort")
    assert (unlabelled.tenant, unlabelled.job_class) == ("", "")
    jsonl_trace = write(
        tmp_path / "t.jsonl",
        '{"job_id": "a", "arrival": 0, "gpus": 1, "model": "m", "ideal_rate": 1000, "dataset": "d",'
        ' "dataset_size": 1000, "epochs": 1, "tenant": "vc-b", "class": null}\n',
    )
    (only,) = load_trace(jsonl_trace)
    assert (only.tenant, only.job_class) == ("vc-b", "")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_write_trace_leaves_out_the_label_columns_no_job_uses(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    write_trace(path, [job("a"), job("b", job_class="best-effort")])
    text = path.read_text()
    assert "class" in text and "tenant" not in text
    write_trace(path, [job("a")])
    assert "class" not in path.read_text()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_write_trace_reads_back_equal_in_readable_units(tmp_path: Path, suffix: str) -> None:
    jobs = [
        job("a", arrival=12.0, ideal_bytes_per_sec=89_700_000.0, dataset_bytes=1300 * 10**9, epochs=0.0840222),
        job(
            "b", arrival=7.25, gpus=8, ideal_bytes_per_sec=123_456_789.0, dataset="d", dataset_bytes=999, irregular=True
        ),
        job("c", dataset="e", tenant="vc-a", job_class="best-effort"),
    ]
    path = tmp_path / f"t{suffix}"
    write_trace(path, jobs)
    assert load_trace(path) == jobs
    text = path.read_text()
    assert "89.7MB/s" in text and "1.3TB" in text and "123.456789MB/s" in text


ERRORS = [
    pytest.param(HEADER + ",owner\n" + GOOD_ROW + ",me\n", "t.csv:1: unknown column 'owner'", id="unknown-column"),
    pytest.param(HEADER.replace(",model", "") + "\n", "t.csv:1: missing required column 'model'", id="missing-column"),
    pytest.param(HEADER + ",gpus\n", "t.csv:1: column 'gpus' appears twice", id="duplicate-column"),
    pytest.param(
        HEADER + "\n" + GOOD_ROW + "\nb,0,1,resnet50,,d,1TB,1\n",
        "t.csv:3: missing required field 'ideal_rate'",
        id="empty-required-cell",
    ),
    pytest.param(
        HEADER + "\na,-5,1,m,1MB/s,d,1TB,1\n", "t.csv:2: arrival: duration '-5' must not be negative", id="negative"
    ),
    pytest.param(HEADER + "\na,0,0,m,1MB/s,d,1TB,1\n", "t.csv:2: gpus: '0' must be at least 1", id="zero-gpus"),
    pytest.param(HEADER + "\na,0,1.5,m,1MB/s,d,1TB,1\n", "t.csv:2: gpus: '1.5' is not a whole number", id="half-gpu"),
    pytest.param(HEADER + "\na,0,1,m,1MB,d,1TB,1\n", "t.csv:2: ideal_rate: rate '1MB' has no time unit", id="rate"),
    pytest.param(
        HEADER + "\na,0,1,m,1MB/s,d,1G,1\n", "t.csv:2: dataset_size: size '1G' has an unknown unit", id="size-unit"
    ),
    pytest.param(HEADER + "\na,0,1,m,0MB/s,d,1TB,1\n", "t.csv:2: ideal_rate: '0MB/s' must be positive", id="zero"),
    pytest.param(HEADER + "\na,0,1,m,1MB/s,d,1TB,-1\n", "t.csv:2: epochs: '-1' must be positive", id="neg-epochs"),
    pytest.param(
        HEADER + "\na,soon,1,m,1MB/s,d,1TB,1\n", "t.csv:2: arrival: duration 'soon' is not a number", id="duration"
    ),
    pytest.param(
        HEADER + ",steps,step_bytes\na,0,1,m,1MB/s,d,1TB,1,10,1MB\n",
        "t.csv:2: epochs: give either epochs or steps and step_bytes, not both",
        id="epochs-and-steps",
    ),
    pytest.param(
        HEADER + ",steps\na,0,1,m,1MB/s,d,1TB,,10\n",
        "t.csv:2: step_bytes: missing; steps and step_bytes go together",
        id="steps-alone",
    ),
    pytest.param(
        HEADER + "\na,0,1,m,1MB/s,d,1TB,\n",
        "t.csv:2: epochs: missing; give epochs, or steps and step_bytes",
        id="no-work",
    ),
    pytest.param(
        HEADER + ",flags\na,0,1,m,1MB/s,d,1TB,1,curriculum\n",
        "t.csv:2: flags: unknown flag 'curriculum'",
        id="unknown-flag",
    ),
    pytest.param(
        HEADER + "\n" + GOOD_ROW + "\n" + GOOD_ROW + "\n",
        "t.csv:3: job_id: 'a' is already used on line 2",
        id="duplicate-job",
    ),
    pytest.param(
        HEADER + "\na,0,1,m,1MB/s,d,1TB,1\nb,0,1,m,1MB/s,d,2TB,1\n",
        "t.csv:3: dataset_size: dataset 'd' is 2000000000000 bytes here but 1000000000000 bytes on line 2",
        id="dataset-size-disagrees",
    ),
    pytest.param(HEADER + "\na,0,1,m,1MB/s,d,1TB\n", "t.csv:2: 7 cells, but the header has 8 columns", id="cells"),
    pytest.param(HEADER + "\n", "t.csv: the trace has no jobs", id="empty"),
    pytest.param("", "t.csv: the trace has no header line", id="no-header"),
    # A quote left open makes one cell of the rest of the file: past the csv module's 128 KiB, a traceback before.
    pytest.param(
        HEADER + '\n"a,0,1,m,1MB/s,d,1TB,1\n' + "x" * 140_000 + "\n",
        't.csv:2: not valid CSV from here on (field larger than field limit (131072)): is a quote (") left open?',
        id="stray-quote",
    ),
    # Infinite: a run that never ends, or a wait that never does.
    pytest.param(
        HEADER + "\na,1e400,1,m,1MB/s,d,1TB,1\n",
        "t.csv:2: arrival: duration '1e400' is too long to be a number of seconds",
        id="infinite-arrival",
    ),
    # Held again at every preemption: at most a day, as the data manager takes a live job's.
    pytest.param(
        HEADER + ",grace_period\na,0,1,m,1MB/s,d,1TB,1,2d\n",
        "t.csv:2: grace_period: '2d' must be at most a day (86,400 s), as the data manager takes a job's",
        id="grace-period-over-a-day",
    ),
]


@pytest.mark.parametrize(("content", "message"), ERRORS)
def test_a_bad_csv_trace_is_refused_naming_line_field_and_rule(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path / "t.csv", content)
    with pytest.raises(SimInputError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(str(tmp_path)), caught.value
    assert message in str(caught.value)


JSON_ROW = '"job_id": "a", "arrival": 0, "gpus": 1, "model": "m", "ideal_rate": "1MB/s", "dataset": "d"'
JSON_ERRORS = [
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": "1TB", "epochs": 1, "user": "x"}\n',
        "t.jsonl:1: unknown field 'user'",
        id="unknown-field",
    ),
    pytest.param("{" + JSON_ROW + ', "epochs": 1}\n', "t.jsonl:1: missing required field 'dataset_size'", id="miss"),
    pytest.param(
        "\n{" + JSON_ROW + ', "dataset_size": "1TB", "epochs": 1,}\n', "t.jsonl:2: not valid JSON", id="bad-json"
    ),
    pytest.param("[1, 2]\n", "t.jsonl:1: expected a JSON object, not list", id="not-object"),
    pytest.param(
        "{" + JSON_ROW.replace('"gpus": 1', '"gpus": true') + ', "dataset_size": 1, "epochs": 1}\n',
        "t.jsonl:1: gpus: expected a number, not True",
        id="bool-gpus",
    ),
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": "1TB", "epochs": 1, "flags": {"irregular": true}}\n',
        "t.jsonl:1: flags: expected names",
        id="flags-object",
    ),
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": "1TB", "epochs": 1, "tenant": 7}\n',
        "t.jsonl:1: tenant: expected a non-empty string, not 7",
        id="tenant-number",
    ),
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": "1TB", "epochs": 1, "class": " "}\n',
        "t.jsonl:1: class: expected a non-empty string, not ' '",
        id="class-blank",
    ),
    # Integers past the largest float (an OverflowError traceback before), and past what Python reads at all.
    pytest.param(
        "{" + JSON_ROW.replace('"gpus": 1', '"gpus": 1' + "0" * 400) + ', "dataset_size": 1, "epochs": 1}\n',
        "t.jsonl:1: gpus: 100000000000000000000000... (401 characters) is too large a number",
        id="gpus-past-a-float",
    ),
    pytest.param(
        "{" + JSON_ROW.replace('"arrival": 0', '"arrival": 1' + "0" * 400) + ', "dataset_size": 1, "epochs": 1}\n',
        "t.jsonl:1: arrival: 100000000000000000000000... (401 characters) is too large a number",
        id="arrival-past-a-float",
    ),
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": 1' + "0" * 400 + ', "epochs": 1}\n',
        "t.jsonl:1: dataset_size: 100000000000000000000000... (401 characters) is too large a number",
        id="size-past-a-float",
    ),
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": 1.5, "epochs": 1}\n',
        "t.jsonl:1: dataset_size: 1.5 is not a whole number of bytes",
        id="size-a-fraction",
    ),
    pytest.param(
        "{" + JSON_ROW.replace('"1MB/s"', "2.5") + ', "dataset_size": 1, "epochs": 1}\n',
        "t.jsonl:1: ideal_rate: 2.5 is not a whole number of bytes/s",
        id="rate-a-fraction",
    ),
    pytest.param(
        "{" + JSON_ROW + ', "dataset_size": 1' + "0" * 5000 + ', "epochs": 1}\n',
        "t.jsonl:1: not valid JSON: a number of more than 4,300 digits",
        id="size-past-python",
    ),
]


@pytest.mark.parametrize(("content", "message"), JSON_ERRORS)
def test_a_bad_jsonl_trace_is_refused_naming_line_field_and_rule(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(SimInputError, match="^" + str(tmp_path)) as caught:
        load_trace(write(tmp_path / "t.jsonl", content))
    assert message in str(caught.value)


def test_a_trace_needs_a_known_extension_and_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(SimInputError, match=r"t\.txt: a trace file must end in \.csv or \.jsonl"):
        load_trace(write(tmp_path / "t.txt", HEADER + "\n" + GOOD_ROW + "\n"))
    with pytest.raises(SimInputError, match=r"cannot read .*missing\.csv: No such file"):
        load_trace(tmp_path / "missing.csv")


def test_durations_take_seconds_and_units() -> None:
    assert [parse_duration(t) for t in ("90", "1.5m", "2h", "1d", "4w")] == [90, 90, 7200, 86400, 4 * 7 * 86400]
    # An exponent takes a sign, as a float's does ("1e-9" was refused as no number at all).
    assert [parse_duration(t) for t in ("1e2s", "1e-3", "1.5e-3m", "2E+1h")] == [100, 0.001, 0.09, 72000]
    with pytest.raises(ValueError, match="'2 hours' is not a number of seconds or a number with s, m, h, d or w"):
        parse_duration("2 hours")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (42, "42s"),
        (59.4, "59s"),
        (59.7, "1.0m"),
        (750, "12.5m"),
        (3596, "59.9m"),
        (3597, "1.0h"),
        (86_219, "23.9h"),
        (86_399, "1.0d"),
        (4 * 86_400, "4.0d"),
        (-59.7, "-1.0m"),
    ],
)
def test_a_reported_duration_is_shown_in_the_unit_its_rounding_reaches(seconds: float, shown: str) -> None:
    """Chosen before rounding, 59.7 s showed as "60s" and 86,399 s as "24.0h"."""
    assert format_duration(seconds) == shown


@pytest.mark.parametrize("text", ["1e400", "1e307w", "9" * 400])
def test_a_duration_past_the_largest_float_is_refused_not_read_as_infinity(text: str) -> None:
    """Infinity was taken: `sim generate --duration 1e400` then drew arrivals until memory ran out."""
    with pytest.raises(ValueError, match=r"is too long to be a number of seconds"):
        parse_duration(text)


@pytest.mark.parametrize(
    "name",
    ["t.csv", "t.jsonl", "c.toml"],
)
def test_a_byte_order_mark_before_a_file_is_not_part_of_its_first_line(tmp_path: Path, name: str) -> None:
    """Spreadsheet programs and Windows editors start UTF-8 files with one: the CSV header's first column was
    '\\ufeffjob_id', and the JSON and TOML readers refused their first line."""
    text = {
        "t.csv": HEADER + "\n" + GOOD_ROW + "\n",
        "t.jsonl": '{"job_id": "a", "arrival": 0, "gpus": 1, "model": "m", "ideal_rate": "1MB/s", "dataset": "d", '
        '"dataset_size": "1TB", "epochs": 1}\n',
        "c.toml": CLUSTER,
    }[name]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8-sig")
    if name == "c.toml":
        assert load_cluster(path) == ClusterSpec(2, 4, 10**12, 200_000_000)
    else:
        assert [j.job_id for j in load_trace(path)] == ["a"]


# --- cluster files ---------------------------------------------------------------------------------------------

CLUSTER = 'nodes = 2\ngpus_per_node = 4\ncache_per_node = "1TB"\nremote_io = "200MB/s"\n'


def test_a_cluster_file_is_read_with_units(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path / "c.toml", CLUSTER))
    assert cluster == ClusterSpec(2, 4, 10**12, 200_000_000)
    assert cluster.total_gpus == 8


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (CLUSTER + "gpu = 'v100'\n", "c.toml: unknown key 'gpu'; accepted keys: nodes, gpus_per_node"),
        (CLUSTER.replace('remote_io = "200MB/s"\n', ""), "c.toml: missing required key 'remote_io'"),
        (CLUSTER.replace("nodes = 2", "nodes = 0"), "c.toml: nodes: 0 must be at least 1"),
        (CLUSTER.replace('"1TB"', "-1"), "c.toml: cache_per_node: -1 must not be negative"),
        (CLUSTER.replace('"200MB/s"', '"0MB/s"'), "c.toml: remote_io: '0MB/s' must be positive"),
        (CLUSTER.replace('"200MB/s"', '"200MB"'), "c.toml: remote_io: rate '200MB' has no time unit"),
        (CLUSTER + "nodes = 3\n", "c.toml: not valid TOML: Cannot overwrite a value (at line 5"),
        # Past the largest float (an OverflowError traceback before), and past what Python reads at all.
        (
            CLUSTER.replace("nodes = 2", "nodes = 1" + "0" * 400),
            "c.toml: nodes: 100000000000000000000000... (401 characters) is too large a number",
        ),
        (CLUSTER.replace("nodes = 2", "nodes = 1" + "0" * 5000), "c.toml: not valid TOML: a number of more than 4,300"),
        # A bare number is bytes/s, bounded as "200MB/s" is (the remote IO scale was blamed for it before).
        (
            CLUSTER.replace('"200MB/s"', "1e30"),
            "c.toml: remote_io: 1e+30 is more than the largest value silod takes (9,223,372,036,854,775,807 bytes/s)",
        ),
        (CLUSTER.replace('"1TB"', "1e30"), "c.toml: cache_per_node: 1e+30 is more than the largest value silod takes"),
        # A fraction of a byte, refused as the string "1.5" and "0.5B" are (it was rounded before: 1.5 became 2).
        (
            CLUSTER.replace('"1TB"', "1.5"),
            "c.toml: cache_per_node: 1.5 is not a whole number of bytes: a fraction is refused, not rounded (a unit "
            "may carry one: '1.5TB')",
        ),
        (CLUSTER.replace('"1TB"', '"1.5"'), "c.toml: cache_per_node: size '1.5' is 1.5 bytes, not a whole number"),
        (CLUSTER.replace('"200MB/s"', "0.4"), "c.toml: remote_io: 0.4 is not a whole number of bytes/s"),
        (
            CLUSTER + "cpus_per_node = 8\nram_per_node = 2.5\n",
            "c.toml: ram_per_node: 2.5 is not a whole number of bytes",
        ),
        # A run's cost grows with the nodes and GPUs whatever the trace (a million nodes: 10 s for one job).
        (
            CLUSTER.replace("nodes = 2", "nodes = 100001"),
            "c.toml: nodes: 100001 must be at most 100,000: a run's cost grows with the cluster's size",
        ),
        (
            CLUSTER.replace("gpus_per_node = 4", "gpus_per_node = 1048577"),
            "c.toml: gpus_per_node: 1048577 must be at most 1,048,576, the most GPUs the simulator takes",
        ),
        (
            CLUSTER.replace("nodes = 2", "nodes = 2048").replace("gpus_per_node = 4", "gpus_per_node = 1024"),
            "c.toml: nodes x gpus_per_node: 2,048 x 1,024 GPUs must be at most 1,048,576 GPUs in all",
        ),
    ],
)
def test_a_bad_cluster_file_is_refused_naming_the_key_and_rule(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(SimInputError) as caught:
        load_cluster(write(tmp_path / "c.toml", content))
    assert message in str(caught.value)


def test_a_cluster_or_tenants_file_that_is_not_utf8_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    """A UnicodeDecodeError traceback before."""
    cluster = tmp_path / "c.toml"
    cluster.write_bytes(CLUSTER.replace('"200MB/s"', '"200MB/s"  # caf\xe9').encode("latin-1"))
    with pytest.raises(SimInputError, match=f"^{cluster}:4: not UTF-8 text$"):
        load_cluster(cluster)
    tenants = tmp_path / "vcs.toml"
    tenants.write_bytes("[caf\xe9]\ncells = { node = 1 }\n".encode("latin-1"))
    with pytest.raises(SimInputError, match=f"^{tenants}:1: not UTF-8 text$"):
        load_tenants(tenants)


def test_a_cluster_past_the_simulators_size_or_a_grace_period_past_a_day_is_refused_however_it_was_made() -> None:
    """The file readers refuse them naming the key or column; traces and clusters built in code meet the same
    bounds in `check_inputs`."""
    with pytest.raises(ValueError, match="the cluster has 100,001 nodes and 100,001 GPUs; the simulator takes at most"):
        check_inputs([job("a")], ClusterSpec(100_001, 1, 0, 10**9))
    with pytest.raises(ValueError, match="at most 100,000 nodes and 1,048,576 GPUs"):
        check_inputs([job("a")], ClusterSpec(2, 2**20, 0, 10**9))
    with pytest.raises(ValueError, match=r"trace job 'a': grace period 86401.0 s must be from 0 to a day \(86,400 s\)"):
        check_inputs([job("a", grace_seconds=86_401.0)], ClusterSpec(1, 1, 0, 10**9))
    check_inputs([job("a", grace_seconds=86_400.0)], ClusterSpec(100_000, 1, 0, 10**9))  # the bounds themselves


def test_the_remote_io_scale_multiplies_only_the_limit() -> None:
    cluster = ClusterSpec(2, 4, 10**12, 200_000_000)
    assert with_remote_io_scale(cluster, 2.5) == ClusterSpec(2, 4, 10**12, 500_000_000)
    with pytest.raises(ValueError, match="must be positive"):
        with_remote_io_scale(cluster, 0)


def test_a_remote_io_scale_that_leaves_no_rate_or_less_than_the_tenants_reserve_is_refused_saying_why() -> None:
    cluster = ClusterSpec(2, 4, 10**12, 200_000_000)
    assert with_remote_io_scale(cluster, 5e-9).remote_io_bytes_per_sec == 1  # the smallest limit
    with pytest.raises(SimInputError, match=r"x 1e-12 is 0\.0002 bytes/s, less than the smallest limit silod takes"):
        with_remote_io_scale(cluster, 1e-12)
    reserving = replace(cluster, tenants={"a": TenantShare(cells={"node": 1}, io_bytes_per_sec=150e6)})
    assert with_remote_io_scale(reserving, 0.75).remote_io_bytes_per_sec == 150e6
    with pytest.raises(SimInputError, match="is 100,000,000 bytes/s, less than the 150,000,000 bytes/s its tenants"):
        with_remote_io_scale(reserving, 0.5)


def test_a_size_given_as_a_whole_number_is_read_exactly_past_what_a_float_holds(tmp_path: Path) -> None:
    """It went through a float: 2**53 + 1 bytes became 2**53."""
    cluster = load_cluster(write(tmp_path / "c.toml", CLUSTER.replace('"1TB"', str(2**53 + 1))))
    assert cluster.cache_bytes_per_node == 2**53 + 1


# --- the generator ---------------------------------------------------------------------------------------------


def compute_seconds(j: TraceJob) -> float:
    return j.epochs * j.dataset_bytes / j.ideal_bytes_per_sec


def is_shared(j: TraceJob) -> bool:
    return "/" not in j.dataset


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    config = GeneratorConfig(jobs=200, seed=7)
    assert generate(config) == generate(GeneratorConfig(jobs=200, seed=7))
    assert generate(config) != generate(replace(config, seed=8))


def test_jobs_or_duration_bounds_the_trace() -> None:
    assert len(generate(GeneratorConfig(jobs=50, seed=1))) == 50
    trace = generate(GeneratorConfig(duration_seconds=7 * 86400, arrivals_per_hour=10, seed=1))
    assert all(0 < j.arrival <= 7 * 86400 for j in trace)
    assert [j.arrival for j in trace] == sorted(j.arrival for j in trace)
    assert len(trace) == pytest.approx(7 * 24 * 10, rel=0.1)  # Poisson: mean rate x duration
    with pytest.raises(ValueError, match="either a number of jobs or a duration"):
        GeneratorConfig(jobs=5, duration_seconds=60)
    with pytest.raises(ValueError, match="sharing must be between 0 and 1"):
        GeneratorConfig(jobs=5, sharing=1.5)


def test_durations_are_heavy_tailed_and_gpu_demand_follows_the_mix() -> None:
    trace = generate(GeneratorConfig(jobs=20_000, seed=3))
    hours = sorted(compute_seconds(j) / 3600 for j in trace)
    assert 0.75 < statistics.median(hours) < 1.25  # most jobs: minutes to an hour
    assert hours[0] > 2.5 / 60 and hours[-1] < 7 * 24  # 3 minutes to 6.9 days
    assert 0.09 < sum(h > 16.7 for h in hours) / len(hours) < 0.11  # the tail of days
    assert statistics.mean(hours) > 8 * statistics.median(hours)
    gpus = Counter(j.gpus for j in trace)
    for demand, share in ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05)):
        assert gpus[demand] / len(trace) == pytest.approx(share, abs=0.01)


def test_jobs_are_the_eleven_figure_6_jobs_with_the_papers_rates_and_dataset_sizes() -> None:
    rates = {(w.model, w.dataset): (w.bytes_per_sec_per_gpu, w.dataset_bytes) for w in WORKLOADS}
    image_models = {"resnet50": 114_000_000, "resnet152": 43_000_000, "efficientnetb1": 69_000_000}
    image_datasets = {"imagenet-1k": 143 * 10**9, "imagenet-22k": 1360 * 10**9, "openimages": 660 * 10**9}
    expected = {(m, d): (rate, size) for m, rate in image_models.items() for d, size in image_datasets.items()}
    expected[("vlad", "youtube-8m")] = (10_000_000, 1460 * 10**9)
    expected[("bert", "websearch")] = (2_000_000, 20_971 * 10**9)
    assert rates == expected
    assert sum(w.weight for w in WORKLOADS) == pytest.approx(1.0)
    trace = generate(GeneratorConfig(jobs=11_000, seed=4))
    for j in trace:
        per_gpu, size = rates[(j.model, j.dataset.split("/")[0])]
        assert j.ideal_bytes_per_sec == per_gpu * j.gpus
        assert j.dataset_bytes == size
    drawn = Counter((j.model, j.dataset.split("/")[0]) for j in trace)
    assert all(count / len(trace) == pytest.approx(1 / 11, abs=0.01) for count in drawn.values())


def test_the_sharing_fraction_is_the_share_of_jobs_on_shared_datasets() -> None:
    private = generate(GeneratorConfig(jobs=3000, sharing=0.0, seed=5))
    assert len({j.dataset for j in private}) == len(private)
    everyone = generate(GeneratorConfig(jobs=3000, sharing=1.0, seed=5))
    assert {j.dataset for j in everyone} == {w.dataset for w in WORKLOADS}
    some = generate(GeneratorConfig(jobs=3000, sharing=0.3, seed=5))
    assert sum(map(is_shared, some)) / len(some) == pytest.approx(0.3, abs=0.03)


def test_a_knob_changes_only_what_it_names() -> None:
    base = generate(GeneratorConfig(jobs=300, sharing=0.2, seed=6))
    more_sharing = generate(GeneratorConfig(jobs=300, sharing=0.6, seed=6))
    faster = generate(GeneratorConfig(jobs=300, sharing=0.2, gpu_speed_scale=2.0, seed=6))

    def without_dataset(j: TraceJob) -> TraceJob:
        return replace(j, dataset="")

    assert list(map(without_dataset, base)) == list(map(without_dataset, more_sharing))
    shared_before = {j.job_id for j in base if is_shared(j)}
    assert shared_before < {j.job_id for j in more_sharing if is_shared(j)}  # sharing only adds shared jobs
    assert [j.ideal_bytes_per_sec for j in faster] == [2 * j.ideal_bytes_per_sec for j in base]
    assert [replace(j, ideal_bytes_per_sec=0.0) for j in faster] == [replace(j, ideal_bytes_per_sec=0.0) for j in base]


def test_the_irregular_fraction_flags_that_share_of_jobs() -> None:
    assert not any(j.irregular for j in generate(GeneratorConfig(jobs=1000, seed=2)))
    flagged = generate(GeneratorConfig(jobs=4000, irregular=0.25, seed=2))
    assert sum(j.irregular for j in flagged) / len(flagged) == pytest.approx(0.25, abs=0.03)


YEARS_10 = 10 * 365 * 86400  # the simulator's horizon


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        # 2.3 GB and growing after a minute before: the trace is the simulator's to hold.
        ({"jobs": 10**9}, "jobs: 1,000,000,000 must be at most 10,000,000, the most jobs a trace may have"),
        ({"duration_seconds": YEARS_10 + 1}, "duration: 315,360,001 s must be at most the simulator's horizon"),
        # An ideal rate past the largest rate (an OverflowError traceback before), or one rounded to 0 bytes/s.
        ({"gpu_speed_scale": 1e300}, "gpu_speed_scale: 1e+300 must be at most 1e+10: the fastest job"),
        ({"gpu_speed_scale": 1e-300}, "gpu_speed_scale: 1e-300 must be at least 0.002: the longest job"),
        ({"gpu_speed_scale": 0.0019}, "gpu_speed_scale: 0.0019 must be at least 0.002"),
        # Arrivals 1e296 years apart, and a trace of 87 million jobs.
        (
            {"jobs": 10, "arrivals_per_hour": 1e-300},
            "jobs, arrivals_per_hour: 10 jobs at 1e-300 an hour arrive over 1.14e+297 years on average",
        ),
        (
            {"duration_seconds": 520 * 7 * 86400, "arrivals_per_hour": 1000},
            "duration, arrivals_per_hour: 1000 arrivals an hour for 314,496,000 s make 8.74e+07 jobs on average",
        ),
    ],
)
def test_knobs_whose_trace_the_simulator_could_not_run_or_hold_are_refused_naming_them(
    knobs: dict[str, float], message: str
) -> None:
    size: dict[str, float | None] = {"jobs": None} if "duration_seconds" in knobs else {"jobs": 5}
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        GeneratorConfig(**{**size, **knobs})  # type: ignore[arg-type]


def test_arrivals_that_pass_the_horizon_by_chance_are_refused_before_a_job_is_made() -> None:
    """Ten jobs 0.91 years apart on average arrive within the horizon on average, but not with every seed."""
    config = GeneratorConfig(jobs=10, arrivals_per_hour=1 / 8000, seed=0)
    with pytest.raises(ValueError, match=r"^jobs, arrivals_per_hour: job 8 of 10 arrives 11.3 years after the trace"):
        generate(config)
    assert len(generate(replace(config, seed=1))) == 10


@pytest.mark.parametrize("scale", [0.002, 1e10])
def test_every_job_generated_at_the_bounds_of_the_speed_scale_is_one_the_simulator_runs(scale: float) -> None:
    trace = generate(GeneratorConfig(jobs=3000, gpu_speed_scale=scale, seed=3))
    assert all(1 <= j.ideal_bytes_per_sec <= 2**63 - 1 for j in trace)
    check_inputs(trace, ClusterSpec(10, 8, 0, 2**63 - 1))  # within the horizon, at its ideal rate


# --- shipped scenarios -----------------------------------------------------------------------------------------


def test_the_shipped_scenarios_are_listed() -> None:
    assert available_scenarios() == [
        "cluster400",
        "cluster96",
        "fitgpp-io",
        "fitgpp-synthetic",
        "harmony-80",
        "harmony-80-io",
        "harmony-80-poisson",
        "hived-tenants",
        "micro",
        "tiresias-fig7",
        "tiresias-philly",
    ]
    known = (
        "cluster400, cluster96, fitgpp-io, fitgpp-synthetic, harmony-80, harmony-80-io, harmony-80-poisson, "
        "hived-tenants, micro, tiresias-fig7, tiresias-philly"
    )
    with pytest.raises(SimInputError, match=f"unknown scenario 'nano'; known scenarios: {known}$"):
        load_scenario("nano")


def test_micro_is_the_papers_8_v100_micro_benchmark() -> None:
    micro = load_scenario("micro")
    assert micro.cluster == ClusterSpec(nodes=2, gpus_per_node=4, cache_bytes_per_node=10**12,
                                        remote_io_bytes_per_sec=200 * 10**6)  # fmt: skip
    by_model = Counter(j.model for j in micro.trace)
    assert by_model == {"resnet50": 2, "efficientnetb1": 2, "bert": 1}
    for j in micro.trace:
        expected = {
            "resnet50": (1, 114e6, 1.3e12, 13.0),
            "efficientnetb1": (1, 69e6, 1.3e12, 10.0),
            "bert": (4, 8e6, 20.9e12, 0.07),
        }[j.model]
        assert (j.gpus, j.ideal_bytes_per_sec, j.dataset_bytes, j.epochs) == expected
        assert j.arrival == 0 and not j.irregular
    image_jobs = [j for j in micro.trace if j.model != "bert"]
    assert len({j.dataset for j in image_jobs}) == 4  # four different 1.3 TB datasets
    assert sum(j.gpus for j in micro.trace) == micro.cluster.total_gpus


def test_a_scenario_counts_as_generated_exactly_where_loading_it_draws_its_trace_from_a_recipe() -> None:
    generated = [name for name in available_scenarios() if is_generated_scenario(name)]
    assert generated == [
        name
        for name in available_scenarios()
        if not is_colocation_scenario(name) and load_scenario(name).recipe is not None
    ]
    assert {"cluster400", "cluster96"} <= set(generated) and "micro" not in generated


@pytest.mark.parametrize(("name", "nodes", "remote_io"), [("cluster96", 12, 10**9), ("cluster400", 50, 4 * 10**9)])
def test_the_generated_scenarios_are_the_papers_clusters_in_its_io_bound_regime(
    name: str, nodes: int, remote_io: int
) -> None:
    scenario = load_scenario(name)
    # 8-V100 nodes with 368 GB of local SSD per V100, the paper's egress limit for that many GPUs
    assert scenario.cluster == ClusterSpec(nodes, 8, 8 * 368 * 10**9, remote_io)
    assert scenario.trace == load_scenario(name).trace
    assert len({j.dataset for j in scenario.trace}) == len(scenario.trace)  # no job shares its dataset
    span = max(j.arrival for j in scenario.trace)
    gpus = scenario.cluster.total_gpus
    offered_gpu_load = sum(j.gpus * compute_seconds(j) for j in scenario.trace) / (span * gpus)
    assert 0.85 < offered_gpu_load < 1.25  # arrivals that would keep every GPU busy if IO kept up
    offered_reads = sum(j.total_bytes for j in scenario.trace) / span
    assert offered_reads > 5 * remote_io  # the paper's regime: demand far above the egress limit


def test_cluster400_is_four_weeks_of_arrivals() -> None:
    cluster400 = load_scenario("cluster400")
    four_weeks = 28 * 86400
    assert 0.95 * four_weeks < max(j.arrival for j in cluster400.trace) <= four_weeks
    assert cluster400.recipe is not None and cluster400.recipe.duration_seconds == four_weeks
    assert load_scenario("micro").recipe is None


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ('trace = "t.csv"\n[generate]\njobs = 3\n', "give either trace or [generate], not both or neither"),
        ("[generate]\njobs = 3\nsharing = 0.5\n", "[generate]: missing required key 'arrivals_per_hour'"),
        ("[generate]\njobs = 3\nload = 0.9\n", "[generate]: unknown key 'load'"),
        (
            "[generate]\njobs = 3\nduration = '1w'\narrivals_per_hour = 1\nsharing = 0\ngpu_speed_scale = 1\n"
            "irregular = 0\nseed = 1\n",
            "[generate]: give either a number of jobs or a duration, not both or neither",
        ),
        (
            "[generate]\njobs = 3\narrivals_per_hour = 1\nsharing = 2\ngpu_speed_scale = 1\nirregular = 0\nseed = 1\n",
            "[generate]: sharing: 2 must be between 0 and 1",
        ),
    ],
)
def test_a_bad_scenario_recipe_is_refused_naming_the_key(tmp_path: Path, recipe: str, message: str) -> None:
    path = write(tmp_path / "s.toml", f'description = "d"\n{recipe}\n[cluster]\n{CLUSTER}')
    with pytest.raises(SimInputError) as caught:
        _load("s", path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


@pytest.mark.parametrize(
    ("simulation", "message"),
    [
        ("round = '0.01'", "[simulation] round: '0.01' must be at least 0.1 s, the live data manager's"),
        ("preemption_cost = '2d'", "[simulation] preemption_cost: '2d' must be at most a day (86,400 s)"),
        ("preemption_cost = 1e400", "[simulation] preemption_cost: inf is not finite"),
    ],
)
def test_a_scenarios_round_and_preemption_cost_are_bounded_as_the_command_line_bounds_them(
    tmp_path: Path, simulation: str, message: str
) -> None:
    """A round of a nanosecond runs hours of rounds for a minute's trace; a preemption cost of 10^12 s (paid at every
    preemption) ran until memory ran out."""
    write(tmp_path / "t.csv", HEADER + "\n" + GOOD_ROW + "\n")
    path = write(
        tmp_path / "s.toml", f'description = "d"\ntrace = "t.csv"\n[simulation]\n{simulation}\n[cluster]\n{CLUSTER}'
    )
    with pytest.raises(SimInputError) as caught:
        _load("s", path)
    assert str(caught.value).startswith(f"{path}: {message}"), caught.value
    with pytest.raises(ValueError, match=r"preemption_seconds must be from 0 to a day \(86,400 s\)"):
        SimConfig(preemption_seconds=86_401)
    with pytest.raises(ValueError, match=r"round_seconds must be at least 0\.1"):
        SimConfig(round_seconds=0.01)
