"""What gang admission does to JCT under load, in the simulator and on the testbed (issue 25 part 4).

    .venv/bin/python bench/gang_admission.py [--jobs 30] [--window-s 300] [--nodes 4] [--seeds 1-5]
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

Per run: the finished jobs' mean JCT, makespan, finished jobs, and the failed or stalled ones
(unfinished when the run stopped: jobs each holding part of what they need and waiting on each
other). Issue 33's rule: no timeout or stop time stands in for a JCT, so the failed and stalled
jobs are counted apart per arm, and a JCT ratio covers only the jobs that finished in both arms
(sim.metrics.completed_in_both): off's mean JCT over gang admission's on those jobs (>1: gang
admission is faster for the jobs both finished; it says nothing of the jobs one arm lost, which
`failed_*` count). "With" is the RM's default gang shape (RMConfig.gang_shape, "submitted");
"minimum" is reported beside it. Seeds: five by default (`--seeds 6-10` for others); each ratio
is the median over (policy, seed) runs with its min and max.

Last line: {"failed_without": <jobs failed or stalled with gang admission off, over all runs>,
"failed_with": <the same with the default gang shape>, "failed_minimum", "jct_gain_completed_in_both"
(+ _min / _max / _n), "jct_gain_minimum_completed_in_both" (+ _min / _max / _n), "completed_in_both" (jobs
the ratio covers, over all runs), "per_policy": {...}, "runs": [...]}.

`--testbed`: the same question on the multi-host testbed (docs/testbed.md; bench/support/
gang_testbed.py): 3 node hosts with room for three 384 MB containers each, `--jobs` tiny MLR PS jobs
(2 workers + 2 servers submitted, min 1 + 1, 3 epochs, `static` policy) submitted at once, on a
fresh cluster with rm.toml `gang_admission = false` and one with `true` (gang shape "minimum";
`--settings off,minimum,submitted` adds gang shape "submitted"), same jobs in the same order, the
settings interleaved over `--repeats`. Per job its JCT (submission to final state); a job unfinished
at `--timeout-s` is killed and counted stalled, a job that failed (its AM gave up waiting for its
executors) counted failed; neither has a JCT. `--quick`: 6 jobs, one repeat, 150 s timeout (longer
than the AM's 120 s executor wait, so a starved AM's end is seen). Without the testbed it says why,
prints {"error": ...} and exits 2. Last line: {"failed_without", "failed_with" (failed + stalled
under "off" and under the last gang setting run: "submitted" when run, else "minimum"),
"jct_gain_completed_in_both" (off's mean JCT over the gang setting's, over the (repeat, job) pairs
that succeeded in both; null when none did), "completed_in_both", "testbed_jct_gain_gang_vs_off" /
"testbed_jct_gain_gang_submitted_vs_off" (the same per setting), "mean_jct_s" (succeeded jobs'),
"stalled", "failed", "repeats", "jobs", "runs": [...]}.

Measured 2026-11-28 ~20:00 UTC, simulator, defaults (30 jobs in 300 s on 4 nodes, seeds 1-5; static,
eps, dorm; the machine's load does not change a simulated figure): failed or stalled jobs 64 with gang
admission off (eps 41, dorm 23, static 0) against 0 with it ("submitted" and "minimum" alike);
`jct_gain_completed_in_both` 1.92 (1.19-5.36) over the 15 (policy, seed) runs and 386 jobs that
finished in both arms (static 3.03, 1.89-3.80; eps 1.47, 1.19-5.36; dorm 1.92, 1.20-3.66).

Measured before issue 33 (2026-11-26, --quick, 2-core host), with the timeout as a failed job's
JCT -- figures that measured the timeout, kept for the failure counts: off / minimum = 0.865
(3 of 6 jobs failed in each). "minimum" admits three jobs whose AM + min 1 + 1 fit (all 9
slots), but the PS AM waits for its submitted 2 + 2 before it trains (appmaster/ps/runtime/master.py
`_drive`), so all three wait on workers no one can get until their AMs give up at 120 s: the
deadlock gang admission is meant to prevent, moved, not removed. So rm.toml's default gang_shape is
"submitted", the gang the AM waits for: `--testbed --quick --settings off,submitted` failed 3 of 6
jobs off and none submitted (its 12.2x was the 150 s timeout over 9.65 s; not a JCT gain).
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
from sim.metrics import completed_in_both, ratio, spread_keys  # noqa: E402
from sim.simulator import SimConfig, SimResult, simulate  # noqa: E402
from support.seeds import DEFAULT_TEXT, parse_seeds  # noqa: E402
from sim.workload import WorkloadSpec, generate  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "off": {"gang_admission": False},
    "minimum": {"gang_admission": True, "gang_shape": "minimum"},
    "submitted": {"gang_admission": True, "gang_shape": "submitted"},
}


def mean(xs: list[float]) -> Optional[float]:
    return round(statistics.fmean(xs), 2) if xs else None


def gain_completed_in_both(without: list[tuple[str, Optional[float]]], with_: list[tuple[str, Optional[float]]]
                           ) -> tuple[Optional[float], int]:
    """(off's mean JCT over the gang arm's, over the jobs that finished in both; how many jobs)."""
    a, b = completed_in_both(without, with_)
    return (ratio(statistics.fmean(a), statistics.fmean(b)) if a else None), len(a)


def sim_jcts(res: SimResult) -> list[tuple[str, Optional[float]]]:
    return [(r.name, r.jct) for r in res.records]


def testbed_jcts(run: gang_testbed.RunOutcome, rep: int) -> list[tuple[str, Optional[float]]]:
    """(repeat/job, JCT) of a testbed run, None for a job that failed or stalled."""
    return [(f"{rep}/{j.name}", j.jct_s if j.final_status == "SUCCEEDED" else None) for j in run.jobs]


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
            runs.append({"setting": setting, "repeat": rep + 1,
                         "succeeded_mean_jct_s": res.succeeded_mean_jct_s, "stalled": res.stalled,
                         "failed": res.failed, "wall_s": res.wall_s,
                         "jobs": [{"name": j.name, "jct_s": j.jct_s, "status": j.final_status,
                                   "diagnostics": j.diagnostics} for j in res.jobs]})
            print(f"testbed gang {setting:>9} repeat {rep + 1}: succeeded jobs' mean JCT "
                  f"{res.succeeded_mean_jct_s} s, stalled {res.stalled}, failed {res.failed}, "
                  f"JCTs {[(j.jct_s, j.final_status) for j in res.jobs]}", file=sys.stderr, flush=True)

    def jcts(setting: str) -> list[tuple[str, Optional[float]]]:
        return [x for rep, r in enumerate(per[setting]) for x in testbed_jcts(r, rep)]

    def lost(setting: str) -> int:
        return sum(r.failed + r.stalled for r in per[setting])

    means = {s: mean([j for _, j in jcts(s) if j is not None]) for s in settings}
    gang = "submitted" if "submitted" in per else "minimum"
    gain, both = gain_completed_in_both(jcts("off"), jcts(gang))
    out: dict[str, Any] = {"failed_without": lost("off"), "failed_with": lost(gang), "with": gang,
                           "jct_gain_completed_in_both": gain, "completed_in_both": both}
    if "minimum" in per:
        out["testbed_jct_gain_gang_vs_off"] = gain_completed_in_both(jcts("off"), jcts("minimum"))[0]
    if "submitted" in per:
        out["testbed_jct_gain_gang_submitted_vs_off"] = gain_completed_in_both(jcts("off"), jcts("submitted"))[0]
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
    p.add_argument("--seeds", default=DEFAULT_TEXT, help="trace seeds: a list (6,7,8) or a range (6-10)")
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
        seeds = parse_seeds(ns.seeds)
        lo, hi = (int(x) for x in ns.epochs.split(","))
    except ValueError as e:
        p.error(f"{e} (--seeds wants 1,2,3 or 1-5 and --epochs two integers like 10,40)")
    pols = [x for x in ns.policies.split(",") if x]
    if ns.jobs < 1 or not pols:
        p.error("--jobs must be >= 1 and --policies must name something")
    cal = calibration.load(ns.calibration)
    with_mode = SimConfig().rm.gang_shape       # the RM's default gang shape ("submitted")
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        trace = generate(WorkloadSpec(jobs=ns.jobs, window_s=ns.window_s, apps=tuple(sorted(cal.apps)),
                                      arrivals="poisson", epochs=(lo, hi)), seed)
        for policy in pols:
            row: dict[str, Any] = {"seed": seed, "policy": policy}
            results: dict[str, SimResult] = {}
            for mode, knobs in MODES.items():
                base = SimConfig().rm
                cfg = SimConfig(nodes=ns.nodes, node_memory_mb=ns.node_memory_mb, node_vcores=ns.node_vcores,
                                rm=msgspec.structs.replace(base, **knobs))
                res = results[mode] = simulate(trace, policy, cal, cfg)
                s = res.summary
                row[mode] = {"finished_mean_jct_s": s.mean_jct_s, "makespan_s": s.makespan_s, "finished": s.finished,
                             "failed_or_stalled": s.jobs - s.finished, "mean_utilization": round(s.mean_utilization, 3)}
                print(f"seed {seed} {policy:>8} gang {mode:>9}: finished jobs' mean JCT {s.mean_jct_s}, makespan "
                      f"{s.makespan_s}, finished {s.finished}/{s.jobs}", file=sys.stderr, flush=True)
            for mode in ("minimum", "submitted"):
                gain, both = gain_completed_in_both(sim_jcts(results["off"]), sim_jcts(results[mode]))
                row[f"jct_gain_{mode}_completed_in_both"] = gain
                row[f"completed_in_both_{mode}"] = both
            runs.append(row)

    def lost(mode: str, pol: Optional[str] = None) -> int:
        return sum(r[mode]["failed_or_stalled"] for r in runs if pol is None or r["policy"] == pol)

    per_policy = {pol: {**spread_keys("jct_gain_completed_in_both",
                                      [r[f"jct_gain_{with_mode}_completed_in_both"] for r in runs if r["policy"] == pol]),
                        **spread_keys("jct_gain_minimum_completed_in_both",
                                      [r["jct_gain_minimum_completed_in_both"] for r in runs if r["policy"] == pol]),
                        "failed_without": lost("off", pol), "failed_with": lost(with_mode, pol),
                        "failed_minimum": lost("minimum", pol)}
                  for pol in pols}
    print(f"{'policy':>8} {'gain (' + with_mode + ')':>18} {'gain (minimum)':>15} {'failed off/with/min':>20}")
    for pol, g in per_policy.items():
        print(f"{pol:>8} {g['jct_gain_completed_in_both']!s:>18} {g['jct_gain_minimum_completed_in_both']!s:>15} "
              f"{g['failed_without']:>8}/{g['failed_with']}/{g['failed_minimum']}")
    print(json.dumps({
        "failed_without": lost("off"), "failed_with": lost(with_mode), "failed_minimum": lost("minimum"),
        "with": with_mode,
        **spread_keys("jct_gain_completed_in_both", [r[f"jct_gain_{with_mode}_completed_in_both"] for r in runs]),
        **spread_keys("jct_gain_minimum_completed_in_both", [r["jct_gain_minimum_completed_in_both"] for r in runs]),
        "completed_in_both": sum(r[f"completed_in_both_{with_mode}"] for r in runs),
        "per_policy": per_policy, "jobs": ns.jobs, "nodes": ns.nodes, "window_s": ns.window_s, "seeds": seeds,
        "epochs": [lo, hi], "runs": runs,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
