"""Storage faults a deployment sees, driven against the real servers (moto, Azurite) through a real mount.

A proxy in front of the real server (tests/fault_proxy.py) stalls an answer mid-body, trickles it a byte at a
time or answers "busy" (503), as an overloaded or hanging storage node does; a dedicated Azurite is killed and
restarted under a running epoch. Whatever happens, a reader gets the object's exact bytes or EIO, never a short
or wrong read, and the retries silod makes are the ones its log reports.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from datamgr.devservers import azure_client, free_port
from silodlib.backends import InvalidBackendOption, RetryingBackend, RetryPolicy, open_backend, retry
from silodlib.backends.uri import parse_dataset_uri
from silodlib.scrub import REDACTED
from tests import polling
from tests.datamgr_fixtures import SILOD, DataManagerProcess, silod_cli
from tests.fault_proxy import AZURE_SERVER_BUSY, S3_SLOW_DOWN, FaultProxy, RestartableAzurite
from tests.mount_fixtures import MountFactory, MountProcess, options_args
from tests.storage_servers import DatasetTarget, DatasetTargetFactory

# Seconds a mount that meets stalls waits for the next bytes of an answer: short, so the tests do not wait long,
# and far above what a loopback server under load takes to answer.
READ_TIMEOUT = 1.0
ATTEMPTS = RetryPolicy().attempts  # what the mount uses
FAULTY = "faulty.bin"
OTHER = "other.bin"


@dataclass
class ProxiedDataset:
    """A dataset on a real server, reached through a fault proxy: `options` point the backend at the proxy."""

    backend: str
    target: DatasetTarget
    proxy: FaultProxy
    options: dict[str, str]
    files: dict[str, bytes]

    @property
    def busy_answer(self) -> tuple[str, bytes]:
        return S3_SLOW_DOWN if self.backend == "s3" else AZURE_SERVER_BUSY


@pytest.fixture(params=["s3", "az"])
def proxied(request: pytest.FixtureRequest, dataset_target_factory: DatasetTargetFactory) -> Iterator[ProxiedDataset]:
    """Two 256 KiB objects (seeded random bytes) on moto or Azurite, and a fault proxy in front of the server."""
    backend: str = request.param
    target = dataset_target_factory(backend)
    rng = random.Random(20)
    files = {FAULTY: rng.randbytes(256 * 1024), OTHER: rng.randbytes(256 * 1024)}
    for key, data in files.items():
        target.put(key, data)
    url_option = "endpoint_url" if backend == "s3" else "account_url"
    server = urlsplit(target.options[url_option])
    assert server.hostname is not None and server.port is not None
    with FaultProxy((server.hostname, server.port)) as proxy:
        options = {**target.options, url_option: proxy.url + server.path}
        yield ProxiedDataset(backend, target, proxy, options, files)


class BackgroundRead:
    """Reads a whole file through the mount in a thread, so that a read that hangs fails the test at a deadline
    instead of hanging it."""

    def __init__(self, path: Path) -> None:
        self.data: bytes | None = None
        self.error: OSError | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(path,), daemon=True).start()

    def _run(self, path: Path) -> None:
        try:
            self.data = path.read_bytes()
        except OSError as exc:
            self.error = exc
        finally:
            self._done.set()

    def finished(self, within: float, what: str) -> BackgroundRead:
        polling.eventually(self._done.is_set, what=what, timeout=within, interval=0.05)
        return self


@pytest.fixture
def retries_at_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mounts started in the test log at DEBUG, where every retry has its line: at INFO a dataset's retries are
    logged once per `retry.LOG_INTERVAL` (`retry.RetryLog`), and the tests that use this count them all."""
    monkeypatch.setenv("SILOD_LOG_LEVEL", "DEBUG")


def retries_logged(mount: MountProcess, object_uri: str) -> int:
    """How many retries of reads of `object_uri` the mount's log reports (one line per retry, in a mount logging
    at DEBUG: `retries_at_debug`)."""
    pattern = re.compile(rf"read {re.escape(object_uri)} \[\d+, \+\d+\] failed on attempt \d+ of \d+, retrying")
    return len(pattern.findall(mount.log_path.read_text()))


def slowest_failure(read_timeout: float, tries: int, fuse_reads: int = 1) -> float:
    """Seconds for `fuse_reads` reads through the mount that each make `tries` backend reads that each time out,
    with every backoff delay the retry policy may add, plus slack for a loaded machine: the deadline of a poll,
    not a measured bound."""
    _, most_waited = RetryPolicy().total_wait()
    return fuse_reads * (tries * read_timeout + most_waited) + 20.0


def failed_reads_logged(mount: MountProcess, object_uri: str) -> int:
    """How many lines the mount logged of reads that failed on `object_uri` (a WARNING line for a job's first
    failure, then at most one every `failure_log.LOG_INTERVAL`)."""
    return mount.log_path.read_text().count(f"read failed: {object_uri}:")


# --- the read timeout ------------------------------------------------------------------------------------------

AZURE_KEY = "c2lsb2Qta2V5"  # any base64: no request is made


@pytest.mark.parametrize("uri", ["s3://bucket/data", "az://account/container/data"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "3601", "30s", "soon", "9" * 100])
def test_a_read_timeout_that_is_not_seconds_in_range_is_refused_naming_the_value(uri: str, value: str) -> None:
    options = {"read_timeout": value} | ({"account_key": AZURE_KEY} if uri.startswith("az") else {})
    with pytest.raises(InvalidBackendOption) as raised:
        open_backend(uri, options)
    message = str(raised.value)
    assert message.startswith(f"{uri}: option 'read_timeout' must be a number of seconds greater than 0")
    assert repr(value if len(value) <= 40 else value[:40] + "...") in message  # long values cut short


@pytest.mark.parametrize("uri", ["s3://bucket/data", "az://account/container/data"])
def test_a_read_timeout_in_seconds_is_accepted_by_both_remote_backends(uri: str) -> None:
    options = {"read_timeout": "0.5"} | ({"account_key": AZURE_KEY} if uri.startswith("az") else {})
    open_backend(uri, options).close()


# --- a server that stalls mid-body ------------------------------------------------------------------------------

# Azure's SDK downloader itself re-sends a GET whose body fails, up to 3 tries 1 s apart, before it gives up to
# silod: 3 stalled answers reach silod's retry as one failure there, and as three on S3.
STALLS = 3
SILOD_RETRIES_AFTER_STALLS = {"s3": 3, "az": 1}


@pytest.mark.usefixtures("retries_at_debug")
def test_an_answer_stalling_mid_body_times_out_is_retried_and_the_reader_gets_the_exact_bytes(
    mount_factory: MountFactory, proxied: ProxiedDataset
) -> None:
    data = proxied.files[FAULTY]
    proxied.proxy.stall(FAULTY, STALLS, after_bytes=len(data) // 2)
    mount = mount_factory(
        {"job": proxied.target.uri}, *options_args({**proxied.options, "read_timeout": str(READ_TIMEOUT)})
    )

    read = BackgroundRead(mount.job_dir("job") / FAULTY).finished(
        slowest_failure(READ_TIMEOUT, STALLS + 1), "the read of the stalled object to finish"
    )

    assert read.error is None and read.data == data  # exactly the bytes: the half body was never served
    gets = proxied.proxy.gets(FAULTY)
    assert [g.fault for g in gets] == ["stall"] * STALLS + [None]
    polling.eventually(  # the client hung up on every stalled answer: it timed out
        lambda: proxied.proxy.stalls_in_progress() == 0, what="the client hanging up on every stalled answer"
    )
    object_uri = f"{proxied.target.uri}/{FAULTY}"
    assert retries_logged(mount, object_uri) == SILOD_RETRIES_AFTER_STALLS[proxied.backend]
    assert failed_reads_logged(mount, object_uri) == 0  # not even an EIO that the kernel's own re-read hid


@pytest.mark.parametrize("proxied", ["s3"], indirect=True)
@pytest.mark.usefixtures("retries_at_debug")
def test_a_stall_longer_than_timeout_times_attempts_ends_in_eio_and_the_mount_serves_on(
    mount_factory: MountFactory, proxied: ProxiedDataset
) -> None:
    # S3 only: Azure's downloader triples every try (see STALLS), which would make this test minutes long.
    data = proxied.files[FAULTY]
    proxied.proxy.stall(FAULTY, 1_000_000, after_bytes=len(data) // 2)  # stalls for as long as the test runs
    mount = mount_factory(
        {"job": proxied.target.uri}, *options_args({**proxied.options, "read_timeout": str(READ_TIMEOUT)})
    )

    # The kernel asks again for a page its read-ahead failed to get: the reader's EIO may take two reads.
    read = BackgroundRead(mount.job_dir("job") / FAULTY).finished(
        slowest_failure(READ_TIMEOUT, ATTEMPTS, fuse_reads=2), "the read of the stalled object to end in EIO"
    )

    assert read.data is None and read.error is not None and read.error.errno == errno.EIO
    object_uri = f"{proxied.target.uri}/{FAULTY}"
    gets = proxied.proxy.gets(FAULTY)
    failed = len(gets) // ATTEMPTS  # the reads that reached the backend and failed: one, or two with the kernel's
    assert failed >= 1
    assert [g.fault for g in gets] == ["stall"] * ATTEMPTS * failed  # each tried exactly the attempts, timing out
    assert 1 <= failed_reads_logged(mount, object_uri) <= failed  # a re-read within the log's interval is counted
    polling.eventually(
        lambda: proxied.proxy.stalls_in_progress() == 0, what="the client hanging up on every stalled answer"
    )
    assert retries_logged(mount, object_uri) == (ATTEMPTS - 1) * failed
    # The failure poisons nothing: the other object, and the stalled one once the server answers, read right.
    proxied.proxy.heal()
    assert (mount.job_dir("job") / OTHER).read_bytes() == proxied.files[OTHER]
    assert (mount.job_dir("job") / FAULTY).read_bytes() == data


# --- a server that trickles -----------------------------------------------------------------------------------

TRICKLES = 2
TRICKLE_EVERY = 0.25  # seconds between bytes, well within READ_TIMEOUT: only the read's deadline can end the try
MIN_READ_RATE = 64 * 1024  # bytes/s: a try of the 256 KiB object gets READ_TIMEOUT + 4 s
# What a trickled read costs each backend's retries: on S3 each cut try is one silod retry. On Azure the SDK's
# downloader re-sends the GET of the body that was cut, within the same try, whose deadline has passed: the
# re-sent request (the second trickled answer) is cut as it starts waiting for its answer, a failure the SDK
# leaves to silod's retry, which gets the good answer.
GETS_AFTER_TRICKLES = ["trickle"] * TRICKLES + [None]
SILOD_RETRIES_AFTER_TRICKLES = {"s3": TRICKLES, "az": 1}


@pytest.mark.usefixtures("retries_at_debug")
def test_an_answer_trickling_within_the_read_timeout_is_cut_at_the_reads_deadline_and_the_reader_gets_the_bytes(
    mount_factory: MountFactory, proxied: ProxiedDataset
) -> None:
    data = proxied.files[FAULTY]
    proxied.proxy.trickle(FAULTY, TRICKLES, every=TRICKLE_EVERY)
    options = {**proxied.options, "read_timeout": str(READ_TIMEOUT), "min_read_rate": str(MIN_READ_RATE)}
    mount = mount_factory({"job": proxied.target.uri}, *options_args(options))

    deadline = READ_TIMEOUT + len(data) / MIN_READ_RATE  # of one try; the trickle would take 18 hours
    read = BackgroundRead(mount.job_dir("job") / FAULTY).finished(
        slowest_failure(deadline, TRICKLES + 1), "the read of the trickling object to finish"
    )

    assert read.error is None and read.data == data  # exactly the bytes: the trickled ones were never served
    assert [g.fault for g in proxied.proxy.gets(FAULTY)] == GETS_AFTER_TRICKLES
    polling.eventually(  # every trickling answer was cut, not left to run
        lambda: proxied.proxy.trickles_in_progress() == 0, what="the client cutting every trickling answer"
    )
    object_uri = f"{proxied.target.uri}/{FAULTY}"
    assert retries_logged(mount, object_uri) == SILOD_RETRIES_AFTER_TRICKLES[proxied.backend]
    assert "the answer came slower than min_read_rate 65.5 kB/s" in mount.log_path.read_text()
    assert failed_reads_logged(mount, object_uri) == 0


# A listing page's deadline is READ_TIMEOUT plus the most a page's answer can hold at `min_read_rate`: at this rate
# 1-3 s for either backend's page bound, where the trickle of even a two-object page would take over an hour; and
# the deadline of a stat or of a read of one of the 256 KiB objects is READ_TIMEOUT and a few hundredths.
FAST_MIN_READ_RATE = 16_000_000  # bytes/s


@pytest.mark.parametrize("framing", ["its own framing", "the end of the connection"])
def test_a_listing_page_trickling_within_the_read_timeout_is_cut_at_its_deadline_and_the_listing_retried(
    proxied: ProxiedDataset, caplog: pytest.LogCaptureFixture, framing: str
) -> None:
    """Also when the page is delimited by the end of the connection, where the cut reads as the page's end: an
    SDK would parse what came as a whole (shorter) page, and the listing would lack objects without an error."""
    location = parse_dataset_uri(proxied.target.uri).location
    listed = location[0] if proxied.backend == "s3" else location[1]  # the bucket or container: what a listing GETs
    proxied.proxy.trickle(listed, TRICKLES, every=TRICKLE_EVERY, until_close=framing == "the end of the connection")
    options = {**proxied.options, "read_timeout": str(READ_TIMEOUT), "min_read_rate": str(FAST_MIN_READ_RATE)}
    backend = RetryingBackend(open_backend(proxied.target.uri, options))
    caplog.set_level(logging.DEBUG, logger="silodlib.backends.retry")  # every retry: at INFO, one per interval

    listing = polling.outcome_within(
        slowest_failure(READ_TIMEOUT + 3, TRICKLES + 1), lambda: sorted(info.key for info in backend.list())
    )
    backend.close()

    assert listing == {"result": sorted(proxied.files)}  # {"hung": True}: the trickling listing was never cut
    faults = [g.fault for g in proxied.proxy.gets(listed)]
    assert faults[:TRICKLES] == ["trickle"] * TRICKLES and faults[-1] is None and set(faults) == {"trickle", None}
    polling.eventually(lambda: proxied.proxy.trickles_in_progress() == 0, what="every trickling page cut")
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"listing {proxied.target.uri}")]
    assert retries and all("the answer came slower than min_read_rate 16.0 MB/s" in message for message in retries)


@pytest.mark.parametrize("after_bytes", [0, 200], ids=["after its headers", "mid-page"])
def test_a_listing_page_cut_short_by_the_server_is_retried_not_parsed_as_a_page(
    proxied: ProxiedDataset, after_bytes: int
) -> None:
    """A server that dies mid-answer: the page is shorter than its framing says. Cut right after its headers, S3's
    empty body was parsed as an empty last page (botocore has urllib3 accept short bodies), and the dataset would
    have registered without its objects; cut mid-page, the Azure SDK let the `requests` error through, taken for
    a permanent failure. Either must be retried as a lost connection, as often as the retry policy allows: two
    cuts in a row, more than either SDK's own retry takes."""
    location = parse_dataset_uri(proxied.target.uri).location
    listed = location[0] if proxied.backend == "s3" else location[1]
    proxied.proxy.cut(listed, 2, after_bytes=after_bytes)
    backend = RetryingBackend(open_backend(proxied.target.uri, proxied.options))

    try:
        keys = sorted(info.key for info in backend.list())
    finally:
        backend.close()

    assert keys == sorted(proxied.files)
    assert [g.fault for g in proxied.proxy.gets(listed)] == ["cut", "cut", None]


def test_a_server_that_ignores_the_range_and_sends_the_whole_object_gives_the_reader_the_range_asked_for(
    proxied: ProxiedDataset,
) -> None:
    """HTTP lets a server answer a ranged GET with 200 and the whole object (an old proxy or CDN in front of the
    store does): the range is cut from it, not taken for the range (a mount read that as a changed object)."""
    proxied.proxy.whole(FAULTY, 2)
    backend = open_backend(proxied.target.uri, proxied.options)
    try:
        middle = backend.read(FAULTY, 100_000, 50_000)
        end = backend.read(FAULTY, 250_000, 50_000)  # past the object's end: short
        after = backend.read(FAULTY, 0, 1_000)  # a ranged answer again, on a connection of the same pool
    finally:
        backend.close()

    data = proxied.files[FAULTY]
    assert (middle, end, after) == (data[100_000:150_000], data[250_000:], data[:1_000])
    assert [g.fault for g in proxied.proxy.gets(FAULTY)] == ["whole", "whole", None]


class TrickledCall:
    """A backend call whose answers can trickle from their first byte: what it asks for (the method and the name the
    request's path ends in), how its retries are logged, and the result it must give."""

    def __init__(self, operation: str, proxied: ProxiedDataset) -> None:
        location = parse_dataset_uri(proxied.target.uri).location
        bucket_or_container = location[0] if proxied.backend == "s3" else location[1]
        faulty_uri = f"{proxied.target.uri}/{FAULTY}"
        self.method, self.name, self.logged_as = {
            "stat": ("HEAD", FAULTY, f"stat {faulty_uri}"),
            "read": ("GET", FAULTY, f"read {faulty_uri}"),
            "list": ("GET", bucket_or_container, f"listing {proxied.target.uri}"),
        }[operation]
        self.operation = operation
        self.expected: object = {
            "stat": len(proxied.files[FAULTY]),
            "read": proxied.files[FAULTY],
            "list": sorted(proxied.files),
        }[operation]

    def __call__(self, backend: RetryingBackend) -> object:
        if self.operation == "stat":
            return backend.stat(FAULTY).size
        if self.operation == "read":
            return backend.read(FAULTY, 0, len(self.expected))  # type: ignore[arg-type]
        return sorted(info.key for info in backend.list())


@pytest.mark.parametrize("operation", ["stat", "read", "list"])
def test_an_answer_whose_headers_trickle_within_the_read_timeout_is_cut_at_the_deadline_and_the_call_retried(
    proxied: ProxiedDataset, caplog: pytest.LogCaptureFixture, operation: str
) -> None:
    """Before its headers are in, no answer exists for an SDK hook to watch: the deadline must hold from the first
    byte. A stat is only headers; a read and a listing wait for theirs before any body."""
    call = TrickledCall(operation, proxied)
    proxied.proxy.trickle(call.name, TRICKLES, every=TRICKLE_EVERY, from_head=True)
    options = {**proxied.options, "read_timeout": str(READ_TIMEOUT), "min_read_rate": str(FAST_MIN_READ_RATE)}
    backend = RetryingBackend(open_backend(proxied.target.uri, options))
    caplog.set_level(logging.DEBUG, logger="silodlib.backends.retry")  # every retry: at INFO, one per interval

    outcome = polling.outcome_within(slowest_failure(READ_TIMEOUT + 2, TRICKLES + 1), lambda: call(backend))
    backend.close()

    assert outcome == {"result": call.expected}  # {"hung": True}: the answer whose headers trickle was never cut
    faults = [r.fault for r in proxied.proxy.requests(call.name, call.method)]
    assert faults[:TRICKLES] == ["trickle"] * TRICKLES and faults[-1] is None and set(faults) == {"trickle", None}
    polling.eventually(lambda: proxied.proxy.trickles_in_progress() == 0, what="every trickling answer cut")
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith(call.logged_as)]
    assert retries and all("the answer came slower than min_read_rate 16.0 MB/s" in message for message in retries)


def test_headers_that_trickle_through_a_forward_proxy_are_cut_at_the_deadline_too(
    proxied: ProxiedDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HTTP_PROXY set, both SDKs send through a proxy's connection pools, not the direct ones: here the fault
    proxy, as a forward proxy in front of the real server (the backend's options name the server itself)."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxied.proxy.url)
    proxied.proxy.trickle(FAULTY, TRICKLES, every=TRICKLE_EVERY, from_head=True)
    options = {**proxied.target.options, "read_timeout": str(READ_TIMEOUT), "min_read_rate": str(FAST_MIN_READ_RATE)}
    backend = RetryingBackend(open_backend(proxied.target.uri, options))

    outcome = polling.outcome_within(
        slowest_failure(READ_TIMEOUT + 2, TRICKLES + 1), lambda: backend.read(FAULTY, 0, len(proxied.files[FAULTY]))
    )
    backend.close()

    assert outcome == {"result": proxied.files[FAULTY]}  # {"hung": True}: never cut
    assert [r.fault for r in proxied.proxy.gets(FAULTY)] == GETS_AFTER_TRICKLES


def test_registering_a_dataset_whose_listing_trickles_is_refused_as_unavailable_naming_the_rate_not_hung(
    proxied: ProxiedDataset, datamgr_process: DataManagerProcess
) -> None:
    location = parse_dataset_uri(proxied.target.uri).location
    proxied.proxy.trickle(location[0] if proxied.backend == "s3" else location[1], 100, every=TRICKLE_EVERY)
    options = {**proxied.options, "read_timeout": str(READ_TIMEOUT), "min_read_rate": str(FAST_MIN_READ_RATE)}
    option_args = [arg for name, value in options.items() for arg in ("--option", f"{name}={value}")]
    address = datamgr_process.start().address

    refused = silod_cli("dataset", "add", proxied.target.uri, *option_args, datamgr=address)  # 60 s at most

    assert refused.returncode == 1 and "UNAVAILABLE" in refused.stderr  # before: "did not answer in time", stuck
    assert "the answer came slower than min_read_rate 16.0 MB/s" in refused.stderr
    proxied.proxy.heal()
    added = silod_cli("dataset", "add", proxied.target.uri, *option_args, datamgr=address)
    assert added.returncode == 0, added.stderr
    assert "Traceback" not in datamgr_process.log_path.read_text()


# --- a server that sheds load (503) -----------------------------------------------------------------------------

BUSY_ANSWERS = 3


@pytest.mark.usefixtures("retries_at_debug")
def test_the_first_n_busy_answers_are_retried_n_times_as_logged_and_the_reader_gets_the_exact_bytes(
    mount_factory: MountFactory, proxied: ProxiedDataset
) -> None:
    proxied.proxy.busy(FAULTY, BUSY_ANSWERS, proxied.busy_answer)
    mount = mount_factory({"job": proxied.target.uri}, *options_args(proxied.options))

    read = BackgroundRead(mount.job_dir("job") / FAULTY).finished(
        slowest_failure(0, BUSY_ANSWERS + 1), "the read of the object answered busy to finish"
    )

    assert read.error is None and read.data == proxied.files[FAULTY]
    gets = proxied.proxy.gets(FAULTY)
    assert [g.fault for g in gets] == ["busy"] * BUSY_ANSWERS + [None]
    object_uri = f"{proxied.target.uri}/{FAULTY}"
    assert retries_logged(mount, object_uri) == BUSY_ANSWERS  # every retry silod's own, none hidden in an SDK
    assert failed_reads_logged(mount, object_uri) == 0


# --- the server killed and restarted mid-epoch ------------------------------------------------------------------


@dataclass
class EpochReader:
    """Reads every file of a job's directory, epoch after epoch in an order of its own, in a thread, recording each
    outcome: "ok" (the exact bytes), "EIO", or what else it got (wrong bytes, another error)."""

    root: Path
    files: dict[str, bytes]
    seed: int
    outcomes: list[tuple[int, str, str]] = field(default_factory=list)  # (epoch, file, outcome)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> EpochReader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        order, rng, epoch = sorted(self.files), random.Random(self.seed), 0
        while not self._stop.is_set():
            rng.shuffle(order)
            for name in order:
                self.outcomes.append((epoch, name, self._read(name)))
                if self._stop.is_set():
                    return
            epoch += 1

    def _read(self, name: str) -> str:
        try:
            data = (self.root / name).read_bytes()
        except OSError as exc:
            return "EIO" if exc.errno == errno.EIO else f"error {exc!r}"
        if data != self.files[name]:
            return f"wrong bytes ({len(data)} of {len(self.files[name])})"
        return "ok"

    def whole_epoch_after(self, index: int) -> list[str] | None:
        """The outcomes of the first epoch read entirely after outcome number `index` was recorded, once it is
        done (the read recorded as number `index` may have started before)."""
        outcomes = list(self.outcomes)
        started_before = {epoch for epoch, _, _ in outcomes[: index + 1]}
        later = outcomes[index + 1 :]
        for epoch in sorted({epoch for epoch, _, _ in later} - started_before):
            reads = [outcome for e, _, outcome in later if e == epoch]
            if len(reads) == len(self.files):
                return reads
        return None


@pytest.fixture
def restartable_azurite(tmp_path: Path) -> Iterator[RestartableAzurite]:
    yield from RestartableAzurite.running(tmp_path / "azurite")


READERS = 4


def test_azurite_killed_and_restarted_mid_epoch_reads_are_right_or_eio_then_all_right_on_the_same_mount(
    mount_factory: MountFactory, restartable_azurite: RestartableAzurite
) -> None:
    server = restartable_azurite.server
    container = azure_client(server).create_container("restarted")
    rng = random.Random(21)
    files = {f"train/item_{i:03d}.bin": rng.randbytes(rng.randint(16_000, 96_000)) for i in range(40)}
    for name, data in files.items():
        container.upload_blob(f"data/{name}", data)
    restartable_azurite.persist()  # the uploads saved: a crash now may only lose what reads change (nothing)
    uri = f"az://{server.account_name}/restarted/data"
    mount = mount_factory({"job": uri}, *options_args({**server.backend_options(), "read_timeout": "5"}))
    readers = [EpochReader(mount.job_dir("job"), files, seed).start() for seed in range(READERS)]
    try:
        polling.eventually(
            lambda: all(len(r.outcomes) >= len(files) + 5 for r in readers), what="every reader into its 2nd epoch"
        )
        restartable_azurite.kill()
        killed_at = [len(r.outcomes) for r in readers]
        polling.eventually(  # the outage reaches the readers: a read in flight or after it fails (as EIO, below)
            lambda: any(o != "ok" for r, n in zip(readers, killed_at, strict=True) for _, _, o in r.outcomes[n:]),
            what="a read failing while the server is down",
        )
        restartable_azurite.start()
        back_at = [len(r.outcomes) for r in readers]
        remote_at_restart = _bytes_from_remote(mount.stats())
        after = [
            polling.eventually(partial(r.whole_epoch_after, n), what="a whole epoch read after the restart", timeout=60)
            for r, n in zip(readers, back_at, strict=True)
        ]
        # ... from the server, not from a cache: at least the dataset's size fetched per reader since the restart
        total = READERS * sum(map(len, files.values()))
        mount.wait_for_stats(lambda stats: _bytes_from_remote(stats) - remote_at_restart >= total)
    finally:
        for reader in readers:
            reader.stop()

    surprises = [outcome for r in readers for _, _, outcome in r.outcomes if outcome not in ("ok", "EIO")]
    assert surprises == []  # during the outage too: the right bytes or EIO, never anything else
    assert any(o == "EIO" for r, n in zip(readers, killed_at, strict=True) for _, _, o in r.outcomes[n:])
    assert after == [["ok"] * len(files)] * READERS  # the same mount, without a remount, serves everything again


def _bytes_from_remote(stats: dict[str, Any]) -> int:
    return int(stats["jobs"]["job"]["bytes_from_remote"])


# --- a blip: the storage server down for a few seconds, refusing connections -------------------------------------

# A refused connection fails a try at once, so only the retries' waits can outlast a blip: with full jitter from
# 0.1 s all five tries were spent in 0.39 s of a 0.3-0.5 s blip, and at most 1.5 s of waits. Now they wait at least
# 6 s in all (`RetryPolicy.total_wait`); an outage of these seconds of waits lies between the two.
OUTAGE = 5.0


def _blip_dataset(azurite: RestartableAzurite, files: dict[str, bytes]) -> str:
    """Upload `files` under a new container's prefix "data" and save them across a kill; the dataset's URI."""
    container = azure_client(azurite.server).create_container("blip")
    for name, data in files.items():
        container.upload_blob(f"data/{name}", data)
    azurite.persist()  # the uploads saved: a kill loses nothing a read needs
    return f"az://{azurite.server.account_name}/blip/data"


class OutageWaits:
    """An injected sleep for the retries, during which the server is down: it records each wait and, once they add
    up to `OUTAGE` seconds, starts the server again. The outage lasts that long as the retries count time, without
    the test waiting it out."""

    def __init__(self, azurite: RestartableAzurite) -> None:
        self.azurite = azurite
        self.waits: list[float] = []
        self.ended = False

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if not self.ended and sum(self.waits) >= OUTAGE:
            self.azurite.start()
            self.ended = True


def test_a_storage_server_down_for_seconds_refusing_connections_is_ridden_out_by_the_reads_retries(
    restartable_azurite: RestartableAzurite,
) -> None:
    data = random.Random(22).randbytes(64 * 1024)
    uri = _blip_dataset(restartable_azurite, {"item.bin": data})
    waits = OutageWaits(restartable_azurite)
    backend = RetryingBackend(open_backend(uri, restartable_azurite.server.backend_options()), sleep=waits)
    try:
        restartable_azurite.kill()  # its port refuses connections until `waits` starts it again
        assert backend.read("item.bin", 0, len(data)) == data  # before: BackendUnavailable after 5 refused tries
    finally:
        backend.close()
    assert waits.ended and len(waits.waits) < RetryPolicy().attempts  # the outage met, and ridden out


# Seconds the server stays down under a mount before it is started again (which takes about 1 s more): more than
# the 1.5 s of waits five tries could take with full jitter, less than the 6 s they now take at least.
BLIP = 2.0
BLIP_READERS = 8


def test_a_blip_under_a_mounts_readers_costs_them_no_eio_and_the_log_one_retry_line_not_one_per_retry(
    mount_factory: MountFactory, restartable_azurite: RestartableAzurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hunt's repro: readers of a mount whose storage refuses connections for a moment got EIO, and the node's
    log took an INFO line for every retry (2,372 lines in a few short outages with 16 readers)."""
    monkeypatch.setenv("SILOD_LOG_JSON", "1")  # the lines' fields, to check the retry line's
    rng = random.Random(23)
    files = {f"train/item_{i:03d}.bin": rng.randbytes(rng.randint(16_000, 64_000)) for i in range(40)}
    uri = _blip_dataset(restartable_azurite, files)
    mount = mount_factory({"job": uri}, *options_args(restartable_azurite.server.backend_options()))
    readers = [EpochReader(mount.job_dir("job"), files, seed).start() for seed in range(BLIP_READERS)]
    try:
        polling.eventually(lambda: all(len(r.outcomes) >= len(files) for r in readers), what="every reader reading")
        restartable_azurite.kill()
        down_at = time.monotonic()
        time.sleep(BLIP)  # the outage itself, not a wait for something to happen
        restartable_azurite.start()
        back_at = [len(r.outcomes) for r in readers]
        polling.eventually(
            lambda: all(r.whole_epoch_after(n) for r, n in zip(readers, back_at, strict=True)),
            what="a whole epoch read by every reader after the blip",
            timeout=60,
        )
        over_after = time.monotonic() - down_at
    finally:
        for reader in readers:
            reader.stop()

    outcomes = [outcome for r in readers for _, _, outcome in r.outcomes]
    assert set(outcomes) == {"ok"}  # before: EIO for the reads the blip met
    entries = [json.loads(line) for line in mount.log_path.read_text().splitlines() if line.startswith("{")]
    retries = [e for e in entries if e["logger"] == "silodlib.backends.retry"]
    assert retries, "the blip met no read"
    assert 1 <= len(retries) <= 1 + over_after // retry.LOG_INTERVAL  # before: one line per retry, dozens
    assert all(e["level"] == "INFO" and e["dataset_uri"] == uri for e in retries)


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_a_failed_azure_ad_token_request_is_one_line_in_the_mounts_log_its_detail_at_debug_never_a_secret(
    tmp_path: Path, level: str
) -> None:
    """azure-identity logged a WARNING of a dozen lines for each failed token request (every credential tried, a
    guide's link) beside silod's line, which names the credential and what to set. That detail now shows at
    `--log-level DEBUG` only, as DEBUG lines (with azure-identity's tracebacks), scrubbed as every line is: here it
    holds a managed identity's IDENTITY_HEADER, which `requests` refuses for its newline, printing the value whole."""
    secret = f"identity-header-{os.urandom(8).hex()}"
    env = {name: value for name, value in os.environ.items() if not name.startswith(("AZURE_", "IDENTITY_", "MSI_"))}
    env |= {
        "AZURE_TOKEN_CREDENTIALS": "managedidentitycredential",
        "IDENTITY_ENDPOINT": f"http://127.0.0.1:{free_port()}/msi",  # never reached: the header is refused first
        "IDENTITY_HEADER": f"{secret}\n",
    }
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = [*SILOD, "--log-level", level, "mount", str(mountpoint), "--cache-dir", str(tmp_path / "cache")]
    argv += ["--foreground", "--job", "a=az://devstoreaccount1/cont/train"]
    argv += ["--option", "account_url=https://127.0.0.1:1/devstoreaccount1"]  # https: DefaultAzureCredential
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    stderr = result.stderr
    assert result.returncode == 1 and not os.path.ismount(mountpoint), stderr[-3000:]
    assert secret not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1].startswith(
        "silod mount: cannot list the dataset: az://devstoreaccount1/cont/train: access denied (no Azure AD token: "
        "DefaultAzureCredential tried ManagedIdentityCredential: "
    ), stderr[-3000:]
    identity_lines = [line for line in stderr.splitlines() if re.search(r" [A-Z]+ azure\.identity\.", line)]
    detail = "failed to retrieve a token from the included credentials"
    if level == "INFO":
        assert detail not in stderr and not identity_lines and "Traceback" not in stderr, stderr[-3000:]
    else:
        assert detail in stderr and identity_lines, stderr[-3000:]
        assert all(" DEBUG azure.identity." in line for line in identity_lines), identity_lines
        assert any(REDACTED in line for line in identity_lines), identity_lines  # the header was there, scrubbed
