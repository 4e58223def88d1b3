"""Each queue's ideal share (rm/policies/queue_shares.py) against hand-computed cases, and its
promises over random clusters: shares within the cluster, none above a queue's maximum, none below
min(guarantee, demand)."""
from __future__ import annotations

import random

import pytest

from protocol.records import ZERO, Resource
from rm.policies.queue_shares import QueueDemand, QueueShare, ideal_shares, owed_to_others, water_fill

TOTAL = Resource(100, 10)


def shares(*queues: QueueDemand, max_ignored_over_capacity: float = 0.1,
           natural_termination_factor: float = 0.2) -> dict[str, QueueShare]:
    return ideal_shares(TOTAL, list(queues), max_ignored_over_capacity=max_ignored_over_capacity,
                        natural_termination_factor=natural_termination_factor)


def test_owner_gets_its_guarantee_back_from_a_borrower() -> None:
    # A grew into the whole cluster; B (50 %) wants half of it.
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(100, 10)),
               QueueDemand("b", 0.5, 1.0, pending=Resource(50, 5)))
    assert s["a"].ideal == Resource(50, 5) and s["b"].ideal == Resource(50, 5)
    assert s["a"].over == Resource(50, 5) and s["b"].owed == Resource(50, 5)
    # YARN's dampening: 0.2 of the 50 over, per round (vcores: ceil(5 x 0.2) = 1).
    assert s["a"].reclaim == Resource(10, 1)
    assert s["b"].reclaim == ZERO


def test_borrower_keeps_what_the_owner_does_not_want() -> None:
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(100, 10)),
               QueueDemand("b", 0.5, 1.0, pending=Resource(20, 2)))
    assert s["b"].ideal == Resource(20, 2) and s["a"].ideal == Resource(80, 8)
    assert s["a"].reclaim == Resource(4, 1)      # ceil(20 x 0.2), ceil(2 x 0.2)


def test_idle_guarantee_goes_to_queues_with_demand_in_proportion() -> None:
    # C (50 %) is idle: A (20 %) and B (30 %) split the whole cluster 2 : 3.
    s = shares(QueueDemand("a", 0.2, 1.0, used=Resource(10, 1), pending=Resource(100, 10)),
               QueueDemand("b", 0.3, 1.0, used=Resource(10, 1), pending=Resource(100, 10)),
               QueueDemand("c", 0.5, 1.0))
    assert s["a"].ideal == Resource(40, 4) and s["b"].ideal == Resource(60, 6) and s["c"].ideal == ZERO


def test_maximum_capacity_is_a_ceiling() -> None:
    s = shares(QueueDemand("a", 0.5, 0.6, used=Resource(50, 5), pending=Resource(100, 10)),
               QueueDemand("b", 0.5, 1.0, pending=Resource(10, 1)))
    assert s["a"].ideal == Resource(60, 6)      # not the 90 left: its maximum is 60 %
    assert s["b"].ideal == Resource(10, 1)


def test_within_the_dead_zone_nothing_is_reclaimed() -> None:
    # A holds 54 of a 50 guarantee: within 1.1 x 50, so it is left alone though B wants more.
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(54, 5)),
               QueueDemand("b", 0.5, 1.0, used=Resource(46, 5), pending=Resource(10, 0)))
    assert s["a"].ideal == Resource(50, 5) and s["a"].reclaim == ZERO
    # Without a dead zone, 0.2 of the 4 MB over is taken (rounded up).
    s0 = shares(QueueDemand("a", 0.5, 1.0, used=Resource(54, 5)),
                QueueDemand("b", 0.5, 1.0, used=Resource(46, 5), pending=Resource(10, 0)),
                max_ignored_over_capacity=0.0)
    assert s0["a"].reclaim == Resource(1, 0)


def test_factor_one_reclaims_everything_over_in_one_round() -> None:
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(100, 10)),
               QueueDemand("b", 0.5, 1.0, pending=Resource(50, 5)), natural_termination_factor=1.0)
    assert s["a"].reclaim == Resource(50, 5)


def test_a_queue_that_opted_out_keeps_what_it_holds() -> None:
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(100, 10), preemptable=False),
               QueueDemand("b", 0.5, 1.0, pending=Resource(50, 5)))
    assert s["a"].ideal == Resource(100, 10) and s["a"].reclaim == ZERO and s["b"].ideal == ZERO


def test_a_queue_below_its_guarantee_without_demand_keeps_its_use() -> None:
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(30, 3)),
               QueueDemand("b", 0.5, 1.0, used=Resource(20, 2), pending=Resource(100, 10)))
    assert s["a"].ideal == Resource(30, 3) and s["b"].ideal == Resource(70, 7)


def test_owed_to_others_sums_the_other_queues_shortfall() -> None:
    s = shares(QueueDemand("a", 0.5, 1.0, used=Resource(100, 10)),
               QueueDemand("b", 0.5, 1.0, pending=Resource(50, 5)))
    assert owed_to_others(s, "a") == Resource(50, 5) and owed_to_others(s, "b") == ZERO


@pytest.mark.parametrize("bad", [{"max_ignored_over_capacity": -0.1}, {"max_ignored_over_capacity": 1.5},
                                 {"natural_termination_factor": 0.0}, {"natural_termination_factor": 1.2}])
def test_out_of_range_settings_are_refused_by_name(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ideal_shares(TOTAL, [QueueDemand("a", 1.0, 1.0)], **bad)


def test_water_fill_is_exact_on_a_linear_piece() -> None:
    assert water_fill(10.0, [1.0, 1.0], [0.0, 0.0], [3.0, 100.0]) == [3.0, 7.0]
    assert water_fill(10.0, [1.0, 3.0], [0.0, 0.0], [100.0, 100.0]) == pytest.approx([2.5, 7.5])


def test_shares_keep_their_promises_on_random_clusters() -> None:
    rng = random.Random(34)
    for _ in range(500):
        total = Resource(rng.randint(0, 5000), rng.randint(0, 64))
        n = rng.randint(1, 5)
        caps = [rng.random() + 0.01 for _ in range(n)]
        scale = rng.uniform(0.3, 1.0) / sum(caps)        # guarantees add up to at most the cluster
        queues = []
        left = total
        for i, c in enumerate(caps):
            cap = c * scale
            used = Resource(rng.randint(0, left.memory), rng.randint(0, left.vcores))
            left = left - used
            queues.append(QueueDemand(f"q{i}", cap, rng.uniform(cap, 1.0), used=used,
                                      pending=Resource(rng.randint(0, 3000), rng.randint(0, 40)),
                                      preemptable=rng.random() > 0.2))
        out = ideal_shares(total, queues, max_ignored_over_capacity=rng.random(),
                           natural_termination_factor=rng.uniform(0.01, 1.0))
        assert sum(s.ideal.memory for s in out.values()) <= total.memory
        assert sum(s.ideal.vcores for s in out.values()) <= total.vcores
        # An opted-out queue over its guarantee keeps room the others' guarantees would need.
        untouchable = {dim: any(not q.preemptable and getattr(q.used, dim) > getattr(out[q.name].guaranteed, dim)
                                for q in queues) for dim in ("memory", "vcores")}
        for q in queues:
            s = out[q.name]
            if q.preemptable:
                assert s.ideal.fits_in(s.maximum)
                for dim in ("memory", "vcores"):
                    if untouchable[dim]:
                        continue
                    want = getattr(q.used, dim) + getattr(q.pending, dim)
                    assert getattr(s.ideal, dim) >= min(getattr(s.guaranteed, dim), want)
            else:
                assert q.used.fits_in(s.ideal) and s.reclaim == ZERO
            assert s.reclaim.fits_in(s.over)
