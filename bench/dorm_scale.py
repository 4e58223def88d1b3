"""Dorm's decision time against cluster size: the most jobs (with proportionally many nodes) for
which the `dorm` policy decides within a budget (1 s: issue 10's "largest size that solves within 1 s").

    .venv/bin/python bench/dorm_scale.py [--budget-s 1.0] [--nodes-per-job 2] [--max-jobs 256] [--runs 3]

Each size is a seeded snapshot (bench/support/dorm_snapshots.py: Dorm's Table II jobs, its testbed's
12-core / 128 GB nodes, nearly full, one job arriving) decided by a fresh DormPolicy: the whole
decide() -- the jobs' view, DRF shares, building and solving P2, the directives -- twice: with the
policy's default MIP gap (within 1 % of the best utilization) and to optimality (HiGHS's default
gap, 1e-4). The solver's own time limit is set well above the budget so a slow solve is
measured, not cut short. Sizes double from 2 jobs until one exceeds the budget (median of --runs
runs), then a bisection between the last two finds the largest within it. Prints one line per size
measured, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rm.policies import DormPolicy  # noqa: E402
from rm.policies.dorm import DEFAULT_MIP_REL_GAP  # noqa: E402
from support.dorm_snapshots import dorm_snapshot  # noqa: E402  (bench/support: not a benchmark itself)


def decide_s(jobs: int, nodes_per_job: float, runs: int, time_limit_s: float, gap: float) -> tuple[float, int, bool]:
    """Median decide() seconds at `jobs`, how many directives it gave, whether P2 was solved."""
    snap = dorm_snapshot(jobs, nodes_per_job, seed=jobs)
    times, n_dec, solved = [], 0, False
    for _ in range(runs):
        policy = DormPolicy(time_limit_s=time_limit_s, mip_rel_gap=gap)
        t0 = time.perf_counter()
        decision = policy.decide(snap)
        times.append(time.perf_counter() - t0)
        n_dec, solved = len(decision), policy.last_solution is not None
    return statistics.median(times), n_dec, solved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=1.0)
    ap.add_argument("--nodes-per-job", type=float, default=2.0)
    ap.add_argument("--max-jobs", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    limit = max(2.0, 3 * args.budget_s)
    out: dict[str, object] = {}
    for label, gap in (("", DEFAULT_MIP_REL_GAP), ("_optimal", 1e-4)):
        print(f"-- P2 solved to within {gap:g} of the best utilization", flush=True)
        best, at_best, capped = largest_within(args, limit, gap)
        key = "dorm_max_jobs_within_1s" if args.budget_s == 1.0 else "dorm_max_jobs_within_budget"
        out[key + label] = best
        out["nodes" + label] = round(best * args.nodes_per_job)
        out["decide_ms_at_max" + label] = round(at_best * 1000, 1)
        out["capped_by_max_jobs" + label] = capped
    out.update({"mip_rel_gap": DEFAULT_MIP_REL_GAP, "mip_rel_gap_optimal": 1e-4, "nodes_per_job": args.nodes_per_job,
                "budget_s": args.budget_s, "cpus": os.cpu_count()})
    print(json.dumps(out))


def largest_within(args: argparse.Namespace, limit: float, gap: float) -> tuple[int, float, bool]:
    """The most jobs decided within the budget, its decide time, whether --max-jobs capped the search."""
    seen: dict[int, float] = {}

    def measure(n: int) -> float:
        t, n_dec, solved = decide_s(n, args.nodes_per_job, args.runs, limit, gap)
        seen[n] = t
        print(f"{n} jobs x {round(n * args.nodes_per_job)} nodes: decide {t * 1000:.1f} ms, "
              f"{n_dec} directives, P2 {'solved' if solved else 'not solved'}", flush=True)
        return t

    best, over, n = 0, None, 2
    while n <= args.max_jobs:
        if measure(n) > args.budget_s:
            over = n
            break
        best, n = n, n * 2
    if over is not None:
        lo, hi = best, over
        while hi - lo > max(1, lo // 16):       # to within ~6 %
            mid = (lo + hi) // 2
            if measure(mid) <= args.budget_s:
                lo = mid
            else:
                hi = mid
        best = lo
    return best, seen.get(best, 0.0), over is None

if __name__ == "__main__":
    main()
