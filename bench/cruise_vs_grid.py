"""Cruise against a grid search of every (W, S) split on the local cluster (dissertation Table 3.4).

    .venv/bin/python bench/cruise_vs_grid.py [--executors 6] [--bandwidth 40mbit] [--keep-dir DIR]

For MLR and NMF with two hyper-parameter settings each (mini-batch sizes), on a LocalCluster of 3
NMs whose executors' links are capped (emulated, so every executor has its own link and the split
matters on one machine):

1. grid search: a job at every split (W, N - W) of N executors with the optimizer off; its epoch
   time is the median of its epochs after the first (the first includes warm-up);
2. Cruise: a job with optimizer "cruise" started from each of the two worst splits; the
   configuration it chose is its final shape, and its epoch time is the grid's epoch time for that
   shape (the true time of the choice), also reported as measured in the Cruise run itself.

relative = chosen epoch time / best epoch time (anchor: Cruise within 6.5%; target 5%).
Solve times of the optimizer for N = 32 and 1,000 simulated nodes come from bench/cruise_solve.py's
setups (anchor 30 ms homogeneous, 37.4 s heterogeneous; target < 10 ms and < 1 s).
Prints a table, then one JSON object as the last line: {"cases": [...], "worst_relative_to_optimum",
"solve_ms_homogeneous_32", "solve_ms_homogeneous_1000", "solve_ms_heterogeneous_32",
"solve_ms_heterogeneous_1000"}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cruise_solve  # noqa: E402  (the solve-time setups of bench/cruise_solve.py)
from support.ps_job_runner import run_ps_job  # noqa: E402  (bench/support: not a benchmark itself)
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from appmaster.cruise.solver_homogeneous import solve_homogeneous_target  # noqa: E402
from appmaster.cruise.solver_milp import solve_milp_target  # noqa: E402
from elastane_cli import ps_commands  # noqa: E402
from elastane_cli.local_cluster import LocalCluster  # noqa: E402

JOB_TIMEOUT_S = 300.0
POLL_S = 0.5
EXECUTOR_MEMORY_MB = 320
AM_MEMORY_MB = 384
# Cruise decides once every worker has run `min_batches` (8) mini-batches. A job's 8 data blocks of
# one mini-batch each (MLR at batch 125) spread over 5 workers leave the least-loaded worker one
# mini-batch per epoch, so a Cruise run needs 8 epochs before it may decide, and a few more to
# execute the plan and train on the new shape.
CRUISE_EPOCHS = 12

# Models of ~0.4-0.8 MB that a mini-batch mostly touches: communication-bound at tens of mbit/s.
WORKLOADS: dict[str, dict[str, Any]] = {
    "mlr-b50": {"app": "mlr", "data": {"num_features": 20_000, "nnz_per_sample": 200, "num_samples": 1000,
                         "rows_per_block": 125},
                "hparams": {"learning_rate": 0.5, "batch_size": 50}},
    "mlr-b125": {"app": "mlr", "data": {"num_features": 20_000, "nnz_per_sample": 200, "num_samples": 1000,
                          "rows_per_block": 125},
                 "hparams": {"learning_rate": 0.5, "batch_size": 125}},
    "nmf-b20": {"app": "nmf", "data": {"num_users": 400, "num_items": 20_000, "observed_fraction": 0.02,
                                       "rank": 8, "rows_per_block": 50},
                "hparams": {"rank": 8, "batch_size": 20}},
    "nmf-b50": {"app": "nmf", "data": {"num_users": 400, "num_items": 20_000, "observed_fraction": 0.02,
                                       "rank": 8, "rows_per_block": 50},
                "hparams": {"rank": 8, "batch_size": 50}},
}


async def run_job(cluster: LocalCluster, job: dict[str, Any], workers: int, servers: int, epochs: int,
                  cruise: bool, name: str) -> dict[str, Any]:
    """Submit one job, wait for it, return its final status (the AM's status.json)."""
    spec = ps_commands.validate_spec({**job, "workers": workers, "servers": servers, "max_epochs": epochs,
                                      "blocks": 12, "executor_memory_mb": EXECUTOR_MEMORY_MB,
                                      "hparams": {**job["hparams"], "convergence_threshold": 1e-9},
                                      "optimizer": "cruise" if cruise else "off",
                                      "cruise": {"min_batches": 8}})
    return await run_ps_job(cluster, spec, name, AM_MEMORY_MB, JOB_TIMEOUT_S, POLL_S)


def steady_epoch_s(status: dict[str, Any], after_time: Optional[float] = None) -> Optional[float]:
    """Median epoch time after the first epoch (or of epochs that started after `after_time`)."""
    hist = status["objective_history"]
    if after_time is not None:
        secs = [h["epoch_time_s"] for h in hist if h["time"] - h["epoch_time_s"] >= after_time]
    else:
        secs = [h["epoch_time_s"] for h in hist[1:]] or [h["epoch_time_s"] for h in hist]
    return statistics.median(secs) if secs else None


def final_shape(status: dict[str, Any]) -> tuple[int, int]:
    cruise = status.get("cruise") or {}
    if cruise.get("shape"):
        return tuple(cruise["shape"])  # type: ignore[return-value]
    return status["spec"]["workers"], status["spec"]["servers"]


def solve_times(runs: int = 7) -> dict[str, float]:
    """The optimizer's solve time (whole target: roles, blocks, price) on bench/cruise_solve.py's setups."""
    out = {}
    for n, job in ((32, cruise_solve.JOB), (1000, cruise_solve.JOB_1000)):
        homo = cruise_solve.slots([(n, cruise_solve.R4_XLARGE)])
        out[f"solve_ms_homogeneous_{n}"] = cruise_solve.median_ms(lambda: solve_homogeneous_target(job, homo), runs)
    for n, job, classes in ((32, cruise_solve.JOB, [(28, cruise_solve.R4_XLARGE), (4, cruise_solve.R4_4XLARGE)]),
                            (1000, cruise_solve.JOB_1000, cruise_solve.CLASSES_1000)):
        het = cruise_solve.slots(classes)
        out[f"solve_ms_heterogeneous_{n}"] = cruise_solve.median_ms(lambda: solve_milp_target(job, het), runs)
    return out


async def bench(cluster: LocalCluster, n: int, names: list[str]) -> list[dict[str, Any]]:
    cases = []
    for name in names:
        job = WORKLOADS[name]
        grid: dict[tuple[int, int], float] = {}
        for w in range(1, n):
            st = await run_job(cluster, job, w, n - w, 3, False, f"grid-{name}-{w}x{n - w}")
            grid[(w, n - w)] = steady_epoch_s(st) or float("inf")
            print(f"  {name} grid {w}x{n - w}: epoch {grid[(w, n - w)]:.3f}s", flush=True)
        best_shape = min(grid, key=grid.__getitem__)
        worst = sorted(grid, key=grid.__getitem__, reverse=True)[:2]
        for start in worst:
            st = await run_job(cluster, job, start[0], start[1], CRUISE_EPOCHS, True, f"cruise-{name}-{start[0]}x{start[1]}")
            chosen = final_shape(st)
            plans = st["cruise"]["plan_history"] if st.get("cruise") else []
            done = [p for p in plans if p.get("finished")]
            measured = steady_epoch_s(st, done[-1]["finished"]) if done else steady_epoch_s(st)
            case = {"workload": name, "app": job["app"], "start": list(start), "chosen": list(chosen),
                    "best": list(best_shape), "best_epoch_s": round(grid[best_shape], 4),
                    "chosen_epoch_s": round(grid.get(tuple(chosen), float("nan")), 4),
                    "measured_epoch_s_in_cruise_run": round(measured, 4) if measured else None,
                    "start_epoch_s": round(grid[start], 4), "plans": len(plans),
                    "plan_errors": [p["error"] for p in plans if p.get("error")],
                    "relative": round(grid.get(tuple(chosen), float("inf")) / grid[best_shape], 4),
                    "grid": {f"{w}x{s}": round(v, 4) for (w, s), v in sorted(grid.items())}}
            cases.append(case)
            print(f"  {name} cruise from {start[0]}x{start[1]}: chose {chosen[0]}x{chosen[1]} "
                  f"({case['chosen_epoch_s']}s) best {best_shape[0]}x{best_shape[1]} ({case['best_epoch_s']}s) "
                  f"relative {case['relative']:.3f}, {len(plans)} plan(s)", flush=True)
    return cases


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--executors", type=int, default=6, help="N: executors of every job (default 6: five (W, S) splits)")
    ap.add_argument("--bandwidth", default="40mbit", help="emulated link of every executor (default 40mbit)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ", ".join(WORKLOADS))
    ap.add_argument("--keep-dir", default=None)
    args = ap.parse_args(argv)
    names = [x for x in args.workloads.split(",") if x]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or args.executors < 2:
        ap.error(f"unknown workloads {unknown}" if unknown else "--executors must be >= 2")
    base = Path(args.keep_dir) if args.keep_dir else Path(tempfile.mkdtemp(prefix="cruise-vs-grid-"))
    cluster = LocalCluster(base, nodes=3, node_memory_mb=2048, node_vcores=4, heartbeat_interval_ms=250,
                           node_bandwidth=args.bandwidth, network="emulated")
    cluster.start(timeout_s=60)
    try:
        cases = asyncio.run(bench(cluster, args.executors, names))
    finally:
        cluster.stop()
    out: dict[str, Any] = {"cases": cases,
                           "worst_relative_to_optimum": max((c["relative"] for c in cases), default=None)}
    out.update({k: round(v, 4) for k, v in solve_times().items()})
    print(f"worst relative to the optimum: {out['worst_relative_to_optimum']} (anchor 1.065, target 1.05); "
          + ", ".join(f"{k} {v}" for k, v in out.items() if k.startswith("solve_ms")))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
