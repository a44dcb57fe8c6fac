"""Policy-round benchmark: how long one scheduling round takes at cluster scale, for every policy x cache system.

Builds one seeded synthetic snapshot: 1,000 jobs demanding 1, 2, 4 or 8 GPUs, reading ~200 datasets with
a skewed popularity (so popular datasets are shared by many jobs), on 300 nodes of 8 GPUs with 1 TB of cache
each and a 120 Gbit/s remote IO limit. Jobs are gang-placed first-come first-served until the cluster is
full and the rest queue, so every policy has both running jobs to allocate storage to and a queue to decide
on. Models, per-GPU ideal rates and dataset sizes follow the paper's Figure 6 (ResNet-50 on ImageNet-1k:
114 MB/s per V100 over 143 GB; BERT on web search: 2 MB/s over 20,971 GB).

Then, for every `registry.available_policies()` x cache system, times `Scheduler.decide` on that snapshot
(best of --repeats runs, wall clock and CPU time) and prints the milliseconds per round against the 1 s goal,
judged on CPU time (what other work on a shared machine takes does not count). Progress goes to
stderr, the table to stdout. Exits 1 if a pair misses the goal or cannot be built (a policy whose module is
not there yet is reported, not fatal to the other rows).

    PYTHONPATH=. .venv/bin/python bench/scheduler_round.py [--jobs N] [--datasets N] [--nodes N] [--repeats N]
        [--seed N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, replace

from datamgr.scheduler.perf import VanillaPerf
from datamgr.scheduler.policies.fifo import FifoPolicy
from datamgr.scheduler.registry import CACHE_SYSTEMS, Scheduler, available_policies, build_scheduler
from datamgr.scheduler.sim.model import ClusterSpec
from datamgr.scheduler.snapshot import DatasetState, JobState, Snapshot

GOAL_SECONDS = 1.0
MB = 10**6
GB = 10**9
TB = 10**12
GPU_DEMANDS = (1, 2, 4, 8)
GPU_DEMAND_WEIGHTS = (0.4, 0.25, 0.2, 0.15)


@dataclass(frozen=True)
class Family:
    """A kind of dataset and the models trained on it: base size and per-GPU ideal rate f* of each model."""

    name: str
    size_bytes: int
    rates_per_gpu: tuple[float, ...]
    epochs: tuple[float, float]  # a job trains for a uniform draw in this range
    weight: float  # share of the datasets that are of this kind


FAMILIES = (
    Family("imagenet-1k", 143 * GB, (114 * MB, 43 * MB, 69 * MB), (30, 90), 0.4),  # ResNet-50/152, EfficientNet-B1
    Family("imagenet-22k", 1360 * GB, (114 * MB, 43 * MB), (10, 60), 0.25),
    Family("landmarks", 500 * GB, (10 * MB,), (10, 60), 0.2),  # VLAD; the dataset size is our assumption
    Family("websearch", 20_971 * GB, (2 * MB,), (0.05, 1), 0.15),  # BERT, a fraction of an epoch
)


@dataclass(frozen=True)
class Dataset:
    uri: str
    family: Family
    size_bytes: int


def synthetic_datasets(rng: random.Random, count: int) -> list[Dataset]:
    """`count` datasets, each a variant of a family sized within a factor of two of the family's base."""
    families = rng.choices(FAMILIES, weights=[f.weight for f in FAMILIES], k=count)
    return [
        Dataset(f"s3://bench/{family.name}-{i:03d}", family, int(family.size_bytes * 2 ** rng.uniform(-1, 1)))
        for i, family in enumerate(families)
    ]


def synthetic_job(rng: random.Random, index: int, dataset: Dataset, submit_time: float) -> JobState:
    gpus = rng.choices(GPU_DEMANDS, weights=GPU_DEMAND_WEIGHTS)[0]
    ideal = rng.choice(dataset.family.rates_per_gpu) * gpus
    return JobState(
        job_id=f"job-{index:05d}",
        submit_time=submit_time,
        gpus=gpus,
        dataset_uri=dataset.uri,
        dataset_bytes=dataset.size_bytes,
        ideal_bytes_per_sec=ideal,
        total_bytes=rng.uniform(*dataset.family.epochs) * dataset.size_bytes,
    )


def with_progress(rng: random.Random, job: JobState, now: float) -> JobState:
    """A running job part-way through its training, with the GPU time it took to get there."""
    seconds = rng.uniform(0.0, min(now - job.submit_time, 0.9 * job.total_bytes / job.ideal_bytes_per_sec))
    return job._replace(done_bytes=seconds * job.ideal_bytes_per_sec, attained_gpu_seconds=seconds * job.gpus)


def build_snapshot(args: argparse.Namespace) -> Snapshot:
    """The seeded cluster every pair is timed on (see the module docstring)."""
    rng = random.Random(args.seed)
    cluster = ClusterSpec(args.nodes, 8, 1 * TB, 120e9 / 8)
    datasets = synthetic_datasets(rng, args.datasets)
    popularity = [1.0 / (rank + 1) ** 0.8 for rank in range(len(datasets))]  # Zipf-like: a few shared widely
    arrivals = sorted(rng.uniform(0.0, 7 * 86_400.0) for _ in range(args.jobs))
    chosen = rng.choices(datasets, weights=popularity, k=args.jobs)
    jobs = [synthetic_job(rng, i, d, arrival) for i, (d, arrival) in enumerate(zip(chosen, arrivals, strict=True))]
    queued = Snapshot(
        time=arrivals[-1],
        nodes=cluster.node_states(),
        remote_io_bytes_per_sec=cluster.remote_io_bytes_per_sec,
        datasets={d.uri: DatasetState(d.uri, d.size_bytes) for d in chosen},
        jobs={job.job_id: job for job in jobs},
        seed=args.seed,
    )
    placements = FifoPolicy().schedule(queued, VanillaPerf()).placements
    assert placements is not None  # FIFO decides compute
    placed = queued.with_placements(placements)
    running = {job.job_id: with_progress(rng, job, placed.time) for job in placed.running_jobs()}
    return replace(placed, jobs={**placed.jobs, **running})


def describe(snapshot: Snapshot) -> str:
    running = snapshot.running_jobs()
    shared = sum(1 for uri in snapshot.datasets if len(snapshot.jobs_of(uri)) > 1)
    return (
        f"{len(snapshot.jobs)} jobs ({len(running)} running on {sum(j.gpus for j in running)} of "
        f"{snapshot.total_gpus} GPUs, {len(snapshot.queued_jobs())} queued), {len(snapshot.datasets)} datasets "
        f"({shared} shared; {sum(d.size_bytes for d in snapshot.datasets.values()) / TB:.0f} TB), "
        f"{len(snapshot.nodes)} nodes, cache {snapshot.cache_capacity_bytes / TB:.0f} TB, "
        f"remote IO {snapshot.remote_io_bytes_per_sec / GB:.0f} GB/s"
    )


def best_round_seconds(scheduler: Scheduler, snapshot: Snapshot, repeats: int) -> tuple[float, float]:
    """The fastest of `repeats` rounds, wall clock and CPU time: the least disturbed by other work."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        scheduler.decide(snapshot)
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - cpu_started)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    snapshot = build_snapshot(args)
    print(describe(snapshot))
    print(f"\n{'policy':<10} {'cache system':<13} {'wall ms':>10} {'CPU ms':>10}  CPU under {GOAL_SECONDS:g} s")
    ok = True
    for policy in available_policies():
        for cache_system in CACHE_SYSTEMS:
            print(f"timing {policy}/{cache_system} ...", file=sys.stderr, flush=True)
            try:
                scheduler = build_scheduler(policy, cache_system)
            except (ImportError, AttributeError) as exc:  # a registered policy whose code has not landed
                print(f"{policy:<10} {cache_system:<13} {'-':>10} {'-':>10}  cannot load: {exc}")
                ok = False
                continue
            wall, cpu = best_round_seconds(scheduler, snapshot, args.repeats)
            under = cpu < GOAL_SECONDS
            ok = ok and under
            verdict = "yes" if under else "NO"
            print(f"{policy:<10} {cache_system:<13} {wall * 1000:>10.1f} {cpu * 1000:>10.1f}  {verdict}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
