"""The `dorm` policy: P2's solutions checked against every constraint and both θ bounds from the
allocation itself (not from the solver's own variables), optimality against brute force on tiny
instances, infeasible P2 keeps the current allocation, solving only when the job set changes, and
the RM's settings reaching the policy."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from partition_snapshots import job, node, snapshot
from protocol.config import RMConfig
from protocol.records import Resource
from rm import policies
from rm.policies import DormPolicy
from rm.policies.dorm import build_problem
from rm.policies.dorm_milp import P2Problem, P2Solution, solve_p2
from rm.policies.elastic_jobs import elastic_view

E = Resource(1024, 1)


def violations(p: P2Problem, sol: P2Solution) -> list[str]:
    """Every constraint of P2 (and the θ bounds) checked on the allocation x alone."""
    x = sol.x
    a, b, m = p.shape
    out = []
    if x.shape != (a, b) or (x < 0).any() or not np.issubdtype(x.dtype, np.integer):
        out.append("(9) x is not a non-negative integer matrix")
    used = x.T @ p.demand                                          # (b, m)
    for i in range(a):
        if sol.am_node[i] >= 0:
            used[sol.am_node[i]] += p.am[i]
        elif p.am[i].any():
            out.append(f"AM of job {i} not placed")
    if (used > p.capacity + 1e-9).any():
        out.append(f"(6) a node is over capacity: {used} > {p.capacity}")
    n = x.sum(axis=1)
    if (n > p.n_max).any() or (n < p.n_min).any():
        out.append(f"(7, 8) executors {n} outside [{p.n_min}, {p.n_max}]")
    share = np.array([max(p.demand[i, k] * n[i] / p.total[k] for k in range(m)) for i in range(a)])
    loss = np.abs(share - p.fair_share).sum()
    if loss > p.theta1 * 2 * m + 1e-6:
        out.append(f"(15) fairness loss {loss} > θ1·2m = {p.theta1 * 2 * m}")
    resized = sum(1 for i in range(a) if p.adjustable[i] and (x[i] != p.current[i]).any())
    if resized > math.ceil(p.theta2 * p.adjustable.sum() - 1e-9):
        out.append(f"(16) {resized} jobs resized > ceil(θ2·{p.adjustable.sum()})")
    return out


def random_problem(rng: np.random.Generator, a: int, b: int, theta1: float, theta2: float) -> P2Problem:
    demand = rng.integers(1, 4, size=(a, 2)).astype(float)
    capacity = rng.integers(4, 9, size=(b, 2)).astype(float)
    n_min = rng.integers(1, 3, size=a)
    n_max = n_min + rng.integers(0, 4, size=a)
    # a current allocation that fits: fill greedily
    current = np.zeros((a, b), dtype=int)
    free = capacity.copy()
    for i in range(a):
        for j in range(b):
            while current[i].sum() < n_min[i] and (demand[i] <= free[j]).all():
                current[i, j] += 1
                free[j] -= demand[i]
    adjustable = rng.random(a) < 0.7
    total = capacity.sum(axis=0)
    fair = rng.random(a) * 0.4
    return P2Problem(demand, capacity, total, n_min, n_max, fair, current, adjustable, np.zeros((a, 2)),
                     theta1, theta2)


@pytest.mark.parametrize("seed", range(12))
def test_p2_solutions_satisfy_every_constraint_and_both_thresholds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = random_problem(rng, a=int(rng.integers(2, 5)), b=int(rng.integers(2, 4)),
                       theta1=float(rng.choice([0.05, 0.2, 1.0])), theta2=float(rng.choice([0.0, 0.5, 1.0])))
    sol = solve_p2(p)
    if sol is None:     # infeasible: then no allocation at all meets P2 (checked by brute force)
        assert p.shape[0] * p.shape[1] > 6 or brute_force_utilization(p) < 0
        return
    assert violations(p, sol) == []


def brute_force_utilization(p: P2Problem) -> float:
    """The best utilization (10) over every allocation satisfying P2 (tiny instances only)."""
    a, b, m = p.shape
    best = -1.0
    per_job = [[c for c in itertools.product(range(int(p.n_max[i]) + 1), repeat=b)
                if p.n_min[i] <= sum(c) <= p.n_max[i]] for i in range(a)]
    for combo in itertools.product(*per_job):
        x = np.array(combo, dtype=int)
        sol = P2Solution(x, np.zeros(a), np.zeros(a, dtype=int), np.full(a, -1), 0.0)
        if not violations(p, sol):
            best = max(best, float((x.sum(axis=1) * (p.demand / p.total).sum(axis=1)).sum()))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_p2_reaches_the_brute_force_optimum_on_tiny_instances(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, a=2, b=2, theta1=float(rng.choice([0.1, 0.5])), theta2=float(rng.choice([0.5, 1.0])))
    best = brute_force_utilization(p)
    sol = solve_p2(p)
    if best < 0:
        assert sol is None
    else:
        assert sol is not None and sol.utilization == pytest.approx(best, abs=1e-6)


def two_jobs(theta2: float = 0.5, theta1: float = 0.1):
    nodes = [node("n1", 4096, 4), node("n2", 4096, 4)]
    a = job("app_1", E, {"n1": (2, 1), "n2": (2, 2)}, workers=2, servers=1, max_workers=4, max_servers=3,
            submit_time=1)
    b = job("app_2", E, {}, started=False, am_on=None, workers=1, servers=1, submit_time=2)
    return nodes, a, b, DormPolicy(theta1, theta2)


def test_an_arriving_job_shrinks_the_running_one_within_the_thresholds() -> None:
    nodes, a, b, dorm = two_jobs()
    assert dorm.decide(snapshot(nodes, [a])) == policies.Decision()      # already at its maximum
    snap = snapshot(nodes, [a, b])
    d = dorm.decide(snap)
    assert set(d.jobs) == {"app_1"}                 # the new job gets no directive: it starts as submitted
    jd = d.jobs["app_1"]
    # A at most: the cluster has 8 vcores, A's AM 1, B's AM and executors 3 -> 4 executors for A
    assert jd.workers + jd.servers == 4 and jd.workers >= 1 and jd.servers >= 1
    assert sum(p.workers + p.servers for p in jd.placement) == 4 and jd.reason.startswith("dorm:")
    assert dorm.last_problem is not None and dorm.last_solution is not None
    assert violations(dorm.last_problem, dorm.last_solution) == []
    # B's AM and executors fit beside A's new placement on each node
    free = {n.node_id: n.capacity.vcores for n in snap.nodes}
    free["n1"] -= 1                                  # A's AM
    for p in jd.placement:
        free[p.node] -= p.workers + p.servers
    assert sum(free.values()) >= 3 and max(free.values()) >= 1
    # Same job set: no new solve, no new decision (the RM keeps the directive it holds).
    assert dorm.decide(snap) == policies.Decision()


def test_infeasible_p2_keeps_the_current_allocation() -> None:
    # θ2 = 0: no running job may be resized, but B only fits if A shrinks -> infeasible.
    nodes, a, b, dorm = two_jobs(theta2=0.0)
    dorm.decide(snapshot(nodes, [a]))
    assert dorm.decide(snapshot(nodes, [a, b])) == policies.Decision()
    assert dorm.last_problem is not None and dorm.last_solution is None
    # Once the job set changes again (A completes), Dorm solves again.
    assert dorm.decide(snapshot(nodes, [b])) == policies.Decision()
    assert dorm.last_problem is not None and dorm.last_problem.shape[0] == 1


def test_a_zero_fairness_threshold_gives_every_job_exactly_its_drf_share() -> None:
    nodes, a, b, dorm = two_jobs(theta1=0.0)
    dorm.decide(snapshot(nodes, [a]))
    dorm.decide(snapshot(nodes, [a, b]))
    p, sol = dorm.last_problem, dorm.last_solution
    assert p is not None and sol is not None and violations(p, sol) == []
    shares = p.share_per_executor() * sol.x.sum(axis=1)
    assert shares.tolist() == pytest.approx(p.fair_share.tolist())
    assert p.fair_share.tolist() == pytest.approx([0.5, 0.25])


def test_a_job_that_just_started_is_resized_outside_the_adjustment_budget() -> None:
    # θ2 = 0: no job running at the last solve may be resized; B, launched since, may.
    nodes = [node("n1", 4096, 4), node("n2", 4096, 4)]
    a = job("app_1", E, {"n1": (1, 1)}, workers=1, servers=1, max_workers=2, max_servers=2, submit_time=1)
    b_new = job("app_2", E, {}, started=False, am_on=None, workers=1, servers=1, max_workers=3, max_servers=3,
                submit_time=2)
    b_run = job("app_2", E, {"n2": (1, 1)}, workers=1, servers=1, max_workers=3, max_servers=3, submit_time=2)
    dorm = DormPolicy(0.1, 0.0)
    assert dorm.decide(snapshot(nodes, [a])) == policies.Decision()          # A may not grow: θ2 = 0
    assert dorm.decide(snapshot(nodes, [a, b_new])) == policies.Decision()   # B fits on n2 as it is
    d = dorm.decide(snapshot(nodes, [a, b_run], am_nodes={"app_2": "n2"}))   # B started: solve again
    assert set(d.jobs) == {"app_2"}
    assert d.jobs["app_2"].workers + d.jobs["app_2"].servers == 4               # the two free slots
    assert dorm.last_problem is not None and dorm.last_problem.adjustable.tolist() == [True, False]


def test_problem_uses_the_jobs_weights_for_drf_shares() -> None:
    nodes = [node("n1", 8192, 8)]
    a = job("app_1", E, {"n1": (1, 1)}, workers=1, servers=1, max_workers=8, max_servers=8, weight=3.0,
            am_on=None, submit_time=1)
    b = job("app_2", E, {"n1": (1, 1)}, workers=1, servers=1, max_workers=8, max_servers=8, am_on=None,
            submit_time=2)
    p = build_problem(elastic_view(snapshot(nodes, [a, b])), 0.1, 0.5)
    assert p.fair_share.tolist() == pytest.approx([6 / 8, 2 / 8])     # 3:1 by weight


def test_settings_reach_the_policy_through_the_registry() -> None:
    dorm = policies.create("dorm", RMConfig(dorm_fairness_threshold=0.3, dorm_adjustment_threshold=0.25))
    assert isinstance(dorm, DormPolicy) and (dorm.theta1, dorm.theta2) == (0.3, 0.25)
    assert isinstance(policies.create("dorm"), DormPolicy)          # defaults without settings
    assert policies.create("static").name == "static"               # no-argument factories unchanged
    assert {"dorm", "drf", "tetris", "eps", "static"} <= set(policies.known())
    with pytest.raises(ValueError):
        DormPolicy(fairness_threshold=1.5)


def test_rm_config_thresholds_are_read_and_checked(tmp_path) -> None:
    from protocol.config import ConfigError
    from rm.__main__ import load_configs, parse_args
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    (tmp_path / "rm.toml").write_text('[rm]\npolicy = "dorm"\ndorm_fairness_threshold = 0.2\n')
    args = ["--config", str(tmp_path / "rm.toml"), "--cluster-config", str(tmp_path / "cluster.toml")]
    cfg, _ = load_configs(parse_args(args))
    assert (cfg.policy, cfg.dorm_fairness_threshold, cfg.dorm_adjustment_threshold) == ("dorm", 0.2, 0.5)
    (tmp_path / "rm.toml").write_text('[rm]\ndorm_adjustment_threshold = 2.0\n')
    with pytest.raises(ConfigError, match="dorm_adjustment_threshold"):
        load_configs(parse_args(args))
