"""bench/queue_reclaim.py --sim's arithmetic: a gain between modes is the median of per-seed ratios
over the seeds that succeeded in both, not a ratio of medians over different seeds."""
from __future__ import annotations

from typing import Optional

import pytest

from bench_module import load_bench
from sim.queue_reclaim_scenario import ReclaimRun

qr = load_bench("queue_reclaim")


def runs(mode: str, b_jcts: list[Optional[float]], a_jct: float = 100.0) -> list[ReclaimRun]:
    return [ReclaimRun(seed, mode, None if b is None else 1.0, b, (a_jct,), 0, 0) for seed, b in enumerate(b_jcts)]


def test_queue_b_gain_pairs_each_seed_with_itself() -> None:
    # none did not finish seeds 0 and 1; on seeds 2-4 shrink is 2x faster on each. Medians over
    # each mode's own seeds (1000 over 50) would claim 20x.
    all_runs = (runs("off", [None, None, 1000.0, 1000.0, 100.0]) + runs("shrink", [50.0, 50.0, 500.0, 500.0, 50.0])
                + runs("kill", [60.0] * 5, a_jct=200.0))
    out = qr.sim_summary(all_runs, ["none", "kill", "shrink"])
    assert out["queue_b_jct_gain_vs_none"] == pytest.approx(2.0)
    assert out["queue_b_jct_gain_vs_none_min"] == pytest.approx(2.0)
    assert out["queue_b_jct_gain_vs_none_max"] == pytest.approx(2.0)
    assert out["queue_b_jct_gain_vs_none_seeds"] == 3
    assert out["failed"] == {"none": 2, "kill": 0, "shrink": 0}
    assert out["queue_a_jct_shrink_over_kill"] == pytest.approx(0.5) and out["queue_a_jct_shrink_over_kill_seeds"] == 5


def test_no_seed_in_both_modes_gives_no_gain() -> None:
    out = qr.sim_summary(runs("off", [None, 10.0]) + runs("shrink", [5.0, None]), ["none", "shrink"])
    assert out["queue_b_jct_gain_vs_none"] is None and out["queue_b_jct_gain_vs_none_seeds"] == 0
    assert out["queue_a_jct_shrink_over_kill"] is None
