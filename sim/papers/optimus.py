"""Optimus §6's workload in the simulator: its job types, speed functions, loss curve, arrivals and cluster.

What is taken from the paper (Optimus, EuroSys'18):

* **Job types**: the nine models of Table 1, each trained synchronously or asynchronously (§6.1:
  "we randomly choose the job among the examples in Table 1 and decide to run it using
  asynchronous training or synchronous training randomly"): 18 synthetic apps named
  "optimus:<Model>_sync" / "optimus:<Model>_async" (a PS job spec's "module:Class" form).
* **Speed functions**: Table 2's coefficients, eq. 4 for sync (θ = 1.02, 2.78, 4.92, 0.00, 0.02 on
  M/w, 1, w/p, w, p) and eq. 3 for async (θ = 2.83, 3.92, 0.00, 0.11 on 1, w/p, w, p, over w).
  The paper gives no M (the global batch of eq. 4); M = 1 takes Table 2's θ0 as printed (M folded
  in). Then, as §3.2 observes of Fig. 9(c), more workers at the same servers slow a synchronous
  job, and at 1:1 sixteen times the executors buy 8 %: "more resources do not mean higher training
  speed" (§6.2). `OptimusPaper(batch_m=16)` is models/optimus_fit.py's reading (its reference
  prior), where a synchronous job at 1:1 still gains 2.7x from 1 to 16 of each.
* **Loss curve**: Fig. 7's fitted Seq2Seq curve, β = (0.21, 1.07, 0.07); with §6.1's thresholds of
  1-5 % a job trains 12-51 epochs.
* **Arrivals**: uniform over [0, 12000] s (§6.1); 60 jobs, the count §6.3's Poisson variant gives
  (3 arrivals per 10-minute scheduling interval over 12000 s).
* **Cluster**: the testbed's 13 servers (7 CPU servers of 16 cores; the GPU servers' 8 cores and
  GPUs are not modelled: every node is 16 vCores, 64 GB). Each worker and parameter server asks
  2 vCores and 4 GB; jobs are submitted 1:1 (§6.1 "we set the ratio of the number of parameter
  servers to the number of workers to 1:1") at 1-4 of each and may grow to 16 of each.
* **Resizing**: checkpoint-based (§4: checkpoint, restart with the new shape), the PS job's
  elastic_mode "kill", `restart_s` each time.

Departures, and why:

* Table 2 lists ResNet-50's coefficients only and Fig. 7 Seq2Seq's curve only; every job type
  uses them. Job types differ in their epoch's length: steps per epoch follow Table 1's dataset
  sizes, downscaled as §6.1 downscales large datasets (here into [0.3, 3] of a reference epoch).
* The length of a step (the θ's unit) and the downscaled epoch are not in the paper; `epoch_s`
  sets the reference epoch's seconds at one worker and one server (sync), chosen so that the DRF
  baseline's makespan is near the paper's 6.7 hours (Fig. 13). It is one scale for every job.
* GPUs are not modelled (the simulator's resources are memory and vCores).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from protocol.json_types import JsonObject
from protocol.records import Resource

from ..calibration import AppCalibration, Calibration
from ..trace import TraceJob
from .speed import FeatureEpochTimeModel, PaperAppCalibration, project_theta

# Table 2 (per training step). Sync, eq. 4: θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p.
SYNC_THETA = (1.02, 2.78, 4.92, 0.00, 0.02)
# Async, eq. 3: f(p, w) = w / (θ0 + θ1·w/p + θ2·w + θ3·p).
ASYNC_THETA = (2.83, 3.92, 0.00, 0.11)
BATCH_M = 1.0                       # eq. 4's M: Table 2's θ0 as printed (module doc)
LOSS_CURVE = (0.21, 1.07, 0.07)     # Fig. 7, Seq2Seq
# Table 1: model name, parameters (millions), dataset size (examples).
TABLE1: tuple[tuple[str, float, int], ...] = (
    ("ResNext110", 1.7, 60_000), ("ResNet50", 25.0, 1_313_788), ("InceptionBN", 11.3, 30_607),
    ("Kaggle", 1.4, 37_920), ("CNNRand", 6.0, 10_662), ("DSSM", 1.5, 214_288),
    ("RNNLSTM", 4.7, 1_002_000), ("Seq2Seq", 9.1, 1_000_000), ("DeepSpeech2", 38.0, 45_000))
REFERENCE_EXAMPLES = 100_000        # a dataset of this size takes one reference epoch
DOWNSCALE = (0.3, 3.0)              # §6.1 downscales the large datasets: epochs within this range
MAX_EXECUTORS = 16                  # per role


def sync_step_time(workers: int, servers: int, m: float = BATCH_M) -> float:
    """Table 2's eq. 4: seconds (θ units) per synchronous step with p = servers, w = workers."""
    t0, t1, t2, t3, t4 = SYNC_THETA
    return t0 * m / workers + t1 + t2 * workers / servers + t3 * workers + t4 * servers


def async_speed(workers: int, servers: int) -> float:
    """Table 2's eq. 3: steps per second of an asynchronous job (all workers together)."""
    t0, t1, t2, t3 = ASYNC_THETA
    return workers / (t0 + t1 * workers / servers + t2 * workers + t3 * servers)


SYNC_FEATURES = (0, 2, 3, 4, 5)     # eq. 4's terms among the seven features: 1/w, 1, w/p, w, p


def step_features(sync: bool, m: float = BATCH_M) -> tuple[float, ...]:
    """Time per step over [1/w, 1/p, 1, w/p, w, p, p/w] (sim/papers/speed.py): eq. 4 as it is,
    eq. 3 as 1/f = θ0/w + θ1/p + θ2 + θ3·p/w."""
    if sync:
        t0, t1, t2, t3, t4 = SYNC_THETA
        return (t0 * m, 0.0, t1, t2, t3, t4, 0.0)
    a0, a1, a2, a3 = ASYNC_THETA
    return (a0, a1, a2, 0.0, 0.0, 0.0, a3)


def epoch_scale(examples: int) -> float:
    """A job type's epoch relative to the reference epoch (its dataset, downscaled: module doc)."""
    lo, hi = DOWNSCALE
    return min(hi, max(lo, examples / REFERENCE_EXAMPLES))


def app_name(model: str, sync: bool) -> str:
    return f"optimus:{model}_{'sync' if sync else 'async'}"


@dataclass(frozen=True)
class OptimusPaper:
    """The knobs of the reproduction (defaults: the paper's, module doc)."""

    jobs: int = 60
    window_s: float = 12000.0
    threshold: tuple[float, float] = (0.01, 0.05)
    batch_m: float = BATCH_M                    # eq. 4's M (the paper gives none)
    modes: tuple[bool, ...] = (True, False)     # sync, async drawn at random (§6.1); (True,): Fig. 16's all-sync
    nodes: int = 13
    node: Resource = Resource(65536, 16)
    executor: Resource = Resource(4096, 2)
    epoch_s: float = 150.0              # the reference epoch's seconds at (1 worker, 1 server), sync
    scheduling_interval_s: float = 600.0    # §6.1: "Each scheduling interval is 10 minutes long"
    restart_s: float = 20.0             # checkpoint + restart at the new shape (§4)
    startup_s: float = 10.0
    am_start_s: float = 2.0
    finish_s: float = 1.0


def calibration(paper: OptimusPaper = OptimusPaper()) -> Calibration:
    """The 18 synthetic apps: per Table 1 model and mode, Table 2's speed function scaled so the
    model's epoch at (1, 1) sync takes `epoch_s` x its dataset's scale, and Fig. 7's curve."""
    per_step = paper.epoch_s / sync_step_time(1, 1, paper.batch_m)      # steps per reference epoch x the θ unit
    apps: dict[str, AppCalibration] = {}
    for model, _params, examples in TABLE1:
        scale = epoch_scale(examples)
        for sync in (True, False):
            features = [per_step * scale * c for c in step_features(sync, paper.batch_m)]
            ref: JsonObject = {"paper": "optimus", "model": model, "sync": sync, "epoch_scale": scale}
            # eq. 4 is the simulator's own five-feature form (a plain calibration); eq. 3 needs seven.
            theta = [features[i] for i in SYNC_FEATURES] if sync else project_theta(
                FeatureEpochTimeModel(tuple(features)), MAX_EXECUTORS, MAX_EXECUTORS)
            app = AppCalibration(theta=theta, loss_curve=list(LOSS_CURVE), clocks_per_epoch=100.0 * scale,
                                 reference=ref, am_start_s=paper.am_start_s, startup_s=paper.startup_s,
                                 finish_s=paper.finish_s, reshape_s=paper.restart_s, restart_s=paper.restart_s,
                                 pause_s=paper.restart_s)
            apps[app_name(model, sync)] = app if sync else PaperAppCalibration(
                features=features, **{f: getattr(app, f) for f in app.__struct_fields__})
    return Calibration(apps=apps, measured_on="Optimus (EuroSys'18) Table 1, Table 2, Fig. 7",
                       note="synthetic: sim/papers/optimus.py")


def generate(paper: OptimusPaper, seed: int) -> list[TraceJob]:
    """§6.1's workload: arrivals uniform over the window, a Table 1 model and a mode at random, a
    threshold in 1-5 %, a 1:1 shape of 1-4 of each (up to MAX_EXECUTORS of each)."""
    if not paper.modes or len(paper.modes) > 2:
        raise ValueError(f"modes must be (True, False), (True,) or (False,), got {paper.modes}")
    if paper.jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {paper.jobs}")
    lo, hi = paper.threshold
    if not (0 < lo <= hi < 1):
        raise ValueError(f"thresholds must satisfy 0 < low <= high < 1, got {lo}, {hi}")
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0.0, paper.window_s) for _ in range(paper.jobs))
    out = []
    for i, t in enumerate(arrivals):
        model = rng.choice(TABLE1)[0]
        sync = rng.random() < 0.5 if len(paper.modes) == 2 else paper.modes[0]
        n = rng.randint(1, 4)
        out.append(TraceJob(
            name=f"opt{i + 1:04d}", arrival_s=round(t, 3), app=app_name(model, sync),
            threshold=round(rng.uniform(lo, hi), 4), workers=n, servers=n, min_workers=1, min_servers=1,
            max_workers=MAX_EXECUTORS, max_servers=MAX_EXECUTORS, sync="bsp" if sync else "ssp",
            elastic_mode="kill", user=f"user{i % 4}", executor_memory_mb=paper.executor.memory,
            executor_vcores=paper.executor.vcores))
    return out


def check_table2(workers: int, servers: int, sync: bool, epoch_model: FeatureEpochTimeModel) -> float:
    """The ratio of `epoch_model`'s time at (w, p) to Table 2's (constant across shapes when the
    model is Table 2's speed function, whatever its scale)."""
    table = sync_step_time(workers, servers) if sync else 1.0 / async_speed(workers, servers)
    return epoch_model.epoch_time(workers, servers) / table


__all__ = ["ASYNC_THETA", "LOSS_CURVE", "OptimusPaper", "SYNC_THETA", "TABLE1", "app_name", "async_speed",
           "calibration", "check_table2", "epoch_scale", "generate", "step_features", "sync_step_time"]
