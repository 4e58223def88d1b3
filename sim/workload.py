"""A seeded generator of the papers' workloads (Optimus §6.1), as a trace (sim/trace.py).

Optimus §6.1: "Job arrival happens randomly between [0, 12000] seconds. Upon an arrival event, we
randomly choose the job among the examples in Table 1 and decide to run it using asynchronous
training or synchronous training randomly. We vary the convergence threshold of jobs between 1%
and 5%." Here the job kinds are Elastane's apps (mlr, nmf, lda, lasso), asynchronous training is
SSP (bounded staleness) and synchronous BSP; each job's data is its app's calibration reference
scaled by a factor drawn log-uniformly from `data_scale` (so jobs differ in size as the paper's
models do), its requested shape is small (1-4 workers, 1-2 servers) and it may grow to four
times that (the elastic range the policies play with). Users are drawn from `users` names.
The same arguments and seed give the same trace.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

from .trace import APPS, TraceJob


@dataclass(frozen=True)
class WorkloadSpec:
    """The knobs of the generator (defaults: Optimus §6.1, with Elastane's apps)."""

    jobs: int = 20
    window_s: float = 12000.0
    threshold_min: float = 0.01
    threshold_max: float = 0.05
    data_scale: tuple[float, float] = (20.0, 200.0)
    apps: Sequence[str] = APPS
    users: int = 4
    queue: str = "default"
    executor_memory_mb: int = 1024
    executor_vcores: int = 1
    growth: int = 4            # max shape = growth x requested


def generate(spec: WorkloadSpec, seed: int) -> list[TraceJob]:
    if spec.jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {spec.jobs}")
    if spec.window_s < 0:
        raise ValueError(f"window must be >= 0 seconds, got {spec.window_s}")
    if not (0 < spec.threshold_min <= spec.threshold_max < 1):
        raise ValueError(f"thresholds must satisfy 0 < min <= max < 1, got {spec.threshold_min}, {spec.threshold_max}")
    lo, hi = spec.data_scale
    if not (0 < lo <= hi):
        raise ValueError(f"data_scale must satisfy 0 < low <= high, got {lo}, {hi}")
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0.0, spec.window_s) for _ in range(spec.jobs))
    out = []
    for i, t in enumerate(arrivals):
        app = rng.choice(list(spec.apps))
        workers, servers = rng.randint(1, 4), rng.randint(1, 2)
        out.append(TraceJob(
            name=f"job{i + 1:04d}", arrival_s=round(t, 3), app=app,  # type: ignore[arg-type]
            threshold=round(rng.uniform(spec.threshold_min, spec.threshold_max), 4),
            workers=workers, servers=servers, min_workers=1, min_servers=1,
            max_workers=workers * spec.growth, max_servers=servers * spec.growth,
            data_scale=round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 3),
            sync="ssp" if rng.random() < 0.5 else "bsp", user=f"user{rng.randrange(spec.users)}",
            queue=spec.queue, executor_memory_mb=spec.executor_memory_mb, executor_vcores=spec.executor_vcores))
    return out


__all__ = ["WorkloadSpec", "generate"]
