"""Synthetic cluster snapshots for policy benchmarks: many nodes, many running elastic PS jobs.

`synthetic_snapshot(jobs, nodes, seed, round)` builds the `ClusterSnapshot` a policy decides on
(rm/policies/snapshot.py) without an RM: homogeneous nodes, and started PS jobs (BSP or SSP) whose
AMs' job reports carry what the policies read -- shape, executor resource, objective history along
a known loss curve (eq. 1 of Optimus, with noise), epoch times from a known speed function at the
current shape -- and whose executors are spread round-robin over the nodes. `round` advances every
job by that many epochs (same shapes), so consecutive rounds give a policy new data to refit on,
as a real scheduling interval does. Deterministic for (jobs, nodes, seed, round).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocol.job_report import MAX_EPOCH_TIMES, MAX_OBJECTIVES, EpochObjective, JobReport
from protocol.records import AppState, NodeState, Resource
from rm.policies.snapshot import AppView, ClusterSnapshot, NodeView, ps_job_view

AM = Resource(1024, 1)


@dataclass(frozen=True)
class ClusterShape:
    """Node size and job mix of a synthetic cluster."""

    # Small enough that the jobs' demand at their max shapes (~2x the cluster) exceeds it: the
    # allocation's budget binds, as in a busy cluster.
    node_memory_mb: int = 32 * 1024
    node_vcores: int = 8
    max_workers: int = 32
    max_servers: int = 16
    executor_vcores: tuple[int, ...] = (1, 2, 4)
    epochs: tuple[int, int] = (5, 60)        # epochs already trained at round 0 (range)


def synthetic_snapshot(jobs: int, nodes: int, seed: int = 0, round: int = 0,
                       shape: ClusterShape = ClusterShape()) -> ClusterSnapshot:
    """A snapshot of `nodes` nodes running `jobs` elastic PS jobs (see the module doc)."""
    rng = np.random.default_rng(seed)
    vcores = rng.choice(shape.executor_vcores, size=jobs)
    memory = vcores * 2048
    max_w = rng.integers(2, shape.max_workers + 1, size=jobs)
    max_s = rng.integers(1, shape.max_servers + 1, size=jobs)
    workers = np.maximum(1, (max_w * rng.uniform(0.1, 0.5, size=jobs)).astype(int))
    servers = np.maximum(1, (max_s * rng.uniform(0.1, 0.5, size=jobs)).astype(int))
    sync = rng.random(jobs) < 0.5
    b0 = rng.uniform(0.05, 0.5, size=jobs)
    b1 = rng.uniform(0.8, 1.5, size=jobs)
    b2 = rng.uniform(0.01, 0.2, size=jobs)
    # A true speed function per job (epochs/s), eq. 4 / eq. 3 shaped.
    th = rng.uniform(0.5, 2.0, size=(jobs, 4)) * np.array([20.0, 1.0, 2.0, 0.05])
    trained0 = rng.integers(shape.epochs[0], shape.epochs[1], size=jobs)
    noise = np.random.default_rng(seed + 1 + round)

    node_cap = Resource(shape.node_memory_mb, shape.node_vcores)
    used_mem = np.zeros(nodes, dtype=np.int64)
    used_vc = np.zeros(nodes, dtype=np.int64)
    apps = []
    cursor = 0
    for j in range(jobs):
        w, s, v, m = int(workers[j]), int(servers[j]), int(vcores[j]), int(memory[j])
        ex = Resource(m, v)
        trained = int(trained0[j]) + round
        ks = np.arange(max(0, trained - MAX_OBJECTIVES), trained)
        loss = (1.0 / (b0[j] * (ks + 1) + b1[j]) + b2[j]) * (1 + noise.normal(0, 0.01, len(ks)))
        inv = th[j, 0] / w + th[j, 1] + th[j, 2] * w / s + th[j, 3] * s
        if not sync[j]:
            inv = th[j, 0] / w + th[j, 1] / s + th[j, 2] * 0.1 + th[j, 3] * s / w
        times = inv * (1 + noise.normal(0, 0.02, min(MAX_EPOCH_TIMES, trained)))
        report = JobReport(
            workers=w, servers=s, started=True, iterations=trained * 100, early_feedback=True,
            early_feedback_iterations=100, speed=1.0, speed_iterations=100, executor_resource=ex,
            phase="TRAINING", epoch=trained - 1, epoch_time_s=float(times[-1]), objective=float(loss[-1]),
            epoch_times=[float(t) for t in times], initial_objective=float(1.0 / b1[j] + b2[j]),
            objectives=[EpochObjective(int(k), float(o)) for k, o in zip(ks, loss)])
        spec = {"app": "mlr", "workers": w, "servers": s, "max_workers": int(max_w[j]),
                "max_servers": int(max_s[j]), "executor_memory_mb": m, "executor_vcores": v,
                "sync": "bsp" if sync[j] else "ssp", "max_epochs": 10_000}
        held = AM + ex.scale(w + s)
        # The AM, then the executors, spread round-robin over the nodes.
        on: dict[int, int] = {}
        for unit in range(w + s + 1):
            n = cursor % nodes
            used_mem[n] += m if unit else AM.memory
            used_vc[n] += v if unit else AM.vcores
            if unit:
                on[n] = on.get(n, 0) + 1
            cursor += 1
        apps.append(AppView(app_id=f"application_1_{j + 1:05d}", queue="default", user="bench", state=AppState.RUNNING,
                            submit_time=float(j), resources=held, shape=report, ps=ps_job_view(spec),
                            am_resource=AM, executors_on=tuple((f"node{n:05d}:8042", ex.scale(c))
                                                               for n, c in sorted(on.items()))))
    node_views = tuple(NodeView(f"node{n:05d}:8042", "/default-rack", NodeState.RUNNING, node_cap,
                                Resource(int(used_mem[n]), int(used_vc[n]))) for n in range(nodes))
    total = node_cap.scale(nodes)
    used = Resource(int(used_mem.sum()), int(used_vc.sum()))
    return ClusterSnapshot(now=1_000_000.0 + 600.0 * round, total=total, used=used, nodes=node_views,
                           apps=tuple(apps), minimum_allocation_mb=1)


__all__ = ["ClusterShape", "synthetic_snapshot"]
