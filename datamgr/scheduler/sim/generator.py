"""Synthetic traces shaped like a production DL cluster's: Philly-like durations and GPU demands, Poisson
arrivals, and the models and datasets the SiloD paper measures.

- Arrivals: a Poisson process of `arrivals_per_hour`, for `jobs` jobs or until `duration_seconds`.
- GPUs per job: 1, 2, 4, 8 with probabilities 0.70, 0.10, 0.15, 0.05 (the Philly mix Gavel's generator uses).
- Duration, compute-bound on V100s: heavy-tailed, log-uniform in minutes within three bands: 60% 10^U(0.5, 2)
  (3 minutes to 1.7 hours), 30% 10^U(2, 3) (1.7 to 16.7 hours), 10% 10^U(3, 4) (16.7 hours to 6.9 days).
  Median 56 minutes, mean 8.7 hours: most jobs are short, a few long ones hold most GPU time, as in Microsoft's
  Philly trace (Jeon et al., ATC '19). A job's work is `epochs = duration x f* / dataset size`, so it takes
  that long only when IO keeps up.
- Model and dataset: `WORKLOADS`, eleven kinds of job, equally likely, our reconstruction of the "11 jobs" of
  the paper's Figure 6 (which names five models but not the pairs): ResNet-50 (114 MB/s per V100), ResNet-152
  (43 MB/s) and EfficientNetB1 (69 MB/s) each on ImageNet-1k (143 GB), ImageNet-22k (1.36 TB) and Open Images
  (660 GB), VLAD (10 MB/s) on Youtube-8M (1.46 TB) and BERT (2 MB/s) on web search (20,971 GB). Rates from
  Figure 6's caption; sizes from §2.1-2.2 (143 GB, 1.36 TB, 20,971 GB) and, for Open Images and Youtube-8M, from
  the evaluation's Table 4 as issue 13 lists it (our copy of the paper lacks §7). A job's f* is the per-GPU
  rate x its GPUs (data-parallel scaling) x `gpu_speed_scale`.

Knobs: `sharing` is the probability that a job reads the shared copy of its dataset (named after it, e.g.
"imagenet-1k") rather than a private copy ("imagenet-1k/job-0042", same size, never shared): 0 gives every
job its own dataset, 1 makes all jobs of a dataset share one cache. `gpu_speed_scale` multiplies every f*
while keeping each job's epochs (faster GPUs finish the same work sooner and read faster). `irregular` is the
share of jobs flagged irregular. Every job draws the same random numbers in the same order whatever the knobs,
so changing a knob changes only what it names: the same seed gives the same arrivals, GPUs, models and
durations at every sharing fraction and speed. Randomness comes only from `random.Random(seed).random()`,
whose sequence Python keeps stable across versions.

Bounds: the knobs must give a trace the simulator runs (`engine.check_inputs`): arrivals within its horizon of
`model.HORIZON_YEARS` years, every job's ideal rate a whole number of bytes/s up to silod's largest rate, and its run
at that rate within the horizon, which bounds `gpu_speed_scale` (`speed_scale_bounds`); and at most `MAX_JOBS` jobs.
`generate_jobs` yields the trace job by job, so a trace of any length takes the same memory to write.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from datamgr.scheduler.sim.model import HORIZON_SECONDS, HORIZON_YEARS, YEAR_SECONDS, TraceJob
from silodlib.units import MAX_VALUE

T = TypeVar("T")

MB = 10**6
GB = 10**9
TB = 10**12


@dataclass(frozen=True, slots=True)
class Workload:
    """A model trained on a dataset: one kind of job the generator draws, with its probability `weight`."""

    model: str
    bytes_per_sec_per_gpu: int  # f* on one V100
    dataset: str
    dataset_bytes: int
    weight: float


# The paper's Figure 6 profiles "11 jobs", one V100 each (section 2.2), and its caption gives five models' rates
# but not the eleven pairs. Ours match the count: three image models on three image datasets, VLAD on Youtube-8M
# and BERT on web search. Sizes: ImageNet-1k, ImageNet-22k and web search from sections 2.1-2.2; Open Images and
# Youtube-8M from the evaluation's Table 4 as issue 13 lists it (our copy lacks section 7; Figure 6's caption
# points to Table 1, which in our copy is five anonymous production tasks). The paper names no mix, so each of
# the eleven is equally likely. (Table 4, per issue 13, also lists AlexNet, EfficientNetB0 and InceptionV3 on
# ImageNet-22k, with no IO demand we could take: they are left out rather than given invented rates.)
_IMAGE_MODELS = (("resnet50", 114 * MB), ("resnet152", 43 * MB), ("efficientnetb1", 69 * MB))
_IMAGE_DATASETS = (("imagenet-1k", 143 * GB), ("imagenet-22k", 1360 * GB), ("openimages", 660 * GB))
_FIGURE_6_JOBS: tuple[tuple[str, int, str, int], ...] = (
    *((model, rate, dataset, size) for dataset, size in _IMAGE_DATASETS for model, rate in _IMAGE_MODELS),
    ("vlad", 10 * MB, "youtube-8m", 1460 * GB),
    ("bert", 2 * MB, "websearch", 20_971 * GB),
)
WORKLOADS: tuple[Workload, ...] = tuple(
    Workload(model, rate, dataset, size, 1.0 / len(_FIGURE_6_JOBS)) for model, rate, dataset, size in _FIGURE_6_JOBS
)
GPU_DEMAND: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
# (probability, low, high) of log10(duration in minutes)
DURATION_BANDS: tuple[tuple[float, float, float], ...] = ((0.60, 0.5, 2.0), (0.30, 2.0, 3.0), (0.10, 3.0, 4.0))
_CHOICES = 6  # uniform draws per job, in the order `_draw` uses them: GPUs, workload, band, duration, sharing, flag

# The most jobs a generated trace may have. Not for the generator's sake (it writes a trace job by job, in the
# same memory at any length) but for the trace's: the simulator holds every job of a trace in memory, about half
# a kilobyte each, and runs in hours what the largest shipped scenario (16,119 jobs) runs in a minute. Ten
# million jobs is a 5 GB trace to load and a file of about 800 MB; past it, a count is a typo (1e9 for 1e6), or an
# arrival rate times a duration no one meant, which would fill the disk before anything said so.
MAX_JOBS = 10_000_000


class KnobError(ValueError):
    """Knobs whose trace the simulator could not run or hold. `knobs` names them as a scenario recipe's keys
    (`jobs`, `duration`, `arrivals_per_hour`, `gpu_speed_scale`, `gpu_demand`), so that a caller can name them
    its own way (the command line's options), and `rule` says what is wrong with their values."""

    def __init__(self, knobs: tuple[str, ...], rule: str) -> None:
        super().__init__(f"{', '.join(knobs)}: {rule}")
        self.knobs = knobs
        self.rule = rule


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    """What to generate: `jobs` jobs, or every arrival within `duration_seconds` (exactly one of the two)."""

    jobs: int | None = None
    duration_seconds: float | None = None
    arrivals_per_hour: float = 4.0
    sharing: float = 0.5
    gpu_speed_scale: float = 1.0
    irregular: float = 0.0
    seed: int = 0
    gpu_demand: tuple[tuple[int, float], ...] = GPU_DEMAND  # (GPUs, probability); probabilities sum to 1

    def __post_init__(self) -> None:
        if (self.jobs is None) == (self.duration_seconds is None):
            raise ValueError("give either a number of jobs or a duration, not both or neither")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")
        if self.duration_seconds is not None and not self.duration_seconds > 0:
            raise ValueError(f"duration must be positive, not {self.duration_seconds}")
        for name in ("arrivals_per_hour", "gpu_speed_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("sharing", "irregular"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {getattr(self, name)}")
        if not self.gpu_demand or any(gpus < 1 or not p > 0 for gpus, p in self.gpu_demand):
            raise ValueError(
                f"gpu_demand needs GPU counts of at least 1 with positive probabilities: {self.gpu_demand}"
            )
        if abs(sum(p for _, p in self.gpu_demand) - 1.0) > 1e-6:
            raise ValueError(f"gpu_demand's probabilities must sum to 1, not {sum(p for _, p in self.gpu_demand):g}")
        self._check_bounds()

    def _check_bounds(self) -> None:
        """Refuse (`KnobError`) knobs whose trace the simulator could not run or hold, on average: the random
        arrivals may still pass a bound near it, which `trace_size` finds before a job is made."""
        horizon = f"the simulator's horizon of {HORIZON_YEARS} years ({HORIZON_SECONDS:,} s)"
        if self.jobs is not None and self.jobs > MAX_JOBS:
            raise KnobError(("jobs",), f"{self.jobs:,} must be at most {MAX_JOBS:,}, the most jobs a trace may have")
        if self.duration_seconds is not None and self.duration_seconds > HORIZON_SECONDS:
            raise KnobError(("duration",), f"{self.duration_seconds:,.0f} s must be at most {horizon}")
        low, high = speed_scale_bounds(self.gpu_demand)
        if not self.gpu_speed_scale >= low:
            raise KnobError(
                ("gpu_speed_scale",),
                f"{self.gpu_speed_scale:g} must be at least {low:g}: the longest job the generator draws (6.9 days on "
                f"V100s) would run past {horizon} even at its ideal rate",
            )
        if not self.gpu_speed_scale <= high:
            raise KnobError(
                ("gpu_speed_scale",),
                f"{self.gpu_speed_scale:g} must be at most {high:g}: the fastest job the generator draws would read "
                f"faster than the largest rate silod takes ({MAX_VALUE:,} bytes/s)",
            )
        hours = 3600.0
        if self.jobs is not None and self.jobs * hours / self.arrivals_per_hour > HORIZON_SECONDS:
            span = self.jobs * hours / self.arrivals_per_hour / YEAR_SECONDS
            raise KnobError(
                ("jobs", "arrivals_per_hour"),
                f"{self.jobs:,} jobs at {self.arrivals_per_hour:g} an hour arrive over {span:.3g} years on average, "
                f"past {horizon}: ask for fewer jobs or more an hour",
            )
        if self.duration_seconds is not None and self.arrivals_per_hour * self.duration_seconds / hours > MAX_JOBS:
            expected = self.arrivals_per_hour * self.duration_seconds / hours
            raise KnobError(
                ("duration", "arrivals_per_hour"),
                f"{self.arrivals_per_hour:g} arrivals an hour for {self.duration_seconds:,.0f} s make {expected:.3g} "
                f"jobs on average, more than the {MAX_JOBS:,} a trace may have",
            )


def speed_scale_bounds(gpu_demand: Sequence[tuple[int, float]] = GPU_DEMAND) -> tuple[float, float]:
    """The `gpu_speed_scale` range in which every job the generator can draw with `gpu_demand` is one the simulator
    runs: the longest (6.9 days on V100s) finishes within its horizon at its ideal rate, the slowest (BERT on the
    fewest GPUs) reads at least a byte a second, and the fastest (ResNet-50 on the most GPUs) at most silod's largest
    rate. Rounded inward to two digits, with room for the rounding of the epochs and rates a trace file carries."""
    longest = 60.0 * 10 ** max(high for _, _, high in DURATION_BANDS)
    slowest = min(w.bytes_per_sec_per_gpu for w in WORKLOADS) * min(gpus for gpus, _ in gpu_demand)
    fastest = max(w.bytes_per_sec_per_gpu for w in WORKLOADS) * max(gpus for gpus, _ in gpu_demand)
    low = max(1.001 * longest / HORIZON_SECONDS, 1.0 / slowest)  # a whole byte/s at least, rounding included
    return _two_digits(low, up=True), _two_digits(0.999 * MAX_VALUE / fastest, up=False)


def _two_digits(value: float, up: bool) -> float:
    """`value` rounded to two significant digits, up or down, as the float that its decimal spelling reads as."""
    exponent = math.floor(math.log10(value)) - 1
    mantissa = value / 10.0**exponent
    return float(f"{math.ceil(mantissa) if up else math.floor(mantissa)}e{exponent}")


@dataclass(frozen=True, slots=True)
class _Draw:
    """One job's random choices, before it has an id."""

    arrival: float
    gpus: int
    workload: Workload
    duration_seconds: float
    shared: bool
    irregular: bool


def generate(config: GeneratorConfig) -> list[TraceJob]:
    """The trace `config` describes, in arrival order; the same config always gives the same trace."""
    return list(generate_jobs(config))


def generate_jobs(config: GeneratorConfig, count: int | None = None) -> Iterator[TraceJob]:
    """`generate`'s trace job by job, in the same memory however long it is. A job's id is as wide as the last's,
    so the jobs are counted first (`trace_size`, which raises `KnobError` where they pass a bound), unless the
    caller gives `count`, what `trace_size` said."""
    width = max(4, len(str((trace_size(config)[0] if count is None else count) - 1)))
    for i, (arrival, uniforms) in enumerate(_arrivals(config)):
        yield _job(f"job-{i:0{width}d}", _draw(arrival, uniforms, config), config.gpu_speed_scale)


def trace_size(config: GeneratorConfig) -> tuple[int, float]:
    """How many jobs `config` gives and when the last arrives (0 and 0.0 for none), from the arrivals alone: about
    a second per million jobs. Raises `KnobError` where a random arrival passes the simulator's horizon or the count
    passes `MAX_JOBS`, which `GeneratorConfig` checks only on average."""
    count, last = 0, 0.0
    for arrival, _ in _arrivals(config):
        if arrival > HORIZON_SECONDS:  # only with a number of jobs: a duration is within the horizon
            raise KnobError(
                ("jobs", "arrivals_per_hour"),
                f"job {count + 1:,} of {config.jobs or 0:,} arrives {arrival / YEAR_SECONDS:.3g} years after the trace "
                f"start at {config.arrivals_per_hour:g} an hour, past the simulator's horizon of {HORIZON_YEARS} "
                "years: ask for fewer jobs or more an hour",
            )
        count, last = count + 1, arrival
        if count > MAX_JOBS:  # only with a duration: a number of jobs is at most MAX_JOBS
            raise KnobError(
                ("duration", "arrivals_per_hour"),
                f"more than {MAX_JOBS:,} jobs arrive at {config.arrivals_per_hour:g} an hour within "
                f"{config.duration_seconds or 0:,.0f} s, more than a trace may have",
            )
    return count, last


def _arrivals(config: GeneratorConfig) -> Iterator[tuple[float, list[float]]]:
    """Each job's arrival and the uniform draws its choices come from, in the order they are drawn."""
    rng = random.Random(config.seed)
    mean_gap = 3600.0 / config.arrivals_per_hour
    clock = 0.0
    count = 0
    while config.jobs is None or count < config.jobs:
        clock += -mean_gap * math.log(1.0 - rng.random())
        if config.duration_seconds is not None and clock > config.duration_seconds:
            return
        yield float(round(clock)), [rng.random() for _ in range(_CHOICES)]
        count += 1


def _draw(arrival: float, uniforms: Sequence[float], config: GeneratorConfig) -> _Draw:
    gpus_u, workload_u, band_u, duration_u, shared_u, irregular_u = uniforms
    gpus = pick_weighted(gpus_u, config.gpu_demand)
    workload = pick_weighted(workload_u, [(w, w.weight) for w in WORKLOADS])
    _, low, high = pick_weighted(band_u, [(band, band[0]) for band in DURATION_BANDS])
    minutes = 10 ** (low + (high - low) * duration_u)
    return _Draw(
        arrival=arrival,
        gpus=gpus,
        workload=workload,
        duration_seconds=60.0 * minutes,
        shared=shared_u < config.sharing,
        irregular=irregular_u < config.irregular,
    )


def pick_weighted(u: float, weighted: Sequence[tuple[T, float]]) -> T:
    """The choice a uniform draw `u` in [0, 1) lands on when the weights (summing to 1) tile the interval."""
    bound = 0.0
    for choice, weight in weighted:
        bound += weight
        if u < bound:
            return choice
    return weighted[-1][0]  # u beyond the rounded sum of the weights


def _job(job_id: str, draw: _Draw, gpu_speed_scale: float) -> TraceJob:
    workload = draw.workload
    v100_rate = workload.bytes_per_sec_per_gpu * draw.gpus
    epochs = float(f"{draw.duration_seconds * v100_rate / workload.dataset_bytes:.6g}")
    return TraceJob(
        job_id=job_id,
        arrival=draw.arrival,
        gpus=draw.gpus,
        model=workload.model,
        ideal_bytes_per_sec=float(round(v100_rate * gpu_speed_scale)),
        dataset=workload.dataset if draw.shared else f"{workload.dataset}/{job_id}",
        dataset_bytes=workload.dataset_bytes,
        epochs=epochs,
        irregular=draw.irregular,
    )


def service_distribution(
    gpu_demand: Sequence[tuple[int, float]] = GPU_DEMAND, points_per_band: int = 64
) -> tuple[list[float], list[float]]:
    """The distribution of a generated job's service in GPU-seconds (GPUs x duration on V100s), as weighted
    points: each GPU count x each duration band's log-uniform range at `points_per_band` evenly spaced
    quantiles. What 2D-Gittins takes as the history of past jobs when none is given."""
    services: list[float] = []
    weights: list[float] = []
    for gpus, gpu_share in gpu_demand:
        for band_share, low, high in DURATION_BANDS:
            for k in range(points_per_band):
                minutes = 10 ** (low + (high - low) * (k + 0.5) / points_per_band)
                services.append(gpus * 60.0 * minutes)
                weights.append(gpu_share * band_share / points_per_band)
    return services, weights
