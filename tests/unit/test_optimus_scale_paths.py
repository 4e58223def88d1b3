"""Optimus's fast paths at scale give the decisions of the plain ones (issue 38 part 5).

The policy fits thousands of loss curves per round from the lists it keeps (fit_loss_histories:
no per-job arrays, rows fitted in blocks), orients them in one pass, and places jobs on a node
list kept in blocks (SortedKeys). Each is checked here against the plain form it replaces, and the
policy's Decisions over seeded, varied snapshots -- rising and negative objectives, per-clock
points, a non-finite objective, jobs reshaped between rounds (speed samples at two shapes),
max_epochs close -- are the same with the fast paths as with the plain ones, round after round.
"""
from __future__ import annotations

import bisect
import dataclasses
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from models import optimus_fit
from models.optimus_fit import fit_loss_curves, fit_loss_histories, loss_arrays, orientation
from protocol.job_report import ClockObjective, EpochObjective
from rm.policies import ClusterSnapshot, create
from rm.policies import optimus as optimus_policy
from rm.policies import optimus_placement
from rm.policies.optimus_placement import NodeBook, PlacementJob, SortedKeys, even_split, place_jobs
from rm.policies.snapshot import ps_job_view

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from support.synthetic_cluster import synthetic_snapshot  # type: ignore[import-not-found]  # bench/support


def _curves(fits):
    return [None if c is None else dataclasses.astuple(c) for c in fits]


def random_history(rng: np.random.Generator):
    """(initial, epochs, objectives, clock_k, clock_objectives) as the RM keeps them, with the
    cases the fast path must hand to loss_arrays: clock points, repeated epochs, non-finite values."""
    n = int(rng.integers(0, 70))
    start = int(rng.integers(0, 30))
    epochs = list(range(start, start + n))
    if rng.random() < 0.1 and n > 2:
        epochs[n // 2] = epochs[n // 2 - 1]
    b0, b1, b2 = rng.uniform(0.05, 0.5), rng.uniform(0.8, 1.5), rng.uniform(-0.3, 0.2)
    sign = -1.0 if rng.random() < 0.2 else 1.0
    losses = [sign * (1 / (b0 * (e + 1) + b1) + b2) * (1 + rng.normal(0, 0.02)) for e in epochs]
    if rng.random() < 0.05 and n:
        losses[int(rng.integers(0, n))] = float(rng.choice([np.nan, np.inf]))
    initial = None if rng.random() < 0.2 else sign * (1 / b1 + b2)
    clock_k: list[float] = []
    clock_l: list[float] = []
    if rng.random() < 0.3:
        clock_k = sorted(rng.uniform(0, start + n + 1, int(rng.integers(1, 30))).tolist())
        clock_l = [sign * (1 / (b0 * k + b1) + b2) for k in clock_k]
    return initial, epochs, losses, clock_k, clock_l


@pytest.mark.parametrize("seed", range(4))
def test_fitting_the_kept_lists_equals_fitting_each_jobs_loss_arrays(seed):
    rng = np.random.default_rng(seed)
    histories = [random_history(rng) for _ in range(int(rng.integers(1, 1200)))]
    fast = fit_loss_histories(histories)
    plain = fit_loss_curves([loss_arrays(*h) for h in histories])
    assert _curves(fast) == _curves(plain)
    assert sum(c is not None for c in fast) > len(histories) // 2     # most are fitted: the check bites
    assert fit_loss_histories([]) == []
    assert fit_loss_histories([(None, [], [], [], []), (1.0, [], [], [], [])]) == [None, None]
    assert fit_loss_curves([(np.zeros(0), np.zeros(0))]) == [None]


def test_rows_are_oriented_as_each_series_alone():
    rng = np.random.default_rng(3)
    rows = [rng.normal(0, 1, int(rng.integers(1, 12))) * 10 ** rng.uniform(-2, 2) for _ in range(400)]
    rows += [np.array([np.nan, -1.0, np.inf, -3.0]), np.array([np.nan]), np.array([2.0, 2.0]),
             np.array([-1.0, 0.0]), np.array([0.0, 0.0, 0.0])]
    series = [(np.arange(len(r), dtype=float), r) for r in rows]
    k, x, mask, _ = optimus_fit._pad(series)
    signs, offsets = optimus_fit._orientations(x, mask)
    assert list(zip(signs.tolist(), offsets.tolist())) == [orientation(r) for r in rows]


def test_fitting_rows_in_blocks_gives_what_one_block_gives(monkeypatch):
    rng = np.random.default_rng(5)
    histories = [random_history(rng) for _ in range(300)]
    whole = _curves(fit_loss_histories(histories))
    monkeypatch.setattr(optimus_fit, "FIT_BLOCK_ROWS", 7)
    assert _curves(fit_loss_histories(histories)) == whole


@pytest.mark.parametrize("sync", [True, False])
def test_the_one_pass_speed_fit_equals_the_filtered_one(sync):
    """Samples all usable at one shape take fit_speed's one-pass branch; the same samples with an
    unusable one added go through the filter first: the fits must be the same."""
    rng = np.random.default_rng(2)
    for app in ("mlr", "nmf", "lasso", "lda", None):
        prior = optimus_fit.app_prior(app, sync) if app else None
        for _ in range(50):
            p, w = int(rng.integers(1, 5)), int(rng.integers(1, 9))
            samples = [(p, w, float(rng.uniform(0.05, 3.0))) for _ in range(int(rng.integers(1, 17)))]
            weight = optimus_fit.APP_PRIOR_WEIGHT if prior is not None else optimus_fit.PRIOR_WEIGHT
            lean = optimus_fit.fit_speed(samples, sync, 8, 16, prior_weight=weight, prior=prior)
            filtered = optimus_fit.fit_speed([*samples, (p, w, float("nan")), (0, w, 1.0)], sync, 8, 16,
                                             prior_weight=weight, prior=prior)
            assert lean is not None and filtered is not None
            assert dataclasses.astuple(lean) == dataclasses.astuple(filtered)


class PlainKeys:
    """SortedKeys as one sorted Python list (what NodeBook kept before the blocks)."""

    def __init__(self, keys):
        self.keys = sorted(keys)

    def __len__(self):
        return len(self.keys)

    def __iter__(self):
        return iter(self.keys)

    def first(self, count):
        return self.keys[:count]

    def drop_first(self, count):
        del self.keys[:count]

    def insert(self, key):
        bisect.insort(self.keys, key)


def test_sorted_keys_stay_the_sorted_list_through_takes_and_inserts(monkeypatch):
    monkeypatch.setattr(SortedKeys, "BLOCK", 4)
    rng = np.random.default_rng(0)
    start = [(int(-rng.integers(0, 9)), int(-rng.integers(0, 20)), i) for i in range(60)]
    fast, plain = SortedKeys(start), PlainKeys(start)
    for i in range(60, 600):
        op = rng.integers(0, 3)
        if op == 0:
            n = int(rng.integers(0, 6))
            assert fast.first(n) == plain.first(n)
            fast.drop_first(n)
            plain.drop_first(n)
        else:
            key = (int(-rng.integers(0, 9)), int(-rng.integers(0, 20)), i)
            fast.insert(key)
            plain.insert(key)
        assert list(fast) == plain.keys and len(fast) == len(plain)
        assert all(len(b) <= 2 * SortedKeys.BLOCK for b in fast.blocks)
    assert fast.first(len(plain) + 5) == plain.keys


def test_placement_on_blocks_equals_the_one_list_book(monkeypatch):
    rng = np.random.default_rng(1)
    for _ in range(20):
        nodes = int(rng.integers(1, 300))
        mem = rng.integers(0, 16, nodes) * 1024
        vc = rng.integers(0, 9, nodes)
        jobs = [PlacementJob(f"j{i}", int(rng.integers(0, 9)), int(rng.integers(0, 5)), int(rng.choice([1024, 2048])),
                             int(rng.choice([1, 2]))) for i in range(int(rng.integers(1, 120)))]
        names = [f"n{i}" for i in range(nodes)]
        monkeypatch.setattr(SortedKeys, "BLOCK", int(rng.integers(1, 8)))
        fast = place_jobs(NodeBook(names, mem, vc), jobs)
        with monkeypatch.context() as m:
            m.setattr(optimus_placement, "SortedKeys", PlainKeys)
            plain = place_jobs(NodeBook(names, mem, vc), jobs)
        assert fast == plain
        assert any(v for v in fast.values())


@pytest.mark.parametrize("count,k", [(0, 3), (7, 3), (6, 3), (1, 4), (9, 1)])
def test_even_split_is_as_even_as_the_counts_allow_larger_first(count, k):
    split = even_split(count, k)
    assert sum(split) == count and len(split) == k
    assert max(split) - min(split) <= 1 and split == sorted(split, reverse=True)


APPS = ("mlr", "nmf", "lasso", "lda")


def varied_snapshot(jobs: int, nodes: int, seed: int, rnd: int) -> ClusterSnapshot:
    """bench/support/synthetic_cluster's snapshot with every job given one of six kinds (fixed per
    job): plain; a rising negative objective (LDA's); per-clock points; a NaN objective every third
    round; reshaped every other round (samples at two shapes); max_epochs 8 epochs ahead."""
    snap = synthetic_snapshot(jobs, nodes, seed=seed, round=rnd)
    traits = np.random.default_rng(seed * 1000 + 7)
    noise = np.random.default_rng(seed * 1000 + 8 + rnd)
    kinds = traits.integers(0, 6, size=jobs)
    apps = []
    for j, a in enumerate(snap.apps):
        r, spec, kind = a.shape, a.ps, int(kinds[j])
        app = APPS[int(traits.integers(0, 4))]
        assert r is not None and spec is not None and r.epoch is not None
        changes: dict[str, object] = {}
        if kind == 1:
            app = "lda"
            changes["objectives"] = [EpochObjective(o.epoch, -o.objective) for o in r.objectives]
            changes["initial_objective"] = -(r.initial_objective or 0.0)
        elif kind == 2:
            e = r.epoch + 1
            ks = np.sort(noise.uniform(max(0, e - 3), e + 0.9, 12))
            changes["clock_objectives"] = [ClockObjective(int(x * 100), float(x), float(1 / (0.2 * x + 1) + 0.05))
                                           for x in ks]
        elif kind == 3 and rnd % 3 == 1:
            changes["objectives"] = [*r.objectives[:-1], EpochObjective(r.objectives[-1].epoch, float("nan"))]
        elif kind == 4:
            changes.update(workers=r.workers + (rnd // 2) % 2, directive_version=1 + rnd // 2)
        report = msgspec.structs.replace(r, **changes) if changes else r
        ps = ps_job_view({"app": app, "workers": report.workers, "servers": report.servers,
                          "max_workers": max(spec.max_workers, report.workers), "max_servers": spec.max_servers,
                          "executor_memory_mb": spec.executor.memory, "executor_vcores": spec.executor.vcores,
                          "sync": "bsp" if spec.bsp else "ssp", "max_epochs": r.epoch + 8 if kind == 5 else 10_000})
        apps.append(dataclasses.replace(a, shape=report, ps=ps))
    return dataclasses.replace(snap, apps=tuple(apps))


def plain_fit_loss_histories(histories):
    return fit_loss_curves([loss_arrays(*h) for h in histories])


@pytest.mark.parametrize("seed,jobs,nodes", [(0, 150, 600), (1, 300, 250), (2, 60, 40)])
def test_decisions_with_the_fast_paths_are_those_of_the_plain_ones(monkeypatch, seed, jobs, nodes):
    fast, plain = create("optimus"), create("optimus")
    reshaped = 0
    for rnd in range(6):
        snap = varied_snapshot(jobs, nodes, seed, rnd)
        got = fast.decide(snap)
        with monkeypatch.context() as m:
            m.setattr(optimus_policy, "fit_loss_histories", plain_fit_loss_histories)
            m.setattr(optimus_placement, "SortedKeys", PlainKeys)
            want = plain.decide(snap)
        assert got == want, f"round {rnd}"
        reshaped += len(got)
    assert reshaped > jobs          # the rounds reshape jobs: the comparison covers placements
