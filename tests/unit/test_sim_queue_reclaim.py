"""Issue 34's scenario in the simulator (sim/queue_reclaim_scenario.py), five seeds: the RM core's
capacity preemption gives queue B's job its guarantee by shrinking queue A's elastic jobs -- no
kill -- where with preemption off it waits for A's jobs to finish."""
from __future__ import annotations

import pytest

from sim import calibration
from sim.queue_reclaim_scenario import run, summary

SEEDS = range(5)


@pytest.fixture(scope="module")
def runs():  # type: ignore[no-untyped-def]
    cal = calibration.load()
    return {(seed, mode): run(seed, mode, cal) for seed in SEEDS for mode in ("off", "shrink")}


def test_shrink_gives_queue_b_its_guarantee_without_a_kill(runs) -> None:  # type: ignore[no-untyped-def]
    for seed in SEEDS:
        off, shrink = runs[(seed, "off")], runs[(seed, "shrink")]
        assert off.shrunk == off.killed == 0
        assert shrink.killed == 0 and shrink.shrunk > 0, shrink
        assert shrink.b_wait_s is not None and off.b_wait_s is not None
        assert shrink.b_wait_s < off.b_wait_s, (seed, shrink.b_wait_s, off.b_wait_s)
        assert shrink.b_jct_s is not None and all(j is not None for j in shrink.a_jct_s)


def test_the_summary_reports_medians_per_mode(runs) -> None:  # type: ignore[no-untyped-def]
    s = summary(list(runs.values()))
    assert s["unfinished_off"] == s["unfinished_shrink"] == 0.0
    assert s["b_wait_s_shrink"] < s["b_wait_s_off"]
