"""Harmony's co-location experiment (dissertation §4.4.3, Fig. 4.10-4.12), small: a mixed workload
of PS jobs on one local cluster under three ways of sharing it, in the same run.

    python bench/harmony_colocation.py [--jobs 8] [--nodes 4] [--epochs 15] [--node-bandwidth 400mbit]

- isolated: RM policy `static`, nodes the size of one job (its AM, one worker, one server): each job
  runs on its own node's share, the others wait (the bench submits one job per node at a time);
- naive:    RM policy `static`, nodes four times as big: every job runs at once, co-located, with
  no arbiter (their subtasks contend);
- harmony:  RM policy `harmony` on the naive nodes: jobs profiled, grouped, their COMP / COMM
  interleaved by each node's arbiter, two of them spilling input (`spill_alpha`);
- subtasks: the naive cluster with every job's executors taking the node arbiter's slots around
  their COMP / COMM subtasks (job spec `use_arbiter`), no grouping, no spill: Fig. 4.12's
  "subtasks only" step;
- harmony_no_spill: Harmony without spill ("+ grouping"), so with `harmony` ("+ reloading") the
  three give Fig. 4.12's breakdown.

The workload (`--jobs`, default 8) cycles over MLR, NMF, LDA and Lasso with different batch sizes, so
their CPU / network balance differs; all jobs arrive at once (the same jobs in every mode).
The nodes share this machine's cores (no per-node CPU quota: YARN's strict mode shares a node's
cores out by vcore, which would hand a container of a big naive node a sliver of a core while the
node idles, and Harmony's weighted containers take no quota at all); each node has a network cap
(`--node-bandwidth`, enforced by network namespaces with a shaped veth per node where the machine
allows it, else by the data plane's pacing).

Measured, not modelled: JCT (submission to finish, queueing included) and makespan from the RM's
app reports; CPU utilization from the NMs' cgroup CPU accounting (the RM's utilization series, the
containers' cores over the machine's cores); network utilization from the node interfaces' byte
counters over the nodes' caps (null when the nodes have no interfaces of their own: emulated
bandwidth on loopback). Anchors (80 jobs on 100 machines): Harmony 2.11x faster mean JCT, 1.60x
shorter makespan, 1.65x utilization against isolated; naive co-location only 11 % / 9 % faster.

Last line, JSON: {"isolated": {...}, "naive": {...}, "subtasks": {...}, "harmony_no_spill": {...},
"harmony": {...}, "utilization_gain", "jct_gain", "makespan_gain", "naive_jct_gain",
"subtasks_jct_gain", "grouping_jct_gain", "reloading_jct_gain"} (gains = isolated over the mode for
times, Harmony over isolated for CPU utilization; reloading = harmony_no_spill over harmony).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from elastane_cli import ps_commands  # noqa: E402
from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from psruntime.wire.bandwidth import parse_rate  # noqa: E402
from elastane_cli.rm_rest_client import RmRestClient  # noqa: E402

EXECUTOR_MB = 256
AM_MB = 256
POLL_S = 1.0
# (app, data, hparams): four apps, two batch sizes each, so CPU / network ratios differ.
WORKLOAD: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("mlr", {"num_samples": 30_000}, {"batch_size": 500}),
    ("nmf", {"num_users": 6000}, {}),
    ("lda", {"num_docs": 3000}, {}),
    ("lasso", {"num_samples": 30_000}, {}),
    ("mlr", {"num_samples": 30_000}, {"batch_size": 50}),
    ("nmf", {"num_users": 6000, "rows_per_block": 500}, {}),
    ("lda", {"num_docs": 2000}, {}),
    ("lasso", {"num_samples": 20_000}, {}),
)
SPILLING = {1, 3}          # workload indexes that spill input under harmony (alpha auto / 0.5)


def log(text: str) -> None:
    print(f"[harmony_colocation] {text}", file=sys.stderr, flush=True)


def job_specs(n: int, epochs: int, spill: bool, use_arbiter: bool = False) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        app, data, hparams = WORKLOAD[i % len(WORKLOAD)]
        spec: dict[str, Any] = {"app": app, "workers": 1, "servers": 1, "executor_memory_mb": EXECUTOR_MB,
                                "max_epochs": epochs, "convergence_threshold": 1e-12, "data": data,
                                "hparams": hparams}
        if use_arbiter:
            spec["use_arbiter"] = True
        if spill and i % len(WORKLOAD) in SPILLING:
            spec["spill_alpha"] = "auto" if i % 2 else 0.5
        out.append(spec)
    return out


async def run_mode(cluster: LocalCluster, specs: list[dict[str, Any]], max_running: int,
                   timeout_s: float) -> dict[str, Any]:
    """All jobs arrive at once; at most `max_running` are submitted at a time (isolated: one per
    node -- YARN grants no gangs, so more AMs than nodes would each hold part of a node and wait
    for the rest), the others wait in arrival order. JCT = finish - arrival."""
    async with RmRestClient(cluster.rm_url, "bench") as client:
        t0 = time.time()
        waiting = list(enumerate(specs))
        running: list[str] = []
        reports: dict[str, dict[str, Any]] = {}
        while waiting or running:
            if time.time() - t0 > timeout_s:
                for a in running:
                    await client.kill(a)
                raise RuntimeError(f"{len(waiting) + len(running)} jobs did not finish within {timeout_s:.0f}s")
            while waiting and len(running) < max_running:
                i, s = waiting.pop(0)
                spec = ps_commands.validate_spec(s)
                running.append(await ps_commands.submit_ps_job(client, spec, f"colocation-{i}-{s['app']}",
                                                               am_memory=AM_MB))
            for a in list(running):
                r = await client.app(a)
                if r["state"] in ps_commands.FINAL_STATES:
                    reports[a] = r
                    running.remove(a)
                    log(f"  {a} {r['name']}: {r['finalStatus']} after {time.time() - t0:.0f}s"
                        + ("" if r["finalStatus"] == "SUCCEEDED" else f": {str(r.get('diagnostics', ''))[:300]}"))
            await asyncio.sleep(POLL_S)
        end = time.time()
        util = await client.utilization()
    failed = [r["name"] for r in reports.values() if r["finalStatus"] != "SUCCEEDED"]
    if failed:
        raise RuntimeError(f"jobs did not succeed: {failed}")
    jcts = [r["finishedTime"] / 1000.0 - t0 for r in reports.values()]
    return {"mean_jct_s": round(statistics.fmean(jcts), 2), "max_jct_s": round(max(jcts), 2),
            "makespan_s": round(max(jcts), 2), **utilization_of(util, t0 * 1000, end * 1000, cluster),
            "jobs": len(jcts)}


def utilization_of(util: dict[str, Any], t0_ms: float, t1_ms: float, cluster: LocalCluster) -> dict[str, Any]:
    """Mean CPU (the containers' cgroup-accounted cores over this machine's cores) and network
    (node interfaces' bytes over the nodes' caps) over [t0, t1]."""
    points = [p for p in (util.get("utilization") or {}).get("cluster") or [] if t0_ms <= p["t"] <= t1_ms]
    if not points:
        return {"cpu_utilization": None, "network_utilization": None, "samples": 0}
    cores = os.cpu_count() or 1
    cpu = statistics.fmean(p["cpuCores"] for p in points) / cores
    net: Optional[float] = None
    if cluster.network_mode == "netns" and cluster.node_bandwidth_bps:
        rate = statistics.fmean((p["netRxBytesPerSec"] + p["netTxBytesPerSec"]) / 2 for p in points)
        net = rate * 8 / (cluster.node_bandwidth_bps * cluster.num_nodes)
    return {"cpu_utilization": round(cpu, 3), "network_utilization": None if net is None else round(net, 3),
            "samples": len(points), "network_mode": cluster.network_mode}


def main() -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--node-bandwidth", default="400mbit")
    p.add_argument("--timeout-s", type=float, default=1500.0, help="per mode")
    p.add_argument("--modes", default="isolated,naive,subtasks,harmony_no_spill,harmony")
    ns = p.parse_args()
    if ns.jobs < 1 or ns.nodes < 1 or ns.epochs < 1:
        p.error("--jobs, --nodes and --epochs must be >= 1")
    try:
        bandwidth = parse_rate(ns.node_bandwidth)
    except ValueError as e:
        p.error(f"--node-bandwidth: {e}")
    # One job = its AM + a worker + a server: an isolated node holds exactly one.
    one_job_vcores, one_job_mb = 3, AM_MB + 2 * EXECUTOR_MB + 64
    # mode: (policy, node scale, spill, use_arbiter)
    modes = {"isolated": ("static", 1, False, False), "naive": ("static", 4, False, False),
             "subtasks": ("static", 4, False, True), "harmony": ("harmony", 4, True, False),
             "harmony_no_spill": ("harmony", 4, False, False)}
    out: dict[str, Any] = {}
    for name in [m for m in ns.modes.split(",") if m]:
        if name not in modes:
            p.error(f"--modes: unknown mode {name!r}; known: {', '.join(modes)}")
        policy, scale, spill, use_arbiter = modes[name]
        log(f"{name}: policy {policy}, nodes of {one_job_vcores * scale} vcores / {one_job_mb * scale} MB "
            f"and {ns.node_bandwidth} each")
        with tempfile.TemporaryDirectory(prefix=f"colocation-{name}-") as tmp:
            cluster = LocalCluster(Path(tmp), nodes=ns.nodes, node_vcores=one_job_vcores * scale,
                                   node_memory_mb=one_job_mb * scale, heartbeat_interval_ms=500, policy=policy,
                                   am_expiry_s=60, nm_expiry_s=60, node_bandwidth=bandwidth)
            try:
                cluster.start()
                max_running = ns.nodes if name == "isolated" else ns.jobs
                specs = job_specs(ns.jobs, ns.epochs, spill, use_arbiter)
                out[name] = asyncio.run(run_mode(cluster, specs, max_running, ns.timeout_s))
            except Exception as e:  # noqa: BLE001 - one mode failing is reported, the others still run
                out[name] = {"error": f"{type(e).__name__}: {e}"}
            finally:
                cluster.stop()
        log(f"{name}: {json.dumps(out[name])}")

    def ratio(a: Any, b: Any) -> Optional[float]:
        return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    iso, har = out.get("isolated", {}), out.get("harmony", {})
    out.update(jct_gain=ratio(iso.get("mean_jct_s"), har.get("mean_jct_s")),
               makespan_gain=ratio(iso.get("makespan_s"), har.get("makespan_s")),
               utilization_gain=ratio(har.get("cpu_utilization"), iso.get("cpu_utilization")),
               naive_jct_gain=ratio(iso.get("mean_jct_s"), out.get("naive", {}).get("mean_jct_s")),
               # Fig. 4.12's breakdown, each step's mean JCT against isolated's
               subtasks_jct_gain=ratio(iso.get("mean_jct_s"), out.get("subtasks", {}).get("mean_jct_s")),
               grouping_jct_gain=ratio(iso.get("mean_jct_s"), out.get("harmony_no_spill", {}).get("mean_jct_s")),
               reloading_jct_gain=ratio(out.get("harmony_no_spill", {}).get("mean_jct_s"), har.get("mean_jct_s")),
               cores=os.cpu_count(), nodes=ns.nodes, jobs=ns.jobs, epochs=ns.epochs)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
