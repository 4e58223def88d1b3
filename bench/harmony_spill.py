"""Harmony's spill (dissertation §4.3.3, Fig. 4.19): fixed disk block ratios against the adaptive one.

    python bench/harmony_spill.py [--samples 360000 --workers 2 --executor-mb 144 --epochs 6] [--keep-dir D]

One local cluster (an RM and 2 NMs as processes, cgroup memory limits where the NMs can use them).
The same MLR job, whose workers' input is about as large as what their memory-tight containers
hold beside the executor itself, runs once per setting, one after the other: `spill_alpha` fixed
at 0, 0.25, 0.5, 0.75 and 1, then "auto" (initial alpha from sampled sizes, hill climbing per clock
between load stalls and memory pressure). Same seed, so every run trains the same trajectory.

Per setting: `iteration_s`, the median epoch time after the first epoch (the AM's epoch times);
`stall_s`, the workers' load stall time in total (from their last status); `peak_rss_mb`, the
largest RSS of any of the job's executors, sampled by the benchmark every 0.2 s from /proc;
`alpha`, the job's mean alpha at its end; `spilled_mb`; `outcome` ("SUCCEEDED", or how it ended, e.g.
killed -104 for exceeding its container's memory: then its times are null).

Last line, JSON: {"fixed": {"0.0": {...}, ...}, "adaptive": {...}, "best_fixed_alpha",
"adaptive_over_best_fixed"}; `adaptive_over_best_fixed` is how much shorter the adaptive run's
iteration time is than the best fixed alpha's that finished ((best - adaptive) / best; the
dissertation's anchor is 0.163 with 8 jobs on 32 machines, where each job gets its own alpha).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from support.watched_job import FINAL, Job, am_log_tail, http, pids_of_app, wait_for  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

FIXED = (0.0, 0.25, 0.5, 0.75, 1.0)


def log(text: str) -> None:
    print(f"[harmony_spill] {text}", file=sys.stderr, flush=True)


def executor_rss_bytes(app_id: str) -> int:
    """The largest RSS among the app's executor processes now."""
    most = 0
    for pid in pids_of_app(app_id):
        try:
            if b"psruntime.executor" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    most = max(most, int(line.split()[1]) * 1024)
        except OSError:
            continue
    return most


def job_spec(ns: argparse.Namespace, alpha: float | str) -> dict[str, Any]:
    return {"app": "mlr", "preset": "tiny", "workers": ns.workers, "servers": 1, "max_epochs": ns.epochs,
            "convergence_threshold": 1e-12, "executor_memory_mb": ns.executor_mb, "heldout_every_epochs": 0,
            "clock_batches": ns.clock_batches, "spill_alpha": alpha,
            "data": {"num_samples": ns.samples, "rows_per_block": ns.rows_per_block, "num_features": 1000,
                     "nnz_per_sample": 50, "num_heldout": 500},
            "hparams": {"batch_size": 1000, "learning_rate": 0.3}}


def run_one(cluster: LocalCluster, ns: argparse.Namespace, alpha: float | str) -> dict[str, Any]:
    job = Job(cluster, job_spec(ns, alpha), f"spill-{alpha}")
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], executor_rss_bytes(job.app_id))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        app = wait_for(lambda: (a := job.app())["state"] in FINAL and a, ns.timeout_s, f"{job.app_id} to end")
    finally:
        done.set()
        sampler.join()
        if job.app()["state"] not in FINAL:
            job.kill()
    wait_for(lambda: not pids_of_app(job.app_id), 60, f"the processes of {job.app_id} to exit")
    out: dict[str, Any] = {"outcome": app["finalStatus"], "peak_rss_mb": round(peak[0] / 2**20, 1),
                           "iteration_s": None, "stall_s": None, "alpha": None, "spilled_mb": None}
    if app["finalStatus"] != "SUCCEEDED":
        out["outcome"] = f"{app['finalStatus']}: {app['diagnostics'][:160]}"
        log(f"alpha {alpha}: {out['outcome']}\n{am_log_tail(cluster, job.app_id, 5)}")
        return out
    final = json.loads((cluster.base_dir / "rm" / "apps" / job.app_id / "status.json").read_text())
    shape = app.get("shape") or {}
    times = [e["epoch_time_s"] for e in final["objective_history"] if e.get("epoch_time_s") is not None]
    steady = sorted(times[1:] or times)
    workers = [e for e in final["shape"]["executors"] if e["role"] == "worker"]
    # The median epoch after the first: the machine may be shared, one slow epoch is noise.
    out.update(iteration_s=round(steady[len(steady) // 2], 3) if steady else None,
               stall_s=round(sum(e.get("spill_stall_s") or 0.0 for e in workers), 3),
               alpha=None if shape.get("alpha") is None else round(shape["alpha"], 3),
               spilled_mb=round(shape.get("spilled_mb") or 0.0, 1),
               epoch_times=[round(t, 2) for t in times],
               objectives=[round(e["objective"], 5) for e in final["objective_history"]])
    log(f"alpha {alpha}: {out}")
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting's runs as one: the run of median iteration time (the lower middle one of an even
    number; a run that did not finish counts as slowest), with every run's iteration time beside it."""
    ranked = sorted(runs, key=lambda r: (r["iteration_s"] is None, r["iteration_s"] or 0.0))
    out = dict(ranked[(len(ranked) - 1) // 2])
    if len(runs) > 1:
        out["iteration_s_runs"] = [r["iteration_s"] for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=360_000, help="MLR training rows (412 bytes each)")
    p.add_argument("--rows-per-block", type=int, default=5000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--executor-mb", type=int, default=144)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--clock-batches", type=int, default=10)
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--keep-dir", type=Path, default=None)
    p.add_argument("--repeats", type=int, default=1,
                   help="run every setting this many times, round robin; each figure is the median")
    p.add_argument("--only", nargs="*", default=None, metavar="ALPHA",
                   help="run only these settings (numbers and/or auto), e.g. to repeat one")
    ns = p.parse_args(argv)
    tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix="harmony-spill-")
    base = ns.keep_dir or Path(tmp.name)  # type: ignore[union-attr]
    cluster = LocalCluster(base, nodes=2, node_memory_mb=ns.workers * ns.executor_mb + 1024, node_vcores=4,
                           heartbeat_interval_ms=250)
    data_mb = ns.samples * 412 / ns.workers / 2**20
    log(f"{ns.workers} workers with {data_mb:.0f} MB of input each in {ns.executor_mb} MB containers")
    results: dict[str, Any] = {"fixed": {}, "adaptive": {}}
    try:
        cluster.start(timeout_s=60)
        http(f"{cluster.rm_url}/ws/v1/cluster/info")
        settings: list[float | str] = [a for a in FIXED if ns.only is None or str(a) in ns.only
                                        or f"{a:g}" in ns.only]
        if ns.only is None or "auto" in ns.only:
            settings.append("auto")
        # Round robin, so a busy spell of a shared machine does not land on one setting's runs only.
        runs: dict[str, list[dict[str, Any]]] = {str(a): [] for a in settings}
        for _ in range(max(1, ns.repeats)):
            for alpha in settings:
                runs[str(alpha)].append(run_one(cluster, ns, alpha))
        for alpha in settings:
            merged = median_run(runs[str(alpha)])
            if alpha == "auto":
                results["adaptive"] = merged
            else:
                results["fixed"][str(alpha)] = merged
    finally:
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()
    finished = {a: r for a, r in results["fixed"].items() if r["iteration_s"]}
    best = min(finished, key=lambda a: finished[a]["iteration_s"]) if finished else None
    adaptive = results["adaptive"].get("iteration_s")
    results["best_fixed_alpha"] = None if best is None else float(best)
    results["adaptive_over_best_fixed"] = (
        round((finished[best]["iteration_s"] - adaptive) / finished[best]["iteration_s"], 3)
        if best is not None and adaptive else None)
    results["setup"] = {"workers": ns.workers, "input_mb_per_worker": round(data_mb, 1),
                        "executor_mb": ns.executor_mb, "epochs": ns.epochs}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
