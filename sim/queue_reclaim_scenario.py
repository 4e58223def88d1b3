"""Issue 34's scenario in the simulator: queue A's elastic jobs hold the whole cluster, a job arrives
in queue B, and capacity preemption (rm/policies/queue_reclaim.py, run by the real RM core after
every policy round exactly as in the RM) gives B its guarantee back -- or not, with it off.

Per seed: queue A (50 % guaranteed, 100 % maximum) gets `a_jobs` elastic PS jobs at t = 0 whose
submitted shapes fill the cluster (A borrows B's idle half), each with minimum 1 worker + 1 server;
queue B (50 %) gets one job at a random time once A's jobs train. The apps, thresholds and data
sizes are drawn from the seed; the cluster and everything else are fixed, so modes differ only in
`preemption` ("off" | "kill" | "shrink"). Reported per run: B's wait (arrival until its training
starts), B's and A's JCTs, and how many executors were shrunk / killed.

The simulated AM runs the PS AM's controller: a shrink directive is an EPS remove (its reshape
cost); a killed executor is an executor loss, which the controller recovers (a worker replaced
live, a server through the latest checkpoint, at the shape the job had) until
max_executor_failures, then the job fails. A job that did not succeed has no JCT here (it counts
as unfinished).
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

import msgspec

from protocol.config import QueueConfig, RMConfig

from .calibration import Calibration
from .job_record import JobRecord
from .simulator import SimConfig, Simulator
from .trace import TraceJob

MODES = ("off", "kill", "shrink")
QUEUES = [QueueConfig("a", 50.0, 100.0), QueueConfig("b", 50.0, 100.0)]


@dataclass(frozen=True)
class ReclaimRun:
    """One simulated run of the scenario."""

    seed: int
    mode: str
    b_wait_s: Optional[float]          # B's job: arrival until training began (None: never began)
    b_jct_s: Optional[float]
    a_jct_s: tuple[Optional[float], ...]
    shrunk: int
    killed: int


def scenario_trace(seed: int, a_jobs: int = 2, nodes: int = 4, node_vcores: int = 4) -> list[TraceJob]:
    """A's jobs fill `nodes` x `node_vcores` (one vcore an executor); B's job asks for half."""
    rng = random.Random(seed)
    per_job = nodes * node_vcores // a_jobs
    jobs = []
    for i in range(a_jobs):
        servers = max(1, per_job // 4)
        jobs.append(TraceJob(arrival_s=0.0, app=rng.choice(("mlr", "lasso")), threshold=round(rng.uniform(0.0005, 0.001), 5),
                             workers=per_job - servers, servers=servers, min_workers=1, min_servers=1,
                             data_scale=round(rng.uniform(60.0, 120.0), 1), queue="a", name=f"a{i}",
                             executor_memory_mb=512, executor_vcores=1))
    half = nodes * node_vcores // 2
    jobs.append(TraceJob(arrival_s=round(rng.uniform(30.0, 90.0), 1), app=rng.choice(("mlr", "lasso")),
                         threshold=round(rng.uniform(0.002, 0.01), 4), workers=half - 1, servers=1, queue="b",
                         name="b0", data_scale=round(rng.uniform(10.0, 20.0), 1), executor_memory_mb=512,
                         executor_vcores=1))
    return jobs


def run(seed: int, mode: str, calibration: Calibration, policy: str = "static", nodes: int = 4,
        node_vcores: int = 4, grace_s: float = 15.0, a_jobs: int = 2) -> ReclaimRun:
    """The scenario for `seed` with capacity preemption `mode`, on `nodes` x `node_vcores`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    rm = RMConfig(queues=QUEUES, preemption=mode, preemption_natural_termination_factor=1.0,   # type: ignore[arg-type]
                  preemption_max_wait_before_kill_s=grace_s, nm_expiry_s=10.0, am_expiry_s=10.0)
    cfg = SimConfig(nodes=nodes, node_memory_mb=4096, node_vcores=node_vcores, am_nodes=1, rm=rm, stall_s=1800.0)
    sim = Simulator(scenario_trace(seed, a_jobs=a_jobs, nodes=nodes, node_vcores=node_vcores), policy, calibration, cfg)
    result = sim.run()
    by_name = {r.name: r for r in result.records}
    b = by_name["b0"]
    rec = sim.core.queue_preemption.get("a")
    return ReclaimRun(seed, mode, None if b.start is None else b.start - b.arrival, _jct(b),
                      tuple(_jct(r) for n, r in sorted(by_name.items()) if n.startswith("a")),
                      rec.shrunk if rec else 0, rec.killed if rec else 0)


def _jct(r: JobRecord) -> Optional[float]:
    """A job's JCT if it succeeded (a failed job's end is no completion)."""
    return r.jct            # None unless it SUCCEEDED (JobRecord.jct)


def summary(runs: Sequence[ReclaimRun]) -> dict[str, float]:
    """Medians over the seeds, per mode: B's wait and JCT, A's mean JCT (runs where all finished)."""
    out: dict[str, float] = {}
    for mode in MODES:
        mine = [r for r in runs if r.mode == mode]
        waits = [r.b_wait_s for r in mine if r.b_wait_s is not None]
        bj = [r.b_jct_s for r in mine if r.b_jct_s is not None]
        aj = [statistics.fmean([j for j in r.a_jct_s if j is not None]) for r in mine if all(j is not None for j in r.a_jct_s)]
        if waits:
            out[f"b_wait_s_{mode}"] = round(statistics.median(waits), 2)
        if bj:
            out[f"b_jct_s_{mode}"] = round(statistics.median(bj), 2)
        if aj:
            out[f"a_jct_s_{mode}"] = round(statistics.median(aj), 2)
        out[f"unfinished_{mode}"] = float(sum(1 for r in mine if r.b_jct_s is None or any(j is None for j in r.a_jct_s)))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m sim.queue_reclaim_scenario [--seeds N] [--policy P]`: every mode on seeds 0..N-1,
    interleaved; one JSON line per run, then the medians as one JSON object on the last line."""
    import argparse
    import json

    from . import calibration as calibration_file

    ap = argparse.ArgumentParser(prog="python -m sim.queue_reclaim_scenario", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (at least 5 for a figure)")
    ap.add_argument("--policy", default="static", help="the RM's policy (static, eps, optimus, dorm, ...)")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    cal = calibration_file.load()
    runs = []
    for seed in range(args.seeds):
        for mode in MODES:
            r = run(seed, mode, cal, args.policy)
            runs.append(r)
            print(json.dumps(msgspec.to_builtins(r)))
    print(json.dumps({"seeds": args.seeds, "policy": args.policy, **summary(runs)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["MODES", "QUEUES", "ReclaimRun", "main", "run", "scenario_trace", "summary"]
