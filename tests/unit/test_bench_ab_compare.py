"""bench/ab_compare.py's summary: failed runs (non-zero exit, an `error` in the report) keep no
value in the medians, and a verdict needs two quiet successful runs a side."""
from __future__ import annotations

from typing import Optional

from bench_module import load_bench

ab = load_bench("ab_compare")
FIG = ab.Figure("eps", "bench/eps_overhead.py", (), "eps_add_s")


def run(side: str, value: Optional[float], error: str = "", saturated: bool = False,
        report: Optional[dict[str, object]] = None) -> object:
    return ab.Run(side, "eps", value, 0.0, 0.0, 1.0, saturated, error, report or {})


def test_failed_runs_keep_no_value_in_the_medians() -> None:
    old = [run("old", 1.0), run("old", 1.0)]
    # Two fast runs that exited non-zero or reported an error would pull the median to 1.0.
    new = [run("new", 0.5, error="exit 1: boom"), run("new", 0.5, report={"error": "half-done"}),
           run("new", 1.5), run("new", 1.5)]
    out = ab.summary(FIG, old, new)
    assert out["new_median"] == 1.5 and out["new_over_old"] == 1.5 and out["within_1_1x"] is False
    assert out["new_failed_runs"] == 2 and out["new_quiet_runs"] == 2 and out["old_quiet_runs"] == 2


def test_a_verdict_needs_two_quiet_successful_runs_a_side() -> None:
    old = [run("old", 1.0), run("old", 1.0), run("old", 0.9, saturated=True)]
    new = [run("new", 1.0, error="exit 1: boom"), run("new", 1.0, saturated=True), run("new", 1.05)]
    out = ab.summary(FIG, old, new)
    assert out["within_1_1x"] is None and out["new_median"] == 1.05          # reported, not judged
    assert (out["new_quiet_runs"], out["new_failed_runs"], out["new_saturated_runs"]) == (1, 1, 1)
    assert out["old_saturated_runs"] == 1
    none = ab.summary(FIG, old, [run("new", None, error="no 'eps_add_s' in the last line")])
    assert none["within_1_1x"] is None and none["new_failed_runs"] == 1 and none["new_quiet_runs"] == 0
