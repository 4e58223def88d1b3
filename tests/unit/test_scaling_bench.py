"""bench/scaling.py's arithmetic: epoch medians without the first epoch, the ratios between the
variants' medians over repeats, each PS run's objective against its repeat's single process,
failed and saturated runs kept apart."""
from __future__ import annotations

from typing import Any, Optional

import pytest

from bench_module import load_bench

sc = load_bench("scaling")


def run(variant: str, repeat: int, epoch_s: Optional[float], objective: Optional[float] = 1.0,
        comm: Optional[float] = None, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"variant": variant, "repeat": repeat, "epoch_s": epoch_s, "objective": objective, **extra}
    if comm is not None:
        r["comm_share"] = comm
    return r


def test_the_first_epoch_is_left_out_of_the_median() -> None:
    assert sc.median_after_first([9.0, 1.0, 3.0, 2.0]) == 2.0
    assert sc.median_after_first([9.0]) is None and sc.median_after_first([]) is None


def test_ratios_come_from_each_variants_median_over_repeats() -> None:
    runs = [run("single", 0, 1.0), run("ps1", 0, 1.6, comm=0.4), run("ps2", 0, 0.8, comm=0.5),
            run("ps4", 0, 0.5, comm=0.6),
            run("single", 1, 1.2), run("ps1", 1, 1.4, comm=0.5), run("ps2", 1, 0.9, comm=0.5),
            run("ps4", 1, 0.4, comm=0.7),
            run("single", 2, 1.1), run("ps1", 2, 1.5, comm=0.6), run("ps2", 2, 0.7, comm=0.5),
            run("ps4", 2, 0.45, comm=0.8)]
    out = sc.summarise("mlr", runs, [1, 2, 4])
    assert out["epoch_s"] == {"single": 1.1, "ps1": 1.5, "ps2": 0.8, "ps4": 0.45}
    assert out["speedup_2"] == pytest.approx(1.5 / 0.8, abs=1e-3)
    assert out["speedup_4"] == pytest.approx(1.5 / 0.45, abs=1e-3)
    assert out["ps1_over_single"] == pytest.approx(1.5 / 1.1, abs=1e-3)
    assert out["speedup_4_over_single"] == pytest.approx(1.1 / 0.45, abs=1e-3)
    assert out["comm_share"] == {"ps1": 0.5, "ps2": 0.5, "ps4": 0.7}
    assert out["epoch_s_runs"]["ps4"] == [0.5, 0.4, 0.45]


def test_each_ps_objective_is_checked_against_its_own_repeats_single_process() -> None:
    runs = [run("single", 0, 1.0, objective=2.0), run("ps1", 0, 1.0, objective=2.01),
            run("single", 1, 1.0, objective=4.0), run("ps1", 1, 1.0, objective=2.01)]
    out = sc.summarise("nmf", runs, [1])
    assert runs[1]["objective_rel_diff"] == pytest.approx(0.005)
    assert runs[3]["objective_rel_diff"] == pytest.approx(0.4975)     # against 4.0, not 2.0
    assert out["objective_rel_diff_max"] == pytest.approx(0.4975)
    assert out["objectives_within_1pct"] is False
    near = sc.summarise("nmf", runs[:2], [1])
    assert near["objectives_within_1pct"] is True


def test_failed_runs_are_counted_apart_and_give_no_figure() -> None:
    runs = [run("single", 0, 1.0), run("ps1", 0, None, objective=None, error="app FAILED"),
            run("ps2", 0, 0.6, objective=1.0)]
    out = sc.summarise("lasso", runs, [1, 2])
    assert out["failed_runs"] == 1
    assert out["epoch_s"]["ps1"] is None and out["speedup_2"] is None and out["ps1_over_single"] is None
    assert out["objectives_within_1pct"] is True          # the run that finished matched


def test_saturated_runs_are_listed_with_why() -> None:
    runs = {"mlr": [run("single", 0, 1.0, saturated=None),
                    run("ps4", 1, 1.0, saturated="machine 97% busy (limit 90%)")]}
    assert sc.saturated_runs(runs) == ["mlr/ps4/repeat2: machine 97% busy (limit 90%)"]
