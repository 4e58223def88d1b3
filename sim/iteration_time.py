"""How long a simulated job's epoch takes where it runs: the hook co-location models plug into.

A job's epoch time alone on idle nodes is its calibrated speed function (models.ps_iteration_time,
`SimJob.solo_epoch_s`). Where it runs with other jobs the simulator asks an `IterationTimeModel`
for the epoch time instead, giving it the job and a `ClusterLoad`: every node's vcores and the
executors of every training job on it. The simulator asks again, for every training job, whenever
the executors that train change anywhere (a job starts, reshapes, pauses or ends), and the job goes
on at the new speed from then.

`CoreContention` (the default) is the cluster's CPU: executors asking no more vcores than their
node has cores train at their calibrated speed, and a node whose training executors ask more than
it has (an NM declaring more vcores than cores: `SimConfig.node_cores`) slows every executor on it
by asked / cores, as CPU-bound processes sharing cores fairly do. A BSP job
goes at its slowest executor's pace, so the job's epoch time is its solo time times the worst
factor over the nodes it runs on. A co-location model (Harmony §3's interference between the jobs
of a group, sim/colocation.py) implements the same protocol, usually wrapping this one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

WORKER, SERVER = "worker", "server"


@dataclass(frozen=True)
class ExecutorLoad:
    """One training executor: which job, which role, where, how many vcores it asked for."""

    app_id: str
    app: str            # the job's app (mlr, nmf, lda, lasso): what a co-location model keys on
    role: str           # WORKER or SERVER
    node: str
    vcores: int


@dataclass(frozen=True)
class JobLoad:
    """A training job as an iteration-time model sees it."""

    app_id: str
    app: str
    workers: int
    servers: int
    solo_epoch_s: float                 # its calibrated epoch time at this shape, alone
    executors: tuple[ExecutorLoad, ...]

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(e.node for e in self.executors)


@dataclass(frozen=True)
class ClusterLoad:
    """Every node's cores (in calibrated vcores) and the executors of every training job on it."""

    node_vcores: dict[str, int]
    jobs: tuple[JobLoad, ...] = ()
    by_node: dict[str, tuple[ExecutorLoad, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, node_vcores: dict[str, int], jobs: tuple[JobLoad, ...]) -> "ClusterLoad":
        by_node: dict[str, list[ExecutorLoad]] = {}
        for j in jobs:
            for e in j.executors:
                by_node.setdefault(e.node, []).append(e)
        return cls(dict(node_vcores), jobs, {n: tuple(es) for n, es in by_node.items()})

    def asked_vcores(self, node: str) -> int:
        return sum(e.vcores for e in self.by_node.get(node, ()))

    def colocated(self, job: JobLoad) -> tuple[JobLoad, ...]:
        """The other training jobs with an executor on one of `job`'s nodes."""
        mine = job.nodes
        return tuple(j for j in self.jobs if j.app_id != job.app_id and j.nodes & mine)


class IterationTimeModel(Protocol):
    """Gives a training job's epoch time (seconds, on its data) where it runs now."""

    def epoch_time(self, job: JobLoad, cluster: ClusterLoad) -> float: ...


class CoreContention:
    """The default model: oversubscribed nodes slow their executors proportionally (module doc)."""

    def factor(self, job: JobLoad, cluster: ClusterLoad) -> float:
        """How much slower than alone the job goes: the worst asked / capacity over its nodes (>= 1)."""
        worst = 1.0
        for node in job.nodes:
            cap = cluster.node_vcores.get(node, 0)
            asked = cluster.asked_vcores(node)
            if cap > 0 and asked > cap:
                worst = max(worst, asked / cap)
        return worst

    def epoch_time(self, job: JobLoad, cluster: ClusterLoad) -> float:
        return job.solo_epoch_s * self.factor(job, cluster)


__all__ = ["ClusterLoad", "CoreContention", "ExecutorLoad", "IterationTimeModel", "JobLoad", "SERVER", "WORKER"]
