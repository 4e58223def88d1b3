"""Decision time of the `optimus` policy at datacenter scale (issue 10; anchor 5 s on one core, target
under 0.5 s at 4,000 jobs x 16,000 nodes), on synthetic snapshots (bench/support/synthetic_cluster.py),
and the largest `dorm` instance decided within 1 s (bench/dorm_scale.py's search, on its snapshots).

One policy instance sees round 0 (every job new to it: all fits cold), then rounds 1..R, in each of
which every job has trained one more epoch, so every job's loss curve and speed function are
refitted -- the worst case of a real scheduling interval. The figure is the median decide() time of
rounds 1..R (fits, allocation, placement) as CPU time of this process, which on a shared, loaded
host is what one core spends on it (the wall time is reported beside it, as is the cold round).
BLAS and numpy run on one thread (the anchor is one core); the process is pinned to one core where
it can be.

Baseline, in the same run: the `optimus` policy as it was at git revision `--baseline` (default:
the commit before issue 38 part 5's speed-ups, whose round took 728 ms in the issue), loaded from
git next to today's (models/optimus_fit.py and rm/policies/optimus*.py at that revision, the rest of
the tree as it is now), deciding the same snapshots; each round times both, in alternating order,
so a slow spell of a shared machine falls on both. Reported: each one's median and range over the
timed rounds, and `speedup_vs_baseline` (the baseline's median over today's). `--baseline ""`
leaves it out.

Last line: {"optimus_ms_4000x16000": ..., "optimus_baseline_ms": ..., "speedup_vs_baseline": ...,
"dorm_max_jobs_within_1s": ..., ...} (the optimus key names the sizes run; --skip-dorm leaves Dorm
out).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Optional  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from support.synthetic_cluster import synthetic_snapshot  # noqa: E402  (bench/support: not a benchmark)

from rm.policies import create  # noqa: E402


BASELINE_REV = "967c61c^"     # before "Optimus round at 4,000 jobs x 16,000 nodes: per-job numpy work out ..."
# The modules of the policy at a revision, in import order, and the imports that must point at the
# revision's copies (the snapshot and decision types stay today's: the policies share the snapshots).
BASELINE_MODULES = (("models/optimus_fit.py", "models.optimus_fit"),
                    ("rm/policies/optimus_alloc.py", "rm.policies.optimus_alloc"),
                    ("rm/policies/optimus_placement.py", "rm.policies.optimus_placement"),
                    ("rm/policies/optimus_priors.py", "rm.policies.optimus_priors"),
                    ("rm/policies/optimus.py", "rm.policies.optimus"))


def load_baseline(rev: str) -> Any:
    """The OptimusPolicy class of git revision `rev`, its modules loaded as `<name>_baseline`."""
    module: Optional[types.ModuleType] = None
    for path, name in BASELINE_MODULES:
        out = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"cannot read {path} at {rev}: {out.stderr.strip()}")
        src = out.stdout
        for _, other in BASELINE_MODULES:
            short = other.rsplit(".", 1)[1]
            src = src.replace(f"from {other} import", f"from {other}_baseline import")
            src = src.replace(f"from .{short} import", f"from .{short}_baseline import")
        module = types.ModuleType(f"{name}_baseline")
        module.__package__ = name.rsplit(".", 1)[0]
        sys.modules[module.__name__] = module
        exec(compile(src, f"{rev}:{path}", "exec"), module.__dict__)
    assert module is not None
    return module.OptimusPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--nodes", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the cold one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-dorm", action="store_true", help="only the optimus figure")
    ap.add_argument("--baseline", default=BASELINE_REV, help="git revision of the baseline policy ('' for none)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    policy = create("optimus")
    baseline: Any = None
    baseline_error: Optional[str] = None
    if args.baseline:
        try:
            baseline = load_baseline(args.baseline)()
        except Exception as e:  # noqa: BLE001 - no baseline (e.g. a clone without that history) is reported
            baseline_error = f"{type(e).__name__}: {e}"
            print(f"baseline {args.baseline}: {baseline_error}", file=sys.stderr)
    times, walls, changed = [], [], []
    base_times: list[float] = []
    same_decisions = True

    def timed(p: Any, snap: Any) -> tuple[Any, float, float]:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        d = p.decide(snap)
        return d, time.process_time() - c0, time.perf_counter() - t0

    for r in range(args.rounds + 1):
        # One snapshot at a time, as in the RM; the garbage of building it is collected before the
        # clock starts (a collection the policy's own allocations trigger still counts).
        snap = synthetic_snapshot(args.jobs, args.nodes, seed=args.seed, round=r)
        if baseline is not None and r % 2:      # alternate which policy decides first
            base_decision, base_cpu, _ = timed(baseline, snap)
        decision, cpu, wall = timed(policy, snap)
        if baseline is not None and not r % 2:
            base_decision, base_cpu, _ = timed(baseline, snap)
        times.append(cpu)
        walls.append(wall)
        changed.append(len(decision))
        if baseline is not None:
            base_times.append(base_cpu)
            same_decisions = same_decisions and base_decision == decision
        print(f"round {len(times) - 1}: {times[-1] * 1e3:.0f} ms CPU, {walls[-1] * 1e3:.0f} ms wall, "
              f"{len(decision)} jobs reshaped" + (f"; baseline {base_times[-1] * 1e3:.0f} ms CPU"
                                                   if baseline is not None else ""), file=sys.stderr, flush=True)
    warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
    wall = statistics.median(walls[1:]) if len(walls) > 1 else walls[0]
    out: dict[str, object] = {f"optimus_ms_{args.jobs}x{args.nodes}": round(warm * 1e3, 1),
                              "optimus_wall_ms": round(wall * 1e3, 1), "optimus_cold_ms": round(times[0] * 1e3, 1),
                              "jobs": args.jobs, "nodes": args.nodes,
                              "rounds": args.rounds, "jobs_reshaped": changed[-1],
                              "anchor_ms": 5000, "target_ms": 500,
                              "optimus_ms_range": [round(min(times[1:] or times) * 1e3, 1),
                                                   round(max(times[1:] or times) * 1e3, 1)]}
    if baseline is not None:
        base = statistics.median(base_times[1:]) if len(base_times) > 1 else base_times[0]
        out.update(baseline_rev=args.baseline, optimus_baseline_ms=round(base * 1e3, 1),
                   optimus_baseline_ms_range=[round(min(base_times[1:] or base_times) * 1e3, 1),
                                              round(max(base_times[1:] or base_times) * 1e3, 1)],
                   speedup_vs_baseline=round(base / warm, 3) if warm > 0 else None,
                   same_decisions_as_baseline=same_decisions)
    elif baseline_error is not None:
        out["baseline_error"] = baseline_error
    if not args.skip_dorm:
        from dorm_scale import largest_within   # noqa: PLC0415 (bench/dorm_scale.py: its search, its snapshots)

        from rm.policies.dorm import DEFAULT_MIP_REL_GAP  # noqa: PLC0415
        search = argparse.Namespace(budget_s=1.0, nodes_per_job=2.0, max_jobs=256, runs=3)
        best, at_best, capped = largest_within(search, 3.0, DEFAULT_MIP_REL_GAP)
        out.update(dorm_max_jobs_within_1s=best, dorm_nodes=round(best * search.nodes_per_job),
                   dorm_decide_ms_at_max=round(at_best * 1000, 1), dorm_capped_by_max_jobs=capped)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
