"""The Cruise cost model, dissertation eq. 3.1-3.4 (shared by the Cruise optimizer and the policies).

The epoch time of a configuration is the slowest worker's epoch (eq. 3.1); a worker's epoch is its
computation plus communication cost (eq. 3.2); computation is C_w.proc * d_i (eq. 3.3) and
communication is ceil(d_i / B) mini-batches times the per-mini-batch exchange, bounded either by the
slowest server's bandwidth or by the worker's own (eq. 3.4):

    C_i = C^i_w.proc d_i + ceil(d_i / B) * max( max_j m_j w / b_ij , sum_j m_j / b_ij )

Units: d_i counts input blocks of `samples_per_block` samples each, m_j counts model blocks; a
worker moves `bytes_per_batch` bytes each way per mini-batch (its pull; its push is as large:
the same keys), spread over the servers in proportion to the model blocks they hold.

Departures, each measured (docs/cruise.md has the numbers) and each at its spot below:
1. Per-executor bandwidth: the dissertation writes one pairwise bandwidth b_ij in both terms.
   Elastane measures bandwidth per executor, not per pair, so the server-bound term uses the
   server's serving bandwidth (its NIC carries the traffic of all w workers) and the worker-bound
   term the worker's own (its NIC carries its exchange with all servers).
2. Bytes per direction: a link is full duplex (and the emulated cap paces egress only), so a pull
   and a push do not queue behind each other on one NIC; the exchange is priced by the bytes of
   one direction, the dissertation's m_j (the model pulled), not pull + push.
3. Per-mini-batch latency L_i (`NodeProfile.latency_s_per_batch`): a round trip's fixed cost that
   no number of servers shortens: C_i gains ceil(d_i / B) * L_i.
4. Compute under concurrency (`JobProfile.compute_parallelism` P): the workers of a job whose
   hosts have P cores in all slow each other down once W > P, so C^i_w.proc is the uncontended
   per-sample cost times max(1, W / P).
5. Compute overlaps the servers' queue (`JobProfile.overlap`, what the optimizer uses): eq. 3.4
   adds a worker's compute to the slowest server's per-batch term, as if all W workers waited
   for it together every mini-batch. Within an epoch they drift apart, and a server serves the
   others while one computes, so a server-bound mini-batch costs max(own exchange, server term -
   its compute): the epoch is max(compute + batches (L + h / b_w), batches (L + server term)).
   Measured: nmf-b20 at 4x2 (2 cores) spent 69 ms a mini-batch communicating where the server
   term is 90 ms, and its compute (~40 ms a mini-batch) explains the difference.
With L = 0, P = inf and no overlap this is eq. 3.4, and on identical nodes eq. 3.5.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np
from protocol.errors import PlanningError


class CostModelError(PlanningError, ValueError):
    """Inputs the cost model cannot evaluate (a non-positive size, an unknown node...)."""


@dataclass(frozen=True)
class JobProfile:
    """Sizes of one job: its input and model partitioning and its mini-batch size."""

    input_blocks: int              # D, in blocks
    samples_per_block: float       # training instances per input block
    model_blocks: int              # M, in blocks
    bytes_per_batch: float         # bytes one worker moves each way (its pull) per mini-batch
    batch_size: int                # B, instances per mini-batch
    # Departure 4 (module doc): workers that compute at full speed at once (the cores of the hosts
    # the job's executors share); beyond it their per-sample compute grows as W / P.
    compute_parallelism: float = math.inf
    # Departure 5 (module doc): a worker's compute overlaps the servers serving the other workers.
    overlap: bool = False
    # The job spec's bounds on each role (None: none): the solvers keep their targets within them.
    max_workers: Optional[int] = None
    max_servers: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("input_blocks", "model_blocks", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise CostModelError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("samples_per_block", "bytes_per_batch"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise CostModelError(f"{name} must be a positive number, got {v}")
        if not self.compute_parallelism > 0:
            raise CostModelError(f"compute_parallelism must be > 0, got {self.compute_parallelism}")

    def worker_range(self, n: int) -> tuple[int, int]:
        """The fewest and most workers a target on `n` nodes may have: one of each role at least,
        and neither role beyond its bound (CostModelError when `n` nodes cannot keep both)."""
        lo = max(1, n - self.max_servers) if self.max_servers is not None else 1
        hi = min(n - 1, self.max_workers) if self.max_workers is not None else n - 1
        if lo > hi:
            raise CostModelError(f"{n} nodes cannot be split within max_workers {self.max_workers} and "
                                 f"max_servers {self.max_servers}")
        return lo, hi

    def contention(self, workers: int | float) -> float:
        """How much slower each of `workers` concurrent workers computes than one alone."""
        return max(1.0, workers / self.compute_parallelism)

    @property
    def bytes_per_model_block(self) -> float:
        """Bytes a worker exchanges per mini-batch with the holder of one model block."""
        return self.bytes_per_batch / self.model_blocks

    @property
    def batches_per_input_block(self) -> float:
        return self.samples_per_block / self.batch_size


@dataclass(frozen=True)
class NodeProfile:
    """What the cost model knows of one slot (a container that can run one executor)."""

    node_id: str
    compute_s_per_sample: float    # C^i_w.proc, measured, normalised to an uncontended worker
    worker_bandwidth: float        # bytes/s the node moves as a worker, measured
    server_bandwidth: float        # bytes/s the node serves as a server, measured
    latency_s_per_batch: float = 0.0   # departure 3 (module doc): fixed cost of a mini-batch's round trip

    def __post_init__(self) -> None:
        for name in ("compute_s_per_sample", "latency_s_per_batch"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise CostModelError(f"{self.node_id}: {name} must be >= 0, got {v}")
        for name in ("worker_bandwidth", "server_bandwidth"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise CostModelError(f"{self.node_id}: {name} must be a positive number, got {v}")


@dataclass(frozen=True)
class Assignment:
    """A configuration: input blocks per worker node and model blocks per server node (w, s, d, m)."""

    workers: Mapping[str, int]
    servers: Mapping[str, int]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.workers), len(self.servers)

    def validate(self, job: JobProfile, nodes: Mapping[str, NodeProfile]) -> None:
        """Check the constraints of Fig. 3.2: disjoint roles, all blocks placed, known nodes."""
        both = set(self.workers) & set(self.servers)
        if both:
            raise CostModelError(f"nodes {sorted(both)} are both worker and server")
        unknown = sorted((set(self.workers) | set(self.servers)) - set(nodes))
        if unknown:
            raise CostModelError(f"no profile for nodes {unknown}")
        if not self.workers or not self.servers:
            raise CostModelError(f"a configuration needs >= 1 worker and >= 1 server, got {self.shape}")
        if any(v < 0 for v in self.workers.values()) or any(v < 0 for v in self.servers.values()):
            raise CostModelError("block counts must be >= 0")
        if sum(self.workers.values()) != job.input_blocks:
            raise CostModelError(f"workers hold {sum(self.workers.values())} input blocks, "
                                 f"the job has {job.input_blocks}")
        if sum(self.servers.values()) != job.model_blocks:
            raise CostModelError(f"servers hold {sum(self.servers.values())} model blocks, "
                                 f"the job has {job.model_blocks}")


@dataclass(frozen=True)
class EpochPrediction:
    """Predicted epoch time (eq. 3.1) with each worker's compute and communication cost."""

    epoch_s: float
    compute_s: dict[str, float] = field(default_factory=dict)
    comm_s: dict[str, float] = field(default_factory=dict)
    server_batch_s: float = 0.0          # max_j m_j w / b_j: per-batch time of the slowest server
    slowest_worker: str = ""
    server_bound: bool = False           # whether the slowest worker is server-bandwidth bound

    def to_json(self) -> dict[str, object]:
        return {"epoch_s": self.epoch_s, "slowest_worker": self.slowest_worker,
                "server_batch_s": self.server_batch_s, "server_bound": self.server_bound,
                "compute_s": dict(self.compute_s), "comm_s": dict(self.comm_s)}


def predict(job: JobProfile, nodes: Mapping[str, NodeProfile], assignment: Assignment,
            integral_batches: bool = True) -> EpochPrediction:
    """Epoch time of `assignment` by eq. 3.1-3.4.

    `integral_batches` counts ceil(d_i / B) mini-batches as eq. 3.4 does; False uses d_i / B, the
    continuous form eq. 3.5 and the solvers optimise (they differ by at most one batch per worker).
    """
    assignment.validate(job, nodes)
    w = len(assignment.workers)
    mb = job.bytes_per_model_block
    # Server-bound term: the slowest server; it is the same for every worker.
    server_batch = max(m * mb * w / nodes[j].server_bandwidth for j, m in assignment.servers.items())
    contention = job.contention(w)             # departure 4
    compute, comm = {}, {}
    slowest, worst, worst_bound = "", -1.0, False
    for i, d in assignment.workers.items():
        n = nodes[i]
        samples = d * job.samples_per_block
        batches = math.ceil(samples / job.batch_size - 1e-9) if integral_batches else samples / job.batch_size
        worker_batch = job.bytes_per_batch / n.worker_bandwidth
        compute[i] = n.compute_s_per_sample * contention * samples
        # Departure 3: the round trip's latency on top of the bandwidth-bound exchange.
        comm[i] = batches * (n.latency_s_per_batch + max(server_batch, worker_batch))
        if job.overlap:     # departure 5: the server term absorbs the worker's own compute
            comm[i] = max(batches * (n.latency_s_per_batch + worker_batch),
                          batches * (n.latency_s_per_batch + server_batch) - compute[i])
        if compute[i] + comm[i] > worst:
            worst, slowest, worst_bound = compute[i] + comm[i], i, server_batch > worker_batch
    return EpochPrediction(worst, compute, comm, server_batch, slowest, worst_bound)


def epoch_time(job: JobProfile, nodes: Mapping[str, NodeProfile], assignment: Assignment,
               integral_batches: bool = True) -> float:
    """Just the predicted epoch time (eq. 3.1) of `assignment`."""
    return predict(job, nodes, assignment, integral_batches).epoch_s


def epoch_time_arrays(job: JobProfile, compute_s_per_sample: np.ndarray, worker_bandwidth: np.ndarray,
                      input_blocks: np.ndarray, server_bandwidth: np.ndarray, model_blocks: np.ndarray,
                      integral_batches: bool = False, latency_s_per_batch: np.ndarray | float = 0.0) -> float:
    """Vectorised eq. 3.1-3.4 (with the module doc's departures) over arrays of workers (first
    three, and the latencies) and servers (the next two); what the solvers and the brute-force
    baselines evaluate many times."""
    w = len(input_blocks)
    server_batch = float(np.max(model_blocks * (job.bytes_per_model_block * w) / server_bandwidth))
    samples = input_blocks * job.samples_per_block
    batches = samples / job.batch_size
    if integral_batches:
        batches = np.ceil(batches - 1e-9)
    compute = compute_s_per_sample * job.contention(w) * samples
    worker_batch = job.bytes_per_batch / worker_bandwidth
    if job.overlap:
        return float(np.max(np.maximum(compute + batches * (latency_s_per_batch + worker_batch),
                                       batches * (latency_s_per_batch + server_batch))))
    per_batch = latency_s_per_batch + np.maximum(server_batch, worker_batch)
    return float(np.max(compute + batches * per_batch))


def model_inputs_json(job: JobProfile, nodes: Mapping[str, NodeProfile]) -> dict[str, object]:
    """The model's inputs as JSON (for the job status, benchmarks and recorded test profiles)."""
    out = dataclasses.asdict(job)
    if math.isinf(job.compute_parallelism):
        out["compute_parallelism"] = None           # JSON has no infinity
    return {"job": out, "nodes": [dataclasses.asdict(n) for n in nodes.values()]}


def model_inputs_from_json(data: Mapping[str, object]) -> tuple[JobProfile, dict[str, NodeProfile]]:
    """Inverse of `model_inputs_json`."""
    fields = dict(data["job"])  # type: ignore[call-overload]
    if fields.get("compute_parallelism") is None:
        fields["compute_parallelism"] = math.inf
    job = JobProfile(**fields)
    nodes = [NodeProfile(**n) for n in data["nodes"]]  # type: ignore[attr-defined]
    return job, {n.node_id: n for n in nodes}
