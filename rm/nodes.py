"""Node tracker: NM registration, heartbeats and liveness (pure; the clock is injected).

Liveness is kept in an insertion-ordered dict refreshed on every heartbeat, so finding expired
nodes looks only at the oldest entries: a heartbeat is O(1) here, not a scan of the cluster.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Optional

from protocol.records import ZERO, NodeState, Resource

from .model import Node


class NodeTracker:
    """All NMs the RM has heard of, their states, and the cluster's schedulable total."""

    def __init__(self, expiry_s: float):
        self.expiry_s = expiry_s
        self.nodes: dict[str, Node] = {}
        self._by_host: dict[str, set[str]] = {}
        self._live: OrderedDict[str, float] = OrderedDict()   # node_id -> last heartbeat, oldest first
        self._running_total: Resource = ZERO                   # capability of RUNNING nodes
        self.draining: dict[str, None] = {}                     # ids of DECOMMISSIONING nodes
        self.unhealthy: dict[str, None] = {}                    # ids of UNHEALTHY nodes
        self.running: dict[str, None] = {}                      # ids of RUNNING (schedulable) nodes
        # Apps a heartbeat response told a node to clean up, kept until the NM's response_id shows
        # it got that response (rm/nm_protocol.py asks again if not): node id -> app id -> the
        # response's id. Response ids restart with a registration, and so does this.
        self.apps_cleanup_sent: dict[str, dict[str, int]] = {}
        # DECOMMISSIONING nodes that went LOST, with their deadlines, until the core takes them
        # (`ResourceManagerCore._node_lost` keeps them to decommission again when they register).
        self.lost_draining: dict[str, Optional[float]] = {}

    @property
    def total(self) -> Resource:
        """The cluster's resource: RUNNING nodes' capability, and what the nodes that take nothing
        new but still run their containers use -- DECOMMISSIONING ones (YARN sets a draining node's
        total to its used resources) and UNHEALTHY ones (docs/operating.md: their containers go
        on) -- so the queues' shares of the containers that run on there stay within the total: a
        total without them made a queue's running containers look like more than the cluster,
        and the queue reclaim killed some of them with no other queue waiting."""
        total = self._running_total
        for node_id in self.held():
            total = total + self.nodes[node_id].used
        return total

    def held(self) -> list[str]:
        """The ids of the nodes that run containers but take no new ones (draining, unhealthy)."""
        return [*self.draining, *self.unhealthy]

    def get(self, node_id: str) -> Optional[Node]:
        return self.nodes.get(node_id)

    def lookup(self, name: str) -> list[Node]:
        """Nodes named by id ("host:port") or by host name."""
        n = self.nodes.get(name)
        if n is not None:
            return [n]
        return [self.nodes[i] for i in self._by_host.get(name, ())]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def schedulable(self) -> list[Node]:
        return [self.nodes[i] for i in self.running]

    def register(self, node_id: str, http_address: str, capability: Resource, rack: str,
                 version: str, now: float, labels: frozenset[str] = frozenset()) -> Node:
        """(Re-)register a node as RUNNING with a fresh capability and labels (a DECOMMISSIONING
        one stays so: its NM restarted while it drained). Returns the node record; an existing
        record keeps its containers so the core can reconcile them."""
        n = self.nodes.get(node_id)
        if n is not None and n.state == NodeState.RUNNING:
            self._running_total = self._running_total - n.capability
        self.unhealthy.pop(node_id, None)
        draining = n is not None and n.state == NodeState.DECOMMISSIONING
        if n is None:
            n = Node(node_id, http_address, rack, capability, NodeState.RUNNING, now)
            self.nodes[node_id] = n
            self._by_host.setdefault(n.host, set()).add(node_id)
        else:
            n.http_address, n.rack, n.capability = http_address, rack, capability
            n.state = NodeState.RUNNING
        n.version = version
        n.labels = labels
        n.last_heartbeat = now
        n.last_health_update = now
        n.health_report = ""
        n.response_id = 0
        self.apps_cleanup_sent.pop(node_id, None)
        if draining:
            n.state = NodeState.DECOMMISSIONING
        else:
            self._running_total = self._running_total + capability
            self.running[node_id] = None
        self._live[node_id] = now
        self._live.move_to_end(node_id)
        return n

    def heartbeat(self, n: Node, healthy: bool, report: str, now: float) -> None:
        """Record a heartbeat from a known, non-LOST node; health flips RUNNING <-> UNHEALTHY."""
        n.last_heartbeat = now
        self._live[n.node_id] = now
        self._live.move_to_end(n.node_id)
        if report != n.health_report or (healthy != (n.state == NodeState.RUNNING)):
            n.last_health_update = now
        n.health_report = report
        if n.state == NodeState.DECOMMISSIONING:
            return          # it drains whatever its health
        if healthy and n.state == NodeState.UNHEALTHY:
            n.state = NodeState.RUNNING
            self._running_total = self._running_total + n.capability
            self.running[n.node_id] = None
            self.unhealthy.pop(n.node_id, None)
        elif not healthy and n.state == NodeState.RUNNING:
            n.state = NodeState.UNHEALTHY
            self._running_total = self._running_total - n.capability
            self.running.pop(n.node_id, None)
            self.unhealthy[n.node_id] = None

    def expired(self, now: float) -> list[Node]:
        """Mark nodes silent for longer than expiry_s LOST and return them."""
        out = []
        deadline = now - self.expiry_s
        while self._live:
            node_id, last = next(iter(self._live.items()))
            if last >= deadline:
                break
            self._live.popitem(last=False)
            out.append(self.mark_lost(self.nodes[node_id]))
        return out

    def mark_lost(self, n: Node) -> Node:
        if n.state == NodeState.RUNNING:
            self._running_total = self._running_total - n.capability
        self.running.pop(n.node_id, None)
        if n.node_id in self.draining:
            # Its decommission outlives the loss: it drains on once its NM registers again.
            del self.draining[n.node_id]
            self.lost_draining[n.node_id] = n.decommission_deadline
        self.unhealthy.pop(n.node_id, None)
        n.state = NodeState.LOST
        self._live.pop(n.node_id, None)
        n.to_cleanup.clear()
        n.apps_to_cleanup.clear()
        self.apps_cleanup_sent.pop(n.node_id, None)
        return n

    def decommission(self, n: Node, deadline: Optional[float]) -> None:
        """RUNNING or UNHEALTHY -> DECOMMISSIONING: nothing new is placed on it (graceful
        decommission, YARN's; the core ends it)."""
        if n.state == NodeState.RUNNING:
            self._running_total = self._running_total - n.capability
        self.running.pop(n.node_id, None)
        self.unhealthy.pop(n.node_id, None)
        self.draining[n.node_id] = None
        n.state = NodeState.DECOMMISSIONING
        n.decommission_deadline = deadline

    def recommission(self, n: Node) -> None:
        """DECOMMISSIONING -> RUNNING (its next heartbeat says whether it is healthy)."""
        n.state = NodeState.RUNNING
        n.decommission_deadline = None
        self.draining.pop(n.node_id, None)
        self._running_total = self._running_total + n.capability
        self.running[n.node_id] = None

    def decommissioned(self, n: Node) -> None:
        """DECOMMISSIONING -> DECOMMISSIONED: drained; its NM is told to stop, so it is no longer
        expected to heartbeat (not LOST when it goes quiet)."""
        n.state = NodeState.DECOMMISSIONED
        n.decommission_deadline = None
        self.draining.pop(n.node_id, None)
        self._live.pop(n.node_id, None)
        self.apps_cleanup_sent.pop(n.node_id, None)

    def restore_decommissioned(self, node_id: str, http_address: str, rack: str, capability: Resource,
                               now: float) -> Node:
        """A DECOMMISSIONED node a recovered store names (not live, not schedulable)."""
        n = Node(node_id, http_address, rack, capability, NodeState.DECOMMISSIONED, now)
        self.nodes[node_id] = n
        self._by_host.setdefault(n.host, set()).add(node_id)
        return n

    def forget(self, n: Node) -> None:
        """Drop a DECOMMISSIONED node's record: its NM may register again, as a new node."""
        self.nodes.pop(n.node_id, None)
        self.apps_cleanup_sent.pop(n.node_id, None)
        ids = self._by_host.get(n.host)
        if ids is not None:
            ids.discard(n.node_id)
            if not ids:
                del self._by_host[n.host]

    def counts(self) -> dict[NodeState, int]:
        out: dict[NodeState, int] = {}
        for n in self.nodes.values():
            out[n.state] = out.get(n.state, 0) + 1
        return out
