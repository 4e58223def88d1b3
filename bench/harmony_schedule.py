"""Harmony's scheduling: the pure `harmony` policy's decision time and its grouping quality
(dissertation §4.4.7: 1.2 s for 80 jobs on 100 machines, under 5 s for 8,000 jobs on 10,000;
within about 2 % of exhaustive search).

    .venv/bin/python bench/harmony_schedule.py [--runs 5] [--instances 60] [--seed 0]

Workload: jobs whose iteration time at 16 machines is log-normal (median 1 s) and whose COMP share
of it is uniform in [0.2, 0.8] (the spread of Fig. 4.9), so COMP on one machine is 16x that share.
Decision time is one `HarmonyPolicy.decide()` on a snapshot where every job has just been
profiled (its report has timings at its profiling directive): the round that folds in 80 / 8,000
reports, runs Algorithm 1 over all of them, allocates the nodes and writes every job's decision
(median of --runs fresh policies; the snapshot is built outside the timing). Algorithm 1 alone is
timed too. Quality: on --instances random instances small enough to enumerate (2-6 jobs, 2-8
machines), Algorithm 1's modelled score against the exhaustive search over every admission of the
first k jobs (Algorithm 1 admits jobs in order), every partition and every split of the machines;
the search over any subset of the jobs is reported beside it. Prints a summary, then one JSON
object as the last line.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from protocol.internal_api import RunState, ShapeDirective
from protocol.job_report import JobReport, WorkerTiming
from protocol.records import ZERO, Resource
from rm.policies.harmony import HarmonyPolicy
from rm.policies.harmony_grouping import schedule
from rm.policies.snapshot import AppView, ClusterSnapshot, NodeView, ps_job_view

# The exhaustive-search oracle is test support (tests/support/harmony_exhaustive.py), not product code.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from harmony_exhaustive import best_grouping

SPEC = ps_job_view({"app": "mlr", "workers": 1, "servers": 1, "executor_memory_mb": 1024, "executor_vcores": 1})
NODE = Resource(32 * 1024, 8)           # m4.2xlarge: 8 vCPU, 32 GB
AM = Resource(1024, 1)


def workload(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(COMP on one machine, COMM) per job, seconds per iteration."""
    itr16 = rng.lognormal(0.0, 0.6, n)
    share = rng.uniform(0.2, 0.8, n)
    return itr16 * share * 16.0, itr16 * (1.0 - share)


def snapshot(nodes: list[NodeView], t_cpu1: np.ndarray, t_net: np.ndarray,
             directives: dict[str, ShapeDirective] | None) -> ClusterSnapshot:
    apps = []
    for i, (c, n) in enumerate(zip(t_cpu1.tolist(), t_net.tolist())):
        app_id = f"application_1_{i + 1:05d}"
        d = None if directives is None else directives.get(app_id)
        report = None
        if d is not None and d.workers > 0:
            report = JobReport(workers=d.workers, servers=d.servers, started=True, iterations=20,
                               directive_version=d.version,
                               worker_times=WorkerTiming(compute_s=c / d.workers, comm_s=n, workers=d.workers))
        apps.append(AppView(app_id, "default", "u", "RUNNING", float(i), ZERO, report, SPEC, am_resource=AM,
                            directive=d))
    total = NODE.scale(len(nodes))
    return ClusterSnapshot(now=1e9, total=total, used=ZERO, nodes=tuple(nodes), apps=tuple(apps))


def decision_ms(n_jobs: int, n_nodes: int, runs: int, rng: np.random.Generator) -> tuple[float, float, dict]:
    """(median decide() ms on the all-profiled round, Algorithm 1 alone ms, what it decided)."""
    nodes = [NodeView(f"n{i:05d}", "/r", "RUNNING", NODE, ZERO) for i in range(n_nodes)]
    t_cpu1, t_net = workload(n_jobs, rng)
    first = HarmonyPolicy()
    d1 = first.decide(snapshot(nodes, t_cpu1, t_net, None))      # everyone profiling, one node each
    directives = {a: jd.directive(1) for a, jd in d1.jobs.items()}
    snap = snapshot(nodes, t_cpu1, t_net, directives)
    times, decided = [], None
    for _ in range(runs):
        policy = copy.deepcopy(first)
        t0 = time.perf_counter()
        decided = policy.decide(snap)
        times.append((time.perf_counter() - t0) * 1000.0)
    assert decided is not None
    running = [jd for jd in decided.jobs.values() if jd.run_state is not RunState.PAUSE]
    groups = {jd.group for jd in running}
    t0 = time.perf_counter()
    g = schedule(t_cpu1, t_net, n_nodes, cap=(NODE.vcores - AM.vcores) // 2)    # the policy's cap here
    alg1 = (time.perf_counter() - t0) * 1000.0
    return statistics.median(times), alg1, {"running": len(running), "groups": len(groups),
                                            "U": [round(x, 3) for x in g.utilization]}


def quality(instances: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """(worst, mean score ratio against exhaustive search over ordered admissions, worst against
    exhaustive search over any subset)."""
    ratios, any_subset = [], []
    for _ in range(instances):
        n, machines = int(rng.integers(2, 7)), int(rng.integers(2, 9))
        t_cpu1, t_net = workload(n, rng)
        ours = schedule(t_cpu1, t_net, machines).score
        ratios.append(ours / best_grouping(t_cpu1, t_net, machines).score)
        any_subset.append(ours / best_grouping(t_cpu1, t_net, machines, fifo=False).score)
    return min(ratios), float(np.mean(ratios)), min(any_subset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--instances", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    out: dict[str, object] = {}
    for n_jobs, n_nodes in ((80, 100), (8000, 10000)):
        ms, alg1, what = decision_ms(n_jobs, n_nodes, args.runs, rng)
        out[f"ms_{n_jobs}x{n_nodes}"] = round(ms, 1)
        out[f"algorithm1_ms_{n_jobs}x{n_nodes}"] = round(alg1, 1)
        print(f"{n_jobs} jobs x {n_nodes} nodes: decide() {ms:.1f} ms (Algorithm 1 alone {alg1:.1f} ms); "
              f"{what['running']} jobs running in {what['groups']} groups, modelled U = {what['U']}")
    worst, mean, worst_any = quality(args.instances, rng)
    out["worst_vs_exhaustive"] = round(worst, 4)
    out["mean_vs_exhaustive"] = round(mean, 4)
    out["worst_vs_exhaustive_any_subset"] = round(worst_any, 4)
    print(f"{args.instances} small instances: Algorithm 1 / exhaustive (ordered admission) worst {worst:.4f}, "
          f"mean {mean:.4f}; against any subset of the jobs worst {worst_any:.4f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
