"""Inputs and checks shared by the simulator's tests: trace jobs and clusters in a line, tiny scenarios, plots."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread

from datamgr.scheduler.sim.model import ClusterSpec, TraceJob
from tests.site_packages import install_site_package

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MB = 10**6
GB = 10**9


def job(
    job_id: str,
    arrival: float = 0.0,
    gpus: int = 1,
    rate: float = 100 * MB,
    dataset: str = "ds",
    size: int = 10 * GB,
    epochs: float = 1.0,
    irregular: bool = False,
    model: str = "model",
) -> TraceJob:
    return TraceJob(job_id, arrival, gpus, model, rate, dataset, size, epochs, irregular)


def cluster(nodes: int = 1, gpus: int = 1, cache: int = 0, io: float = 100 * MB) -> ClusterSpec:
    return ClusterSpec(nodes, gpus, cache, io)


OVER_PLACING_POLICY = """
from datamgr.scheduler.policy import Decision


class OnAMissingNode:
    name = "missing-node"

    def schedule(self, snapshot, estimator):
        return Decision(placements={job_id: {"no-such-node": job.gpus} for job_id, job in snapshot.jobs.items()})
"""


def is_png(path: Path) -> bool:
    return path.read_bytes().startswith(PNG_MAGIC) and imread(path).shape[2] == 4


def tiny_inputs(tmp_path: Path) -> list[str]:
    """--trace and --cluster arguments for three jobs on one 4-GPU node."""
    trace = tmp_path / "tiny.csv"
    trace.write_text(
        "job_id,arrival,gpus,model,ideal_rate,dataset,dataset_size,epochs\n"
        "a,0,1,resnet50,100MB/s,small,100GB,3\n"
        "b,60,2,resnet50,200MB/s,large,1TB,1\n"
        "c,120,1,bert,2MB/s,huge,20TB,0.001\n"
    )
    cluster = tmp_path / "c.toml"
    cluster.write_text('nodes = 1\ngpus_per_node = 4\ncache_per_node = "500GB"\nremote_io = "100MB/s"\n')
    return ["--trace", str(trace), "--cluster", str(cluster)]


def install_missing_node_policy(site: Path, monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """A site's policy `missing-node` in `module` (an entry point in `site`, as `pip install` leaves one, and
    `site` on sys.path) that places jobs on a node that does not exist: the engine refuses its decision, in a
    worker process too, and the command reports it as a failed run. `module` names it apart from other tests'."""
    entry_points = f"[silod.policies]\nmissing-node = {module}:OnAMissingNode\n"
    install_site_package(site, module.replace("_", "-"), module, OVER_PLACING_POLICY, entry_points)
    monkeypatch.syspath_prepend(str(site))  # spawned workers start with the same sys.path
