"""MILP solve of Fig. 3.2 for heterogeneous nodes, with scipy.optimize.milp (HiGHS).

Nodes are first grouped into classes of identical profile (`group_classes`). The dissertation
keeps a binary w_i, s_i per machine (O(N^2) variables after linearising, 37.4 s on 32 nodes with
Gurobi); identical machines are interchangeable, so an integer count of workers per class is exact
when nodes come in few types and keeps the model small at N = 1,000. With every node distinct,
each class has one node and the model is the per-node formulation (x_k = w_i, n_k - x_k = s_i).

Variables per class k (n_k nodes, per-sample compute c_k, bandwidths bw_k, bs_k):
  x_k  workers of class k (the rest, n_k - x_k, are servers: ||w|| + ||s|| = N)
  p_k  input blocks per class-k worker (the largest; d_i <= p_k), q_k  model blocks per class-k server
and globally W = sum_k x_k, Z = the slowest server's per-batch time, T = the epoch (epigraph of
the max over workers, eq. 3.1). Constraints:
  sum_k x_k p_k >= D               (every input block has a worker)
  sum_k (n_k - x_k) q_k >= M        (every model block has a server)
  Z >= q_k W mb / bs_k              (server-bound term of eq. 3.4)
  T >= spb c_k p_k + (spb/B) p_k Z  and  T >= p_k (spb c_k + (spb/B) bytes / bw_k)   (eq. 3.2-3.4)
(c_k here includes the latency per sample L_k / B and the contention k(W) at the heuristic's W; with
the cost model's overlap, the first constraint is T >= (spb/B) p_k (Z + L_k)).
The products are linearised as the dissertation does, by binary expansion: x_k, W and p_k are
written in bits and each bit-times-bounded-variable product gets a McCormick envelope. Only the
side of the envelope that the optimiser would otherwise exploit is needed, which keeps it exact.
Mini-batches per epoch are taken as d_i / B (the continuous form of eq. 3.5); the chosen target
is then priced with ceil(d_i / B). With roles fixed the block split is re-done by balance's exact
greedy, which is at least as good as the MILP's p_k, q_k.

A cheap heuristic (closed-form W of the mean node, then a pattern search over workers per class)
gives the MILP tight bounds and is the answer when HiGHS hits `time_limit_s` without an
incumbent; with one, the incumbent (never worse than the heuristic, which bounds T) is returned.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from models.cruise_cost import CostModelError, JobProfile, NodeProfile, epoch_time_arrays

from .balance import split_blocks
from .solver_homogeneous import mean_profile
from .targets import Slot, Target, build_target, choose_workers
from protocol.errors import PlanningError

DEFAULT_CLASS_TOLERANCE = 0.05      # measured profiles within ~5% count as one class
DEFAULT_TIME_LIMIT_S = 0.9         # the solve-time target is < 1 s; past it, the best incumbent
MIP_REL_GAP = 1e-4              # 0.01%: far inside the noise of measured profiles


class SolverError(PlanningError, RuntimeError):
    """The MILP found no feasible configuration."""


@dataclass
class NodeClass:
    """Nodes the optimizer treats as identical, and the profile standing for them."""

    members: list[str]
    profile: NodeProfile


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


def group_classes(profiles: Sequence[NodeProfile], tolerance: float = DEFAULT_CLASS_TOLERANCE) -> list[NodeClass]:
    """Group nodes whose four measured values are all within `tolerance` (relative) of a class's
    first member, taken in order of compute speed; tolerance 0 groups only equal profiles. Each
    class stands for its members' mean."""
    groups: list[list[NodeProfile]] = []
    for p in sorted(profiles, key=lambda p: (p.compute_s_per_sample, p.worker_bandwidth,
                                             p.server_bandwidth, p.node_id)):
        for g in groups:
            head = g[0]
            if (_close(p.compute_s_per_sample, head.compute_s_per_sample, tolerance)
                    and _close(p.worker_bandwidth, head.worker_bandwidth, tolerance)
                    and _close(p.server_bandwidth, head.server_bandwidth, tolerance)
                    and _close(p.latency_s_per_batch, head.latency_s_per_batch, tolerance)):
                g.append(p)
                break
        else:
            groups.append([p])
    return [NodeClass([p.node_id for p in g], mean_profile(g, f"class-{i}")) for i, g in enumerate(groups)]


class _Builder:
    """Collects variables and sparse constraint rows for scipy.optimize.milp."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integral: list[int] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def var(self, lb: float, ub: float, integer: bool) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integral.append(1 if integer else 0)
        return len(self.lb) - 1

    def bits(self, ub: int) -> list[int]:
        return [self.var(0, 1, True) for _ in range(max(1, int(ub).bit_length()))]

    def row(self, terms: dict[int, float], lo: float, hi: float) -> None:
        r = len(self.lo)
        for c, v in terms.items():
            if v != 0:
                self.rows.append(r)
                self.cols.append(c)
                self.vals.append(v)
        self.lo.append(lo)
        self.hi.append(hi)

    def product_bits(self, bits: list[int], y: int, ub: float, side: str) -> list[int]:
        """Variables a_t = bit_t * y (y in [0, ub]) with the McCormick side that binds: 'upper'
        (a_t <= ub bit_t, a_t <= y) or 'lower' (a_t >= y - ub (1 - bit_t))."""
        out = []
        for b in bits:
            a = self.var(0, ub, False)
            if side == "upper":
                self.row({a: 1, b: -ub}, -np.inf, 0)
                self.row({a: 1, y: -1}, -np.inf, 0)
            else:
                self.row({a: 1, y: -1, b: -ub}, -ub, np.inf)
            out.append(a)
        return out


@dataclass
class MilpResult:
    """Workers per class as the MILP chose them, and how the solve went."""

    workers_per_class: list[int]
    objective_s: float
    status: str
    solve_ms: float
    classes: list[NodeClass] = field(default_factory=list)


def heuristic_workers(job: JobProfile, classes: Sequence[NodeClass]) -> tuple[float, list[int]]:
    """A good feasible configuration, cheaply: for W around the closed-form optimum of the mean
    node, give the worker role to the nodes cheapest per block of compute (or with the slowest
    server bandwidth), split blocks optimally, keep the best. Its epoch time bounds the MILP's
    variables (tight big-M constants make HiGHS far faster) and it is the fallback if the MILP
    fails."""
    from .solver_homogeneous import solve_homogeneous
    nodes = [(k, c.profile) for k, c in enumerate(classes) for _ in c.members]
    n = len(nodes)
    lo, hi = job.worker_range(n)
    w0 = solve_homogeneous(job, mean_profile([c.profile for c in classes]), n).workers
    orders = [sorted(range(n), key=lambda i: nodes[i][1].compute_s_per_sample),
              sorted(range(n), key=lambda i: nodes[i][1].server_bandwidth)]
    best = (math.inf, [0] * len(classes))
    for w in sorted({min(max(v, lo), hi) for v in (w0 // 2, w0 - 1, w0, w0 + 1, (w0 + n) // 2)}):
        for order in orders:
            ws, ss = order[:w], order[w:]
            c = np.array([nodes[i][1].compute_s_per_sample for i in ws])
            bw = np.array([nodes[i][1].worker_bandwidth for i in ws])
            bs = np.array([nodes[i][1].server_bandwidth for i in ss])
            lat = np.array([nodes[i][1].latency_s_per_batch for i in ws])
            d, m = split_blocks(job, c, bw, bs, lat)
            t = epoch_time_arrays(job, c, bw, d, bs, m, integral_batches=False, latency_s_per_batch=lat)
            if t < best[0]:
                counts = [0] * len(classes)
                for i in ws:
                    counts[nodes[i][0]] += 1
                best = (t, counts)
    return _pattern_search(job, classes, best)


def _counts_time(job: JobProfile, classes: Sequence[NodeClass], counts: Sequence[int]) -> float:
    """Continuous-batch epoch time with counts[k] workers of class k, blocks split optimally."""
    n_w = np.array(counts)
    n_s = np.array([len(c.members) for c in classes]) - n_w
    lo, hi = job.worker_range(int(n_w.sum() + n_s.sum()))
    if not lo <= n_w.sum() <= hi or (n_w < 0).any() or (n_s < 0).any():
        return math.inf
    prof = [c.profile for c in classes]
    c = np.repeat([p.compute_s_per_sample for p in prof], n_w)
    bw = np.repeat([p.worker_bandwidth for p in prof], n_w)
    bs = np.repeat([p.server_bandwidth for p in prof], n_s)
    lat = np.repeat([p.latency_s_per_batch for p in prof], n_w)
    d, m = split_blocks(job, c, bw, bs, lat)
    return epoch_time_arrays(job, c, bw, d, bs, m, integral_batches=False, latency_s_per_batch=lat)


def _pattern_search(job: JobProfile, classes: Sequence[NodeClass],
                    start: tuple[float, list[int]]) -> tuple[float, list[int]]:
    """Improve worker counts per class by moves of +-step in one class or step from one class to
    another, halving the step when nothing improves (a cheap incumbent, not a proof)."""
    best_t, best = start
    k = len(classes)
    step = max(1, max(len(c.members) for c in classes) // 8)
    while step >= 1:
        improved = False
        moves: list[tuple[int, int, Optional[int]]] = [(i, s, None) for i in range(k) for s in (step, -step)]
        moves += [(i, step, j) for i in range(k) for j in range(k) if i != j]
        for i, s, j in moves:
            cand = list(best)
            cand[i] += s
            if j is not None:
                cand[j] -= s
            t = _counts_time(job, classes, cand)
            if t < best_t * (1 - 1e-12):
                best_t, best, improved = t, cand, True
        if not improved:
            step //= 2
    return best_t, best


def solve_classes(job: JobProfile, classes: Sequence[NodeClass],
                  time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> MilpResult:
    """Solve the class MILP (module doc); returns the number of workers of each class.
    `time_limit_s` covers the whole call (heuristic and model building included)."""
    t0 = time.perf_counter()
    t_heur, heur_counts = heuristic_workers(job, classes)
    contention = job.contention(sum(heur_counts))
    n_total = sum(len(c.members) for c in classes)
    if n_total < 2:
        raise CostModelError(f"need at least 2 nodes (one worker, one server), got {n_total}")
    D, M = job.input_blocks, job.model_blocks
    spb, g = job.samples_per_block, job.batches_per_input_block
    mb = job.bytes_per_model_block
    # Time unit for conditioning: roughly one epoch of the whole input on an average node.
    ref = mean_profile([c.profile for c in classes])
    scale = D * spb * (ref.compute_s_per_sample + job.bytes_per_batch / ref.worker_bandwidth / job.batch_size)
    scale = scale / n_total if scale > 0 else 1.0
    # Bounds from the heuristic's epoch time t_ub: some worker holds >= 1 block, so Z <= t_ub / g;
    # a class-k worker's blocks p_k and server's blocks q_k are bounded the same way.
    t_ub = t_heur / scale * (1 + 1e-6)
    z_max = min(M * mb * (n_total - 1) / min(c.profile.server_bandwidth for c in classes) / scale, t_ub / g)

    b = _Builder()
    t_var = b.var(0, t_ub, False)
    z_var = b.var(0, z_max, False)
    w_bits = b.bits(n_total)
    cover_d: dict[int, float] = {}
    cover_m: dict[int, float] = {}
    w_sum: dict[int, float] = {}
    x_vars = []
    for cls in classes:
        n_k, p = len(cls.members), cls.profile
        x = b.var(0, n_k, True)
        x_vars.append(x)
        w_sum[x] = 1.0
        x_bits = b.bits(n_k)
        b.row({x: 1, **{v: -(2 ** t) for t, v in enumerate(x_bits)}}, 0, 0)
        # Compute and the per-batch latency per block; the contention k(W) is taken at the
        # heuristic's W (it would make the model non-linear in W), the target is priced exactly.
        comp = spb * (p.compute_s_per_sample * contention + p.latency_s_per_batch / job.batch_size) / scale
        p_max = int(min(D, math.floor(t_ub / (comp + g * job.bytes_per_batch / p.worker_bandwidth / scale))))
        q_max = int(min(M, math.floor(z_max * scale * p.server_bandwidth / mb)))
        pk = b.var(0, p_max, True)
        p_bits = b.bits(p_max)
        b.row({pk: 1, **{v: -(2 ** t) for t, v in enumerate(p_bits)}}, 0, 0)
        qk = b.var(0, q_max, True)
        # x_k p_k (coverage wants it large: upper envelope)
        for t, a in enumerate(b.product_bits(x_bits, pk, p_max, "upper")):
            cover_d[a] = cover_d.get(a, 0) + 2 ** t
        # (n_k - x_k) q_k (x_k q_k enters negatively: lower envelope)
        cover_m[qk] = cover_m.get(qk, 0) + n_k
        for t, a in enumerate(b.product_bits(x_bits, qk, q_max, "lower")):
            cover_m[a] = cover_m.get(a, 0) - 2 ** t
        # Z >= q_k W mb / bs_k
        coef = mb / p.server_bandwidth / scale
        terms = {a: coef * 2 ** t for t, a in enumerate(b.product_bits(w_bits, qk, q_max, "lower"))}
        terms[z_var] = -1
        b.row(terms, -np.inf, 0)
        # T >= spb c_k p_k + g p_k Z  and  T >= p_k (spb c_k + g bytes / bw_k)
        terms = {a: g * 2 ** t for t, a in enumerate(b.product_bits(p_bits, z_var, z_max, "lower"))}
        # With overlap (cost model departure 5) the server-bound side carries only the latency.
        terms[pk] = g * p.latency_s_per_batch / scale if job.overlap else comp
        terms[t_var] = -1
        b.row(terms, -np.inf, 0)
        b.row({pk: comp + g * job.bytes_per_batch / p.worker_bandwidth / scale, t_var: -1}, -np.inf, 0)
    b.row(cover_d, D, np.inf)
    b.row(cover_m, M, np.inf)
    b.row({**w_sum, **{v: -(2 ** t) for t, v in enumerate(w_bits)}}, 0, 0)
    b.row(w_sum, *job.worker_range(n_total))       # one of each role, neither beyond its bound

    n_vars = len(b.lb)
    cost = np.zeros(n_vars)
    cost[t_var] = 1.0
    a = coo_matrix((b.vals, (b.rows, b.cols)), shape=(len(b.lo), n_vars)).tocsr()
    res = milp(cost, integrality=np.array(b.integral), bounds=Bounds(np.array(b.lb), np.array(b.ub)),
               constraints=LinearConstraint(a, np.array(b.lo), np.array(b.hi)),
               options={"time_limit": max(0.05, time_limit_s - (time.perf_counter() - t0)), "mip_rel_gap": MIP_REL_GAP, "disp": False})
    solve_ms = (time.perf_counter() - t0) * 1000.0
    if res.x is None:
        if res.status == 2:
            # Infeasible within t_ub can only mean rounding at the bound: the heuristic is optimal.
            return MilpResult(heur_counts, t_heur, "heuristic (optimal)", solve_ms, list(classes))
        # Time limit without an incumbent: the heuristic is the best we know.
        return MilpResult(heur_counts, t_heur, f"heuristic ({res.message})", solve_ms, list(classes))
    counts = [int(round(res.x[x])) for x in x_vars]
    status = "optimal" if res.status == 0 else f"incumbent ({res.message})"
    return MilpResult(counts, float(res.x[t_var]) * scale, status, solve_ms, list(classes))


def solve_milp_target(job: JobProfile, slots: Sequence[Slot],
                      class_tolerance: float = DEFAULT_CLASS_TOLERANCE,
                      time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Target:
    """Target for heterogeneous `slots`: the MILP's workers per class, current roles kept where
    possible within each class, blocks split optimally for those roles."""
    t0 = time.perf_counter()
    classes = group_classes([s.profile for s in slots], class_tolerance)
    result = solve_classes(job, classes, time_limit_s)
    by_id = {s.slot_id: s for s in slots}
    workers: list[str] = []
    for cls, n_w in zip(classes, result.workers_per_class):
        workers += [s.slot_id for s in choose_workers([by_id[m] for m in cls.members], n_w)]
    solve_ms = (time.perf_counter() - t0) * 1000.0
    return build_target(job, slots, workers, "milp", solve_ms,
                        {"classes": len(classes), "milp_status": result.status,
                         "milp_objective_s": result.objective_s,
                         "workers_per_class": result.workers_per_class})
