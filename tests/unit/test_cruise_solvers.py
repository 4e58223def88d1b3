"""Closed form (eq. 3.5) against brute force over all (W, S); the class MILP against brute force
over all role assignments; heterogeneity puts more input on faster nodes."""
import numpy as np
import pytest

from appmaster.cruise.baselines import brute_force_heterogeneous, brute_force_homogeneous
from appmaster.cruise.solver_homogeneous import (homogeneous_epoch_time, homogeneous_epoch_time_blocks, solve_homogeneous,
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


@pytest.mark.parametrize("overlap", [False, True])
def test_closed_form_with_latency_and_contention_agrees_with_brute_force(overlap):
    rng = np.random.default_rng(7)
    for _ in range(300):
        job = random_job(rng)
        job = JobProfile(job.input_blocks, job.samples_per_block, job.model_blocks, job.bytes_per_batch,
                         job.batch_size, float(rng.choice([1, 2, 3.5, 8, np.inf])), overlap)
        node = NodeProfile("n", float(10 ** rng.uniform(-6, -2)), float(10 ** rng.uniform(6, 10)),
                           float(10 ** rng.uniform(6, 10)), float(rng.choice([0.0, 10 ** rng.uniform(-4, 0)])))
        n = int(rng.integers(2, 80))
        fast, slow = solve_homogeneous(job, node, n), brute_force_homogeneous(job, node, n)
        assert fast.epoch_s == pytest.approx(slow.epoch_s, rel=1e-9), (job, node, n)


def test_whole_blocks_pick_the_split_that_trains_fewer_blocks_per_worker():
    # 8 input blocks over 6 executors: 3 workers train 3, 3, 2 blocks, 4 workers 2 each. Continuous
    # D / w (2.67 blocks) favours 3 workers; whole blocks favour 4, and that is what the target is priced at.
    job = JobProfile(input_blocks=8, samples_per_block=50, model_blocks=12, bytes_per_batch=2.2e5, batch_size=20)
    node = NodeProfile("n", 2e-3, 5e6, 5e6)
    assert solve_homogeneous(job, node, 6).workers == 3
    blocks = solve_homogeneous(job, node, 6, integral=True)
    assert blocks.workers == 4
    assert homogeneous_epoch_time_blocks(job, node, 6, 4) < homogeneous_epoch_time_blocks(job, node, 6, 3)
    target = solve_homogeneous_target(job, [Slot(NodeProfile(f"e{i}", 2e-3, 5e6, 5e6)) for i in range(6)])
    assert target.shape == (4, 2) and target.epoch_s == pytest.approx(blocks.epoch_s)


@pytest.mark.parametrize("overlap", [False, True])
def test_whole_blocks_agree_with_a_scan_of_every_split(overlap):
    rng = np.random.default_rng(11)
    for _ in range(300):
        job = JobProfile(int(rng.integers(1, 40)), float(rng.uniform(10, 500)), int(rng.integers(1, 40)),
                         float(10 ** rng.uniform(4, 7)), int(rng.integers(5, 200)), float(rng.choice([2, np.inf])),
                         overlap)
        node = NodeProfile("n", float(10 ** rng.uniform(-5, -2)), float(10 ** rng.uniform(6, 8)),
                           float(10 ** rng.uniform(6, 8)), float(rng.choice([0.0, 10 ** rng.uniform(-4, -1)])))
        n = int(rng.integers(2, 14))
        best = min(homogeneous_epoch_time_blocks(job, node, n, w) for w in range(1, n))
        # Every worker count is scored: the scan's optimum exactly (the candidates near the
        # continuous optimum missed it by up to 2.5x; a bound of 1.1 here let some misses by).
        assert solve_homogeneous(job, node, n, integral=True).epoch_s <= best * (1 + 1e-12), (job, node, n)


def test_whole_blocks_find_a_best_shape_far_from_the_continuous_optimum():
    """19 input blocks of one mini-batch each: every worker trains one ceil'd batch whatever their
    number, so more workers only load the servers -- one worker is best, where four were chosen
    (2.5x slower by the solver's own pricing)."""
    job = JobProfile(input_blocks=19, samples_per_block=1, model_blocks=1, bytes_per_batch=1000.0, batch_size=32)
    node = NodeProfile("x", 1e-6, 1e6, 1e6, 1e-3)
    r = solve_homogeneous(job, node, 8, integral=True)
    assert (r.workers, r.servers) == (1, 7)
    assert r.epoch_s == pytest.approx(homogeneous_epoch_time_blocks(job, node, 8, 1))


def test_latency_dominated_profile_picks_more_workers_than_bandwidth_dominated():
    # Same job and nodes; in one the mini-batch's cost is a fixed round trip (no more servers make
    # it shorter), in the other it is the bytes through the servers' links.
    job = JobProfile(input_blocks=48, samples_per_block=100, model_blocks=48, bytes_per_batch=1e5, batch_size=10)
    latency = [Slot(NodeProfile(f"e{i}", 1e-4, 1e9, 1e9, latency_s_per_batch=0.02)) for i in range(12)]
    bandwidth = [Slot(NodeProfile(f"e{i}", 1e-4, 5e6, 5e6)) for i in range(12)]
    lat_w = solve_homogeneous_target(job, latency).shape[0]
    bw_w = solve_homogeneous_target(job, bandwidth).shape[0]
    assert lat_w > bw_w and lat_w >= 10 and bw_w == 6
    # The MILP path (two node classes) agrees on the direction.
    mixed_lat = latency[:6] + [Slot(NodeProfile(f"f{i}", 5e-5, 1e9, 1e9, 0.02)) for i in range(6)]
    mixed_bw = bandwidth[:6] + [Slot(NodeProfile(f"f{i}", 5e-5, 5e6, 5e6)) for i in range(6)]
    assert solve_milp_target(job, mixed_lat).shape[0] > solve_milp_target(job, mixed_bw).shape[0]


def test_contention_stops_workers_past_the_cores_from_looking_faster():
    # Compute-heavy job: with a core each, workers pay off up to W = 8 of 12; on 2 shared cores compute
    # does not speed up past 2 workers, so the servers' side decides and W stays at the balance, 6.
    job = JobProfile(input_blocks=60, samples_per_block=100, model_blocks=12, bytes_per_batch=1e5, batch_size=50)
    node = NodeProfile("n", 1e-3, 1e7, 1e7)
    free = solve_homogeneous(job, node, 12, integral=True).workers
    shared = solve_homogeneous(JobProfile(60, 100, 12, 1e5, 50, compute_parallelism=2), node, 12, integral=True).workers
    assert free == 8 and shared == 6


def test_overlap_moves_a_compute_heavy_small_batch_job_to_more_workers():
    # Issue 13's nmf-b20 on 16 cores, roughly: 8 input blocks of 50 rows, mini-batches of 20,
    # 224 KB each way per mini-batch on 5 MB/s links, 0.7 ms compute per row. Eq. 3.4 adds each
    # mini-batch's compute to the servers' queue and keeps 3x3; with the compute overlapping the
    # queue (the optimizer's model) 4x2 -- the grid's best there, 0.55 s against 0.65 s -- wins.
    node = NodeProfile("n", 7e-4, 5e6, 5e6)
    eq34 = JobProfile(input_blocks=8, samples_per_block=50, model_blocks=12, bytes_per_batch=2.24e5, batch_size=20)
    assert solve_homogeneous(eq34, node, 6, integral=True).workers == 3
    overlap = JobProfile(8, 50, 12, 2.24e5, 20, overlap=True)
    assert solve_homogeneous(overlap, node, 6, integral=True).workers == 4
    # MILP path: two classes of nodes, same direction.
    slots = [Slot(NodeProfile(f"a{i}", 7e-4, 5e6, 5e6)) for i in range(3)]
    slots += [Slot(NodeProfile(f"b{i}", 6e-4, 5e6, 5e6)) for i in range(3)]
    assert solve_milp_target(overlap, slots).shape[0] >= solve_milp_target(eq34, slots).shape[0]


def test_targets_keep_the_specs_role_bounds_and_are_the_best_within_them():
    """A job's max_workers / max_servers hold in every target (a directive grants containers and
    Cruise splits them: unbounded, it gave a 3 x 3 grant 5 workers against max_workers 4)."""
    free = JobProfile(100, 100, 10, 1e6, 100)
    p = lambda i: NodeProfile(f"e{i}", 9e-3, 1e7, 1e7)  # noqa: E731  # optimum W = 6 of 8
    slots = [Slot(p(i)) for i in range(8)]
    assert solve_homogeneous_target(free, slots).shape == (6, 2)
    for bounds, shape in (({"max_workers": 4}, (4, 4)), ({"max_servers": 1}, (7, 1)),
                          ({"max_workers": 5, "max_servers": 3}, (5, 3))):
        job = JobProfile(100, 100, 10, 1e6, 100, **bounds)
        assert solve_homogeneous_target(job, slots).shape == shape, bounds
        assert solve_homogeneous(job, p(0), 8).workers == brute_force_homogeneous(job, p(0), 8).workers
    with pytest.raises(CostModelError, match="cannot be split within max_workers 3 and max_servers 3"):
        solve_homogeneous(JobProfile(100, 100, 10, 1e6, 100, max_workers=3, max_servers=3), p(0), 8)
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(40):
        base = JobProfile(int(rng.integers(10, 60)), float(rng.uniform(100, 1000)), int(rng.integers(4, 30)),
                          float(10 ** rng.uniform(5, 8)), int(rng.integers(50, 500)))
        nodes = random_nodes(rng, int(rng.integers(3, 7)))
        _, free_workers = brute_force_heterogeneous(base, nodes)
        if len(free_workers) < 2:
            continue
        job = JobProfile(base.input_blocks, base.samples_per_block, base.model_blocks, base.bytes_per_batch,
                         base.batch_size, max_workers=len(free_workers) - 1)     # the free optimum is out
        best, _ = brute_force_heterogeneous(job, nodes)
        target = solve_milp_target(job, [Slot(q) for q in nodes], class_tolerance=0)
        assert target.shape[0] <= job.max_workers
        assert target.epoch_s_continuous == pytest.approx(best, rel=1e-3)
        checked += 1
    assert checked >= 10
