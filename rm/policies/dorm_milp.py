"""Dorm's utilization-fairness optimizer: the MILP P2 (Dorm §IV-B, eq. 10-18) with `scipy.optimize.milp`.

Pure numbers in, numbers out (the `dorm` policy builds the problem from a snapshot). Notation as
the paper's Table I: a jobs (i), b nodes (j), m resource types (k).

    max  sum_k sum_i sum_j x_ij d_ik / C_k                                   (10)  utilization
    s.t. l_i >= s_i - ŝ_i,  l_i >= ŝ_i - s_i                                 (11, 12)
         M r_i >= x'_ij - x_ij,  M r_i >= x_ij - x'_ij    i running before   (13, 14)
         sum_i l_i <= θ1 x 2m                                                 (15)
         sum_i r_i <= ceil(θ2 x |jobs running before and now|)               (16)
         sum_i x_ij d_ik <= c_jk                                              (6)
         n_min_i <= sum_j x_ij <= n_max_i                                     (7, 8)
         x_ij integer >= 0, l_i >= 0, r_i in {0, 1}                           (9, 17, 18)

with s_i = max_k d_ik sum_j x_ij / C_k the job's dominant share -- linear, since the dominant
resource of a fixed demand vector is fixed: s_i = g_i sum_j x_ij with g_i = max_k d_ik / C_k --
and x' the current allocation. C_k is the cluster's total of resource k (shares and utilization
are of the whole cluster), c_jk what node j has for these jobs.

Departures, and why:
* (15) reads ceil(θ1 x 2m) in the paper. The loss is a real number at most 2m (each job's share
  and DRF share are at most 1 per resource summed), so θ1 x 2m is the fraction θ1 of its range; the
  ceiling would make every θ1 in (0, 1/(2m)] the same bound of 1 -- i.e. no bound at all for m=2
  -- so it is dropped here. (16) keeps its ceiling: it bounds a count.
* M is per job and node, the smallest value that keeps (13, 14) exact: x'_ij for a decrease and
  (the most executors of job i node j holds) - x'_ij for an increase. Every job holding executors
  gets an r_i (a newly launched one too, so that it is not moved for nothing, see below); (16)
  counts only those running before and now.
* A job whose AM container is not placed yet needs room for it on one node: binaries y_ij with
  sum_j y_ij = 1 enter (6) with the AM's resource. Without them a cluster Dorm keeps full would
  never start another job in YARN, where the AM comes before the executors.
* P1 wants resizes (and, after utilization, fairness loss) small as well; among allocations of the
  same utilization the solver is steered to resize fewer jobs by a cost on each r_i too small to
  outweigh one executor of utilization.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp


@dataclass(frozen=True)
class P2Problem:
    """One instance of P2. Arrays: demand (a, m), capacity (b, m), total (m,), n_min / n_max (a,),
    fair_share ŝ (a,), current x' (a, b), adjustable (a,) bool: running before and now (A^t ∩
    A^t-1, the jobs (16) counts), am (a, m): an AM to place (zero row: none)."""

    demand: np.ndarray
    capacity: np.ndarray
    total: np.ndarray
    n_min: np.ndarray
    n_max: np.ndarray
    fair_share: np.ndarray
    current: np.ndarray
    adjustable: np.ndarray
    am: np.ndarray
    theta1: float
    theta2: float

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.demand.shape[0], self.capacity.shape[0], self.demand.shape[1]

    def share_per_executor(self) -> np.ndarray:
        """g_i: the dominant share one executor of job i adds."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(self.total > 0, self.demand / np.where(self.total > 0, self.total, 1), 0.0)
        return ratio.max(axis=1) if ratio.size else np.zeros(self.demand.shape[0])

    def loss_bound(self) -> float:
        """The bound of (15) (see the module doc on the ceiling)."""
        return self.theta1 * 2 * self.shape[2]

    def adjustment_bound(self) -> int:
        """The bound of (16)."""
        return math.ceil(self.theta2 * int(self.adjustable.sum()) - 1e-9)


@dataclass(frozen=True)
class P2Solution:
    """x (a, b) executors per job and node, l (a,) fairness losses, r (a,) moved (0/1; (16) counts
    the adjustable jobs'), am_node
    (a,) the node index of each AM placed (-1: none), and the utilization (10) reached."""

    x: np.ndarray
    loss: np.ndarray
    resized: np.ndarray
    am_node: np.ndarray
    utilization: float


def solve_p2(p: P2Problem, time_limit_s: float = 2.0, mip_rel_gap: float = 1e-4) -> Optional[P2Solution]:
    """P2's optimum to within `mip_rel_gap` of utilization (HiGHS's own default 1e-4), or the best
    allocation found within `time_limit_s`; None when P2 is infeasible or nothing feasible was
    found in time."""
    a, b, m = p.shape
    if a == 0 or b == 0:
        return None
    total = np.where(p.total > 0, p.total, 1.0)
    util_per_x = (p.demand / total).sum(axis=1)              # (a,): sum_k d_ik / C_k
    g = p.share_per_executor()
    am_jobs = np.flatnonzero(p.am.sum(axis=1) > 0)
    n_x, n_y = a * b, len(am_jobs) * b
    ix_l, ix_r, ix_y = n_x, n_x + a, n_x + 2 * a
    n_var = ix_y + n_y

    def xi(i: int, j: int) -> int:
        return i * b + j

    with np.errstate(divide="ignore", invalid="ignore"):
        fit_all = np.where(p.demand[:, None, :] > 0, p.capacity[None, :, :] / np.where(
            p.demand[:, None, :] > 0, p.demand[:, None, :], 1), np.inf).min(axis=2)           # (a, b)
    c = np.zeros(n_var)
    c[:n_x] = -np.repeat(util_per_x, b)
    positive = util_per_x[util_per_x > 0]
    eps = 0.5 * (positive.min() if positive.size else 1.0) / (a + 1)
    c[ix_r:ix_r + a] = eps

    rows: list[sp.coo_matrix] = []
    lbs: list[np.ndarray] = []
    ubs: list[np.ndarray] = []

    def add(mat: sp.coo_matrix, lb: np.ndarray, ub: np.ndarray) -> None:
        rows.append(mat)
        lbs.append(lb)
        ubs.append(ub)

    # (6): per node j and resource k, sum_i x_ij d_ik + sum_AM y_ij am_ik <= c_jk
    r_idx, c_idx, vals = [], [], []
    for k in range(m):
        for i in range(a):
            if p.demand[i, k]:
                r_idx.append(np.arange(b) * m + k)
                c_idx.append(xi(i, 0) + np.arange(b))
                vals.append(np.full(b, p.demand[i, k], dtype=float))
        for t, i_am in enumerate(am_jobs.tolist()):
            if p.am[i_am, k]:
                r_idx.append(np.arange(b) * m + k)
                c_idx.append(ix_y + t * b + np.arange(b))
                vals.append(np.full(b, p.am[i_am, k], dtype=float))
    add(_coo(r_idx, c_idx, vals, b * m, n_var), np.full(b * m, -np.inf), p.capacity.reshape(-1).astype(float))
    # (7, 8): n_min_i <= sum_j x_ij <= n_max_i
    sums = sp.coo_matrix((np.ones(n_x), (np.repeat(np.arange(a), b), np.arange(n_x))), shape=(a, n_var))
    add(sums, p.n_min.astype(float), p.n_max.astype(float))
    # (11, 12): l_i - g_i sum_j x_ij >= -ŝ_i and l_i + g_i sum_j x_ij >= ŝ_i
    for sign in (-1.0, 1.0):
        mat = sp.coo_matrix((np.concatenate([np.repeat(sign * g, b), np.ones(a)]),
                             (np.concatenate([np.repeat(np.arange(a), b), np.arange(a)]),
                              np.concatenate([np.arange(n_x), ix_l + np.arange(a)]))), shape=(a, n_var))
        add(mat, sign * p.fair_share.astype(float), np.full(a, np.inf))
    # (13, 14) with the tightest M per job and node: x'_ij - x_ij <= x'_ij r_i (x_ij >= 0) and
    # x_ij - x'_ij <= (u_ij - x'_ij) r_i, u_ij the most executors of job i node j can hold.
    # Every job holding executors gets r_i (the cost on r_i keeps it where it is when nothing is
    # gained by moving it); only the jobs running before and now count in (16).
    tracked = p.adjustable | (p.current.sum(axis=1) > 0)
    adj = np.flatnonzero(tracked)
    if adj.size:
        upper_x = fit_all[adj]
        upper_x = np.minimum(np.floor(upper_x + 1e-9), p.n_max[adj, None].astype(float))
        cur = p.current[adj].astype(float)                                                  # (adj, b)
        cols_x = (adj[:, None] * b + np.arange(b)[None, :])
        cols_r = np.repeat((ix_r + adj)[:, None], b, axis=1)
        for m_ij, sign, keep in ((cur, 1.0, cur > 0), (upper_x - cur, -1.0, upper_x > cur)):
            # sign +1: M r + x >= x' ; sign -1: M r - x >= -x'
            k = int(keep.sum())
            rr = np.arange(k)
            mat = sp.coo_matrix((np.concatenate([m_ij[keep], np.full(k, sign)]),
                                 (np.concatenate([rr, rr]), np.concatenate([cols_r[keep], cols_x[keep]]))),
                                shape=(k, n_var))
            add(mat, sign * cur[keep], np.full(k, np.inf))
    # (15) sum_i l_i <= θ1 2m, (16) sum_i r_i <= ceil(θ2 |A^t ∩ A^t-1|)
    one = np.zeros((2, n_var))
    one[0, ix_l:ix_l + a] = 1.0
    one[1, ix_r:ix_r + a] = p.adjustable.astype(float)
    add(sp.coo_matrix(one), np.full(2, -np.inf), np.array([p.loss_bound(), float(p.adjustment_bound())]))
    # each AM on exactly one node
    if n_y:
        mat = sp.coo_matrix((np.ones(n_y), (np.repeat(np.arange(len(am_jobs)), b), ix_y + np.arange(n_y))),
                            shape=(len(am_jobs), n_var))
        add(mat, np.ones(len(am_jobs)), np.ones(len(am_jobs)))

    lower = np.zeros(n_var)
    # x_ij <= the executors of job i node j can hold alone (implied by (6); tighter bounds help the solver)
    x_upper = np.minimum(np.floor(fit_all + 1e-9), p.n_max[:, None].astype(float)).reshape(-1)
    upper = np.concatenate([x_upper, np.full(a, np.inf),
                            np.where(tracked, 1.0, 0.0), np.ones(n_y)])
    integrality = np.concatenate([np.ones(n_x), np.zeros(a), np.ones(a), np.ones(n_y)])
    res = milp(c, integrality=integrality, bounds=Bounds(lower, upper),
               constraints=LinearConstraint(sp.vstack(rows).tocsr(), np.concatenate(lbs), np.concatenate(ubs)),
               options={"time_limit": time_limit_s, "disp": False, "mip_rel_gap": mip_rel_gap})
    if res.x is None:
        return None
    sol = res.x
    x = np.rint(sol[:n_x]).astype(int).reshape(a, b)
    resized = np.rint(sol[ix_r:ix_r + a]).astype(int)
    am_node = np.full(a, -1)
    for t, i_am in enumerate(am_jobs.tolist()):
        am_node[i_am] = int(np.argmax(sol[ix_y + t * b: ix_y + (t + 1) * b]))
    return P2Solution(x, sol[ix_l:ix_l + a], resized, am_node, float((x.sum(axis=1) * util_per_x).sum()))


def _coo(r_idx: list[np.ndarray], c_idx: list[np.ndarray], vals: list[np.ndarray], n_rows: int,
         n_cols: int) -> sp.coo_matrix:
    if not vals:
        return sp.coo_matrix((n_rows, n_cols))
    return sp.coo_matrix((np.concatenate(vals), (np.concatenate(r_idx), np.concatenate(c_idx))),
                         shape=(n_rows, n_cols))


__all__ = ["P2Problem", "P2Solution", "solve_p2"]
