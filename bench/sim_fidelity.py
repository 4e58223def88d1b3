"""The simulator against the multi-host testbed: the same trace, the same policy, plain per-job errors.

    .venv/bin/python bench/sim_fidelity.py [--quick] [--policies static,drf,optimus,eps,harmony]
                                           [--jobs 8] [--repeats 3] [--hosts 4] [--calibration FILE]

The trace (`TRACE_ROWS`: the first `--jobs` (8-12, default 8) of 12 jobs of the four apps at their
calibration reference data, arriving `GAP_S` apart so later ones queue behind earlier ones; half of them elastic,
so drf, optimus and eps have something to resize) runs for each policy

1. on the multi-host testbed (docs/testbed.md, elastane_cli/testbed_cluster.TestbedCluster):
   `--hosts` (3-4) node hosts, each `host_vcores` vcores with a CPU budget of at most 0.3 core
   shared out by vcore (NM `cpu_limit_cores`), every vcore getting the calibration's
   `core_per_vcore` -- the CPU the simulated executors train at -- and a master host without a
   budget running the RM and, through the `am` node label, every AM; each job submitted at its
   arrival time (the reference job spec with the trace's shape, bounds, threshold and epoch limit)
   and followed to its end; its JCT is the RM's finishedTime - startedTime. `--repeats` times
   (default 3), the repeats interleaved over the policies (static, drf, ..., static, drf, ...), so
   a slow spell of the machine falls on every policy;
2. in the simulator on the same cluster (the hosts' vcores and memory, one AM node; NM heartbeats
   every 250 ms) with the calibration file and the same policy (deterministic: once).

Per job: |JCT_sim - JCT_real| / JCT_real, a plain error (no rescaling by a probe); per run their
mean (the per-job JCT mean absolute error, the judged figure), the largest single job's error
(`jct_abs_error_max_job`: reported, not judged) and the makespan's error. The machine's busy
share and load are measured over every real run (elastane_cli/machine_load.py); a run on a
saturated machine is reported (`saturated_runs`, and in its policy's `runs`) and used for
nothing. Per policy over its accepted runs: the median of the
errors, and the spread between repeats (max - min over the median of the runs' real mean JCT and
of their real makespans, the larger).

`verdict` (`decide`): "failed" when every run was saturated (or none ran, or none was accepted); "inconclusive" when
fewer than 3 repeats were asked for (`--quick`: one, a smoke run), when a policy has fewer than
`--repeats` accepted runs or an error the simulator could not give (jobs it
did not finish), or the largest spread between repeats is above 5 % (the errors would measure the
machine's noise); otherwise "pass" when `jct_mean_abs_error_max` (the largest over the policies
of the per-job JCT mean absolute error) and `makespan_error_max` are both <= 0.10 (issue 33's
target), else "fail". A single job's error may be above 0.10 in a pass: `jct_abs_error_max_job`
says how far.

Run time: 15 runs of 8 jobs, each under 3 minutes (testbed start, the jobs, stop: 2.6-3 minutes
measured on the saturated 2-core machine), within 45 minutes (`wall_s` and `within_budget` say
whether it was); 12 jobs take about a third longer.

Without the testbed (root, iproute2, util-linux, OpenSSH: `testbed_hosts.unavailable_reason`) it
says why on stderr, prints {"error": ...} and exits 2. Exit 1 on verdict "failed".

Last line, JSON: {"jct_mean_abs_error_max", "jct_abs_error_max_job", "makespan_error_max", "repeats",
"saturated_runs", "repeat_spread_max", "verdict", "verdict_reason", "policies": {policy:
{"jct_mean_abs_error", "jct_abs_error_max_job", "makespan_error", "repeat_spread", "accepted_runs",
"sim": {...}, "runs": [...]}}, "plan", "trace_jobs", "wall_s", "within_budget", "cores",
"calibration"}.
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
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

from elastane_cli import testbed_hosts  # noqa: E402
from elastane_cli.context import default_user  # noqa: E402
from elastane_cli.machine_load import MachineMeter, SaturationLimits  # noqa: E402
from elastane_cli.rm_rest_client import RmRestClient  # noqa: E402
from elastane_cli.sim_calibrate import (AM_MEMORY_MB, EXECUTOR_MEMORY_MB, CalibrationPlan, reference_job,  # noqa: E402
                                       run_job)
from elastane_cli.testbed_cluster import TestbedCluster  # noqa: E402
from rm import policies  # noqa: E402
from sim import calibration  # noqa: E402
from sim.sim_job import JobTimings  # noqa: E402
from sim.simulator import SimConfig, SimResult, simulate  # noqa: E402
from sim.trace import TraceJob  # noqa: E402

# (app, workers, servers, max_workers, threshold); every job's epoch limit is MAX_EPOCHS.
# Two or three jobs fit the hosts at once at their submitted shapes, so later ones queue.
TRACE_ROWS: tuple[tuple[str, int, int, int, float], ...] = (
    ("mlr", 2, 1, 3, 0.03), ("nmf", 2, 1, 2, 0.03), ("lasso", 1, 1, 3, 0.03), ("lda", 2, 1, 2, 0.03),
    ("mlr", 1, 1, 1, 0.02), ("lasso", 2, 1, 3, 0.02), ("nmf", 1, 1, 3, 0.02), ("lda", 1, 1, 1, 0.02),
    ("mlr", 2, 1, 2, 0.02), ("lasso", 1, 1, 1, 0.03), ("nmf", 2, 1, 3, 0.03), ("mlr", 1, 1, 3, 0.03),
)
GAP_S = 10.0
MAX_EPOCHS = 8
DEFAULT_JOBS = 8
MIN_REPEATS = 3               # fewer repeats give no spread to judge: never a verdict
DEFAULT_POLICIES = ("static", "drf", "optimus", "eps", "harmony")
TARGET = 0.10                 # issue 33: per-job JCT mean absolute error and makespan error <= 10 %
SPREAD_LIMIT = 0.05           # a spread between repeats above it: "inconclusive"
MAX_HOST_CPUS = 0.3           # issue 33: hosts of <= 0.3 core
HOST_VCORES = 4
BUDGET_S = 45 * 60.0
# A calibration file that does not record its per-vcore CPU (files before issue 33): this share,
# which makes HOST_VCORES vcores a 0.3-core host; the output says the plan does not match the
# calibration then. Such files were measured on a local cluster of 2 nodes x 4 vcores sharing the
# 2-core dev machine's cores by vcore: 0.25 core per vcore, which would leave one vcore on a 0.3-core
# host -- too few for the trace -- so their simulated epochs are about 3x too fast for these hosts.
DEFAULT_CORE_PER_VCORE = MAX_HOST_CPUS / HOST_VCORES
LEGACY_CORE_PER_VCORE = 0.25


@dataclass(frozen=True)
class Plan(CalibrationPlan):
    """The testbed and the simulated cluster the trace runs on (module doc): the calibration's kind
    of hosts (`CalibrationPlan`: budgets shared out by vcore, AMs on the master), sized here."""

    from_calibration: bool = False

    @classmethod
    def of(cls, cal: calibration.Calibration, hosts: int) -> "Plan":
        """`hosts` hosts at the calibration's CPU per vcore, as many vcores each as fit in 0.3 core,
        pinned to CPUs when the calibration's were."""
        cpv = cal.core_per_vcore or DEFAULT_CORE_PER_VCORE
        vcores = max(1, min(HOST_VCORES * 2, int(MAX_HOST_CPUS / cpv + 1e-9)))
        return cls(hosts, vcores, cpv, pin_cpus=cal.pinned_hosts, from_calibration=cal.core_per_vcore > 0)

    def to_json(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "host_vcores": self.host_vcores, "core_per_vcore": self.core_per_vcore,
                "host_cpus": self.host_cpus, "pinned_hosts": self.pin_cpus, "core_per_vcore_from_calibration": self.from_calibration,
                "ams": "on the master host",
                "note": "" if self.from_calibration else (
                    f"the calibration records no core_per_vcore (it predates issue 33; measured at about "
                    f"{LEGACY_CORE_PER_VCORE} core per vcore): the hosts give {self.core_per_vcore:g}, so the "
                    f"errors measure that mismatch too; refit the calibration first")}


def trace(jobs: int, policy: str = "static") -> list[TraceJob]:
    """The trace's first `jobs` jobs. Under `harmony` each job's bounds admit one worker and one
    server per node (Harmony's rule: a job runs on as many nodes as it has of each): min shape 1x1,
    max servers = max workers; the same jobs otherwise, and the same trace for the testbed and the
    simulator."""
    out = []
    for i, (app, w, s, mw, th) in enumerate(TRACE_ROWS[:jobs]):
        bounds: dict[str, Any] = ({"min_workers": 1, "min_servers": 1, "max_servers": max(mw, s)}
                                  if policy == "harmony" else {})
        out.append(TraceJob(name=f"f{i + 1}-{app}", arrival_s=i * GAP_S, app=app, workers=w, servers=s,
                            max_workers=mw, threshold=th, max_epochs=MAX_EPOCHS, executor_memory_mb=EXECUTOR_MEMORY_MB,
                            **bounds))
    return out


def real_spec(job: TraceJob) -> dict[str, Any]:
    return {**reference_job(job.app, MAX_EPOCHS), "workers": job.workers, "servers": job.servers,
            "min_workers": job.shape_min[0], "min_servers": job.shape_min[1],
            "max_workers": job.shape_max[0], "max_servers": job.shape_max[1],
            "convergence_threshold": job.threshold}


def sim_config(plan: Plan, jobs: int) -> SimConfig:
    return SimConfig(nodes=plan.hosts, node_memory_mb=plan.node_memory_mb, node_vcores=plan.host_vcores,
                     am_nodes=1, am_node_memory_mb=(AM_MEMORY_MB + 64) * jobs, am_node_vcores=jobs,
                     heartbeat_s=0.25, timings=JobTimings(am_memory_mb=AM_MEMORY_MB))


def run_real(jobs: list[TraceJob], policy: str, plan: Plan, base: Path) -> dict[str, Any]:
    """The trace on a fresh testbed cluster (removed after), the machine measured over it."""
    cluster: TestbedCluster = plan.cluster(base, policy, jobs_at_once=len(jobs)).start(timeout_s=180)
    try:
        async def go() -> dict[str, dict[str, float]]:
            async with RmRestClient(cluster.rm_url, default_user()) as client:
                t0 = asyncio.get_running_loop().time() + 0.5
                runs = await asyncio.gather(*(run_job(client, real_spec(j), j.name, at_s=j.arrival_s, t0=t0,
                                                      timeout_s=900.0) for j in jobs))
                out = {}
                for j, r in zip(jobs, runs):
                    app = await client.app(r.app_id)
                    out[j.name] = {"arrival": app["startedTime"] / 1000.0, "end": app["finishedTime"] / 1000.0,
                                   "jct": float(r.jct_s or 0.0), "epochs": float(r.epochs),
                                   "ok": float(r.final_status == "SUCCEEDED")}
                return out
        meter = MachineMeter().start()
        jobs_out = asyncio.run(go())
        load = meter.stop()
    finally:
        cluster.stop()
    return {"jobs": jobs_out, "machine": load}


# ----- the arithmetic (pure) ------------------------------------------------------------------------

def rel_error(sim: Optional[float], real: Optional[float]) -> Optional[float]:
    """|sim - real| / real; None when either is missing or real is not positive."""
    if sim is None or real is None or real <= 0:
        return None
    return abs(sim - real) / real


def run_errors(sim_jct: dict[str, Optional[float]], sim_makespan: Optional[float],
               real: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One real run against the simulator: per-job errors, their mean, the largest, the makespan's
    error. A job that failed on the testbed or did not finish in the simulator has no error and
    makes the run's mean and largest None (the comparison is incomplete, not better)."""
    per_job = {name: rel_error(sim_jct.get(name), r["jct"] if r["ok"] else None) for name, r in real.items()}
    real_makespan = max(r["end"] for r in real.values()) - min(r["arrival"] for r in real.values())
    errs = list(per_job.values())
    complete = [e for e in errs if e is not None] if errs and None not in errs else None
    return {"jct_mean_abs_error": statistics.fmean(complete) if complete else None,
            "jct_abs_error_max_job": max(complete) if complete else None,
            "makespan_error": rel_error(sim_makespan, real_makespan),
            "real_mean_jct_s": statistics.fmean(r["jct"] for r in real.values()),
            "real_makespan_s": real_makespan, "per_job": per_job}


def spread(values: Sequence[float]) -> float:
    """(max - min) / median; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else 0.0


def policy_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A policy's figures over its runs that were not saturated: median errors and the spread."""
    ok = [r for r in runs if not r.get("saturated")]
    jct = [r["jct_mean_abs_error"] for r in ok]
    worst_job = [r.get("jct_abs_error_max_job") for r in ok]
    worst_known = [e for e in worst_job if e is not None]
    mk = [r["makespan_error"] for r in ok]
    return {"accepted_runs": len(ok),
            "jct_mean_abs_error": None if not jct or None in jct else round(statistics.median(jct), 4),
            # the largest one job's error in any accepted run: beside the judged mean, not judged
            "jct_abs_error_max_job": round(max(worst_known), 4) if worst_known and len(worst_known) == len(worst_job)
            else None,
            "makespan_error": None if not mk or None in mk else round(statistics.median(mk), 4),
            "repeat_spread": round(max(spread([r["real_mean_jct_s"] for r in ok]),
                                       spread([r["real_makespan_s"] for r in ok])), 4)}


def decide(summaries: dict[str, dict[str, Any]], total_runs: int, saturated_runs: int, repeats: int,
           target: float = TARGET, spread_limit: float = SPREAD_LIMIT) -> dict[str, Any]:
    """The headline keys and the verdict over every policy's summary (module doc)."""
    jct = [s["jct_mean_abs_error"] for s in summaries.values()]
    worst_job = [s.get("jct_abs_error_max_job") for s in summaries.values()]
    worst_known = [e for e in worst_job if e is not None]
    mk = [s["makespan_error"] for s in summaries.values()]
    spreads = [s["repeat_spread"] for s in summaries.values()]
    out: dict[str, Any] = {
        "jct_mean_abs_error_max": max(jct) if jct and None not in jct else None,
        "jct_abs_error_max_job": max(worst_known) if worst_known and len(worst_known) == len(worst_job) else None,
        "makespan_error_max": max(mk) if mk and None not in mk else None,
        "repeats": repeats, "saturated_runs": saturated_runs,
        "repeat_spread_max": max(spreads) if spreads else None}
    accepted = sum(s["accepted_runs"] for s in summaries.values())
    if total_runs == 0 or saturated_runs >= total_runs:
        verdict, why = "failed", "every run was on a saturated machine" if total_runs else "no run"
    elif accepted == 0:
        verdict, why = "failed", "no run was accepted (the others broke)"
    elif repeats < MIN_REPEATS:
        verdict, why = "inconclusive", f"{repeats} repeat(s) asked for: a verdict needs {MIN_REPEATS}"
    elif any(s["accepted_runs"] < repeats for s in summaries.values()):
        short = sorted(p for p, s in summaries.items() if s["accepted_runs"] < repeats)
        verdict, why = "inconclusive", f"fewer than {repeats} accepted runs: {', '.join(short)}"
    elif out["jct_mean_abs_error_max"] is None or out["makespan_error_max"] is None:
        missing = sorted(p for p, s in summaries.items() if s["jct_mean_abs_error"] is None or s["makespan_error"] is None)
        verdict, why = "inconclusive", f"no error for {', '.join(missing)} (jobs failed or did not finish)"
    elif out["repeat_spread_max"] > spread_limit:
        verdict, why = "inconclusive", f"spread between repeats {out['repeat_spread_max']:.1%} > {spread_limit:.0%}"
    elif out["jct_mean_abs_error_max"] <= target and out["makespan_error_max"] <= target:
        verdict, why = "pass", f"every policy's JCT mean absolute error and makespan error <= {target:.0%}"
    else:
        verdict, why = "fail", f"a policy's JCT mean absolute error or makespan error above {target:.0%}"
    out.update(verdict=verdict, verdict_reason=why)
    return out


# ----- the bench -------------------------------------------------------------------------------------

def simulated(policy: str, jobs: list[TraceJob], cal: calibration.Calibration, plan: Plan) -> dict[str, Any]:
    try:
        res: SimResult = simulate(jobs, policy, cal, sim_config(plan, len(jobs)))
    except Exception as e:  # noqa: BLE001 - a policy the simulator cannot run is reported, the others go on
        return {"error": f"{type(e).__name__}: {e}", "jct": {}, "makespan_s": None}
    return {"jct": {r.name: r.jct for r in res.records}, "makespan_s": res.summary.makespan_s,
            "finished": res.summary.finished, "epochs": {r.name: r.epochs for r in res.records},
            "extrapolated_job_share": res.extrapolated_job_share}


def main(argv: Optional[list[str]] = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: one repeat (never a verdict)")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help=f"jobs of the trace, 8-{len(TRACE_ROWS)}")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    p.add_argument("--repeats", type=int, default=None,
                   help="real runs per policy, interleaved (default 3, --quick 1; >= 3 for a verdict)")
    p.add_argument("--hosts", type=int, default=4, help="testbed node hosts (3 or 4)")
    p.add_argument("--calibration", type=Path, default=calibration.DEFAULT_PATH)
    ns = p.parse_args(argv)
    names = [x for x in ns.policies.split(",") if x]
    unknown = [x for x in names if x not in policies.known()]
    if not names or unknown:
        p.error(f"--policies: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(policies.known())}")
    ns.repeats = ns.repeats if ns.repeats is not None else (1 if ns.quick else MIN_REPEATS)
    if ns.repeats < 1:
        p.error(f"--repeats must be >= 1, got {ns.repeats}")
    if not DEFAULT_JOBS <= ns.jobs <= len(TRACE_ROWS):
        p.error(f"--jobs must be in {DEFAULT_JOBS}..{len(TRACE_ROWS)}, got {ns.jobs}")
    if ns.hosts not in (3, 4):
        p.error(f"--hosts must be 3 or 4, got {ns.hosts}")
    try:
        cal = calibration.load(ns.calibration)
    except calibration.CalibrationError as e:
        p.error(str(e))
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason:
        print(f"sim_fidelity: needs the multi-host testbed (docs/testbed.md): {reason}", file=sys.stderr)
        print(json.dumps({"error": f"testbed unavailable: {reason}"}))
        return 2
    wall = time.monotonic()
    plan = Plan.of(cal, ns.hosts)
    n_jobs = ns.jobs
    traces = {policy: trace(n_jobs, policy) for policy in names}
    limits = SaturationLimits.budgeted_hosts()    # the hosts have CPU budgets (machine_load.py)
    sims = {policy: simulated(policy, traces[policy], cal, plan) for policy in names}
    runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in names}
    for rep in range(ns.repeats):
        for policy in names:
            with tempfile.TemporaryDirectory(prefix="elastane-fidelity-") as tmp:
                try:
                    real = run_real(traces[policy], policy, plan, Path(tmp))
                except Exception as e:  # noqa: BLE001 - a run that broke is reported, the others still run
                    runs[policy].append({"error": f"{type(e).__name__}: {e}", "saturated": False,
                                         "jct_mean_abs_error": None, "makespan_error": None,
                                         "real_mean_jct_s": 0.0, "real_makespan_s": 0.0})
                    print(f"{policy} #{rep + 1}: {runs[policy][-1]['error']}", file=sys.stderr)
                    continue
            load = real["machine"]
            why = limits.refuse(load)
            r = run_errors(sims[policy]["jct"], sims[policy]["makespan_s"], real["jobs"])
            r.update(saturated=why is not None, refused=why or "", machine=load.to_json(),
                     real_epochs={k: int(v["epochs"]) for k, v in real["jobs"].items()},
                     real_jct_s={k: round(v["jct"], 2) for k, v in real["jobs"].items()})
            runs[policy].append(r)
            print(f"{policy} #{rep + 1}: JCT error {r['jct_mean_abs_error']}, makespan error {r['makespan_error']}, "
                  f"machine {load.busy_share:.0%} busy, load {load.load_per_core:.2f}/core"
                  + (f": SATURATED ({why}), not used" if why else ""), file=sys.stderr)
    # A run that broke counts as not accepted (its summary entry has no error), not as saturated.
    summaries = {policy: policy_summary([r for r in rs if "error" not in r]) for policy, rs in runs.items()}
    saturated = sum(bool(r.get("saturated")) for rs in runs.values() for r in rs)
    out = decide(summaries, sum(len(rs) for rs in runs.values()), saturated, ns.repeats)
    wall_s = time.monotonic() - wall

    def rounded(r: dict[str, Any]) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else
                    {j: None if e is None else round(e, 4) for j, e in v.items()} if k == "per_job" else v)
                for k, v in r.items()}
    out.update(policies={policy: {**summaries[policy], "sim": {k: v for k, v in sims[policy].items()},
                                  "runs": [rounded(r) for r in runs[policy]]} for policy in names},
               plan=plan.to_json(), trace_jobs=n_jobs, wall_s=round(wall_s, 1), within_budget=wall_s <= BUDGET_S,
               cores=os.cpu_count(), calibration=str(ns.calibration))
    print(json.dumps(out))
    return 1 if out["verdict"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
