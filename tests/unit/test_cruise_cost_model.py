"""Cruise cost model (eq. 3.1-3.4) and the optimal block split on synthetic profiles."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from appmaster.cruise.balance import min_max_split, split_blocks
from models.cruise_cost import (Assignment, CostModelError, JobProfile, NodeProfile, epoch_time,
                                 epoch_time_arrays, model_inputs_from_json, model_inputs_json, predict)

JOB = JobProfile(input_blocks=100, samples_per_block=100, model_blocks=10, bytes_per_batch=1e6, batch_size=100)


def node(i, c=1e-3, bw=1e7, bs=1e7):
    return NodeProfile(f"n{i}", c, bw, bs)


def test_worker_and_server_bound_terms_by_hand():
    nodes = {"a": node("a"), "b": node("b"), "s": node("s", bs=2e7)}
    nodes = {k: NodeProfile(k, v.compute_s_per_sample, v.worker_bandwidth, v.server_bandwidth) for k, v in nodes.items()}
    a = Assignment({"a": 60, "b": 40}, {"s": 10})
    p = predict(JOB, nodes, a)
    # a: 6000 samples -> 6 s compute, 60 batches; server term 10 blocks * 1e5 B * 2 workers / 2e7 = 0.01 s,
    # worker term 1e6 / 1e7 = 0.1 s -> worker-bound: 60 * 0.1 = 6 s.
    assert p.compute_s["a"] == pytest.approx(6.0)
    assert p.comm_s["a"] == pytest.approx(6.0)
    assert p.epoch_s == pytest.approx(12.0) and p.slowest_worker == "a" and not p.server_bound
    # A slow server makes the server term bind (eq. 3.4's first case) for every worker.
    nodes["s"] = NodeProfile("s", 1e-3, 1e7, 1e5)
    p = predict(JOB, nodes, a)
    assert p.server_batch_s == pytest.approx(10 * 1e5 * 2 / 1e5)
    assert p.server_bound and p.comm_s["b"] == pytest.approx(40 * 20.0)


def test_ceil_batches_versus_continuous():
    nodes = {"a": node("a"), "s": node("s")}
    a = Assignment({"a": 100}, {"s": 10})
    job = JobProfile(100, 1.5, 10, 1e6, 100)        # 150 samples: 1.5 -> 2 mini-batches
    assert epoch_time(job, nodes, a) - epoch_time(job, nodes, a, integral_batches=False) == pytest.approx(0.5 * 0.1)


def test_known_optimum_on_synthetic_metrics():
    # 8 identical nodes, c = 9e-3 s/sample, K = bytes / (B b) = 1e-3 s/sample:
    # f(w) = (D/w)(c + K max(1, w/(N-w))) is minimal where (N-w)/w = sqrt(K/c) = 1/3, i.e. W = 6,
    # with f(6) = 10000/6 * (9e-3 + 3e-3) = 20 s.
    nodes = {f"n{i}": node(i, c=9e-3) for i in range(8)}
    times = {}
    for w in range(1, 8):
        times[w] = epoch_time_arrays(JOB, np.full(w, 9e-3), np.full(w, 1e7), np.full(w, 100 / w),
                                     np.full(8 - w, 1e7), np.full(8 - w, 10 / (8 - w)))
    assert min(times, key=times.get) == 6
    assert times[6] == pytest.approx(20.0)
    # The integral split of the same shape is priced by the mapping form, and still wins.
    integral = {}
    for w in range(1, 8):
        d, m = split_blocks(JOB, np.full(w, 9e-3), np.full(w, 1e7), np.full(8 - w, 1e7))
        a = Assignment({f"n{i}": int(x) for i, x in enumerate(d)}, {f"n{w + i}": int(x) for i, x in enumerate(m)})
        integral[w] = epoch_time(JOB, nodes, a)
    assert min(integral, key=integral.get) == 6


def test_arrays_agree_with_mapping_form():
    rng = np.random.default_rng(3)
    nodes = {f"n{i}": NodeProfile(f"n{i}", rng.uniform(1e-4, 1e-3), rng.uniform(1e6, 1e7), rng.uniform(1e6, 1e7))
             for i in range(6)}
    a = Assignment({"n0": 30, "n1": 50, "n2": 20}, {"n3": 3, "n4": 3, "n5": 4})
    c = np.array([nodes[k].compute_s_per_sample for k in a.workers])
    bw = np.array([nodes[k].worker_bandwidth for k in a.workers])
    bs = np.array([nodes[k].server_bandwidth for k in a.servers])
    for integral in (True, False):
        assert epoch_time_arrays(JOB, c, bw, np.array(list(a.workers.values())), bs,
                                 np.array(list(a.servers.values())), integral) == pytest.approx(
            epoch_time(JOB, nodes, a, integral))


@pytest.mark.parametrize("assignment, message", [
    (Assignment({"a": 100}, {"a": 10}), "both worker and server"),
    (Assignment({"a": 99}, {"s": 10}), "input blocks"),
    (Assignment({"a": 100}, {"s": 9}), "model blocks"),
    (Assignment({"a": 100}, {}), ">= 1 server"),
    (Assignment({"x": 100}, {"s": 10}), "no profile"),
])
def test_bad_configurations_are_named(assignment, message):
    with pytest.raises(CostModelError, match=message):
        predict(JOB, {"a": node("a"), "s": node("s")}, assignment)


def test_bad_profiles_are_named():
    with pytest.raises(CostModelError, match="worker_bandwidth"):
        NodeProfile("x", 1e-3, 0.0, 1.0)
    with pytest.raises(CostModelError, match="batch_size"):
        JobProfile(10, 1, 1, 1.0, 0)


def test_min_max_split_is_optimal_against_exhaustive():
    rng = np.random.default_rng(7)
    for _ in range(30):
        k = int(rng.integers(1, 4))
        w = rng.uniform(0.5, 3.0, k)
        total = int(rng.integers(0, 12))
        x = min_max_split(total, w)
        assert x.sum() == total and (x >= 0).all()
        best = min(max(a * wi for a, wi in zip(combo, w))
                   for combo in np.ndindex(*([total + 1] * k)) if sum(combo) == total)
        assert max(x * w) == pytest.approx(best)


def test_split_blocks_gives_faster_workers_more():
    d, m = split_blocks(JOB, np.array([1e-3, 5e-4]), np.array([1e7, 1e7]), np.array([1e7, 3e7]))
    assert d.sum() == 100 and m.sum() == 10
    assert d[1] > d[0] and m[1] > m[0]


RECORDED = Path(__file__).parents[1] / "data" / "cruise_recorded_profiles.json"
# Stated bounds on the model's error against measured epoch times (bench/cruise_vs_grid.py on the
# 2-core CI machine, docs/cruise.md): the median over every (profile, split) pair, the worst
# prediction of a split from the profile measured at that split, and the mean over profiles of the
# grid time of the split the model picks over the grid's best. The model leaves out a per-epoch
# fixed cost (the clock barrier, the AM's status round), so it tends to predict low.
# Measured when recorded: median 0.21, own split at most 0.55 (nmf-b5 at 5x1), picked split 1.04x.
MEDIAN_RELATIVE_ERROR = 0.30
OWN_SPLIT_RELATIVE_ERROR = 0.65
PICKED_RELATIVE_TO_BEST = 1.06


def _recorded_predictions():
    from appmaster.cruise.solver_homogeneous import mean_profile
    from appmaster.cruise.targets import Slot, build_target

    data = json.loads(RECORDED.read_text())
    for wl in data["workloads"]:
        measured = {tuple(map(int, k.split("x"))): v for k, v in wl["grid"].items()}
        n = sum(next(iter(measured)))
        for at, inputs in wl["profiles"].items():
            job, nodes = model_inputs_from_json(inputs)
            node = mean_profile(list(nodes.values()))
            slots = [Slot(dataclasses.replace(node, node_id=f"n{i}")) for i in range(n)]
            predicted = {(w, n - w): build_target(job, slots, [f"n{i}" for i in range(w)]).epoch_s
                         for w in range(1, n)}
            yield wl["workload"], tuple(map(int, at.split("x"))), predicted, measured


def test_prediction_errors_on_recorded_profiles_stay_under_the_stated_bounds():
    errors, own, picked = [], [], []
    for name, at, predicted, measured in _recorded_predictions():
        picked.append(measured[min(predicted, key=predicted.__getitem__)] / min(measured.values()))
        for split, t in measured.items():
            e = abs(predicted[split] - t) / t
            errors.append(e)
            if split == at:
                own.append((e, name, at))
    assert len(own) >= 10
    assert float(np.median(errors)) <= MEDIAN_RELATIVE_ERROR
    assert max(own)[0] <= OWN_SPLIT_RELATIVE_ERROR, max(own)
    assert float(np.mean(picked)) <= PICKED_RELATIVE_TO_BEST


def test_model_inputs_round_trip_through_json():
    job = JobProfile(8, 50.0, 12, 2e5, 20, compute_parallelism=2.0)
    nodes = {"a": NodeProfile("a", 1e-3, 5e6, 4e6, 0.002)}
    assert model_inputs_from_json(json.loads(json.dumps(model_inputs_json(job, nodes)))) == (job, nodes)
    inf = JobProfile(8, 50.0, 12, 2e5, 20)
    assert model_inputs_from_json(json.loads(json.dumps(model_inputs_json(inf, nodes))))[0] == inf


def test_latency_and_contention_terms_by_hand():
    nodes = {"a": NodeProfile("a", 1e-3, 1e7, 1e7, latency_s_per_batch=0.05), "b": node("b"), "s": node("s")}
    a = Assignment({"a": 50, "b": 50}, {"s": 10})
    # a: 5000 samples -> 5 s compute, 50 batches of 0.05 s latency + max(0.1 worker, 0.2 server) s.
    p = predict(JOB, nodes, a)
    assert p.compute_s["a"] == pytest.approx(5.0) and p.comm_s["a"] == pytest.approx(50 * 0.25)
    assert p.comm_s["b"] == pytest.approx(50 * 0.2)
    # Two workers on one core: each computes at half speed.
    shared = dataclasses.replace(JOB, compute_parallelism=1.0)
    assert predict(shared, nodes, a).compute_s["a"] == pytest.approx(10.0)
    c = np.array([1e-3, 1e-3])
    assert epoch_time_arrays(shared, c, np.full(2, 1e7), np.array([50, 50]), np.array([1e7]), np.array([10]),
                             True, np.array([0.05, 0.0])) == pytest.approx(epoch_time(shared, nodes, a))
    with pytest.raises(CostModelError, match="latency"):
        NodeProfile("x", 1e-3, 1.0, 1.0, -1.0)
    with pytest.raises(CostModelError, match="compute_parallelism"):
        JobProfile(10, 1, 1, 1.0, 1, 0.0)


def test_overlap_hides_compute_in_the_servers_term_by_hand():
    nodes = {"a": node("a"), "s": NodeProfile("s", 1e-3, 1e7, 1e6)}
    a = Assignment({"a": 100}, {"s": 10})
    # 10000 samples: 10 s compute, 100 batches; server term 10 * 1e5 / 1e6 = 1 s, worker 0.1 s.
    assert epoch_time(JOB, nodes, a) == pytest.approx(10 + 100 * 1.0)
    overlap = dataclasses.replace(JOB, overlap=True)
    assert epoch_time(overlap, nodes, a) == pytest.approx(max(10 + 100 * 0.1, 100 * 1.0))
    fast = {"a": node("a"), "s": NodeProfile("s", 1e-3, 1e7, 1e8)}     # worker-bound: no change
    assert epoch_time(overlap, fast, a) == pytest.approx(epoch_time(JOB, fast, a))
    assert epoch_time_arrays(overlap, np.array([1e-3]), np.array([1e7]), np.array([100]), np.array([1e6]),
                             np.array([10]), True) == pytest.approx(epoch_time(overlap, nodes, a))
