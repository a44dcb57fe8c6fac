"""One shared retry with jittered exponential backoff, and a backend wrapper that applies it.

Backends classify failures (`Backend.is_transient`: only `BackendUnavailable` is worth retrying) and keep
their SDK-level retries short; the decision to wait and try again is made here, once, for every backend.
The waits are `silodlib.backoff`'s with equal jitter, so that the tries of a call span a known least time
whatever is drawn: a network blip shorter than that is ridden out even where each try fails at once (a refused
connection). docs/backends.md defends the defaults. The retries are logged at a rate a log can take
(`RetryLog`). The sleep, the random source and the log's clock are injected so tests run without waiting and
deterministically.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from silodlib.backends.base import Backend, BackendError, ObjectInfo
from silodlib.backoff import EQUAL_JITTER, Backoff
from silodlib.line_rate import LineRate
from silodlib.logfields import log_ids

log = logging.getLogger(__name__)

T = TypeVar("T")

LOG_INTERVAL = 10.0  # seconds between two INFO lines of one backend's retries (as between a job's failed reads)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure.

    `attempts` counts every try, the first included: a backend that keeps failing fails a call after exactly that
    many. Before try n+1 the delay is uniform in [cap / 2, cap] seconds, where cap = min(max_delay,
    base_delay * 2**(n-1)) ("equal jitter"): never less than half the cap, so the waits of a call that fails every
    try add up to at least half the caps' sum (`total_wait`). By default 0.5-1, 1-2, 2-4 and 2.5-5 s: 6-12 s in
    all, which bridges an outage of a few seconds even where each try fails at once; full jitter's waits could
    all come out near 0.
    """

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"retry attempts must be a whole number >= 1, got {self.attempts!r}")
        for name in ("base_delay", "max_delay"):
            _check_seconds(name, getattr(self, name))

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.base_delay, self.max_delay, EQUAL_JITTER)

    def delay_cap(self, failed_attempt: int) -> float:
        """The largest delay after try number `failed_attempt` (1-based) failed."""
        return self.backoff.cap(failed_attempt)

    def total_wait(self) -> tuple[float, float]:
        """The least and the most seconds a call whose every try fails waits in all: it rides out an outage of
        failures that come at once (refused connections) shorter than the least, and fails, when storage is down,
        after its tries and at most the most."""
        return self.backoff.total(self.attempts - 1)


def _check_seconds(name: str, value: object) -> None:
    """Refuse a delay that is not a finite number of seconds >= 0 (NaN or infinity would make a wait that never
    ends, or a sleep that raises mid-retry), naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"retry {name} must be a finite number of seconds >= 0, got {value!r}")


class RetryLog:
    """The log lines of one backend's retries, at a rate a log can take.

    During an outage every read of every reader retries: 16 readers wrote 100 INFO lines a second, four per
    failed read. So the first retry is logged at INFO, and the retries in the `LOG_INTERVAL` seconds after it at
    DEBUG only; the first retry after that is at INFO again, counting the retries logged at DEBUG since the last
    INFO line. Each line names the call, the attempt, the delay and the failure, with `fields`
    (silodlib.logfields) as its structured fields. Thread-safe: a backend's calls run in many threads.
    """

    def __init__(self, fields: Mapping[str, str] | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._fields = dict(fields or {})
        self._clock = clock
        self._lock = threading.Lock()
        self._info = LineRate(LOG_INTERVAL)  # the INFO lines; the retries it leaves out are logged at DEBUG only

    def retrying(self, describe: str, failed: int, attempts: int, delay: float, exc: BaseException) -> None:
        """Log that `describe` failed on try `failed` of `attempts` with `exc` and is tried again in `delay` s."""
        with self._lock:
            at_debug = self._info.due(self._clock())
        log.log(
            logging.DEBUG if at_debug is None else logging.INFO,
            "%s failed on attempt %d of %d, retrying in %.3f s: %s%s",
            describe or "storage operation",
            failed,
            attempts,
            delay,
            _safe_text(exc),
            f" ({at_debug} more retries logged at DEBUG since the last such line)" if at_debug else "",
            extra=self._fields,
        )


def _safe_text(exc: BaseException) -> str:
    """Our exceptions' messages are scrubbed of credentials by the backends; others are shown by type only."""
    return str(exc) if isinstance(exc, BackendError) else type(exc).__name__


@dataclass(frozen=True, slots=True)
class _Waits:
    """How a retried call waits between tries and where it logs its retries."""

    policy: RetryPolicy
    sleep: Callable[[float], None]
    rng: random.Random | None
    log: RetryLog

    def before_retry(self, exc: Exception, failed: int, describe: str) -> None:
        """Log and wait out the delay after try `failed` (1-based) failed with `exc`."""
        delay = self.policy.backoff.delay(failed, self.rng)
        self.log.retrying(describe, failed, self.policy.attempts, delay, exc)
        self.sleep(delay)


def call_with_retries(
    operation: Callable[[], T],
    *,
    is_transient: Callable[[BaseException], bool],
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    describe: str = "",
    retry_log: RetryLog | None = None,
) -> T:
    """Return `operation()`, retrying it after a jittered delay while it fails transiently.

    An exception for which `is_transient` is False is re-raised at once; after `policy.attempts` tries the
    last exception is re-raised. Each retry is logged to `retry_log` (by default one of this call's own, so its
    first retry is at INFO and the rest of its retries within `LOG_INTERVAL` at DEBUG).
    Only `BaseException`s that are not `Exception`s (KeyboardInterrupt, cancellation) are never retried.
    """
    return _with_retries(operation, is_transient, _Waits(policy, sleep, rng, retry_log or RetryLog()), describe)


def _with_retries(
    operation: Callable[[], T], is_transient: Callable[[BaseException], bool], waits: _Waits, describe: str
) -> T:
    failed = 0
    while True:
        try:
            return operation()
        except Exception as exc:
            failed += 1
            if failed >= waits.policy.attempts or not is_transient(exc):
                raise
            waits.before_retry(exc, failed, describe)


class _FromInner(Generic[T]):
    """A class attribute of the wrapped backend, read through the wrapper instance."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, wrapper: RetryingBackend | None, owner: type | None = None) -> T:
        if wrapper is None:
            raise AttributeError(f"RetryingBackend.{self._name} depends on the wrapped backend")
        value: T = getattr(wrapper.inner, self._name)
        return value


class RetryingBackend(Backend):
    """The wrapped backend's interface, with `list`, `stat` and `read` retried on transient errors.

    Permanent errors (`NoSuchObject`, `AccessDenied`, bad arguments) pass through at once. `scheme`,
    `option_names`, `secret_options`, `url_options`, `uri`, `is_transient`, `object_uri` and `close` are the
    wrapped backend's: the wrapper neither takes options nor validates them again (the wrapped backend did when it
    was built), which is why `Backend.__init__` is not called. All its calls' retries share one `RetryLog`, so a
    dataset's retries are logged at INFO at most once per `LOG_INTERVAL` however many readers retry; `clock` is
    that log's.

    A listing that fails midway is restarted from the beginning and the objects already yielded are
    skipped (by key and kind), so the caller sees each object once. That costs a set of the yielded keys,
    about what the caller keeps anyway to build a manifest. Failures count against `policy.attempts` only
    while the restarted listing yields nothing new: a listing of millions of objects that hits a rare
    transient error every few thousand pages still completes, one that fails at the same place does not.
    """

    scheme = _FromInner[str]()
    option_names = _FromInner[frozenset[str]]()
    secret_options = _FromInner[frozenset[str]]()
    url_options = _FromInner[frozenset[str]]()

    def __init__(
        self,
        inner: Backend,
        policy: RetryPolicy = RetryPolicy(),
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.policy = policy
        self._waits = _Waits(policy, sleep, rng, RetryLog(log_ids(dataset_uri=str(inner.uri)), clock=clock))

    def list(self) -> Iterator[ObjectInfo]:
        yielded: set[tuple[str, bool]] = set()
        failed = 0
        while True:
            listing = self.inner.list()
            progressed = False
            try:
                while True:
                    try:
                        info = next(listing)
                    except StopIteration:
                        return
                    except Exception as exc:
                        failure = exc
                        break
                    identity = (info.key, info.is_dir)
                    if identity not in yielded:
                        yielded.add(identity)
                        progressed = True
                        yield info
            finally:
                close = getattr(listing, "close", None)
                if close is not None:
                    close()
            failed = 1 if progressed else failed + 1
            if failed >= self.policy.attempts or not self.is_transient(failure):
                raise failure
            self._waits.before_retry(failure, failed, f"listing {self.uri}")

    def stat(self, key: str) -> ObjectInfo:
        return self._retried(lambda: self.inner.stat(key), f"stat {self.object_uri(key)}")

    def read(self, key: str, offset: int, length: int, version: str | None = None) -> bytes:
        return self._retried(
            lambda: self.inner.read(key, offset, length, version), f"read {self.object_uri(key)} [{offset}, +{length}]"
        )

    def close(self) -> None:
        self.inner.close()

    def is_transient(self, exc: BaseException) -> bool:
        return self.inner.is_transient(exc)

    def object_uri(self, key: str) -> str:
        return self.inner.object_uri(key)

    def _retried(self, operation: Callable[[], T], describe: str) -> T:
        return _with_retries(operation, self.inner.is_transient, self._waits, describe)
