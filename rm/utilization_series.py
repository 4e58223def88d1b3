"""The RM's bounded utilization time series: a ring per node and one for the cluster (pure).

Heartbeats carry each node's latest measurements (protocol NodeUtilization). Points are bucketed
by the RM's clock at `interval_ms`: a node heartbeating faster than that replaces its bucket's
point, so a ring holds one point per interval and its length bounds the memory (NODE_POINTS per
node, CLUSTER_POINTS for the cluster). The cluster's figures are running sums of every reporting
node's latest (a heartbeat does O(1) work: the NM sends its containers' sums, and no per-app or
cluster-wide work happens); the cluster's point is written once per interval, and the
per-application sums are made when read from each node's last per-container list.

Per node, `cpuCores` / `memoryMB` / `spillBytes` are what that NM's containers use (so they compare
with the node's vcores and memory), `hostCpuCores` / `hostMemoryMB` the whole machine's. Network
counters are the machine's; NMs sharing a host (a local cluster) report the same ones, so the
cluster counts each host's network and host figures once, from its latest report.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, NamedTuple, Optional, TypeVar

from protocol.internal_api import ContainerUtilization, NodeUtilization
from protocol.records import Resource

INTERVAL_MS = 1000
NODE_POINTS = 600        # 10 minutes a node at INTERVAL_MS
CLUSTER_POINTS = 3600    # 1 hour for the cluster
P = TypeVar("P")


class NodePoint(NamedTuple):
    """One node's figures in one interval (a tuple: one is made per heartbeat)."""

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


class ClusterPoint(NamedTuple):
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


class Ring(Generic[P]):
    """The last `maxlen` points, oldest first; a point in the newest point's interval replaces it.

    A point is `width` numbers (time in epoch ms first) kept in one flat array of doubles that
    grows to `maxlen` points and then wraps: 8 bytes a number, no Python object per point (so
    600 points of 5000 nodes are 190 MB at most, and nothing for the garbage collector to scan);
    `make` turns a point back into its typed record when read."""

    def __init__(self, maxlen: int, interval_ms: int, width: int, make: Callable[[tuple[float, ...]], P]):
        self.data = array("d")
        self.maxlen = maxlen
        self.interval_ms = interval_ms
        self.width = width
        self.make = make
        self.count = 0
        self.start = 0          # the oldest point's slot once the ring is full

    def _offset(self, k: int) -> int:
        """Where the k-th oldest point starts in `data`."""
        return ((self.start + k) % self.maxlen) * self.width

    def add(self, values: tuple[float, ...]) -> None:
        w, data = self.width, self.data
        if self.count:
            last = self._offset(self.count - 1)
            if int(data[last]) // self.interval_ms >= int(values[0]) // self.interval_ms:
                data[last:last + w] = array("d", values)
                return
        if self.count < self.maxlen:
            data.extend(values)
            self.count += 1
        else:
            i = self.start * w
            data[i:i + w] = array("d", values)
            self.start = (self.start + 1) % self.maxlen

    def _point(self, k: int) -> P:
        i = self._offset(k)
        return self.make(tuple(self.data[i:i + self.width]))

    def since(self, t_ms: Optional[int]) -> list[P]:
        """Points newer than `t_ms` (all when None), oldest first."""
        first = 0
        if t_ms is not None:
            first = self.count
            while first > 0 and self.data[self._offset(first - 1)] > t_ms:  # the newest are asked for
                first -= 1
        return [self._point(k) for k in range(first, self.count)]

    def latest(self) -> Optional[P]:
        return self._point(self.count - 1) if self.count else None

    def __len__(self) -> int:
        return self.count


NODE_WIDTH = 8      # t, cpu, memory, rx, tx, spill, host cpu, host memory
CLUSTER_WIDTH = 10  # the node figures, then vcores and memory in total


def _node_point(v: tuple[float, ...]) -> NodePoint:
    return NodePoint(int(v[0]), v[1], v[2], v[3], v[4], int(v[5]), v[6], v[7])


def _cluster_point(v: tuple[float, ...]) -> ClusterPoint:
    return ClusterPoint(_node_point(v[:NODE_WIDTH]), int(v[8]), int(v[9]))


@dataclass
class AppUse:
    """What an application's running containers use, summed over the nodes that reported them."""

    cpu_cores: float = 0.0
    memory_mb: float = 0.0
    spill_bytes: int = 0
    containers: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"cpuCores": round(max(0.0, self.cpu_cores), 3), "memoryMB": round(max(0.0, self.memory_mb), 1),
                "spillBytes": self.spill_bytes, "containers": self.containers}


# Indexes into a node point's numbers (NodePoint's fields).
_T, _CPU, _MEM, _RX, _TX, _SPILL, _HOST_CPU, _HOST_MEM = range(NODE_WIDTH)


class LatestReport:
    """A node's last report, when the RM received it, and the last per-container list it sent
    (reports without one keep it): one record per node, updated in place."""

    __slots__ = ("t_ms", "host", "report", "values", "containers")

    def __init__(self, t_ms: int, host: str, report: NodeUtilization, values: tuple[float, ...]):
        self.t_ms = t_ms
        self.host = host
        self.report = report
        self.values = values
        self.containers: tuple[ContainerUtilization, ...] = report.containers or ()

    @property
    def point(self) -> NodePoint:
        return _node_point(self.values)


class _Sums:
    """Running sums of the reporting nodes' latest figures (containers per node, host per host)."""

    __slots__ = ("cpu", "mem", "spill", "rx", "tx", "host_cpu", "host_mem")

    def __init__(self) -> None:
        self.cpu = self.mem = self.rx = self.tx = self.host_cpu = self.host_mem = 0.0
        self.spill = 0

    def shift_node(self, v: tuple[float, ...], sign: int) -> None:
        self.cpu += sign * v[_CPU]
        self.mem += sign * v[_MEM]
        self.spill += sign * int(v[_SPILL])

    def shift_host(self, v: tuple[float, ...], sign: int) -> None:
        self.rx += sign * v[_RX]
        self.tx += sign * v[_TX]
        self.host_cpu += sign * v[_HOST_CPU]
        self.host_mem += sign * v[_HOST_MEM]


class UtilizationSeries:
    """Rings of node and cluster points fed from heartbeats, the latest report per node, and the
    per-application sums of the latest reports.

    A heartbeat allocates nothing that outlives it but plain tuples of numbers (which the garbage
    collector stops tracking) and the report itself (untracked Structs): objects that live until
    the node's next heartbeat would otherwise reach the collector's old generations and make its
    full collections more frequent, a cost far above the report's own."""

    def __init__(self, interval_ms: int = INTERVAL_MS, node_points: int = NODE_POINTS,
                 cluster_points: int = CLUSTER_POINTS):
        self.interval_ms = interval_ms
        self.node_points = node_points
        self._cluster: Ring[ClusterPoint] = Ring(cluster_points, interval_ms, CLUSTER_WIDTH, _cluster_point)
        self._pending_t: Optional[int] = None            # the cluster point not yet written: its time
        self._pending_capacity = Resource(0, 0)          # and the capacity then
        self.nodes: dict[str, Ring[NodePoint]] = {}
        self.latest: dict[str, LatestReport] = {}
        self._sums = _Sums()
        self._hosts: dict[str, tuple[float, ...]] = {}   # host -> the point whose host figures count
        self._host_nodes: dict[str, set[str]] = {}
        self._apps: Optional[dict[str, AppUse]] = None   # per-app sums, made when read

    def report(self, node_id: str, host: str, now: float, u: NodeUtilization, capacity: Resource) -> None:
        """Take one heartbeat's measurements; `capacity` is the cluster's schedulable total now."""
        t_ms = int(now * 1000)
        self._close_interval(t_ms)
        values = (t_ms, u.containers_cpu_cores, u.containers_memory_mb, u.net_rx_bytes_per_s, u.net_tx_bytes_per_s, u.spill_bytes, u.cpu_cores,
                  u.memory_mb)
        sums = self._sums
        latest = self.latest.get(node_id)
        if latest is None:
            self.latest[node_id] = LatestReport(t_ms, host, u, values)
        else:
            sums.shift_node(latest.values, -1)
            latest.t_ms, latest.host, latest.report, latest.values = t_ms, host, u, values
            if u.containers is not None:
                latest.containers = u.containers
        sums.shift_node(values, 1)
        old_host = self._hosts.get(host)
        if old_host is not None:
            sums.shift_host(old_host, -1)
        else:
            self._host_nodes[host] = set()
        self._hosts[host] = values
        sums.shift_host(values, 1)
        self._host_nodes[host].add(node_id)
        self._apps = None
        ring = self.nodes.get(node_id)
        if ring is None:
            ring = self.nodes[node_id] = Ring(self.node_points, self.interval_ms, NODE_WIDTH, _node_point)
        ring.add(values)
        self._pending_t, self._pending_capacity = t_ms, capacity

    def forget_node(self, node_id: str, now: float, capacity: Resource) -> None:
        """A lost or decommissioned node's figures leave the cluster's sums (its ring stays readable)."""
        rep = self.latest.get(node_id)
        if rep is None:
            return
        t_ms = int(now * 1000)
        self._close_interval(t_ms)
        self._sums.shift_node(rep.values, -1)
        del self.latest[node_id]
        self._apps = None
        nodes = self._host_nodes.get(rep.host)
        if nodes is not None:
            nodes.discard(node_id)
            if not nodes:
                del self._host_nodes[rep.host]
                self._sums.shift_host(self._hosts.pop(rep.host), -1)
        self._pending_t, self._pending_capacity = t_ms, capacity

    def _close_interval(self, t_ms: int) -> None:
        """Before a change in a later interval: write the pending cluster point, the sums as they
        stood at the end of its interval. Within one interval nothing is written (a heartbeat costs
        no cluster point; a reader flushes)."""
        t = self._pending_t
        if t is not None and t // self.interval_ms != t_ms // self.interval_ms:
            self._flush()

    def _flush(self) -> None:
        t_ms = self._pending_t
        if t_ms is None:
            return
        self._pending_t = None
        s, capacity = self._sums, self._pending_capacity
        self._cluster.add((t_ms, max(0.0, s.cpu), max(0.0, s.mem), max(0.0, s.rx), max(0.0, s.tx),
                           max(0, s.spill), max(0.0, s.host_cpu), max(0.0, s.host_mem), capacity.vcores,
                           capacity.memory))

    @property
    def cluster(self) -> Ring[ClusterPoint]:
        """The cluster's ring, its current interval's point included."""
        self._flush()
        return self._cluster

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

    @property
    def apps(self) -> dict[str, AppUse]:
        """What each application's containers use in the nodes' latest reports. Summed when read
        (once per request: no heartbeat runs during one), so a heartbeat does no per-app work."""
        if self._apps is None:
            apps: dict[str, AppUse] = {}
            for rep in self.latest.values():
                for c in rep.containers:
                    use = apps.get(c.app_id)
                    if use is None:
                        use = apps[c.app_id] = AppUse()
                    use.cpu_cores += c.cpu_cores
                    use.memory_mb += c.memory_mb
                    use.spill_bytes += c.spill_bytes
                    use.containers += 1
            self._apps = apps
        return self._apps

    def has_node(self, node_id: str) -> bool:
        return node_id in self.nodes

    def containers(self) -> Iterator[tuple[str, ContainerUtilization]]:
        """(node id, container figures) of every container in the nodes' latest reports."""
        for node_id, rep in self.latest.items():
            for c in rep.containers:
                yield node_id, c
