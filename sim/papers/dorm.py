"""Dorm §V's workload in the simulator: its application mix, trace shape and cluster, against static partitions.

What is taken from the paper (Dorm, Sun et al.):

* **Cluster**: 20 DormSlaves, 240 CPU cores and 2.5 TB of RAM (§V-A-1): 20 nodes of 12 vCores and
  128 GB.
* **Applications** (Table II): 50 applications of 7 kinds -- 20 LR, 20 MF, 6 CaffeNet and one each
  of VGG-16, GoogLeNet, AlexNet and ResNet-50 -- with each kind's container (CPUs, RAM), weight and
  n_max; the baseline (Swarm) creates 8, 8, 4, 2, 2, 2, 3 containers for them (§V-A-4), which is
  what each job is submitted with and what `static` keeps.
* **Trace**: the 50 applications in random order, submitted with a mean interval of 20 minutes
  (§V-A-3: exponential gaps, a Poisson process).
* **Dorm's thresholds**: Dorm-3's θ1 = θ2 = 0.1, the configuration of all three headline figures
  (2.32x utilization, 1.52x lower fairness loss, 2.72x speed-up).

Departures, and why:

* An application of n containers is a PS job of n - 1 workers and one server (Elastane's PS jobs
  have the two roles; Dorm's n counts containers), so n_min is 2, not Table II's (whose n_min
  column is unreadable in the paper; 2 is the least a PS job runs with).
* GPUs are not modelled (the simulator's resources are memory and vCores): the four ImageNet
  applications ask one GPU per container in Table II and the testbed has 5, which bounds them
  there and not here. Utilization is the mean of the memory and vCore fractions (Dorm sums CPU,
  GPU and RAM; the ratio between two runs is what is compared).
* The paper gives no speed function or length of its applications. Each is assumed to scale as a
  data-parallel job with a 2 % serial part and 0.05 % of an epoch per extra worker in coordination,
  T(w) = base·(1/w + 0.02 + 0.0005·w), and to run `hours` at its static size (`KINDS`), a fixed
  number of epochs (max_epochs, so convergence does not vary). `DormPaper(speed=LINEAR)` is the
  variant without that assumption's losses: T(w) = base/w, every worker adds its whole speed (what
  the paper's 2.72x speed-up is bounded by: n_max / static is 4x for LR and MF, 2-2.5x for the
  ImageNet kinds).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from protocol.config import RMConfig
from protocol.records import Resource

from ..calibration import AppCalibration, Calibration
from ..trace import TraceJob


@dataclass(frozen=True)
class Kind:
    """One row of Table II, with the static container count (§V-A-4) and an assumed length."""

    name: str
    vcores: int
    memory_gb: int
    weight: float
    n_max: int
    count: int
    static: int
    hours: float           # assumed: hours at the static size (the paper gives none)


KINDS: tuple[Kind, ...] = (
    Kind("LR", 2, 8, 1.0, 32, 20, 8, 2.0),
    Kind("MF", 2, 6, 2.0, 32, 20, 8, 2.0),
    Kind("CaffeNet", 4, 6, 4.0, 8, 6, 4, 4.0),
    Kind("VGG16", 4, 32, 1.0, 5, 1, 2, 8.0),
    Kind("GoogLeNet", 6, 16, 1.0, 5, 1, 2, 6.0),
    Kind("AlexNet", 6, 16, 2.0, 5, 1, 2, 4.0),
    Kind("ResNet50", 4, 32, 4.0, 5, 1, 3, 8.0),
)
# The assumed speed function (module doc): seconds per epoch over the five-feature form
# models.ps_iteration_time uses, θ = base · (1, 0.02, 0, 0.0005, 0) on [1/w, 1, w/s, w, s].
SPEED_SHAPE = (1.0, 0.02, 0.0, 0.0005, 0.0)
LINEAR = (1.0, 0.0, 0.0, 0.0, 0.0)
EPOCHS = 20


def app_name(kind: Kind) -> str:
    return f"dorm:{kind.name}"


def epoch_units(workers: int, shape: tuple[float, ...] = SPEED_SHAPE) -> float:
    """T(w) / base at one server."""
    t0, t1, t2, t3, t4 = shape
    return t0 / workers + t1 + t2 * workers + t3 * workers + t4


@dataclass(frozen=True)
class DormPaper:
    """The knobs of the reproduction (defaults: the paper's, module doc)."""

    nodes: int = 20
    node: Resource = Resource(128 * 1024, 12)
    mean_interval_s: float = 20 * 60.0
    theta1: float = 0.1                 # Dorm-3
    theta2: float = 0.1
    restart_s: float = 60.0             # checkpoint-kill-resume (§III-C-2)
    startup_s: float = 30.0
    scale: float = 1.0                  # every application's length times this (quick runs)
    speed: tuple[float, ...] = SPEED_SHAPE  # the assumed speed function's shape (LINEAR: the variant)

    def rm_config(self, base: RMConfig) -> RMConfig:
        import msgspec  # noqa: PLC0415
        return msgspec.structs.replace(base, dorm_fairness_threshold=self.theta1,
                                       dorm_adjustment_threshold=self.theta2)


def calibration(paper: DormPaper = DormPaper()) -> Calibration:
    """One synthetic app per kind: the assumed speed function with its base set so `EPOCHS` epochs
    at the static size take the kind's `hours`."""
    apps = {}
    for k in KINDS:
        base = k.hours * 3600.0 * paper.scale / (EPOCHS * epoch_units(k.static - 1, paper.speed))
        apps[app_name(k)] = AppCalibration(
            theta=[base * c for c in paper.speed], loss_curve=[1.0, 1.0, 0.0], clocks_per_epoch=100.0,
            reference={"paper": "dorm", "kind": k.name, "static_containers": k.static, "hours": k.hours},
            am_start_s=2.0, startup_s=paper.startup_s, finish_s=1.0, reshape_s=paper.restart_s,
            restart_s=paper.restart_s, pause_s=paper.restart_s, max_epochs=EPOCHS)
    return Calibration(apps=apps, measured_on="Dorm Table II and §V-A (speed and length assumed)",
                       note="synthetic: sim/papers/dorm.py")


def generate(paper: DormPaper, seed: int) -> list[TraceJob]:
    """The 50 applications in a random order with exponential gaps of mean `mean_interval_s`."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS for _ in range(k.count)]
    rng.shuffle(kinds)
    t, out = 0.0, []
    for i, k in enumerate(kinds):
        if i:
            t += rng.expovariate(1.0 / paper.mean_interval_s)
        out.append(TraceJob(
            name=f"dorm{i + 1:04d}", arrival_s=round(t, 3), app=app_name(k), threshold=1e-9,
            workers=k.static - 1, servers=1, min_workers=1, min_servers=1, max_workers=k.n_max - 1,
            max_servers=1, max_epochs=EPOCHS, elastic_mode="kill", user=f"user{i % 5}",
            executor_memory_mb=k.memory_gb * 1024, executor_vcores=k.vcores, weight=k.weight))
    return out


__all__ = ["DormPaper", "EPOCHS", "KINDS", "Kind", "LINEAR", "SPEED_SHAPE", "app_name", "calibration", "epoch_units",
           "generate"]
