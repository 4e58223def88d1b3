"""Closed form (eq. 3.5) against brute force over all (W, S); the class MILP against brute force
over all role assignments; heterogeneity puts more input on faster nodes."""
import numpy as np
import pytest

from appmaster.cruise.baselines import brute_force_heterogeneous, brute_force_homogeneous
from appmaster.cruise.solver_homogeneous import (homogeneous_epoch_time, solve_homogeneous,
                                                 solve_homogeneous_target)
from appmaster.cruise.solver_milp import group_classes, solve_classes, solve_milp_target
from appmaster.cruise.targets import Role, Slot
from models.cruise_cost import CostModelError, JobProfile, NodeProfile


def random_job(rng):
    return JobProfile(input_blocks=int(rng.integers(20, 400)), samples_per_block=float(rng.uniform(10, 1e4)),
                      model_blocks=int(rng.integers(4, 200)), bytes_per_batch=float(10 ** rng.uniform(4, 9)),
                      batch_size=int(rng.integers(10, 1e4)))


def test_closed_form_agrees_with_brute_force_on_random_parameters():
    rng = np.random.default_rng(42)
    for _ in range(300):
        job = random_job(rng)
        node = NodeProfile("n", float(10 ** rng.uniform(-6, -2)), float(10 ** rng.uniform(6, 10)),
                           float(10 ** rng.uniform(6, 10)))
        n = int(rng.integers(2, 80))
        fast, slow = solve_homogeneous(job, node, n), brute_force_homogeneous(job, node, n)
        assert fast.epoch_s == pytest.approx(slow.epoch_s, rel=1e-9), (job, node, n)
        assert fast.workers + fast.servers == n
        assert homogeneous_epoch_time(job, node, n, fast.workers) == pytest.approx(fast.epoch_s)


def test_closed_form_edges():
    job = JobProfile(100, 100, 10, 1e6, 100)
    # No compute at all: only the communication balance matters (the crossover point).
    assert solve_homogeneous(job, NodeProfile("n", 0.0, 1e7, 1e7), 10).workers == 5
    assert solve_homogeneous(job, NodeProfile("n", 1.0, 1e7, 1e7), 2).workers == 1
    with pytest.raises(CostModelError, match="at least 2"):
        solve_homogeneous(job, NodeProfile("n", 1.0, 1e7, 1e7), 1)


def test_homogeneous_target_keeps_current_roles_and_splits_evenly():
    job = JobProfile(100, 100, 10, 1e6, 100)
    p = lambda i: NodeProfile(f"e{i}", 9e-3, 1e7, 1e7)  # noqa: E731  # optimum W = 6 of 8
    slots = [Slot(p(i), Role.SERVER if i < 4 else Role.WORKER, 5) for i in range(8)]
    t = solve_homogeneous_target(job, slots)
    assert t.shape == (6, 2)
    assert {f"e{i}" for i in range(4, 8)} <= set(t.assignment.workers)   # all current workers stay
    assert sorted(t.assignment.workers.values()) == [16, 16, 17, 17, 17, 17]
    assert sorted(t.assignment.servers.values()) == [5, 5]


def random_nodes(rng, n):
    return [NodeProfile(f"n{i}", float(10 ** rng.uniform(-5, -3)), float(10 ** rng.uniform(7, 9)),
                        float(10 ** rng.uniform(7, 9))) for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_milp_agrees_with_brute_force_on_small_heterogeneous_cases(seed):
    rng = np.random.default_rng(seed)
    job = JobProfile(int(rng.integers(10, 60)), float(rng.uniform(100, 1000)), int(rng.integers(4, 30)),
                     float(10 ** rng.uniform(5, 8)), int(rng.integers(50, 500)))
    nodes = random_nodes(rng, int(rng.integers(3, 6)))
    best, _ = brute_force_heterogeneous(job, nodes)
    target = solve_milp_target(job, [Slot(p) for p in nodes], class_tolerance=0)
    assert target.epoch_s_continuous == pytest.approx(best, rel=1e-3)


def test_milp_with_classes_agrees_with_per_node_brute_force():
    job = JobProfile(80, 500, 16, 4e6, 250)
    kinds = [(2e-4, 1e8, 1e8), (5e-5, 4e8, 4e8)]
    nodes = [NodeProfile(f"s{i}", *kinds[0]) for i in range(5)] + [NodeProfile(f"f{i}", *kinds[1]) for i in range(2)]
    classes = group_classes(nodes)
    assert sorted(len(c.members) for c in classes) == [2, 5]
    best, _ = brute_force_heterogeneous(job, nodes)
    result = solve_classes(job, classes)
    assert result.objective_s == pytest.approx(best, rel=1e-3)
    target = solve_milp_target(job, [Slot(p) for p in nodes])
    assert target.epoch_s_continuous == pytest.approx(best, rel=1e-3)


def test_milp_puts_more_input_blocks_on_faster_nodes():
    # Compute-bound job; 6 slow and 2 fast (4x compute) nodes with the same bandwidth.
    job = JobProfile(200, 1000, 8, 1e5, 1000)
    nodes = [NodeProfile(f"slow{i}", 4e-4, 1e9, 1e9) for i in range(6)] + \
            [NodeProfile(f"fast{i}", 1e-4, 1e9, 1e9) for i in range(2)]
    t = solve_milp_target(job, [Slot(p) for p in nodes])
    w = t.assignment.workers
    assert {"fast0", "fast1"} <= set(w)
    slow_blocks = [v for k, v in w.items() if k.startswith("slow")]
    assert slow_blocks and min(w["fast0"], w["fast1"]) >= 3 * max(slow_blocks)
    assert sum(w.values()) == 200 and sum(t.assignment.servers.values()) == 8


def test_milp_prefers_high_bandwidth_nodes_as_servers_when_communication_bound():
    job = JobProfile(64, 100, 64, 5e8, 100)
    nodes = [NodeProfile(f"n{i}", 1e-5, 1e10, 1e8) for i in range(6)] + \
            [NodeProfile(f"big{i}", 1e-5, 1e10, 1e10) for i in range(2)]
    t = solve_milp_target(job, [Slot(p) for p in nodes])
    assert {"big0", "big1"} <= set(t.assignment.servers)
    assert t.epoch_s_continuous == pytest.approx(brute_force_heterogeneous(job, nodes)[0], rel=1e-3)


def test_group_classes_tolerates_measurement_noise():
    nodes = [NodeProfile("a", 1.00e-4, 1e8, 1e8), NodeProfile("b", 1.01e-4, 0.99e8, 1.0e8),
             NodeProfile("c", 3e-4, 1e8, 1e8)]
    classes = group_classes(nodes, 0.05)
    assert sorted(sorted(c.members) for c in classes) == [["a", "b"], ["c"]]
    assert len(group_classes(nodes, 0)) == 3
