"""Human units: what operators type is read exactly, and anything ambiguous is refused with a reason."""

from __future__ import annotations

import pytest

from silodcli.tables import agent_text, cached_per_node_text, gpu_hours_text, read_text
from silodlib.units import UnitError, format_rate, format_size, parse_rate, parse_size
from silodpb.v1 import datamgr_pb2 as pb


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("500GiB", 500 * 2**30),
        ("1.5TB", 1_500_000_000_000),
        ("100kB", 100_000),
        ("100KB", 100_000),
        ("4MiB", 4 * 2**20),
        ("2 MiB", 2 * 2**20),
        ("0", 0),
        ("1e3B", 1000),
        ("0.1kB", 100),  # exact: 0.1 x 1000 in floating point is 100.00000000000001
    ],
)
def test_parse_size_reads_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1G", "'G' is ambiguous: say GB or GiB"),
        ("500M", "'M' is ambiguous"),
        ("5Mb", "'Mb' means bits"),
        ("1gb", "case-sensitive: did you mean GB?"),
        ("1mib", "did you mean MiB?"),
        ("-3GiB", "is negative"),
        ("lots", "is not a number with a unit"),
        ("3 parsecs", "unknown unit"),
        ("", "is not a number"),
        ("0.5B", "is 0.5 bytes, not a whole number of bytes"),  # was silently 0
        ("1.5", "is 1.5 bytes, not a whole number"),  # was silently 2
        ("1MB/s", "is a rate"),  # was "did you mean MB?"
        ("1Gbps", "is a rate"),
        ("99999999999999999999999", "larger than the largest a request can carry"),
    ],
)
def test_parse_size_rejects_ambiguous_or_malformed_sizes(text: str, fragment: str) -> None:
    with pytest.raises(UnitError, match=fragment) as info:
        parse_size(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200MB/s", 200_000_000),
        ("1.5GiB/s", int(1.5 * 2**30)),
        ("1Gbps", 125_000_000),
        ("3 Mbps", 375_000),
        ("800kbps", 100_000),
        ("12345", 12345),
    ],
)
def test_parse_rate_reads_byte_and_bit_rates(text: str, expected: int) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("200MB", "no time unit: did you mean 200MB/s?"),
        ("1G/s", "ambiguous"),
        ("5mbps", "unknown unit"),
        ("-1MB/s", "is negative"),
        ("1.5", "is 1.5 bytes/s, not a whole number"),
        ("12bps", "is 1.5 bytes/s"),
        ("1e300", "larger than the largest a request can carry"),
    ],
)
def test_parse_rate_rejects_sizes_and_ambiguous_rates(text: str, fragment: str) -> None:
    with pytest.raises(UnitError, match=fragment):
        parse_rate(text)


def test_format_size_and_rate_pick_readable_units() -> None:
    assert format_size(512) == "512 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(3 * 2**40) == "3.0 TiB"
    assert format_rate(999) == "999 B/s"
    assert format_rate(200_000_000) == "200.0 MB/s"


def test_a_value_that_rounds_up_to_the_next_unit_is_shown_in_it() -> None:
    # "1024.0 KiB" and "1000.0 kB/s" were shown: the unit was chosen before the value was rounded.
    assert format_size(1_048_575) == "1.0 MiB"
    assert format_size(2**30 - 1) == "1.0 GiB"
    assert format_size(1023) == "1023 B"
    assert format_rate(999_999) == "1.0 MB/s"
    assert format_rate(999_949) == "999.9 kB/s"


def test_gpu_hours_from_a_thousand_are_whole_hours_not_scientific_notation() -> None:
    assert gpu_hours_text(1520.4 * 3600) == "1,520"  # it was "1.52e+03"
    assert gpu_hours_text(999.4 * 3600) == "999"
    assert gpu_hours_text(12.34 * 3600) == "12.3"
    assert gpu_hours_text(10) == "0.00278"


def test_a_datasets_cache_is_shown_per_node_beside_its_per_node_quota() -> None:
    # The nodes' bytes were summed: 195.3 KiB cached of a 97.7 KiB dataset with a quota of 97.7 KiB per node.
    def dataset(*cached: int) -> pb.Dataset:
        return pb.Dataset(usage=[pb.DatasetUsage(node_id=f"n{i}", cached_bytes=b) for i, b in enumerate(cached)])

    assert cached_per_node_text(dataset(100_000, 100_000)) == "97.7 KiB"
    assert cached_per_node_text(dataset(50_000, 100_000)) == "48.8 KiB..97.7 KiB"
    assert cached_per_node_text(dataset()) == "0 B"


def test_a_nodes_agent_is_shown_by_the_address_its_stream_comes_from_or_a_dash_without_one() -> None:
    def node(peer: str | None) -> pb.Node:
        return pb.Node(node_id="n1") if peer is None else pb.Node(node_id="n1", agent=pb.ServingAgent(peer=peer))

    assert agent_text(node(None)) == "-"
    assert agent_text(node("ipv4:10.0.0.7:51234")) == "10.0.0.7:51234"
    assert agent_text(node("ipv6:[::1]:40000")) == "[::1]:40000"
    assert agent_text(node("unix:/run/silod.sock")) == "unix:/run/silod.sock"
    assert agent_text(node("")) == "unknown address"


def test_a_jobs_read_is_the_data_managers_count_of_all_its_runs_or_from_an_older_one_its_nodes_reports() -> None:
    usage = [pb.JobUsage(node_id="n1", bytes_read=1000), pb.JobUsage(node_id="n2", bytes_read=500, failed_reads=2)]
    assert read_text(pb.Job(job_id="j", usage=usage, bytes_read=9000)) == "8.8 KiB, 2 failed"  # runs before counted
    assert read_text(pb.Job(job_id="j", usage=usage)) == "1.5 KiB, 2 failed"  # an older data manager: no count
    assert read_text(pb.Job(job_id="j", usage=usage, bytes_read=0)) == "0 B, 2 failed"  # present, though 0
