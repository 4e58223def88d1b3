"""Small cluster snapshots of elastic PS jobs for the partitioning policies' tests (dorm, drf, tetris)."""
from __future__ import annotations

from typing import Any, Optional

from protocol.internal_api import NodePlacement
from protocol.job_report import JobReport
from protocol.records import ZERO, Resource
from rm.policies import AppView, ClusterSnapshot, NodeView, ps_job_view

AM = Resource(512, 1)


def node(node_id: str, memory: int, vcores: int, used: Resource = ZERO) -> NodeView:
    return NodeView(node_id, "/default-rack", "RUNNING", Resource(memory, vcores), used)


def job(app_id: str, executor: Resource, placement: dict[str, tuple[int, int]], *, started: bool = True,
        submit_time: float = 0.0, am_on: Optional[str] = "am", **spec: Any) -> AppView:
    """A PS job whose executors run as `placement` says (node -> (workers, servers)); spec fields
    (workers, servers, min_/max_workers, ..., weight) as keyword arguments."""
    w = sum(p[0] for p in placement.values())
    s = sum(p[1] for p in placement.values())
    ps = {"app": "mlr", "workers": spec.pop("workers", max(1, w)), "servers": spec.pop("servers", max(1, s)),
          "executor_memory_mb": executor.memory, "executor_vcores": executor.vcores, **spec}
    held = executor.scale(w + s) + (AM if am_on else ZERO)
    report = JobReport(workers=w, servers=s, started=True, executor_resource=executor) if started else None
    return AppView(app_id, "default", "alice", "RUNNING" if started else "ACCEPTED", submit_time, held,
                   shape=report, ps=ps_job_view(ps), am_resource=AM,
                   executors=tuple(NodePlacement(node=n, workers=pw, servers=psv)
                                   for n, (pw, psv) in sorted(placement.items())))


def snapshot(nodes: list[NodeView], apps: list[AppView], am_nodes: Optional[dict[str, str]] = None) -> ClusterSnapshot:
    """Nodes' `used` is filled in from the apps' executors and AMs (AM of app i on `am_nodes[i]`,
    default the first node) unless a node says otherwise. A job made with `am_on=None` holds no
    AM container on any node (the policies see it as granted once it holds executors)."""
    used: dict[str, Resource] = {n.node_id: ZERO for n in nodes}
    for a in apps:
        if a.ps is None:
            continue            # another app: nothing of it runs yet
        ex = a.shape.executor_resource if a.shape and a.shape.executor_resource else None
        ex = ex or a.ps.executor
        n = 0
        for p in a.executors:
            used[p.node] = used[p.node] + ex.scale(p.workers + p.servers)
            n += p.workers + p.servers
        if a.resources != ex.scale(n):     # the app holds its AM too
            am_node = (am_nodes or {}).get(a.app_id, nodes[0].node_id)
            used[am_node] = used[am_node] + a.am_resource
    full = [NodeView(n.node_id, n.rack, n.state, n.capacity, n.used if n.used != ZERO else used[n.node_id])
            for n in nodes]
    total = sum((n.capacity for n in nodes), ZERO)
    return ClusterSnapshot(now=100.0, total=total, used=sum((n.used for n in full), ZERO), nodes=tuple(full),
                           apps=tuple(apps))
