"""What Cruise measures (dissertation §3.3.1, Metric Collection): workers report compute and
communication time at the end of every mini-batch, servers report service counters periodically;
both are smoothed by exponential moving averages because the raw figures fluctuate.

Counts are kept since the last reconfiguration (what the trigger policy looks at); a
reconfiguration also restarts the averages, since the per-batch times of the old shape no longer
predict the new one. The last per-sample compute cost and bandwidths of each executor survive
the restart (they describe the node, not the shape), so an executor switched to server still has
a compute estimate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional
from protocol.errors import PlanningError

DEFAULT_ALPHA = 0.2     # weight of the newest sample: smooths over ~5 mini-batches


class MetricsError(PlanningError, ValueError):
    """A report with a value that cannot be a measurement (negative, NaN, ...)."""


def _check(name: str, value: float, positive: bool = False) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise MetricsError(f"{name} must be a {'positive' if positive else 'non-negative'} number, got {value}")
    return v


@dataclass
class MovingAverage:
    """Exponential moving average; the first sample initialises it. `count` samples folded in."""

    alpha: float = DEFAULT_ALPHA
    value: Optional[float] = None
    count: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise MetricsError(f"alpha must be in (0, 1], got {self.alpha}")

    def add(self, sample: float, weight: int = 1) -> float:
        """Fold in `sample`; `weight` > 1 folds it as that many equal samples (a batched report)."""
        a = 1.0 - (1.0 - self.alpha) ** weight
        self.value = sample if self.value is None else self.value + a * (sample - self.value)
        self.count += weight
        return self.value

    def add_all(self, samples: Iterable[float]) -> Optional[float]:
        """Fold in each of `samples` in order; the average after them (None if still empty)."""
        for x in samples:
            self.add(float(x))
        return self.value


@dataclass
class WorkerStats:
    """One worker's per-mini-batch averages since the last reconfiguration."""

    alpha: float = DEFAULT_ALPHA
    compute_s_per_sample: MovingAverage = field(init=False)
    comm_s: MovingAverage = field(init=False)
    bytes_per_batch: MovingAverage = field(init=False)
    batches: int = 0

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.compute_s_per_sample = MovingAverage(self.alpha)
        self.comm_s = MovingAverage(self.alpha)
        self.bytes_per_batch = MovingAverage(self.alpha)
        self.batches = 0

    def record(self, batches: int, samples: float, compute_s: float, comm_s: float,
               bytes_moved: Optional[float]) -> None:
        """Fold in `batches` mini-batches (one report may cover several) totalling these figures."""
        if int(batches) != batches or batches < 1:
            raise MetricsError(f"batches must be a positive integer, got {batches}")
        samples = _check("samples", samples, positive=True)
        compute_s, comm_s = _check("compute_s", compute_s), _check("comm_s", comm_s)
        self.compute_s_per_sample.add(compute_s / samples, batches)
        self.comm_s.add(comm_s / batches, batches)
        if bytes_moved is not None:
            self.bytes_per_batch.add(_check("bytes", bytes_moved) / batches, batches)
        self.batches += batches

    @property
    def bandwidth(self) -> Optional[float]:
        """Bytes per second of communication, if bytes were reported: a lower bound on the worker's
        bandwidth, exact when the worker side is the bottleneck (eq. 3.4's second case)."""
        if self.bytes_per_batch.value is None or not self.comm_s.value:
            return None
        return self.bytes_per_batch.value / self.comm_s.value if self.bytes_per_batch.value > 0 else None


@dataclass
class ServerStats:
    """One server's service rate from its cumulative counters (requests, busy seconds, bytes)."""

    alpha: float = DEFAULT_ALPHA
    service_s: MovingAverage = field(init=False)      # busy seconds per request
    bandwidth: MovingAverage = field(init=False)      # bytes served per busy second
    reports: int = 0
    _last: Optional[tuple[float, float, float]] = None

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.service_s = MovingAverage(self.alpha)
        self.bandwidth = MovingAverage(self.alpha)
        self.reports = 0

    def record(self, requests: float, busy_s: float, bytes_served: float) -> None:
        """Fold in the counters' growth since the previous report (a reset counter restarts)."""
        cur = (_check("requests", requests), _check("busy_s", busy_s), _check("bytes_served", bytes_served))
        last, self._last = self._last, cur
        if last is None or any(c < p for c, p in zip(cur, last)):
            return  # first report, or the server restarted its counters: nothing to difference
        d_req, d_busy, d_bytes = (c - p for c, p in zip(cur, last))
        if d_req > 0 and d_busy > 0:
            self.service_s.add(d_busy / d_req)
            if d_bytes > 0:
                self.bandwidth.add(d_bytes / d_busy)
            self.reports += 1


@dataclass
class LastKnown:
    """The node-level figures of an executor as last measured, kept across reconfigurations."""

    compute_s_per_sample: Optional[float] = None
    worker_bandwidth: Optional[float] = None
    server_bandwidth: Optional[float] = None
    link_bandwidth: Optional[float] = None      # bytes/s of the node's link, as the cluster declares it
    host: str = ""                              # the machine it runs on, and that machine's cores
    host_cores: Optional[int] = None


class MetricsBook:
    """All workers' and servers' statistics of one job, keyed by executor id."""

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        MovingAverage(alpha)  # validates alpha
        self.alpha = alpha
        self.workers: dict[str, WorkerStats] = {}
        self.servers: dict[str, ServerStats] = {}
        self.last_known: dict[str, LastKnown] = {}

    def record_worker(self, executor: str, batches: int, samples: float, compute_s: float, comm_s: float,
                      bytes_moved: Optional[float] = None) -> None:
        """A worker's report of `batches` mini-batches: instances processed, total compute and
        communication seconds and, when known, the bytes it pushed and pulled."""
        st = self.workers.setdefault(executor, WorkerStats(self.alpha))
        st.record(batches, samples, compute_s, comm_s, bytes_moved)
        lk = self.last_known.setdefault(executor, LastKnown())
        lk.compute_s_per_sample = st.compute_s_per_sample.value
        if st.bandwidth is not None:
            lk.worker_bandwidth = st.bandwidth

    def record_server(self, executor: str, requests: float, busy_s: float, bytes_served: float) -> None:
        """A server's cumulative counters: requests served, seconds spent serving, bytes sent."""
        st = self.servers.setdefault(executor, ServerStats(self.alpha))
        st.record(requests, busy_s, bytes_served)
        if st.bandwidth.value is not None:
            self.last_known.setdefault(executor, LastKnown()).server_bandwidth = st.bandwidth.value

    def record_link(self, executor: str, bytes_per_s: float) -> None:
        """The link rate the cluster declares for an executor's node (its NIC, or an emulated cap):
        an upper bound of both its bandwidths, see profiling."""
        self.last_known.setdefault(executor, LastKnown()).link_bandwidth = _check("link bandwidth", bytes_per_s,
                                                                                  positive=True)

    def record_host(self, executor: str, host: str, cores: int) -> None:
        """The machine an executor runs on and the CPU cores it may use there."""
        if int(cores) < 1:
            raise MetricsError(f"host cores must be >= 1, got {cores}")
        lk = self.last_known.setdefault(executor, LastKnown())
        lk.host, lk.host_cores = host, int(cores)

    def compute_parallelism(self) -> float:
        """Workers of the job that can compute at once at full speed: the cores of the distinct
        machines its executors run on (inf while none has said). Executors that share a machine
        share its cores -- all of a local cluster's, on one host."""
        cores = {k.host: k.host_cores for k in self.last_known.values() if k.host and k.host_cores}
        return float(sum(cores.values())) if cores else math.inf

    def batches_since_reconfiguration(self, executor: str) -> int:
        st = self.workers.get(executor)
        return st.batches if st else 0

    def mark_reconfigured(self) -> None:
        """A new shape is in place: restart the averages and the per-worker batch counts."""
        for w in self.workers.values():
            w.restart()
        for s in self.servers.values():
            s.restart()

    def forget(self, executor: str) -> None:
        """An executor is gone for good."""
        self.workers.pop(executor, None)
        self.servers.pop(executor, None)
        self.last_known.pop(executor, None)

    def to_json(self) -> dict:
        return {"workers": {k: {"compute_s_per_sample": v.compute_s_per_sample.value, "comm_s": v.comm_s.value,
                                "bytes_per_batch": v.bytes_per_batch.value, "batches": v.batches}
                            for k, v in sorted(self.workers.items())},
                "servers": {k: {"service_s": v.service_s.value, "bandwidth": v.bandwidth.value,
                                "reports": v.reports} for k, v in sorted(self.servers.items())}}
