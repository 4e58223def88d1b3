"""The RM's bounded utilization time series: a ring per node and one for the cluster (pure).

Heartbeats carry each node's latest measurements (protocol NodeUtilization). Points are bucketed
by the RM's clock at `interval_ms`: a node heartbeating faster than that replaces its bucket's
point, so a ring holds one point per interval and its length bounds the memory (NODE_POINTS per
node, CLUSTER_POINTS for the cluster). The cluster's figures are running sums of every reporting
node's latest (updated in O(1) per heartbeat, plus O(containers) for the per-app sums), so a point
for the cluster costs no scan of the nodes.

Per node, `cpuCores` / `memoryMB` / `spillBytes` are what that NM's containers use (so they compare
with the node's vcores and memory), `hostCpuCores` / `hostMemoryMB` the whole machine's. Network
counters are the machine's; NMs sharing a host (a local cluster) report the same ones, so the
cluster counts each host's network and host figures once, from its latest report.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from protocol.internal_api import ContainerUtilization, NodeUtilization
from protocol.records import Resource

INTERVAL_MS = 1000
NODE_POINTS = 600        # 10 minutes a node at INTERVAL_MS
CLUSTER_POINTS = 3600    # 1 hour for the cluster


@dataclass(frozen=True)
class NodePoint:
    """One node's figures in one interval."""

    t_ms: int
    cpu_cores: float
    memory_mb: float
    net_rx_bytes_per_s: float
    net_tx_bytes_per_s: float
    spill_bytes: int
    host_cpu_cores: float
    host_memory_mb: float

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t_ms, "cpuCores": round(self.cpu_cores, 3), "memoryMB": round(self.memory_mb, 1),
                "netRxBytesPerSec": round(self.net_rx_bytes_per_s, 1),
                "netTxBytesPerSec": round(self.net_tx_bytes_per_s, 1), "spillBytes": self.spill_bytes,
                "hostCpuCores": round(self.host_cpu_cores, 3), "hostMemoryMB": round(self.host_memory_mb, 1)}


@dataclass(frozen=True)
class ClusterPoint:
    """The cluster's figures in one interval, with its schedulable capacity then."""

    node: NodePoint
    vcores_total: int
    memory_total_mb: int

    @property
    def t_ms(self) -> int:
        return self.node.t_ms

    def to_json(self) -> dict[str, Any]:
        out = self.node.to_json()
        out["vcoresTotal"] = self.vcores_total
        out["memoryTotalMB"] = self.memory_total_mb
        return out


class Ring:
    """The last `maxlen` points, oldest first; a point in the newest point's interval replaces it."""

    def __init__(self, maxlen: int, interval_ms: int):
        self.points: deque[Any] = deque(maxlen=maxlen)
        self.interval_ms = interval_ms

    def add(self, point: Any) -> None:
        pts = self.points
        if pts and pts[-1].t_ms // self.interval_ms >= point.t_ms // self.interval_ms:
            pts[-1] = point
        else:
            pts.append(point)

    def since(self, t_ms: Optional[int]) -> list[Any]:
        """Points newer than `t_ms` (all when None), oldest first."""
        if t_ms is None:
            return list(self.points)
        out = []
        for p in reversed(self.points):  # the newest are what a poller asks for
            if p.t_ms <= t_ms:
                break
            out.append(p)
        out.reverse()
        return out


@dataclass
class AppUse:
    """What an application's running containers use, summed over the nodes that reported them."""

    cpu_cores: float = 0.0
    memory_mb: float = 0.0
    spill_bytes: int = 0
    containers: int = 0

    def add(self, other: "AppUse", sign: int) -> None:
        self.cpu_cores += sign * other.cpu_cores
        self.memory_mb += sign * other.memory_mb
        self.spill_bytes += sign * other.spill_bytes
        self.containers += sign * other.containers

    def to_json(self) -> dict[str, Any]:
        return {"cpuCores": round(max(0.0, self.cpu_cores), 3), "memoryMB": round(max(0.0, self.memory_mb), 1),
                "spillBytes": self.spill_bytes, "containers": self.containers}


@dataclass
class _Sums:
    cpu: float = 0.0
    mem: float = 0.0
    spill: int = 0


@dataclass(frozen=True)
class _HostFigures:
    rx: float
    tx: float
    cpu: float
    mem: float


@dataclass(frozen=True)
class LatestReport:
    """A node's last report and when the RM received it."""

    t_ms: int
    host: str
    report: NodeUtilization
    point: NodePoint


class UtilizationSeries:
    """Rings of node and cluster points fed from heartbeats, the latest report per node, and the
    per-application sums of the latest reports."""

    def __init__(self, interval_ms: int = INTERVAL_MS, node_points: int = NODE_POINTS,
                 cluster_points: int = CLUSTER_POINTS):
        self.interval_ms = interval_ms
        self.node_points = node_points
        self.cluster = Ring(cluster_points, interval_ms)
        self.nodes: dict[str, Ring] = {}
        self.latest: dict[str, LatestReport] = {}
        self._sums = _Sums()
        self._hosts: dict[str, _HostFigures] = {}
        self._host_nodes: dict[str, set[str]] = {}
        self._host_sum = _HostFigures(0.0, 0.0, 0.0, 0.0)
        self._node_apps: dict[str, dict[str, AppUse]] = {}
        self.apps: dict[str, AppUse] = {}

    def report(self, node_id: str, host: str, now: float, u: NodeUtilization, capacity: Resource) -> None:
        """Take one heartbeat's measurements; `capacity` is the cluster's schedulable total now."""
        t_ms = int(now * 1000)
        cpu = mem = 0.0
        node_apps: dict[str, AppUse] = {}
        for c in u.containers:
            cpu += c.cpu_cores
            mem += c.memory_mb
            use = node_apps.get(c.app_id)
            if use is None:
                use = node_apps[c.app_id] = AppUse()
            use.add(AppUse(c.cpu_cores, c.memory_mb, c.spill_bytes, 1), 1)
        point = NodePoint(t_ms, cpu, mem, u.net_rx_bytes_per_s, u.net_tx_bytes_per_s, u.spill_bytes,
                          u.cpu_cores, u.memory_mb)
        self._drop_node_sums(node_id)
        self.latest[node_id] = LatestReport(t_ms, host, u, point)
        self._sums.cpu += cpu
        self._sums.mem += mem
        self._sums.spill += u.spill_bytes
        self._set_host(host, node_id, _HostFigures(u.net_rx_bytes_per_s, u.net_tx_bytes_per_s, u.cpu_cores,
                                                   u.memory_mb))
        self._node_apps[node_id] = node_apps
        for app_id, use in node_apps.items():
            total = self.apps.get(app_id)
            if total is None:
                total = self.apps[app_id] = AppUse()
            total.add(use, 1)
        ring = self.nodes.get(node_id)
        if ring is None:
            ring = self.nodes[node_id] = Ring(self.node_points, self.interval_ms)
        ring.add(point)
        self._add_cluster_point(t_ms, capacity)

    def forget_node(self, node_id: str, now: float, capacity: Resource) -> None:
        """A lost node's figures leave the cluster's sums (its ring stays readable)."""
        if node_id not in self.latest:
            return
        self._drop_node_sums(node_id)
        rep = self.latest.pop(node_id)
        nodes = self._host_nodes.get(rep.host)
        if nodes is not None:
            nodes.discard(node_id)
            if not nodes:
                del self._host_nodes[rep.host]
                self._shift_host(self._hosts.pop(rep.host), -1)
        self._add_cluster_point(int(now * 1000), capacity)

    def _drop_node_sums(self, node_id: str) -> None:
        old = self.latest.get(node_id)
        if old is not None:
            self._sums.cpu -= old.point.cpu_cores
            self._sums.mem -= old.point.memory_mb
            self._sums.spill -= old.point.spill_bytes
        for app_id, use in self._node_apps.pop(node_id, {}).items():
            total = self.apps.get(app_id)
            if total is not None:
                total.add(use, -1)
                if total.containers <= 0:
                    del self.apps[app_id]

    def _shift_host(self, h: _HostFigures, sign: int) -> None:
        s = self._host_sum
        self._host_sum = _HostFigures(s.rx + sign * h.rx, s.tx + sign * h.tx, s.cpu + sign * h.cpu,
                                      s.mem + sign * h.mem)

    def _set_host(self, host: str, node_id: str, figures: _HostFigures) -> None:
        old = self._hosts.get(host)
        if old is not None:
            self._shift_host(old, -1)
        self._hosts[host] = figures
        self._shift_host(figures, 1)
        self._host_nodes.setdefault(host, set()).add(node_id)

    def _add_cluster_point(self, t_ms: int, capacity: Resource) -> None:
        s, h = self._sums, self._host_sum
        self.cluster.add(ClusterPoint(NodePoint(t_ms, max(0.0, s.cpu), max(0.0, s.mem), max(0.0, h.rx),
                                                max(0.0, h.tx), max(0, s.spill), max(0.0, h.cpu),
                                                max(0.0, h.mem)),
                                      capacity.vcores, capacity.memory))

    # ----- reading ------------------------------------------------------------------------------
    def to_json(self, since_ms: Optional[int] = None, node_id: Optional[str] = None) -> dict[str, Any]:
        """The REST body of /ws/v1/cluster/utilization; `node_id` limits "nodes" to that node (empty
        when it has not reported yet)."""
        ids = [node_id] if node_id is not None else sorted(self.nodes)
        return {"utilization": {
            "intervalMs": self.interval_ms,
            "cluster": [p.to_json() for p in self.cluster.since(since_ms)],
            "nodes": {i: [p.to_json() for p in self.nodes[i].since(since_ms)] if i in self.nodes else []
                      for i in ids},
        }}

    def has_node(self, node_id: str) -> bool:
        return node_id in self.nodes

    def containers(self) -> Iterator[tuple[str, ContainerUtilization]]:
        """(node id, container figures) of every container in the nodes' latest reports."""
        for node_id, rep in self.latest.items():
            for c in rep.report.containers:
                yield node_id, c
