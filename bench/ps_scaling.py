"""PS scaling on the multi-host testbed: one job on 1, 2, 4 and 8 hosts of the same CPU budget.

    python bench/ps_scaling.py [--hosts 1,2,4,8] [--host-cpus C] [--epochs 4] [--samples 40000] [--quick]

For each host count N, a fresh testbed cluster (docs/testbed.md) of N node hosts, each with a CPU
budget of `--host-cpus` cores (default: 0.75 of the machine's cores over the largest N, at most 2;
the same for every N, so N hosts have N times the CPU) and a master host without a budget running
the RM and, through the `am` node label, the AM; one MLR job (`--samples` rows, fixed epochs, no
convergence stop) of N workers and N servers placed one worker + one server per host (the spec's
`placement`). Measured: the job's epoch time (the median of its AM-reported epochs after the
first), its throughput (rows per second of training), and `speedup` = throughput over the 1-host
run's in the same run (the baseline), `efficiency` = speedup / N. `machine_cpu_busy`: the share of
the machine's cores busy over each run (elastane_cli/machine_load.py): near 1, the hosts did not
get their budgets and the figure is the machine's, not the system's.

Without the testbed it says why on stderr, prints {"error": ...} and exits 2.
Last line, JSON: {"runs": [{"hosts", "epoch_s", "rows_per_s", "speedup", "efficiency", "jct_s",
"machine_cpu_busy", "machine_load_per_core"}], "host_cpus", "epochs", "samples", "cores"}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from elastane_cli import testbed_hosts  # noqa: E402
from elastane_cli.context import default_user  # noqa: E402
from elastane_cli.machine_load import MachineMeter  # noqa: E402
from elastane_cli.rm_rest_client import RmRestClient  # noqa: E402
from elastane_cli.sim_calibrate import AM_MEMORY_MB, run_job  # noqa: E402
from elastane_cli.testbed_cluster import TestbedCluster  # noqa: E402

EXECUTOR_MB = 512


def job_spec(cluster: TestbedCluster, hosts: int, epochs: int, samples: int) -> dict[str, Any]:
    return {"app": "mlr", "workers": hosts, "servers": hosts, "executor_memory_mb": EXECUTOR_MB,
            "max_epochs": epochs, "convergence_threshold": 1e-12, "heldout_every_epochs": 0,
            "data": {"num_samples": samples, "rows_per_block": max(1, samples // (8 * hosts))},
            "placement": [{"node": cluster.node_id(h), "workers": 1, "servers": 1} for h in cluster.node_names]}


def run_one(hosts: int, host_cpus: float, epochs: int, samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"ps-scaling-{hosts}-") as tmp:
        cluster = TestbedCluster(Path(tmp), workers=hosts, worker_cpus=host_cpus, node_memory_mb=2 * EXECUTOR_MB + 64,
                                 node_vcores=2, nm_expiry_s=60, am_expiry_s=60, am_host=True,
                                 am_host_memory_mb=AM_MEMORY_MB + 128, am_host_vcores=1)
        try:
            cluster.start(timeout_s=180)
            meter = MachineMeter().start()

            async def go() -> Any:
                async with RmRestClient(cluster.rm_url, default_user()) as client:
                    return await run_job(client, job_spec(cluster, hosts, epochs, samples), f"scaling-{hosts}",
                                         t0=asyncio.get_running_loop().time(), timeout_s=900.0)
            run = asyncio.run(go())
            load = meter.stop()
            # every epoch's time from the AM's final status (the polled reports can miss a short run's)
            run.fill_from_status(cluster.final_status(run.app_id))
        finally:
            cluster.stop()
    if run.final_status != "SUCCEEDED" or not run.epoch_wall_s:
        raise RuntimeError(f"the {hosts}-host job ended {run.final_status} with epochs {run.epoch_times}")
    epoch = float(run.epoch_wall_s)
    return {"hosts": hosts, "epoch_s": round(epoch, 3), "rows_per_s": round(samples / epoch, 1),
            "epoch_times": run.epoch_times, "jct_s": run.jct_s, "machine_cpu_busy": round(load.busy_share, 3),
            "machine_load_per_core": round(load.load_per_core, 3)}


def main(argv: Optional[list[str]] = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--hosts", default="1,2,4,8", help="comma-separated host counts (the first is the baseline)")
    p.add_argument("--host-cpus", type=float, default=None)
    p.add_argument("--epochs", type=int, default=None, help="default 4 (--quick: 2)")
    p.add_argument("--samples", type=int, default=None, help="MLR rows (default 40000; --quick: 4000)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 and 2 hosts, 2 epochs of 4000 rows")
    ns = p.parse_args(argv)
    try:
        counts = [int(x) for x in (ns.hosts if not ns.quick or ns.hosts != "1,2,4,8" else "1,2").split(",") if x]
    except ValueError:
        p.error(f"--hosts: comma-separated integers, got {ns.hosts!r}")
    epochs = ns.epochs or (2 if ns.quick else 4)
    samples = ns.samples or (4000 if ns.quick else 40_000)
    cores = os.cpu_count() or 1
    host_cpus = ns.host_cpus or round(min(2.0, 0.75 * cores / max(counts or [1])), 3)
    if not counts or min(counts) < 1 or epochs < 2 or samples < 1 or host_cpus <= 0:
        p.error("--hosts >= 1 each, --epochs >= 2 (the first epoch warms up), --samples and --host-cpus > 0")
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason:
        print(f"ps_scaling: needs the multi-host testbed (docs/testbed.md): {reason}", file=sys.stderr)
        print(json.dumps({"error": f"testbed unavailable: {reason}"}))
        return 2
    runs: list[dict[str, Any]] = []
    for n in counts:
        try:
            runs.append(run_one(n, host_cpus, epochs, samples))
        except Exception as e:  # noqa: BLE001 - one host count failing is reported, the others still run
            runs.append({"hosts": n, "error": f"{type(e).__name__}: {e}"})
        print(f"[ps_scaling] {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    base = runs[0].get("rows_per_s") if runs else None
    for r in runs:
        if base and r.get("rows_per_s"):
            r["speedup"] = round(r["rows_per_s"] / base, 3)
            r["efficiency"] = round(r["speedup"] * counts[0] / r["hosts"], 3)
    ok = [r["machine_cpu_busy"] for r in runs if "machine_cpu_busy" in r]
    print(json.dumps({"runs": runs, "host_cpus": host_cpus, "epochs": epochs, "samples": samples, "cores": cores,
                      "machine_cpu_busy_max": max(ok) if ok else None,
                      "speedup_max_hosts": runs[-1].get("speedup") if runs else None,
                      "median_epoch_s": statistics.median([r["epoch_s"] for r in runs if "epoch_s" in r])
                      if any("epoch_s" in r for r in runs) else None}))
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
