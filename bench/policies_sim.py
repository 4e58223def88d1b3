"""The cluster policies on simulated clusters: our apps on a loaded cluster, and the papers' own workloads.

    .venv/bin/python bench/policies_sim.py [--quick] [--seeds 1-5] [--jobs 60] [--nodes 16] [--load 0.75]
    .venv/bin/python bench/policies_sim.py --paper optimus [--quick] [--seeds 1-5]
    .venv/bin/python bench/policies_sim.py --paper dorm [--quick] [--seeds 1-5]
    .venv/bin/python bench/policies_sim.py --paper harmony [--quick] [--seeds 1-5]

Every run replays one trace per seed under each policy on the same simulated cluster
(sim/simulator.py: the real RM core and policy code on a virtual clock). Five seeds by default
(`--seeds` names others: "6-10", "6,7"); every gain is reported as its median over the seeds (the
key itself) with `<key>_min`, `<key>_max` and `<key>_n` (how many seeds gave one), and `per_seed`
holds each seed's. A mean-JCT ratio between two runs covers the jobs that finished in both (`unfinished` counts the others per policy;
no timeout stands in for a JCT). Per policy: mean JCT, makespan, mean allocation, mean useful
utilization (executors of training jobs only, sim/metrics.py), mean DRF fairness loss (Dorm eq. 2),
finished / unfinished jobs, reshapes, `extrapolated_job_share` (jobs that trained at a shape beyond
their app's measured calibration range, where the simulator counts it), the simulator's wall time.

Against a bound: `sim/bounds.py`'s clairvoyant lower bound on mean JCT (true curves, zero resize
cost, no queueing; the larger of each job alone at its fastest shape and the cluster as one fluid
resource under SRPT): `<policy>_jct_over_bound` is the bound over the policy's mean JCT (<= 1).
`optimus-truth` (sim/optimus_truth.py) is Optimus's greedy rule fed the true curves -- reported
separately (`optimus_jct_over_truth`: its mean JCT over Optimus's), not a bound.

**Default** (issue 25 part 2; the trace frozen by issue 33): our four apps (sim/calibration.json) on
16 nodes of 8 vCores / 8 GB, `sim.workload.cluster_trace`: Poisson arrivals at the rate that offers
`--load` of the cluster, jobs of tens of epochs (thresholds 0.05-0.5 %, max_epochs 20-60 in the
spec). Policies static, drf, optimus, optimus-truth, dorm (`--policies all`: every registered one,
tetris included). Keys: `seeds`, `offered_load`, `optimus_jct_gain_vs_drf` (DRF mean JCT over
Optimus's; target >= 1.5) and `optimus_jct_gain_vs_drf_min`, `optimus_makespan_gain_vs_drf`,
`optimus_jct_gain_vs_static` and `drf_jct_gain_vs_static` (whether DRF is the stronger baseline),
`optimus_jct_gain_vs_tetris` (with --policies all), `optimus_jct_over_bound`,
`optimus_truth_jct_over_bound`, `drf_jct_over_bound`, `optimus_jct_over_truth`,
`dorm_util_gain_vs_static` (allocation), `dorm_useful_util_gain_vs_static` (target >= 1.3),
`dorm_fairness_gain_vs_static` (static's fairness loss over Dorm's; target >= 1),
`optimus_truth_jct_gain_vs_drf`, and with `--policies` naming them `optimus_true_speed_jct_gain_vs_drf`
and `optimus_true_epochs_jct_gain_vs_drf` (see --paper optimus),
`extrapolated_job_share` (the largest over policies and seeds), `unfinished`.

**--paper optimus** (sim/papers/optimus.py: Table 1's job types with Table 2's speed functions and
Fig. 7's curve, 60 jobs arriving over [0, 12000] s, 13 nodes, a 10-minute scheduling interval):
Optimus against DRF and Tetris. Keys `optimus_jct_gain_vs_drf` (paper 2.39), `optimus_makespan_gain_vs_drf`
(paper 1.63), `optimus_jct_gain_vs_tetris`, `optimus_makespan_gain_vs_tetris` (paper: Tetris 5.0 h vs
Optimus 4.1 h makespan, 1.22), `drf_makespan_h` (paper 6.7), the bound's and optimus-truth's
(`optimus_truth_jct_gain_vs_drf`: what the rule gains without prediction errors), and what each of
Optimus's two estimates costs it: `optimus_true_speed_jct_gain_vs_drf` and
`optimus_true_epochs_jct_gain_vs_drf` are the `optimus` policy itself with its speed function or its
remaining epochs replaced by the truth (the simulator's optimus-true-speed and optimus-true-epochs,
sim/optimus_truth.py `TruthInputs`; neither is a bound). `all_sync` holds the same for Fig. 16's
all-synchronous workload (DRF, Optimus and the three truth-fed variants; not in --quick). With
`--warm`, also `optimus_warm_jct_gain_vs_drf`: Optimus that first scheduled the trace of seed + 100
of the same workload and starts from the per-app priors it learned there (what an RM that has run
for a while keeps in its stored state), against the same DRF run.

**--paper dorm** (sim/papers/dorm.py: Table II's 50 applications arriving 20 minutes apart on
average, 20 nodes x 12 cores, Dorm-3's thresholds): Dorm against static partitions. Keys
`dorm_util_gain_vs_static` (over the first 5 hours, as the paper's figure; paper 2.32),
`dorm_util_gain_vs_static_run` (over the whole run), `dorm_fairness_gain_vs_static` (paper 1.52),
`dorm_speedup_vs_static` (per application, static JCT over Dorm's, averaged; paper 2.72). The
paper gives no speed functions; `linear_speed` holds the same keys for the variant where every
worker adds its whole speed (sim/papers/dorm.py's LINEAR), the assumed function's cost (not in
--quick).

**--paper harmony** (bench/support/harmony_sim_paper.py; sim/workload_harmony.py's 80 jobs of Table
4.1 on 100 hosts of 8 cores): Harmony against the stronger isolated baseline (each job at its best
DoP alone, or the best fixed DoP of {2, 4, 8, 16}; `harmony_baseline_dop` says which), fixed DoP 16,
isolated at Harmony's own DoPs and naive co-location. Keys `harmony_jct_gain_vs_best_isolated`
(paper 2.11 over its isolated baseline), `harmony_baseline_dop`, `harmony_jct_gain_vs_fixed_isolated`,
`harmony_makespan_gain_vs_best_isolated` (paper 1.60), `seeds`, and the split of the gain.

`--quick` (a smaller trace per seed, still five seeds) is for checking the bench runs. `--paper`
dispatches through PAPERS, a table of functions (one per paper). The last line of output is one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support.harmony_sim_paper import harmony_run  # noqa: E402  (bench/support: not a benchmark itself)
from support.seeds import DEFAULT_TEXT, parse_seeds  # noqa: E402
from protocol.records import Resource  # noqa: E402
from rm import policies  # noqa: E402
from rm.policies.optimus import OptimusState  # noqa: E402
from sim import calibration as calibration_file  # noqa: E402
from sim.bounds import clairvoyant_bound, over_bound  # noqa: E402
from sim.calibration import Calibration  # noqa: E402
from sim.metrics import completed_in_both, ratio, spread_keys  # noqa: E402
from sim.papers import dorm as dorm_paper  # noqa: E402
from sim.papers import optimus as optimus_paper  # noqa: E402
from sim.sim_job import JobTimings  # noqa: E402
from sim.simulator import (OPTIMUS_TRUE_EPOCHS, OPTIMUS_TRUE_SPEED, OPTIMUS_TRUTH, SimConfig, SimResult,  # noqa: E402
                           Simulator, known_policies, simulate)
from sim.trace import TraceJob  # noqa: E402
from sim.workload import CLUSTER_SPEC, cluster_trace  # noqa: E402

Row = dict[str, Any]


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    """The median of the values present (None when none is)."""
    vs = [v for v in values if v is not None]
    return round(statistics.median(vs), 3) if vs else None


def jct_gain(results: dict[str, SimResult], base: str, new: str) -> Optional[float]:
    """`base`'s mean JCT over `new`'s, over the jobs that finished in both runs (a job that failed
    or stalled in either has no JCT to compare: it is counted in `unfinished`, not given one)."""
    b, n = results.get(base), results.get(new)
    if b is None or n is None:
        return None
    jb, jn = completed_in_both([(r.name, r.jct) for r in b.records], [(r.name, r.jct) for r in n.records])
    return ratio(statistics.fmean(jb), statistics.fmean(jn)) if jb else None


def over_bound_of(rows: dict[str, Row], policy: str, bound_jct: float) -> Optional[float]:
    """The bound's mean JCT over the policy's; None when the run left a job unfinished (the bound
    covers every job, the run's mean only the finished ones)."""
    r = rows.get(policy)
    if r is None or r["unfinished"]:
        return None
    return over_bound(bound_jct, r["mean_jct_s"])


def extrapolated_share(result: SimResult) -> Optional[float]:
    """The share of the run's jobs that trained at a shape beyond their app's measured calibration
    range (sim/simulator.py's SimResult.extrapolated_job_share; None where the simulator does not
    count it)."""
    share = getattr(result, "extrapolated_job_share", None)
    return None if share is None else round(float(share), 4)


def aggregate(per_seed: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, Optional[float]]:
    """Each gain's median over the seeds with its `_min` and `_max`."""
    out: dict[str, Optional[float]] = {}
    for key in keys:
        out.update(spread_keys(key, [p["gains"][key] for p in per_seed]))
    return out


def window_mean(result: SimResult, field: str, until_s: Optional[float]) -> float:
    """A sample field's mean over the samples up to `until_s` after the first arrival (all: None)."""
    first = min((r.arrival for r in result.records), default=result.t0) - result.t0
    vals = [getattr(s, field) for s in result.samples if until_s is None or s.t - first <= until_s]
    return statistics.fmean(vals) if vals else 0.0


def row(result: SimResult) -> Row:
    s = result.summary
    j = s.to_json()
    useful = getattr(s, "mean_useful_utilization", None)
    return {"mean_jct_s": j["mean_jct_s"], "makespan_s": j["makespan_s"],
            "unfinished": s.jobs - s.finished, "extrapolated_job_share": extrapolated_share(result),
            "mean_utilization": round(s.mean_utilization, 4),
            "mean_useful_utilization": None if useful is None else round(float(useful), 4),
            "mean_fairness_loss": round(s.mean_fairness_loss, 4), "finished": s.finished, "jobs": s.jobs,
            "reshapes": s.reshapes, "virtual_h": round(s.virtual_s / 3600.0, 2), "wall_s": round(s.wall_s, 2)}


def run(trace: Sequence[TraceJob], policy: str, cal: Calibration, cfg: SimConfig) -> Optional[SimResult]:
    """One policy's run; None (reported as null) when the simulator cannot run it."""
    try:
        result = simulate(trace, policy, cal, cfg)
    except (KeyError, ValueError) as e:     # a policy not registered here, a trace it cannot take
        print(f"{policy:>13}: not run ({e})", file=sys.stderr)
        return None
    r = row(result)
    print(f"{policy:>13}: mean JCT {r['mean_jct_s']} s, makespan {r['makespan_s']} s, allocation "
          f"{r['mean_utilization']}, useful {r['mean_useful_utilization']}, fairness loss {r['mean_fairness_loss']}, "
          f"{r['finished']}/{r['jobs']} finished, {r['reshapes']} reshapes, {r['wall_s']} s wall", file=sys.stderr)
    return result


def get(rows: dict[str, Row], policy: str, field: str) -> Optional[float]:
    v = rows.get(policy, {}).get(field)
    return None if v is None else float(v)


def seeds_of(ns: argparse.Namespace) -> list[int]:
    return list(ns.seed_list)


def run_all(trace: Sequence[TraceJob], names: Sequence[str], cal: Calibration, cfg: SimConfig) -> dict[str, SimResult]:
    out = {}
    for name in names:
        res = run(trace, name, cal, cfg)
        if res is not None:
            out[name] = res
    return out


# ----- default: our apps on a loaded cluster ----------------------------------------------------

# The policies the targets compare (`--policies all`: every registered one, tetris included, which
# alone takes minutes a seed).
DEFAULT_POLICIES = ["static", "drf", "optimus", OPTIMUS_TRUTH, "dorm"]


def policy_names(ns: argparse.Namespace, default: Sequence[str]) -> list[str]:
    if ns.policies == "all":
        return known_policies()
    return ns.policies.split(",") if ns.policies else list(default)


def default_run(ns: argparse.Namespace) -> dict[str, Any]:
    cal = calibration_file.load(ns.calibration)
    nodes = ns.nodes
    # Heartbeats and allocates every 2 s instead of 1 s: the same schedule to within a second of
    # hours-long jobs, half the events (the runs take minutes on a 2-core host otherwise).
    cfg = SimConfig(nodes=nodes, node_memory_mb=ns.node_memory_mb, node_vcores=ns.node_vcores, heartbeat_s=2.0,
                    timings=JobTimings(allocate_interval_s=2.0, pending_interval_s=0.5))
    cluster = Resource(ns.node_memory_mb * nodes, ns.node_vcores * nodes)
    am = Resource(cfg.timings.am_memory_mb, 1)
    spec = replace(CLUSTER_SPEC, jobs=ns.jobs if ns.jobs else (30 if ns.quick else CLUSTER_SPEC.jobs))
    names = policy_names(ns, DEFAULT_POLICIES)
    per_seed: list[dict[str, Any]] = []
    for seed in seeds_of(ns):
        ct = cluster_trace(cal, cluster, am, seed, ns.load, spec)
        print(f"seed {seed}: {len(ct.jobs)} jobs, {ct.rate_per_s * 3600:.1f} arrivals/h, offered load "
              f"{ct.offered_load:.3f} (target {ns.load}), {nodes} nodes", file=sys.stderr)
        results = run_all(ct.jobs, names, cal, cfg)
        bound = clairvoyant_bound(ct.jobs, cal, cluster)
        rows = {k: row(v) for k, v in results.items()}
        for name, r in rows.items():     # each policy against DRF and against the bound
            r["jct_gain_vs_drf"] = jct_gain(results, "drf", name)
            r["jct_over_bound"] = over_bound_of(rows, name, bound.mean_jct_s)
        per_seed.append({"seed": seed, "offered_load": round(ct.offered_load, 3), "policies": rows,
                         "bound": bound.to_json(), "gains": gains_default(results, rows, bound.mean_jct_s)})
    shares = [r["extrapolated_job_share"] for p in per_seed for r in p["policies"].values()]
    out: dict[str, Any] = {"mode": "default", "nodes": nodes, "jobs": spec.jobs, "target_load": ns.load,
                           "seeds": [p["seed"] for p in per_seed], "policies_run": names,
                           "offered_load": median([float(p["offered_load"]) for p in per_seed]),
                           # the largest share over every policy and seed (None: not counted)
                           "extrapolated_job_share": max((x for x in shares if x is not None), default=None),
                           "unfinished": {n: sum(p["policies"][n]["unfinished"] for p in per_seed if n in p["policies"])
                                          for n in names},
                           **aggregate(per_seed, DEFAULT_GAINS)}
    out["per_seed"] = per_seed
    return out


DEFAULT_GAINS = ("optimus_jct_gain_vs_drf", "optimus_makespan_gain_vs_drf", "optimus_jct_gain_vs_tetris",
                 "optimus_jct_gain_vs_static", "drf_jct_gain_vs_static",
                 "optimus_jct_over_bound", "optimus_truth_jct_over_bound", "optimus_jct_over_truth",
                 "drf_jct_over_bound", "dorm_util_gain_vs_static", "dorm_useful_util_gain_vs_static",
                 "dorm_fairness_gain_vs_static", "optimus_truth_jct_gain_vs_drf", "optimus_true_speed_jct_gain_vs_drf",
                 "optimus_true_epochs_jct_gain_vs_drf")


def gains_default(results: dict[str, SimResult], rows: dict[str, Row], bound_jct: float) -> dict[str, Optional[float]]:
    return {
        "optimus_jct_gain_vs_drf": jct_gain(results, "drf", "optimus"),
        "optimus_makespan_gain_vs_drf": ratio(get(rows, "drf", "makespan_s"), get(rows, "optimus", "makespan_s")),
        "optimus_jct_gain_vs_tetris": jct_gain(results, "tetris", "optimus"),
        # static (FIFO, requested shapes) beside DRF: whether DRF is the stronger baseline here
        "optimus_jct_gain_vs_static": jct_gain(results, "static", "optimus"),
        "drf_jct_gain_vs_static": jct_gain(results, "static", "drf"),
        # the clairvoyant bound's mean JCT over the policy's (<= 1; 1 = the bound met), sim/bounds.py
        "optimus_jct_over_bound": over_bound_of(rows, "optimus", bound_jct),
        "optimus_truth_jct_over_bound": over_bound_of(rows, OPTIMUS_TRUTH, bound_jct),
        "drf_jct_over_bound": over_bound_of(rows, "drf", bound_jct),
        # Optimus's rule with true curves (sim/optimus_truth.py, not a bound) over Optimus
        "optimus_jct_over_truth": jct_gain(results, OPTIMUS_TRUTH, "optimus"),
        # with --policies naming them: what Optimus's speed and epoch estimates cost it
        "optimus_truth_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_TRUTH),
        "optimus_true_speed_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_TRUE_SPEED),
        "optimus_true_epochs_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_TRUE_EPOCHS),
        "dorm_util_gain_vs_static": ratio(get(rows, "dorm", "mean_utilization"), get(rows, "static", "mean_utilization")),
        "dorm_useful_util_gain_vs_static": ratio(get(rows, "dorm", "mean_useful_utilization"),
                                                 get(rows, "static", "mean_useful_utilization")),
        "dorm_fairness_gain_vs_static": ratio(get(rows, "static", "mean_fairness_loss"),
                                              get(rows, "dorm", "mean_fairness_loss")),
    }


# ----- --paper optimus --------------------------------------------------------------------------

OPTIMUS_GAINS = ("optimus_jct_gain_vs_drf", "optimus_makespan_gain_vs_drf", "optimus_jct_gain_vs_tetris",
                 "optimus_makespan_gain_vs_tetris", "drf_makespan_h", "optimus_jct_over_bound",
                 "optimus_truth_jct_over_bound", "optimus_jct_over_truth", "optimus_truth_jct_gain_vs_drf",
                 "optimus_true_speed_jct_gain_vs_drf", "optimus_true_epochs_jct_gain_vs_drf",
                 "optimus_warm_jct_gain_vs_drf")


def optimus_run(ns: argparse.Namespace) -> dict[str, Any]:
    paper = optimus_paper.OptimusPaper()
    if ns.quick:        # half the jobs over half the window: the same load, half the run
        paper = replace(paper, jobs=30, window_s=6000.0)
    cfg = SimConfig(nodes=paper.nodes, node_memory_mb=paper.node.memory, node_vcores=paper.node.vcores,
                    policy_interval_s=paper.scheduling_interval_s, heartbeat_s=2.0,
                    timings=JobTimings(allocate_interval_s=2.0, pending_interval_s=0.5))
    cluster = Resource(paper.node.memory * paper.nodes, paper.node.vcores * paper.nodes)
    out: dict[str, Any] = {"mode": "paper-optimus", "jobs": paper.jobs, "nodes": paper.nodes,
                           "paper": {"optimus_jct_gain_vs_drf": 2.39, "optimus_makespan_gain_vs_drf": 1.63,
                                     "optimus_makespan_gain_vs_tetris": round(5.0 / 4.1, 3), "drf_makespan_h": 6.7}}
    # §6.1's mix, then Fig. 16's all-sync workload, each with Optimus's rule on the true curves
    # (optimus-truth) and the clairvoyant bound (sim/bounds.py).
    # optimus-true-speed / -epochs: Optimus itself with one estimate replaced by the truth (what
    # each estimate costs it).
    truths = [OPTIMUS_TRUTH, OPTIMUS_TRUE_SPEED, OPTIMUS_TRUE_EPOCHS]
    variants = (("", paper, ["drf", "tetris", "optimus", *truths]),
                ("all_sync", replace(paper, modes=(True,)), ["drf", "optimus", *truths]))
    for label, variant, default_names in variants:
        if label and (ns.policies or ns.quick):
            continue
        cal = optimus_paper.calibration(variant)
        names = policy_names(ns, default_names)
        per_seed: list[dict[str, Any]] = []
        for seed in seeds_of(ns):
            trace = optimus_paper.generate(variant, seed)
            print(f"seed {seed}: Optimus §6 workload{' (' + label + ')' if label else ''}, {len(trace)} jobs over "
                  f"{variant.window_s:.0f} s, {variant.nodes} nodes", file=sys.stderr)
            results = run_all(trace, names, cal, cfg)
            if ns.warm and "optimus" in names:
                warm = optimus_warm(trace, optimus_paper.generate(variant, seed + WARM_SEED_OFFSET), cal, cfg)
                if warm is not None:
                    results[OPTIMUS_WARM] = warm
            bound = clairvoyant_bound(trace, cal, cluster)
            rows = {k: row(v) for k, v in results.items()}
            per_seed.append({"seed": seed, "policies": rows, "bound": bound.to_json(),
                             "gains": gains_optimus(results, rows, bound.mean_jct_s)})
        gains = aggregate(per_seed, OPTIMUS_GAINS)
        if not label:
            out.update(seeds=[p["seed"] for p in per_seed], **gains, per_seed=per_seed)
        else:
            out[label] = {**{k: v for k, v in gains.items() if v is not None},
                          "per_seed": [{"seed": p["seed"], **p["gains"]} for p in per_seed]}
    return out


# --warm: Optimus that has already scheduled one trace of the same workload (seed + this offset)
# and starts from the priors it learned there -- an RM that has run for a while (its priors are in
# its stored state) -- against the cold start of every other run.
WARM_SEED_OFFSET = 100
OPTIMUS_WARM = "optimus-warm"


def optimus_warm(trace: Sequence[TraceJob], history: Sequence[TraceJob], cal: Calibration,
                 cfg: SimConfig) -> Optional[SimResult]:
    """Optimus on `trace`, starting from the priors it learned scheduling `history` (its stored
    state's per-app priors only: no jobs, no round cadence)."""
    first = Simulator(history, "optimus", cal, cfg)
    first.run()
    doc = policies.export_state(first.policy)
    if doc is None:
        return None
    state = msgspec.json.decode(doc, type=OptimusState)
    sim = Simulator(trace, "optimus", cal, cfg)
    policies.restore_state(sim.policy, msgspec.json.encode(
        msgspec.structs.replace(state, jobs={}, last_round=None, last_jobs=None)))
    result = sim.run()
    r = row(result)
    print(f"{OPTIMUS_WARM:>13}: mean JCT {r['mean_jct_s']} s, makespan {r['makespan_s']} s (priors from seed + "
          f"{WARM_SEED_OFFSET})", file=sys.stderr)
    return result


def gains_optimus(results: dict[str, SimResult], rows: dict[str, Row], bound_jct: float) -> dict[str, Optional[float]]:
    mk = get(rows, "drf", "makespan_s")
    return {
        "optimus_jct_gain_vs_drf": jct_gain(results, "drf", "optimus"),
        "optimus_makespan_gain_vs_drf": ratio(mk, get(rows, "optimus", "makespan_s")),
        "optimus_jct_gain_vs_tetris": jct_gain(results, "tetris", "optimus"),
        "optimus_makespan_gain_vs_tetris": ratio(get(rows, "tetris", "makespan_s"), get(rows, "optimus", "makespan_s")),
        "drf_makespan_h": None if mk is None else round(mk / 3600.0, 2),
        "optimus_jct_over_bound": over_bound_of(rows, "optimus", bound_jct),
        "optimus_truth_jct_over_bound": over_bound_of(rows, OPTIMUS_TRUTH, bound_jct),
        "optimus_jct_over_truth": jct_gain(results, OPTIMUS_TRUTH, "optimus"),
        "optimus_truth_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_TRUTH),
        "optimus_true_speed_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_TRUE_SPEED),
        "optimus_true_epochs_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_TRUE_EPOCHS),
        "optimus_warm_jct_gain_vs_drf": jct_gain(results, "drf", OPTIMUS_WARM),
    }


# ----- --paper dorm -----------------------------------------------------------------------------

FIRST_HOURS = 5.0       # Dorm §V-B-1 averages utilization over the first 5 hours
DORM_GAINS = ("dorm_util_gain_vs_static", "dorm_util_gain_vs_static_run", "dorm_useful_util_gain_vs_static",
              "dorm_fairness_gain_vs_static", "dorm_speedup_vs_static", "dorm_mean_jct_gain_vs_static")


def dorm_run(ns: argparse.Namespace) -> dict[str, Any]:
    paper = dorm_paper.DormPaper()
    if ns.quick:        # applications a quarter as long, arriving four times as often: the same load
        paper = replace(paper, scale=0.25, mean_interval_s=paper.mean_interval_s / 4)
    base = SimConfig()
    cfg = SimConfig(nodes=paper.nodes, node_memory_mb=paper.node.memory, node_vcores=paper.node.vcores,
                    heartbeat_s=5.0, policy_interval_s=10.0,
                    timings=JobTimings(allocate_interval_s=5.0, pending_interval_s=1.0),
                    rm=paper.rm_config(base.rm))
    first_s = FIRST_HOURS * 3600.0 * (paper.mean_interval_s / dorm_paper.DormPaper().mean_interval_s)
    names = policy_names(ns, ["static", "dorm"])
    out: dict[str, Any] = {"mode": "paper-dorm", "applications": len(dorm_paper.generate(paper, seeds_of(ns)[0])),
                           "nodes": paper.nodes,
                           "paper": {"dorm_util_gain_vs_static": 2.32, "dorm_fairness_gain_vs_static": 1.52,
                                     "dorm_speedup_vs_static": 2.72}}
    # The assumed speed function first, then the variant without its losses (sim/papers/dorm.py).
    for label, variant in (("", paper), ("linear_speed", replace(paper, speed=dorm_paper.LINEAR))):
        if label and ns.quick:
            continue
        cal = dorm_paper.calibration(variant)
        per_seed: list[dict[str, Any]] = []
        for seed in seeds_of(ns):
            trace = dorm_paper.generate(variant, seed)
            print(f"seed {seed}: Dorm §V workload{' (' + label + ')' if label else ''}, {len(trace)} applications, "
                  f"mean interval {variant.mean_interval_s / 60:.0f} min, {variant.nodes} nodes", file=sys.stderr)
            results = run_all(trace, names, cal, cfg)
            per_seed.append({"seed": seed, "policies": {k: row(v) for k, v in results.items()},
                             "gains": gains_dorm(results, first_s)})
        gains = aggregate(per_seed, DORM_GAINS)
        if not label:
            out.update(seeds=[p["seed"] for p in per_seed], **gains, per_seed=per_seed)
        else:
            out[label] = {**gains, "per_seed": [{"seed": p["seed"], **p["gains"]} for p in per_seed]}
    return out


def gains_dorm(results: dict[str, SimResult], first_s: float) -> dict[str, Optional[float]]:
    st, dm = results.get("static"), results.get("dorm")
    if st is None or dm is None:
        return {k: None for k in DORM_GAINS}
    jct_static = {r.name: r.jct for r in st.records if r.jct is not None}
    speedups = [jct_static[r.name] / r.jct for r in dm.records if r.jct and r.name in jct_static]
    return {
        "dorm_util_gain_vs_static": ratio(window_mean(dm, "utilization", first_s), window_mean(st, "utilization", first_s)),
        "dorm_util_gain_vs_static_run": ratio(dm.summary.mean_utilization, st.summary.mean_utilization),
        "dorm_useful_util_gain_vs_static": ratio(dm.summary.mean_useful_utilization, st.summary.mean_useful_utilization),
        "dorm_fairness_gain_vs_static": ratio(st.summary.mean_fairness_loss, dm.summary.mean_fairness_loss),
        "dorm_speedup_vs_static": round(statistics.fmean(speedups), 3) if speedups else None,
        "dorm_mean_jct_gain_vs_static": jct_gain(results, "static", "dorm"),
    }


@dataclass(frozen=True)
class Paper:
    """A `--paper` mode: what it runs (a function of the parsed arguments to the last-line JSON)."""

    run: Callable[[argparse.Namespace], dict[str, Any]]
    help: str


PAPERS: dict[str, Paper] = {
    "optimus": Paper(optimus_run, "Optimus §6: Table 1 jobs, Table 2 speed functions; vs DRF and Tetris"),
    "dorm": Paper(dorm_run, "Dorm §V: Table II applications on 20 x 12 cores; vs static partitions"),
    "harmony": Paper(harmony_run, "Harmony §4.4: 80 jobs of Table 4.1 on 100 x 8 cores, DoP 16; vs isolated and naive"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--paper", choices=sorted(PAPERS), help="; ".join(f"{k}: {v.help}" for k, v in PAPERS.items()))
    p.add_argument("--quick", action="store_true", help="a smaller trace (half the jobs or shorter applications)")
    p.add_argument("--seeds", default=DEFAULT_TEXT,
                   help="the traces' seeds: a list (6,7,8) or a range (6-10); each gain is reported as its median "
                        "over them with its min and max")
    p.add_argument("--policies", default="", help="comma-separated policies (default: the mode's; all: every one)")
    p.add_argument("--jobs", type=int, default=0, help="default mode: jobs in the trace (0: 60, --quick 30)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--load", type=float, default=0.75, help="default mode: the offered load to draw arrivals for")
    p.add_argument("--node-memory-mb", type=int, default=8192)
    p.add_argument("--node-vcores", type=int, default=8)
    p.add_argument("--calibration", type=Path, default=calibration_file.DEFAULT_PATH)
    p.add_argument("--warm", action="store_true",
                   help=f"--paper optimus: also Optimus starting from the priors it learned on the trace of seed + "
                        f"{WARM_SEED_OFFSET} (optimus_warm_jct_gain_vs_drf)")
    ns = p.parse_args(argv)
    try:
        ns.seed_list = parse_seeds(ns.seeds)
    except ValueError as e:
        p.error(str(e))
    for name, value in (("--nodes", ns.nodes), ("--node-memory-mb", ns.node_memory_mb),
                        ("--node-vcores", ns.node_vcores)):
        if value < 1:
            p.error(f"{name} must be >= 1, got {value}")
    if ns.jobs < 0:
        p.error(f"--jobs must be >= 0, got {ns.jobs}")
    if not (0.0 < ns.load < 10.0):
        p.error(f"--load must be in (0, 10), got {ns.load}")
    if ns.warm and ns.paper != "optimus":
        p.error("--warm is for --paper optimus")
    out = PAPERS[ns.paper].run(ns) if ns.paper else default_run(ns)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
