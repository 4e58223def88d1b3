"""bench/sync_windows.py: W workers in lockstep sync windows against the sequential loop."""
from __future__ import annotations

import json
import pytest

from bench_module import load_bench

sync_windows = load_bench("sync_windows")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert sync_windows.main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_one_worker_in_windows_is_the_sequential_loop_and_two_move_away(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--quick", "--apps", "mlr", "--merge", "sum,avg")
    mlr = out["mlr"]
    assert len(mlr["sequential"]) == 3 and mlr["sequential"][2] < mlr["sequential"][0]     # 2 epochs, it learns
    runs = {(r["workers"], r["sync_batches"], r["merge"]): r for r in mlr["runs"]}
    assert set(runs) == {(w, k, m) for w in (1, 2) for k in (1, 4) for m in ("sum", "avg")}
    for k in (1, 4):
        for m in ("sum", "avg"):       # one worker: averaging divides by 1, windows read their own writes
            assert runs[(1, k, m)]["objectives"] == pytest.approx(mlr["sequential"], rel=1e-5)
            assert runs[(1, k, m)]["final_rel_diff"] < 1e-4
    # Two workers change the trajectory (stale reads across workers); averaging halves each step.
    assert runs[(2, 1, "sum")]["final_rel_diff"] > 0
    assert runs[(2, 1, "avg")]["objectives"][-1] > runs[(2, 1, "sum")]["objectives"][-1]


@pytest.mark.parametrize("argv, needle", [(["--merge", "mean"], "--merge"), (["--workers", "0"], "--workers"),
                                          (["--apps", "svm"], "unknown app"), (["--sync-batches", "x"], "--sync-batches")])
def test_bad_arguments_exit_2_naming_the_flag(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        sync_windows.parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err
