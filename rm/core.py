"""The RM core: applications, attempts, containers, liveness. Pure (no I/O, injected clock).

The server calls these methods from HTTP handlers and timers, then drains `effects` (AM launches)
and `dirty` (apps to write to the state store). Errors are protocol ApiErrors so handlers can
answer them directly; every method validates before it changes anything.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from protocol import internal_api as api
from protocol import ps_job_spec, tokens
from protocol.ids import ApplicationId, AttemptId, ContainerId
from protocol.config import ClusterConfig, RMConfig
from protocol.nm_client import container_token_payload
from protocol.records import ZERO, AppState, AttemptState, ContainerState, ExitStatus, FinalStatus, NodeState, Resource
from protocol.app_timeouts import LifetimeError
from protocol.remote_exception import ApplicationIdNotHandedOut, BadRequest, NotFound

from .am_limit import AM_LIMIT_DIAGNOSTICS
from .am_protocol import AmProtocol
from .app_lifetime import TIMED_OUT_DIAGNOSTICS, LifetimeMonitor, check_new_expiry, effective_lifetime
from .decision_log import DecisionLog
from .directive_retry import DirectiveRetries
from .log_aggregation_status import LogAggregationBook
from .dirty_apps import DirtyApps
from .model import AmSpec, App, Attempt, Container, Node, bounded_diagnostics
from .nm_protocol import NmProtocol
from .nodes import NodeTracker
from .policies.queue_reclaim import ReclaimBook
from .policies.queue_shares import QueueShare
from .policies.snapshot import ps_job_view
from .policy_resync import PolicyResync
from .preemption_record import PreemptionRecord
from .scheduler import GANG_DIAGNOSTICS, Ask, AskError, CapacityScheduler, Gang
from .state_machines import (NOT_COUNTED, AppEvent, AttemptEvent, attempt_is_final, counts_toward_max_attempts,
                             next_app_state, next_attempt_state)
from .utilization_series import UtilizationSeries

CONTAINER_LAUNCH_EXPIRY_S = 600.0   # YARN's rm.container-allocation.expiry-interval
MAX_RESERVED_IDS = 10_000          # new-application ids held for a submission at most (the oldest go)
# Attempts an RM restart or failover keeps (their AM container was allocated, so their AM may run).
# Earlier ones had nothing running yet and are replaced by a new attempt.
KEPT_ATTEMPT_STATES = frozenset({AttemptState.ALLOCATED, AttemptState.LAUNCHED, AttemptState.RUNNING})

@dataclass(frozen=True)
class LaunchAm:
    """Effect: start this attempt's AM container on its NM."""

    app_id: str
    attempt_id: str
    container: Container
    am_token: str

class ResourceManagerCore(AmProtocol, NmProtocol):
    """All RM state and the rules that change it (AM and NM protocols in their mixins)."""

    def __init__(self, cfg: RMConfig, cluster: ClusterConfig, clock: Callable[[], float],
                 launch_expiry_s: float = CONTAINER_LAUNCH_EXPIRY_S):
        self.cfg = cfg
        self.cluster = cluster
        self.clock = clock
        self.start_time = clock()
        self.cluster_ts = int(self.start_time * 1000)
        self.nodes = NodeTracker(cfg.nm_expiry_s)
        self.scheduler = CapacityScheduler(cfg, self.nodes.lookup, lambda: self.nodes.total,
                                           on_activation=self._am_activation_changed,
                                           schedulable_nodes=self.nodes.schedulable,
                                           on_gang=self._gang_wait_changed,
                                           state_version=lambda: self.policy_version)
        self.apps: dict[str, App] = {}
        self.attempts: dict[str, Attempt] = {}
        self.containers: dict[str, Container] = {}
        # Handed out by new-application, not yet submitted, oldest first; at most MAX_RESERVED_IDS
        # (a client asking for ids it never uses cannot grow the RM without bound).
        self.reserved_ids: dict[str, None] = {}
        self._app_seq = 0
        self._submit_seq = 0
        self.launch_expiry_s = launch_expiry_s
        self._am_live: OrderedDict[str, float] = OrderedDict()      # attempt -> last AM contact
        self._unlaunched: OrderedDict[str, float] = OrderedDict()   # container -> allocated at
        # Expired AMs whose node was silent too: the node's verdict (lost, or heard from) decides
        # whether the attempt was lost with its host (not counted) or its AM hung (counted).
        self._am_node_wait: dict[str, float] = {}                   # attempt -> when its AM expired
        # attempt -> ask id -> the ask row as its AM last sent it (priority, locality, tag), kept
        # while the row is live so a container released before its AM heard of it can be asked
        # for again (`_undeliver`) after the scheduler dropped the row.
        self.ask_shapes: dict[str, dict[int, Ask]] = {}
        self.effects: list[LaunchAm] = []
        self.dirty: set[str] = DirtyApps()     # rm/dirty_apps.py: a request's own marks are tracked
        # Completed apps, oldest first (YARN's max-completed-applications): beyond
        # cfg.max_completed_apps the oldest is forgotten (`_forget_completed`), and `removed` holds
        # the forgotten ones the server has yet to delete from the store.
        self.completed: OrderedDict[str, None] = OrderedDict()
        self.removed: set[str] = set()
        self.decommissions_dirty = False
        self.restored_draining: dict[str, Node] = {}   # DECOMMISSIONING when recovered, not registered yet
        self.decisions = DecisionLog()      # recent directive changes, for operators (in memory only)
        self.directive_retries = DirectiveRetries()   # directives acted on and not reached (rm/directive_retry.py)
        # policy_rounds_*: the server's off-loop policy rounds whose Decision was applied / dropped
        # as stale (rm/server.py).
        self.counters = {"nm_heartbeats": 0, "am_allocates": 0, "containers_allocated": 0,
                         "apps_submitted": 0, "policy_rounds_applied": 0, "policy_rounds_dropped": 0,
                         "containers_recovered": 0, "policy_rounds_held": 0, "reshapes_after_failover": 0,
                         "containers_kept_across_attempts": 0}
        self.utilization = UtilizationSeries()   # fed by heartbeats that carry measurements
        # The nodes' log aggregation reports, for the app view's logAggregationStatus (in memory).
        self.log_aggregation = LogAggregationBook(bool(cluster.remote_app_log_dir))
        # Bumped by every change a policy's snapshot would show differently (apps' states, containers,
        # asks, nodes, directives, the shape part of a job report): a Decision taken on an older
        # snapshot is stale (rm/policy_runner.py's finish_round drops it). Progress alone (epochs,
        # speeds, timings) does not count: a decision on a report one round old is as good.
        self.policy_version = 0
        # Capacity preemption (rm/reclaim_runner.py): the reclaim's state between policy rounds, the
        # queues' ideal shares it last computed, the preemption message each app's AM gets with its
        # allocate responses while its containers are warned, and what was taken from each queue.
        self.reclaim_book = ReclaimBook()
        self.queue_shares: dict[str, QueueShare] = {}
        self.preemption_notices: dict[str, api.PreemptionMessage] = {}
        self.queue_preemption = {name: PreemptionRecord() for name in self.scheduler.queues}
        # Application lifetimes (YARN's LIFETIME timeouts): the unfinished apps that have one, killed
        # by `tick` once it is up; each queue's default and cap.
        self.lifetimes = LifetimeMonitor()
        self.queue_configs = {q.name: q for q in cfg.queues}
        # Whether the RM's policy places new PS jobs before they start (set by the server from its
        # policy, rm/policies/base.py `places_new_jobs`); AMs learn it at registration.
        self.policy_places_new_jobs = False
        # The RM's HA term (rm/ha/; 0 without HA): part of every new container id, YARN's
        # container_e<epoch>_..., so two terms never issue the same id.
        self.container_epoch = 0
        # After a recovery from the store: the policy's rounds held until the cluster is back, and
        # the reshapes of its first rounds counted (rm/policy_resync.py; set by the server).
        self.policy_resync: Optional[PolicyResync] = None

    # ----- helpers --------------------------------------------------------------------------
    def policy_changed(self) -> None:
        """Something a policy's snapshot shows has changed (see `policy_version`)."""
        self.policy_version += 1

    def _app_event(self, app: App, ev: AppEvent) -> None:
        app.state = next_app_state(app.state, ev)
        self.dirty.add(app.app_id)
        self.policy_version += 1

    def _attempt_event(self, at: Attempt, ev: AttemptEvent) -> None:
        at.state = next_attempt_state(at.state, ev)
        self.dirty.add(at.app_id)

    def _wait_diagnostics_changed(self, app_id: str, diagnostics: Optional[str], prefix: str) -> bool:
        """The scheduler started holding an app's AM back (diagnostics) or stopped (None): set the
        app's diagnostics, or clear them if they are still this wait's (they start with `prefix`).
        False for an app that is gone or final."""
        app = self.apps.get(app_id)
        if app is None or app.state.is_final:
            return False
        if diagnostics is not None:
            app.diagnostics = diagnostics
        elif app.diagnostics.startswith(prefix):
            app.diagnostics = ""
        self.dirty.add(app_id)
        return True

    def _am_activation_changed(self, app_id: str, diagnostics: Optional[str]) -> None:
        """The scheduler held an app back at its queue's AM limit (diagnostics) or activated it (None)."""
        if self._wait_diagnostics_changed(app_id, diagnostics, AM_LIMIT_DIAGNOSTICS):
            self.policy_version += 1        # AppView.am_limited

    def _gang_wait_changed(self, app_id: str, diagnostics: Optional[str]) -> None:
        """Gang admission started holding the app's AM back (diagnostics) or stopped (None)."""
        self._wait_diagnostics_changed(app_id, diagnostics, GANG_DIAGNOSTICS)

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

    def rests_on_stored(self, app_id: str) -> None:
        """A request answered from the app's state as it is (a retried finish or kill, which
        change nothing) confirms that state: while it is not stored yet, mark the app again so
        the request waits for the store as the first one did (rm/dirty_apps.py)."""
        if app_id in self.dirty:
            self.dirty.add(app_id)

    def take_dirty(self) -> set[str]:
        out, self.dirty = self.dirty, DirtyApps()
        return out

    def take_removed(self) -> set[str]:
        """The apps forgotten since the last call, for the store to delete."""
        out, self.removed = self.removed, set()
        return out

    def recovered(self) -> None:
        """After `recover` of every stored app: the completed ones in order of their finish, and
        any beyond the limit forgotten (a smaller max_completed_apps than the last RM's)."""
        order = sorted(self.completed, key=lambda a: (self.apps[a].finish_time or 0.0, self.apps[a].seq))
        self.completed = OrderedDict.fromkeys(order)
        self._forget_completed()

    def _forget_completed(self) -> None:
        """Forget the oldest completed apps beyond cfg.max_completed_apps: the app, its attempts
        and what is kept of them, here and (through `removed`) in the store. Not before an app has
        been over for the longer of the NM and AM expiries (its AM may still call and its NMs
        report its containers until then: it waits for a later `tick`), nor while the RM still
        tracks a container of it."""
        excess = len(self.completed) - self.cfg.max_completed_apps
        if excess <= 0:
            return
        settled = self.clock() - max(self.cfg.nm_expiry_s, self.cfg.am_expiry_s)
        live: Optional[set[str]] = None      # the apps with tracked containers, walked once if needed
        for app_id in list(self.completed):
            if excess <= 0:
                break
            app = self.apps.get(app_id)
            if app is not None and (app.finish_time or 0.0) > settled:
                break                   # in finish order: the ones after it ended later still
            if live is None:
                live = {c.app_id for c in self.containers.values()}
            if app_id in live:
                continue
            del self.completed[app_id]
            excess -= 1
            if app is None:
                continue
            del self.apps[app_id]
            for at_id in app.attempts:
                self.attempts.pop(at_id, None)
                self._am_live.pop(at_id, None)
                self._am_node_wait.pop(at_id, None)
            self.log_aggregation.forget(app_id)
            self.preemption_notices.pop(app_id, None)
            self.dirty.discard(app_id)
            self.removed.add(app_id)

    # ----- client side: new-application, submit, kill ----------------------------------------
    def new_application(self) -> str:
        self._app_seq += 1
        app_id = str(ApplicationId(self.cluster_ts, self._app_seq))
        self.reserved_ids[app_id] = None
        while len(self.reserved_ids) > MAX_RESERVED_IDS:
            del self.reserved_ids[next(iter(self.reserved_ids))]       # the oldest goes
        return app_id

    def earlier_submission(self, app_id: str, user: str, name: str, app_type: str, am: AmSpec) -> bool:
        """Whether a submission names an app this RM holds as the same submission sent again: True
        when `user` submitted it with this name, type and AM command and environment -- a client
        that resent it after losing the answer (its RM failed over, or the answer timed out after
        the app was stored). YARN's ClientRMService answers such a copy as a success and changes
        nothing ("an earlier submitted application"). A different submission under a taken id is
        refused as before. False when the id names no app here."""
        app = self.apps.get(app_id)
        if app is None:
            return False
        same = (app.user == user and app.name == name and app.app_type == app_type
                and app.am.commands == am.commands and app.am.environment == am.environment)
        if not same:
            raise BadRequest(f"application-id: {app_id} was already submitted, by {app.user} as {app.name!r}; "
                             f"ask new-application for an id of its own")
        return True

    def check_submission(self, app_id: str, queue: str, am_resource: Resource) -> Resource:
        """Validate what only the core can judge; returns the normalised AM resource."""
        if app_id in self.apps:
            raise BadRequest(f"application-id: {app_id} was already submitted")
        if app_id not in self.reserved_ids:
            raise ApplicationIdNotHandedOut(f"application-id: {app_id} was not handed out by new-application "
                                            f"of this ResourceManager; ask it for one")
        if queue not in self.scheduler.queues:
            raise BadRequest(f"queue: unknown queue {queue!r}; known queues: {', '.join(self.scheduler.queues)}")
        try:
            return self.scheduler.normalize(am_resource, "resource")
        except AskError as e:
            raise BadRequest(str(e)) from None

    def _check_ps_job(self, app_type: str, ps_job: Optional[ps_job_spec.PSJobSpec]) -> None:
        """A PS job spec belongs to an ELASTANE_PS app, and a PS job whose executors the scheduler
        could never grant is refused (it would wait forever, and under gang admission so would its AM)."""
        if ps_job is None:
            return
        if app_type.upper() != ps_job_spec.APPLICATION_TYPE:
            raise BadRequest(f"elastane.{ps_job_spec.ELASTANE_FIELD} needs application-type "
                             f"{ps_job_spec.APPLICATION_TYPE}, not {app_type!r}")
        try:
            self.scheduler.normalize(Resource(ps_job.executor_memory_mb, ps_job.executor_vcores),
                                     f"elastane.{ps_job_spec.ELASTANE_FIELD}.executor resource")
        except AskError as e:
            raise BadRequest(str(e)) from None

    def submit(self, app_id: str, user: str, name: str, queue: str, app_type: str, am: AmSpec,
               max_attempts: int, *, ps_job: Optional[ps_job_spec.PSJobSpec] = None,
               extension: Optional[dict[str, object]] = None, keep_containers: bool = False,
               lifetime_s: Optional[int] = None) -> App:
        """Create the app in NEW_SAVING; the caller stores it and then calls `app_saved`. `ps_job`
        is an ELASTANE_PS app's decoded, validated spec (rm/submission.py); the app keeps it typed.
        `extension` is what else the submission's `elastane` object held; `keep_containers`: a failed
        attempt's containers pass to the next attempt (`_attempt_failed`); `lifetime_s`: its LIFETIME
        timeout, which the queue's default fills and its cap bounds (rm/app_lifetime.py)."""
        am.resource = self.check_submission(app_id, queue, am.resource)
        self._check_ps_job(app_type, ps_job)
        if max_attempts < 1:
            raise BadRequest(f"max-app-attempts must be >= 1, got {max_attempts}")
        self.reserved_ids.pop(app_id, None)
        self._submit_seq += 1
        app = App(app_id=app_id, user=user, name=name, queue=queue, app_type=app_type, am=am,
                  max_attempts=min(max_attempts, self.cfg.max_app_attempts), submit_time=self.clock(),
                  seq=self._submit_seq, extension=extension, keep_containers=keep_containers,
                  ps=ps_job_view(ps_job, self.scheduler.min_mb) if ps_job is not None else None)
        q = self.queue_configs[queue]
        lifetime = effective_lifetime(lifetime_s, q.default_app_lifetime_s, q.max_app_lifetime_s)
        if lifetime is not None:
            app.lifetime_expiry = app.submit_time + lifetime
            self.lifetimes.set(app_id, app.lifetime_expiry)
        self.apps[app_id] = app
        self._app_event(app, AppEvent.START)
        self.counters["apps_submitted"] += 1
        return app

    def forget_unsaved(self, app_id: str) -> None:
        """The store could not save a NEW_SAVING app: drop it so nothing is left half-created."""
        app = self.apps.get(app_id)
        if app is not None and app.state == AppState.NEW_SAVING:
            del self.apps[app_id]
            self.lifetimes.forget(app_id)
            self.reserved_ids[app_id] = None
            self.dirty.discard(app_id)

    def gang_of(self, app: App) -> Optional[Gang]:
        """The executors a PS job's AM waits for under gang admission (RMConfig.gang_admission /
        gang_shape), None for other apps or with it off. The spec was validated at submission."""
        if not self.cfg.gang_admission or app.ps is None:
            return None
        try:    # checked at submission; a recovered app meets this RM's limits, which may differ
            executor = self.scheduler.normalize(app.ps.executor)
        except AskError:
            return None
        count = app.ps.n_min if self.cfg.gang_shape == "minimum" else app.ps.workers + app.ps.servers
        return Gang(executor, count)

    def app_saved(self, app_id: str) -> None:
        app = self.get_app(app_id)
        self._app_event(app, AppEvent.SAVED)
        self.scheduler.add_app(app_id, app.queue, app.user, app.seq, self.gang_of(app))
        self._app_event(app, AppEvent.ACCEPT)
        self._new_attempt(app)
        self._schedule(self.nodes.schedulable())

    def move_app(self, app_id: str, queue: str) -> App:
        """Move an unfinished app to another queue with what it holds (YARN's move to queue): its
        containers, asks and AM are charged there from now on (CapacityScheduler.move_app).
        BadRequest naming what is wrong (a finished app, an unknown queue, one whose maximum
        capacity cannot take the app); nothing changes then. The next policy round sees it there."""
        app = self.get_app(app_id)
        if app.state.is_final:
            raise BadRequest(f"{app_id} is {app.state.value}: a finished application cannot be moved")
        if app.queue == queue:
            return app
        at = self.attempts.get(app.current_attempt or "")
        am = self.containers.get(at.am_container_id) if at is not None and at.am_container_id else None
        try:
            self.scheduler.move_app(app_id, queue, am.resource if am is not None else ZERO)
        except AskError as e:
            raise BadRequest(str(e)) from None
        app.queue = queue
        self.dirty.add(app_id)
        self.policy_version += 1
        self._schedule(self.nodes.schedulable())     # the new queue's room may serve its asks now
        return app

    def update_lifetime(self, app_id: str, expiry: float) -> App:
        """Move an unfinished app's expiry (YARN's updateApplicationTimeouts): ahead of now and,
        under a queue with a maximum lifetime, within it from the submission (BadRequest naming
        what is wrong; nothing changes then)."""
        app = self.get_app(app_id)
        if app.state.is_final:
            raise BadRequest(f"{app_id} is {app.state.value}: the lifetime of a finished application cannot be updated")
        q = self.queue_configs.get(app.queue)
        try:
            check_new_expiry(expiry, self.clock(), app.submit_time, q.max_app_lifetime_s if q is not None else -1)
        except LifetimeError as e:
            raise BadRequest(str(e)) from None
        app.lifetime_expiry = expiry
        self.lifetimes.set(app_id, expiry)
        self.dirty.add(app_id)
        return app

    def expire_lifetimes(self) -> list[str]:
        """Kill the unfinished apps whose lifetime is up (YARN's RMAppLifetimeMonitor); their ids."""
        killed = []
        for app_id in self.lifetimes.due(self.clock()):
            app = self.apps.get(app_id)
            if app is not None and not app.state.is_final:
                self.kill(app_id, TIMED_OUT_DIAGNOSTICS)
                killed.append(app_id)
        return killed

    def kill(self, app_id: str, diagnostics: str = "Application killed by user.") -> App:
        app = self.get_app(app_id)
        if app.state.is_final:
            self.rests_on_stored(app_id)
            return app
        at = self.attempts.get(app.current_attempt or "")
        diagnostics = bounded_diagnostics(diagnostics)
        if at is not None and not attempt_is_final(at.state):
            self._end_attempt(at, AttemptEvent.KILL, diagnostics)
        app.diagnostics = diagnostics
        app.final_status = FinalStatus.KILLED
        self._app_event(app, AppEvent.KILL)
        self._app_done(app)
        return app

    def preempt_containers(self, app_id: str, container_ids: Sequence[str], diagnostics: str) -> list[str]:
        """Kill these non-AM containers of the app's current attempt for another queue (YARN's
        preemption: exit status PREEMPTED, the AM told on its next allocate); the ones killed."""
        app = self.apps.get(app_id)
        at = self.attempts.get(app.current_attempt or "") if app is not None else None
        if app is None or at is None or attempt_is_final(at.state):
            return []
        killed = []
        for cid in container_ids:
            c = self.containers.get(cid)
            if c is None or c.is_am or c.attempt_id != at.attempt_id:
                continue
            if not self._release(c, cleanup_on_node=True):     # one its AM has not heard of is asked again
                at.completed.append(api.ContainerStatus(container_id=cid, state=ContainerState.COMPLETE.value,
                                                        exit_status=ExitStatus.PREEMPTED, diagnostics=diagnostics))
            killed.append(cid)
        return killed

    def recover(self, app: App, attempts: list[Attempt]) -> None:
        """Restore an app from the state store after an RM restart or failover (work-preserving,
        as YARN's RM recovery). Finished apps are listed again. An unfinished app's current attempt
        whose AM container was allocated is kept: its AM and containers still run, so it waits (up
        to am_expiry_s) for its AM to register again, and its containers are re-adopted as their
        NMs re-register (`adopt_container`). Any other unfinished attempt died with the old RM (not
        counted as a failure) and the app gets a new one."""
        self.apps[app.app_id] = app
        app.attempts = [at.attempt_id for at in attempts]
        for at in attempts:
            self.attempts[at.attempt_id] = at
        self._submit_seq = max(self._submit_seq, app.seq)
        if app.state.is_final:
            for at in attempts:
                if at.state == AttemptState.FINISHING:
                    # Its AM unregistered and the RM restarted before the AM container exited:
                    # nothing waits for that exit any more (its NM is told to clean the app up).
                    at.state, at.finish_time = AttemptState.FINISHED, self.clock()
                    self.dirty.add(app.app_id)
            self.completed[app.app_id] = None       # put in finish order by `recovered`
            return
        # Its lifetime runs on (one that ended while no RM was up ends it at the next tick, as YARN's).
        self.lifetimes.set(app.app_id, app.lifetime_expiry)
        now = self.clock()
        known_queue = app.queue in self.scheduler.queues
        current = attempts[-1] if attempts else None
        kept = current if (known_queue and current is not None and current.state in KEPT_ATTEMPT_STATES
                           and app.state in (AppState.ACCEPTED, AppState.RUNNING)) else None
        for at in attempts:
            if not attempt_is_final(at.state) and at is not kept:
                # A restore, not a transition: the attempt died with the old RM.
                at.state, at.counts_as_failure = AttemptState.FAILED, False
                at.finish_time = now
                at.diagnostics = "Attempt lost: the ResourceManager restarted"
        if not known_queue:
            app.state, app.final_status, app.finish_time = AppState.FAILED, FinalStatus.FAILED, now
            app.diagnostics = f"queue {app.queue!r} no longer exists after the ResourceManager restart"
            self.dirty.add(app.app_id)
            self.completed[app.app_id] = None
            return
        self.scheduler.add_app(app.app_id, app.queue, app.user, app.seq, self.gang_of(app))
        if kept is not None:
            # Also a restore: the attempt keeps its state (ALLOCATED, LAUNCHED or RUNNING) and the
            # app its own; only the AM's session is gone. Its AM's token still verifies (the cluster
            # secret signs it), so the AM's next call finds the attempt and is told to register.
            kept.registered = False
            kept.awaiting_resync = True
            kept.response_id, kept.last_response = 0, None
            self._touch(kept)       # the wait for the AM runs from now, as its liveness would
            self.dirty.add(app.app_id)
            self.policy_version += 1
            return
        app.state = AppState.NEW
        self._app_event(app, AppEvent.RECOVER)
        self._new_attempt(app)

    def adopt_container(self, node: Node, s: api.ContainerStatus) -> None:
        """A (re-)registering NM reports a container this RM does not know (it was allocated
        before an RM restart or failover): re-adopt it when it belongs to a kept attempt, charging
        it to its app, queue and node as at allocation; pass a completion on to that attempt's AM;
        have the NM clean up any other (YARN's work-preserving NM resync)."""
        running = s.state != ContainerState.COMPLETE.value
        try:
            cid = ContainerId.parse(s.container_id)
        except ValueError:
            cid = None
        at = self.attempts.get(str(cid.attempt)) if cid is not None else None
        app = self.apps.get(at.app_id) if at is not None else None
        if app is not None and at is not None and app.keep_containers and at.attempt_id != app.current_attempt:
            # An app that keeps containers: an earlier attempt's container that its next attempt
            # took over (its id still names the attempt that was granted it).
            cur = self.attempts.get(app.current_attempt or "")
            if cur is not None and s.container_id in cur.previous_containers:
                at = cur
        # Only an earlier RM's containers (another epoch) are adopted: one of this RM's own that it
        # no longer knows was completed here (its node was lost, it expired) and its AM was told.
        if (at is None or app is None or cid is None or cid.epoch == self.container_epoch
                or not self._is_current(app, at) or at.state == AttemptState.FINISHING
                or (running and s.resource is None)):
            if running:     # an attempt that ended (or is unknown): its containers must go
                node.to_cleanup.append(s.container_id)
            return
        is_am = s.container_id == at.am_container_id
        if not running:
            if is_am:       # the AM exited while no RM heard of it: the attempt is over
                self._attempt_failed(at, f"AM Container for {at.attempt_id} exited with exitCode: "
                                         f"{s.exit_status} ({ExitStatus.describe(s.exit_status)}) while the "
                                         f"ResourceManager restarted. Diagnostics: {s.diagnostics}",
                                     counts=counts_toward_max_attempts(s.exit_status))
            elif not any(c.container_id == s.container_id for c in at.completed):
                at.completed.append(s)
            return
        assert s.resource is not None
        c = Container(s.container_id, app.app_id, at.attempt_id, node.node_id, node.http_address, s.resource,
                      self.clock(), "", tag="AM" if is_am else s.role, is_am=is_am, launched=True)
        self.containers[c.container_id] = c
        self.policy_version += 1
        node.containers.add(c.container_id)
        at.containers.add(c.container_id)
        app.nodes_used.add(node.node_id)
        self.scheduler.adopt(app.app_id, node, c.resource, is_am)
        self.counters["containers_recovered"] += 1
        if c.container_id in at.pending_release:
            # Released by the AM before its NM re-registered: now it can be cleaned up.
            at.pending_release.discard(c.container_id)
            self._release(c, cleanup_on_node=True)
            at.completed.append(api.ContainerStatus(container_id=c.container_id, state=ContainerState.COMPLETE.value,
                                                    exit_status=ExitStatus.ABORTED,
                                                    diagnostics="Container released by application"))

    def am_missing_after_resync(self, node: Node, reported: dict[str, api.ContainerStatus]) -> None:
        """A node re-registered without the AM container of a kept attempt that ran there (one not
        re-adopted yet: while an attempt lives here its AM container is known, unless it was kept
        across a restart): the AM did not survive (or never started) while the RM restarted; the
        attempt fails, not counted, and a new one starts, as an RM restart without work
        preservation would have done."""
        for aid in list(self._am_live):
            at = self.attempts[aid]
            if (at.am_node_id != node.node_id or not at.am_container_id or at.am_container_id in self.containers
                    or attempt_is_final(at.state) or at.state == AttemptState.FINISHING):
                continue
            s = reported.get(at.am_container_id)
            if s is None or s.state == ContainerState.COMPLETE.value:
                self._attempt_failed(at, f"AM container {at.am_container_id} of {aid} is not running on "
                                         f"{node.node_id} after the ResourceManager restarted" + NOT_COUNTED,
                                     counts=False)

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

    def _end_attempt(self, at: Attempt, ev: AttemptEvent, diagnostics: str, keep: bool = False) -> list[Container]:
        """Move an attempt to a final state and clean up every container it still holds -- with
        `keep`, all but its launched non-AM containers, which are returned for the next attempt
        (YARN's keep-containers-across-application-attempts)."""
        self._attempt_event(at, ev)
        at.finish_time = self.clock()
        if diagnostics:
            at.diagnostics = bounded_diagnostics(diagnostics)
        self._am_live.pop(at.attempt_id, None)
        self._am_node_wait.pop(at.attempt_id, None)
        self.scheduler.clear_demand(at.app_id)
        self.ask_shapes.pop(at.attempt_id, None)
        kept: list[Container] = []
        undelivered = {c.container_id for c in at.to_deliver}
        for cid in sorted(at.containers):
            c = self.containers.get(cid)
            if c is None:
                continue
            # Only what the AM launched goes on: one it never heard of or never started runs nothing.
            if keep and not c.is_am and c.launched and cid not in undelivered:
                kept.append(c)
            else:
                self._release(c, cleanup_on_node=True)
        at.to_deliver.clear()
        return kept

    def _previous_containers(self, at: Attempt) -> list[api.AllocatedContainer]:
        """The containers `at` took over from the failed attempt before it that still run, each with
        a container token signed afresh for this attempt (the first may have expired): what its AM
        stops them with."""
        out = []
        app = self.apps[at.app_id]
        now = self.clock()
        for cid in at.previous_containers:
            c = self.containers.get(cid)
            if c is None or c.attempt_id != at.attempt_id:
                continue
            token = tokens.sign(self.cluster.secret, tokens.CONTAINER,
                                container_token_payload(cid, c.node_id, app.app_id, at.attempt_id, app.user, c.resource),
                                self.cfg.container_token_lifetime_s, now=now)
            out.append(api.AllocatedContainer(container_id=cid, node_id=c.node_id, node_http_address=c.node_http_address,
                                              resource=c.resource, container_token=token, ask_id=c.ask_id, tag=c.tag))
        return out

    def _attempt_failed(self, at: Attempt, diagnostics: str, counts: bool = True) -> None:
        app = self.apps[at.app_id]
        if app.state.is_final or attempt_is_final(at.state):
            return
        at.counts_as_failure = counts
        failures = sum(1 for a in app.attempts if self.attempts[a].state == AttemptState.FAILED
                       and self.attempts[a].counts_as_failure) + (1 if counts else 0)
        retry = failures < app.max_attempts
        kept = self._end_attempt(at, AttemptEvent.FAIL, diagnostics, keep=retry and app.keep_containers)
        if retry:
            self._app_event(app, AppEvent.ATTEMPT_RETRY)
            # Gang admission of the next AM counts the executors it is handed (else a job that
            # lost its AM's host could wait for room its own kept executors take).
            self.scheduler.hold_gang_executors(app.app_id, len(kept))
            nxt = self._new_attempt(app)
            for c in kept:      # the next attempt owns them: their completions and releases are its
                at.containers.discard(c.container_id)
                c.attempt_id = nxt.attempt_id
                nxt.containers.add(c.container_id)
                nxt.previous_containers.append(c.container_id)
            if kept:
                self.counters["containers_kept_across_attempts"] += len(kept)
        else:
            app.final_status = FinalStatus.FAILED
            app.diagnostics = bounded_diagnostics(f"Application {app.app_id} failed {failures} times due to: "
                                                  f"{diagnostics}. Failing the application.")
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
        self.completed[app.app_id] = None       # forgotten, past the limit, by a later `tick`
        self.lifetimes.forget(app.app_id)

    # ----- containers -----------------------------------------------------------------------
    def _schedule(self, candidates: list[Node]) -> None:
        for a in self.scheduler.allocate(candidates):
            self._create_container(a.app_id, self.nodes.nodes[a.node_id], a.resource, a.ask_id, a.tag, a.is_am)

    def _create_container(self, app_id: str, node: Node, r: Resource, ask_id: int, tag: str, is_am: bool) -> None:
        app = self.apps[app_id]
        at = self.attempts[app.current_attempt or ""]
        at.container_seq += 1
        cid = str(ContainerId(AttemptId.parse(at.attempt_id), at.container_seq, self.container_epoch))
        now = self.clock()
        token = tokens.sign(self.cluster.secret, tokens.CONTAINER,
                            container_token_payload(cid, node.node_id, app_id, at.attempt_id, app.user, r),
                            self.cfg.container_token_lifetime_s, now=now)
        c = Container(cid, app_id, at.attempt_id, node.node_id, node.http_address, r, now, token,
                      ask_id=ask_id if not is_am else 0, tag=tag, is_am=is_am)
        self.containers[cid] = c
        self.policy_version += 1
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

    def _release(self, c: Container, cleanup_on_node: bool) -> bool:
        """Forget a container and give its resources back to its app and queue; optionally tell
        its NM to kill it, in which case the node keeps the resources charged until the NM
        confirms (rm/nm_protocol.py), so nothing new is placed where the old process still runs.
        True when its AM had not been handed it yet (`_undeliver`): no completion is due for it."""
        self.containers.pop(c.container_id, None)
        self.policy_version += 1
        self._unlaunched.pop(c.container_id, None)
        app = self.apps[c.app_id]
        node = self.nodes.get(c.node_id)
        now = self.clock()
        app.memory_seconds += c.resource.memory * max(0.0, now - c.allocated_at)
        app.vcore_seconds += c.resource.vcores * max(0.0, now - c.allocated_at)
        hold = cleanup_on_node and node is not None and node.state != NodeState.LOST
        self.scheduler.release(c.app_id, app.queue, app.user, None if hold else node, c.resource, c.is_am)
        at = self.attempts.get(c.attempt_id)
        undelivered = False
        if at is not None:
            at.containers.discard(c.container_id)
            if at.to_deliver and not c.is_am:
                undelivered = self._undeliver(at, c)
        if node is not None:
            node.containers.discard(c.container_id)
            if hold:
                node.hold_release(c.container_id, c.resource)
        return undelivered

    def _undeliver(self, at: Attempt, c: Container) -> bool:
        """A container released before its AM heard of it (YARN's recoverResourceRequestsForContainer):
        it leaves the next allocate response -- neither allocated nor completed there -- and, while
        the attempt goes on, its ask counts it again. False if it was delivered already."""
        for i, d in enumerate(at.to_deliver):
            if d.container_id == c.container_id:
                del at.to_deliver[i]
                break
        else:
            return False
        if attempt_is_final(at.state) or at.state == AttemptState.FINISHING:
            return True
        sa = self.scheduler.apps.get(c.app_id)
        shape = self.ask_shapes.get(at.attempt_id, {}).get(c.ask_id)
        if sa is not None and shape is not None:
            row = sa.asks.get(c.ask_id)
            self.scheduler.update_asks(c.app_id, [replace(row or shape, count=(row.count if row else 0) + 1)], {})
            self.policy_version += 1        # the app's pending demand
        return True

    def _container_completed(self, c: Container, status: api.ContainerStatus, cleanup_on_node: bool = False) -> None:
        undelivered = self._release(c, cleanup_on_node)
        at = self.attempts.get(c.attempt_id)
        if at is None:
            return
        if c.is_am:
            if at.state == AttemptState.FINISHING:
                self._attempt_event(at, AttemptEvent.CONTAINER_FINISHED)
                at.finish_time = self.clock()
                self._am_live.pop(at.attempt_id, None)
            elif not attempt_is_final(at.state):
                counts = counts_toward_max_attempts(status.exit_status)
                diagnostics = (f"AM Container for {at.attempt_id} exited with exitCode: {status.exit_status} "
                               f"({ExitStatus.describe(status.exit_status)}). Diagnostics: {status.diagnostics}")
                node = self.nodes.get(c.node_id)
                if node is not None and node.state == NodeState.LOST:
                    diagnostics = f"Attempt {at.attempt_id} was lost with its node {c.node_id}. {diagnostics}"
                if not counts:
                    diagnostics += NOT_COUNTED
                self._attempt_failed(at, diagnostics, counts=counts)
        elif not undelivered and not attempt_is_final(at.state) and at.state != AttemptState.FINISHING:
            at.completed.append(status)

