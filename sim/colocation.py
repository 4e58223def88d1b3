"""Co-located PS jobs' iteration times: Harmony's model (dissertation eq. 4.1-4.4) plus measured interference.

Pure: no clock, no simulator. A job is a `SubtaskTimes`, its per-iteration work alone at its degree of
parallelism: `t_cpu` (its COMP subtask) and `t_net` (its COMM: PULL + PUSH), seconds. Jobs whose
executors share a host form a co-location set; `iteration_times(loads, mode)` says how long each
one's iteration takes there, in one of three modes:

- `ISOLATED`: each job on hosts of its own (the paper's isolated baseline): `t_cpu + t_net`.
- `HARMONY`: the NM arbiter interleaves the jobs' subtasks, one COMP and one primary COMM at a time
  per host; a group iteration (every job one iteration) takes eq. 4.1 (models/harmony.py),

      Tg = max( sum_j t_cpu_j, sum_j t_net_j, max_j (t_cpu_j + t_net_j) ),

  plus `arbiter_handoff_s` per subtask that queued behind another job's (a grant handed from one
  job to the next: bench/arbiter.py's handoff). Every job of the set does one iteration per group
  iteration, so each job's iteration time is Tg: the dissertation's definition ("the time for all
  jobs j of a group g to finish an iteration"), which also charges the short jobs of a job-bound
  group (Fig. 4.7b) the long job's iteration.
- `NAIVE`: co-located, contending freely (the paper's "naively co-located" baseline, Gandiva's
  approach): no arbiter, so each resource is processor-shared by the subtasks using it at once, and
  a subtask sharing the CPU with another job's COMP slows by `naive_cpu_contention` on top of its
  share (time-slicing a core between two COMPs: context switches, each evicting the other's cache;
  bench/colocation_interference.py measures it). Each job's mean iteration is read off a fluid run
  of the set's subtask cycles (`naive_iteration_times`): jobs drift out of step, so they overlap
  COMP with COMM part of the time as Harmony does, but with no one ordering them.

Departure, and why: the network gets no contention term. Two flows on one link share it fairly at
about the link's rate (TCP), and this project cannot measure a loss there (its testbed links are
shaped loopback); only the CPU term is measured, so NAIVE's penalty is a lower bound.

The measured values (`MEASURED`) come from `bench/colocation_interference.py` on the project's dev
machine (2 cores shared by several builds, so medians of interleaved repeats): see docs/harmony_simulation.md.
`utilization(loads, times)` is eq. 4.3 for a set: the fraction of the set's time its CPU and network
spend on useful subtask work (sum_j t_cpu_j / T_j, sum_j t_net_j / T_j), which the simulator
weights by machines as eq. 4.4 does.

`ColocationTimes` puts the model into the simulator (sim/iteration_time.py's `IterationTimeModel`):
the training jobs with executors on a host are that host's set (the arbiter is per host), and a
job's iteration is its slowest host's (BSP). A job's COMP and COMM per iteration are its calibrated
solo epoch time split as its speed function splits it (the θ0/w term is COMP: eq. 4.2; the rest
COMM), over its app's iterations per epoch; its epoch time is its iteration time times those
iterations. It also integrates eq. 4.4 over time
(CPU and network busy on useful work, per host) for the run's utilization.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Callable, Optional, Sequence

import numpy as np

from models.harmony import group_iteration_time
from protocol.errors import PlanningError

from .calibration import Calibration
from .iteration_time import ClusterLoad, JobLoad


class ColocationError(PlanningError, ValueError):
    """Loads or settings the co-location model cannot evaluate (negative times, an unknown mode)."""


class Mode(str, Enum):
    """How the jobs of a co-location set share their hosts (module doc)."""

    ISOLATED = "isolated"
    HARMONY = "harmony"
    NAIVE = "naive"


@dataclass(frozen=True)
class SubtaskTimes:
    """A job's per-iteration work alone at its degree of parallelism (seconds)."""

    t_cpu: float
    t_net: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.t_cpu) and math.isfinite(self.t_net) and self.t_cpu >= 0 and self.t_net >= 0):
            raise ColocationError(f"subtask times must be finite and non-negative, got {self.t_cpu}, {self.t_net}")

    @property
    def alone(self) -> float:
        """Its iteration on hosts of its own: COMP then COMM."""
        return self.t_cpu + self.t_net


@dataclass(frozen=True)
class Interference:
    """What co-location costs beyond eq. 4.1's sharing (module doc; measured values: `MEASURED`)."""

    arbiter_handoff_s: float = 0.0      # per subtask that waited for another job's to end (HARMONY)
    naive_cpu_contention: float = 0.0   # a COMP's slowdown while another job's COMP shares the CPU (NAIVE)

    def __post_init__(self) -> None:
        if not (self.arbiter_handoff_s >= 0 and self.naive_cpu_contention >= 0):
            raise ColocationError("interference terms must be non-negative")


# bench/colocation_interference.py on the dev machine: two COMPs time-sliced on one core took 5.0 %
# longer than one after the other (medians of 5 interleaved repeats: 0.506 s alone, 1.091 s the pair);
# bench/arbiter.py's handoff p50 in the same run: 31 us. docs/harmony_simulation.md records the run.
MEASURED = Interference(arbiter_handoff_s=31e-6, naive_cpu_contention=0.05)


def harmony_group_time(loads: Sequence[SubtaskTimes], interference: Interference = MEASURED) -> float:
    """Eq. 4.1 for the set, plus a handoff per subtask that queued behind another job's: with k jobs
    each of its 3 subtasks (COMP, PULL, PUSH) follows another job's of its kind, so 3k of them."""
    if not loads:
        return 0.0
    tg = group_iteration_time(np.array([x.t_cpu for x in loads]), np.array([x.t_net for x in loads]))
    return tg + (3 * len(loads) * interference.arbiter_handoff_s if len(loads) > 1 else 0.0)


WARMUP_ITERATIONS = 4       # the fluid run's start-up (all jobs start their COMP together) is skipped
MEASURED_ITERATIONS = 24    # then each job's mean iteration over this many


def naive_iteration_times(loads: Sequence[SubtaskTimes], contention: float) -> tuple[float, ...]:
    """NAIVE: each job's mean iteration time when the set's subtasks share each resource equally,
    a COMP slowed by `contention` while another COMP runs beside it (module doc). A fluid run from
    all jobs starting their COMP at once; deterministic, and cached per set."""
    return _naive(tuple((x.t_cpu, x.t_net) for x in loads), float(contention))


@lru_cache(maxsize=4096)
def _naive(work: tuple[tuple[float, float], ...], contention: float) -> tuple[float, ...]:
    k = len(work)
    if k <= 1:
        return tuple(c + n for c, n in work)
    eps = 1e-12
    busy = [j for j in range(k) if work[j][0] + work[j][1] > eps]   # a job with no work never contends
    phase = [0] * k                         # 0: in COMP, 1: in COMM
    left = [work[j][0] for j in range(k)]
    done = [0] * k
    start = [0.0] * k                       # when each job ended its warm-up ...
    end = [0.0] * k                         # ... and its measured iterations
    t = 0.0
    target = WARMUP_ITERATIONS + MEASURED_ITERATIONS
    # Every job keeps cycling (and contending) until the slowest is measured. A job's iteration
    # takes at most k (1 + contention) times its time alone, so the slowest is measured within
    # `window`, in which job i ends at most 2 (window / alone_i + 1) subtasks; each step ends one.
    alone = [work[j][0] + work[j][1] for j in range(k)]
    window = target * k * (1.0 + contention) * max(alone[j] for j in busy) if busy else 0.0
    steps = sum(2 * (int(window / alone[j]) + 2) for j in busy) + 16
    for _ in range(steps):
        for j in busy:
            while left[j] <= eps:           # a zero-length subtask ends at once
                if phase[j] == 0:
                    phase[j], left[j] = 1, work[j][1]
                else:
                    done[j] += 1
                    if done[j] == WARMUP_ITERATIONS:
                        start[j] = t
                    elif done[j] == target:
                        end[j] = t
                    phase[j], left[j] = 0, work[j][0]
        if all(done[j] >= target for j in busy):
            break
        on_cpu = sum(1 for j in busy if phase[j] == 0)
        on_net = len(busy) - on_cpu
        rate = {j: (1.0 / (on_cpu * (1.0 + (contention if on_cpu > 1 else 0.0))) if phase[j] == 0
                    else 1.0 / on_net) for j in busy}
        dt = min(left[j] / rate[j] for j in busy)
        t += dt
        for j in busy:
            left[j] = max(0.0, left[j] - rate[j] * dt)
    else:
        raise ColocationError(f"the naive fluid run did not settle for {work}")     # the bound says it cannot
    return tuple((end[j] - start[j]) / MEASURED_ITERATIONS if j in busy else 0.0 for j in range(k))


def iteration_times(loads: Sequence[SubtaskTimes], mode: Mode, interference: Interference = MEASURED) -> tuple[float, ...]:
    """Each job's iteration time in a co-location set of `loads` under `mode` (module doc)."""
    if mode is Mode.ISOLATED or len(loads) <= 1:
        return tuple(x.alone for x in loads)
    if mode is Mode.HARMONY:
        tg = harmony_group_time(loads, interference)
        return tuple(tg for _ in loads)
    if mode is Mode.NAIVE:
        return naive_iteration_times(loads, interference.naive_cpu_contention)
    raise ColocationError(f"unknown co-location mode {mode!r}")


def utilization(loads: Sequence[SubtaskTimes], times: Sequence[float]) -> tuple[float, float]:
    """Eq. 4.3 for a set: the share of its time its CPU and network do the jobs' subtasks
    (sum_j t_cpu_j / T_j, sum_j t_net_j / T_j), each capped at 1."""
    cpu = sum(x.t_cpu / t for x, t in zip(loads, times) if t > 0)
    net = sum(x.t_net / t for x, t in zip(loads, times) if t > 0)
    return min(1.0, cpu), min(1.0, net)


def throughput_gain(loads: Sequence[SubtaskTimes], mode: Mode, interference: Interference = MEASURED) -> float:
    """The set's work per second under `mode`, in units of one job running alone on the same hosts:
    sum_j alone_j / T_j (1.0: no better than running the jobs one after another; a 70:30 and a
    30:70 job of equal length under eq. 4.1 alone: 2.0)."""
    if mode is Mode.ISOLATED:
        return 1.0          # the jobs take the hosts in turn
    times = iteration_times(loads, mode, interference)
    return sum(x.alone / t for x, t in zip(loads, times) if t > 0)


class ColocationTimes:
    """The co-location model as the simulator's iteration-time model (module doc). `clock` (the
    simulator's virtual clock) lets it integrate utilization over the run; without one it does not."""

    def __init__(self, calibration: Calibration, mode: Mode, interference: Interference = MEASURED,
                 clock: Optional[Callable[[], float]] = None):
        self.calibration = calibration
        self.mode = Mode(mode)
        self.interference = interference
        self.clock = clock
        self._cluster: Optional[ClusterLoad] = None
        self._epoch: dict[str, float] = {}
        self._since = 0.0
        self._busy = (0.0, 0.0)             # CPU and network hosts busy on useful work now
        self._area = [0.0, 0.0]             # ... integrated over time
        self._first: Optional[float] = None
        self.max_set = 0                    # the most jobs ever sharing hosts (a run's summary)

    def subtasks(self, job: JobLoad) -> SubtaskTimes:
        """The job's COMP and COMM per iteration alone at its shape: its solo epoch split as its
        speed function splits it (θ0/w is COMP, eq. 4.2), over its iterations per epoch."""
        app = self.calibration.app(job.app)
        model = app.epoch_model()
        w, s = max(1, job.workers), max(1, job.servers)
        whole = model.epoch_time(w, s)
        share = model.theta[0] / w / whole if whole > 0 else 0.0
        per_clock = job.solo_epoch_s / app.clocks_per_epoch
        return SubtaskTimes(share * per_clock, (1.0 - share) * per_clock)

    def epoch_time(self, job: JobLoad, cluster: ClusterLoad) -> float:
        if cluster is not self._cluster:
            self._evaluate(cluster)
        return self._epoch.get(job.app_id, job.solo_epoch_s)

    def _evaluate(self, cluster: ClusterLoad) -> None:
        """Every training job's epoch time in `cluster`, and the hosts busy now (eq. 4.3 x m).

        The arbiter is per host, so the model is applied host by host: the training jobs with an
        executor on a host share it (eq. 4.1 over them in HARMONY mode, the fluid run in NAIVE, each
        alone where it is alone), and a BSP job goes at the pace of its slowest host. Where a group's
        jobs share the same hosts that is eq. 4.1 over the group; a job still training on its old
        hosts while it moves to another group slows only the jobs of the hosts it is on."""
        self._cluster = cluster
        self._epoch = {}
        jobs = {j.app_id: j for j in cluster.jobs}
        loads = {a: self.subtasks(j) for a, j in jobs.items()}
        on_host = {frozenset(e.app_id for e in execs if e.app_id in jobs) for execs in cluster.by_node.values()}
        slowest: dict[str, float] = {}
        for members in on_host:
            ids = sorted(members)
            if not ids:
                continue
            mode = self.mode if len(ids) > 1 else Mode.ISOLATED
            for a, t in zip(ids, iteration_times([loads[a] for a in ids], mode, self.interference)):
                slowest[a] = max(slowest.get(a, 0.0), t)
            self.max_set = max(self.max_set, len(ids))
        cpu = net = 0.0
        for a, j in jobs.items():
            t = slowest.get(a, loads[a].alone)
            self._epoch[a] = t * self.calibration.app(j.app).clocks_per_epoch
            # Eq. 4.3 times m, job by job: each of its workers' hosts spends t_cpu (t_net) of every
            # iteration T on its subtasks.
            if t > 0:
                cpu += j.workers * loads[a].t_cpu / t
                net += j.workers * loads[a].t_net / t
        self._account((cpu, net))

    def _account(self, busy: tuple[float, float]) -> None:
        if self.clock is None:
            return
        now = self.clock()
        if self._first is None:
            self._first = now
        for i in range(2):
            self._area[i] += self._busy[i] * (now - self._since)
        self._since, self._busy = now, busy

    def mean_utilization(self, hosts: int, start: float, end: float) -> tuple[float, float]:
        """Eq. 4.4 averaged over [start, end] on `hosts` hosts: the mean share of the hosts' CPU and
        network busy on useful subtask work (the state last seen holds until `end`)."""
        if hosts < 1 or end <= start:
            return (0.0, 0.0)
        area = [self._area[i] + self._busy[i] * max(0.0, end - self._since) for i in range(2)]
        return (area[0] / (hosts * (end - start)), area[1] / (hosts * (end - start)))


__all__ = ["ColocationTimes", "ColocationError", "Interference", "SubtaskTimes", "MEASURED", "MEASURED_ITERATIONS", "Mode",
           "WARMUP_ITERATIONS", "harmony_group_time", "iteration_times", "naive_iteration_times",
           "throughput_gain", "utilization"]
