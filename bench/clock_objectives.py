"""What the PS AM's objective every few clocks costs (appmaster.ps.clock_objectives,
JobReport.clock_objectives): BSP training with the samples on (the default pacing: every 1/8 epoch,
evaluations within 50 % of the training time in the first epoch and 10 % after) against the same
job with them off, in the same run.

    .venv/bin/python bench/clock_objectives.py [--quick] [--apps mlr,nmf,lasso,lda] [--epochs N] [--repeats R]

Per app, a job of 2 workers and 1 server on in-process executors (real executors and data plane
over localhost sockets in this event loop, no RM: the AM's Training parts as the AM builds them),
sized so that an epoch spans several clocks (the pacer's ~0.25 s clocks); `--epochs` epochs per
run, runs alternating on / off, `--repeats` of each (medians). Reported per app: the training time
(the clock loop's `train`, setup excluded) with samples over without, the mid-epoch samples per
epoch, and the evaluations' share of the clocks' time as the pacer counted it. A sample's value is
checked in tests (tests/unit/test_clock_objectives.py), not here.

Prints a summary, then one JSON object as the last line: {"apps": {app: {"time_on_s", "time_off_s",
"overhead", "samples_per_epoch", "eval_share"}}, "clock_objective_overhead_max": the largest
median overhead (time on / time off - 1) over the apps}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from appmaster.container_book import AmContainer
from appmaster.ps.clock_objectives import ClockObjectives
from appmaster.ps.runtime.executor_pool import ExecutorPool, Role
from appmaster.ps.metrics import EpochRecord, JobMetrics
from appmaster.ps.training import Training
from protocol.ps_job_spec import validate
from protocol.records import Resource
from psruntime.apps.registry import create_app
from psruntime.executor import Executor
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.wire.frame_codec import Frame

# Sizes where one epoch of 2 workers spans several ~0.25 s clocks on a development host.
SIZES: dict[str, dict[str, Any]] = {
    "mlr": {"num_samples": 20_000, "rows_per_block": 2_000, "num_features": 400, "nnz_per_sample": 20},
    "nmf": {"num_users": 4_000, "rows_per_block": 400},
    "lasso": {"num_samples": 20_000, "rows_per_block": 2_000},
    "lda": {"num_docs": 2_000, "rows_per_block": 200},
}
ROW_COUNTS = ("num_samples", "num_users", "num_docs")
QUICK_ROWS_DIVISOR = 4


async def run_job(app_name: str, data: dict[str, Any], epochs: int, sampling: bool) -> dict[str, float]:
    spec = validate({"app": app_name, "workers": 2, "servers": 1, "max_epochs": epochs,
                     "convergence_threshold": 1e-12, "data": data})
    app = create_app(spec.app, spec.app_data(), spec.app_hparams())
    pool = ExecutorPool(spec.num_blocks, am_address="127.0.0.1:1")
    client = DataPlaneClient()
    metrics = JobMetrics()
    if not sampling:        # every = 1 epoch: the next mark is always the epoch's end, never mid-epoch
        metrics.clock_objectives = ClockObjectives(every=1.0)
    training = Training.build(spec, app, pool, metrics, client)
    executors: list[Executor] = []
    try:
        for n, role in enumerate([Role.SERVER] + [Role.WORKER] * 2):
            rec = pool.add(role, AmContainer(container_id=f"container_1_0001_01_{n + 2:06d}", node_id="n1:1",
                                             node_http_address="n1:1", resource=Resource(256, 1), token="t"))
            ex = Executor(rec.executor_id, spec.num_blocks, role=role.value)
            executors.append(ex)
            address = await ex.start()
            pool.handle_frame(Frame({"op": "executor_ready", "executor_id": rec.executor_id, "address": address,
                                     "pid": 1}))
        await training.setup(pool.ready(Role.SERVER), pool.ready(Role.WORKER))

        async def on_epoch(rec: EpochRecord) -> None:
            pass
        t0 = time.perf_counter()
        await training.loop.train(on_epoch)
        seconds = time.perf_counter() - t0
        c = metrics.clock_objectives
        return {"seconds": seconds, "samples_per_epoch": c.evaluations / max(1, training.loop.epochs_done),
                "eval_share": c.eval_s / c.train_s if c.train_s > 0 else 0.0,
                "clocks_per_epoch": training.loop.clocks_done / max(1, training.loop.epochs_done)}
    finally:
        if training.placement.placed:
            await training.placement.controller.close()
        await client.close()
        for ex in executors:
            await ex.stop()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller data, 2 epochs, 1 repeat")
    p.add_argument("--apps", default="mlr,nmf,lasso,lda")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    epochs, repeats = (2, 1) if args.quick else (args.epochs, args.repeats)
    out: dict[str, Any] = {"apps": {}}
    for app_name in args.apps.split(","):
        data = dict(SIZES[app_name])
        if args.quick:      # a quarter of the rows (and blocks)
            data = {k: v // QUICK_ROWS_DIVISOR if k in ROW_COUNTS else v for k, v in data.items()}
        on: list[dict[str, float]] = []
        off: list[dict[str, float]] = []
        for _ in range(repeats):
            on.append(await run_job(app_name, data, epochs, True))
            off.append(await run_job(app_name, data, epochs, False))
        t_on = statistics.median(r["seconds"] for r in on)
        t_off = statistics.median(r["seconds"] for r in off)
        row = {"time_on_s": round(t_on, 3), "time_off_s": round(t_off, 3), "overhead": round(t_on / t_off - 1, 4),
               "samples_per_epoch": round(statistics.median(r["samples_per_epoch"] for r in on), 2),
               "eval_share": round(statistics.median(r["eval_share"] for r in on), 4),
               "clocks_per_epoch": round(statistics.median(r["clocks_per_epoch"] for r in on), 1)}
        out["apps"][app_name] = row
        print(f"{app_name}: {row}", flush=True)
    out["clock_objective_overhead_max"] = max(r["overhead"] for r in out["apps"].values())
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
