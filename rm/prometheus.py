"""Prometheus text exposition of RM metrics (`/metrics/prometheus`)."""
from __future__ import annotations

from typing import Callable

from protocol.internal_api import ContainerUtilization
from protocol.prometheus_text import Exposition
from protocol.records import ZERO, AppState, NodeState

from .core import ResourceManagerCore
from .utilization_series import LatestReport, NodePoint


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
    metric("elastane_rm_containers_recovered_total", "counter",
           "Containers of kept attempts re-adopted from the NMs after an RM restart or failover.",
           [("", core.counters["containers_recovered"])])
    metric("elastane_rm_containers_kept_across_attempts_total", "counter",
           "Containers of a failed attempt passed to the next one (keep-containers-across-application-attempts).",
           [("", core.counters["containers_kept_across_attempts"])])
    metric("elastane_rm_nm_heartbeats_total", "counter", "NodeManager heartbeats processed.",
           [("", core.counters["nm_heartbeats"])])
    metric("elastane_rm_am_allocates_total", "counter", "ApplicationMaster allocate calls processed.",
           [("", core.counters["am_allocates"])])
    metric("elastane_rm_apps_submitted_total", "counter", "Applications submitted since start.",
           [("", core.counters["apps_submitted"])])
    metric("elastane_rm_policy_rounds_total", "counter",
           "Policy rounds, by whether their Decision was applied, dropped as stale, or held after a recovery.",
           [('{outcome="applied"}', core.counters["policy_rounds_applied"]),
            ('{outcome="dropped"}', core.counters["policy_rounds_dropped"]),
            ('{outcome="held"}', core.counters["policy_rounds_held"])])
    metric("elastane_rm_reshapes_after_failover_total", "counter",
           "Directives that changed a running job's shape in the policy's first rounds after this RM "
           "recovered from the state store (0 unless the cluster changed).",
           [("", core.counters["reshapes_after_failover"])])
    metric("elastane_rm_queue_memory_mb", "gauge", "Memory allocated per queue.",
           [(f'{{queue="{q.name}"}}', q.used.memory) for q in core.scheduler.queues.values()])
    # Capacity preemption (docs/preemption.md): counters per queue and way, the last round's shares.
    recs = sorted(core.queue_preemption.items())
    metric("elastane_rm_queue_preempted_containers_total", "counter",
           "Executors taken back from a queue for other queues, by how: shrunk live, released by the AM "
           "on a preemption message, killed.",
           [(f'{{queue="{q}",how="{how}"}}', n) for q, r in recs
            for how, n in (("shrink", r.shrunk), ("released", r.released), ("killed", r.killed))])
    metric("elastane_rm_queue_preempted_memory_mb_total", "counter", "Memory taken back from a queue, in MB.",
           [(f'{{queue="{q}"}}', r.resources.memory) for q, r in recs])
    metric("elastane_rm_queue_preempted_vcores_total", "counter", "Vcores taken back from a queue.",
           [(f'{{queue="{q}"}}', r.resources.vcores) for q, r in recs])
    shares = sorted(core.queue_shares.items())
    metric("elastane_rm_queue_share_memory_mb", "gauge",
           "A queue's memory at the last reclaim round: guaranteed, used, pending, ideal share, being reclaimed.",
           [(f'{{queue="{q}",kind="{kind}"}}', v) for q, s in shares
            for kind, v in (("guaranteed", s.guaranteed.memory), ("used", s.used.memory),
                            ("pending", s.pending.memory), ("ideal", s.ideal.memory),
                            ("reclaiming", core.reclaim_book.being_reclaimed(q).memory))])
    return "\n".join(lines) + "\n" + render_utilization(core)


MB = 1024 * 1024


def render_utilization(core: ResourceManagerCore) -> str:
    """The measured figures (docs/metrics.md): per node and cluster from the nodes' latest reports,
    per container and per application with their queue and (where launched with one) role."""
    series = core.utilization
    out = Exposition()
    latest = sorted(series.latest.items())

    def per_node(name: str, help_: str, value: Callable[[LatestReport], float]) -> None:
        out.family(name, "gauge", help_, [({"node": nid}, value(r)) for nid, r in latest])

    per_node("elastane_rm_node_cpu_cores", "CPU cores the node's containers use (cgroup accounting or /proc).",
             lambda r: r.point.cpu_cores)
    per_node("elastane_rm_node_memory_bytes", "Memory the node's containers use (cgroup less inactive cache, or RSS).",
             lambda r: round(r.point.memory_mb * MB))
    per_node("elastane_rm_node_spill_bytes", "Bytes the node's containers have spilled to local disk.",
             lambda r: r.point.spill_bytes)
    per_node("elastane_rm_node_host_cpu_cores", "CPU cores busy on the node's whole host (/proc/stat).",
             lambda r: r.report.cpu_cores)
    per_node("elastane_rm_node_host_cores", "CPU cores of the node's host.", lambda r: r.report.host_cores)
    per_node("elastane_rm_node_host_memory_bytes", "Memory in use on the node's whole host (MemTotal - MemAvailable).",
             lambda r: round(r.report.memory_mb * MB))
    per_node("elastane_rm_node_host_memory_total_bytes", "Memory of the node's host.",
             lambda r: round(r.report.memory_total_mb * MB))
    per_node("elastane_rm_node_network_receive_bytes_per_second",
             "Bytes per second the node's host receives (all interfaces but loopback).",
             lambda r: r.report.net_rx_bytes_per_s)
    per_node("elastane_rm_node_network_transmit_bytes_per_second",
             "Bytes per second the node's host sends (all interfaces but loopback).",
             lambda r: r.report.net_tx_bytes_per_s)
    per_node("elastane_rm_node_utilization_age_seconds", "Seconds since the node's last utilization report.",
             lambda r: round(max(0.0, core.clock() - r.t_ms / 1000), 3))

    containers = sorted(series.containers(), key=lambda nc: (nc[1].app_id, nc[1].container_id))

    def labels(node_id: str, c: ContainerUtilization) -> dict[str, str]:
        app = core.apps.get(c.app_id)
        return {"node": node_id, "app": c.app_id, "queue": app.queue if app else "", "role": c.role,
                "container": c.container_id}

    out.family("elastane_rm_container_cpu_cores", "gauge", "CPU cores a running container uses.",
               [(labels(n, c), c.cpu_cores) for n, c in containers])
    out.family("elastane_rm_container_memory_bytes", "gauge", "Memory a running container uses.",
               [(labels(n, c), round(c.memory_mb * MB)) for n, c in containers])
    out.family("elastane_rm_container_spill_bytes", "gauge", "Bytes a running container has spilled to disk.",
               [(labels(n, c), c.spill_bytes) for n, c in containers])

    apps = sorted(series.apps.items())

    def app_labels(app_id: str) -> dict[str, str]:
        app = core.apps.get(app_id)
        return {"app": app_id, "queue": app.queue if app else ""}

    out.family("elastane_rm_app_cpu_cores", "gauge", "CPU cores an application's running containers use.",
               [(app_labels(a), round(u.cpu_cores, 4)) for a, u in apps])
    out.family("elastane_rm_app_memory_bytes", "gauge", "Memory an application's running containers use.",
               [(app_labels(a), round(u.memory_mb * MB)) for a, u in apps])
    out.family("elastane_rm_app_spill_bytes", "gauge", "Bytes an application's containers have spilled to disk.",
               [(app_labels(a), u.spill_bytes) for a, u in apps])
    out.family("elastane_rm_app_containers_measured", "gauge", "An application's containers in the latest reports.",
               [(app_labels(a), u.containers) for a, u in apps])

    cluster_now = series.cluster.latest()
    last = cluster_now.node if cluster_now is not None else None
    cluster: tuple[tuple[str, str, Callable[[NodePoint], float]], ...] = (
            ("elastane_rm_cluster_cpu_cores", "CPU cores all containers use.",
             lambda p: p.cpu_cores),
            ("elastane_rm_cluster_memory_bytes", "Memory all containers use.", lambda p: round(p.memory_mb * MB)),
            ("elastane_rm_cluster_spill_bytes", "Bytes all containers have spilled to disk.", lambda p: p.spill_bytes),
            ("elastane_rm_cluster_network_receive_bytes_per_second",
             "Bytes per second the cluster's hosts receive (each host once).", lambda p: p.net_rx_bytes_per_s),
            ("elastane_rm_cluster_network_transmit_bytes_per_second",
             "Bytes per second the cluster's hosts send (each host once).", lambda p: p.net_tx_bytes_per_s))
    for name, help_, value in cluster:
        out.family(name, "gauge", help_, [({}, value(last))] if last is not None else [])
    return out.text()
