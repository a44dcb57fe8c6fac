"""A cluster launcher as small as one can be: it follows the data manager's WatchDecisions stream and keeps its
"pods" (job -> the nodes and GPUs its workers run on) as the decisions say, the way docs/deploy.md describes a
Kubernetes operator doing it: stops before starts, level-triggered on every snapshot, idempotent."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from datamgr.client import DataManagerClient
from silodpb.v1 import datamgr_pb2 as pb

Placement = tuple[tuple[str, int], ...]  # (node, GPUs), by node


class Launcher:
    """Follows one data manager's decisions on a thread of its own until `disconnect`; `actions` records what it
    did ("start a on n1:2", "stop a", "suspend a": stop it, letting it checkpoint through its grace period),
    `pods` what runs now, and `decisions` every decision it was sent, in order."""

    def __init__(self) -> None:
        self.pods: dict[str, Placement] = {}
        self.actions: list[str] = []
        self.decisions: list[pb.JobDecision] = []
        self.snapshots = 0  # streams opened (each begins with a snapshot)
        self.error: grpc.RpcError | None = None  # how the last stream ended, if not by `disconnect`
        self._lock = threading.Lock()
        self._client: DataManagerClient | None = None
        self._call: grpc.CallIterator[pb.DecisionEvent] | None = None
        self._thread: threading.Thread | None = None

    def connect(self, address: str) -> None:
        self._client = DataManagerClient(address, timeout=10)
        self._call = self._client.stub.WatchDecisions(pb.WatchDecisionsRequest())
        self.error = None
        self._thread = threading.Thread(target=self._follow, args=(self._call,), daemon=True)
        self._thread.start()

    def disconnect(self) -> None:
        if self._call is not None:
            self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves cancel() untyped
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._client is not None:
            self._client.close()
        self._call = self._thread = self._client = None

    def state(self) -> tuple[dict[str, Placement], list[str]]:
        with self._lock:
            return dict(self.pods), list(self.actions)

    def sent(self) -> list[pb.JobDecision]:
        with self._lock:
            return list(self.decisions)

    def _follow(self, call: grpc.CallIterator[pb.DecisionEvent]) -> None:
        try:
            for event in call:
                with self._lock:
                    self._apply(event)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = exc

    def _apply(self, event: pb.DecisionEvent) -> None:
        if event.snapshot:
            self.snapshots += 1
            listed = {d.job_id for d in event.jobs}
            for job_id in sorted(set(self.pods) - listed):  # finished while we were away
                self._stop(job_id)
        for job_id in event.jobs_finished:
            if job_id in self.pods:
                self._stop(job_id)
        for decision in event.jobs:  # stops come first in an event
            self.decisions.append(decision)
            wanted = tuple((w.node_id, w.count) for w in decision.placement)
            running = self.pods.get(decision.job_id)
            if decision.phase == pb.JOB_PHASE_RUNNING:
                if running != wanted:
                    if running is not None:
                        self._stop(decision.job_id)  # a migration: the old workers go first
                    self.pods[decision.job_id] = wanted
                    self.actions.append(f"start {decision.job_id} on {_text(wanted)}")
            elif running is not None:
                self._stop(decision.job_id, "suspend" if decision.phase == pb.JOB_PHASE_SUSPENDING else "stop")

    def _stop(self, job_id: str, verb: str = "stop") -> None:
        del self.pods[job_id]
        self.actions.append(f"{verb} {job_id}")


def _text(placement: Placement) -> str:
    return ",".join(f"{node}:{gpus}" for node, gpus in placement)


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    """A launcher, disconnected when the test ends (connect it to a data manager)."""
    following = Launcher()
    try:
        yield following
    finally:
        following.disconnect()
