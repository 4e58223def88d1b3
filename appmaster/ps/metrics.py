"""Training metrics the PS AM keeps: per-worker compute / communication time per mini-batch and
per-server service time as exponential moving averages (what the optimizers of later issues
read), plus the objective history with epoch times and the objective every few clocks
(appmaster.ps.clock_objectives)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Optional

from appmaster.cruise.metrics import MovingAverage
from appmaster.ps.clock_objectives import ClockObjectives
from protocol.job_report import ServerTiming, WorkerTiming, finite
from protocol.ps_status import EpochResult

DEFAULT_ALPHA = 0.1   # weight of the newest sample: smooths over ~10 mini-batches


@dataclass
class WorkerTimes:
    """Per-mini-batch times of one worker (seconds)."""

    compute_s: MovingAverage = field(default_factory=lambda: MovingAverage(DEFAULT_ALPHA))
    comm_s: MovingAverage = field(default_factory=lambda: MovingAverage(DEFAULT_ALPHA))
    # The parts of compute_s / comm_s spent waiting for an arbiter's grant (Harmony; 0 otherwise).
    compute_wait_s: MovingAverage = field(default_factory=lambda: MovingAverage(DEFAULT_ALPHA))
    comm_wait_s: MovingAverage = field(default_factory=lambda: MovingAverage(DEFAULT_ALPHA))
    # Bytes pulled + pushed per mini-batch (None: the worker does not count them), a step's mean
    # folded in as that many mini-batches.
    bytes_per_batch: MovingAverage = field(default_factory=lambda: MovingAverage(DEFAULT_ALPHA))

    def to_json(self) -> dict[str, Any]:
        return {"compute_s": self.compute_s.value, "comm_s": self.comm_s.value, "batches": self.compute_s.count,
                "compute_wait_s": self.compute_wait_s.value, "comm_wait_s": self.comm_wait_s.value,
                "bytes_per_batch": self.bytes_per_batch.value}


@dataclass
class ServerTimes:
    """Mean time a server spends serving one data-plane request (seconds), over successive polls."""

    service_s: MovingAverage = field(default_factory=lambda: MovingAverage(alpha=0.3))
    requests: int = 0
    busy_s: float = 0.0

    def update(self, requests: int, busy_s: float) -> None:
        """Fold in the server's cumulative counters (the mean over the requests since the last poll)."""
        new_requests, new_busy = requests - self.requests, busy_s - self.busy_s
        if new_requests > 0 and new_busy >= 0:
            self.service_s.add(new_busy / new_requests)
        self.requests, self.busy_s = requests, busy_s

    def to_json(self) -> dict[str, Any]:
        return {"service_s": self.service_s.value, "requests": self.requests}


@dataclass(frozen=True)
class EpochRecord:
    """One finished epoch: its objective, how long its training took, and when it ended (unix time).
    `evaluation_s`: the part of epoch_time_s the mid-epoch objective samples took
    (appmaster.ps.clock_objectives), so epoch_time_s - evaluation_s is the clocks' time alone."""

    epoch: int
    objective: float
    epoch_time_s: float
    time: float
    evaluation_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "objective": self.objective, "epoch_time_s": self.epoch_time_s,
                "time": self.time, "evaluation_s": self.evaluation_s}

    def result(self) -> EpochResult:
        """The epoch as the job status serves it (`objective_history`, protocol.ps_status)."""
        return EpochResult(epoch=self.epoch, objective=finite(self.objective), epoch_time_s=self.epoch_time_s,
                           time=self.time, evaluation_s=self.evaluation_s)


@dataclass
class JobMetrics:
    """Everything measured about the running job."""

    workers: dict[str, WorkerTimes] = field(default_factory=dict)
    servers: dict[str, ServerTimes] = field(default_factory=dict)
    initial_objective: Optional[float] = None
    epochs: list[EpochRecord] = field(default_factory=list)
    # The objective every few clocks (JobReport.clock_objectives), filled by the BSP clock loop.
    clock_objectives: ClockObjectives = field(default_factory=ClockObjectives)
    # Who else wants each worker's per-mini-batch times (e.g. the Cruise driver): f(worker, compute, comm).
    batch_listeners: list[Callable[[str, list[float], list[float]], None]] = field(default_factory=list, repr=False)

    def record_batches(self, worker: str, compute_s: Iterable[float], comm_s: Iterable[float],
                       compute_wait_s: Iterable[float] = (), comm_wait_s: Iterable[float] = (),
                       bytes_moved: Optional[int] = None) -> None:
        """Fold in a step's per-mini-batch times (and, where the worker counted them, the parts
        waited for a grant: none given means none waited; and the bytes its pulls and pushes
        carried in all, None: not counted)."""
        compute, comm = [float(x) for x in compute_s], [float(x) for x in comm_s]
        cw, mw = [float(x) for x in compute_wait_s], [float(x) for x in comm_wait_s]
        w = self.workers.setdefault(worker, WorkerTimes())
        w.compute_s.add_all(compute)
        w.comm_s.add_all(comm)
        w.compute_wait_s.add_all(cw if len(cw) == len(compute) else [0.0] * len(compute))
        w.comm_wait_s.add_all(mw if len(mw) == len(comm) else [0.0] * len(comm))
        if bytes_moved is not None and compute and bytes_moved >= 0:
            w.bytes_per_batch.add(bytes_moved / len(compute), len(compute))
        for listener in self.batch_listeners:
            listener(worker, compute, comm)

    def record_server(self, server: str, requests: int, busy_s: float) -> None:
        self.servers.setdefault(server, ServerTimes()).update(requests, busy_s)

    def record_epoch(self, rec: EpochRecord) -> None:
        self.epochs.append(rec)

    def truncate_epochs(self, epochs: int) -> None:
        """Forget the epochs from `epochs` on (training went back to a checkpoint taken then)."""
        del self.epochs[epochs:]

    @property
    def objectives(self) -> list[float]:
        return [e.objective for e in self.epochs]

    def worker_timing(self, workers: Collection[str]) -> WorkerTiming:
        """The job report's worker times: the mean of `workers`' moving averages (those measured;
        `bytes_per_batch` over those that count bytes)."""
        mine = [t for w, t in self.workers.items() if w in workers]
        rows = [(t.compute_s.value, t.comm_s.value, t.compute_wait_s.value or 0.0, t.comm_wait_s.value or 0.0)
                for t in mine]
        known = [(c, m, cw, mw) for c, m, cw, mw in rows
                 if c is not None and m is not None and math.isfinite(c + m + cw + mw)]
        if not known:
            return WorkerTiming()
        n = len(known)

        def mean(i: int) -> float:
            return max(0.0, sum(r[i] for r in known) / n)
        compute, comm, compute_wait, comm_wait = mean(0), mean(1), mean(2), mean(3)
        counted = [b for b in (t.bytes_per_batch.value for t in mine) if b is not None and math.isfinite(b)]
        return WorkerTiming(compute_s=compute, comm_s=comm, workers=n,
                            compute_held_s=max(0.0, compute - compute_wait), comm_held_s=max(0.0, comm - comm_wait),
                            compute_wait_s=compute_wait, comm_wait_s=comm_wait,
                            bytes_per_batch=max(0.0, sum(counted) / len(counted)) if counted else 0.0)

    def server_timing(self, servers: Collection[str]) -> ServerTiming:
        """The job report's server time: the mean service time of `servers` (those measured)."""
        values = [t.service_s.value for s, t in self.servers.items() if s in servers]
        known = [v for v in values if v is not None and math.isfinite(v)]
        if not known:
            return ServerTiming()
        return ServerTiming(service_s=max(0.0, sum(known) / len(known)), servers=len(known))

    def to_json(self) -> dict[str, Any]:
        return {"workers": {k: v.to_json() for k, v in sorted(self.workers.items())},
                "servers": {k: v.to_json() for k, v in sorted(self.servers.items())}}
