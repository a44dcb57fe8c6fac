"""Failed reads logged at a rate a log can take (`fuseclient.failure_log`): a job whose storage refuses every read
logs its first failure at once, then a line every interval at most, counting the failures left out."""

from __future__ import annotations

import logging

import pytest

from fuseclient.failure_log import ReadFailureLog
from silodlib.backends import AccessDenied, BackendUnavailable


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fuseclient.fs"]


@pytest.mark.expected_warnings
def test_a_burst_of_failed_reads_is_one_line_then_one_an_interval_counting_those_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    failures = ReadFailureLog(interval=10.0, clock=clock)
    denied = AccessDenied("az://a/c/x.bin: access denied (AuthenticationFailed: ...)")
    for _ in range(600):  # 3 s of a loader skipping errors
        failures.failed("j1", "az://a/c", denied)
        clock.now += 0.005
    failures.failed("j2", "az://a/c", BackendUnavailable("az://a/c/y.bin: storage unavailable"))  # another job
    clock.now += 10.0
    failures.failed("j1", "az://a/c", denied)

    assert _lines(caplog) == [
        "job j1: read refused by storage: az://a/c/x.bin: access denied (AuthenticationFailed: ...)",
        "job j2: read failed: az://a/c/y.bin: storage unavailable",
        "job j1: read refused by storage: az://a/c/x.bin: access denied (AuthenticationFailed: ...) (599 more failed "
        "reads of this job since the last such line)",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "fuseclient.fs")
    assert [getattr(r, "job_id", None) for r in caplog.records if r.name == "fuseclient.fs"] == ["j1", "j2", "j1"]


@pytest.mark.expected_warnings
def test_a_job_remembered_among_too_many_others_is_forgotten_and_logs_at_once_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    failures = ReadFailureLog(interval=10.0, clock=clock)
    denied = AccessDenied("s3://b/x: access denied")
    for index in range(1025):
        failures.failed(f"j{index}", "s3://b", denied)
    failures.failed("j0", "s3://b", denied)  # the first of 1,025 was forgotten: logged again
    failures.failed("j1024", "s3://b", denied)  # the last is remembered: left out
    assert len(_lines(caplog)) == 1026
