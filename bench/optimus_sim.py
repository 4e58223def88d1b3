"""Optimus before and after issue 25's part-3 fixes, each against DRF, on the same simulated traces.

    .venv/bin/python bench/optimus_sim.py [--quick] [--jobs 60] [--nodes 4] [--window-s 1500]
                                          [--seeds 1-5] [--before REV] [--calibration PATH]
    .venv/bin/python bench/optimus_sim.py --trace cluster [--jobs 30] [--nodes 16] [--load 0.75] ...

"Before" is the `optimus` policy as it was at git revision REV (default: the commit before the
fixes), loaded from git next to today's (models/optimus_fit.py and rm/policies/optimus.py at REV,
the rest of the tree as it is now), so both run on the same simulator (sim/simulator.py), the same
traces (one per seed) and the same DRF baseline. `--trace generate` (default) is
sim.workload.generate with the setting the issue measured (60 jobs over 1500 s on 4 nodes of 8 GB /
8 vcores); `--trace cluster` is bench/policies_sim.py's default trace (sim.workload.cluster_trace:
Poisson arrivals at an offered load on 16 nodes, jobs of tens of epochs, heartbeats and allocates
every 2 s), where the simulator's `optimus-truth` runs too (Optimus's rule fed the true curves,
sim/optimus_truth.py: not a bound). Per policy and seed: mean JCT, makespan, reshapes, how many
jobs finished of how many (`finished`, `jobs`); the gains are DRF's over Optimus's, each the median
over the seeds (five by default; `--seeds 6-10` for others) with `_min` / `_max` / `_n`. A seed's
mean-JCT gain covers only the jobs both runs finished (sim/metrics.py `jct_gain_in_both`; how many:
`<gain>_jobs_in_both`, per seed), so a run that lost its long jobs does not look faster.

Last line, one JSON object: {"seeds", "policies": {name: {"mean_jct_s": [...], "finished": [...],
"jobs": [...], ...}}, "optimus_jct_gain_vs_drf", "optimus_makespan_gain_vs_drf" (after the fixes),
"optimus_before_jct_gain_vs_drf", "optimus_before_makespan_gain_vs_drf", "optimus_jct_gain_vs_before",
"optimus_reshapes", "optimus_before_reshapes", "optimus_jct_over_truth" (optimus-truth's mean JCT over
Optimus's, --trace cluster only; with `optimus_jct_over_truth_jobs_in_both`)} (medians over the seeds,
each gain with `_min` / `_max` / `_n`, each JCT gain with `_jobs_in_both`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rm import policies  # noqa: E402
from sim import calibration  # noqa: E402
from dataclasses import replace  # noqa: E402

from protocol.records import Resource  # noqa: E402
from sim.sim_job import JobTimings  # noqa: E402
from sim.metrics import completed_in_both, jct_gain_in_both, spread_keys  # noqa: E402
from sim.simulator import OPTIMUS_TRUTH, SimConfig, simulate  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
from support.seeds import DEFAULT_TEXT, parse_seeds  # noqa: E402
from sim.trace import TraceJob  # noqa: E402
from sim.workload import WorkloadSpec, generate  # noqa: E402

BEFORE_REV = "606a976^"      # the commit before "Optimus fixed where it loses (issue 25 part 3)"


def load_before(rev: str) -> None:
    """Register the `optimus` policy of git revision `rev` as "optimus-before" (see the module doc)."""
    def show(path: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"optimus_sim: cannot read {path} at {rev}: {out.stderr.strip()}")
        return out.stdout

    fit = types.ModuleType("models.optimus_fit_before")
    sys.modules[fit.__name__] = fit
    exec(compile(show("models/optimus_fit.py"), f"{rev}:models/optimus_fit.py", "exec"), fit.__dict__)
    pol = types.ModuleType("rm.policies.optimus_before")
    pol.__package__ = "rm.policies"
    sys.modules[pol.__name__] = pol
    src = show("rm/policies/optimus.py").replace("from models.optimus_fit import", "from models.optimus_fit_before import")
    exec(compile(src, f"{rev}:rm/policies/optimus.py", "exec"), pol.__dict__)
    policies.register("optimus-before", pol.OptimusPolicy)


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den == 0:
        return None
    return round(num / den, 3)


def median(values: list[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


Jcts = dict[str, list[tuple[str, Optional[float]]]]     # per policy: (job name, JCT or None) of one seed


def jct_gains(per_seed: list[Jcts], base: str, new: str) -> list[Optional[float]]:
    """Per seed, `base`'s mean JCT over `new`'s over the jobs both runs finished (None where none did)."""
    return [jct_gain_in_both(s[base], s[new]) for s in per_seed]


def jobs_in_both(per_seed: list[Jcts], base: str, new: str) -> list[int]:
    """Per seed, how many jobs the `jct_gains` ratio covers."""
    return [len(completed_in_both(s[base], s[new])[0]) for s in per_seed]


def make_trace(ns: argparse.Namespace, cal: calibration.Calibration, cfg: SimConfig, seed: int) -> list[TraceJob]:
    if ns.trace == "generate":
        return generate(WorkloadSpec(jobs=ns.jobs, window_s=ns.window_s, apps=tuple(sorted(cal.apps))), seed)
    from sim.workload import CLUSTER_SPEC, cluster_trace     # noqa: PLC0415 (only this mode needs them)
    cluster = Resource(cfg.node_memory_mb * cfg.nodes, cfg.node_vcores * cfg.nodes)
    ct = cluster_trace(cal, cluster, Resource(cfg.timings.am_memory_mb, 1), seed, ns.load,
                       replace(CLUSTER_SPEC, jobs=ns.jobs))
    print(f"seed {seed}: {len(ct.jobs)} jobs, offered load {ct.offered_load:.3f}", file=sys.stderr)
    return list(ct.jobs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", choices=("generate", "cluster"), default="generate")
    p.add_argument("--jobs", type=int, default=0, help="jobs per trace (0: 60, or 30 for --trace cluster)")
    p.add_argument("--nodes", type=int, default=0, help="nodes (0: 4, or 16 for --trace cluster)")
    p.add_argument("--load", type=float, default=0.75, help="--trace cluster: the offered load")
    p.add_argument("--window-s", type=float, default=1500.0)
    p.add_argument("--seeds", default=DEFAULT_TEXT, help="trace seeds: a list (6,7,8) or a range (6-10)")
    p.add_argument("--before", default=BEFORE_REV, help="git revision of the 'before' policy")
    p.add_argument("--calibration", type=Path, default=calibration.DEFAULT_PATH)
    p.add_argument("--quick", action="store_true", help="20 jobs over 500 s, one seed")
    ns = p.parse_args(argv)
    cluster_mode = ns.trace == "cluster"
    ns.jobs = ns.jobs or (30 if cluster_mode else 60)
    ns.nodes = ns.nodes or (16 if cluster_mode else 4)
    if ns.quick:
        ns.jobs, ns.window_s, ns.seeds = (20 if cluster_mode else 20), 500.0, "1"
    try:
        seeds = parse_seeds(ns.seeds)
    except ValueError as e:
        p.error(str(e))
    load_before(ns.before)
    cal = calibration.load(ns.calibration)
    if cluster_mode:    # as bench/policies_sim.py runs its default trace
        cfg = SimConfig(nodes=ns.nodes, heartbeat_s=2.0, timings=JobTimings(allocate_interval_s=2.0, pending_interval_s=0.5))
    else:
        cfg = SimConfig(nodes=ns.nodes)
    names = ("drf", "optimus-before", "optimus") + ((OPTIMUS_TRUTH,) if cluster_mode else ())
    out: dict[str, dict[str, list[Any]]] = {n: {"mean_jct_s": [], "makespan_s": [], "reshapes": [], "finished": [],
                                                "jobs": []} for n in names}
    jcts: list[Jcts] = []
    for seed in seeds:
        trace = make_trace(ns, cal, cfg, seed)
        jcts.append({})
        for name in names:
            res = simulate(trace, name, cal, cfg)
            s = res.summary
            row = s.to_json()
            jcts[-1][name] = [(r.name, r.jct) for r in res.records]
            for key in ("mean_jct_s", "makespan_s"):
                out[name][key].append(row[key])
            out[name]["reshapes"].append(s.reshapes)
            out[name]["finished"].append(s.finished)
            out[name]["jobs"].append(s.jobs)
            print(f"seed {seed} {name:>14}: mean JCT {row['mean_jct_s']} s, makespan {row['makespan_s']} s, "
                  f"{s.reshapes} reshapes, {s.finished}/{s.jobs} finished, {s.wall_s:.1f} s wall", file=sys.stderr)

    def spread(name: str, num: str, den: str, key: str) -> dict[str, Any]:
        if key != "mean_jct_s":
            return spread_keys(name, [ratio(a, b) for a, b in zip(out[num][key], out[den][key])])
        # Each run's own finished-jobs mean would compare different job sets.
        return {**spread_keys(name, jct_gains(jcts, num, den)), f"{name}_jobs_in_both": jobs_in_both(jcts, num, den)}
    print(json.dumps({
        "trace": ns.trace, "seeds": seeds, "jobs": ns.jobs, "nodes": ns.nodes,
        "window_s": ns.window_s if not cluster_mode else None, "load": ns.load if cluster_mode else None,
        "before": ns.before,
        "policies": out,
        **spread("optimus_jct_gain_vs_drf", "drf", "optimus", "mean_jct_s"),
        **spread("optimus_makespan_gain_vs_drf", "drf", "optimus", "makespan_s"),
        **spread("optimus_before_jct_gain_vs_drf", "drf", "optimus-before", "mean_jct_s"),
        **spread("optimus_before_makespan_gain_vs_drf", "drf", "optimus-before", "makespan_s"),
        **spread("optimus_jct_gain_vs_before", "optimus-before", "optimus", "mean_jct_s"),
        "optimus_reshapes": median(out["optimus"]["reshapes"]),
        "optimus_before_reshapes": median(out["optimus-before"]["reshapes"]),
        "optimus_jct_over_truth": median(jct_gains(jcts, OPTIMUS_TRUTH, "optimus")) if cluster_mode else None,
        "optimus_jct_over_truth_jobs_in_both": jobs_in_both(jcts, OPTIMUS_TRUTH, "optimus") if cluster_mode else None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
