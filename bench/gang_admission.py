"""What gang admission does to JCT under load, in the simulator and on the testbed (issue 25 part 4).

    .venv/bin/python bench/gang_admission.py [--jobs 30] [--window-s 300] [--nodes 4] [--seeds 1,2,3]
                                             [--policies static,eps,dorm] [--quick]
    .venv/bin/python bench/gang_admission.py --testbed [--jobs 8] [--repeats 2] [--timeout-s 300]
                                             [--settings off,minimum[,submitted]] [--quick] [--keep-dir DIR]

One generated trace per seed (sim.workload.generate: Poisson arrivals, the shipped calibration's
apps) replayed by the simulator (sim/simulator.py: the real RM core and scheduler, so the RM's
`gang_admission` applies as it does on a cluster) three ways per policy: gang admission off (every
AM starts when its container fits: a job may hold its AM and part of its executors while it waits
for the rest), on with the job's minimum shape (min_workers + min_servers: the default) and on with
its submitted shape (workers + servers: what the PS AM starts training with). The offered load
(--window-s against the jobs' sizes) is high, so jobs queue: that is where holding part of what a
job needs costs the jobs behind it.

Per run: mean JCT over all jobs (a job that never finished counted until the run stopped -- a
lower bound: the finished jobs' mean alone, also shown, favours runs where long jobs stalled),
makespan, finished jobs, and the stalled ones (unfinished when the run stopped: jobs each holding
part of what they need and waiting on each other). Gains are off / on (>1: gang admission is
faster), per policy the median over seeds.

Last line: {"jct_gain_gang_vs_off": <median over policies and seeds of off / minimum mean JCT>,
"jct_gain_gang_submitted_vs_off": ..., "per_policy": {...}, "runs": [...]}.

`--testbed`: the same question on the multi-host testbed (docs/testbed.md; bench/support/
gang_testbed.py): 3 node hosts with room for three 384 MB containers each, `--jobs` tiny MLR PS jobs
(2 workers + 2 servers submitted, min 1 + 1, 3 epochs, `static` policy) submitted at once, on a
fresh cluster with rm.toml `gang_admission = false` and one with `true` (gang shape "minimum";
`--settings off,minimum,submitted` adds gang shape "submitted"), same jobs in the same order, the
settings interleaved over `--repeats`. Per job its JCT (submission to final state); a job unfinished
at `--timeout-s` is killed and counted stalled, a job that failed (its AM gave up waiting for its
executors) counted failed, both with the timeout as JCT (a lower bound). `--quick`: 6 jobs, one
repeat, 150 s timeout (longer than the AM's 120 s executor wait, so a starved AM's end is seen).
Without the testbed it says why, prints {"error": ...} and exits 2. Last line:
{"testbed_jct_gain_gang_vs_off": <mean JCT off / minimum, over all repeats' jobs>,
["testbed_jct_gain_gang_submitted_vs_off",] "mean_jct_s": {setting: s}, "stalled": {setting: n},
"failed": {setting: n}, "repeats", "jobs", "runs": [...]}.

Measured (2026-11-26, --quick, 2-core host): off / minimum = 0.865 (mean JCT 119.5 s off, 138.3 s
minimum, 3 of 6 jobs failed in each). "minimum" admits three jobs whose AM + min 1 + 1 fit (all 9
slots), but the PS AM waits for its submitted 2 + 2 before it trains (appmaster/ps/master.py
`_drive`), so all three wait on workers no one can get until their AMs give up at 120 s: the
deadlock gang admission is meant to prevent, moved, not removed. So rm.toml's default gang_shape is
"submitted", the gang the AM waits for: `--testbed --quick --settings off,submitted` measured off /
submitted = 12.2 (mean JCT 118.1 s off, 9.65 s submitted; 3 of 6 jobs failed off, none submitted).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import msgspec  # noqa: E402

from elastane_cli import testbed_hosts  # noqa: E402
from sim import calibration  # noqa: E402
from support import gang_testbed  # noqa: E402  (bench/support: not a benchmark itself)
from support.sigterm import unwind_on_sigterm  # noqa: E402
from sim.simulator import SimConfig, SimResult, simulate  # noqa: E402
from sim.workload import WorkloadSpec, generate  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "off": {"gang_admission": False},
    "minimum": {"gang_admission": True, "gang_shape": "minimum"},
    "submitted": {"gang_admission": True, "gang_shape": "submitted"},
}


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den == 0:
        return None
    return round(num / den, 3)


def median(xs: list[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def censored_mean_jct(res: SimResult) -> Optional[float]:
    """Mean JCT over every job, one that never finished counted until the run stopped (a lower
    bound on its JCT): the finished jobs' mean alone favours a run where the long jobs stalled."""
    stop = res.t0 + res.summary.virtual_s
    jcts = [(r.end if r.end is not None else stop) - r.arrival for r in res.records]
    return round(statistics.fmean(jcts), 1) if jcts else None


def testbed_main(ns: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    """--testbed: the loaded workload on the testbed under each setting, the settings interleaved."""
    jobs = 6 if ns.quick else (ns.jobs if ns.jobs is not None else 8)
    repeats = 1 if ns.quick else ns.repeats
    timeout_s = 150.0 if ns.quick else ns.timeout_s
    settings = [x for x in ns.settings.split(",") if x]
    unknown = [x for x in settings if x not in gang_testbed.SETTINGS]
    if "off" not in settings or unknown or len(settings) < 2:
        p.error(f"--settings must name off and at least one of minimum,submitted (unknown: {unknown or 'none'})")
    if jobs < 1 or repeats < 1 or timeout_s <= 0:
        p.error("--jobs and --repeats must be >= 1 and --timeout-s > 0")
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason:
        print(f"gang_admission: --testbed needs the multi-host testbed (docs/testbed.md): {reason}", file=sys.stderr)
        print(json.dumps({"error": f"testbed unavailable: {reason}"}))
        return 2
    unwind_on_sigterm()   # a SIGTERM stops the testbed cluster this bench started
    shape = gang_testbed.TestbedShape()
    runs: list[dict[str, Any]] = []
    per: dict[str, list[gang_testbed.RunOutcome]] = {s: [] for s in settings}
    for rep in range(repeats):
        for setting in settings:
            name = f"{setting}-{rep + 1}"
            if ns.keep_dir:
                res = gang_testbed.run_workload(ns.keep_dir / name, shape, jobs, setting, timeout_s)
            else:
                with tempfile.TemporaryDirectory(prefix="elastane-gang-") as tmp:
                    res = gang_testbed.run_workload(Path(tmp), shape, jobs, setting, timeout_s)
            per[setting].append(res)
            runs.append({"setting": setting, "repeat": rep + 1, "mean_jct_s": res.mean_jct_s,
                         "succeeded_mean_jct_s": res.succeeded_mean_jct_s, "stalled": res.stalled,
                         "failed": res.failed, "wall_s": res.wall_s,
                         "jobs": [{"name": j.name, "jct_s": j.jct_s, "status": j.final_status,
                                   "diagnostics": j.diagnostics} for j in res.jobs]})
            print(f"testbed gang {setting:>9} repeat {rep + 1}: mean JCT {res.mean_jct_s} s (succeeded jobs' "
                  f"{res.succeeded_mean_jct_s}), stalled {res.stalled}, failed {res.failed}, "
                  f"JCTs {[(j.jct_s, j.final_status) for j in res.jobs]}", file=sys.stderr, flush=True)

    def mean_jct(setting: str) -> Optional[float]:
        jcts = [x for r in per[setting] for x in r.censored_jcts()]
        return round(statistics.fmean(jcts), 2) if jcts else None

    means = {s: mean_jct(s) for s in settings}
    out: dict[str, Any] = {"testbed_jct_gain_gang_vs_off": ratio(means["off"], means.get("minimum"))}
    if "submitted" in per:
        out["testbed_jct_gain_gang_submitted_vs_off"] = ratio(means["off"], means["submitted"])
    print(json.dumps({
        **out, "mean_jct_s": means,
        "stalled": {s: sum(r.stalled for r in per[s]) for s in per},
        "failed": {s: sum(r.failed for r in per[s]) for s in per},
        "repeats": repeats, "jobs": jobs, "timeout_s": timeout_s, "nodes": shape.nodes,
        "node_memory_mb": shape.node_memory_mb, "epochs": shape.epochs, "runs": runs,
    }))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=None, help="simulator: 30; --testbed: 8")
    p.add_argument("--window-s", type=float, default=300.0, help="arrival window (shorter: more load)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--node-memory-mb", type=int, default=8192)
    p.add_argument("--node-vcores", type=int, default=8)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--policies", default="static,eps,dorm")
    p.add_argument("--epochs", default="10,40", help="each job's max_epochs drawn from [lo, hi]")
    p.add_argument("--calibration", type=Path, default=calibration.DEFAULT_PATH)
    p.add_argument("--quick", action="store_true",
                   help="12 jobs in 120 s, one seed, static only (--testbed: 6 jobs, one repeat, 150 s timeout)")
    p.add_argument("--testbed", action="store_true", help="run on the multi-host testbed instead (docs/testbed.md)")
    p.add_argument("--repeats", type=int, default=2, help="--testbed: rounds of the settings, interleaved")
    p.add_argument("--settings", default="off,minimum",
                   help="--testbed: rm.toml gang settings compared (off, minimum = gang_admission true, submitted)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="--testbed: a run's jobs count stalled after this")
    p.add_argument("--keep-dir", type=Path, default=None, help="--testbed: keep each run's testbed dir here")
    ns = p.parse_args(argv)
    if ns.testbed:
        return testbed_main(ns, p)
    if ns.jobs is None:
        ns.jobs = 30
    if ns.quick:
        ns.jobs, ns.window_s, ns.seeds, ns.policies = 12, 120.0, "1", "static"
    try:
        seeds = [int(s) for s in ns.seeds.split(",") if s]
        lo, hi = (int(x) for x in ns.epochs.split(","))
    except ValueError:
        p.error("--seeds wants integers like 1,2,3 and --epochs two integers like 10,40")
    pols = [x for x in ns.policies.split(",") if x]
    if ns.jobs < 1 or not seeds or not pols:
        p.error("--jobs must be >= 1 and --seeds / --policies must name something")
    cal = calibration.load(ns.calibration)
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        trace = generate(WorkloadSpec(jobs=ns.jobs, window_s=ns.window_s, apps=tuple(sorted(cal.apps)),
                                      arrivals="poisson", epochs=(lo, hi)), seed)
        for policy in pols:
            row: dict[str, Any] = {"seed": seed, "policy": policy}
            for mode, knobs in MODES.items():
                base = SimConfig().rm
                cfg = SimConfig(nodes=ns.nodes, node_memory_mb=ns.node_memory_mb, node_vcores=ns.node_vcores,
                                rm=msgspec.structs.replace(base, **knobs))
                res = simulate(trace, policy, cal, cfg)
                s = res.summary
                row[mode] = {"mean_jct_s": censored_mean_jct(res), "finished_mean_jct_s": s.mean_jct_s,
                             "makespan_s": s.makespan_s, "finished": s.finished, "stalled": s.jobs - s.finished,
                             "mean_utilization": round(s.mean_utilization, 3)}
                print(f"seed {seed} {policy:>8} gang {mode:>9}: mean JCT {row[mode]['mean_jct_s']} "
                      f"(finished jobs' {s.mean_jct_s}), makespan {s.makespan_s}, finished {s.finished}/{s.jobs}",
                      file=sys.stderr, flush=True)
            row["jct_gain_minimum"] = ratio(row["off"]["mean_jct_s"], row["minimum"]["mean_jct_s"])
            row["jct_gain_submitted"] = ratio(row["off"]["mean_jct_s"], row["submitted"]["mean_jct_s"])
            runs.append(row)
    per_policy = {pol: {"jct_gain_minimum": median([r["jct_gain_minimum"] for r in runs if r["policy"] == pol]),
                        "jct_gain_submitted": median([r["jct_gain_submitted"] for r in runs if r["policy"] == pol]),
                        "stalled_off": sum(r["off"]["stalled"] for r in runs if r["policy"] == pol),
                        "stalled_minimum": sum(r["minimum"]["stalled"] for r in runs if r["policy"] == pol),
                        "stalled_submitted": sum(r["submitted"]["stalled"] for r in runs if r["policy"] == pol)}
                  for pol in pols}
    print(f"{'policy':>8} {'gain (minimum)':>15} {'gain (submitted)':>17} {'stalled off/min/sub':>20}")
    for pol, g in per_policy.items():
        print(f"{pol:>8} {g['jct_gain_minimum']!s:>15} {g['jct_gain_submitted']!s:>17} "
              f"{g['stalled_off']:>8}/{g['stalled_minimum']}/{g['stalled_submitted']}")
    print(json.dumps({
        "jct_gain_gang_vs_off": median([r["jct_gain_minimum"] for r in runs]),
        "jct_gain_gang_submitted_vs_off": median([r["jct_gain_submitted"] for r in runs]),
        "per_policy": per_policy, "jobs": ns.jobs, "nodes": ns.nodes, "window_s": ns.window_s, "seeds": seeds,
        "epochs": [lo, hi], "runs": runs,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
