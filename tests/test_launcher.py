"""End to end: `silod datamgr serve --policy tiresias-las` places jobs registered with GPUs, and a launcher
(tests/launcher.py) follows its WatchDecisions stream: jobs start, one is preempted when a job of a higher
queue arrives, and resumed when that one finishes; a launcher that reconnects, to the same data manager or to
a restarted one, picks up the current decisions; `silod status` shows each job's state, queue, attained
service and preemptions.

Tiresias runs with 2 queues and a threshold of 10 GPU-seconds (`--policy-option queues=10s`), so a job on both
of the node's 2 GPUs is demoted 5 s after it starts and a job on one of them 10 s after; demotions come only
from the wake-ups the policy asks for (`--round 3600` rules out periodic rounds).

`silod datamgr serve --policy fitgpp`: a trial-and-error job preempts a best-effort job registered with a grace
period; the launcher is told at once to suspend it, but its GPUs go to the trial-and-error job only once the
grace period is over, a restart of the data manager meanwhile notwithstanding."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datamgr.client import DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb
from tests import polling
from tests.datamgr_fixtures import DataManagerProcess, cli, make_local_dataset
from tests.launcher import Launcher

GPUS = 2  # the node's


def serving(tmp_path: Path, *policy: str) -> Iterator[DataManagerProcess]:
    """`silod datamgr serve` with `policy` (its name and knobs), 1 MB/s of remote IO and hour-long rounds."""
    datamgr = DataManagerProcess(
        tmp_path / "state", tmp_path / "datamgr.log", *policy, "--remote-io-limit", "1MB/s", "--round", "3600"
    )
    try:
        yield datamgr.start()
    finally:
        datamgr.stop()


@pytest.fixture
def tiresias(tmp_path: Path) -> Iterator[DataManagerProcess]:
    yield from serving(tmp_path, "--policy", "tiresias-las", "--policy-option", "queues=10s")


def jobs(datamgr: DataManagerProcess) -> dict[str, dict[str, Any]]:
    """`silod status --json`'s jobs by id."""
    return {job["job_id"]: job for job in json.loads(cli(datamgr, "status", "--json"))["jobs"]}


def queue(job: dict[str, Any]) -> float | None:
    state: dict[str, float] = job["schedule"]["policy_state"]
    return state.get("queue")


def test_a_launcher_follows_placements_preemptions_and_resumptions_across_reconnects_and_restarts(
    tiresias: DataManagerProcess, launcher: Launcher, tmp_path: Path
) -> None:
    with DataManagerClient(tiresias.address, timeout=10) as client:
        client.register_node("n1", "n1:1", 10_000_000, gpus=GPUS)
    uri = make_local_dataset(tmp_path / "data", files=4, size=500)
    cli(tiresias, "dataset", "add", uri)
    launcher.connect(tiresias.address)

    def add(job_id: str, gpus: int) -> None:
        cli(tiresias, "job", "add", job_id, "--dataset", uri, "--ideal-rate", "1MB/s", "--gpus", str(gpus))

    def launched(pods: dict[str, tuple[tuple[str, int], ...]], actions: list[str]) -> bool:
        return launcher.state() == (pods, actions)

    add("first", GPUS)
    started = ["start first on n1:2"]
    polling.eventually(lambda: launched({"first": (("n1", GPUS),)}, started), what=lambda: f"{launcher.state()}")

    # 10 GPU-seconds on 2 GPUs: 5 s after it starts, the policy's wake-up demotes it to the second queue.
    polling.eventually(lambda: queue(jobs(tiresias)["first"]) == 1.0, what=lambda: f"demotion: {jobs(tiresias)}")

    add("second", 1)  # enters the first queue, ahead of the demoted job: it takes a GPU, and `first` cannot run
    preempted = [*started, "stop first", "start second on n1:1"]
    polling.eventually(lambda: launched({"second": (("n1", 1),)}, preempted), what=lambda: f"{launcher.state()}")
    status = jobs(tiresias)  # `second` runs 10 s on its 1 GPU before it is demoted: time to look
    assert status["first"]["schedule"]["phase"] == "JOB_PHASE_PREEMPTED"
    assert status["first"]["schedule"]["preemptions"] == 1 and status["first"]["workers"] == []
    assert status["second"]["schedule"]["phase"] == "JOB_PHASE_RUNNING"
    assert float(status["first"]["schedule"]["attained_gpu_seconds"]) >= 10  # its demotion's threshold
    table = cli(tiresias, "status")
    header, row = (next(line for line in table.splitlines() if line.startswith(w)) for w in ("JOB", "first"))
    shown = {column: row[header.index(column) :].split()[0] for column in ("STATE", "QUEUE", "GPU-H", "PREEMPTED")}
    assert shown["STATE"] == "preempted" and shown["QUEUE"] == "2" and shown["PREEMPTED"] == "1"  # Q2, from 1
    assert float(shown["GPU-H"]) >= 10 / 3600

    # The launcher goes away and comes back: the snapshot it gets first changes nothing it runs.
    launcher.disconnect()
    launcher.connect(tiresias.address)
    polling.eventually(lambda: launcher.snapshots == 2, what="a second snapshot")
    assert launcher.state() == ({"second": (("n1", 1),)}, preempted)

    # `second` is demoted in turn and lines up behind `first`, which reached the second queue before it: the
    # demotion preempts it, and `first` resumes.
    resumed = [*preempted, "stop second", "start first on n1:2"]
    polling.eventually(lambda: launched({"first": (("n1", GPUS),)}, resumed), what=lambda: f"{launcher.state()}")
    assert queue(jobs(tiresias)["second"]) == 1.0

    cli(tiresias, "job", "finish", "second")  # a waiting job can be withdrawn: nothing for the launcher to stop
    finished = jobs(tiresias)
    assert list(finished) == ["first"] and launcher.state() == ({"first": (("n1", GPUS),)}, resumed)

    # A restarted data manager keeps every job's decision and history: the launcher, reconnected, has nothing to do.
    launcher.disconnect()
    assert tiresias.terminate() == 0
    tiresias.start()
    launcher.connect(tiresias.address)
    polling.eventually(lambda: launcher.snapshots == 3, what="a snapshot from the restarted data manager")
    assert launcher.state() == ({"first": (("n1", GPUS),)}, resumed)
    first = jobs(tiresias)["first"]["schedule"]
    assert (first["phase"], first["preemptions"], queue(jobs(tiresias)["first"])) == ("JOB_PHASE_RUNNING", 1, 1.0)
    assert launcher.error is None


def test_a_launcher_of_a_data_manager_without_a_policy_is_told_there_is_nothing_to_follow(
    datamgr_process: DataManagerProcess, launcher: Launcher
) -> None:
    launcher.connect(datamgr_process.start().address)
    polling.eventually(lambda: launcher.error is not None, what="the stream refused")
    assert launcher.error is not None
    assert launcher.error.code().name == "FAILED_PRECONDITION"
    assert "no policy places jobs on this data manager (--policy external)" in (launcher.error.details() or "")


# The BE job's: long enough to look at it suspending (three CLI processes) and to restart the data manager meanwhile
# on a machine the parallel suite keeps busy, where 10 s was once too short; the test then waits out the rest.
GRACE_SECONDS = 30


@pytest.fixture
def fitgpp(tmp_path: Path) -> Iterator[DataManagerProcess]:
    yield from serving(tmp_path, "--policy", "fitgpp")


def column(table: str, job_id: str, name: str) -> str:
    """The cell of `silod status`'s job table in column `name` of the job's row (cells may hold spaces)."""
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("JOB "))
    row = next(line for line in lines if line.startswith(f"{job_id} "))
    names = header.split()
    start = header.index(name)
    following = names.index(name) + 1
    end = header.index(names[following], start) if following < len(names) else len(row)
    return row[start:end].strip()


def test_fitgpp_a_te_job_preempts_a_be_job_that_keeps_its_gpus_through_its_grace_period_and_a_restart(
    fitgpp: DataManagerProcess, launcher: Launcher, tmp_path: Path
) -> None:
    with DataManagerClient(fitgpp.address, timeout=10) as client:
        client.register_node("n1", "n1:1", 10_000_000, gpus=GPUS)
    uri = make_local_dataset(tmp_path / "data", files=4, size=500)
    cli(fitgpp, "dataset", "add", uri)
    launcher.connect(fitgpp.address)

    def launched(pods: dict[str, tuple[tuple[str, int], ...]], actions: list[str]) -> bool:
        return launcher.state() == (pods, actions)

    be_added = cli(
        fitgpp, *("job", "add", "be", "--dataset", uri, "--ideal-rate", "1MB/s", "--gpus", str(GPUS)),
        *("--class", "be", "--grace-period", f"{GRACE_SECONDS}s"),
    )  # fmt: skip
    assert f"best-effort, {GRACE_SECONDS}s grace" in be_added
    started = ["start be on n1:2"]
    polling.eventually(lambda: launched({"be": (("n1", GPUS),)}, started), what=lambda: f"{launcher.state()}")

    # The TE job needs both GPUs: FitGpp preempts the BE job, and the stream says so at once, with the end of its
    # grace period; the TE job waits for the GPUs the BE job keeps until then.
    cli(fitgpp, "job", "add", "te", "--dataset", uri, "--ideal-rate", "1MB/s", "--gpus", str(GPUS), "--class", "te")
    suspended = [*started, "suspend be"]
    polling.eventually(lambda: launched({}, suspended), what=lambda: f"{launcher.state()}")
    (suspending,) = [d for d in launcher.sent() if d.phase == pb.JOB_PHASE_SUSPENDING]
    until = suspending.suspended_until
    status = jobs(fitgpp)
    be, te = status["be"], status["te"]
    assert (be["schedule"]["phase"], be["schedule"]["suspended_until"]) == ("JOB_PHASE_SUSPENDING", until)
    assert be["schedule"]["held"] == [{"node_id": "n1", "count": GPUS}] and be["workers"] == []
    assert (be["job_class"], be["grace_seconds"]) == ("JOB_CLASS_BEST_EFFORT", GRACE_SECONDS)
    assert (te["schedule"]["phase"], te["job_class"]) == ("JOB_PHASE_PENDING", "JOB_CLASS_TRIAL_AND_ERROR")
    table = cli(fitgpp, "status")
    assert (column(table, "be", "CLASS"), column(table, "be", "GRACE"), column(table, "te", "CLASS")) == (
        "be",
        f"{GRACE_SECONDS}s",
        "te",
    )
    assert column(table, "be", "STATE").startswith("suspending until ")
    assert column(table, "te", "STATE") == "pending"

    # Restarted mid-grace, the data manager still holds the BE job's GPUs until the same time.
    launcher.disconnect()
    assert fitgpp.terminate() == 0
    fitgpp.start()
    launcher.connect(fitgpp.address)
    polling.eventually(lambda: launcher.snapshots == 2, what="a snapshot from the restarted data manager")
    after_restart = [(d.job_id, d.phase, d.suspended_until) for d in launcher.sent()[len(launcher.sent()) - 2 :]]
    assert after_restart == [("be", pb.JOB_PHASE_SUSPENDING, until), ("te", pb.JOB_PHASE_PENDING, 0.0)]

    # Once the grace period is over, the BE job's GPUs are released (its decision becomes PREEMPTED) and go to
    # the TE job, never before.
    resumed = [*suspended, "start te on n1:2"]
    polling.eventually(
        lambda: launched({"te": (("n1", GPUS),)}, resumed), what=lambda: f"{launcher.state()}", timeout=GRACE_SECONDS
    )
    order = [(d.job_id, d.phase) for d in launcher.sent()]
    released = order.index(("be", pb.JOB_PHASE_PREEMPTED))
    assert order.index(("be", pb.JOB_PHASE_SUSPENDING)) < released < order.index(("te", pb.JOB_PHASE_RUNNING))
    status = jobs(fitgpp)
    assert float(status["te"]["schedule"]["first_start_time"]) >= until
    assert (status["be"]["schedule"]["phase"], status["be"]["schedule"]["preemptions"]) == ("JOB_PHASE_PREEMPTED", 1)
    assert status["be"]["schedule"]["held"] == [] and launcher.error is None
