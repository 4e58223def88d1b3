"""Cruise optimizer solve-time benchmark (dissertation §3.4.6: 30 ms homogeneous, 37.4 s
heterogeneous on 32 nodes).

    .venv/bin/python bench/cruise_solve.py [--runs 7]

Homogeneous: eq. 3.5's closed form (plus role choice, block split and pricing, i.e. the whole
target) for N = 32 and 1,000 identical simulated nodes, against the baseline in the same run: the
brute-force search over every (W, S) split evaluating the cost model on all N nodes (§3.4.2's grid
search, done in the model). Heterogeneous: the class MILP (scipy.optimize.milp / HiGHS) for
N = 32 (28 + 4 fast nodes, the dissertation's setup) and N = 1,000 (four synthetic node classes).
Medians of --runs runs. Prints a summary, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from appmaster.cruise.baselines import brute_force_homogeneous
from appmaster.cruise.solver_homogeneous import solve_homogeneous, solve_homogeneous_target
from appmaster.cruise.solver_milp import solve_milp_target
from appmaster.cruise.targets import Slot
from models.cruise_cost import JobProfile, NodeProfile

# NMF-like job of §3.4.6: 200 input blocks of 10K items, 128 model blocks, mini-batch 10K,
# the whole 284 MB model exchanged per mini-batch.
JOB = JobProfile(input_blocks=200, samples_per_block=10_000, model_blocks=128, bytes_per_batch=284e6,
                 batch_size=10_000)
JOB_1000 = JobProfile(input_blocks=4_000, samples_per_block=500, model_blocks=1_024, bytes_per_batch=284e6,
                      batch_size=10_000)
R4_XLARGE = (4e-4, 1.25e9 / 8, 1.25e9 / 8)          # s/sample, worker B/s, server B/s
R4_4XLARGE = (1e-4, 5e9 / 8, 5e9 / 8)
CLASSES_1000 = [(400, R4_XLARGE), (300, (2e-4, 2.5e9 / 8, 2.5e9 / 8)), (200, R4_4XLARGE),
                (100, (6e-4, 1e9 / 8, 2e9 / 8))]


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def slots(classes) -> list[Slot]:
    out = []
    for k, (n, prof) in enumerate(classes):
        out += [Slot(NodeProfile(f"c{k}-{i}", *prof)) for i in range(n)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    node = NodeProfile("r4.xlarge", *R4_XLARGE)
    out: dict[str, float] = {}
    for n, job in ((32, JOB), (1000, JOB_1000)):
        homo = slots([(n, R4_XLARGE)])
        out[f"solve_ms_homogeneous_{n}"] = median_ms(lambda: solve_homogeneous_target(job, homo), args.runs)
        out[f"closed_form_only_ms_homogeneous_{n}"] = median_ms(lambda: solve_homogeneous(job, node, n), args.runs)
        out[f"bruteforce_ms_homogeneous_{n}"] = median_ms(lambda: brute_force_homogeneous(job, node, n), args.runs)
        fast, slow = solve_homogeneous(job, node, n), brute_force_homogeneous(job, node, n)
        assert abs(fast.epoch_s - slow.epoch_s) <= 1e-9 * slow.epoch_s, (fast, slow)
        print(f"homogeneous N={n}: closed form (W,S)=({fast.workers},{fast.servers}) = brute force "
              f"({slow.workers},{slow.servers}); target {out[f'solve_ms_homogeneous_{n}']:.3f} ms, "
              f"closed form alone {out[f'closed_form_only_ms_homogeneous_{n}']:.4f} ms, "
              f"brute force {out[f'bruteforce_ms_homogeneous_{n}']:.2f} ms")
    for n, job, classes in ((32, JOB, [(28, R4_XLARGE), (4, R4_4XLARGE)]), (1000, JOB_1000, CLASSES_1000)):
        het = slots(classes)
        target = solve_milp_target(job, het)
        out[f"solve_ms_heterogeneous_{n}"] = median_ms(lambda: solve_milp_target(job, het), args.runs)
        print(f"heterogeneous N={n} ({len(classes)} classes): (W,S)={target.shape} "
              f"workers per class {target.details['workers_per_class']} [{target.details['milp_status']}], "
              f"epoch {target.epoch_s:.1f} s, solve {out[f'solve_ms_heterogeneous_{n}']:.1f} ms")
    out["speedup_vs_bruteforce_homogeneous_1000"] = (out["bruteforce_ms_homogeneous_1000"]
                                                     / out["solve_ms_homogeneous_1000"])
    print(json.dumps({k: round(v, 4) for k, v in out.items()}))


if __name__ == "__main__":
    main()
