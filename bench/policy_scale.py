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

Last line: {"optimus_ms_4000x16000": ..., "dorm_max_jobs_within_1s": ..., ...} (the optimus key
names the sizes run; --skip-dorm leaves Dorm out).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from support.synthetic_cluster import synthetic_snapshot  # noqa: E402  (bench/support: not a benchmark)

from rm.policies import create  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--nodes", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the cold one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-dorm", action="store_true", help="only the optimus figure")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    policy = create("optimus")
    times, walls, changed = [], [], []
    for r in range(args.rounds + 1):
        # One snapshot at a time, as in the RM; the garbage of building it is collected before the
        # clock starts (a collection the policy's own allocations trigger still counts).
        snap = synthetic_snapshot(args.jobs, args.nodes, seed=args.seed, round=r)
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        decision = policy.decide(snap)
        times.append(time.process_time() - c0)
        walls.append(time.perf_counter() - t0)
        changed.append(len(decision))
        print(f"round {len(times) - 1}: {times[-1] * 1e3:.0f} ms CPU, {walls[-1] * 1e3:.0f} ms wall, "
              f"{len(decision)} jobs reshaped", file=sys.stderr, flush=True)
    warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
    wall = statistics.median(walls[1:]) if len(walls) > 1 else walls[0]
    out: dict[str, object] = {f"optimus_ms_{args.jobs}x{args.nodes}": round(warm * 1e3, 1),
                              "optimus_wall_ms": round(wall * 1e3, 1), "optimus_cold_ms": round(times[0] * 1e3, 1),
                              "jobs": args.jobs, "nodes": args.nodes,
                              "rounds": args.rounds, "jobs_reshaped": changed[-1],
                              "anchor_ms": 5000, "target_ms": 500}
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
