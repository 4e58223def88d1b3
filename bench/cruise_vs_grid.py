"""Cruise against a grid search of every (W, S) split on the local cluster (dissertation Table 3.4).

    .venv/bin/python bench/cruise_vs_grid.py [--executors 6] [--bandwidth 40mbit] [--workloads a,b]
                                             [--starts 1] [--grid-only] [--keep-dir DIR]

Workloads (WORKLOADS): MLR and NMF at several mini-batch sizes, model sizes and link caps, chosen
so the grid's best split ranges from W > S to W < S; on a LocalCluster of 3 NMs (one per link cap a
workload asks for) whose executors' links are capped (emulated, so every executor has its own link
and the split matters on one machine). `--executors 12` is the 16-core host's run (each workload's
data grows so every worker of every split has input blocks).

1. grid search: a job at every split (W, N - W) of N executors; its epoch time is the median of
   its epochs after the first (the first includes warm-up). It runs the optimizer with a gain
   threshold no plan reaches, so it never reconfigures but prices its own split every epoch: the
   cost model's inputs as measured at that split and its predicted epoch time (`probes`);
2. Cruise: a job with optimizer "cruise" started from each of the `--starts` worst splits; the
   configuration it chose is its final shape, and its epoch time is the grid's epoch time for that
   shape (the true time of the choice), also reported as measured in the Cruise run itself. Its
   first decision's inputs give the model's predicted epoch time of every split (`predicted`) and
   the rank (Spearman) correlation of those predictions with the grid.

relative = chosen epoch time / best epoch time (anchor: Cruise within 6.5%; target 5%).
Solve times of the optimizer for N = 32 and 1,000 simulated nodes come from bench/cruise_solve.py's
setups (anchor 30 ms homogeneous, 37.4 s heterogeneous; target < 10 ms and < 1 s).
A grid probe that failed (no epoch time) has a null time, is counted (`failed_probes`, per case and
over the workloads; `failed_splits`) and takes no part in the best, the worst splits or the rank
correlation; a case whose chosen split has no grid time has a null `relative`
(`cases_without_relative`) and no part in `worst_relative_to_optimum`.
Prints a table, then one JSON object as the last line: {"cases": [...], "worst_relative_to_optimum",
"failed_probes", "cases_without_relative",
"rank_correlation" (the lowest over the cases), "rank_correlation_mean", "host_cores", "executors",
"solve_ms_homogeneous_32", "solve_ms_homogeneous_1000", "solve_ms_heterogeneous_32",
"solve_ms_heterogeneous_1000"}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cruise_solve  # noqa: E402  (the solve-time setups of bench/cruise_solve.py)
from support.ps_job_runner import run_ps_job  # noqa: E402  (bench/support: not a benchmark itself)
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from appmaster.cruise.solver_homogeneous import mean_profile, solve_homogeneous_target  # noqa: E402
from appmaster.cruise.solver_milp import solve_milp_target  # noqa: E402
from appmaster.cruise.targets import Slot, build_target  # noqa: E402
from elastane_cli import ps_commands  # noqa: E402
from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from protocol.ps_status import PsStatus  # noqa: E402
from models.cruise_cost import model_inputs_from_json  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

JOB_TIMEOUT_S = 300.0
POLL_S = 0.5
EXECUTOR_MEMORY_MB = 320
AM_MEMORY_MB = 384
# Cruise decides once every worker has run `min_batches` (8) mini-batches. A job's 8 data blocks of
# one mini-batch each (MLR at batch 125) spread over 5 workers leave the least-loaded worker one
# mini-batch per epoch, so a Cruise run needs 8 epochs before it may decide, and a few more to
# execute the plan and train on the new shape.
CRUISE_EPOCHS = 12
GRID_EPOCHS = 3

# Models of ~0.4-0.8 MB that a mini-batch mostly touches: communication-bound at tens of mbit/s.
# Beside the four of issue 13: nmf-b10 (small mini-batches, 5 model blocks), nmf-r32-b20 (rank 32:
# compute-heavy, a smaller model, a 200mbit link) and nmf-b5; on 2 shared cores their grids' best
# moved between 4x2, 3x3 and 2x4 from run to run (docs/cruise.md).
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
    "nmf-b10": {"app": "nmf", "data": {"num_users": 400, "num_items": 20_000, "observed_fraction": 0.02,
                                      "rank": 8, "rows_per_block": 50},
               "hparams": {"rank": 8, "batch_size": 10}, "blocks": 5},
    # Not in the default run: the emulated link lets its small frames (< 16 KiB a model block) through
    # unpaced, so the servers' term is overpriced and the model misses its best split (docs/cruise.md).
    "nmf-b5": {"app": "nmf", "data": {"num_users": 400, "num_items": 20_000, "observed_fraction": 0.02,
                                      "rank": 8, "rows_per_block": 50},
               "hparams": {"rank": 8, "batch_size": 5}},
    "nmf-r32-b20": {"app": "nmf", "data": {"num_users": 400, "num_items": 5_000, "observed_fraction": 0.05,
                                           "rank": 32, "rows_per_block": 50},
                    "hparams": {"rank": 32, "batch_size": 20}, "bandwidth": "200mbit"},
}

DEFAULT_WORKLOADS = [x for x in WORKLOADS if x != "nmf-b5"]


async def run_job(cluster: LocalCluster, job: dict[str, Any], workers: int, servers: int, epochs: int,
                  cruise: bool, name: str) -> PsStatus:
    """Submit one job, wait for it, return its final status (the AM's status.json).

    A grid job (`cruise` False) runs the optimizer too, but with a gain threshold no plan reaches:
    it measures and prices its own split every epoch and never reconfigures, so its decisions
    carry the cost model's inputs as measured at that split."""
    opts = {"min_batches": 8} if cruise else {"min_batches": 1, "gain_threshold": 0.99}
    spec = ps_commands.validate_spec({**job, "workers": workers, "servers": servers, "max_epochs": epochs,
                                      "blocks": job.get("blocks", 12), "executor_memory_mb": EXECUTOR_MEMORY_MB,
                                      "hparams": {**job["hparams"], "convergence_threshold": 1e-9},
                                      "optimizer": "cruise", "cruise": opts})
    return await run_ps_job(cluster, spec, name, AM_MEMORY_MB, JOB_TIMEOUT_S, POLL_S)


def steady_epoch_s(status: PsStatus, after_time: Optional[float] = None) -> Optional[float]:
    """Median epoch time after the first epoch (or of epochs that started after `after_time`)."""
    hist = status.objective_history
    if after_time is not None:
        secs = [h.epoch_time_s for h in hist if h.time - h.epoch_time_s >= after_time]
    else:
        secs = [h.epoch_time_s for h in hist[1:]] or [h.epoch_time_s for h in hist]
    return statistics.median(secs) if secs else None


def final_shape(status: PsStatus) -> tuple[int, int]:
    if status.cruise is not None and len(status.cruise.shape) == 2:
        return status.cruise.shape[0], status.cruise.shape[1]
    if status.spec is None:
        raise RuntimeError(f"{status.application_id}: the final status has no spec")
    return status.spec.workers, status.spec.servers


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


def model_inputs(status: PsStatus) -> Optional[dict[str, Any]]:
    """The cost model's inputs of the job's last priced decision (None if it priced none)."""
    decisions = status.cruise.decisions if status.cruise else []
    priced = [d["inputs"] for d in decisions if d.get("inputs")]
    return priced[-1] if priced else None


def predict_splits(inputs: dict[str, Any], n: int) -> dict[tuple[int, int], float]:
    """Predicted epoch time of every split (W, n - W) from one set of measured model inputs, as the
    optimizer prices it (blocks split optimally, ceil(d_i / B) mini-batches)."""
    job, nodes = model_inputs_from_json(inputs)
    node = mean_profile(list(nodes.values()))
    slots = [Slot(replace(node, node_id=f"n{i}")) for i in range(n)]
    return {(w, n - w): build_target(job, slots, [f"n{i}" for i in range(w)]).epoch_s for w in range(1, n)}


def spearman(a: list[float], b: list[float]) -> Optional[float]:
    """Rank correlation of two equally long series (None when either is constant)."""
    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b)[0])


def sized(job: dict[str, Any], n: int) -> dict[str, Any]:
    """The workload for N executors: 8 input blocks per 5 workers (so every worker of every split
    has a block), the rows of a block kept, and a model block for every server of every split."""
    k = -(-(n - 1) // 5)
    data = dict(job["data"])
    rows = "num_samples" if job["app"] == "mlr" else "num_users"
    data[rows] = data[rows] * k
    sized_job = {key: v for key, v in job.items() if key != "bandwidth"}
    return {**sized_job, "data": data, "blocks": max(job.get("blocks", 12), n - 1)}


Split = tuple[int, int]


def grid_ranking(grid: dict[Split, Optional[float]], starts: int) -> tuple[Optional[Split], list[Split], list[Split]]:
    """(the fastest measured split, the `starts` slowest measured ones, the failed ones: no epoch
    time). A failed probe takes no part in best or worst: no stand-in time is given it."""
    measured = {k: v for k, v in grid.items() if v is not None}
    failed = sorted(k for k, v in grid.items() if v is None)
    if not measured:
        return None, [], failed
    best = min(measured, key=measured.__getitem__)
    return best, sorted(measured, key=measured.__getitem__, reverse=True)[:starts], failed


def relative_to_best(grid: dict[Split, Optional[float]], chosen: Split, best: Split) -> Optional[float]:
    """The chosen split's grid epoch time over the best's; None when the chosen split has none
    (its probe failed, or it is not in the grid)."""
    t, b = grid.get(chosen), grid.get(best)
    return None if t is None or b is None or b <= 0 else round(t / b, 4)


def grid_rank_correlation(predicted: dict[Split, float], grid: dict[Split, Optional[float]]) -> Optional[float]:
    """Spearman of the predictions against the grid over the splits measured in both."""
    keys = sorted(k for k in predicted if grid.get(k) is not None)
    return spearman([predicted[k] for k in keys], [float(grid[k] or 0.0) for k in keys])


def worst_relative(cases: list[dict[str, Any]]) -> Optional[float]:
    """The largest `relative` over the cases that have one (a case without is counted apart)."""
    return max((c["relative"] for c in cases if c.get("relative") is not None), default=None)


def _r4(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 4)


def _fmt(x: Optional[float]) -> str:
    return "failed" if x is None else f"{x:.3f}"


async def bench(cluster: LocalCluster, n: int, names: list[str], grid_only: bool = False,
                starts: int = 1) -> list[dict[str, Any]]:
    cases = []
    for name in names:
        job = sized(WORKLOADS[name], n)
        grid: dict[Split, Optional[float]] = {}
        probes: dict[Split, dict[str, Any]] = {}
        for w in range(1, n):
            st = await run_job(cluster, job, w, n - w, GRID_EPOCHS, False, f"grid-{name}-{w}x{n - w}")
            grid[(w, n - w)] = steady_epoch_s(st)      # None: the probe failed (counted, never a stand-in)
            inputs = model_inputs(st)
            own = predict_splits(inputs, n)[(w, n - w)] if inputs else None
            probes[(w, n - w)] = {"measured_epoch_s": _r4(grid[(w, n - w)]),
                                  "predicted_epoch_s": round(own, 4) if own else None,
                                  "inputs": inputs, "metrics": st.cruise.metrics if st.cruise else None}
            print(f"  {name} grid {w}x{n - w}: epoch {_fmt(grid[(w, n - w)])}s predicted "
                  f"{own if own is None else round(own, 3)}s", flush=True)
        best_shape, worst, failed = grid_ranking(grid, starts)
        splits = sorted(grid)
        common = {"workload": name, "app": job["app"], "bandwidth": WORKLOADS[name].get("bandwidth"),
                  "best": list(best_shape) if best_shape else None,
                  "best_epoch_s": _r4(grid[best_shape]) if best_shape else None,
                  "grid": {f"{w}x{s}": _r4(v) for (w, s), v in sorted(grid.items())},
                  "failed_probes": len(failed), "failed_splits": [f"{w}x{s}" for w, s in failed],
                  "probes": {f"{w}x{s}": p for (w, s), p in sorted(probes.items())}}
        if best_shape is None:
            # Every probe failed: nothing to rank or start from.
            cases.append({**common, "relative": None})
            print(f"  {name}: every grid probe failed", flush=True)
            continue
        if grid_only:
            # The model's ranking as a Cruise run from the worst split would see it.
            inputs = probes[worst[0]]["inputs"]
            predicted = predict_splits(inputs, n) if inputs else {}
            case = {**common, "start": list(worst[0]),
                    "predicted": {f"{w}x{s}": round(v, 4) for (w, s), v in sorted(predicted.items())},
                    "rank_correlation": grid_rank_correlation(predicted, grid) if predicted else None}
            if predicted:
                chosen = min(predicted, key=predicted.__getitem__)
                case.update({"predicted_best": list(chosen), "relative": relative_to_best(grid, chosen, best_shape)})
            cases.append(case)
            print(f"  {name}: best {best_shape[0]}x{best_shape[1]}, model from {worst[0][0]}x{worst[0][1]} picks "
                  f"{case.get('predicted_best')} relative {case.get('relative')}, rank correlation "
                  f"{case['rank_correlation']}", flush=True)
            continue
        predicted = {}
        for start in worst:
            st = await run_job(cluster, job, start[0], start[1], CRUISE_EPOCHS, True,
                               f"cruise-{name}-{start[0]}x{start[1]}")
            chosen = final_shape(st)
            plans = st.cruise.plan_history if st.cruise else []
            done = [p.finished for p in plans if p.finished]
            measured = steady_epoch_s(st, done[-1]) if done else steady_epoch_s(st)
            # What Cruise predicted for every split, from the inputs it first decided on.
            decided = [d for d in (st.cruise.decisions if st.cruise else []) if d.get("inputs")]
            predicted = predict_splits(decided[0]["inputs"], n) if decided else {}
            case = {**common, "start": list(start), "chosen": list(chosen),
                    "chosen_epoch_s": _r4(grid.get(chosen)),
                    "measured_epoch_s_in_cruise_run": round(measured, 4) if measured else None,
                    "start_epoch_s": _r4(grid[start]), "plans": len(plans),
                    "plan_errors": [p.error for p in plans if p.error],
                    "relative": relative_to_best(grid, chosen, best_shape),
                    "predicted": {f"{w}x{s}": round(v, 4) for (w, s), v in sorted(predicted.items())},
                    "rank_correlation": grid_rank_correlation(predicted, grid) if predicted else None,
                    "inputs": decided[0]["inputs"] if decided else None}
            if start != worst[0]:
                del case["probes"]          # once per workload
            cases.append(case)
            print(f"  {name} cruise from {start[0]}x{start[1]}: chose {chosen[0]}x{chosen[1]} "
                  f"({case['chosen_epoch_s']}s) best {best_shape[0]}x{best_shape[1]} ({case['best_epoch_s']}s) "
                  f"relative {case['relative']}, {len(plans)} plan(s), rank correlation "
                  f"{case['rank_correlation']}", flush=True)
        print("    predicted " + " / ".join(_fmt(predicted.get(k)) for k in splits)
              + "\n    measured  " + " / ".join(_fmt(grid[k]) for k in splits), flush=True)
    return cases


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--executors", type=int, default=6, help="N: executors of every job (default 6: five (W, S) splits)")
    ap.add_argument("--bandwidth", default="40mbit", help="emulated link of every executor (default 40mbit)")
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                    help="comma-separated subset of " + ", ".join(WORKLOADS) + " (default: all but nmf-b5)")
    ap.add_argument("--keep-dir", default=None)
    ap.add_argument("--grid-only", action="store_true", help="only the grid and the model's predictions, no Cruise runs")
    ap.add_argument("--starts", type=int, default=1, help="Cruise runs per workload, from the worst splits (default 1)")
    args = ap.parse_args(argv)
    names = [x for x in args.workloads.split(",") if x]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown or args.executors < 2:
        ap.error(f"unknown workloads {unknown}" if unknown else "--executors must be >= 2")
    base = Path(args.keep_dir) if args.keep_dir else Path(tempfile.mkdtemp(prefix="cruise-vs-grid-"))
    n = args.executors
    # Room for N executors and the AM on 3 nodes; a cluster per link cap the workloads ask for.
    vcores = -(-(n + 1) // 3) + 1
    cases: list[dict[str, Any]] = []
    for bandwidth in dict.fromkeys(WORKLOADS[x].get("bandwidth", args.bandwidth) for x in names):
        group = [x for x in names if WORKLOADS[x].get("bandwidth", args.bandwidth) == bandwidth]
        cluster = LocalCluster(base / bandwidth, nodes=3, node_memory_mb=max(2048, vcores * 400), node_vcores=vcores,
                               heartbeat_interval_ms=250, node_bandwidth=bandwidth, network="emulated")
        cluster.start(timeout_s=60)
        try:
            cases += asyncio.run(bench(cluster, n, group, args.grid_only, args.starts))
        finally:
            cluster.stop()
    rhos = [c["rank_correlation"] for c in cases if c.get("rank_correlation") is not None]
    out: dict[str, Any] = {"cases": cases,
                           "worst_relative_to_optimum": worst_relative(cases),
                           # counted apart: a failed probe or a choice without a grid time gives no relative
                           "failed_probes": sum({c["workload"]: c["failed_probes"] for c in cases}.values()),
                           "cases_without_relative": sum(1 for c in cases if c.get("relative") is None),
                           "rank_correlation": round(min(rhos), 4) if rhos else None,
                           "rank_correlation_mean": round(statistics.mean(rhos), 4) if rhos else None,
                           "host_cores": os.cpu_count(), "executors": n}
    out.update({k: round(v, 4) for k, v in solve_times().items()})
    print(f"worst relative to the optimum: {out['worst_relative_to_optimum']} (anchor 1.065, target 1.05); "
          + ", ".join(f"{k} {v}" for k, v in out.items() if k.startswith("solve_ms")))
    print(json.dumps(out, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
