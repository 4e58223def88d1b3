"""The AM side of the RM core: register / allocate / finish, AM tokens and launch results.

A mixin of ResourceManagerCore (rm/core.py), which owns the state these methods read and change;
pure like the rest of the core.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

from protocol import internal_api as api
from protocol import tokens
from protocol.config import ClusterConfig
from protocol.job_report import JobReport
from protocol.json_types import JsonObject
from protocol.records import AttemptState, ContainerState, ExitStatus, FinalStatus
from protocol.ids import ContainerId
from protocol.remote_exception import ApplicationMasterNotRegistered, BadRequest, Unauthorized

from .model import App, Attempt, Container, bounded_diagnostics
from .scheduler import Ask, AskError, CapacityScheduler
from .state_machines import AppEvent, AttemptEvent, attempt_is_final

if TYPE_CHECKING:
    from .model import Node
    from .nodes import NodeTracker


log = logging.getLogger(__name__)

RESYNC_HINT = (" (the ResourceManager restarted or failed over and kept the attempt: register again, "
               "then resend every ask and release)")


def shape_key(report: JobReport) -> tuple[object, ...]:
    """The parts of a job report that make a policy decide differently when they change: the
    job's shape and run state; not its progress or measurements (see ResourceManagerCore.policy_version)."""
    return (report.workers, report.servers, report.started, report.changing, report.early_feedback,
            report.executor_resource, report.directive_version, report.phase, report.paused)


class AmProtocol:
    """ApplicationMaster protocol (YARN's ApplicationMasterService)."""

    apps: dict[str, App]
    attempts: dict[str, Attempt]
    containers: dict[str, Container]
    scheduler: CapacityScheduler
    nodes: "NodeTracker"
    cluster: ClusterConfig
    clock: Callable[[], float]
    counters: dict[str, int]
    policy_version: int
    policy_places_new_jobs: bool
    _am_live: OrderedDict[str, float]
    _am_node_wait: dict[str, float]
    preemption_notices: dict[str, api.PreemptionMessage]
    container_epoch: int
    dirty: set[str]
    ask_shapes: dict[str, dict[int, Ask]]

    if TYPE_CHECKING:  # implemented by ResourceManagerCore (rm/core.py)
        def _app_event(self, app: App, ev: AppEvent) -> None: ...
        def _attempt_event(self, at: Attempt, ev: AttemptEvent) -> None: ...
        def _attempt_failed(self, at: Attempt, diagnostics: str, counts: bool = True) -> None: ...
        def _app_done(self, app: App) -> None: ...
        def _schedule(self, candidates: list[Node]) -> None: ...
        def _mark_launched(self, c: Container) -> None: ...
        def _release(self, c: Container, cleanup_on_node: bool) -> bool: ...
        def _previous_containers(self, at: Attempt) -> list[api.AllocatedContainer]: ...
        def rests_on_stored(self, app_id: str) -> None: ...

    def _attempt_for_token(self, claims: JsonObject) -> tuple[App, Attempt]:
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

    def rolled_am_token(self, at: Attempt, claims: JsonObject) -> str:
        """A fresh AM token for an allocate presented with one past half its lifetime (by this
        core's clock), "" otherwise: YARN rolls its AMRMTokens the same way, and the AM switches
        to the one it gets in AllocateResponse.am_token. The one it presented stays valid until it
        expires (it is signed), so an AM that missed the answer goes on and gets another.
        Claims without an `exp` (no verified token; tests) get none."""
        exp = claims.get("exp")
        if not isinstance(exp, (int, float, str)):
            return ""
        try:
            left = float(exp) - self.clock()
        except ValueError:
            return ""
        if left > self.cluster.token_lifetime_s / 2:
            return ""
        return self.am_token(at)

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
        if at.registered or at.state in (AttemptState.RUNNING, AttemptState.FINISHING):
            # The launcher's start_container call failed on the wire (a timeout, a reset) although
            # the NM started the AM, which has registered since: the attempt is healthy.
            log.warning("ignoring a launch error for %s, whose AM has registered (%s): %s",
                        attempt_id, at.state.value, diagnostics)
            return
        self._attempt_failed(at, f"Error launching {attempt_id}. Got exception: {diagnostics}")

    def am_register(self, claims: JsonObject, req: api.AmRegisterRequest) -> api.AmRegisterResponse:
        app, at = self._attempt_for_token(claims)
        if not self._is_current(app, at):
            raise Unauthorized(f"{at.attempt_id} is not the current attempt of {app.app_id} "
                               f"(attempt state {at.state.value}, app state {app.state.value})")
        if at.state not in (AttemptState.ALLOCATED, AttemptState.LAUNCHED, AttemptState.RUNNING):
            raise BadRequest(f"{at.attempt_id} cannot register in state {at.state.value}")
        if not -1 <= req.rpc_port <= 65535:         # checked before anything changes
            raise BadRequest(f"rpc_port must be a port (0..65535) or -1 for none, got {req.rpc_port}")
        if at.awaiting_resync and at.state == AttemptState.RUNNING:
            # Its AM registered with an earlier RM and registers again after a restart or failover:
            # the attempt goes on as it was (no transition), asks and releases follow in allocate.
            at.awaiting_resync = False
            at.registered = True
            # The latest directive is sent again: one the old RM stored but may not have delivered
            # reaches it; one it has seen it ignores (its version is not new to it).
            app.delivered_directive_version = 0
        elif not at.registered:
            at.awaiting_resync = False
            self._attempt_event(at, AttemptEvent.REGISTERED)
            at.registered = True
            self._app_event(app, AppEvent.ATTEMPT_REGISTERED)
            # A new attempt knows nothing of the directives its predecessor got: the latest is
            # delivered again (an AM under a policy that places new jobs waits for it).
            app.delivered_directive_version = 0
        at.host, at.rpc_port, at.tracking_url = req.host, req.rpc_port, req.tracking_url
        app.tracking_url = req.tracking_url
        self._touch(at)
        return api.AmRegisterResponse(app_id=app.app_id, attempt_id=at.attempt_id,
                                      maximum_resource=self.scheduler.maximum, queue=app.queue, user=app.user,
                                      containers_from_previous_attempts=self._previous_containers(at),
                                      policy_places_new_jobs=self.policy_places_new_jobs)

    def allocate(self, claims: JsonObject, req: api.AllocateRequest) -> api.AllocateResponse:
        app, at = self._attempt_for_token(claims)
        if not self._is_current(app, at):
            return api.AllocateResponse(response_id=req.response_id + 1, action="SHUTDOWN")
        if not at.registered:
            raise ApplicationMasterNotRegistered(f"{at.attempt_id} must register before it allocates"
                                                 + (RESYNC_HINT if at.awaiting_resync else ""))
        if at.last_response is not None and req.response_id + 1 == at.response_id:
            # The AM never got our last answer and repeats its request: answer the same again.
            self._touch(at)
            return at.last_response
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
            if app.shape is None or shape_key(app.shape) != shape_key(req.shape):
                self.policy_version += 1
            app.shape = req.shape
            app.shape_history.record(self.clock(), req.shape)
            if req.shape.started:
                self.scheduler.cap_gang_reservation(app.app_id, 0)     # it trains with what it holds
            if req.shape.directive_version > app.directive_version:
                # The AM acted on a directive this RM did not recover (an RM that failed before it
                # stored it): the next one is numbered above it, or the AM would ignore it.
                app.directive_version = req.shape.directive_version
                self.dirty.add(app.app_id)
        for cid in req.releases:
            c = self.containers.get(cid)
            if c is None and self._unheard_of(at, cid):
                at.pending_release.add(cid)     # its NM has not re-registered since a restart
            if c is not None and c.attempt_id == at.attempt_id and not c.is_am:
                self._release(c, cleanup_on_node=True)
                at.completed.append(api.ContainerStatus(container_id=cid, state=ContainerState.COMPLETE.value,
                                                        exit_status=ExitStatus.ABORTED,
                                                        diagnostics="Container released by application"))
        if asks:
            self.policy_version += 1        # the app's pending demand
            shapes = self.ask_shapes.setdefault(at.attempt_id, {})
            for a in asks:
                shapes[a.ask_id] = a
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
            am_token=self.rolled_am_token(at, claims),
        )
        at.to_deliver, at.completed, at.updated_nodes = [], [], []
        kept_shapes = self.ask_shapes.get(at.attempt_id)
        if kept_shapes:
            # All delivered: only the live rows' shapes can be needed again (`_undeliver`).
            sa = self.scheduler.apps.get(app.app_id)
            rows = sa.asks if sa is not None else {}
            for ask_id in [k for k in kept_shapes if k not in rows]:
                del kept_shapes[ask_id]
        resp.preemption = self.preemption_notices.get(app.app_id)
        if app.directive is not None and app.directive_version > app.delivered_directive_version:
            resp.shape_directive = app.directive
            app.delivered_directive_version = app.directive_version
            d = app.directive        # a paused job asks for nothing, whatever counts its directive carries
            self.scheduler.cap_gang_reservation(app.app_id, 0 if d.run_state is api.RunState.PAUSE
                                                else d.workers + d.servers)
        at.last_response = resp
        return resp

    def am_finish(self, claims: JsonObject, req: api.AmFinishRequest) -> api.AmFinishResponse:
        app, at = self._attempt_for_token(claims)
        if at.state in (AttemptState.FINISHING, AttemptState.FINISHED):   # a retried finish
            self.rests_on_stored(app.app_id)
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
            raise ApplicationMasterNotRegistered(f"{at.attempt_id} must register before it finishes"
                                                 + (RESYNC_HINT if at.awaiting_resync else ""))
        self._attempt_event(at, AttemptEvent.UNREGISTERED)
        diagnostics = bounded_diagnostics(req.diagnostics)
        at.diagnostics = diagnostics
        if req.tracking_url:
            at.tracking_url = app.tracking_url = req.tracking_url
        app.final_status = final
        app.diagnostics = diagnostics
        self._app_event(app, AppEvent.ATTEMPT_FINISHED)
        # Give back everything but the AM container, which exits on its own (then FINISHED).
        self.scheduler.clear_demand(app.app_id)
        for cid in list(at.containers):
            c = self.containers.get(cid)
            if c is not None and not c.is_am:
                self._release(c, cleanup_on_node=True)
        at.to_deliver.clear()
        self.ask_shapes.pop(at.attempt_id, None)
        self._touch(at)   # the AM container gets am_expiry_s to exit before it is cleaned up
        self._app_done(app)
        return api.AmFinishResponse(unregistered=True)

    def _unheard_of(self, at: Attempt, container_id: str) -> bool:
        """Whether a container this RM does not know may still run for `at`: one of the attempt's
        ids from before this RM's epoch (issued by an earlier RM, its NM not re-registered yet)."""
        try:
            cid = ContainerId.parse(container_id)
        except ValueError:
            return False
        return str(cid.attempt) == at.attempt_id and cid.epoch != self.container_epoch

    def _touch(self, at: Attempt) -> None:
        self._am_live[at.attempt_id] = self.clock()
        self._am_live.move_to_end(at.attempt_id)
        if self._am_node_wait:
            self._am_node_wait.pop(at.attempt_id, None)   # it expired while its node was silent: it is back
