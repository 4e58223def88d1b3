"""The cluster policies on simulated clusters: our apps on a loaded cluster, and the papers' own workloads.

    .venv/bin/python bench/policies_sim.py [--quick] [--seeds 1] [--jobs 60] [--nodes 16] [--load 0.75]
    .venv/bin/python bench/policies_sim.py --paper optimus [--quick] [--seeds 1]
    .venv/bin/python bench/policies_sim.py --paper dorm [--quick] [--seeds 1]

Every run replays one trace per seed under each policy on the same simulated cluster
(sim/simulator.py: the real RM core and policy code on a virtual clock); where several seeds run,
each gain is the median over them. Per policy: mean JCT, makespan, mean allocation, mean useful
utilization (executors of training jobs only, sim/metrics.py), mean DRF fairness loss (Dorm eq. 2),
finished jobs, reshapes, the simulator's wall time; on the default trace also its mean JCT against
DRF's (`jct_gain_vs_drf`) and the oracle's (`jct_over_oracle`).

**Default** (issue 25 part 2): our four apps (sim/calibration.json) on 16 nodes of 8 vCores / 8 GB,
`sim.workload.cluster_trace`: Poisson arrivals at the rate that offers `--load` of the cluster,
jobs of tens of epochs (thresholds 0.05-0.5 %, max_epochs 20-60 in the spec). Every registered
policy runs, and the simulator's `oracle` (true remaining epochs and speed functions). Keys:
`policies`, `offered_load` (of the drawn trace), `optimus_jct_gain_vs_drf` (DRF mean JCT over
Optimus's; target >= 1.3), `optimus_makespan_gain_vs_drf`, `optimus_jct_gain_vs_tetris`,
`optimus_over_oracle` (oracle mean JCT over Optimus's; 1.0 = as good; target >= 0.9),
`dorm_util_gain_vs_static` (allocation), `dorm_useful_util_gain_vs_static` (target >= 1.3),
`dorm_fairness_gain_vs_static` (static's fairness loss over Dorm's; target >= 1).

**--paper optimus** (sim/papers/optimus.py: Table 1's job types with Table 2's speed functions and
Fig. 7's curve, 60 jobs arriving over [0, 12000] s, 13 nodes, a 10-minute scheduling interval):
Optimus against DRF and Tetris. Keys `optimus_jct_gain_vs_drf` (paper 2.39), `optimus_makespan_gain_vs_drf`
(paper 1.63), `optimus_jct_gain_vs_tetris`, `optimus_makespan_gain_vs_tetris` (paper: Tetris 5.0 h vs
Optimus 4.1 h makespan, 1.22), `drf_makespan_h` (paper 6.7), and the `oracle` (Optimus's rule on the
true remaining epochs and speed functions): `oracle_jct_gain_vs_drf` is what the rule gains on this
workload without prediction errors, `optimus_over_oracle` what Optimus's errors cost. `all_sync` holds
the same for Fig. 16's all-synchronous workload (DRF, Optimus, oracle).

**--paper dorm** (sim/papers/dorm.py: Table II's 50 applications arriving 20 minutes apart on
average, 20 nodes x 12 cores, Dorm-3's thresholds): Dorm against static partitions. Keys
`dorm_util_gain_vs_static` (over the first 5 hours, as the paper's figure; paper 2.32),
`dorm_util_gain_vs_static_run` (over the whole run), `dorm_fairness_gain_vs_static` (paper 1.52),
`dorm_speedup_vs_static` (per application, static JCT over Dorm's, averaged; paper 2.72). The
paper gives no speed functions; `linear_speed` holds the same keys for the variant where every
worker adds its whole speed (sim/papers/dorm.py's LINEAR), the assumed function's cost.

**--paper harmony** (bench/support/harmony_sim_paper.py; sim/workload_harmony.py's 80 jobs of Table
4.1 on 100 hosts of 8 cores, DoP 16): Harmony against isolated and naive co-location in the
simulator with sim/colocation.py's model. Keys `harmony_jct_gain_vs_isolated` (paper 2.11),
`harmony_makespan_gain_vs_isolated` (1.60), `harmony_util_gain_vs_isolated` (1.65), the naive ones,
and the model's best cases (`model_best_case_jct_gain`, `model_best_case_makespan_gain`).

Run times on this project's shared 2-core dev host (one seed): default ~8 min (Tetris alone
3.5 min), `--quick` (30 jobs; static, drf, optimus, oracle, dorm) ~2 min; `--paper optimus` ~6 min,
`--quick` ~3 min; `--paper dorm` ~3 min, `--quick` ~2 min.

`--paper` dispatches through PAPERS, a table of functions (one per paper). The last line of output
is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support.harmony_sim_paper import harmony_run  # noqa: E402  (bench/support: not a benchmark itself)
from protocol.records import Resource  # noqa: E402
from sim import calibration as calibration_file  # noqa: E402
from sim.calibration import Calibration  # noqa: E402
from sim.papers import dorm as dorm_paper  # noqa: E402
from sim.papers import optimus as optimus_paper  # noqa: E402
from sim.sim_job import JobTimings  # noqa: E402
from sim.simulator import SimConfig, SimResult, known_policies, simulate  # noqa: E402
from sim.trace import TraceJob  # noqa: E402
from sim.workload import CLUSTER_SPEC, cluster_trace  # noqa: E402

Row = dict[str, Any]


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    """num / den rounded, or None when either is missing or den is zero."""
    if num is None or den is None or den == 0:
        return None
    return round(num / den, 3)


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    """The median of the values present (None when none is)."""
    vs = [v for v in values if v is not None]
    return round(statistics.median(vs), 3) if vs else None


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
            "mean_utilization": round(s.mean_utilization, 4),
            "mean_useful_utilization": None if useful is None else round(float(useful), 4),
            "mean_fairness_loss": round(s.mean_fairness_loss, 4), "finished": s.finished, "jobs": s.jobs,
            "reshapes": s.reshapes, "virtual_h": round(s.virtual_s / 3600.0, 2), "wall_s": round(s.wall_s, 2)}


def run(trace: Sequence[TraceJob], policy: str, cal: Calibration, cfg: SimConfig) -> Optional[SimResult]:
    """One policy's run; None (reported as null) when the simulator cannot run it."""
    try:
        result = simulate(trace, policy, cal, cfg)
    except (KeyError, ValueError) as e:     # a policy not registered here, a trace it cannot take
        print(f"{policy:>8}: not run ({e})", file=sys.stderr)
        return None
    r = row(result)
    print(f"{policy:>8}: mean JCT {r['mean_jct_s']} s, makespan {r['makespan_s']} s, allocation "
          f"{r['mean_utilization']}, useful {r['mean_useful_utilization']}, fairness loss {r['mean_fairness_loss']}, "
          f"{r['finished']}/{r['jobs']} finished, {r['reshapes']} reshapes, {r['wall_s']} s wall", file=sys.stderr)
    return result


def get(rows: dict[str, Row], policy: str, field: str) -> Optional[float]:
    v = rows.get(policy, {}).get(field)
    return None if v is None else float(v)


def seeds_of(ns: argparse.Namespace) -> list[int]:
    return [ns.seed + i for i in range(ns.seeds)]


# ----- default: our apps on a loaded cluster ----------------------------------------------------

QUICK_POLICIES = ["static", "drf", "optimus", "oracle", "dorm"]     # the ones the targets compare

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
    names = ns.policies.split(",") if ns.policies else (QUICK_POLICIES if ns.quick else known_policies())
    per_seed: list[dict[str, Any]] = []
    for seed in seeds_of(ns):
        ct = cluster_trace(cal, cluster, am, seed, ns.load, spec)
        print(f"seed {seed}: {len(ct.jobs)} jobs, {ct.rate_per_s * 3600:.1f} arrivals/h, offered load "
              f"{ct.offered_load:.3f} (target {ns.load}), {nodes} nodes", file=sys.stderr)
        rows = {}
        for name in names:
            res = run(ct.jobs, name, cal, cfg)
            if res is not None:
                rows[name] = row(res)
        for r in rows.values():     # each policy against DRF and against the oracle (issue 25 part 2)
            r["jct_gain_vs_drf"] = ratio(get(rows, "drf", "mean_jct_s"), r["mean_jct_s"])
            r["jct_over_oracle"] = ratio(get(rows, "oracle", "mean_jct_s"), r["mean_jct_s"])
        per_seed.append({"seed": seed, "offered_load": round(ct.offered_load, 3), "policies": rows,
                         "gains": gains_default(rows)})
    out: dict[str, Any] = {"mode": "default", "nodes": nodes, "jobs": spec.jobs, "target_load": ns.load,
                           "seeds": [p["seed"] for p in per_seed], "policies": per_seed[0]["policies"],
                           "offered_load": median([float(p["offered_load"]) for p in per_seed])}
    for key in gains_default({}):
        out[key] = median([p["gains"][key] for p in per_seed])
    if len(per_seed) > 1:
        out["per_seed"] = [{"seed": p["seed"], **p["gains"]} for p in per_seed]
    return out


def gains_default(rows: dict[str, Row]) -> dict[str, Optional[float]]:
    return {
        "optimus_jct_gain_vs_drf": ratio(get(rows, "drf", "mean_jct_s"), get(rows, "optimus", "mean_jct_s")),
        "optimus_makespan_gain_vs_drf": ratio(get(rows, "drf", "makespan_s"), get(rows, "optimus", "makespan_s")),
        "optimus_jct_gain_vs_tetris": ratio(get(rows, "tetris", "mean_jct_s"), get(rows, "optimus", "mean_jct_s")),
        "optimus_over_oracle": ratio(get(rows, "oracle", "mean_jct_s"), get(rows, "optimus", "mean_jct_s")),
        "dorm_util_gain_vs_static": ratio(get(rows, "dorm", "mean_utilization"), get(rows, "static", "mean_utilization")),
        "dorm_useful_util_gain_vs_static": ratio(get(rows, "dorm", "mean_useful_utilization"),
                                                 get(rows, "static", "mean_useful_utilization")),
        "dorm_fairness_gain_vs_static": ratio(get(rows, "static", "mean_fairness_loss"),
                                              get(rows, "dorm", "mean_fairness_loss")),
    }


# ----- --paper optimus --------------------------------------------------------------------------

def optimus_run(ns: argparse.Namespace) -> dict[str, Any]:
    paper = optimus_paper.OptimusPaper()
    if ns.quick:        # half the jobs over half the window: the same load, half the run
        paper = replace(paper, jobs=30, window_s=6000.0)
    cfg = SimConfig(nodes=paper.nodes, node_memory_mb=paper.node.memory, node_vcores=paper.node.vcores,
                    policy_interval_s=paper.scheduling_interval_s, heartbeat_s=2.0,
                    timings=JobTimings(allocate_interval_s=2.0, pending_interval_s=0.5))
    out: dict[str, Any] = {"mode": "paper-optimus", "jobs": paper.jobs, "nodes": paper.nodes,
                           "paper": {"optimus_jct_gain_vs_drf": 2.39, "optimus_makespan_gain_vs_drf": 1.63,
                                     "optimus_makespan_gain_vs_tetris": round(5.0 / 4.1, 3), "drf_makespan_h": 6.7}}
    # §6.1's mix, then Fig. 16's all-sync workload with the oracle (Optimus's rule on the true
    # remaining epochs and speed functions: what Optimus would do without prediction errors).
    variants = (("", paper, ["drf", "tetris", "optimus", "oracle"]),
                ("all_sync", replace(paper, modes=(True,)), ["drf", "optimus", "oracle"]))
    for label, variant, default_names in variants:
        if label and ns.policies:
            continue
        cal = optimus_paper.calibration(variant)
        names = ns.policies.split(",") if ns.policies else default_names
        per_seed: list[dict[str, Any]] = []
        for seed in seeds_of(ns):
            trace = optimus_paper.generate(variant, seed)
            print(f"seed {seed}: Optimus §6 workload{' (' + label + ')' if label else ''}, {len(trace)} jobs over "
                  f"{variant.window_s:.0f} s, {variant.nodes} nodes", file=sys.stderr)
            rows = {}
            for name in names:
                res = run(trace, name, cal, cfg)
                if res is not None:
                    rows[name] = row(res)
            per_seed.append({"seed": seed, "policies": rows, "gains": gains_optimus(rows)})
        gains = {key: median([p["gains"][key] for p in per_seed]) for key in gains_optimus({})}
        if not label:
            out.update(seeds=[p["seed"] for p in per_seed], policies=per_seed[0]["policies"], **gains)
            if len(per_seed) > 1:
                out["per_seed"] = [{"seed": p["seed"], **p["gains"]} for p in per_seed]
        else:
            out[label] = {"policies": per_seed[0]["policies"],
                          **{k: v for k, v in gains.items() if v is not None}}
    return out


def gains_optimus(rows: dict[str, Row]) -> dict[str, Optional[float]]:
    mk = get(rows, "drf", "makespan_s")
    return {
        "optimus_jct_gain_vs_drf": ratio(get(rows, "drf", "mean_jct_s"), get(rows, "optimus", "mean_jct_s")),
        "optimus_makespan_gain_vs_drf": ratio(mk, get(rows, "optimus", "makespan_s")),
        "optimus_jct_gain_vs_tetris": ratio(get(rows, "tetris", "mean_jct_s"), get(rows, "optimus", "mean_jct_s")),
        "optimus_makespan_gain_vs_tetris": ratio(get(rows, "tetris", "makespan_s"), get(rows, "optimus", "makespan_s")),
        "drf_makespan_h": None if mk is None else round(mk / 3600.0, 2),
        "optimus_over_oracle": ratio(get(rows, "oracle", "mean_jct_s"), get(rows, "optimus", "mean_jct_s")),
        "oracle_jct_gain_vs_drf": ratio(get(rows, "drf", "mean_jct_s"), get(rows, "oracle", "mean_jct_s")),
    }


# ----- --paper dorm -----------------------------------------------------------------------------

FIRST_HOURS = 5.0       # Dorm §V-B-1 averages utilization over the first 5 hours


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
    names = ns.policies.split(",") if ns.policies else ["static", "dorm"]
    out: dict[str, Any] = {"mode": "paper-dorm", "applications": len(dorm_paper.generate(paper, ns.seed)),
                           "nodes": paper.nodes,
                           "paper": {"dorm_util_gain_vs_static": 2.32, "dorm_fairness_gain_vs_static": 1.52,
                                     "dorm_speedup_vs_static": 2.72}}
    # The assumed speed function first, then the variant without its losses (sim/papers/dorm.py).
    for label, variant in (("", paper), ("linear_speed", replace(paper, speed=dorm_paper.LINEAR))):
        cal = dorm_paper.calibration(variant)
        per_seed: list[dict[str, Any]] = []
        for seed in seeds_of(ns):
            trace = dorm_paper.generate(variant, seed)
            print(f"seed {seed}: Dorm §V workload{' (' + label + ')' if label else ''}, {len(trace)} applications, "
                  f"mean interval {variant.mean_interval_s / 60:.0f} min, {variant.nodes} nodes", file=sys.stderr)
            results = {}
            for name in names:
                res = run(trace, name, cal, cfg)
                if res is not None:
                    results[name] = res
            per_seed.append({"seed": seed, "policies": {k: row(v) for k, v in results.items()},
                             "gains": gains_dorm(results, first_s)})
        gains = {key: median([p["gains"][key] for p in per_seed]) for key in gains_dorm({}, first_s)}
        if not label:
            out.update(seeds=[p["seed"] for p in per_seed], policies=per_seed[0]["policies"], **gains)
            if len(per_seed) > 1:
                out["per_seed"] = [{"seed": p["seed"], **p["gains"]} for p in per_seed]
        else:
            out[label] = {"policies": per_seed[0]["policies"], **gains}
    return out


def gains_dorm(results: dict[str, SimResult], first_s: float) -> dict[str, Optional[float]]:
    st, dm = results.get("static"), results.get("dorm")
    if st is None or dm is None:
        return {"dorm_util_gain_vs_static": None, "dorm_util_gain_vs_static_run": None,
                "dorm_useful_util_gain_vs_static": None, "dorm_fairness_gain_vs_static": None,
                "dorm_speedup_vs_static": None, "dorm_mean_jct_gain_vs_static": None}
    jct_static = {r.name: r.jct for r in st.records if r.jct is not None}
    speedups = [jct_static[r.name] / r.jct for r in dm.records if r.jct and r.name in jct_static]
    return {
        "dorm_util_gain_vs_static": ratio(window_mean(dm, "utilization", first_s), window_mean(st, "utilization", first_s)),
        "dorm_util_gain_vs_static_run": ratio(dm.summary.mean_utilization, st.summary.mean_utilization),
        "dorm_useful_util_gain_vs_static": ratio(dm.summary.mean_useful_utilization, st.summary.mean_useful_utilization),
        "dorm_fairness_gain_vs_static": ratio(st.summary.mean_fairness_loss, dm.summary.mean_fairness_loss),
        "dorm_speedup_vs_static": round(statistics.fmean(speedups), 3) if speedups else None,
        "dorm_mean_jct_gain_vs_static": ratio(st.summary.mean_jct_s, dm.summary.mean_jct_s),
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
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="traces to run (seed, seed+1, ...); gains are medians")
    p.add_argument("--policies", default="", help="comma-separated policies (default: the mode's)")
    p.add_argument("--jobs", type=int, default=0, help="default mode: jobs in the trace (0: 60, --quick 30)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--load", type=float, default=0.75, help="default mode: the offered load to draw arrivals for")
    p.add_argument("--node-memory-mb", type=int, default=8192)
    p.add_argument("--node-vcores", type=int, default=8)
    p.add_argument("--calibration", type=Path, default=calibration_file.DEFAULT_PATH)
    ns = p.parse_args(argv)
    for name, value in (("--seeds", ns.seeds), ("--nodes", ns.nodes), ("--node-memory-mb", ns.node_memory_mb),
                        ("--node-vcores", ns.node_vcores)):
        if value < 1:
            p.error(f"{name} must be >= 1, got {value}")
    if ns.jobs < 0:
        p.error(f"--jobs must be >= 0, got {ns.jobs}")
    if not (0.0 < ns.load < 10.0):
        p.error(f"--load must be in (0, 10), got {ns.load}")
    out = PAPERS[ns.paper].run(ns) if ns.paper else default_run(ns)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
