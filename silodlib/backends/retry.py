"""One shared retry with jittered exponential backoff, and a backend wrapper that applies it.

Backends classify failures (`Backend.is_transient`: only `BackendUnavailable` is worth retrying) and keep
their SDK-level retries short; the decision to wait and try again is made here, once, for every backend.
The waits are `silodlib.backoff`'s with full jitter (a uniform delay between 0 and an exponentially growing
cap). The sleep and the random source are injected so tests run without waiting and deterministically.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from silodlib.backends.base import Backend, BackendError, ObjectInfo
from silodlib.backoff import Backoff
from silodlib.logfields import log_ids

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure.

    `attempts` counts every try, the first included. Before try n+1 the delay is uniform in
    [0, min(max_delay, base_delay * 2**(n-1))] seconds: at most `base_delay` before the second try.
    """

    attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retry attempts must be >= 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("retry delays must be >= 0 seconds")

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.base_delay, self.max_delay)

    def delay_cap(self, failed_attempt: int) -> float:
        """The largest delay after try number `failed_attempt` (1-based) failed."""
        return self.backoff.cap(failed_attempt)


def call_with_retries(
    operation: Callable[[], T],
    *,
    is_transient: Callable[[BaseException], bool],
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    describe: str = "",
    log_fields: Mapping[str, str] | None = None,
) -> T:
    """Return `operation()`, retrying it after a jittered delay while it fails transiently.

    An exception for which `is_transient` is False is re-raised at once; after `policy.attempts` tries the
    last exception is re-raised. Each retry logs one INFO line with the attempt number and the delay, and
    `log_fields` (silodlib.logfields) as its fields.
    Only `BaseException`s that are not `Exception`s (KeyboardInterrupt, cancellation) are never retried.
    """
    failed = 0
    while True:
        try:
            return operation()
        except Exception as exc:
            failed += 1
            if failed >= policy.attempts or not is_transient(exc):
                raise
            _wait_before_retry(exc, failed, policy, sleep, rng, describe, log_fields)


def _wait_before_retry(
    exc: Exception,
    failed: int,
    policy: RetryPolicy,
    sleep: Callable[[float], None],
    rng: random.Random | None,
    describe: str,
    log_fields: Mapping[str, str] | None,
) -> None:
    delay = policy.backoff.delay(failed, rng)
    log.info(
        "%s failed on attempt %d of %d, retrying in %.3f s: %s",
        describe or "storage operation",
        failed,
        policy.attempts,
        delay,
        _safe_text(exc),
        extra=log_fields,
    )
    sleep(delay)


def _safe_text(exc: BaseException) -> str:
    """Our exceptions' messages are scrubbed of credentials by the backends; others are shown by type only."""
    return str(exc) if isinstance(exc, BackendError) else type(exc).__name__


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
    was built), which is why `Backend.__init__` is not called.

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
    ) -> None:
        self.inner = inner
        self.uri = inner.uri
        self._log_fields = log_ids(dataset_uri=str(inner.uri))
        self.policy = policy
        self._sleep = sleep
        self._rng = rng

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
            _wait_before_retry(
                failure, failed, self.policy, self._sleep, self._rng, f"listing {self.uri}", self._log_fields
            )

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
        return call_with_retries(
            operation,
            is_transient=self.inner.is_transient,
            policy=self.policy,
            sleep=self._sleep,
            rng=self._rng,
            describe=describe,
            log_fields=self._log_fields,
        )
