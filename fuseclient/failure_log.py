"""Logging the reads storage fails, at a rate a log can take.

A job whose storage refuses every read (credentials expired, a key rotated) fails each read its loader makes, and
the kernel tries each once more: a loader skipping errors made 600 failed reads in 3 s, and the node logged every
one (50 kB/s of WARNING lines per job, which fill a disk in a day). So each job's first failure is logged at
once, and the failures after it at most once every `interval` seconds, that line counting the ones left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from silodlib.backends import AccessDenied, BackendError
from silodlib.line_rate import LineRate
from silodlib.logfields import log_ids

log = logging.getLogger("fuseclient.fs")

LOG_INTERVAL = 10.0  # seconds between two lines of one job's failed reads
_KEPT_JOBS = 1024  # jobs remembered at most; the quietest are forgotten first (a job that comes back logs at once)


class ReadFailureLog:
    """Per job, when its failed reads were last logged and how many were left out since."""

    def __init__(self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._jobs: dict[str, LineRate] = {}

    def failed(self, job_id: str, dataset_uri: str, exc: BackendError) -> None:
        """Log a failed read of `job_id`'s, unless one was logged less than the interval ago."""
        rate = self._jobs.get(job_id) or LineRate(self._interval)
        left_out = rate.due(self._clock())
        if left_out is None:
            return
        self._jobs.pop(job_id, None)
        self._jobs[job_id] = rate  # the most recently logged last: `_forget` drops from the front
        self._forget()
        log.warning(
            "job %s: read %s: %s%s",
            job_id,
            "refused by storage" if isinstance(exc, AccessDenied) else "failed",
            exc,
            f" ({left_out} more failed reads of this job since the last such line)" if left_out else "",
            extra=log_ids(job_id=job_id, dataset_uri=dataset_uri),
        )

    def _forget(self) -> None:
        while len(self._jobs) > _KEPT_JOBS:
            del self._jobs[next(iter(self._jobs))]
