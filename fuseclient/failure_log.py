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
from dataclasses import dataclass

from silodlib.backends import AccessDenied, BackendError
from silodlib.logfields import log_ids

log = logging.getLogger("fuseclient.fs")

LOG_INTERVAL = 10.0  # seconds between two lines of one job's failed reads
_KEPT_JOBS = 1024  # jobs remembered at most; the quietest are forgotten first (a job that comes back logs at once)


@dataclass(slots=True)
class _Quiet:
    logged_at: float
    left_out: int = 0


class ReadFailureLog:
    """Per job, when its failed reads were last logged and how many were left out since."""

    def __init__(self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._jobs: dict[str, _Quiet] = {}

    def failed(self, job_id: str, dataset_uri: str, exc: BackendError) -> None:
        """Log a failed read of `job_id`'s, unless one was logged less than the interval ago."""
        now = self._clock()
        quiet = self._jobs.get(job_id)
        if quiet is not None and now - quiet.logged_at < self._interval:
            quiet.left_out += 1
            return
        left_out = 0 if quiet is None else quiet.left_out
        self._jobs.pop(job_id, None)
        self._jobs[job_id] = _Quiet(now)  # the most recent last: `_forget` drops from the front
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
