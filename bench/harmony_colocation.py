"""Harmony's co-location experiment (dissertation §4.4.3, Fig. 4.10-4.12) on the multi-host testbed:
a mixed workload of PS jobs on hosts that own their CPUs and links, under five ways of sharing them,
interleaved and repeated in the same run.

    python bench/harmony_colocation.py [--jobs 8] [--hosts 4] [--host-cpus 0.45] [--host-bandwidth 200mbit]
                                       [--epochs 15] [--repeats 3] [--quick]

The cluster (docs/testbed.md, elastane_cli/testbed_cluster.py): `--hosts` worker hosts, each a
network namespace with a tc-capped link (`--host-bandwidth`, both directions) and a cgroup CPU
budget (`--host-cpus` cores; default 0.45 on a machine of 2 cores or fewer, else 4) holding its NM
and every container on it; and a master host with no budget running the RM and an NM labelled
`am` that takes every AM and nothing else (rm.toml `am_node_label`, protocol/node_labels.py), as
the paper setups run their masters on an extra instance. Started by bin/start-cluster, fresh for
every run.

Modes, the same hosts, budgets, caps, jobs (apps, data, seeds, executor size, fixed epochs with no
convergence stop) in each:
- isolated: RM policy `static`, each host's NM offering one job's executors per host (2 vcores):
  every job runs on hosts of its own, the others wait (at most hosts / DoP jobs are submitted at
  a time: YARN grants no gangs, so more would each hold part of a host and wait for the rest);
- naive: RM policy `static`, hosts offering room for every job at once: all co-located, no arbiter;
- subtasks: naive with every job's executors taking the node arbiter's slots around their COMP /
  COMM subtasks (job spec `use_arbiter`), no grouping, no spill: Fig. 4.12's "subtasks only";
- harmony_no_spill: RM policy `harmony` on naive's hosts: profiled, grouped, interleaved ("+ grouping");
- harmony: the same with two jobs spilling input (`spill_alpha`): "+ reloading".
Runs go round the modes `--repeats` times (isolated, naive, ..., isolated, naive, ...), so a slow
spell of the machine falls on every mode; each figure is a mode's median over its runs.

The workload (`--workload links`, default) cycles over bench/support/harmony_workloads.py's MLR
jobs with 0.5-8 MB models, pulled and pushed whole every mini-batch, so their communication is bytes
on the capped links and the mix spans about 80:20 to 20:80 COMP:COMM alone; `--workload apps` is the
older mix of MLR, NMF, LDA and Lasso with KB models. All jobs arrive at once; the data are generated
from the specs' fixed seeds, so every mode trains the same jobs on the same data.

Degree of parallelism, the same in every mode: a job runs `--dop` workers and `--dop` servers
(default 2: two hosts' worth), one of each per host. Harmony places its jobs itself, one worker
and one server on each node of a job's group (the paper's rule, so a job's DoP is its group's node
count, reported as `group_nodes`); with `--harmony-nodes dop` (the default) each Harmony job's
spec bounds it to exactly `--dop` nodes (min_workers = max_workers = min_servers = max_servers =
dop), which the policy honours (docs/harmony_policy.md, "Machine bounds"): it is profiled on `--dop`
nodes and grouped on `--dop` nodes, so every mode runs every job at the same DoP and only the
sharing differs. With `--harmony-nodes free` its jobs are submitted with one worker and one server,
the profiling shape (as the simulator submits them), and no bounds: the policy picks each group's
nodes by its model (T_net grows with the nodes by the link term, rm.toml
`harmony_link_bandwidth_bps`, which the bench sets to `--host-bandwidth`). Under either, the PS AM
starts what Harmony's first directive says, not its submitted shape (docs/internals.md, "Initial
placement"). The static modes place their jobs by Harmony's rule too, not by the scheduler's first fit (which
launches a job's servers before its workers, so they shared one host by role and left server-only
hosts nearly idle, e.g. 0.03 against 0.32 of budget): each job's spec carries a placement of one
worker + one server on each of its `--dop` hosts, which the AM's first asks obey (docs/internals.md,
"Initial placement"), so no static job restarts to get there. Isolated: a job's hosts are the
first `--dop` free ones. Naive / subtasks: every job at once, job i on hosts i*dop .. i*dop+dop-1
round-robin, so each host carries the same number of jobs' pairs, as Harmony's groups give (its
partners are its own choice; the per-host counts match). Each run reports the executors on every
host and one job's executors per host, sampled from the worker hosts' NMs (the sample with the
most executors: `executors_per_host`, `job_executors_per_host`), each job's serving workers and
servers on each of its hosts from its AM's live status, its last sample before it finished
(`job_roles_per_host`: ["w1s1"] is one worker + one server everywhere), how many hosts a job used (`hosts_per_job`) and every host's CPU use
(`host_cpu`), so a placement that differs between modes is visible, not hidden.

Measured, not modelled: JCT (arrival to the RM's finish time, queueing included) and makespan; CPU
utilization = the worker hosts' cgroup CPU time (cpuacct.usage / cpu.stat usage_usec of each host's
cgroup) over their budgets x the makespan; network utilization = the bytes through the worker
hosts' links (their veth counters at the bridge, both directions) over the caps x the makespan.
`machine_cpu_busy`: the share of the whole machine's cores busy over the run (/proc/stat), the
hosts' budgets, the master's RM and AMs, the kernel's packet shaping and the bench together: near
1, the hosts cannot all get their budgets at once, and co-location has no CPU left to win.
Harmony's own overhead, where the policy reports it (its describe(): profilingS, regroupS per job):
`overhead_fraction` = mean over jobs of (profiling + regrouping time) / makespan, and
`job_overhead_fraction` = the same over each job's own JCT (the issue's "under 5 % of a job"). From the jobs'
own metrics: `comm_fraction` (COMM's share of a mini-batch, what co-location can overlap) and
`grant_wait_fraction` (the share spent waiting for arbiter grants, what interleaving costs). Anchors (80 jobs
on 100 machines): Harmony 2.11x faster mean JCT, 1.60x shorter makespan, 1.65x utilization against
isolated; naive co-location only 11 % / 9 % faster.

Last line, JSON: {"isolated": {...}, "naive": {...}, "subtasks": {...}, "harmony_no_spill": {...},
"harmony": {...}, "utilization_gain", "jct_gain", "makespan_gain", "naive_jct_gain",
"subtasks_jct_gain", "grouping_jct_gain", "reloading_jct_gain", "host_cpu_budget", "repeats", ...}
(per-mode dicts hold the medians and every run's figures; gains = isolated over the mode for times,
the mode over isolated for CPU utilization; reloading = harmony_no_spill over harmony).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from support.harmony_workloads import WORKLOADS as LINK_WORKLOADS  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from elastane_cli import ps_commands, testbed_hosts  # noqa: E402
from elastane_cli.machine_load import cpu_seconds as machine_cpu_seconds  # noqa: E402
from elastane_cli.ps_commands import AmStatusReader  # noqa: E402
from elastane_cli.rm_rest_client import RmRestClient  # noqa: E402
from elastane_cli.testbed_cluster import MASTER, TestbedCluster  # noqa: E402
from protocol.ps_status import PsStatus  # noqa: E402
from psruntime.wire.bandwidth import parse_rate  # noqa: E402

AM_MB = 256
POLL_S = 1.0
# --workload links (default): MLR jobs with 0.5-8 MB models pulled and pushed whole every
# mini-batch (bench/support/harmony_workloads.py), from about 80:20 COMP:COMM to 20:80 measured alone
# on a 0.5-core, 100 Mbit/s host: communication that is bytes on the capped links.
LINKS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = tuple(
    (w.app, w.data, w.hparams) for w in LINK_WORKLOADS.values())
# --workload apps: four apps, two sizes each (KB models: their COMM is RPC latency, not bytes).
APPS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("mlr", {"num_samples": 30_000}, {"batch_size": 500}),
    ("nmf", {"num_users": 6000}, {}),
    ("lda", {"num_docs": 3000}, {}),
    ("lasso", {"num_samples": 30_000}, {}),
    ("mlr", {"num_samples": 30_000}, {"batch_size": 50}),
    ("nmf", {"num_users": 6000, "rows_per_block": 500}, {}),
    ("lda", {"num_docs": 2000}, {}),
    ("lasso", {"num_samples": 20_000}, {}),
)
WORKLOADS = {"links": (LINKS, 512), "apps": (APPS, 256)}     # name -> (jobs cycled over, executor MB)
SPILLING = {1, 3}          # workload indexes that spill input under harmony (alpha auto / 0.5)
TIME_KEYS = ("mean_jct_s", "makespan_s")


@dataclass(frozen=True)
class Mode:
    """How one mode shares the hosts."""

    policy: str
    shared: bool           # hosts offer room for every job at once (else one job's share per host)
    spill: bool = False
    use_arbiter: bool = False


MODES = {"isolated": Mode("static", False), "naive": Mode("static", True),
         "subtasks": Mode("static", True, use_arbiter=True), "harmony_no_spill": Mode("harmony", True),
         "harmony": Mode("harmony", True, spill=True)}


def log(text: str) -> None:
    print(f"[harmony_colocation] {text}", file=sys.stderr, flush=True)


def job_specs(n: int, epochs: int, dop: int, mode: Mode, workload: str,
              harmony_nodes: str = "dop") -> list[dict[str, Any]]:
    """The same jobs in every mode: only the arbiter and spill switches differ by mode, and the
    submitted shape. Static: `dop` of each role. Harmony with `harmony_nodes` "dop": `dop` of each
    role and bounds of exactly `dop` (min = max workers and servers), so its groups span `dop`
    nodes, as every static job does; "free": one of each (its profiling shape) and no bounds, the
    policy picks the nodes."""
    jobs, executor_mb = WORKLOADS[workload]
    width = dop if mode.policy == "static" or harmony_nodes == "dop" else 1
    out = []
    for i in range(n):
        app, data, hparams = jobs[i % len(jobs)]
        spec: dict[str, Any] = {"app": app, "workers": width, "servers": width, "executor_memory_mb": executor_mb,
                                "max_epochs": epochs, "convergence_threshold": 1e-12, "data": data,
                                "hparams": hparams, "heldout_every_epochs": 0}
        if mode.policy != "static" and harmony_nodes == "dop":
            spec.update(min_workers=dop, max_workers=dop, min_servers=dop, max_servers=dop)
        if mode.use_arbiter:
            spec["use_arbiter"] = True
        if mode.spill and i % len(jobs) in SPILLING:
            spec["spill_alpha"] = "auto" if i % 2 else 0.5
        out.append(spec)
    return out


class HostMeter:
    """The worker hosts' CPU seconds and link bytes between two readings."""

    def __init__(self, cluster: TestbedCluster):
        self.tb = cluster.testbed
        self.names = cluster.node_names

    def read(self) -> dict[str, tuple[float, int]]:
        out = {}
        for n in self.names:
            cpu = self.tb.cpu_seconds(n)
            sent, received = self.tb.link_bytes(n)
            out[n] = (cpu if cpu is not None else float("nan"), sent + received)
        return out


def final_status(cluster: TestbedCluster, app_id: str) -> PsStatus:
    """The job's final status, which its AM leaves on shared storage (empty if it cannot be read)."""
    return cluster.final_status(app_id)


def roles_by_host(cluster: TestbedCluster, status: Optional[PsStatus]) -> dict[str, str]:
    """host -> the job's serving (READY) workers and servers there as "w<n>s<m>" (Harmony's
    placement: every host "w1s1"), from its AM's live status; {} while none serve."""
    per_host: dict[str, list[int]] = {}
    for e in status.shape.serving() if status is not None and status.shape is not None else []:
        try:
            counts = per_host.setdefault(cluster.host_of(e.node), [0, 0])
        except KeyError:
            continue
        counts[e.role == "server"] += 1
    return {h: f"w{w}s{s}" for h, (w, s) in per_host.items()}


def split_of(st: PsStatus) -> tuple[Optional[float], Optional[float]]:
    """The job's COMM share of a mini-batch (comm / (compute + comm), its workers' mean times) and
    the share of it spent waiting for arbiter grants (compute_wait + comm_wait)."""
    workers = st.metrics.workers.values()
    comp = sum(w.compute_s or 0.0 for w in workers)
    comm = sum(w.comm_s or 0.0 for w in workers)
    wait = sum((w.compute_wait_s or 0.0) + (w.comm_wait_s or 0.0) for w in workers)
    if comp + comm <= 0:
        return None, None
    return comm / (comp + comm), wait / (comp + comm)


def round_robin_hosts(n_jobs: int, hosts: list[str], dop: int) -> list[list[str]]:
    """Job i's `dop` hosts when every job runs at once: hosts i*dop .. i*dop+dop-1, wrapping, so
    every host carries the same number of jobs (one worker + one server each) where the counts
    divide evenly -- the per-host load Harmony's groups give, without its choice of partners."""
    return [[hosts[(i * dop + k) % len(hosts)] for k in range(dop)] for i in range(n_jobs)]


def placement_on(cluster: TestbedCluster, hosts: list[str]) -> list[dict[str, Any]]:
    """A static-mode job's spec placement: one worker and one server on each of its hosts (the
    AM's first asks, docs/internals.md "Initial placement"), Harmony's layout for a group."""
    return [{"node": cluster.node_id(h), "workers": 1, "servers": 1} for h in hosts]


async def executors_by_host(cluster: TestbedCluster, client: RmRestClient,
                            apps: set[str]) -> dict[str, dict[str, int]]:
    """host -> app id -> the app's running non-AM containers there, from the worker hosts' NMs
    (the RM's node list gives their addresses)."""
    out: dict[str, dict[str, int]] = {}
    for node in await client.nodes():
        host = cluster.host_of(str(node.get("id") or ""))
        if host not in cluster.node_names or node.get("state") != "RUNNING":
            continue
        counts: dict[str, int] = {}
        for c in await client.nm_containers(str(node["nodeHTTPAddress"])):
            if c.get("appId") in apps and c.get("state") == "RUNNING" and not str(c.get("id", "")).endswith("_000001"):
                counts[c["appId"]] = counts.get(c["appId"], 0) + 1
        out[host] = counts
    return out


async def run_jobs(cluster: TestbedCluster, specs: list[dict[str, Any]], max_running: int,
                   timeout_s: float, place: Optional[list[list[str]]] = None, dop: int = 2) -> dict[str, Any]:
    """All jobs arrive at once; at most `max_running` are submitted at a time, the others wait in
    arrival order. JCT = the RM's finish time - arrival. `place`: each job's hosts (static modes;
    empty lists: the first free `dop` hosts when it is submitted, isolated's own hosts), where its
    spec's placement puts one worker + one server each; None: the policy places (Harmony)."""
    meter = HostMeter(cluster)
    peak: dict[str, dict[str, int]] = {}      # the placement sample with the most executors
    samples = 0
    policy_state: dict[str, dict[str, Any]] = {}
    load = [os.getloadavg()[0]]     # the machine's load: other work on it slows every host
    # Each job's serving workers and servers per host, from its AM's live status: the latest sample
    # before it finished (a finished job's status lists every executor it was ever given).
    roles: dict[str, dict[str, str]] = {}
    am_status = AmStatusReader("bench")
    async with RmRestClient(cluster.rm_url, "bench") as client:
        before = meter.read()
        machine_before = machine_cpu_seconds()
        t0 = time.time()
        waiting = list(enumerate(specs))
        running: list[str] = []
        reports: dict[str, dict[str, Any]] = {}
        holds: dict[str, list[str]] = {}          # running app id -> its hosts (isolated: none shared)
        while waiting or running:
            if time.time() - t0 > timeout_s:
                for a in running:
                    await client.kill(a)
                raise RuntimeError(f"{len(waiting) + len(running)} jobs did not finish within {timeout_s:.0f}s")
            while waiting and len(running) < max_running:
                i, s = waiting.pop(0)
                hosts: list[str] = []
                if place is not None:
                    taken = {h for hs in holds.values() for h in hs}
                    hosts = place[i] or [h for h in cluster.node_names if h not in taken][:dop]
                    s = {**s, "placement": placement_on(cluster, hosts)}
                spec = ps_commands.validate_spec(s)
                app_id = await ps_commands.submit_ps_job(client, spec, f"colocation-{i}-{s['app']}",
                                                         am_memory=AM_MB)
                running.append(app_id)
                if hosts:
                    holds[app_id] = hosts
            samples += 1
            # Where the executors are, every few polls (NM calls cost the hosts little); the latest
            # sample with the most executors is kept.
            if samples % 5 == 1:
                try:
                    seen = await executors_by_host(cluster, client, set(running))
                    if sum(map(sum, (d.values() for d in seen.values()))) >= sum(
                            map(sum, (d.values() for d in peak.values()))):
                        peak = seen
                except Exception:  # noqa: BLE001 - the placement sample is extra, the run goes on without it
                    pass
            try:    # the policy's own view of each job (Harmony: state, group, its overheads so far)
                for a, st in ((await client.policy_state()).get("apps") or {}).items():
                    if isinstance(st, dict):
                        policy_state[a] = st
            except Exception:  # noqa: BLE001 - the policy's view is extra, the run goes on without it
                pass
            for a in list(running):
                r = await client.app(a)
                if samples % 5 == 1 and r["state"] == "RUNNING" and r.get("trackingUrl"):
                    live = roles_by_host(cluster, await am_status.read(r["trackingUrl"]))
                    if live:
                        roles[a] = live
                if r["state"] in ps_commands.FINAL_STATES:
                    reports[a] = r
                    running.remove(a)
                    holds.pop(a, None)
                    load.append(os.getloadavg()[0])
                    log(f"  {a} {r['name']}: {r['finalStatus']} after {time.time() - t0:.0f}s"
                        + ("" if r["finalStatus"] == "SUCCEEDED" else f": {str(r.get('diagnostics', ''))[:300]}"))
            await asyncio.sleep(POLL_S)
        after = meter.read()
        machine_after = machine_cpu_seconds()
    await am_status.close()
    failed = [r["name"] for r in reports.values() if r["finalStatus"] != "SUCCEEDED"]
    if failed:
        raise RuntimeError(f"jobs did not succeed: {failed}")
    jct_of = {a: r["finishedTime"] / 1000.0 - t0 for a, r in reports.items()}
    jcts = list(jct_of.values())
    makespan = max(jcts)
    budget = cluster.testbed.host(cluster.node_names[0]).cpus or float(os.cpu_count() or 1)
    host_cpu = {n: (after[n][0] - before[n][0]) / (budget * makespan) for n in meter.names}
    cap = cluster.testbed.bandwidth_bps
    net = None
    if cap:
        moved = sum(after[n][1] - before[n][1] for n in meter.names)
        net = moved * 8 / (2 * cap * len(meter.names) * makespan)
    # Harmony's own time per job: profiling + regrouping (policies without them report none)
    spent = {a: float(p.get("profilingS") or 0) + float(p.get("regroupS") or 0)
             for a, p in policy_state.items() if "profilingS" in p}
    overhead = [s / makespan for s in spent.values()]
    groups = [int(p["groupNodes"]) for p in policy_state.values() if p.get("groupNodes")]
    finals = [final_status(cluster, a) for a in reports]
    spans = [len(r) for r in roles.values() if r]
    # Harmony's overhead against each job's own time (the issue: under 5 % of a job).
    job_overhead = [s / jct_of[a] for a, s in spent.items() if jct_of.get(a)]
    splits = [split_of(st) for st in finals]
    comm = [c for c, _ in splits if c is not None]
    wait = [w for _, w in splits if w is not None]
    return {"mean_jct_s": round(statistics.fmean(jcts), 2), "makespan_s": round(makespan, 2),
            "cpu_utilization": round(statistics.fmean(host_cpu.values()), 3),
            "network_utilization": None if net is None else round(net, 4),
            "host_cpu": {n: round(v, 3) for n, v in host_cpu.items()},
            # Placement parity: executors on each worker host, and how many of one job's executors
            # share a host (Harmony: 2, one worker + one server), at the sample with the most running.
            "executors_per_host": {h: sum(peak.get(h, {}).values()) for h in meter.names},
            "job_executors_per_host": sorted({c for d in peak.values() for c in d.values()}),
            # From the AMs' live status: each job's serving workers and servers on each of its
            # hosts, its last sample before it finished.
            "job_roles_per_host": sorted({x for r in roles.values() for x in r.values()}),
            "hosts_per_job": statistics.median(spans) if spans else None,
            "group_nodes": statistics.median(groups) if groups else None,
            "overhead_fraction": round(statistics.fmean(overhead), 4) if overhead else None,
            "job_overhead_fraction": round(statistics.fmean(job_overhead), 4) if job_overhead else None,
            # Why a mode is slow: how much of a mini-batch is COMM (what co-location can overlap)
            # and how much is waiting for the arbiter's grants (what interleaving costs).
            "comm_fraction": round(statistics.fmean(comm), 3) if comm else None,
            "grant_wait_fraction": round(statistics.fmean(wait), 3) if wait else None,
            "machine_load": round(statistics.fmean(load), 2),
            # the share of the machine's cores busy over the run (all of it, not only the hosts')
            "machine_cpu_busy": round((machine_after[0] - machine_before[0])
                                      / max(1e-9, machine_after[1] - machine_before[1]), 3),
            "jobs": len(jcts)}


def run_mode(name: str, mode: Mode, ns: argparse.Namespace, bandwidth: int) -> dict[str, Any]:
    """One run of one mode on a fresh testbed cluster."""
    per_job = 2 * ns.dop                     # executors of one job
    per_host = 2                             # a job's executors on one host (its DoP's share)
    jobs_per_host = max(1, -(-ns.jobs * per_job // (ns.hosts * per_host))) if mode.shared else 1
    # Slots only: the CPU budget of a host is its cgroup's, the same in every mode.
    vcores = per_host * jobs_per_host
    memory = vcores * WORKLOADS[ns.workload][1] + 64
    with tempfile.TemporaryDirectory(prefix=f"colocation-{name}-") as tmp:
        cluster = TestbedCluster(Path(tmp), workers=ns.hosts, worker_cpus=ns.host_cpus, bandwidth_bps=bandwidth,
                                 node_memory_mb=memory, node_vcores=vcores, nm_expiry_s=60, am_expiry_s=60,
                                 heartbeat_interval_ms=500, policy=mode.policy, am_host=True,
                                 # the hosts' link, as an operator tells Harmony (T_net grows with
                                 # a group's nodes: docs/harmony_policy.md)
                                 rm_conf={"harmony_link_bandwidth_bps": bandwidth},
                                 am_host_memory_mb=(AM_MB + 64) * ns.jobs, am_host_vcores=ns.jobs)
        try:
            cluster.start()
            max_running = ns.jobs if mode.shared else max(1, ns.hosts // ns.dop)
            specs = job_specs(ns.jobs, ns.epochs, ns.dop, mode, ns.workload, ns.harmony_nodes)
            place = None
            if mode.policy == "static":
                place = (round_robin_hosts(ns.jobs, cluster.node_names, ns.dop) if mode.shared
                         else [[] for _ in specs])
            return asyncio.run(run_jobs(cluster, specs, max_running, ns.timeout_s, place, ns.dop))
        except Exception as e:  # noqa: BLE001 - one run failing is reported, the others still run
            return {"error": f"{type(e).__name__}: {e}"}
        finally:
            cluster.stop()


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's figures: the median of each number over its runs that finished, and every run."""
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs": runs, "ok_runs": len(ok)}
    for key in ("mean_jct_s", "makespan_s", "cpu_utilization", "network_utilization", "hosts_per_job",
                "group_nodes", "overhead_fraction", "job_overhead_fraction", "comm_fraction", "grant_wait_fraction", "machine_load", "machine_cpu_busy"):
        values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
        out[key] = round(statistics.median(values), 4) if values else None
    return out


def ratio(a: Any, b: Any) -> Optional[float]:
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def main() -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=None, help="default 8 (--quick: 4)")
    p.add_argument("--hosts", type=int, default=4, help="worker hosts (the master comes on top)")
    p.add_argument("--host-cpus", type=float, default=None,
                   help="each worker host's CPU budget in cores (default 0.45 on <= 2 cores, else 4)")
    p.add_argument("--host-bandwidth", default="100mbit", help="each host's link cap")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="links",
                   help="links: MLR with 0.5-8 MB models (default); apps: MLR, NMF, LDA, Lasso with KB models")
    p.add_argument("--dop", type=int, default=2,
                   help="workers (= servers) of a job, one of each per host: every static job's, and every "
                        "Harmony job's bounds under --harmony-nodes dop")
    p.add_argument("--harmony-nodes", choices=("dop", "free"), default="dop",
                   help="dop (default): Harmony's jobs bounded to exactly --dop nodes (min = max workers and "
                        "servers), the DoP every mode uses; free: Harmony picks each group's nodes itself")
    p.add_argument("--epochs", type=int, default=None, help="fixed epochs per job (default 15; --quick: 3)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved runs per mode (default 3; --quick: 1)")
    p.add_argument("--timeout-s", type=float, default=1500.0, help="per run")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--quick", action="store_true", help="development: 4 jobs of 3 epochs, one run per mode")
    ns = p.parse_args()
    ns.jobs = ns.jobs if ns.jobs is not None else (4 if ns.quick else 8)
    ns.epochs = ns.epochs if ns.epochs is not None else (3 if ns.quick else 15)
    ns.repeats = ns.repeats if ns.repeats is not None else (1 if ns.quick else 3)
    ns.host_cpus = ns.host_cpus if ns.host_cpus is not None else (0.45 if (os.cpu_count() or 1) <= 2 else 4.0)
    if min(ns.jobs, ns.hosts, ns.epochs, ns.repeats, ns.dop) < 1:
        p.error("--jobs, --hosts, --epochs, --repeats and --dop must be >= 1")
    if ns.dop > ns.hosts:
        p.error(f"--dop {ns.dop} needs at least that many --hosts (got {ns.hosts})")
    if ns.host_cpus <= 0:
        p.error(f"--host-cpus must be > 0, got {ns.host_cpus}")
    try:
        bandwidth = parse_rate(ns.host_bandwidth)
    except ValueError as e:
        p.error(f"--host-bandwidth: {e}")
    names = [m for m in ns.modes.split(",") if m]
    for name in names:
        if name not in MODES:
            p.error(f"--modes: unknown mode {name!r}; known: {', '.join(MODES)}")
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason:
        print(f"harmony_colocation: needs the multi-host testbed: {reason}", file=sys.stderr)
        return 2
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep in range(ns.repeats):
        for name in names:
            log(f"run {rep + 1}/{ns.repeats} {name}: policy {MODES[name].policy}, {ns.hosts} hosts x "
                f"{ns.host_cpus} cores, {ns.host_bandwidth} links, AMs on {MASTER}")
            r = run_mode(name, MODES[name], ns, bandwidth)
            runs[name].append(r)
            log(f"{name}: {json.dumps(r)}")
    out: dict[str, Any] = {n: medians(rs) for n, rs in runs.items()}
    iso, har = out.get("isolated", {}), out.get("harmony", {})
    nsp = out.get("harmony_no_spill", {})
    out.update(jct_gain=ratio(iso.get("mean_jct_s"), har.get("mean_jct_s")),
               makespan_gain=ratio(iso.get("makespan_s"), har.get("makespan_s")),
               utilization_gain=ratio(har.get("cpu_utilization"), iso.get("cpu_utilization")),
               naive_jct_gain=ratio(iso.get("mean_jct_s"), out.get("naive", {}).get("mean_jct_s")),
               naive_makespan_gain=ratio(iso.get("makespan_s"), out.get("naive", {}).get("makespan_s")),
               naive_utilization_gain=ratio(out.get("naive", {}).get("cpu_utilization"), iso.get("cpu_utilization")),
               # Fig. 4.12's breakdown, each step's mean JCT against isolated's
               subtasks_jct_gain=ratio(iso.get("mean_jct_s"), out.get("subtasks", {}).get("mean_jct_s")),
               grouping_jct_gain=ratio(iso.get("mean_jct_s"), nsp.get("mean_jct_s")),
               reloading_jct_gain=ratio(nsp.get("mean_jct_s"), har.get("mean_jct_s")),
               host_cpu_budget=ns.host_cpus, host_bandwidth_bps=bandwidth, repeats=ns.repeats,
               cores=os.cpu_count(), hosts=ns.hosts, jobs=ns.jobs, epochs=ns.epochs, dop=ns.dop, harmony_nodes=ns.harmony_nodes, quick=ns.quick,
               workload=ns.workload)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
