"""bench/scaling.py's arithmetic: epoch medians without the first epoch, the ratios between the
variants' medians over repeats (8 hosts' keys only when measured), each PS run's objective against
its repeat's single process, failed and saturated runs kept apart; its options checked before a
cluster starts."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from bench_module import load_bench

ROOT = Path(__file__).resolve().parents[2]
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


def test_other_host_counts_get_their_keys_only_when_measured() -> None:
    runs = [run("single", 0, 1.0), run("ps1", 0, 1.6), run("ps2", 0, 0.8), run("ps4", 0, 0.5), run("ps8", 0, 0.4)]
    out = sc.summarise("mlr", runs, [1, 2, 4, 8], rows=48_000)
    assert out["speedup_8"] == pytest.approx(4.0) and out["speedup_8_over_single"] == pytest.approx(2.5)
    assert out["efficiency"] == {"ps2": 1.0, "ps4": 0.8, "ps8": 0.5}
    assert out["rows_per_s"]["ps8"] == pytest.approx(120_000.0) and out["rows_per_s"]["single"] == 48_000.0
    issue_38 = sc.summarise("mlr", runs[:4], [1, 2, 4])
    assert "speedup_8" not in issue_38 and "speedup_8_over_single" not in issue_38
    assert issue_38["rows_per_s"]["ps4"] is None             # no row count given
    only_two = sc.summarise("mlr", runs[:3], [1, 2])
    assert only_two["speedup_4"] is None and only_two["speedup_4_over_single"] is None   # issue 38's keys stay


def test_samples_set_each_apps_input_rows_and_a_job_with_too_few_blocks_is_refused() -> None:
    ns = argparse.Namespace(preset="small", epochs=3, samples=48_000)
    assert sc.data_overrides("nmf", 48_000) == {"num_users": 48_000} and sc.data_overrides("mlr", None) == {}
    assert sc.input_rows("mlr", 8, ns) == 48_000
    assert sc.input_rows("lasso", 4, argparse.Namespace(preset="small", epochs=3, samples=None)) == 50_000
    with pytest.raises(ValueError, match="input blocks"):
        sc.input_rows("mlr", 8, argparse.Namespace(preset="small", epochs=3, samples=4000))   # 2 blocks


def test_each_sync_batches_value_gets_its_own_figures_against_the_same_single_process() -> None:
    runs = [run("single", 0, 1.0, objective=2.0),
            run("ps1", 0, 2.0, sync_batches=1), run("ps4", 0, 1.0, sync_batches=1),
            run("ps1", 0, 1.1, objective=2.01, sync_batches=32), run("ps4", 0, 0.3, objective=2.01, sync_batches=32),
            {"variant": "ps4", "repeat": 0, "sync_batches": 32, "error": "ended FAILED"}]
    out = sc.summarise_by_sync("mlr", runs, [1, 4], [1, 32])
    assert out["sync_batches"] == 32
    assert out["ps1_over_single"] == pytest.approx(1.1) and out["speedup_4"] == pytest.approx(1.1 / 0.3, abs=1e-3)
    one = out["by_sync_batches"]["1"]
    assert one["ps1_over_single"] == pytest.approx(2.0) and one["speedup_4"] == pytest.approx(2.0)
    assert one["failed_runs"] == 0 and out["by_sync_batches"]["32"]["failed_runs"] == 1
    assert out["failed_runs"] == 1 and len(out["runs"]) == len(runs)
    assert out["objective_rel_diff_max"] == pytest.approx(0.005, abs=1e-6)
    assert sc.saturated_runs({"mlr": [{**runs[4], "saturated": "busy 0.95"}]}) == ["mlr/ps4@32/repeat1: busy 0.95"]


def test_singles_at_once_are_a_diagnostic_beside_the_ratios_not_a_baseline_or_a_ps_run() -> None:
    runs = [run("single", 0, 1.0, objective=2.0), run(sc.AT_ONCE, 0, 1.2, objective=2.0),
            run("ps1", 0, 1.1, objective=2.0, sync_batches=32), run("ps4", 0, 0.4, objective=2.0, sync_batches=32),
            run("single", 1, 1.0, objective=2.0), run(sc.AT_ONCE, 1, 1.1, objective=2.0),
            run("ps1", 0, 1.1, objective=2.0, sync_batches=1), run("ps4", 0, 0.5, objective=2.0, sync_batches=1)]
    out = sc.summarise_by_sync("mlr", runs, [1, 4], [1, 32])
    # The median of the singles run on every host at once over the lone single's median.
    assert out["single_at_once_4"] == pytest.approx(1.15, abs=1e-3)
    assert out["by_sync_batches"]["1"]["single_at_once_4"] == pytest.approx(1.15, abs=1e-3)
    assert out["epoch_s_runs"][sc.AT_ONCE] == [1.2, 1.1]
    # The ratios stay against the lone single process, and no objective check counts the diagnostic.
    assert out["speedup_4_over_single"] == pytest.approx(1.0 / 0.4) and out["epoch_s"]["single"] == 1.0
    assert "objective_rel_diff" not in runs[1] and out["comm_share"] == {"ps1": None, "ps4": None}
    alone = sc.summarise("mlr", [run("single", 0, 1.0), run("ps1", 0, 1.2)], [1])
    assert not any(k.startswith("single_at_once") for k in alone)


def test_bad_options_are_refused_before_any_cluster_starts() -> None:
    for argv, what in ((["--sync-batches", "0"], "--sync-batches"), (["--sync-batches", "4,4"], "distinct"),
                       (["--samples", "0"], "--samples"), (["--hosts", "2,4"], "must include 1"),
                       (["--apps", "mlr,lda"], "unknown app 'lda'"),
                       (["--apps", "mlr", "--hosts", "1,16", "--quick"], "16 workers")):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "scaling.py"), *argv], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and what in r.stderr, (argv, r.stderr[-500:])
        assert "[scaling]" not in r.stderr                     # nothing ran


def test_saturated_runs_leave_the_medians_while_a_quiet_run_remains() -> None:
    busy = "machine 97% busy (limit 90%)"
    runs = [run("single", 0, 1.0), run("single", 1, 3.0, saturated=busy), run("single", 2, 3.2, saturated=busy),
            run("ps1", 0, 1.2, comm=0.4), run("ps1", 1, 4.0, comm=0.9, saturated=busy),
            run("ps1", 2, 4.2, comm=0.9, saturated=busy)]
    out = sc.summarise("mlr", runs, [1])
    # Over every run the medians would be 3.0 and 4.0, the saturated machine's figures.
    assert out["epoch_s"] == {"single": 1.0, "ps1": 1.2} and out["comm_share"] == {"ps1": 0.4}
    assert out["ps1_over_single"] == pytest.approx(1.2) and out["from_saturated_runs"] == []
    assert out["epoch_s_runs"]["single"] == [1.0, 3.0, 3.2]          # every run still listed


def test_a_figure_with_only_saturated_runs_says_so() -> None:
    busy = "machine 97% busy (limit 90%)"
    runs = [run("single", 0, 1.0), run("ps1", 0, None, objective=None, error="app FAILED"),
            run("ps1", 1, 4.0, comm=0.9, saturated=busy), run("ps2", 0, 1.0, saturated=busy)]
    out = sc.summarise("mlr", runs, [1, 2])
    assert out["epoch_s"] == {"single": 1.0, "ps1": 4.0, "ps2": 1.0}
    assert out["from_saturated_runs"] == ["epoch_s.ps1", "epoch_s.ps2", "comm_share.ps1"]
    top = sc.summarise_by_sync("mlr", [{**r, "sync_batches": 32} if r["variant"] != "single" else r for r in runs],
                               [1, 2], [32])
    assert top["from_saturated_runs"] == out["from_saturated_runs"]
