"""Every registered policy on one simulated cluster and one generated trace (Optimus §6.1 style).

    .venv/bin/python bench/policies_sim.py [--jobs 60] [--seed 1] [--window-s 1500] [--nodes 4]
                                           [--calibration sim/calibration.json]

The trace comes from `sim.workload.generate` (arrivals uniform over the window, thresholds 1-5 %,
apps and BSP / SSP drawn at random, data sizes log-uniform); each policy replays it on the same
simulated cluster (sim/simulator.py: the real RM core and policy code on a virtual clock). The
default size loads the cluster (about 75 % utilization under `static`) so that policies differ:
Optimus §6 compares them under contention. With the shipped calibration (sim/calibration.json)
an epoch of the reference data takes about a second, so jobs of 20-200x that data run minutes.
Per policy: mean JCT, makespan, mean utilization, mean DRF fairness loss (Dorm eq. 2), finished
jobs, the simulator's wall time. Anchors: Optimus cuts mean JCT 2.39x and makespan 1.63x against
DRF (Optimus §6.2); Dorm raises utilization 2.32x and cuts fairness loss 1.52x against static
allocation (Dorm §VI). A gain is null while either of its policies is not registered.

Prints a table, then one JSON object as the last line: {"policies": {name: {...}},
"optimus_jct_gain_vs_drf", "optimus_makespan_gain_vs_drf", "dorm_util_gain_vs_static",
"dorm_fairness_gain_vs_static"}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rm import policies  # noqa: E402
from sim import calibration  # noqa: E402
from sim.simulator import SimConfig, simulate  # noqa: E402
from sim.workload import WorkloadSpec, generate  # noqa: E402


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    """num / den rounded, or None when either is missing or den is zero."""
    if num is None or den is None or den == 0:
        return None
    return round(num / den, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--window-s", type=float, default=1500.0)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--node-memory-mb", type=int, default=8192)
    p.add_argument("--node-vcores", type=int, default=8)
    p.add_argument("--calibration", type=Path, default=calibration.DEFAULT_PATH)
    ns = p.parse_args(argv)
    cal = calibration.load(ns.calibration)
    trace = generate(WorkloadSpec(jobs=ns.jobs, window_s=ns.window_s, apps=tuple(sorted(cal.apps))), ns.seed)
    cfg = SimConfig(nodes=ns.nodes, node_memory_mb=ns.node_memory_mb, node_vcores=ns.node_vcores)
    out: dict[str, dict[str, Any]] = {}
    for name in policies.known():
        s = simulate(trace, name, cal, cfg).summary
        out[name] = {"mean_jct_s": s.to_json()["mean_jct_s"], "makespan_s": s.to_json()["makespan_s"],
                     "mean_utilization": round(s.mean_utilization, 4),
                     "mean_fairness_loss": round(s.mean_fairness_loss, 4), "finished": s.finished, "jobs": s.jobs,
                     "reshapes": s.reshapes, "virtual_h": round(s.virtual_s / 3600.0, 2), "wall_s": round(s.wall_s, 2)}
        print(f"{name:>8}: mean JCT {out[name]['mean_jct_s']} s, makespan {out[name]['makespan_s']} s, "
              f"utilization {s.mean_utilization:.3f}, fairness loss {s.mean_fairness_loss:.3f}, "
              f"{s.finished}/{s.jobs} finished, {s.reshapes} reshapes, {s.wall_s:.1f} s wall", file=sys.stderr)

    def get(policy: str, field: str) -> Optional[float]:
        v = out.get(policy, {}).get(field)
        return None if v is None else float(v)
    print(json.dumps({
        "policies": out,
        "optimus_jct_gain_vs_drf": ratio(get("drf", "mean_jct_s"), get("optimus", "mean_jct_s")),
        "optimus_makespan_gain_vs_drf": ratio(get("drf", "makespan_s"), get("optimus", "makespan_s")),
        "dorm_util_gain_vs_static": ratio(get("dorm", "mean_utilization"), get("static", "mean_utilization")),
        "dorm_fairness_gain_vs_static": ratio(get("static", "mean_fairness_loss"), get("dorm", "mean_fairness_loss")),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
