"""bench/ps1_overhead.py: PS executors' CPU per host against the single process's share."""
from __future__ import annotations

import json
import os

import pytest

from bench_module import load_bench

ps1_overhead = load_bench("ps1_overhead")


def test_two_hosts_report_cpu_per_host_of_four_executors(capsys: pytest.CaptureFixture[str]) -> None:
    rc = ps1_overhead.main(["--apps", "mlr", "--preset", "tiny", "--epochs", "2", "--repeats", "1",
                            "--hosts", "2", "--sync-batches", "4"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, out
    mlr = out["mlr"]
    assert out["hosts"] == 2 and out["sync_batches"] == 4 and mlr["failed_runs"] == 0
    # Both roles ran (the schedstat clock sees even a server's few ms) and the ratio is their sum
    # per host over half the single process's CPU.
    assert mlr["worker_cpu_s"] > 0 and mlr["server_cpu_s"] > 0 and mlr["batches"] > 0
    run = mlr["runs"][0]
    assert run["ratio"] == pytest.approx((run["worker_cpu_s"] + run["server_cpu_s"]) / (run["single_cpu_s"] / 2),
                                         rel=0.05)


def measured(ratio: float, saturated: object = None, **extra: object) -> dict[str, object]:
    """One run's figures as main records them (every CPU figure scaled with the ratio)."""
    return {"repeat": 0, "ratio": ratio, "single_cpu_s": 1.0, "worker_cpu_s": ratio / 2, "server_cpu_s": ratio / 2,
            "worker_overhead_us": 10.0 * ratio, "server_us": 5.0 * ratio, "sys_share": 0.1, "comp_s": 0.5,
            "clocks": 4.0, "batches": 40, "saturated": saturated, **extra}


def test_saturated_runs_leave_the_medians_while_a_quiet_run_remains() -> None:
    busy = "machine 97% busy"
    out = ps1_overhead.summarise([measured(1.1), measured(2.0, busy), measured(2.2, busy)])
    # Over every run the median would be the saturated 2.0.
    assert out["ps1_cpu_over_single"] == 1.1 and out["worker_cpu_s"] == 0.55
    assert out["quiet_runs"] == 1 and out["from_saturated_runs"] is False
    assert out["ratio_runs"] == [1.1, 2.0, 2.2] and out["failed_runs"] == 0


def test_medians_from_saturated_runs_only_are_flagged_and_failed_runs_counted_apart() -> None:
    busy = "machine 97% busy"
    out = ps1_overhead.summarise([measured(2.0, busy), measured(2.4, busy), {"repeat": 1, "error": "boom",
                                                                            "saturated": None}])
    assert out["ps1_cpu_over_single"] == 2.2 and out["from_saturated_runs"] is True
    assert out["quiet_runs"] == 0 and out["failed_runs"] == 1


def test_proc_cpu_counts_every_thread_of_a_process() -> None:
    before, _ = ps1_overhead.proc_cpu(os.getpid())
    x = 0
    for i in range(200_000):     # some CPU of this thread, which the scheduler's run time counts
        x += i
    after, _ = ps1_overhead.proc_cpu(os.getpid())
    assert after > before and x > 0


@pytest.mark.parametrize("argv, needle", [(["--hosts", "0"], "--hosts"), (["--sync-batches", "0"], "--sync-batches"),
                                          (["--apps", "svm"], "--apps"), (["--epochs", "1"], "--epochs")])
def test_bad_arguments_exit_2_naming_the_flag(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        ps1_overhead.main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err
