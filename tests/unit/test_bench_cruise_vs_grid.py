"""bench/cruise_vs_grid.py's arithmetic: a failed grid probe has no time (no inf stand-in), is
counted, and takes no part in the best, the worst splits, the relatives or the correlation."""
from __future__ import annotations

import json

import pytest

from bench_module import load_bench

cg = load_bench("cruise_vs_grid")


GRID = {(1, 4): 2.0, (2, 3): None, (3, 2): 1.0, (4, 1): 3.0}      # 2x3's probe failed


def test_a_failed_probe_is_neither_best_nor_a_worst_start() -> None:
    best, worst, failed = cg.grid_ranking(GRID, starts=2)
    # With inf standing in, 2x3 would be the first (worst) Cruise start.
    assert best == (3, 2) and worst == [(4, 1), (1, 4)] and failed == [(2, 3)]
    assert cg.grid_ranking({(1, 1): None}, starts=1) == (None, [], [(1, 1)])


def test_a_choice_without_a_grid_time_has_no_relative_and_no_part_in_the_worst() -> None:
    assert cg.relative_to_best(GRID, (4, 1), (3, 2)) == pytest.approx(3.0)
    assert cg.relative_to_best(GRID, (2, 3), (3, 2)) is None          # old: inf
    assert cg.relative_to_best(GRID, (5, 0), (3, 2)) is None          # old: inf
    cases = [{"relative": 1.04}, {"relative": None}, {"relative": 1.2}, {}]
    assert cg.worst_relative(cases) == 1.2
    json.dumps({"worst": cg.worst_relative(cases), "rel": cg.relative_to_best(GRID, (2, 3), (3, 2))},
               allow_nan=False)


def test_the_rank_correlation_covers_the_measured_splits_only() -> None:
    predicted = {(1, 4): 2.1, (2, 3): 0.1, (3, 2): 1.1, (4, 1): 3.1}
    assert cg.grid_rank_correlation(predicted, GRID) == pytest.approx(1.0)
