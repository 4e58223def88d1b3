"""The Harmony evaluation's workload (dissertation §4.4.2, Table 4.1, Fig. 4.9) as a trace and a calibration.

The paper runs 80 jobs on 100 m4.2xlarge instances (8 vCPUs each): 4 applications (NMF, LDA, MLR,
Lasso), 2 data sets each, 10 hyper-parameter settings per (application, data set); each job's
iteration time and COMP:COMM ratio measured at DoP 16 spread as Fig. 4.9 shows. Here:

- every (application, data set, setting) is a job type of its own, named as a user app is
  ("harmony:NMF_Netflix64x_h3", sim/trace.py), with a calibration entry whose speed function is the
  paper's eq. 4.2: `T(w, s) = θ0/w + θ1` per epoch (COMP parallelises over the workers, COMM does
  not); `θ0 = 16 * t_cpu * C`, `θ1 = t_net * C` for the job's per-iteration COMP / COMM times at
  DoP 16 and C = `CLOCKS_PER_EPOCH` iterations per epoch;
- a (application, data set)'s nominal iteration time and COMP share at DoP 16 are `NOMINAL` below;
  the 10 settings spread them (COMP share +- `SHARE_SPREAD`, iteration time x `ITERATION_SPREAD`
  log-uniformly), so the 80 jobs span COMP:COMM from about 80:20 to 20:80 (issue 24's reading of
  Fig. 4.9: the figure's exact values are not in the text, so the spread is what is reproduced, not
  each job);
- each job runs a fixed number of epochs (the paper runs to a convergence threshold; the
  simulator's stopping test on a curve that never meets `THRESHOLD` stops it at its epoch limit),
  sized so it would take `alone_min` minutes alone at DoP 16 (log-uniform in `job_minutes`);
- all jobs arrive at once (the paper's makespan runs "from the start of the first job");
- the trace asks for DoP 16 (16 workers, 16 servers; the isolated baseline runs that shape under
  the `static` policy) and allows any shape from 1 to the cluster's size (Harmony gives a group's
  jobs one worker and one server per node of the group);
- pause / restart / startup costs grow with the model (Table 4.1's 1-24 GB, checkpointed by 16
  servers in parallel): `COST_FIXED_S + COST_S_PER_GB * model GB` (an assumption: the paper reports
  only that regrouping stayed under 2 % of the makespan).

The same seed gives the same trace and calibration.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import msgspec

from .calibration import AppCalibration, Calibration
from .trace import TraceJob

DOP = 16
CLOCKS_PER_EPOCH = 10
THRESHOLD = 1e-6            # never met by LOSS_CURVE within any job's epochs: each runs its epoch limit
LOSS_CURVE = [1.0, 1.0, 0.0]
SHARE_SPREAD = 0.15
ITERATION_SPREAD = (0.6, 1.7)
COST_FIXED_S = 20.0
COST_S_PER_GB = 1.0
PREFIX = "harmony"


@dataclass(frozen=True)
class AppDataset:
    """One (application, data set) of Table 4.1 and its nominal behaviour at DoP 16."""

    app: str
    dataset: str
    input_gb: float
    model_gb: float
    iteration_s: float      # nominal iteration time at DoP 16
    cpu_share: float        # nominal COMP / (COMP + COMM) at DoP 16


# Table 4.1's sizes. The nominal shares follow the input / model sizes (a large input over a small
# model computes more than it communicates: NMF; LDA's and the regressions' large models
# communicate more), the iteration times grow with the sizes; both are this project's assumptions.
NOMINAL: tuple[AppDataset, ...] = (
    AppDataset("NMF", "Netflix64x", 45.6, 1.0, 8.0, 0.72),
    AppDataset("NMF", "Netflix128x", 91.2, 5.0, 16.0, 0.62),
    AppDataset("LDA", "PubMed", 4.3, 2.1, 6.0, 0.40),
    AppDataset("LDA", "NyTimes", 0.6, 1.1, 3.0, 0.30),
    AppDataset("MLR", "Synthetic78", 78.4, 12.0, 20.0, 0.50),
    AppDataset("MLR", "Synthetic155", 155.0, 24.0, 40.0, 0.42),
    AppDataset("Lasso", "Synthetic78", 78.4, 12.0, 15.0, 0.45),
    AppDataset("Lasso", "Synthetic155", 155.0, 24.0, 30.0, 0.35),
)


@dataclass(frozen=True)
class HarmonyWorkloadSpec:
    """The knobs (defaults: the paper's setting)."""

    settings: int = 10                          # hyper-parameter settings per (application, data set)
    job_minutes: tuple[float, float] = (20.0, 90.0)     # each job's run alone at DoP 16
    window_s: float = 0.0                       # arrivals uniform over [0, window] (paper: all at once)
    nodes: int = 100                            # the largest shape a job accepts
    executor_memory_mb: int = 12 * 1024         # two executors fill an 8-core, 32 GB host (isolated)
    executor_vcores: int = 4


@dataclass(frozen=True)
class HarmonyJob:
    """A generated job's truth at DoP 16 (what Fig. 4.9 plots), beside its trace line."""

    name: str
    app: str
    t_cpu: float            # COMP per iteration at DoP 16
    t_net: float            # COMM per iteration
    epochs: int

    @property
    def cpu_share(self) -> float:
        return self.t_cpu / (self.t_cpu + self.t_net)


def generate(spec: HarmonyWorkloadSpec = HarmonyWorkloadSpec(), seed: int = 1
             ) -> tuple[list[TraceJob], Calibration, list[HarmonyJob]]:
    """The trace, the calibration its job types need, and each job's truth at DoP 16."""
    if spec.settings < 1:
        raise ValueError(f"settings must be >= 1, got {spec.settings}")
    lo, hi = spec.job_minutes
    if not (0 < lo <= hi):
        raise ValueError(f"job_minutes must satisfy 0 < low <= high, got {lo}, {hi}")
    if spec.nodes < DOP:
        raise ValueError(f"the cluster needs at least {DOP} nodes for DoP {DOP}, got {spec.nodes}")
    rng = random.Random(seed)
    apps: dict[str, AppCalibration] = {}
    jobs: list[TraceJob] = []
    truth: list[HarmonyJob] = []
    for nominal in NOMINAL:
        for h in range(1, spec.settings + 1):
            share = min(0.85, max(0.15, nominal.cpu_share + rng.uniform(-SHARE_SPREAD, SHARE_SPREAD)))
            itr = nominal.iteration_s * math.exp(rng.uniform(*(math.log(x) for x in ITERATION_SPREAD)))
            t_cpu, t_net = share * itr, (1.0 - share) * itr
            minutes = math.exp(rng.uniform(math.log(lo), math.log(hi)))
            epochs = max(2, round(minutes * 60.0 / (itr * CLOCKS_PER_EPOCH)))
            app = f"{PREFIX}:{nominal.app}_{nominal.dataset}_h{h}"
            cost = COST_FIXED_S + COST_S_PER_GB * nominal.model_gb
            apps[app] = AppCalibration(
                theta=[DOP * t_cpu * CLOCKS_PER_EPOCH, t_net * CLOCKS_PER_EPOCH, 0.0, 0.0, 0.0],
                loss_curve=list(LOSS_CURVE), clocks_per_epoch=float(CLOCKS_PER_EPOCH), max_epochs=epochs,
                reference={"app": nominal.app, "dataset": nominal.dataset, "input_gb": nominal.input_gb,
                           "model_gb": nominal.model_gb, "setting": h},
                am_start_s=5.0, startup_s=cost, restart_s=cost, reshape_s=cost, pause_s=0.5 * cost, finish_s=5.0)
            name = f"{nominal.app.lower()}-{nominal.dataset.lower()}-h{h}"
            truth.append(HarmonyJob(name, app, t_cpu, t_net, epochs))
            jobs.append(TraceJob(
                name=name, arrival_s=0.0, app=app, threshold=THRESHOLD, workers=DOP, servers=DOP,
                min_workers=1, min_servers=1, max_workers=spec.nodes, max_servers=spec.nodes,
                executor_memory_mb=spec.executor_memory_mb, executor_vcores=spec.executor_vcores,
                max_epochs=epochs, user="user0"))
    # Arrival order is drawn, not Table 4.1's: FIFO baselines would otherwise run the apps in blocks.
    order = list(range(len(jobs)))
    rng.shuffle(order)
    arrivals = sorted(rng.uniform(0.0, spec.window_s) for _ in order) if spec.window_s > 0 else [0.0] * len(order)
    trace = [msgspec.structs.replace(jobs[i], arrival_s=round(t, 3)) for i, t in zip(order, arrivals)]
    cal = Calibration(apps=apps, measured_on="synthetic: the Harmony dissertation's §4.4 workload",
                      note="sim/workload_harmony.py: eq. 4.2 speed functions from Table 4.1 / Fig. 4.9's spread")
    return trace, cal, [truth[i] for i in order]


__all__ = ["AppDataset", "CLOCKS_PER_EPOCH", "DOP", "HarmonyJob", "HarmonyWorkloadSpec", "NOMINAL", "generate"]
