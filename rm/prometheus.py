"""Prometheus text exposition of RM metrics (`/metrics/prometheus`)."""
from __future__ import annotations

from protocol.records import ZERO, AppState, NodeState

from .core import ResourceManagerCore


def render(core: ResourceManagerCore) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}")

    apps = {s: 0 for s in AppState}
    for a in core.apps.values():
        apps[a.state] += 1
    nodes = {s: 0 for s in NodeState}
    for s, n in core.nodes.counts().items():
        nodes[s] = n
    total = core.nodes.total
    used = sum((q.used for q in core.scheduler.queues.values()), ZERO)
    metric("elastane_rm_apps", "gauge", "Applications by state.",
           [(f'{{state="{s.value}"}}', v) for s, v in apps.items()])
    metric("elastane_rm_nodes", "gauge", "NodeManagers by state.",
           [(f'{{state="{s.value}"}}', v) for s, v in nodes.items()])
    metric("elastane_rm_memory_mb", "gauge", "Cluster memory in MB.",
           [('{kind="total"}', total.memory), ('{kind="allocated"}', used.memory)])
    metric("elastane_rm_vcores", "gauge", "Cluster virtual cores.",
           [('{kind="total"}', total.vcores), ('{kind="allocated"}', used.vcores)])
    metric("elastane_rm_containers", "gauge", "Containers currently allocated.", [("", len(core.containers))])
    metric("elastane_rm_containers_allocated_total", "counter", "Containers allocated since start.",
           [("", core.counters["containers_allocated"])])
    metric("elastane_rm_nm_heartbeats_total", "counter", "NodeManager heartbeats processed.",
           [("", core.counters["nm_heartbeats"])])
    metric("elastane_rm_am_allocates_total", "counter", "ApplicationMaster allocate calls processed.",
           [("", core.counters["am_allocates"])])
    metric("elastane_rm_apps_submitted_total", "counter", "Applications submitted since start.",
           [("", core.counters["apps_submitted"])])
    metric("elastane_rm_queue_memory_mb", "gauge", "Memory allocated per queue.",
           [(f'{{queue="{q.name}"}}', q.used.memory) for q in core.scheduler.queues.values()])
    return "\n".join(lines) + "\n"
