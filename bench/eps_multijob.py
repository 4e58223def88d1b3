"""EPS's multi-job experiment (EPS §6-7, Fig. 14-18), small: a feedback-driven exploration of MLR
hyper-parameters on a local cluster under three approaches, in the same run:

- static: RM policy `static` (what YARN does): a job that does not fit waits in the queue;
- kill:   RM policy `eps` (the H-scheduler) with jobs in elastic_mode "kill": running jobs are
          reshaped by checkpoint, stop and restart (Optimus / Dorm);
- eps:    RM policy `eps` with jobs in elastic_mode "eps": running jobs are reshaped in place.

    python bench/eps_multijob.py [--jobs 10] [--mean-interarrival-s 5] [--threshold 2] [--seed 7]
                                 [--epochs 25] [--cpu-per-node CORES]

The NMs share this machine's cores out by vcore (`--cpu-limit-cores`, YARN's strict CPU mode: by
default each node gets cores / nodes), so the vcores the jobs compete for are worth real CPU and a
job that grows really gets more; `--cpu-per-node 0` runs with a core per vcore instead (then the
12 declared vcores share 2 cores and growing a job only crowds the machine).

The "user" (this script) has jobs arrive with exponential inter-arrival times (the same seeded
times and learning rates for every approach) and submits them in arrival order, one starting at a
time: the next is submitted once the previous one holds all its executors (the AM's shape report
says `started`). Without that, several AMs would each hold part of the executors they need and
wait for the rest (YARN grants no gangs), which deadlocks a full cluster under any policy. The
user watches each job's early feedback (the shape report's `early_feedback` after
`early_feedback_iterations`, with the objective then), and whenever more jobs than the threshold
are in their training phase it kills the one with the worst early feedback (EPS §6).
Per approach, all from the job's arrival (so queueing counts, as in the paper): mean early-feedback
latency, mean JCT of the jobs that completed, makespan (first arrival to the last job's end).

Last line, JSON: {"static": {...}, "kill": {...}, "eps": {...}} each with feedback_latency_s,
mean_jct_s, makespan_s (plus counts).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from appmaster.ps.submission import build_ps_submission  # noqa: E402
from elastane_cli.local_cluster import LocalCluster  # noqa: E402
from protocol.ps_status import FINAL_STATUS_FILE, read_status  # noqa: E402
from protocol.shape_history import SuspendChange  # noqa: E402
from support.http_json import http_json  # noqa: E402
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)

FINAL = ("FINISHED", "FAILED", "KILLED")
USER = "explorer"
POLL_S = 0.5
APPROACHES = (("static", "static", "eps"), ("kill", "eps", "kill"), ("eps", "eps", "eps"))  # name, policy, mode


def log(text: str) -> None:
    print(f"[eps_multijob] {text}", file=sys.stderr, flush=True)


def http(url: str, method: str = "GET", body: Any = None, timeout_s: float = 30.0) -> Any:
    return http_json(url, method, body, timeout_s, user=USER)


@dataclass
class Trial:
    """One job of the exploration: when it arrives, its hyper-parameter, and what happened."""

    index: int
    arrival_s: float
    learning_rate: float
    app_id: str = ""
    submitted: Optional[float] = None
    started: bool = False
    feedback_at: Optional[float] = None
    feedback_objective: Optional[float] = None
    ended_at: Optional[float] = None
    final_status: str = ""
    killed_by_user: bool = False


def make_trials(n: int, mean_interarrival_s: float, seed: int) -> list[Trial]:
    """Exponential inter-arrival times (the first job at 0) and log-uniform learning rates."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        out.append(Trial(i, t, round(10 ** rng.uniform(-1.3, 0.4), 4)))
        t += rng.expovariate(1.0 / mean_interarrival_s)
    return out


def job_spec(trial: Trial, mode: str, epochs: int, feedback_iterations: int) -> dict[str, Any]:
    return {"app": "mlr", "workers": 2, "servers": 1, "max_workers": 3, "max_servers": 2,
            "elastic_mode": mode, "early_feedback_iterations": feedback_iterations, "executor_memory_mb": 320,
            "max_epochs": epochs, "data": {"num_samples": 4000, "rows_per_block": 250, "seed": 3},
            "hparams": {"learning_rate": trial.learning_rate, "convergence_threshold": 1e-6}}


def run_exploration(cluster: LocalCluster, mode: str, trials: list[Trial], threshold: int, epochs: int,
                    feedback_iterations: int, timeout_s: float) -> list[Trial]:
    rm = cluster.rm_url + "/ws/v1/cluster"
    start = time.monotonic()
    deadline = start + timeout_s
    pending = list(trials)
    live: list[Trial] = []
    while pending or live:
        now = time.monotonic() - start
        if time.monotonic() > deadline:
            raise TimeoutError(f"exploration not done after {timeout_s:.0f}s: {len(pending)} to submit, "
                               f"{[t.app_id for t in live]} running")
        starting = [t for t in live if not t.started]
        if pending and pending[0].arrival_s <= now and not starting:
            t = pending.pop(0)
            t.app_id = http(rm + "/apps/new-application", "POST")["application-id"]
            sub = build_ps_submission(job_spec(t, mode, epochs, feedback_iterations), name=f"trial-{t.index}",
                                      am_memory=384, app_id=t.app_id)
            http(rm + "/apps", "POST", sub)
            t.submitted = time.monotonic() - start
            live.append(t)
            log(f"  t={now:6.1f}s submitted trial {t.index} ({t.app_id}, lr {t.learning_rate})")
        apps = {a["id"]: a for a in (http(rm + "/apps?user=" + USER)["apps"] or {}).get("app", [])}
        for t in list(live):
            app = apps.get(t.app_id)
            if app is None:
                continue
            if app["state"] in FINAL:
                t.ended_at, t.final_status = time.monotonic() - start, app["finalStatus"]
                live.remove(t)
                log(f"  t={t.ended_at:6.1f}s trial {t.index} ended {t.final_status}"
                    f"{' (killed: worst early feedback)' if t.killed_by_user else ''}")
                continue
            if (t.feedback_at is None or not t.started) and app["state"] == "RUNNING":
                shape = (http(f"{rm}/apps/{t.app_id}/shape")["shape"].get("current") or {})
                t.started = t.started or bool(shape.get("started"))
                if shape.get("early_feedback") and t.feedback_at is None:
                    t.feedback_at = time.monotonic() - start
                    objective = shape.get("objective")      # None until the job's first epoch ends
                    t.feedback_objective = math.inf if objective is None else float(objective)
                    log(f"  t={t.feedback_at:6.1f}s trial {t.index} early feedback: objective "
                        f"{t.feedback_objective:.4f}")
        training = [t for t in live if t.feedback_at is not None and not t.killed_by_user]
        if len(training) > threshold:
            worst = max(training, key=lambda t: t.feedback_objective or math.inf)
            worst.killed_by_user = True
            http(f"{rm}/apps/{worst.app_id}/state", "PUT", {"state": "KILLED"})
        time.sleep(POLL_S)
    return trials


def summarise(trials: list[Trial]) -> dict[str, Any]:
    latencies = [t.feedback_at - t.arrival_s for t in trials if t.feedback_at is not None]
    completed = [t.ended_at - t.arrival_s for t in trials if t.final_status == "SUCCEEDED" and t.ended_at is not None]
    ends = [t.ended_at for t in trials if t.ended_at is not None]
    starts = [t.arrival_s for t in trials]
    return {"feedback_latency_s": round(statistics.mean(latencies), 2) if latencies else None,
            "mean_jct_s": round(statistics.mean(completed), 2) if completed else None,
            "makespan_s": round(max(ends) - min(starts), 2) if ends and starts else None,
            "jobs": len(trials), "completed": len(completed), "killed_by_user": sum(t.killed_by_user for t in trials),
            "failed": sum(t.final_status == "FAILED" for t in trials),
            "mean_queued_s": round(statistics.mean(t.submitted - t.arrival_s for t in trials
                                                   if t.submitted is not None), 2),
            "gave_feedback": len(latencies)}


def directives_seen(cluster: LocalCluster, trials: list[Trial]) -> int:
    """How many shape changes the AMs made (from their final status files)."""
    n = 0
    for t in trials:
        f = Path(cluster.base_dir) / "rm" / "apps" / t.app_id / FINAL_STATUS_FILE
        try:
            n += sum(1 for h in read_status(f.read_bytes()).shape_history if not isinstance(h, SuspendChange) and h.changed)
        except (OSError, msgspec.DecodeError):
            continue
    return n


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM stops the cluster this bench started
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--mean-interarrival-s", type=float, default=5.0)
    p.add_argument("--threshold", type=int, default=2, help="most jobs in their training phase")
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--feedback-iterations", type=int, default=48, help="early-feedback phase (iterations)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--slots-per-node", type=int, default=4, help="512 MB / 1 vcore containers per node")
    p.add_argument("--timeout-s", type=float, default=240.0, help="per approach")
    p.add_argument("--keep-dir", type=Path, default=None)
    p.add_argument("--cpu-per-node", type=float, default=None,
                   help="cores each NM's containers get in all, shared by vcore (default: this machine's "
                        "cores / nodes; 0 = a vcore is a core)")
    p.add_argument("--only", choices=[a[0] for a in APPROACHES], action="append")
    ns = p.parse_args(argv)
    # The nodes' vcores are what the jobs compete for; on one machine they are worth its real cores
    # only if the NMs share those out by vcore (YARN's strict CPU mode). Otherwise 12 declared vcores
    # on 2 cores would make a job that grows no faster, only the machine more crowded.
    cpu_per_node = (os.cpu_count() or 1) / ns.nodes if ns.cpu_per_node is None else ns.cpu_per_node
    results: dict[str, Any] = {}
    for name, policy, mode in APPROACHES:
        if ns.only and name not in ns.only:
            continue
        trials = make_trials(ns.jobs, ns.mean_interarrival_s, ns.seed)
        tmp = None if ns.keep_dir else tempfile.TemporaryDirectory(prefix=f"eps-multijob-{name}-")
        base = (ns.keep_dir / name) if ns.keep_dir else Path(tmp.name)  # type: ignore[union-attr]
        cluster = LocalCluster(base, nodes=ns.nodes, node_memory_mb=512 * ns.slots_per_node,
                               node_vcores=ns.slots_per_node, heartbeat_interval_ms=250, policy=policy,
                               nm_expiry_s=30, am_expiry_s=30,
                               extra_nm_args=["--cpu-limit-cores", f"{cpu_per_node:.4f}"])
        try:
            log(f"{name}: RM policy {policy}, jobs in elastic_mode {mode}; {ns.jobs} jobs, "
                f"threshold {ns.threshold}")
            cluster.start(timeout_s=60)
            t0 = time.monotonic()
            run_exploration(cluster, mode, trials, ns.threshold, ns.epochs, ns.feedback_iterations, ns.timeout_s)
            results[name] = {**summarise(trials), "shape_changes": directives_seen(cluster, trials),
                             "wall_s": round(time.monotonic() - t0, 1)}
            log(f"{name}: {results[name]}")
        finally:
            cluster.stop()
            if tmp is not None:
                tmp.cleanup()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
