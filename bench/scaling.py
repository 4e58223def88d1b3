"""PS training across hosts against one numpy process in one host's budget (issue 38 part 1).

    .venv/bin/python bench/scaling.py [--quick] [--apps mlr,nmf,lasso] [--hosts 1,2,4]
                                      [--host-cpus 0.3] [--preset small] [--samples N]
                                      [--epochs 6] [--repeats 3] [--sync-batches 1,32] [--float-hosts]

The project's one PS-scaling bench: issue 38's figure at its defaults, and the 16-core suite's
(bench/host_suite.py: MLR on 1, 2, 4 and 8 hosts of 1.5 cores) through the options.

The testbed (docs/testbed.md, elastane_cli/testbed_cluster.py): as many node hosts as the largest
`--hosts` (four by default), each a network namespace whose cgroup holds its NM and every
container on it under a CPU budget (`--host-cpus`, 0.3 core), and a master host with no budget
running the RM and an NM labelled `am` that takes every AM (the paper setups' master instance).
Each node host is pinned to its own share of the machine's CPUs, as a real host owns its cores
(docs/testbed.md, "Pinned hosts"; `--float-hosts` leaves them floating, as before 2026-11-29:
then the 4-host MLR epoch at sync_batches 32 took 0.35-0.39 s against 0.32-0.35 s pinned, in
the same session, the single process and one host unchanged). One cluster serves every run;
nothing else runs on it while a run does.

Per app (MLR, NMF, Lasso), the same job -- the app's preset data (`--preset`, the data seed 0;
`--samples` sets its input rows -- MLR's and Lasso's samples, NMF's users -- the preset's block
size kept, so every host count trains on the same blocks), `--epochs` fixed epochs
(convergence_threshold 1e-12, so no early stop), and the app's default hyper-parameters (batch
size, clock_batches, learning rate: none set) -- runs as:
- `single`: `python -m psruntime.apps.single_process` (the same mini-batch math on a dense
  in-memory model, one process) inside node1's cgroup, so under the same CPU cap as one host;
- `ps<n>` for each n in `--hosts`: a PS job of n workers and n servers, one worker + one server on
  each of nodes 1..n (the spec's placement), its AM on the master.
Each PS variant runs once per `--sync-batches` value (default 1 and 32): the job's sync_batches,
the mini-batches a worker trains between its syncs with the servers (docs/internals.md, "Sync
windows"). 1 pulls and pushes every mini-batch; 32 reads a window of 32 through the worker's
write-back cache and pushes their sums once. 32 was chosen on the data seed 1, not on the seed 0
measured here, as the largest of 8, 16, 32 and 64 whose final objective after 6 epochs at 4
workers (a lockstep in-process simulation of the windows, now bench/sync_windows.py) stays
within 0.25 % of the sequential loop's for MLR and Lasso: 0.05 % and 0.13 % at 32; 5.6 % (MLR)
at 64. Everything else of the job is
the same at both values. Runs go round the apps and variants `--repeats` times (single, ps1,
ps2, ps4 at each sync_batches, then the next app, then again), so a slow spell of the machine falls
on every variant.

Each run starts once the node hosts are quiet (under a tenth of their budget over 2 s, waiting
at most QUIET_WAIT_S; `quiet_before` and `quiet_wait_s` in the run say how it went), so nothing a
previous run left on a host takes this one's budget (not in `--quick`: `quiet_before` null).

Per run: the median epoch time without the first epoch (the epochs' training time: the single
process's own timing, the AM's `epoch_time_s` less its `evaluation_s` -- the objective samples the
AM takes mid-epoch for Optimus's fits, up to a tenth of the training time -- neither counting the
objective's evaluation),
each node host's CPU use over its budget for the run's wall time, the bytes over each host's link
(its veth counters, both directions), the COMM share of a mini-batch (the workers' mean comm_s
over compute_s + comm_s, from the job's final status), the final objective and its distance to
the single process's (`objective_rel_diff`, the PS runs must be within 1 %), and the machine over
the run (elastane_cli/machine_load: the busy share of all cores and the load per core); a run above
90 % busy (`SaturationLimits.budgeted_hosts`: on hosts with CPU budgets the load counts the tasks
waiting on their budget, so it is recorded, not judged) is saturated, listed in `saturated_runs`,
and its figures are not to be read as the system's: a variant's medians (epoch time, COMM share)
leave its saturated runs out when it has a quiet one; when it has none they are taken from the
saturated runs and named in the app's `from_saturated_runs` (e.g. "epoch_s.ps4", so every ratio
built on that epoch time is from a saturated machine too).

A diagnostic beside them, `single_at_once` (when `--hosts` goes beyond 1): the same single process
on each of nodes 1..n (n the largest host count) at the same time, each in its own host's budget,
run after `single` in every repeat. The testbed's hosts share the machine's cores (at 4 hosts on 2
cores, two hosts to a core), so n busy hosts slow each other's work where separate machines would
not; `single_at_once_<n>` = that run's median epoch (over its n processes) over the lone single's
says by how much, on the very code the baseline runs. It is reported, not used: every ratio stays
against the lone single process.

Per app and sync_batches value, from the medians over repeats: `speedup_2` = ps1 / ps2 epoch time, `speedup_4` = ps1 /
ps4, `ps1_over_single` = ps1 / single, `speedup_4_over_single` = single / ps4 (these four always,
null where not measured); for any other host count n measured (8 in the 16-core suite)
`speedup_<n>` and `speedup_<n>_over_single` too; `efficiency` per host count (speedup / n) and
`rows_per_s` per variant (input rows over the epoch time). A job follows sim calibrate's `run_job`.

Last line, JSON: {"mlr": {"speedup_2", "speedup_4", "ps1_over_single", "speedup_4_over_single",
"single_at_once_<n>" (of the
last --sync-batches value, "sync_batches"; every value's figures under "by_sync_batches"),
"epoch_s", "efficiency", "rows_per_s", "objective_rel_diff_max", "objectives_within_1pct",
"comm_share", "from_saturated_runs", "failed_runs", "runs": [...]}, "nmf": ..., "lasso": ...,
"saturated_runs": [...],
...}; exit 1 if any run failed (its figures are then null, the others still reported). Without
the testbed it says why on stderr, prints {"error": ...} and exits 2. `--quick` (the tiny presets,
3 epochs, one repeat) checks that the bench runs; its figures are dominated by per-epoch overheads.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)
from support.watched_job import wait_for  # noqa: E402

from elastane_cli import testbed_hosts  # noqa: E402
from elastane_cli.machine_load import MachineMeter, SaturationLimits  # noqa: E402
from elastane_cli.rm_rest_client import RmRestClient  # noqa: E402
from elastane_cli.sim_calibrate import AM_MEMORY_MB, run_job  # noqa: E402
from elastane_cli.testbed_cluster import MASTER, TestbedCluster  # noqa: E402
from protocol.ps_app_schemas import APP_SCHEMAS  # noqa: E402
from protocol.ps_job_spec import JobSpecError, validate  # noqa: E402

# bench/harmony_colocation.py's host meter (CPU seconds and link bytes per host), a job's COMM
# share from its final status, and the one-worker-one-server-per-host placement.
# Imported by name so that mypy, checking this file, does not check that one too.
colocation: Any = importlib.import_module("harmony_colocation")

PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
APPS = ("mlr", "nmf", "lasso")
EXECUTOR_MB = 512
OBJECTIVE_TOLERANCE = 0.01      # the PS runs' final objective within 1 % of the single process's
AT_ONCE = "single_at_once"      # the diagnostic variant (single_at_once_run)
QUIET_WAIT_S = 20.0             # before each run, the longest wait for the node hosts to go quiet


def log(text: str) -> None:
    print(f"[scaling] {text}", file=sys.stderr, flush=True)


def median_after_first(times: list[float]) -> Optional[float]:
    """The median epoch time without the first epoch (which pays for warming up); None with fewer
    than two epochs."""
    return float(statistics.median(times[1:])) if len(times) >= 2 else None


def rel_diff(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    if value is None or reference is None or reference == 0:
        return None
    return abs(value - reference) / abs(reference)


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return round(num / den, 3) if num is not None and den else None


def data_overrides(app: str, samples: Optional[int]) -> dict[str, int]:
    """The data spec's fields over the preset's: `samples` input rows, or none."""
    return {} if samples is None else {APP_SCHEMAS[app].rows_field: samples}


def job_spec(app: str, hosts: int, ns: argparse.Namespace, sync_batches: int = 1) -> dict[str, Any]:
    """The PS job of `hosts` workers and servers, without its placement (which names the cluster's nodes)."""
    spec: dict[str, Any] = {"app": app, "preset": ns.preset, "workers": hosts, "servers": hosts,
                            "max_epochs": ns.epochs, "convergence_threshold": 1e-12,
                            "executor_memory_mb": EXECUTOR_MB, "heldout_every_epochs": 0,
                            "sync_batches": sync_batches}
    data = data_overrides(app, ns.samples)
    if data:
        spec["data"] = data
    return spec


def input_rows(app: str, hosts: int, ns: argparse.Namespace) -> int:
    """The job's input rows, checking its spec first (JobSpecError: e.g. fewer blocks than workers)."""
    schema = APP_SCHEMAS[app]
    data = msgspec.convert(validate(job_spec(app, hosts, ns)).app_data(), schema.spec)   # the spec's defaults filled in
    return int(getattr(data, schema.rows_field))


class RunMeter:
    """One run's hosts (CPU over budget, link bytes) and machine (busy share, load per core)."""

    def __init__(self, cluster: TestbedCluster, budget: float) -> None:
        self.hosts = colocation.HostMeter(cluster)
        self.budget = budget
        self.machine = MachineMeter()

    def start(self) -> None:
        self.before = self.hosts.read()
        self.machine.start()
        self.t0 = time.monotonic()

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        after = self.hosts.read()
        load = self.machine.stop()
        saturated = SaturationLimits.budgeted_hosts().refuse(load)
        return {"wall_s": round(wall, 2),
                "host_cpu_over_budget": {h: round((after[h][0] - self.before[h][0]) / (self.budget * wall), 3)
                                         for h in after},
                "link_bytes": {h: after[h][1] - self.before[h][1] for h in after},
                "machine": load.to_json(), "saturated": saturated}


def single_argv(app: str, ns: argparse.Namespace) -> list[str]:
    return [PY, "-m", "psruntime.apps.single_process", "--app", app, "--preset", ns.preset,
            "--epochs", str(ns.epochs), "--hparams", json.dumps({"convergence_threshold": 1e-12}),
            "--spec", json.dumps(data_overrides(app, ns.samples))]


def single_result(r: "subprocess.CompletedProcess[str]") -> dict[str, Any]:
    """A single_process run's figures, or its error."""
    if r.returncode != 0:
        return {"error": f"single_process exited {r.returncode}: {r.stderr.strip()[-400:]}"}
    result = json.loads(r.stdout.strip().splitlines()[-1])
    epochs = result["epochs"]
    return {"epoch_s": median_after_first([float(e["seconds"]) for e in epochs]),
            "epochs": len(epochs), "objective": float(epochs[-1]["objective"]) if epochs else None}


def singles_on(cluster: TestbedCluster, app: str, ns: argparse.Namespace,
               hosts: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The single process run on each of `hosts` at once, each in its host's budget: the run's
    meter figures, and each process's figures (or error) in host order."""
    meter = RunMeter(cluster, ns.host_cpus)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    meter.start()
    with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
        done = list(pool.map(lambda h: cluster.testbed.run(h, single_argv(app, ns), env=env, timeout=ns.timeout_s),
                             hosts))
    return meter.stop(), [single_result(r) for r in done]


def single_run(cluster: TestbedCluster, app: str, ns: argparse.Namespace) -> dict[str, Any]:
    """The single-process baseline inside node1's cgroup (its CPU budget)."""
    out, (one,) = singles_on(cluster, app, ns, ["node1"])
    return {**out, **one}


def single_at_once_run(cluster: TestbedCluster, app: str, ns: argparse.Namespace, n: int) -> dict[str, Any]:
    """A diagnostic, not a baseline: the same single process on each of nodes 1..n at the same
    time, each in its host's budget. The n hosts of this testbed share the machine's cores (two
    hosts to a core at 4 hosts on 2 cores), so n busy hosts slow each other's work (shared caches,
    context switches) where separate machines would not; this measures that on the same code the
    single process runs, as `single_at_once_<n>` = its median epoch over the lone single's."""
    out, each = singles_on(cluster, app, ns, cluster.node_names[:n])
    errors = [e["error"] for e in each if "error" in e]
    if errors:
        return {**out, "error": "; ".join(errors)}
    return {**out, "epoch_s": float(statistics.median(e["epoch_s"] for e in each)),
            "epoch_s_each": [round(e["epoch_s"], 3) for e in each], "epochs": each[0]["epochs"],
            "objective": each[0]["objective"]}


async def ps_run_async(cluster: TestbedCluster, app: str, hosts: int, ns: argparse.Namespace,
                       sync_batches: int) -> dict[str, Any]:
    spec = {**job_spec(app, hosts, ns, sync_batches),
            "placement": colocation.placement_on(cluster, cluster.node_names[:hosts])}
    meter = RunMeter(cluster, ns.host_cpus)
    async with RmRestClient(cluster.rm_url, "bench") as client:
        meter.start()
        job = await run_job(client, spec, f"scaling-{app}-ps{hosts}-sync{sync_batches}",
                            t0=asyncio.get_running_loop().time(),
                            timeout_s=ns.timeout_s)
        out = meter.stop()
    if job.final_status != "SUCCEEDED":
        return {**out, "error": f"{job.app_id} ended {job.final_status}"}
    # The AM's final status on shared storage: every epoch (the RM's last report may lag behind).
    status = cluster.final_status(job.app_id)
    history = status.objective_history
    comm, _ = colocation.split_of(status)
    return {**out, "app_id": job.app_id, "epochs": len(history), "jct_s": job.jct_s,
            # The clocks' time alone: the AM's epoch time less its mid-epoch objective samples (for
            # Optimus's fits, up to a tenth of the training time), as the single process's leaves
            # its evaluation out.
            "epoch_s": median_after_first([e.epoch_time_s - e.evaluation_s for e in history]),
            "evaluation_s": median_after_first([e.evaluation_s for e in history]),
            "objective": history[-1].objective if history else None,
            "comm_share": None if comm is None else round(comm, 3)}


def wait_quiet(cluster: TestbedCluster, budget: float, timeout_s: float = 90.0) -> bool:
    """Wait until every node host uses under a tenth of its budget over a 2 s window (the NMs and
    their pre-started interpreters settle after start-cluster); False if they did not in time."""
    def quiet() -> bool:
        before = {h: cluster.testbed.cpu_seconds(h) or 0.0 for h in cluster.node_names}
        t0 = time.monotonic()
        time.sleep(2.0)      # the measuring window itself, not a stand-in for readiness
        wall = time.monotonic() - t0
        return all(((cluster.testbed.cpu_seconds(h) or 0.0) - before[h]) < 0.1 * budget * wall for h in before)
    try:
        wait_for(quiet, timeout_s, "the node hosts to go quiet", poll_s=0.0)
        return True
    except TimeoutError:
        return False


def ps_run(cluster: TestbedCluster, app: str, hosts: int, ns: argparse.Namespace, sync_batches: int) -> dict[str, Any]:
    try:
        return asyncio.run(ps_run_async(cluster, app, hosts, ns, sync_batches))
    except Exception as e:  # noqa: BLE001 - one run failing is reported, the others still run
        return {"error": f"{type(e).__name__}: {e}"}


def quiet_values(runs: list[dict[str, Any]], key: str, figure: str, from_saturated: list[str]) -> list[float]:
    """The runs' `key` values from the runs that were not saturated, when any of them has one;
    otherwise every run's, with `figure` added to `from_saturated` (never silently)."""
    have = [r for r in runs if r.get(key) is not None]
    quiet = [r[key] for r in have if not r.get("saturated")]
    if quiet or not have:
        return quiet
    from_saturated.append(figure)
    return [r[key] for r in have]


def summarise(app: str, runs: list[dict[str, Any]], hosts: list[int], rows: Optional[int] = None) -> dict[str, Any]:
    """An app's figures: medians over its repeats per variant (saturated runs left out where a quiet
    one remains: `quiet_values`), the ratios, the objective check; `rows` (the input rows) gives each
    variant's rows per second."""
    variants = ["single", *(f"ps{n}" for n in hosts)]
    from_saturated: list[str] = []
    epoch: dict[str, Optional[float]] = {}
    for v in variants:
        xs = quiet_values([r for r in runs if r["variant"] == v], "epoch_s", f"epoch_s.{v}", from_saturated)
        epoch[v] = round(statistics.median(xs), 3) if xs else None
    spread = {v: [round(r["epoch_s"], 3) for r in runs if r["variant"] == v and r.get("epoch_s") is not None]
              for v in variants}
    # Each PS run's final objective against the single process's of the same repeat.
    single_obj = {r["repeat"]: r.get("objective") for r in runs if r["variant"] == "single"}
    diffs = []
    for r in runs:
        if r["variant"].startswith("ps") and "error" not in r:
            r["objective_rel_diff"] = d = rel_diff(r.get("objective"), single_obj.get(r["repeat"]))
            if d is not None:
                diffs.append(d)
    comm = {v: quiet_values([r for r in runs if r["variant"] == v], "comm_share", f"comm_share.{v}", from_saturated)
            for v in variants[1:]}
    ps1 = epoch.get("ps1")
    out: dict[str, Any] = {"speedup_2": ratio(ps1, epoch.get("ps2")), "speedup_4": ratio(ps1, epoch.get("ps4")),
                           "ps1_over_single": ratio(ps1, epoch["single"]),
                           "speedup_4_over_single": ratio(epoch["single"], epoch.get("ps4"))}
    for n in hosts:             # issue 38 names 2 and 4; any other count only when it was measured
        if n > 1 and n not in (2, 4):
            out[f"speedup_{n}"] = ratio(ps1, epoch.get(f"ps{n}"))
            out[f"speedup_{n}_over_single"] = ratio(epoch["single"], epoch.get(f"ps{n}"))

    at_once = quiet_values([r for r in runs if r["variant"] == AT_ONCE], "epoch_s", f"epoch_s.{AT_ONCE}",
                           from_saturated)
    if at_once and hosts[-1] > 1:
        # The testbed's own slowdown of n busy hosts (single_at_once_run): a diagnostic beside the
        # ratios, which stay against the lone single process.
        out[f"single_at_once_{hosts[-1]}"] = ratio(statistics.median(at_once), epoch["single"])
        spread[AT_ONCE] = [round(r["epoch_s"], 3) for r in runs if r["variant"] == AT_ONCE and r.get("epoch_s") is not None]

    def per_host(n: int) -> Optional[float]:
        e = epoch.get(f"ps{n}")
        return ratio(ps1, n * e) if e is not None else None
    return {**out, "efficiency": {f"ps{n}": per_host(n) for n in hosts if n > 1},
            "rows_per_s": {v: round(rows / e, 1) if rows and e else None for v, e in epoch.items()},
            "epoch_s": epoch, "epoch_s_runs": spread,
            "objective_rel_diff_max": round(max(diffs), 5) if diffs else None,
            "objectives_within_1pct": bool(diffs) and max(diffs) <= OBJECTIVE_TOLERANCE,
            "comm_share": {v: round(statistics.median(xs), 3) if xs else None for v, xs in comm.items()},
            "from_saturated_runs": from_saturated,
            "failed_runs": sum(1 for r in runs if "error" in r), "runs": runs}


def summarise_by_sync(app: str, runs: list[dict[str, Any]], hosts: list[int], syncs: list[int],
                      rows: Optional[int] = None) -> dict[str, Any]:
    """`summarise` once per sync_batches value (the PS runs of that value, against the same
    single-process runs): the last value's figures at the top, every value's under
    `by_sync_batches`, and all the runs once."""
    per = {}
    for sb in syncs:
        mine = [r for r in runs if r["variant"] in ("single", AT_ONCE) or r.get("sync_batches", 1) == sb]
        per[sb] = {k: v for k, v in summarise(app, mine, hosts, rows).items() if k != "runs"}
    return {**per[syncs[-1]], "sync_batches": syncs[-1], "by_sync_batches": {str(sb): per[sb] for sb in syncs},
            "failed_runs": sum(1 for r in runs if "error" in r), "runs": runs}


def saturated_runs(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """"app/variant/repeatN: why" for every run during which the machine was saturated."""
    return [f"{a}/{r['variant']}{'' if r.get('sync_batches', 1) == 1 else '@' + str(r['sync_batches'])}"
            f"/repeat{r['repeat'] + 1}: {r['saturated']}"
            for a, rs in runs.items() for r in rs if r.get("saturated")]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The options, checked (exit 2 naming the bad one) before any cluster starts, with `app_list`,
    `host_list` (sorted) and `rows` (each app's input rows) added."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--apps", default=",".join(APPS))
    p.add_argument("--hosts", default="1,2,4", help="host counts of the PS runs (one worker + one server each)")
    p.add_argument("--host-cpus", type=float, default=0.3, help="each node host's CPU budget in cores")
    p.add_argument("--preset", default=None, help="the apps' data preset (default small; --quick: tiny)")
    p.add_argument("--samples", type=int, default=None,
                   help="each app's input rows (MLR/Lasso samples, NMF users; default: the preset's)")
    p.add_argument("--epochs", type=int, default=None, help="fixed epochs per run (default 6; --quick: 3)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; --quick: 1)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    p.add_argument("--sync-batches", default=None,
                   help="the PS jobs' sync_batches values, each a run of every host count (default 1,32; "
                        "--quick: 32); the last one's figures are the top-level keys")
    p.add_argument("--float-hosts", action="store_true",
                   help="leave the node hosts free to run on any of the machine's CPUs (default: each pinned "
                        "to its own, docs/testbed.md \"Pinned hosts\")")
    p.add_argument("--quick", action="store_true", help="development: tiny presets, 3 epochs, one repeat")
    ns = p.parse_args(argv)
    ns.preset = ns.preset or ("tiny" if ns.quick else "small")
    ns.epochs = ns.epochs if ns.epochs is not None else (3 if ns.quick else 6)
    ns.repeats = ns.repeats if ns.repeats is not None else (1 if ns.quick else 3)
    try:
        syncs = [int(x) for x in (ns.sync_batches or ("32" if ns.quick else "1,32")).split(",") if x]
    except ValueError:
        p.error(f"--sync-batches: a comma-separated list of positive ints, got {ns.sync_batches!r}")
    if not syncs or min(syncs) < 1 or len(set(syncs)) != len(syncs):
        p.error(f"--sync-batches: a comma-separated list of distinct positive ints, got {ns.sync_batches!r}")
    apps = [a for a in ns.apps.split(",") if a]
    if not apps:
        p.error("--apps: name at least one app")
    try:
        hosts = sorted({int(h) for h in ns.hosts.split(",") if h})
    except ValueError:
        p.error(f"--hosts: a comma-separated list of host counts, got {ns.hosts!r}")
    for a in apps:
        if a not in APPS:
            p.error(f"--apps: unknown app {a!r}; known: {', '.join(APPS)}")
    if not hosts or hosts[0] < 1 or 1 not in hosts:
        p.error(f"--hosts must include 1 (the ratios are against one host), got {ns.hosts!r}")
    if ns.epochs < 2 or ns.repeats < 1 or ns.host_cpus <= 0 or (ns.samples is not None and ns.samples < 1):
        p.error("--epochs must be >= 2 (the first is left out), --repeats >= 1, --host-cpus and --samples > 0")
    rows: dict[str, int] = {}
    for a in apps:              # every job's spec checked before a cluster starts
        try:
            rows[a] = input_rows(a, hosts[-1], ns)
        except JobSpecError as e:
            p.error(f"--preset / --samples / --hosts: the {a} job at {hosts[-1]} hosts is refused: {e}")
    ns.app_list, ns.host_list, ns.rows, ns.sync_list = apps, hosts, rows, syncs
    return ns


def main(argv: Optional[list[str]] = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    ns = parse_args(argv)
    apps: list[str] = ns.app_list
    hosts: list[int] = ns.host_list
    rows: dict[str, int] = ns.rows
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason:
        print(f"scaling: needs the multi-host testbed (docs/testbed.md): {reason}", file=sys.stderr)
        print(json.dumps({"error": f"testbed unavailable: {reason}"}))
        return 2
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in apps}
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        per_host = 2                                     # one worker + one server
        cluster = TestbedCluster(Path(tmp), workers=max(hosts), worker_cpus=ns.host_cpus,
                                 node_memory_mb=per_host * EXECUTOR_MB + 64, node_vcores=per_host,
                                 nm_expiry_s=60, am_expiry_s=60, heartbeat_interval_ms=500, policy="static",
                                 am_host=True, am_host_memory_mb=AM_MEMORY_MB + 128, am_host_vcores=1,
                                 pin_cpus=not ns.float_hosts)
        try:
            cluster.start(timeout_s=60.0 + 15.0 * max(hosts))      # 120 s at 4 hosts, 180 at 8
            if not wait_quiet(cluster, ns.host_cpus):
                log("the node hosts did not go quiet after start-cluster; measuring anyway")
            at_once = [(AT_ONCE, None)] if hosts[-1] > 1 else []
            variants = [("single", None), *at_once, *((f"ps{n}", sb) for sb in ns.sync_list for n in hosts)]
            for rep in range(ns.repeats):
                for app in apps:
                    for variant, sb in variants:
                        log(f"repeat {rep + 1}/{ns.repeats} {app} {variant}"
                            f"{'' if sb is None else f' sync_batches {sb}'}: {ns.preset}, {ns.epochs} epochs, "
                            f"hosts of {ns.host_cpus} cores, AMs on {MASTER}")
                        # Each run starts on quiet hosts: what the last one left running there (its
                        # containers' clean-up, log aggregation) would otherwise take this one's budget.
                        # Not in --quick, a smoke run whose figures are not read (quiet_before None).
                        t_wait = time.monotonic()
                        quiet = None if ns.quick else wait_quiet(cluster, ns.host_cpus, timeout_s=QUIET_WAIT_S)
                        waited = round(time.monotonic() - t_wait, 1)
                        if quiet is False:
                            log(f"the node hosts were not quiet after {waited} s; measuring anyway")
                        if variant == AT_ONCE:
                            r = single_at_once_run(cluster, app, ns, hosts[-1])
                        else:
                            r = (single_run(cluster, app, ns) if sb is None
                                 else ps_run(cluster, app, int(variant[2:]), ns, sb))
                        r.update(variant=variant, repeat=rep, quiet_before=quiet, quiet_wait_s=waited)
                        if sb is not None:
                            r["sync_batches"] = sb
                        runs[app].append(r)
                        log(f"{app} {variant}: {json.dumps(r)}")
        finally:
            cluster.stop()
    out: dict[str, Any] = {a: summarise_by_sync(a, rs, hosts, ns.sync_list, rows[a]) for a, rs in runs.items()}
    out["saturated_runs"] = saturated_runs(runs)
    out.update(host_cpus=ns.host_cpus, pinned_hosts=not ns.float_hosts, hosts=hosts, preset=ns.preset, samples=ns.samples, input_rows=rows,
               epochs=ns.epochs, repeats=ns.repeats, sync_batches=ns.sync_list,
               quick=ns.quick, cores=os.cpu_count(),
               left_behind=[f"{h}: {x}" for h, xs in cluster.leftovers.items() for x in xs])
    print(json.dumps(out))
    return 1 if any("error" in r for rs in runs.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
