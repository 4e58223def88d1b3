"""The NM side of the RM core: node register / heartbeat, lost nodes and the liveness timers.

A mixin of ResourceManagerCore (rm/core.py), which owns the state these methods read and change;
pure like the rest of the core. The heartbeat path does work in proportion to what changed.
"""
from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Optional

from protocol import internal_api as api
from protocol import node_labels
from protocol.config import RMConfig
from protocol.ids import ApplicationId
from protocol.json_types import JsonObject
from protocol.records import AttemptState, ContainerState, ExitStatus, NodeState, Resource
from protocol.remote_exception import BadRequest, NotFound, Unauthorized

from .log_aggregation_status import LogAggregationBook
from .model import App, Attempt, Container, Node
from .nodes import NodeTracker
from .scheduler import CapacityScheduler
from .state_machines import NOT_COUNTED, AttemptEvent, attempt_is_final
from .utilization_series import UtilizationSeries

log = logging.getLogger(__name__)

# A node's capability at most (1 PiB, 2^20 vcores): far above any host, low enough that the sums
# the RM serves over every node (cluster metrics, the scheduler's queues) stay inside 64 bits.
MAX_NODE_MEMORY_MB = 2 ** 30
MAX_NODE_VCORES = 2 ** 20


def decommissioned_message(node_id: str) -> str:
    return (f"node {node_id} was decommissioned: recommission it (elastane node recommission {node_id}) "
            f"before its NodeManager registers again")


class NmProtocol:
    """NodeManager protocol (YARN's ResourceTrackerService) and the expiry timers."""

    cfg: RMConfig
    nodes: NodeTracker
    scheduler: CapacityScheduler
    apps: dict[str, App]
    attempts: dict[str, Attempt]
    containers: dict[str, Container]
    clock: Callable[[], float]
    counters: dict[str, int]
    policy_version: int
    cluster_ts: int
    launch_expiry_s: float
    utilization: UtilizationSeries
    log_aggregation: LogAggregationBook
    _am_live: OrderedDict[str, float]
    _unlaunched: OrderedDict[str, float]
    _am_node_wait: dict[str, float]
    # Decommissions to store (the server writes them at its next flush), and those a recovery
    # restored for nodes that have not registered again yet: node id -> a placeholder record (its
    # address, capability and deadline as stored).
    decommissions_dirty: bool
    restored_draining: dict[str, Node]

    if TYPE_CHECKING:  # implemented by ResourceManagerCore (rm/core.py)
        def _container_completed(self, c: Container, status: api.ContainerStatus,
                                 cleanup_on_node: bool = False) -> None: ...
        def _mark_launched(self, c: Container) -> None: ...
        def _schedule(self, candidates: list[Node]) -> None: ...
        def _end_attempt(self, at: Attempt, ev: AttemptEvent, diagnostics: str,
                         keep: bool = False) -> list[Container]: ...
        def _attempt_failed(self, at: Attempt, diagnostics: str, counts: bool = True) -> None: ...
        def adopt_container(self, node: Node, s: api.ContainerStatus) -> None: ...
        def am_missing_after_resync(self, node: Node, reported: dict[str, api.ContainerStatus]) -> None: ...
        def _forget_completed(self) -> None: ...
        def expire_lifetimes(self) -> list[str]: ...

    def register_node(self, claims: JsonObject, req: api.NodeRegisterRequest) -> api.NodeRegisterResponse:
        if claims.get("node_id") != req.node_id:
            raise Unauthorized(f"nm token is for node {claims.get('node_id')!r}, not {req.node_id!r}")
        cap = req.capability
        if not (0 < cap.memory <= MAX_NODE_MEMORY_MB and 0 < cap.vcores <= MAX_NODE_VCORES):
            raise BadRequest(f"capability must be within memory 1..{MAX_NODE_MEMORY_MB} MB and vCores "
                             f"1..{MAX_NODE_VCORES}, got memory={cap.memory} vCores={cap.vcores}")
        for app_id in req.applications:
            try:
                ApplicationId.parse(app_id)
            except ValueError as e:
                raise BadRequest(f"applications: {e}") from None
        strange = node_labels.unknown(req.node_labels, self.cfg.node_labels)
        if strange:
            # YARN's answer to a node it will not take: SHUTDOWN with the reason, nothing recorded
            # (the NM stops and logs it, rather than retrying a registration that cannot succeed).
            return api.NodeRegisterResponse(
                node_id=req.node_id, heartbeat_interval_ms=self.cfg.nm_heartbeat_interval_ms,
                rm_start_ms=self.cluster_ts, action="SHUTDOWN",
                diagnostics=f"node {req.node_id} reports node labels {strange} the cluster does not know "
                            f"(rm.toml node_labels: {sorted(self.cfg.node_labels)})")
        known = self.nodes.get(req.node_id)
        if known is not None and known.state == NodeState.DECOMMISSIONED:
            return api.NodeRegisterResponse(
                node_id=req.node_id, heartbeat_interval_ms=self.cfg.nm_heartbeat_interval_ms,
                rm_start_ms=self.cluster_ts, action="SHUTDOWN", diagnostics=decommissioned_message(req.node_id))
        now = self.clock()
        self.policy_version += 1        # a node (re)joins: capacity, state
        node = self.nodes.register(req.node_id, req.http_address, req.capability, req.rack, req.version, now,
                                   frozenset(req.node_labels))
        if req.node_id in self.restored_draining:     # decommissioning when the RM restarted
            self.nodes.decommission(node, self.restored_draining.pop(req.node_id).decommission_deadline)
        reported = {s.container_id: s for s in req.containers}
        # Containers we think run there but the NM does not report: gone with the NM restart.
        for c in self._am_containers_last(node):
            if c.container_id not in self.containers:
                continue    # released meanwhile: its AM's attempt ended with an earlier one
            s = reported.get(c.container_id)
            if s is None or s.state == ContainerState.COMPLETE.value:
                self._container_completed(c, s or api.ContainerStatus(
                    container_id=c.container_id, state="COMPLETE", exit_status=ExitStatus.ABORTED,
                    diagnostics="Container lost when its NodeManager re-registered"))
            else:
                self._mark_launched(c)
        # Containers released earlier: free those the restarted NM no longer runs; ask again for
        # the rest (response ids restart with the registration, so earlier requests do not count).
        for cid, pr in list(node.releasing.items()):
            s = reported.get(cid)
            if s is None or s.state == ContainerState.COMPLETE.value:
                node.finish_release(cid)
            else:
                pr.sent_in = 0
        for cid, s in reported.items():
            if cid in self.containers:
                continue
            if cid in node.releasing:
                if s.state != ContainerState.COMPLETE.value:
                    node.to_cleanup.append(cid)
            else:
                # Unknown here: an earlier RM's container of a kept attempt is re-adopted, any
                # other is cleaned up (rm/core.py).
                self.adopt_container(node, s)
        self.am_missing_after_resync(node, reported)
        self._apps_held(node, req.applications)
        self._log_aggregation_reports(node, req.log_aggregation)
        if self.scheduler.has_demand:
            self._schedule([node])
        return api.NodeRegisterResponse(node_id=req.node_id, heartbeat_interval_ms=self.cfg.nm_heartbeat_interval_ms,
                                        rm_start_ms=self.cluster_ts)

    def node_heartbeat(self, claims: JsonObject, req: api.NodeHeartbeatRequest) -> api.NodeHeartbeatResponse:
        if claims.get("node_id") != req.node_id:
            raise Unauthorized(f"nm token is for node {claims.get('node_id')!r}, not {req.node_id!r}")
        node = self.nodes.get(req.node_id)
        interval = self.cfg.nm_heartbeat_interval_ms
        if node is None or node.state == NodeState.LOST:
            return api.NodeHeartbeatResponse(response_id=0, action="RESYNC", heartbeat_interval_ms=interval,
                                             diagnostics=f"node {req.node_id} is not registered with this RM")
        if node.state == NodeState.DECOMMISSIONED:
            return api.NodeHeartbeatResponse(response_id=node.response_id, action="SHUTDOWN",
                                             heartbeat_interval_ms=interval,
                                             diagnostics=decommissioned_message(node.node_id))
        self.counters["nm_heartbeats"] += 1
        now = self.clock()
        before = (node.state, node.used)
        self.nodes.heartbeat(node, req.health.healthy, req.health.report, now)
        if req.utilization is not None:
            self.utilization.report(node.node_id, node.host, now, req.utilization, self.nodes.total)
        cleanup_sent = self.nodes.apps_cleanup_sent.get(node.node_id)
        if cleanup_sent:
            self._apps_cleanup_unheard(node, cleanup_sent, req.response_id)
        containers = self.containers
        releasing = node.releasing
        for s in req.container_statuses:
            c = containers.get(s.container_id)
            if c is None or c.node_id != node.node_id:
                pr = releasing.get(s.container_id)
                if pr is None:
                    if s.state != ContainerState.COMPLETE.value:
                        node.to_cleanup.append(s.container_id)
                elif s.state == ContainerState.COMPLETE.value:
                    node.finish_release(s.container_id)
                elif pr.sent_in and req.response_id < pr.sent_in:
                    # The NM never got the response that asked for the cleanup: ask again.
                    node.to_cleanup.append(s.container_id)
            elif s.state == ContainerState.COMPLETE.value:
                self._container_completed(c, s)
            elif not c.launched:
                self._mark_launched(c)
        if releasing:
            self._confirm_absent(node, req)
        if req.log_aggregation:
            self._log_aggregation_reports(node, req.log_aggregation)
        drained = node.state == NodeState.DECOMMISSIONING and self._drain(node, now)
        if (node.state, node.used) != before:
            # Health flipped, or released containers were confirmed gone (before scheduling: a gang
            # that waits for room is checked again only when this number moves).
            self.policy_version += 1
        if self.scheduler.has_demand and node.schedulable:
            self._schedule([node])
        node.response_id += 1
        for cid in node.to_cleanup:
            pr = releasing.get(cid)
            if pr is not None:
                pr.sent_in = node.response_id
        resp = api.NodeHeartbeatResponse(response_id=node.response_id, heartbeat_interval_ms=interval,
                                          containers_to_cleanup=node.to_cleanup,
                                          apps_to_cleanup=node.apps_to_cleanup)
        if drained:
            resp.action, resp.diagnostics = "SHUTDOWN", decommissioned_message(node.node_id)
        elif node.apps_to_cleanup:
            # Sent again until the NM's response_id shows it got this response: a lost one would
            # leave the apps' work dirs, localized files and final log uploads on the node for good.
            sent = self.nodes.apps_cleanup_sent.setdefault(node.node_id, {})
            for app_id in node.apps_to_cleanup:
                sent[app_id] = node.response_id
        node.to_cleanup, node.apps_to_cleanup = [], []
        return resp

    def _apps_cleanup_unheard(self, node: Node, sent: dict[str, int], response_id: int) -> None:
        """Forget the apps to clean up that a response the NM got (its `response_id` is that
        response's id or later) carried; put back in `apps_to_cleanup` those it did not get."""
        for app_id, sent_in in list(sent.items()):
            if response_id >= sent_in:
                del sent[app_id]
            elif app_id not in node.apps_to_cleanup:
                node.apps_to_cleanup.append(app_id)
        if not sent:
            del self.nodes.apps_cleanup_sent[node.node_id]

    # ----- graceful decommission (YARN's) -----------------------------------------------------
    def decommission_node(self, node_id: str, timeout_s: Optional[float]) -> Node:
        """An operator takes the node out: DECOMMISSIONING at once (nothing new is placed on it),
        DECOMMISSIONED once its containers have ended -- killed after `timeout_s` (None: waits for
        them) -- and then its NM is told to stop. NotFound / BadRequest for a node that cannot be."""
        n = self._node_for_admin(node_id)
        if timeout_s is not None and not 0 <= timeout_s < math.inf:
            raise BadRequest(f"decommissionTimeout must be a number of seconds >= 0 (or -1: wait), got {timeout_s}")
        if n.state not in (NodeState.RUNNING, NodeState.UNHEALTHY, NodeState.DECOMMISSIONING):
            raise BadRequest(f"node {node_id} is {n.state.value}: only a RUNNING or UNHEALTHY node can be decommissioned")
        now = self.clock()
        self.nodes.decommission(n, None if timeout_s is None else now + timeout_s)
        self.policy_version += 1
        self.decommissions_dirty = True
        log.info("node %s DECOMMISSIONING (%s)", node_id,
                 "waiting for its containers" if timeout_s is None else f"its containers killed after {timeout_s:g} s")
        self._drain(n, now)
        return n

    def recommission_node(self, node_id: str) -> Node:
        """Undo a decommission: a DECOMMISSIONING node is RUNNING again; a DECOMMISSIONED one is
        forgotten, so its NM may register again."""
        known = self.nodes.get(node_id)
        if node_id in self.restored_draining and (known is None or known.state == NodeState.LOST):
            # Restored by a recovery, or LOST while it drained: not registered again yet.
            n = self.restored_draining.pop(node_id)
            self.decommissions_dirty = True
            if known is not None:
                return known
            n.state, n.decommission_deadline = NodeState.NEW, None
            return n
        n = self._node_for_admin(node_id)
        if n.state == NodeState.DECOMMISSIONING:
            self.nodes.recommission(n)
        elif n.state == NodeState.DECOMMISSIONED:
            self.nodes.forget(n)
            n.state = NodeState.SHUTDOWN        # what the returned record says: stopped, and gone from the list
        else:
            raise BadRequest(f"node {node_id} is {n.state.value}: only a DECOMMISSIONING or DECOMMISSIONED node "
                             f"can be recommissioned")
        self.policy_version += 1
        self.decommissions_dirty = True
        log.info("node %s recommissioned", node_id)
        return n

    def decommissions(self) -> list[tuple[Node, Optional[float]]]:
        """What to store of the decommissions: the DECOMMISSIONING and DECOMMISSIONED nodes (with
        their deadlines), and the restored ones not registered again yet (as node records)."""
        out = [(n, n.decommission_deadline) for n in self.nodes
               if n.state in (NodeState.DECOMMISSIONING, NodeState.DECOMMISSIONED)]
        # Their placeholders keep what the recovered record said of them (address, rack,
        # capability), so a later save does not lose it.
        out.extend((n, n.decommission_deadline) for n in self.restored_draining.values())
        return out

    def restore_decommission(self, node_id: str, state: NodeState, deadline: Optional[float], http_address: str,
                             rack: str, capability: Resource) -> None:
        """After a recovery: a DECOMMISSIONED node is listed as such (its NM, if it comes back,
        is told SHUTDOWN); a DECOMMISSIONING one is decommissioned again when it registers."""
        if state == NodeState.DECOMMISSIONED:
            self.nodes.restore_decommissioned(node_id, http_address, rack, capability, self.clock())
        elif state == NodeState.DECOMMISSIONING:
            self.restored_draining[node_id] = Node(node_id, http_address, rack, capability, NodeState.DECOMMISSIONING,
                                                   self.clock(), decommission_deadline=deadline)

    def _node_for_admin(self, node_id: str) -> Node:
        n = self.nodes.get(node_id)
        if n is None:
            raise NotFound(f"nodeId, {node_id}, is not found")
        return n

    def _drain(self, node: Node, now: float) -> bool:
        """A DECOMMISSIONING node: past its deadline its containers are killed (their AMs hear
        ABORTED, which counts against no attempt); once none is left, not even one being cleaned
        up, it is DECOMMISSIONED (True)."""
        if node.decommission_deadline is not None and now >= node.decommission_deadline:
            for c in self._am_containers_last(node):
                if c.container_id not in self.containers:
                    continue    # released when an AM container before it ended its attempt
                self._container_completed(c, api.ContainerStatus(
                    container_id=c.container_id, state=ContainerState.COMPLETE.value, exit_status=ExitStatus.ABORTED,
                    diagnostics=f"Container killed: its node {node.node_id} was decommissioned"), cleanup_on_node=True)
        if node.containers or node.releasing:
            return False
        self.nodes.decommissioned(node)
        # It reports no more: its last figures leave the cluster's utilization, as a lost node's do.
        self.utilization.forget_node(node.node_id, self.clock(), self.nodes.total)
        self.policy_version += 1
        self.decommissions_dirty = True
        log.info("node %s DECOMMISSIONED: its NodeManager is told to stop", node.node_id)
        return True

    def _apps_held(self, node: Node, app_ids: list[str]) -> None:
        """A (re)registering node's apps that are over, or unknown here, go in its next heartbeat's
        apps_to_cleanup (YARN's handleRunningAppOnNode): a node that was down or LOST when they
        ended was never told, and would keep their logs (never aggregated) for ever. The node is
        among those of the apps still running, so it hears when they end (a restarted NM may
        come back under another node id)."""
        for app_id in app_ids:
            app = self.apps.get(app_id)
            if app is not None and not app.state.is_final:
                app.nodes_used.add(node.node_id)
            elif app_id not in node.apps_to_cleanup:
                node.apps_to_cleanup.append(app_id)

    def _log_aggregation_reports(self, node: Node, reports: list[api.LogAggregationReport]) -> None:
        for r in reports:
            if r.app_id in self.apps:       # an app the RM has forgotten has no view to show it in
                self.log_aggregation.report(node.node_id, r)

    @staticmethod
    def _confirm_absent(node: Node, req: api.NodeHeartbeatRequest) -> None:
        """Free released containers the NM does not report although it has seen their cleanup
        request: it never launched them (or finished and reported them before), so holds nothing."""
        reported = {s.container_id for s in req.container_statuses}
        for cid, pr in list(node.releasing.items()):
            if pr.sent_in and req.response_id >= pr.sent_in and cid not in reported:
                node.finish_release(cid)

    def _am_containers_last(self, node: Node) -> list[Container]:
        """The node's containers, executors before AMs: ending an AM container ends its attempt,
        which releases the attempt's other containers, so those are completed first (their AM
        hears of each once) and a container already released is skipped, not looked up."""
        held = [self.containers[cid] for cid in node.containers]
        return sorted(held, key=lambda c: c.is_am)

    def _node_lost(self, node: Node) -> None:
        """Complete every container the node held with ABORTED (-100), tell their AMs, and fail
        the attempts whose AM ran there (not counted: the host went, not the AM)."""
        node.drop_releases()
        if node.node_id in self.nodes.lost_draining:
            # Lost while it drained: its decommission stays stored, and it is DECOMMISSIONING again
            # (with its deadline) when its NM registers again (`register_node`).
            deadline = self.nodes.lost_draining.pop(node.node_id)
            self.restored_draining[node.node_id] = Node(node.node_id, node.http_address, node.rack, node.capability,
                                                        NodeState.DECOMMISSIONING, node.last_heartbeat,
                                                        decommission_deadline=deadline)
            self.decommissions_dirty = True
        self.utilization.forget_node(node.node_id, self.clock(), self.nodes.total)
        report = api.NodeReport(node_id=node.node_id, state=NodeState.LOST.value, http_address=node.http_address)
        told: set[str] = set()
        for c in self._am_containers_last(node):
            if c.container_id not in self.containers:
                continue    # released when an AM container before it ended its attempt
            if c.attempt_id not in told:
                told.add(c.attempt_id)
                at = self.attempts.get(c.attempt_id)
                if at is not None:
                    at.updated_nodes.append(report)
            self._container_completed(c, api.ContainerStatus(
                container_id=c.container_id, state=ContainerState.COMPLETE.value, exit_status=ExitStatus.ABORTED,
                diagnostics=f"Container released on a *lost* node {node.node_id}"))

    def tick(self) -> None:
        """Expire silent nodes, silent AMs and containers allocated but never launched; forget the
        completed apps past the limit whose wait is over; kill the apps whose lifetime is up."""
        now = self.clock()
        self._forget_completed()
        self.expire_lifetimes()
        for node in self.nodes.expired(now):    # all are LOST before the first is processed
            self.policy_version += 1
            self._node_lost(node)
        if self._am_node_wait:
            self._settle_am_node_waits(now)
        deadline = now - self.cfg.am_expiry_s
        while self._am_live:
            aid, last = next(iter(self._am_live.items()))
            if last >= deadline:
                break
            self._am_live.popitem(last=False)
            at = self.attempts[aid]
            if at.state == AttemptState.FINISHING:
                # Unregistered but the AM container never exited: finish it and clean it up.
                self._end_attempt(at, AttemptEvent.CONTAINER_FINISHED, "")
            elif at.awaiting_resync:
                # Kept across an RM restart or failover, but its AM never registered again.
                self._attempt_failed(at, f"ApplicationMaster for attempt {at.attempt_id} did not register again "
                                         f"within {self.cfg.am_expiry_s:g}s after the ResourceManager restarted"
                                         + NOT_COUNTED, counts=False)
            elif not attempt_is_final(at.state):
                if self._node_silent(at.am_node_id, now):
                    # Its host may have vanished: the NM expiry (as long as the AM's by default)
                    # says so soon, and then the attempt is lost with its node, not counted.
                    self._am_node_wait[aid] = now
                else:
                    self._am_expired(at)
        deadline = now - self.launch_expiry_s
        while self._unlaunched:
            cid, at_time = next(iter(self._unlaunched.items()))
            if at_time >= deadline:
                break
            self._unlaunched.popitem(last=False)
            c = self.containers.get(cid)
            if c is not None:
                self._container_completed(c, api.ContainerStatus(
                    container_id=cid, state=ContainerState.COMPLETE.value, exit_status=ExitStatus.ABORTED,
                    diagnostics="Container expired since it was unused"), cleanup_on_node=True)

    def _am_expired(self, at: Attempt) -> None:
        self._attempt_failed(at, f"ApplicationMaster for attempt {at.attempt_id} timed out after "
                                 f"{self.cfg.am_expiry_s:g}s without a heartbeat")

    def _node_silent(self, node_id: str, now: float) -> bool:
        """Whether a node has missed its heartbeats: LOST, or silent for a few heartbeat intervals
        (half the AM expiry at most, so an AM expiring just before its node is still caught)."""
        node = self.nodes.get(node_id)
        if node is None or node.state == NodeState.LOST:
            return True
        grace = min(3 * self.cfg.nm_heartbeat_interval_ms / 1000.0, self.cfg.am_expiry_s / 2)
        return now - node.last_heartbeat > grace

    def _settle_am_node_waits(self, now: float) -> None:
        """Decide the expired AMs whose node was silent: a node now LOST took the attempt with it
        (not counted); a node heard from since lives, so the AM itself stopped (counted)."""
        for aid, expired_at in list(self._am_node_wait.items()):
            at = self.attempts[aid]
            if attempt_is_final(at.state) or at.state == AttemptState.FINISHING:
                del self._am_node_wait[aid]     # settled meanwhile (the node's loss, a kill, an exit)
                continue
            node = self.nodes.get(at.am_node_id)
            if node is None or node.state == NodeState.LOST:
                del self._am_node_wait[aid]
                self._attempt_failed(at, f"Attempt {aid} was lost with its node {at.am_node_id}: its "
                                         f"ApplicationMaster and NodeManager both went silent" + NOT_COUNTED,
                                     counts=False)
            elif node.last_heartbeat > expired_at:
                del self._am_node_wait[aid]
                self._am_expired(at)
