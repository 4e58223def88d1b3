"""The RM core: applications, attempts, containers, liveness. Pure (no I/O, injected clock).

The server calls these methods from HTTP handlers and timers, then drains `effects` (AM launches)
and `dirty` (apps to write to the state store). Errors are protocol ApiErrors so handlers can
answer them directly; every method validates before it changes anything.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional

from protocol import internal_api as api
from protocol import tokens
from protocol.ids import ApplicationId, AttemptId, ContainerId
from protocol.config import ClusterConfig, RMConfig
from protocol.nm_client import container_token_payload
from protocol.records import AppState, AttemptState, ContainerState, ExitStatus, FinalStatus, NodeState, Resource
from protocol.remote_exception import BadRequest, NotFound, Unauthorized

from .model import AmSpec, App, Attempt, Container, Node
from .nodes import NodeTracker
from .scheduler import AskError, CapacityScheduler
from .state_machines import AppEvent, AttemptEvent, attempt_is_final, next_app_state, next_attempt_state

CONTAINER_LAUNCH_EXPIRY_S = 600.0   # YARN's rm.container-allocation.expiry-interval


@dataclass(frozen=True)
class LaunchAm:
    """Effect: start this attempt's AM container on its NM."""

    app_id: str
    attempt_id: str
    container: Container
    am_token: str


class ResourceManagerCore:
    """All RM state and the rules that change it."""

    def __init__(self, cfg: RMConfig, cluster: ClusterConfig, clock: Callable[[], float],
                 launch_expiry_s: float = CONTAINER_LAUNCH_EXPIRY_S):
        self.cfg = cfg
        self.cluster = cluster
        self.clock = clock
        self.start_time = clock()
        self.cluster_ts = int(self.start_time * 1000)
        self.nodes = NodeTracker(cfg.nm_expiry_s)
        self.scheduler = CapacityScheduler(cfg, self.nodes.lookup, lambda: self.nodes.total)
        self.apps: dict[str, App] = {}
        self.attempts: dict[str, Attempt] = {}
        self.containers: dict[str, Container] = {}
        self.reserved_ids: set[str] = set()     # handed out by new-application, not yet submitted
        self._app_seq = 0
        self._submit_seq = 0
        self.launch_expiry_s = launch_expiry_s
        self._am_live: OrderedDict[str, float] = OrderedDict()      # attempt -> last AM contact
        self._unlaunched: OrderedDict[str, float] = OrderedDict()   # container -> allocated at
        self.effects: list[LaunchAm] = []
        self.dirty: set[str] = set()
        self.counters = {"nm_heartbeats": 0, "am_allocates": 0, "containers_allocated": 0,
                         "apps_submitted": 0}

    # ----- helpers --------------------------------------------------------------------------
    def _app_event(self, app: App, ev: AppEvent) -> None:
        app.state = next_app_state(app.state, ev)
        self.dirty.add(app.app_id)

    def _attempt_event(self, at: Attempt, ev: AttemptEvent) -> None:
        at.state = next_attempt_state(at.state, ev)
        self.dirty.add(at.app_id)

    def get_app(self, app_id: str) -> App:
        app = self.apps.get(app_id)
        if app is None:
            raise NotFound(f"app with id: {app_id} not found")
        return app

    def max_resource(self) -> Resource:
        return self.scheduler.maximum

    def take_effects(self) -> list[LaunchAm]:
        out, self.effects = self.effects, []
        return out

    def take_dirty(self) -> set[str]:
        out, self.dirty = self.dirty, set()
        return out

    # ----- client side: new-application, submit, kill ----------------------------------------
    def new_application(self) -> str:
        self._app_seq += 1
        app_id = str(ApplicationId(self.cluster_ts, self._app_seq))
        self.reserved_ids.add(app_id)
        return app_id

    def check_submission(self, app_id: str, queue: str, am_resource: Resource) -> Resource:
        """Validate what only the core can judge; returns the normalised AM resource."""
        if app_id in self.apps:
            raise BadRequest(f"application-id: {app_id} was already submitted")
        if app_id not in self.reserved_ids:
            raise BadRequest(f"application-id: {app_id} was not handed out by new-application")
        if queue not in self.scheduler.queues:
            raise BadRequest(f"queue: unknown queue {queue!r}; known queues: {', '.join(self.scheduler.queues)}")
        try:
            return self.scheduler.normalize(am_resource, "resource")
        except AskError as e:
            raise BadRequest(str(e)) from None

    def submit(self, app_id: str, user: str, name: str, queue: str, app_type: str, am: AmSpec,
               max_attempts: int, submission: dict, elastane: Optional[dict]) -> App:
        """Create the app in NEW_SAVING; the caller stores it and then calls `app_saved`."""
        am.resource = self.check_submission(app_id, queue, am.resource)
        if max_attempts < 1:
            raise BadRequest(f"max-app-attempts must be >= 1, got {max_attempts}")
        self.reserved_ids.discard(app_id)
        self._submit_seq += 1
        app = App(app_id=app_id, user=user, name=name, queue=queue, app_type=app_type, am=am,
                  max_attempts=min(max_attempts, self.cfg.max_app_attempts), submit_time=self.clock(),
                  seq=self._submit_seq, submission=submission, elastane=elastane)
        self.apps[app_id] = app
        self._app_event(app, AppEvent.START)
        self.counters["apps_submitted"] += 1
        return app

    def forget_unsaved(self, app_id: str) -> None:
        """The store could not save a NEW_SAVING app: drop it so nothing is left half-created."""
        app = self.apps.get(app_id)
        if app is not None and app.state == AppState.NEW_SAVING:
            del self.apps[app_id]
            self.reserved_ids.add(app_id)
            self.dirty.discard(app_id)

    def app_saved(self, app_id: str) -> None:
        app = self.get_app(app_id)
        self._app_event(app, AppEvent.SAVED)
        self.scheduler.add_app(app_id, app.queue, app.user, app.seq)
        self._app_event(app, AppEvent.ACCEPT)
        self._new_attempt(app)
        self._schedule(self.nodes.schedulable())

    def kill(self, app_id: str, diagnostics: str = "Application killed by user.") -> App:
        app = self.get_app(app_id)
        if app.state.is_final:
            return app
        at = self.attempts.get(app.current_attempt or "")
        if at is not None and not attempt_is_final(at.state):
            self._end_attempt(at, AttemptEvent.KILL, diagnostics)
        app.diagnostics = diagnostics
        app.final_status = FinalStatus.KILLED
        self._app_event(app, AppEvent.KILL)
        self._app_done(app)
        return app

    def recover(self, app: App, attempts: list[Attempt]) -> None:
        """Restore an app from the state store after an RM restart. Finished apps are listed
        again; unfinished ones lose their old attempt (not counted as a failure) and get a new one."""
        self.apps[app.app_id] = app
        app.attempts = [at.attempt_id for at in attempts]
        for at in attempts:
            self.attempts[at.attempt_id] = at
        self._submit_seq = max(self._submit_seq, app.seq)
        if app.state.is_final:
            return
        now = self.clock()
        for at in attempts:
            if not attempt_is_final(at.state):
                # A restore, not a transition: the attempt died with the old RM.
                at.state, at.counts_as_failure = AttemptState.FAILED, False
                at.finish_time = now
                at.diagnostics = "Attempt lost: the ResourceManager restarted"
        if app.queue not in self.scheduler.queues:
            app.state, app.final_status, app.finish_time = AppState.FAILED, FinalStatus.FAILED, now
            app.diagnostics = f"queue {app.queue!r} no longer exists after the ResourceManager restart"
            self.dirty.add(app.app_id)
            return
        app.state = AppState.NEW
        self._app_event(app, AppEvent.RECOVER)
        self.scheduler.add_app(app.app_id, app.queue, app.user, app.seq)
        self._new_attempt(app)

    # ----- attempts -------------------------------------------------------------------------
    def _new_attempt(self, app: App) -> Attempt:
        n = len(app.attempts) + 1
        aid = str(AttemptId(ApplicationId.parse(app.app_id), n))
        at = Attempt(attempt_id=aid, app_id=app.app_id, number=n, state=AttemptState.NEW, start_time=self.clock())
        self.attempts[aid] = at
        app.attempts.append(aid)
        if not app.start_time:
            app.start_time = at.start_time
        self._attempt_event(at, AttemptEvent.START)
        self.scheduler.request_am(app.app_id, app.am.resource)
        self._attempt_event(at, AttemptEvent.SCHEDULE)
        return at

    def _end_attempt(self, at: Attempt, ev: AttemptEvent, diagnostics: str) -> None:
        """Move an attempt to a final state and clean up every container it still holds."""
        self._attempt_event(at, ev)
        at.finish_time = self.clock()
        if diagnostics:
            at.diagnostics = diagnostics
        self._am_live.pop(at.attempt_id, None)
        self.scheduler.clear_demand(at.app_id)
        for cid in list(at.containers):
            c = self.containers.get(cid)
            if c is not None:
                self._release(c, cleanup_on_node=True)
        at.to_deliver.clear()

    def _attempt_failed(self, at: Attempt, diagnostics: str, counts: bool = True) -> None:
        app = self.apps[at.app_id]
        if app.state.is_final or attempt_is_final(at.state):
            return
        at.counts_as_failure = counts
        self._end_attempt(at, AttemptEvent.FAIL, diagnostics)
        failures = sum(1 for a in app.attempts if self.attempts[a].state == AttemptState.FAILED
                       and self.attempts[a].counts_as_failure)
        if failures < app.max_attempts:
            self._app_event(app, AppEvent.ATTEMPT_RETRY)
            self._new_attempt(app)
        else:
            app.final_status = FinalStatus.FAILED
            app.diagnostics = (f"Application {app.app_id} failed {failures} times due to: {diagnostics}. "
                               f"Failing the application.")
            self._app_event(app, AppEvent.ATTEMPT_FAILED)
            self._app_done(app)

    def _app_done(self, app: App) -> None:
        app.finish_time = self.clock()
        app.progress = 1.0 if app.state == AppState.FINISHED else app.progress
        self.scheduler.remove_app(app.app_id)
        for node_id in app.nodes_used:
            n = self.nodes.get(node_id)
            if n is not None and n.state != NodeState.LOST:
                n.apps_to_cleanup.append(app.app_id)

    def _attempt_for_token(self, claims: dict) -> tuple[App, Attempt]:
        app = self.apps.get(str(claims.get("app_id", "")))
        at = self.attempts.get(str(claims.get("attempt_id", "")))
        if app is None or at is None or at.app_id != app.app_id:
            raise Unauthorized("am token names an unknown application attempt")
        return app, at

    def _is_current(self, app: App, at: Attempt) -> bool:
        return app.current_attempt == at.attempt_id and not app.state.is_final and not attempt_is_final(at.state)

    def am_token(self, at: Attempt) -> str:
        app = self.apps[at.app_id]
        return tokens.sign(self.cluster.secret, tokens.AM,
                           {"app_id": app.app_id, "attempt_id": at.attempt_id, "user": app.user},
                           self.cluster.token_lifetime_s, now=self.clock())

    def am_launched(self, attempt_id: str) -> None:
        at = self.attempts.get(attempt_id)
        if at is None or attempt_is_final(at.state) or at.state == AttemptState.FINISHING:
            return
        if at.state in (AttemptState.ALLOCATED, AttemptState.RUNNING):
            self._attempt_event(at, AttemptEvent.LAUNCHED)
        c = self.containers.get(at.am_container_id)
        if c is not None:
            self._mark_launched(c)

    def am_launch_failed(self, attempt_id: str, diagnostics: str) -> None:
        at = self.attempts.get(attempt_id)
        if at is None or attempt_is_final(at.state):
            return
        self._attempt_failed(at, f"Error launching {attempt_id}. Got exception: {diagnostics}")

    # ----- AM protocol ----------------------------------------------------------------------
    def am_register(self, claims: dict, req: api.AmRegisterRequest) -> api.AmRegisterResponse:
        app, at = self._attempt_for_token(claims)
        if not self._is_current(app, at):
            raise Unauthorized(f"{at.attempt_id} is not the current attempt of {app.app_id} "
                               f"(attempt state {at.state.value}, app state {app.state.value})")
        if at.state not in (AttemptState.ALLOCATED, AttemptState.LAUNCHED, AttemptState.RUNNING):
            raise BadRequest(f"{at.attempt_id} cannot register in state {at.state.value}")
        if not at.registered:
            self._attempt_event(at, AttemptEvent.REGISTERED)
            at.registered = True
            self._app_event(app, AppEvent.ATTEMPT_REGISTERED)
        at.host, at.rpc_port, at.tracking_url = req.host, req.rpc_port, req.tracking_url
        app.tracking_url = req.tracking_url
        self._touch(at)
        return api.AmRegisterResponse(app_id=app.app_id, attempt_id=at.attempt_id,
                                      maximum_resource=self.scheduler.maximum, queue=app.queue, user=app.user)

    def allocate(self, claims: dict, req: api.AllocateRequest) -> api.AllocateResponse:
        app, at = self._attempt_for_token(claims)
        if not self._is_current(app, at):
            return api.AllocateResponse(response_id=req.response_id + 1, action="SHUTDOWN")
        if not at.registered:
            raise BadRequest(f"{at.attempt_id} must register before it allocates")
        if not (0.0 <= req.progress <= 1.0):
            raise BadRequest(f"progress must be within [0, 1], got {req.progress}")
        try:
            asks = self.scheduler.validate_asks(req.asks)
        except AskError as e:
            raise BadRequest(str(e)) from None
        # Validated: now apply.
        self.counters["am_allocates"] += 1
        self._touch(at)
        app.progress = req.progress
        if req.shape is not None:
            app.shape = req.shape
        for cid in req.releases:
            c = self.containers.get(cid)
            if c is not None and c.attempt_id == at.attempt_id and not c.is_am:
                self._release(c, cleanup_on_node=True)
                at.completed.append(api.ContainerStatus(container_id=cid, state=ContainerState.COMPLETE.value,
                                                        exit_status=ExitStatus.ABORTED,
                                                        diagnostics="Container released by application"))
        if asks:
            undelivered: dict[int, int] = {}
            for c in at.to_deliver:
                undelivered[c.ask_id] = undelivered.get(c.ask_id, 0) + 1
            self.scheduler.update_asks(app.app_id, asks, undelivered)
        if self.scheduler.has_demand:
            self._schedule(self.nodes.schedulable())
        at.response_id += 1
        resp = api.AllocateResponse(
            response_id=at.response_id,
            allocated=[api.AllocatedContainer(container_id=c.container_id, node_id=c.node_id,
                                              node_http_address=c.node_http_address, resource=c.resource,
                                              container_token=c.token, ask_id=c.ask_id, tag=c.tag)
                       for c in at.to_deliver],
            completed=at.completed, updated_nodes=at.updated_nodes,
            available=self.scheduler.headroom(app.app_id),
            num_cluster_nodes=len(self.nodes.running),
        )
        at.to_deliver, at.completed, at.updated_nodes = [], [], []
        if app.directive is not None and app.directive_version > app.delivered_directive_version:
            resp.shape_directive = app.directive
            app.delivered_directive_version = app.directive_version
        return resp

    def am_finish(self, claims: dict, req: api.AmFinishRequest) -> api.AmFinishResponse:
        app, at = self._attempt_for_token(claims)
        if at.state in (AttemptState.FINISHING, AttemptState.FINISHED):   # a retried finish
            return api.AmFinishResponse(unregistered=True)
        if not self._is_current(app, at):
            raise Unauthorized(f"{at.attempt_id} is not the current attempt of {app.app_id}")
        try:
            final = FinalStatus(req.final_status)
        except ValueError:
            raise BadRequest(f"final_status must be one of SUCCEEDED, FAILED, KILLED; got {req.final_status!r}") from None
        if final == FinalStatus.UNDEFINED:
            raise BadRequest("final_status must be one of SUCCEEDED, FAILED, KILLED; got 'UNDEFINED'")
        if not at.registered:
            raise BadRequest(f"{at.attempt_id} must register before it finishes")
        self._attempt_event(at, AttemptEvent.UNREGISTERED)
        at.diagnostics = req.diagnostics
        if req.tracking_url:
            at.tracking_url = app.tracking_url = req.tracking_url
        app.final_status = final
        app.diagnostics = req.diagnostics
        self._app_event(app, AppEvent.ATTEMPT_FINISHED)
        # Give back everything but the AM container, which exits on its own (then FINISHED).
        self.scheduler.clear_demand(app.app_id)
        for cid in list(at.containers):
            c = self.containers.get(cid)
            if c is not None and not c.is_am:
                self._release(c, cleanup_on_node=True)
        at.to_deliver.clear()
        self._touch(at)   # the AM container gets am_expiry_s to exit before it is cleaned up
        self._app_done(app)
        return api.AmFinishResponse(unregistered=True)

    def _touch(self, at: Attempt) -> None:
        self._am_live[at.attempt_id] = self.clock()
        self._am_live.move_to_end(at.attempt_id)

    # ----- containers -----------------------------------------------------------------------
    def _schedule(self, candidates: list[Node]) -> None:
        for a in self.scheduler.allocate(candidates):
            self._create_container(a.app_id, self.nodes.nodes[a.node_id], a.resource, a.ask_id, a.tag, a.is_am)

    def _create_container(self, app_id: str, node: Node, r: Resource, ask_id: int, tag: str, is_am: bool) -> None:
        app = self.apps[app_id]
        at = self.attempts[app.current_attempt or ""]
        at.container_seq += 1
        cid = str(ContainerId(AttemptId.parse(at.attempt_id), at.container_seq))
        now = self.clock()
        token = tokens.sign(self.cluster.secret, tokens.CONTAINER,
                            container_token_payload(cid, node.node_id, app_id, at.attempt_id, app.user, r),
                            self.cfg.container_token_lifetime_s, now=now)
        c = Container(cid, app_id, at.attempt_id, node.node_id, node.http_address, r, now, token,
                      ask_id=ask_id if not is_am else 0, tag=tag, is_am=is_am)
        self.containers[cid] = c
        node.containers.add(cid)
        at.containers.add(cid)
        app.nodes_used.add(node.node_id)
        self._unlaunched[cid] = now
        self.counters["containers_allocated"] += 1
        if is_am:
            at.am_container_id, at.am_node_id, at.am_node_http_address = cid, node.node_id, node.http_address
            self._attempt_event(at, AttemptEvent.ALLOCATED)
            self._touch(at)   # AM liveness runs from allocation, so a launch that hangs still expires
            self.effects.append(LaunchAm(app_id, at.attempt_id, c, self.am_token(at)))
        else:
            at.to_deliver.append(c)

    def _mark_launched(self, c: Container) -> None:
        if not c.launched:
            c.launched = True
            self._unlaunched.pop(c.container_id, None)

    def _release(self, c: Container, cleanup_on_node: bool) -> None:
        """Forget a container and give its resources back; optionally tell its NM to kill it."""
        self.containers.pop(c.container_id, None)
        self._unlaunched.pop(c.container_id, None)
        app = self.apps[c.app_id]
        node = self.nodes.get(c.node_id)
        now = self.clock()
        app.memory_seconds += c.resource.memory * max(0.0, now - c.allocated_at)
        app.vcore_seconds += c.resource.vcores * max(0.0, now - c.allocated_at)
        self.scheduler.release(c.app_id, app.queue, app.user, node, c.resource)
        at = self.attempts.get(c.attempt_id)
        if at is not None:
            at.containers.discard(c.container_id)
        if node is not None:
            node.containers.discard(c.container_id)
            if cleanup_on_node and node.state != NodeState.LOST:
                node.to_cleanup.append(c.container_id)

    def _container_completed(self, c: Container, status: api.ContainerStatus, cleanup_on_node: bool = False) -> None:
        self._release(c, cleanup_on_node)
        at = self.attempts.get(c.attempt_id)
        if at is None:
            return
        if c.is_am:
            if at.state == AttemptState.FINISHING:
                self._attempt_event(at, AttemptEvent.CONTAINER_FINISHED)
                at.finish_time = self.clock()
                self._am_live.pop(at.attempt_id, None)
            elif not attempt_is_final(at.state):
                self._attempt_failed(at, f"AM Container for {at.attempt_id} exited with exitCode: "
                                         f"{status.exit_status} ({ExitStatus.describe(status.exit_status)}). "
                                         f"Diagnostics: {status.diagnostics}")
        elif not attempt_is_final(at.state) and at.state != AttemptState.FINISHING:
            at.completed.append(status)

    # ----- NM protocol ----------------------------------------------------------------------
    def register_node(self, claims: dict, req: api.NodeRegisterRequest) -> api.NodeRegisterResponse:
        if claims.get("node_id") != req.node_id:
            raise Unauthorized(f"nm token is for node {claims.get('node_id')!r}, not {req.node_id!r}")
        if req.capability.memory <= 0 or req.capability.vcores <= 0:
            raise BadRequest(f"capability must be positive, got memory={req.capability.memory} "
                             f"vCores={req.capability.vcores}")
        now = self.clock()
        node = self.nodes.register(req.node_id, req.http_address, req.capability, req.rack, req.version, now)
        reported = {s.container_id: s for s in req.containers}
        # Containers we think run there but the NM does not report: gone with the NM restart.
        for cid in list(node.containers):
            c = self.containers[cid]
            s = reported.get(cid)
            if s is None or s.state == ContainerState.COMPLETE.value:
                self._container_completed(c, s or api.ContainerStatus(
                    container_id=cid, state="COMPLETE", exit_status=ExitStatus.ABORTED,
                    diagnostics="Container lost when its NodeManager re-registered"))
            else:
                self._mark_launched(c)
        for cid, s in reported.items():
            if cid not in self.containers and s.state != ContainerState.COMPLETE.value:
                node.to_cleanup.append(cid)
        if self.scheduler.has_demand:
            self._schedule([node])
        return api.NodeRegisterResponse(node_id=req.node_id, heartbeat_interval_ms=self.cfg.nm_heartbeat_interval_ms,
                                        rm_start_ms=self.cluster_ts)

    def node_heartbeat(self, claims: dict, req: api.NodeHeartbeatRequest) -> api.NodeHeartbeatResponse:
        if claims.get("node_id") != req.node_id:
            raise Unauthorized(f"nm token is for node {claims.get('node_id')!r}, not {req.node_id!r}")
        node = self.nodes.get(req.node_id)
        interval = self.cfg.nm_heartbeat_interval_ms
        if node is None or node.state == NodeState.LOST:
            return api.NodeHeartbeatResponse(response_id=0, action="RESYNC", heartbeat_interval_ms=interval,
                                             diagnostics=f"node {req.node_id} is not registered with this RM")
        self.counters["nm_heartbeats"] += 1
        now = self.clock()
        self.nodes.heartbeat(node, req.health.healthy, req.health.report, now)
        containers = self.containers
        for s in req.container_statuses:
            c = containers.get(s.container_id)
            if c is None or c.node_id != node.node_id:
                if s.state != ContainerState.COMPLETE.value:
                    node.to_cleanup.append(s.container_id)
            elif s.state == ContainerState.COMPLETE.value:
                self._container_completed(c, s)
            elif not c.launched:
                self._mark_launched(c)
        if self.scheduler.has_demand and node.schedulable:
            self._schedule([node])
        node.response_id += 1
        resp = api.NodeHeartbeatResponse(response_id=node.response_id, heartbeat_interval_ms=interval,
                                          containers_to_cleanup=node.to_cleanup,
                                          apps_to_cleanup=node.apps_to_cleanup)
        node.to_cleanup, node.apps_to_cleanup = [], []
        return resp

    def _node_lost(self, node: Node) -> None:
        report = api.NodeReport(node_id=node.node_id, state=NodeState.LOST.value, http_address=node.http_address)
        told: set[str] = set()
        for cid in list(node.containers):
            c = self.containers[cid]
            if c.attempt_id not in told:
                told.add(c.attempt_id)
                at = self.attempts.get(c.attempt_id)
                if at is not None:
                    at.updated_nodes.append(report)
            self._container_completed(c, api.ContainerStatus(
                container_id=cid, state=ContainerState.COMPLETE.value, exit_status=ExitStatus.ABORTED,
                diagnostics=f"Container released on a *lost* node {node.node_id}"))

    # ----- timers ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Expire silent nodes, silent AMs and containers allocated but never launched."""
        now = self.clock()
        for node in self.nodes.expired(now):
            self._node_lost(node)
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
            elif not attempt_is_final(at.state):
                self._attempt_failed(at, f"ApplicationMaster for attempt {aid} timed out after "
                                         f"{self.cfg.am_expiry_s:g}s without a heartbeat")
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
