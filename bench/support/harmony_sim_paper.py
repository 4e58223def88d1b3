"""`bench/policies_sim.py --paper harmony`: the Harmony dissertation's §4.4 setting in the simulator.

80 jobs (sim/workload_harmony.py: Table 4.1's 4 applications x 2 data sets x 10 settings, COMP:COMM
at DoP 16 spread about 20:80-80:20, all arriving at once) on 100 hosts of 8 cores and 32 GB, the AMs
on one extra master host (the paper's extra instance). Per seed (sim/harmony_compare.py):

- the isolated baseline (issue 33 part 3): each job on hosts of its own (`static`, the model's
  ISOLATED mode) in the same queue order, the stronger (least mean JCT) of every job at its own
  best DoP alone and the whole queue at the best fixed DoP of {2, 4, 8, 16};
  `harmony_baseline_dop` says which ("per-job" or the DoP);
- isolated at fixed DoP 16 (the baseline before issue 33), and isolated with each job at the DoP
  Harmony ran it at most (`isolated_at_harmony_dop`);
- harmony (the `harmony` policy with sim/colocation.py's HARMONY mode) and naive (Harmony's groups
  and DoPs, no arbiter: NAIVE mode).

So the gains come apart: `dop_choice_jct_gain` (isolated at Harmony's DoP over DoP 16: the DoP
alone), `grouping_jct_gain` (Harmony over isolated at its own DoP: co-location with the arbiter),
`naive_grouping_jct_gain` (the same without the arbiter), `harmony_jct_gain_vs_naive` (the arbiter).
Event granularity `STEP_S` (SimConfig.coarse): the jobs run 20-90 minutes alone, so a 30 s step
moves a JCT by under 1 %.

Every JCT gain covers the jobs both runs finished (sim/harmony_compare.py `gains`; each run's
finished count is in `per_seed`). A job Harmony never trained has no DoP of its own, so it is left
out of `isolated_at_harmony_dop` and counted in `jobs_without_harmony_dop` (over all seeds; per
seed in `per_seed`).

Keys (each the median over the seeds, with `_min` / `_max` / `_n`): `harmony_jct_gain_vs_best_isolated`,
`harmony_makespan_gain_vs_best_isolated`, `harmony_util_gain_vs_best_isolated` (eq. 4.4's CPU
utilization over the makespan), `harmony_jct_gain_vs_fixed_isolated` /
`harmony_makespan_gain_vs_fixed_isolated` (against fixed DoP 16), the naive ones, the split above,
`best_isolated_jct_gain_vs_dop16`, and the model's own best cases against DoP 16:
`model_best_case_jct_gain` / `model_best_case_makespan_gain`, the ceilings when the cluster's CPU
never idles (the jobs' COMP work, eq. 4.2 at any DoP, on a fluid pool of the hosts: shortest job
first for the mean JCT, the total over the hosts for the makespan) and `pairing_at_dop16_jct_gain`
/ `pairing_at_dop16_makespan_gain` (complementary pairs at DoP 16 on 16-host slots, no costs).
`paper_figures` holds the dissertation's (its isolated baseline: each job at its best DoP).
`--quick` runs 32 jobs on 48 hosts.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any, Optional

from sim.colocation import Mode, SubtaskTimes
from sim.harmony_compare import (DOP_CANDIDATES, RUNS, compare, gains, harmony_dops, ideal_schedule, isolated_at_dops,
                                 isolated_baselines, missing_dops, run_mode)
from sim.metrics import spread_keys
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


def harmony_run(ns: argparse.Namespace) -> dict[str, Any]:
    """The comparison per seed, each gain's median and min-max over the seeds, and the model's best
    cases (module doc)."""
    hosts = QUICK_HOSTS if ns.quick else HOSTS
    spec = HarmonyWorkloadSpec(settings=4 if ns.quick else 10, nodes=hosts)
    cfg = SimConfig(nodes=hosts, node_memory_mb=32 * 1024, node_vcores=8, am_nodes=1, am_node_vcores=128,
                    am_node_memory_mb=128 * 1024, sample_s=60.0).coarse(STEP_S)
    per_seed: list[dict[str, Any]] = []
    for seed in ns.seed_list:
        trace, cal, truth = generate(spec, seed)
        out = compare(trace, cal, cfg, runs=[r for r in RUNS if r[0] != "isolated"])
        iso = isolated_baselines(trace, cal, cfg)
        base_name, base = iso.best()
        fixed16 = iso.fixed[DOP]
        dops = harmony_dops(out["harmony"].result)
        at_h = run_mode(isolated_at_dops(trace, dops), cal, cfg, "isolated-at-harmony-dop", "static", Mode.ISOLATED)
        runs = {"best_isolated": base, "isolated_dop16": fixed16, "isolated_at_harmony_dop": at_h, **out}
        loads = [SubtaskTimes(t.t_cpu, t.t_net) for t in truth]
        work = [t.epochs * CLOCKS_PER_EPOCH * (t.t_cpu + t.t_net) for t in truth]
        slots = hosts // DOP
        i_jct, i_mk = ideal_schedule(loads, work, slots, paired=False)
        p_jct, p_mk = ideal_schedule(loads, work, slots, paired=True)
        f_jct, f_mk = fluid_bounds(truth, hosts)
        row: dict[str, Any] = {
            "seed": seed, "harmony_baseline_dop": base_name,
            "isolated_candidates": {str(k): {"mean_jct_s": o.to_json()["mean_jct_s"],
                                             "makespan_s": o.to_json()["makespan_s"],
                                             "finished": o.result.summary.finished}
                                    for k, o in iso.candidates().items()},
            "per_job_dops": dict(Counter(iso.per_job_dops.values())),
            "harmony_dops": dict(Counter(dops.values())),
            # jobs Harmony never trained have no DoP: left out of isolated_at_harmony_dop, counted here
            "jobs_without_harmony_dop": len(missing_dops(trace, dops)),
            "runs": {n: o.to_json() for n, o in runs.items()},
            "harmony": gains(runs, "harmony", "best_isolated"), "naive": gains(runs, "naive", "best_isolated"),
            "harmony_vs_dop16": gains(runs, "harmony", "isolated_dop16"),
            "best_isolated_vs_dop16": gains(runs, "best_isolated", "isolated_dop16"),
            "harmony_dop_vs_dop16": gains(runs, "isolated_at_harmony_dop", "isolated_dop16"),
            "harmony_vs_isolated_at_harmony_dop": gains(runs, "harmony", "isolated_at_harmony_dop"),
            "naive_vs_isolated_at_harmony_dop": gains(runs, "naive", "isolated_at_harmony_dop"),
            "harmony_vs_naive": gains(runs, "harmony", "naive"),
            # the model's ceilings, against the old DoP-16 baseline they were defined on
            "model_best_case_jct_gain": _ratio(fixed16.mean_jct_s, f_jct),
            "model_best_case_makespan_gain": _ratio(fixed16.makespan_s, f_mk),
            "pairing_at_dop16_jct_gain": _ratio(i_jct, p_jct),
            "pairing_at_dop16_makespan_gain": _ratio(i_mk, p_mk)}
        per_seed.append(row)
        h = row["harmony"]
        print(f"seed {seed}: baseline DoP {base_name}; harmony vs best isolated JCT {h['jct_gain']}x, makespan "
              f"{h['makespan_gain']}x; vs DoP 16 JCT {row['harmony_vs_dop16']['jct_gain']}x; naive vs best "
              f"isolated {row['naive']['jct_gain']}x; DoP choice alone {row['harmony_dop_vs_dop16']['jct_gain']}x, "
              f"grouping alone {row['harmony_vs_isolated_at_harmony_dop']['jct_gain']}x", file=sys.stderr, flush=True)
        for name, o in runs.items():
            print(f"  {name:>24}: {o.to_json()}", file=sys.stderr, flush=True)

    def vals(*path: str) -> list[Optional[float]]:
        got: list[Optional[float]] = []
        for r in per_seed:
            v: Any = r
            for p in path:
                v = v[p]
            got.append(v)
        return got
    names = [r["harmony_baseline_dop"] for r in per_seed]
    result: dict[str, Any] = {
        "paper": "harmony", "hosts": hosts, "jobs": per_seed[0]["runs"]["harmony"]["jobs"],
        "seeds": list(ns.seed_list), "step_s": STEP_S,
        "dop_candidates": list(DOP_CANDIDATES),
        # the same baseline on every seed: that DoP; otherwise each seed's, in seed order
        "harmony_baseline_dop": names[0] if len(set(map(str, names))) == 1 else names,
        "jobs_without_harmony_dop": sum(r["jobs_without_harmony_dop"] for r in per_seed),
        "per_seed": per_seed,
        "paper_figures": {"harmony_jct_gain_vs_isolated": 2.11, "harmony_makespan_gain_vs_isolated": 1.60,
                          "harmony_util_gain_vs_isolated": 1.65, "naive_jct_gain_vs_isolated": 1.11,
                          "naive_makespan_gain_vs_isolated": 1.09}}
    for key, path in (("harmony_jct_gain_vs_best_isolated", ("harmony", "jct_gain")),
                      ("harmony_makespan_gain_vs_best_isolated", ("harmony", "makespan_gain")),
                      ("harmony_util_gain_vs_best_isolated", ("harmony", "util_gain")),
                      ("harmony_jct_gain_vs_fixed_isolated", ("harmony_vs_dop16", "jct_gain")),
                      ("harmony_makespan_gain_vs_fixed_isolated", ("harmony_vs_dop16", "makespan_gain")),
                      ("naive_jct_gain_vs_best_isolated", ("naive", "jct_gain")),
                      ("naive_makespan_gain_vs_best_isolated", ("naive", "makespan_gain")),
                      ("best_isolated_jct_gain_vs_dop16", ("best_isolated_vs_dop16", "jct_gain")),
                      ("dop_choice_jct_gain", ("harmony_dop_vs_dop16", "jct_gain")),
                      ("grouping_jct_gain", ("harmony_vs_isolated_at_harmony_dop", "jct_gain")),
                      ("naive_grouping_jct_gain", ("naive_vs_isolated_at_harmony_dop", "jct_gain")),
                      ("harmony_jct_gain_vs_naive", ("harmony_vs_naive", "jct_gain")),
                      ("model_best_case_jct_gain", ("model_best_case_jct_gain",)),
                      ("model_best_case_makespan_gain", ("model_best_case_makespan_gain",)),
                      ("pairing_at_dop16_jct_gain", ("pairing_at_dop16_jct_gain",)),
                      ("pairing_at_dop16_makespan_gain", ("pairing_at_dop16_makespan_gain",))):
        result.update(spread_keys(key, vals(*path)))
    return result


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, 3)


__all__ = ["harmony_run", "fluid_bounds"]
