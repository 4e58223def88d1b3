"""Cruise plan execution: how long a reconfiguration takes and how fast it moves state, against
the data plane's own throughput measured in the same run.

    .venv/bin/python bench/cruise_reconfig.py [--bandwidth 100mbit] [--features 2000000] [--keep-dir DIR]

1. A LocalCluster of 3 NMs with emulated per-executor links (--bandwidth) runs an MLR job with
   optimizer "cruise" started at a bad split (4 workers, 1 server); Cruise reconfigures it while
   it trains. From the job status: each plan's execution time and bytes moved (model blocks
   migrated server-to-server, input splits sent worker-to-worker). moved_mb_per_s = bytes moved
   over plan time, summed over the plans.
2. Baseline, same run, same link: one executor process (`python -m psruntime.executor`, with the
   same ELASTANE_NODE_BANDWIDTH_BPS) and this process push and pull 1 MiB blocks through the
   store client (bench/dataplane.py's StoreSide) for --seconds: dataplane_mb_per_s counts bytes
   both ways, as the data plane moves them with nothing else to do.

A plan moves state alongside training (input splits hand over at an epoch boundary, model moves
make their epoch's end wait), so plan time includes waiting for the epoch it overlaps; the ratio
says how much of the data plane's throughput a reconfiguration gets while the job trains.
Prints a summary, then one JSON object as the last line: {"plan_s", "moved_mb_per_s",
"dataplane_mb_per_s", ...}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from dataplane import StoreSide, wait_file  # noqa: E402  (bench/dataplane.py's store round trips)
from support.ps_job_runner import run_ps_job  # noqa: E402  (bench/support: not a benchmark itself)
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from elastane_cli import ps_commands  # noqa: E402
from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from protocol import container_env  # noqa: E402
from protocol.ps_status import PsStatus  # noqa: E402
from psruntime.wire.bandwidth import parse_rate  # noqa: E402
from psruntime.wire.dataplane import DataPlaneClient  # noqa: E402
from psruntime.store.ownership_table import OwnershipTable  # noqa: E402

MB = 1e6
JOB_TIMEOUT_S = 400.0
JOB: dict[str, Any] = {
    # 2M features: the plan moves ~20 MB, so its time is mostly transfer, not the switch-over at a
    # clock boundary (with 40k features it moved 0.8 MB and measured mostly the wait).
    "app": "mlr", "data": {"num_features": 2_000_000, "nnz_per_sample": 200, "num_samples": 1000,
                           "rows_per_block": 125},
    "hparams": {"learning_rate": 0.5, "convergence_threshold": 1e-9}, "workers": 4, "servers": 1,
    "blocks": 12, "max_epochs": 8, "optimizer": "cruise", "cruise": {"min_batches": 4},
    "executor_memory_mb": 320,
}


async def run_cruise_job(cluster: LocalCluster, job: dict[str, Any]) -> PsStatus:
    return await run_ps_job(cluster, ps_commands.validate_spec(job), "bench-cruise-reconfig", 384, JOB_TIMEOUT_S)


def dataplane_throughput(bps: int, seconds: float, workdir: Path) -> float:
    """MB/s of push + pull of 1 MiB blocks between this process and one executor, both paced at `bps`."""
    os.environ[container_env.NODE_BANDWIDTH_BPS] = str(bps)   # this process's data plane: the same link
    ready = workdir / "probe.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "psruntime.executor", "--executor-id", "srv", "--port", "0",
                             "--num-blocks", "16", "--ready-file", str(ready)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = json.loads(wait_file(ready, proc, "the probe executor"))["address"]

        async def go() -> float:
            table = OwnershipTable(16, ["srv"] * 16, {"srv": address}, 1)
            client = DataPlaneClient()
            await client.request(address, {"op": "set_ownership", "table": table.to_wire()})
            await client.close()
            store = StoreSide(address)
            await store.run(1 << 20, 0.5, key=0)                 # warm-up: connection, first put
            gbps, _ = await store.run(1 << 20, seconds, key=0)
            await store.check_exactly_once()
            return gbps * 1e9 / MB
        return asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bandwidth", default="100mbit", help="emulated link of every executor (default 100mbit)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of the data-plane baseline")
    ap.add_argument("--features", type=int, default=JOB["data"]["num_features"],
                    help="MLR features (the model is features x classes floats; more moves more bytes)")
    ap.add_argument("--keep-dir", default=None)
    args = ap.parse_args(argv)
    try:
        bps = parse_rate(args.bandwidth)
    except ValueError as e:
        ap.error(f"--bandwidth: {e}")
    base = Path(args.keep_dir) if args.keep_dir else Path(tempfile.mkdtemp(prefix="cruise-reconfig-"))
    cluster = LocalCluster(base, nodes=3, node_memory_mb=2048, node_vcores=4, heartbeat_interval_ms=250,
                           node_bandwidth=args.bandwidth, network="emulated")
    cluster.start(timeout_s=60)
    try:
        status = asyncio.run(run_cruise_job(cluster, {**JOB, "data": {**JOB["data"], "num_features": args.features}}))
    finally:
        cluster.stop()
    plans = [p for p in (status.cruise.plan_history if status.cruise else []) if p.plan_s]
    if not plans:
        raise SystemExit("Cruise executed no plan: nothing to measure")
    plan_s = sum(p.plan_s or 0.0 for p in plans)
    moved = sum(p.bytes_moved for p in plans)
    dataplane = dataplane_throughput(bps, args.seconds, base)
    for p in plans:
        ops = p.run.ops if p.run else []
        print(f"plan at epoch {p.epoch}: {'x'.join(map(str, p.shape_before))} -> "
              f"{'x'.join(map(str, p.shape_after or []))} in {p.plan_s or 0.0:.2f}s, {len(ops)} ops, "
              f"{p.bytes_moved / MB:.2f} MB moved" + (f", error {p.error}" if p.error else ""))
    out = {"plan_s": round(plan_s / len(plans), 4), "moved_mb_per_s": round(moved / MB / plan_s, 4),
           "dataplane_mb_per_s": round(dataplane, 4), "plans": len(plans),
           "moved_mb": round(moved / MB, 4), "link_mb_per_s": round(bps / 8 / MB, 4),
           "moved_over_dataplane": round(moved / MB / plan_s / dataplane, 4)}
    print(f"{len(plans)} plan(s), {out['plan_s']:.2f}s each on average, moving {out['moved_mb_per_s']:.2f} MB/s; "
          f"the data plane alone: {out['dataplane_mb_per_s']:.2f} MB/s (link {out['link_mb_per_s']:.2f} MB/s each way)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
