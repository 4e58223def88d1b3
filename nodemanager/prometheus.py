"""Prometheus text exposition of one NM (`/metrics/prometheus` on its web API): its capacity and
allocation, and the latest utilization sample of the host and of each running container."""
from __future__ import annotations

from typing import Optional

from protocol.internal_api import NodeUtilization
from protocol.prometheus_text import Exposition
from protocol.records import Resource

MB = 1024 * 1024


def render(node_id: str, capability: Resource, used: Resource, running: int,
           u: Optional[NodeUtilization], now: float) -> str:
    out = Exposition()
    node = {"node": node_id}
    out.family("elastane_nm_memory_bytes", "gauge", "Container memory of this node: capability and allocated.",
               [({**node, "kind": "total"}, capability.memory * MB), ({**node, "kind": "allocated"}, used.memory * MB)])
    out.family("elastane_nm_vcores", "gauge", "Virtual cores of this node: capability and allocated.",
               [({**node, "kind": "total"}, capability.vcores), ({**node, "kind": "allocated"}, used.vcores)])
    out.family("elastane_nm_containers_running", "gauge", "Containers running on this node.", [(node, running)])
    host = [] if u is None else [(node, u)]
    out.family("elastane_nm_host_cpu_cores", "gauge", "CPU cores busy on this host (/proc/stat).",
               [(n, x.cpu_cores) for n, x in host])
    out.family("elastane_nm_host_cores", "gauge", "CPU cores of this host.", [(n, x.host_cores) for n, x in host])
    out.family("elastane_nm_host_memory_bytes", "gauge", "Memory in use on this host (MemTotal - MemAvailable).",
               [(n, round(x.memory_mb * MB)) for n, x in host])
    out.family("elastane_nm_host_memory_total_bytes", "gauge", "Memory of this host.",
               [(n, round(x.memory_total_mb * MB)) for n, x in host])
    out.family("elastane_nm_network_receive_bytes_per_second", "gauge",
               "Bytes per second this host receives (all interfaces but loopback).",
               [(n, x.net_rx_bytes_per_s) for n, x in host])
    out.family("elastane_nm_network_transmit_bytes_per_second", "gauge",
               "Bytes per second this host sends (all interfaces but loopback).",
               [(n, x.net_tx_bytes_per_s) for n, x in host])
    out.family("elastane_nm_spill_bytes", "gauge", "Bytes this node's containers have spilled to local disk.",
               [(n, x.spill_bytes) for n, x in host])
    out.family("elastane_nm_sample_age_seconds", "gauge", "Seconds since the utilization sample shown here.",
               [(n, round(max(0.0, now - x.sampled_ms / 1000), 3)) for n, x in host])
    cs = sorted(u.containers or (), key=lambda c: c.container_id) if u is not None else []

    def labels(app: str, role: str, container: str) -> dict[str, str]:
        return {"node": node_id, "app": app, "role": role, "container": container}

    out.family("elastane_nm_container_cpu_cores", "gauge", "CPU cores a running container uses.",
               [(labels(c.app_id, c.role, c.container_id), c.cpu_cores) for c in cs])
    out.family("elastane_nm_container_memory_bytes", "gauge", "Memory a running container uses.",
               [(labels(c.app_id, c.role, c.container_id), round(c.memory_mb * MB)) for c in cs])
    out.family("elastane_nm_container_spill_bytes", "gauge", "Bytes a running container has spilled to disk.",
               [(labels(c.app_id, c.role, c.container_id), c.spill_bytes) for c in cs])
    return out.text()
