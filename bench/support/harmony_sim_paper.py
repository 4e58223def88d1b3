"""`bench/policies_sim.py --paper harmony`: the Harmony dissertation's §4.4 setting in the simulator.

80 jobs (sim/workload_harmony.py: Table 4.1's 4 applications x 2 data sets x 10 settings, COMP:COMM
at DoP 16 spread about 20:80-80:20, all arriving at once) on 100 hosts of 8 cores and 32 GB, the AMs
on one extra master host (the paper's extra instance), run three ways (sim/harmony_compare.py):
isolated (`static`, each job DoP 16 on 16 hosts of its own), harmony (the `harmony` policy with
sim/colocation.py's HARMONY mode) and naive (Harmony's groups, no arbiter). Event granularity
`STEP_S` (SimConfig.coarse): the jobs run 20-90 minutes alone, so a 30 s step moves a JCT by
under 1 %.

Keys: `harmony_jct_gain_vs_isolated`, `harmony_makespan_gain_vs_isolated`,
`harmony_util_gain_vs_isolated` (paper: 2.11, 1.60, 1.65; eq. 4.4's CPU utilization over the
makespan), the naive ones likewise (paper: 1.11 JCT, 1.09 makespan), and the model's own best
cases beside them: `model_best_case_jct_gain` / `model_best_case_makespan_gain`, the ceilings when
the cluster's CPU never idles (the jobs' COMP work, eq. 4.2 at any DoP, on a fluid pool of the hosts:
shortest job first for the mean JCT, the total over the hosts for the makespan) and
`pairing_at_dop16_jct_gain` / `pairing_at_dop16_makespan_gain` (complementary pairs at DoP 16 on
the isolated baseline's 16-host slots, no costs). Gains are medians over `--seeds` traces;
`--quick` runs 32 jobs on 48 hosts (three 16-host slots for the isolated baseline).
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any, Optional

from sim.colocation import SubtaskTimes
from sim.harmony_compare import compare, gains, ideal_schedule
from sim.simulator import SimConfig
from sim.workload_harmony import CLOCKS_PER_EPOCH, DOP, HarmonyJob, HarmonyWorkloadSpec, generate

STEP_S = 30.0
HOSTS, QUICK_HOSTS = 100, 48


def fluid_bounds(truth: list[HarmonyJob], hosts: int) -> tuple[float, float]:
    """(mean JCT, makespan) if the hosts' CPUs never idled: each job's COMP work (host-seconds:
    iterations x COMP at DoP 16 x 16, eq. 4.2) on a fluid pool of `hosts`, shortest first."""
    work = sorted(t.epochs * CLOCKS_PER_EPOCH * t.t_cpu * DOP for t in truth)
    n = len(work)
    mean_jct = sum((n - k) * w for k, w in enumerate(work)) / (n * hosts)
    return mean_jct, sum(work) / hosts


def _median(values: list[Optional[float]]) -> Optional[float]:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 3) if got else None


def harmony_run(ns: argparse.Namespace) -> dict[str, Any]:
    """The comparison per seed, medians of the gains, and the model's best cases (module doc)."""
    hosts = QUICK_HOSTS if ns.quick else HOSTS
    spec = HarmonyWorkloadSpec(settings=4 if ns.quick else 10, nodes=hosts)
    cfg = SimConfig(nodes=hosts, node_memory_mb=32 * 1024, node_vcores=8, am_nodes=1, am_node_vcores=128,
                    am_node_memory_mb=128 * 1024, sample_s=60.0).coarse(STEP_S)
    per_seed: list[dict[str, Any]] = []
    for seed in range(ns.seed, ns.seed + ns.seeds):
        trace, cal, truth = generate(spec, seed)
        out = compare(trace, cal, cfg)
        iso = out["isolated"]
        loads = [SubtaskTimes(t.t_cpu, t.t_net) for t in truth]
        work = [t.epochs * CLOCKS_PER_EPOCH * (t.t_cpu + t.t_net) for t in truth]
        slots = hosts // DOP
        i_jct, i_mk = ideal_schedule(loads, work, slots, paired=False)
        p_jct, p_mk = ideal_schedule(loads, work, slots, paired=True)
        f_jct, f_mk = fluid_bounds(truth, hosts)
        row: dict[str, Any] = {"seed": seed, "runs": {n: o.to_json() for n, o in out.items()},
                               "harmony": gains(out, "harmony"), "naive": gains(out, "naive"),
                               "model_best_case_jct_gain": _ratio(iso.mean_jct_s, f_jct),
                               "model_best_case_makespan_gain": _ratio(iso.makespan_s, f_mk),
                               "pairing_at_dop16_jct_gain": _ratio(i_jct, p_jct),
                               "pairing_at_dop16_makespan_gain": _ratio(i_mk, p_mk)}
        per_seed.append(row)
        h = row["harmony"]
        print(f"seed {seed}: harmony vs isolated JCT {h['jct_gain']}x, makespan {h['makespan_gain']}x, CPU "
              f"utilization {h['util_gain']}x; naive {row['naive']}; model best case JCT "
              f"{row['model_best_case_jct_gain']}x, makespan {row['model_best_case_makespan_gain']}x", flush=True)
        for name, o in out.items():
            print(f"  {name:>8}: {o.to_json()}", flush=True)

    def med(*path: str) -> Optional[float]:
        vals: list[Optional[float]] = []
        for r in per_seed:
            v: Any = r
            for p in path:
                v = v[p]
            vals.append(v)
        return _median(vals)
    return {
        "paper": "harmony", "hosts": hosts, "jobs": per_seed[0]["runs"]["isolated"]["jobs"],
        "seeds": ns.seeds, "step_s": STEP_S, "per_seed": per_seed,
        "harmony_jct_gain_vs_isolated": med("harmony", "jct_gain"),
        "harmony_makespan_gain_vs_isolated": med("harmony", "makespan_gain"),
        "harmony_util_gain_vs_isolated": med("harmony", "util_gain"),
        "naive_jct_gain_vs_isolated": med("naive", "jct_gain"),
        "naive_makespan_gain_vs_isolated": med("naive", "makespan_gain"),
        "naive_util_gain_vs_isolated": med("naive", "util_gain"),
        "model_best_case_jct_gain": med("model_best_case_jct_gain"),
        "model_best_case_makespan_gain": med("model_best_case_makespan_gain"),
        "pairing_at_dop16_jct_gain": med("pairing_at_dop16_jct_gain"),
        "pairing_at_dop16_makespan_gain": med("pairing_at_dop16_makespan_gain"),
    }


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, 3)


__all__ = ["harmony_run", "fluid_bounds"]
