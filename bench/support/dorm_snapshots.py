"""Seeded cluster snapshots of running elastic PS jobs plus one arriving job, for Dorm's scale benchmark.

Jobs are drawn from Dorm's workload (Table II: seven kinds of jobs with their CPU / RAM demand per
container and weight; GPUs left out, Elastane's resources are memory and vcores) with n_min = 2
(one worker, one server) and n_max between 4 and 16; nodes are Dorm's testbed slaves (12 cores,
128 GB). The running jobs hold their minimum, then grow round-robin while something fits (placed
first-fit), so the cluster is nearly full; the arriving job has neither its AM nor its executors yet,
which is what makes Dorm solve P2.
"""
from __future__ import annotations

import random

from protocol.internal_api import NodePlacement
from protocol.job_report import JobReport
from protocol.records import ZERO, AppState, NodeState, Resource
from rm.policies import AppView, ClusterSnapshot, NodeView, ps_job_view

NODE = Resource(128 * 1024, 12)
AM = Resource(1024, 1)
# (vcores, memory GB, weight) per container, Dorm Table II
KINDS = [(2, 8, 1), (2, 6, 2), (4, 6, 4), (4, 32, 1), (6, 16, 1), (6, 16, 2), (4, 32, 4)]


def _app(app_id: str, t: float, demand: Resource, weight: int, n_max: int, placement: dict[str, list[int]],
         started: bool) -> AppView:
    w = sum(p[0] for p in placement.values())
    s = sum(p[1] for p in placement.values())
    spec = {"app": "mlr", "workers": max(1, w) if started else 1, "servers": max(1, s) if started else 1,
            "max_workers": n_max // 2, "max_servers": n_max - n_max // 2, "weight": float(weight),
            "executor_memory_mb": demand.memory, "executor_vcores": demand.vcores}
    held = demand.scale(w + s) + (AM if started else ZERO)
    report = JobReport(workers=w, servers=s, started=True, executor_resource=demand) if started else None
    return AppView(app_id, "default", "user", AppState.RUNNING if started else AppState.ACCEPTED, t, held, shape=report,
                   ps=ps_job_view(spec), am_resource=AM,
                   executors=tuple(NodePlacement(node=n, workers=pw, servers=ps) for n, (pw, ps) in sorted(placement.items())))


def dorm_snapshot(jobs: int, nodes_per_job: float = 2.0, seed: int = 0) -> ClusterSnapshot:
    """`jobs` running jobs (and one arriving) on round(jobs x nodes_per_job) nodes (see the module doc)."""
    rng = random.Random(seed)
    node_ids = [f"node{k:05d}:8041" for k in range(max(1, round(jobs * nodes_per_job)))]
    free = {n: NODE for n in node_ids}
    kinds = [rng.choice(KINDS) for _ in range(jobs + 1)]
    demands = [Resource(gb * 1024, cpu) for cpu, gb, _ in kinds]
    n_max = [rng.randint(4, 16) for _ in range(jobs + 1)]
    placed: list[dict[str, list[int]]] = [{} for _ in range(jobs)]
    counts = [0] * jobs
    cursor = 0

    def put(i: int, r: Resource, role: int | None) -> bool:
        nonlocal cursor
        for step in range(len(node_ids)):      # first fit from a rotating start
            n = node_ids[(cursor + step) % len(node_ids)]
            if r.fits_in(free[n]):
                free[n] = free[n] - r
                if role is not None:
                    placed[i].setdefault(n, [0, 0])[role] += 1
                    counts[i] += 1
                cursor = (cursor + step) % len(node_ids)
                return True
        return False

    alive = []
    for i in range(jobs):
        if put(i, AM, None) and put(i, demands[i], 0) and put(i, demands[i], 1):
            alive.append(i)
    growing = list(alive)
    while growing:
        for i in list(growing):
            if counts[i] >= n_max[i] or not put(i, demands[i], counts[i] % 2):
                growing.remove(i)
    apps = [_app(f"application_1_{i + 1:05d}", float(i), demands[i], kinds[i][2], n_max[i], placed[i], True)
            for i in alive]
    apps.append(_app(f"application_1_{jobs + 1:05d}", float(jobs), demands[jobs], kinds[jobs][2], n_max[jobs], {},
                     False))
    nodes = tuple(NodeView(n, "/default-rack", NodeState.RUNNING, NODE, NODE - free[n]) for n in node_ids)
    total = NODE.scale(len(node_ids))
    return ClusterSnapshot(now=0.0, total=total, used=total - sum(free.values(), ZERO), nodes=nodes, apps=tuple(apps))


__all__ = ["dorm_snapshot"]
