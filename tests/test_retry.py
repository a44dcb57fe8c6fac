"""The shared retry: jittered exponential backoff on transient errors only, and the backend wrapper using it."""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from silodlib.backends import (
    AccessDenied,
    Backend,
    BackendUnavailable,
    LocalBackend,
    NoSuchObject,
    ObjectInfo,
    open_backend,
    parse_dataset_uri,
    retry,
)
from silodlib.backends.retry import RetryingBackend, RetryPolicy, call_with_retries
from silodlib.backends.uri import DatasetURI
from tests.storage_servers import free_port

POLICY = RetryPolicy(attempts=5, base_delay=0.1, max_delay=0.3)


class Recorder:
    """An injected `sleep` that only records the delays asked for."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class Failing:
    """An operation that raises `errors` in turn, then returns "done"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, BackendUnavailable)


def unavailable(count: int) -> list[Exception]:
    return [BackendUnavailable(f"failure {n}") for n in range(1, count + 1)]


# --- call_with_retries -------------------------------------------------------------------------------


def test_transient_errors_are_retried_up_to_the_attempts_with_equal_jitter_delays() -> None:
    """Equal jitter, not full: each delay keeps at least half its cap, so a call's waits cannot all come out near 0
    (with full jitter a blip of refused connections spent all five tries in 0.39 s and readers got EIO)."""
    sleep, operation = Recorder(), Failing(*unavailable(10))

    with pytest.raises(BackendUnavailable, match=r"failure 5$"):  # the last error, not the first
        call_with_retries(operation, is_transient=is_unavailable, policy=POLICY, sleep=sleep, rng=random.Random(7))

    assert operation.calls == 5
    caps = [0.1, 0.2, 0.3, 0.3]  # base * 2**(n-1), capped at max_delay
    assert len(sleep.delays) == 4
    assert all(cap / 2 <= delay <= cap for delay, cap in zip(sleep.delays, caps, strict=True))
    expected = random.Random(7)
    assert sleep.delays == [expected.uniform(cap / 2, cap) for cap in caps]
    assert len(set(sleep.delays)) == 4  # jittered, not fixed


@pytest.mark.parametrize("seed", range(50))
def test_a_call_failing_every_try_waits_six_to_twelve_seconds_in_all_whatever_is_drawn(seed: int) -> None:
    """The default policy's promise (docs/backends.md): an outage of failures that come at once (refused
    connections) shorter than 6 s is always ridden out, and a dead backend fails a call after 5 tries and at most
    12 s of waits."""
    policy, sleep, operation = RetryPolicy(), Recorder(), Failing(*unavailable(10))

    with pytest.raises(BackendUnavailable):
        call_with_retries(operation, is_transient=is_unavailable, sleep=sleep, rng=random.Random(seed))

    assert operation.calls == policy.attempts == 5
    assert 6.0 <= sum(sleep.delays) <= 12.0
    assert all(policy.delay_cap(n) / 2 <= delay for n, delay in enumerate(sleep.delays, start=1))
    assert policy.total_wait() == (6.0, 12.0)


def test_the_delay_cap_doubles_from_the_base_delay_up_to_the_maximum() -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.5, max_delay=3.0)
    assert [policy.delay_cap(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert RetryPolicy().delay_cap(10_000) == 5.0  # no overflow on absurd attempt counts


def test_success_after_transient_failures_returns_the_result() -> None:
    sleep, operation = Recorder(), Failing(*unavailable(2))
    result = call_with_retries(operation, is_transient=is_unavailable, policy=POLICY, sleep=sleep, rng=random.Random(1))
    assert result == "done"
    assert operation.calls == 3
    assert len(sleep.delays) == 2


@pytest.mark.parametrize("error", [NoSuchObject("s3://b/k: no such object"), AccessDenied("denied"), ValueError("x")])
def test_permanent_errors_are_raised_at_once(error: Exception) -> None:
    sleep, operation = Recorder(), Failing(error)
    with pytest.raises(type(error)) as raised:
        call_with_retries(operation, is_transient=is_unavailable, sleep=sleep)
    assert raised.value is error
    assert operation.calls == 1
    assert sleep.delays == []


def test_a_permanent_error_after_transient_ones_stops_the_retries() -> None:
    sleep, operation = Recorder(), Failing(BackendUnavailable("blip"), NoSuchObject("gone"), BackendUnavailable("x"))
    with pytest.raises(NoSuchObject, match="gone"):
        call_with_retries(operation, is_transient=is_unavailable, policy=POLICY, sleep=sleep, rng=random.Random(1))
    assert operation.calls == 2
    assert len(sleep.delays) == 1


def test_interrupts_are_never_retried() -> None:
    sleep, operation = Recorder(), Failing(KeyboardInterrupt())  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        call_with_retries(operation, is_transient=lambda exc: True, sleep=sleep)
    assert operation.calls == 1


def test_a_single_attempt_policy_never_sleeps() -> None:
    sleep, operation = Recorder(), Failing(*unavailable(1))
    with pytest.raises(BackendUnavailable):
        call_with_retries(operation, is_transient=is_unavailable, policy=RetryPolicy(attempts=1), sleep=sleep)
    assert sleep.delays == []


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"attempts": 0}, "retry attempts must be a whole number >= 1, got 0"),
        ({"attempts": 2.5}, "retry attempts must be a whole number >= 1, got 2.5"),
        ({"attempts": True}, "retry attempts must be a whole number >= 1, got True"),
        ({"base_delay": -1.0}, "retry base_delay must be a finite number of seconds >= 0, got -1.0"),
        ({"max_delay": -0.5}, "retry max_delay must be a finite number of seconds >= 0, got -0.5"),
        # A NaN delay would fail the sleep mid-retry; an infinite one would make a wait that never ends.
        ({"base_delay": math.nan}, "retry base_delay must be a finite number of seconds >= 0, got nan"),
        ({"max_delay": math.inf}, "retry max_delay must be a finite number of seconds >= 0, got inf"),
        ({"max_delay": "5"}, "retry max_delay must be a finite number of seconds >= 0, got '5'"),
    ],
)
def test_nonsensical_policies_are_refused_naming_the_field_and_value(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError) as raised:
        RetryPolicy(**fields)  # type: ignore[arg-type]
    assert str(raised.value) == named


def test_a_calls_first_retry_logs_one_info_line_with_the_attempt_and_delay_the_next_at_debug_no_foreign_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, every retry was an INFO line (four per failed read): during an outage, 100 lines a second."""
    caplog.set_level(logging.DEBUG, logger="silodlib.backends.retry")
    secret = "AccountKey=c2VjcmV0"
    operation = Failing(BackendUnavailable("s3://b/k: endpoint unreachable"), ConnectionError(secret))
    call_with_retries(
        operation,
        is_transient=lambda exc: True,
        policy=POLICY,
        sleep=Recorder(),
        rng=random.Random(3),
        describe="read s3://b/k",
    )
    lines = [r for r in caplog.records if r.name == "silodlib.backends.retry"]
    assert [r.levelno for r in lines] == [logging.INFO, logging.DEBUG]
    first, second = (r.getMessage() for r in lines)
    assert first.startswith("read s3://b/k failed on attempt 1 of 5, retrying in 0.")
    assert first.endswith("s: s3://b/k: endpoint unreachable")
    assert "attempt 2 of 5" in second and second.endswith(": ConnectionError")
    assert secret not in caplog.text


# --- RetryingBackend over a real local backend -------------------------------------------------------


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"0123456789")
    (root / "sub" / "b.bin").write_bytes(b"abcdef")
    (root / "sub" / "c.bin").write_bytes(b"")
    (root / "empty").mkdir()
    return root


def test_the_wrapper_serves_exactly_what_a_local_backend_serves(dataset_dir: Path) -> None:
    inner = open_backend(f"file://{dataset_dir}")
    sleep = Recorder()
    backend = RetryingBackend(inner, POLICY, sleep=sleep, rng=random.Random(1))

    assert sorted(backend.list(), key=lambda o: o.key) == sorted(inner.list(), key=lambda o: o.key)
    assert backend.stat("sub/b.bin") == inner.stat("sub/b.bin")
    assert backend.read("a.bin", 3, 4) == b"3456"
    assert backend.read("a.bin", 8, 100) == b"89"
    with pytest.raises(NoSuchObject):
        backend.read("missing", 0, 1)
    with pytest.raises(NoSuchObject):
        backend.stat("empty")
    assert sleep.delays == []  # permanent errors are not retried

    assert isinstance(backend, Backend)
    assert (backend.scheme, backend.option_names, backend.secret_options) == ("file", frozenset(), frozenset())
    assert backend.uri == inner.uri
    assert backend.object_uri("sub/b.bin") == f"file://{dataset_dir}/sub/b.bin"
    assert backend.is_transient(BackendUnavailable("x")) and not backend.is_transient(NoSuchObject("x"))
    backend.close()


def test_the_wrapper_delegates_scheme_and_options_of_a_remote_backend() -> None:
    inner = open_backend("s3://bucket/x", {"region": "us-east-1"})
    backend = RetryingBackend(inner)
    assert backend.scheme == "s3"
    assert backend.option_names == inner.option_names
    assert "secret_access_key" in backend.secret_options
    assert str(backend.uri) == "s3://bucket/x"
    backend.close()


class FlakyLocalBackend(LocalBackend):
    """A real local backend with injected faults: the first calls fail with `BackendUnavailable`."""

    def __init__(self, uri: DatasetURI, options: Mapping[str, str], *, failures: int, fail_list_after: int = 0) -> None:
        super().__init__(uri, options)
        self.failures = failures
        self.fail_list_after = fail_list_after
        self.calls = 0

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise BackendUnavailable(f"{self.uri}: injected failure")

    def stat(self, key: str) -> ObjectInfo:
        self._maybe_fail()
        return super().stat(key)

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        self._maybe_fail()
        return super().read(key, offset, length, version)

    def list(self) -> Iterator[ObjectInfo]:
        """Yield `fail_list_after` objects, then fail while failures remain (a listing dying mid-way)."""
        self.calls += 1
        for position, info in enumerate(super().list()):
            if position == self.fail_list_after and self.failures > 0:
                self.failures -= 1
                raise BackendUnavailable(f"{self.uri}: injected failure after {position} objects")
            yield info


def flaky(dataset_dir: Path, failures: int, fail_list_after: int = 0) -> FlakyLocalBackend:
    return FlakyLocalBackend(
        parse_dataset_uri(f"file://{dataset_dir}"), {}, failures=failures, fail_list_after=fail_list_after
    )


def test_stat_and_read_are_retried_with_flaky_backend_fake(dataset_dir: Path) -> None:
    inner = flaky(dataset_dir, failures=3)
    sleep = Recorder()
    backend = RetryingBackend(inner, POLICY, sleep=sleep, rng=random.Random(2))

    assert backend.read("a.bin", 0, 4) == b"0123"
    assert inner.calls == 4 and len(sleep.delays) == 3
    inner.failures = 2
    assert backend.stat("a.bin").size == 10
    assert inner.calls == 7 and len(sleep.delays) == 5

    inner.failures = 99
    with pytest.raises(BackendUnavailable, match="injected failure"):
        backend.read("a.bin", 0, 4)
    assert inner.calls == 12  # exactly `attempts` tries
    assert len(sleep.delays) == 9


def test_a_listing_that_fails_midway_restarts_without_duplicates_with_flaky_backend_fake(dataset_dir: Path) -> None:
    expected = sorted((o.key, o.is_dir) for o in open_backend(f"file://{dataset_dir}").list())
    inner = flaky(dataset_dir, failures=2, fail_list_after=2)
    sleep = Recorder()
    backend = RetryingBackend(inner, POLICY, sleep=sleep, rng=random.Random(2))

    listed = [(o.key, o.is_dir) for o in backend.list()]

    assert sorted(listed) == expected
    assert len(listed) == len(set(listed)) == 4
    assert inner.calls == 3 and len(sleep.delays) == 2


def test_a_listing_that_keeps_failing_without_progress_gives_up_with_flaky_backend_fake(dataset_dir: Path) -> None:
    inner = flaky(dataset_dir, failures=99, fail_list_after=1)
    sleep = Recorder()
    backend = RetryingBackend(inner, POLICY, sleep=sleep, rng=random.Random(2))

    listed: list[ObjectInfo] = []
    with pytest.raises(BackendUnavailable, match="after 1 objects"):
        listed.extend(backend.list())
    assert len(listed) == 1  # yielded once, not once per restart
    # The first failure followed progress; then `attempts` consecutive tries brought nothing new.
    assert inner.calls == POLICY.attempts
    assert len(sleep.delays) == POLICY.attempts - 1


class Clock:
    """An injected clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "silodlib.backends.retry"]


def test_a_backends_retries_are_logged_at_info_once_per_interval_the_rest_at_debug_counted_on_the_next_info_line(
    dataset_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As a job's failed reads are (fuseclient/failure_log.py): the first retry of an outage at once, then at most
    one INFO line per LOG_INTERVAL for the dataset, counting those left to DEBUG; every line with its fields."""
    caplog.set_level(logging.DEBUG, logger="silodlib.backends.retry")
    inner, clock = flaky(dataset_dir, failures=3), Clock()
    backend = RetryingBackend(inner, POLICY, sleep=Recorder(), rng=random.Random(2), clock=clock)

    assert backend.read("a.bin", 0, 4) == b"0123"  # three retries: INFO, DEBUG, DEBUG
    clock.now += retry.LOG_INTERVAL - 0.01
    inner.failures = 1
    assert backend.stat("a.bin").size == 10  # still within the interval: DEBUG
    clock.now += 0.01
    inner.failures = 1
    assert backend.read("sub/b.bin", 1, 2) == b"bc"  # the interval is over: INFO, counting the three at DEBUG

    lines = retry_lines(caplog)
    levels = [r.levelno for r in lines]
    assert levels == [logging.INFO, logging.DEBUG, logging.DEBUG, logging.DEBUG, logging.INFO]
    messages = [r.getMessage() for r in lines]
    assert messages[0].startswith(f"read file://{dataset_dir}/a.bin [0, +4] failed on attempt 1 of 5, retrying in ")
    assert messages[3].startswith(f"stat file://{dataset_dir}/a.bin failed on attempt 1 of 5")
    assert not any("more retries" in message for message in messages[:4])
    assert messages[4].startswith(f"read file://{dataset_dir}/sub/b.bin [1, +2] failed on attempt 1 of 5")
    assert messages[4].endswith(" (3 more retries logged at DEBUG since the last such line)")
    assert all(getattr(r, "dataset_uri", None) == f"file://{dataset_dir}" for r in lines)


class FailingFirstTries(LocalBackend):
    """A real local backend whose reads fail the first `failures` tries of each thread that reads."""

    def __init__(self, uri: DatasetURI, failures: int) -> None:
        super().__init__(uri, {})
        self._failures = failures
        self._tries = threading.local()

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        self._tries.count = tries = getattr(self._tries, "count", 0) + 1
        if tries <= self._failures:
            raise BackendUnavailable(f"{self.uri}: injected failure {tries}")
        return super().read(key, offset, length, version)


READERS = 16


def test_sixteen_readers_retrying_through_an_outage_log_one_info_line_not_one_per_retry(
    dataset_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hunt's outage: 16 readers, each read failing four times; every retry was an INFO line."""
    caplog.set_level(logging.DEBUG, logger="silodlib.backends.retry")
    inner = FailingFirstTries(parse_dataset_uri(f"file://{dataset_dir}"), failures=4)
    # The real clock: the test's 64 retries, which wait nothing, take far less than the log's interval.
    backend = RetryingBackend(inner, POLICY, sleep=lambda seconds: None)
    start = threading.Barrier(READERS)
    results: list[bytes] = []

    def reader() -> None:
        start.wait()
        results.append(backend.read("a.bin", 0, 10))

    threads = [threading.Thread(target=reader) for _ in range(READERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert results == [b"0123456789"] * READERS
    levels = [r.levelno for r in retry_lines(caplog)]
    assert len(levels) == 4 * READERS  # every retry still logged, at DEBUG
    assert levels.count(logging.INFO) == 1  # before: 64 INFO lines


def test_a_permanent_listing_error_is_raised_at_once(tmp_path: Path) -> None:
    (tmp_path / "gone").mkdir()
    backend = RetryingBackend(open_backend(f"file://{tmp_path / 'gone'}"), POLICY, sleep=(sleep := Recorder()))
    (tmp_path / "gone").rmdir()
    with pytest.raises(NoSuchObject):
        list(backend.list())
    assert sleep.delays == []


# --- a real unreachable endpoint ---------------------------------------------------------------------


def test_an_unreachable_s3_endpoint_is_tried_exactly_attempts_times_waiting_six_to_twelve_seconds_in_all() -> None:
    """A refused connection fails at once: the tries of a read of a dead backend are spread over the policy's
    waits (which before could all but vanish: five tries in 0.2 s), and the read still fails, in bounded time."""
    inner = open_backend(
        "s3://bucket/x",
        {
            "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "region": "us-east-1",
            "access_key_id": "a",
            "secret_access_key": "b",
            "path_style": "true",
        },
    )
    sleep = Recorder()
    backend = RetryingBackend(inner, sleep=sleep, rng=random.Random(4))
    try:
        with pytest.raises(BackendUnavailable, match="unreachable"):
            backend.stat("some/key")
        assert len(sleep.delays) == RetryPolicy().attempts - 1  # five attempts, four waits between them
        assert 6.0 <= sum(sleep.delays) <= 12.0 and RetryPolicy().total_wait() == (6.0, 12.0)
    finally:
        backend.close()
