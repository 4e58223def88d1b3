"""A simulated PS job and its ApplicationMaster, talking to the RM core as a real PS AM does.

Life of a job (times from the app's calibration, sim/calibration.py):

    arrival -> submit (new-application, submit, saved)          the core queues the AM
    AM container allocated (LaunchAm effect) -> +am_start_s -> register, allocate loop starts
    asks for its workers and servers; all granted -> +startup_s -> TRAINING (report: started)
    TRAINING: epochs advance at 1 / T, T the epoch time the simulator's iteration-time model gives
      (sim/iteration_time.py: the calibrated speed function models.ps_iteration_time, slowed where
      nodes are oversubscribed) until the job's epoch count (sim/calibration.py) is reached
      -> +finish_s -> finish (SUCCEEDED), AM exits

Directives are handled with the real AM's own pure pieces (appmaster/ps/directives.py):
`DirectiveTracker` decides which to act on -- a version already seen is ignored, directives that
arrive before training starts or while a change runs are kept and only the newest is applied
after -- and `target_of` bounds the shape by the spec's min / max. A change is carried out as the
real AM does: its missing executors are asked for on exactly the directive's nodes (strict asks;
executors elsewhere are replaced), all or nothing: once every one is granted training stalls for
the reshape cost (EPS, in place) or the restart cost (elastic_mode "kill"), then goes on at the new
shape; a change whose executors do not come within the launch timeout fails and the job keeps its
shape. A directive with another `executor_resource` restarts the job at the new size (pause,
release every executor, ask again, restart cost). run_state "pause" stalls pause_s, releases every
executor and waits; "resume" (or "run" after a pause) asks for the shape again and restarts after
the restart cost. Reshape and restart costs grow with the job's model and data size
(AppCalibration.reshape_cost / restart_cost).
The job's phases follow PHASE_TRANSITIONS (a TransitionTable): an event out of place raises.

Every allocate carries a JobReport (protocol/job_report.py) with the fields a real AM fills:
shape, started / changing, iterations, early feedback (after the spec's
`early_feedback_iterations`), speed over the iterations since the last reshape, executor resource,
the directive version acted on, phase, epochs with their times and objectives (the measured run's
where it has them, the curve beyond: the same ones the job's epoch count comes from) and per-worker
compute / communication times split as the epoch-time model does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, Optional, Union

import numpy as np

from models.optimus_fit import LossCurve as FittedCurve
from models.optimus_fit import fit_loss_curve
from protocol import internal_api as api
from protocol import ps_job_spec
from protocol.job_report import (MAX_EPOCH_TIMES, MAX_OBJECTIVES, ClockObjective, EpochObjective, JobReport,
                                 ServerTiming, WorkerTiming, recent_clock_objectives)
from protocol.records import FinalStatus, Resource
from appmaster.ps.directives import DEFAULT_EARLY_FEEDBACK_ITERATIONS, DirectiveTracker, Shape, TrackerState, target_of
from protocol.state_machine import TransitionTable
from rm.model import AmSpec

from .calibration import AppCalibration
from .convergence import LossCurve
from .job_record import JobRecord
from .optimus_truth import JobTruth
from .event_loop import EventLoop
from .sim_node import SimNode
from .trace import TraceJob
from protocol.errors import StateError

ObjectiveCurve = Union[FittedCurve, LossCurve]     # either has loss(k): the shape is all that is used

if TYPE_CHECKING:
    from rm.core import LaunchAm, ResourceManagerCore

WORKER, SERVER = "worker", "server"
CLOCK_OBJECTIVE_EVERY = 1 / 8     # of an epoch: how often a simulated AM samples its objective
CLOCK_SHAPE_EPOCHS = 10           # the first epochs whose objectives shape the per-clock ones
ASK_ID = {WORKER: 1, SERVER: 2}
# The real AM's wait for a change's new executors (appmaster/ps/reconfiguration.py LAUNCH_TIMEOUT_S;
# not imported: that module pulls in the AM's I/O).
LAUNCH_TIMEOUT_S = 120.0


class Phase(str, Enum):
    """Where a simulated job is (the real AM's phase names where it has them)."""

    SUBMITTED = "SUBMITTED"
    GATHERING = "STARTING"          # the real AM's phase names (appmaster.ps.job.JobPhase)
    LAUNCHING = "LAUNCHING"
    TRAINING = "TRAINING"
    RESHAPING = "RESHAPING"
    PAUSING = "PAUSING"
    PAUSED = "PAUSED"
    FINISHING = "FINISHING"
    DONE = "SUCCEEDED"


class PhaseEvent(str, Enum):
    """What moves a simulated job on (module doc)."""

    REGISTER = "register"           # the AM registered: it asks for its executors
    GATHERED = "gathered"           # it holds the target shape: (re)start after startup_s / restart_s
    STARTED = "started"             # training starts
    RESHAPE = "reshape"             # the executors held differ from the active shape: stall
    RESHAPED = "reshaped"
    PAUSE = "pause"                 # a directive's run state PAUSE
    PAUSED = "paused"               # pause_s later: every executor released
    RESUME = "resume"               # a directive's RESUME (or RUN) while paused
    CONVERGE = "converge"           # the loss curve met the threshold: finishing
    STOP = "stop"                   # finished or killed (the RM's SHUTDOWN)


class SimPhaseError(StateError, RuntimeError):
    """An event the simulated job's phase does not take (a simulator bug)."""

    def __init__(self, phase: Phase, event: PhaseEvent):
        super().__init__(f"sim job: {event.value} not allowed in phase {phase.value}")


_P, _PE = Phase, PhaseEvent
PHASE_TRANSITIONS: TransitionTable[Phase, PhaseEvent, Phase] = TransitionTable({
    (_P.SUBMITTED, _PE.REGISTER): _P.GATHERING,
    (_P.GATHERING, _PE.GATHERED): _P.LAUNCHING,
    (_P.LAUNCHING, _PE.STARTED): _P.TRAINING,
    (_P.TRAINING, _PE.RESHAPE): _P.RESHAPING,
    (_P.RESHAPING, _PE.RESHAPED): _P.TRAINING,
    (_P.TRAINING, _PE.PAUSE): _P.PAUSING,
    (_P.RESHAPING, _PE.PAUSE): _P.PAUSING,
    (_P.PAUSING, _PE.PAUSED): _P.PAUSED,
    (_P.PAUSED, _PE.RESUME): _P.GATHERING,
    (_P.TRAINING, _PE.CONVERGE): _P.FINISHING,
    # The RM may shut the AM down in any phase once it allocates; a finish scheduled before such a
    # shutdown still runs, so DONE takes STOP again.
    **{(p, _PE.STOP): _P.DONE for p in Phase if p is not _P.SUBMITTED},
}, SimPhaseError)


@dataclass(frozen=True)
class JobTimings:
    """How often a simulated AM talks to the RM (the real AM's defaults: appmaster/am_client.py)."""

    allocate_interval_s: float = 1.0
    pending_interval_s: float = 0.25
    am_memory_mb: int = 512
    # How long a change waits for the executors it asked for before it gives up and the job goes
    # on at the shape it had (the real AM's launch timeout, appmaster/ps/reconfiguration.py).
    launch_timeout_s: float = LAUNCH_TIMEOUT_S


@dataclass(frozen=True)
class Held:
    """One executor container the job holds: its role, node and size."""

    role: str
    node: str
    resource: Resource


class SimJob:
    """One trace job: submits itself to the core, then plays its AM (see the module doc).

    `on_load_change` is called whenever the executors this job trains on change (it starts,
    reshapes, pauses, finishes): the simulator then asks its iteration-time model for every
    training job's epoch time again (sim/iteration_time.py) and calls `set_epoch_time`."""

    def __init__(self, job: TraceJob, cal: AppCalibration, loop: EventLoop, core: "ResourceManagerCore",
                 nodes: dict[str, SimNode], timings: JobTimings = JobTimings(),
                 on_done: Callable[["SimJob"], None] = lambda j: None,
                 on_load_change: Callable[["SimJob"], None] = lambda j: None):
        self.job, self.cal, self.loop, self.core, self.nodes = job, cal, loop, core, nodes
        self.timings = timings
        self.on_done = on_done
        self.on_load_change = on_load_change
        self.model = cal.epoch_model()
        self.curve = cal.curve()
        max_epochs = job.max_epochs or int(job.hparams.get("max_epochs", cal.max_epochs))
        self.max_epochs = max_epochs
        self.target_epochs = cal.epochs_to_converge(job.threshold, max_epochs)
        self.spec = self._spec()
        # The job's parameter state (a trace may set it; the app's reference model otherwise).
        self.model_mb = job.model_mb if job.model_mb is not None else cal.model_mb
        self.record = JobRecord(job.name, job.app, job.user, job.queue, target_epochs=self.target_epochs)
        self.phase = Phase.SUBMITTED
        self.app_id = ""
        self.attempt_id = ""
        self.am_container = ""
        self.am_node = ""
        self.response_id = 0
        self.containers: dict[str, Held] = {}
        self.active = (0, 0)                                  # (workers, servers) training now
        self.active_ids: tuple[str, ...] = ()                 # the containers training now
        self.target = (job.workers, job.servers)
        # The real AM's pieces: which directive to act on when (version check, one change at a
        # time, directives kept until training starts) and the executors' size now.
        self.tracker = DirectiveTracker()
        self.change: Optional[api.ShapeDirective] = None      # the directive being carried out
        self.change_since = 0.0
        self.restarting = False                               # a pause that resumes at once (new size)
        self.allowed_nodes: tuple[str, ...] = ()              # a directive's placement: only these
        # ... and how many of each role on each of them, where it says (the real AM starts placed
        # executors node by node: appmaster/ps/reconfiguration.py start_placed); {}: counts per role.
        self.per_node: dict[str, tuple[int, int]] = {}
        self._ask_ids: set[int] = set()                       # ask rows sent last (withdrawn when dropped)
        self.executor_resource = Resource(job.executor_memory_mb, job.executor_vcores)
        self.run_state = api.RunState.RUN
        self.releases: list[str] = []
        self.epochs = 0.0
        self.rate = 0.0                                       # epochs per second now
        self.epoch_s = 0.0                                    # the epoch time now (contention included)
        self.last_t = 0.0
        self.generation = 0                                   # invalidates scheduled convergence events
        self.iterations_at_reshape = 0
        self.epoch_times: list[float] = []
        self._reported_epochs = 0
        self._report: Optional[JobReport] = None
        self._clock_points: list[tuple[int, float, float]] = []     # (clock, epochs, objective)
        self._clock_report: Optional[list[ClockObjective]] = None
        self._clock_shape: Optional[ObjectiveCurve] = None
        self._allocating = False

    # ----- submission and AM start ------------------------------------------------------------
    def _spec(self) -> ps_job_spec.PSJobSpec:
        j = self.job
        mins = j.shape_min
        return ps_job_spec.PSJobSpec(
            app=j.app, hparams=dict(j.hparams), workers=j.workers, servers=j.servers,
            max_workers=j.shape_max[0], max_servers=j.shape_max[1], min_workers=mins[0], min_servers=mins[1],
            sync=j.sync, convergence_threshold=j.threshold, executor_memory_mb=j.executor_memory_mb,
            executor_vcores=j.executor_vcores, elastic_mode=j.elastic_mode, max_epochs=self.max_epochs,
            early_feedback_iterations=j.early_feedback_iterations or DEFAULT_EARLY_FEEDBACK_ITERATIONS,
            weight=j.weight)

    def spec_json(self) -> dict[str, object]:
        """The PS job spec the job is submitted with (what `elastane ps submit` would send). It
        carries the epoch limit the simulator stops the job at, so a policy sees the same one."""
        return self.spec.to_json()

    def submit(self) -> None:
        self.record.arrival = self.loop.now
        core = self.core
        self.app_id = core.new_application()
        self.record.app_id = self.app_id
        am = AmSpec([ps_job_spec.AM_COMMAND], {}, {}, Resource(self.timings.am_memory_mb, 1))
        core.submit(self.app_id, self.job.user, self.job.name, self.job.queue, ps_job_spec.APPLICATION_TYPE, am,
                    1, ps_job=self.spec)
        core.app_saved(self.app_id)

    def am_launched(self, effect: "LaunchAm") -> None:
        """The core allocated the AM container: start it on its node; it registers after am_start_s."""
        self.attempt_id = effect.attempt_id
        self.am_container = effect.container.container_id
        self.am_node = effect.container.node_id
        self.nodes[self.am_node].start(self.am_container, self.app_id)
        self.core.am_launched(self.attempt_id)
        self.loop.after(self.cal.am_start_s, self._register)

    @property
    def claims(self) -> dict[str, str]:
        return {"app_id": self.app_id, "attempt_id": self.attempt_id, "user": self.job.user}

    def _register(self) -> None:
        if self.phase is not Phase.SUBMITTED:
            return      # shut down before it registered
        self.core.am_register(self.claims, api.AmRegisterRequest(tracking_url=f"http://sim/{self.app_id}"))
        self.record.am_start = self.loop.now
        self._on(PhaseEvent.REGISTER)
        self._allocating = True
        self._allocate()

    def _on(self, event: PhaseEvent) -> None:
        """Take `event` through PHASE_TRANSITIONS (SimPhaseError if the phase does not take it)."""
        self.phase = PHASE_TRANSITIONS.next(self.phase, event)

    # ----- the allocate loop ------------------------------------------------------------------
    def _usable(self, h: Held) -> bool:
        """An executor the target shape can use: of the current size, on an allowed node."""
        return h.resource == self.executor_resource and (not self.allowed_nodes or h.node in self.allowed_nodes)

    def _chosen(self) -> list[str]:
        """The usable containers the shape counts (oldest first): with a per-node placement, up to
        each node's count per role (executors beyond a node's share are not the shape's)."""
        taken: dict[tuple[str, str], int] = {}
        out = []
        for cid in sorted(self.containers):
            h = self.containers[cid]
            if not self._usable(h):
                continue
            if self.per_node:
                quota = self.per_node.get(h.node, (0, 0))[0 if h.role == WORKER else 1]
                if taken.get((h.node, h.role), 0) >= quota:
                    continue
                taken[(h.node, h.role)] = taken.get((h.node, h.role), 0) + 1
            out.append(cid)
        return out

    def _held(self) -> tuple[int, int]:
        """Usable executors held per role (module doc: placement and size are obeyed)."""
        roles = [self.containers[c].role for c in self._chosen()]
        return roles.count(WORKER), roles.count(SERVER)

    def _wanted(self) -> tuple[int, int]:
        """Executors the job should hold now: none while paused or finishing, else the target."""
        if self.phase in (Phase.PAUSED, Phase.PAUSING, Phase.FINISHING, Phase.DONE):
            return (0, 0)
        return self.target

    def _asks(self) -> list[api.ResourceAsk]:
        held = self._held()
        want = self._wanted()
        r = self.executor_resource
        if self.per_node and want != (0, 0):
            # One strict ask per node and role for what that node still lacks (ask ids 3, 4, 5, ...).
            have: dict[tuple[str, str], int] = {}
            for c in self._chosen():
                h = self.containers[c]
                have[(h.node, h.role)] = have.get((h.node, h.role), 0) + 1
            asks = [api.ResourceAsk(ask_id=ASK_ID[role] + 2 * (i + 1), count=max(0, quota[k] - have.get((node, role), 0)),
                                    resource=r, tag=role, nodes=[node], relax_locality=False)
                    for i, (node, quota) in enumerate(sorted(self.per_node.items()))
                    for k, role in enumerate((WORKER, SERVER))]
        else:
            # A directive's nodes are obeyed, as the real AM's strict asks obey them (no relaxing).
            nodes = list(self.allowed_nodes)
            asks = [api.ResourceAsk(ask_id=ASK_ID[role], count=max(0, want[i] - held[i]), resource=r,
                                    tag=role, nodes=nodes, relax_locality=not nodes)
                    for i, role in enumerate((WORKER, SERVER))]
        # The core keeps an ask row until told otherwise: rows no longer wanted are withdrawn.
        ids = {a.ask_id for a in asks}
        asks += [api.ResourceAsk(ask_id=x, count=0, resource=r, tag=WORKER if x % 2 else SERVER)
                 for x in sorted(self._ask_ids - ids)]
        self._ask_ids = ids
        return asks

    def _allocate(self) -> None:
        if not self._allocating:
            return
        self._advance()
        self._check_launch_timeout()
        asks = self._asks()
        releases, self.releases = self.releases, []
        self.response_id += 1
        req = api.AllocateRequest(response_id=self.response_id, asks=asks, releases=releases,
                                  progress=min(1.0, self.epochs / max(1, self.target_epochs)), shape=self.report())
        resp = self.core.allocate(self.claims, req)
        if resp.action == "SHUTDOWN":
            self._stop("KILLED")
            return
        self.response_id = resp.response_id
        for c in resp.allocated:
            role = c.tag if c.tag in ASK_ID else WORKER
            self.containers[c.container_id] = Held(role, c.node_id, c.resource)
            self.nodes[c.node_id].start(c.container_id, self.app_id)
        for st in resp.completed:
            self.containers.pop(st.container_id, None)
        if resp.shape_directive is not None:
            d = self.tracker.offer(resp.shape_directive)
            if d is not None:
                self._apply(d)
        self._progress_shape()
        pending = any(a.count for a in asks)
        self.loop.after(self.timings.pending_interval_s if pending else self.timings.allocate_interval_s,
                        self._allocate)

    # ----- directives: one at a time, as appmaster/ps/directives.py's DirectiveHandler -------------
    def _apply(self, d: api.ShapeDirective) -> None:
        """Carry out the directive the tracker handed over (the real AM's `DirectiveHandler._apply`)."""
        self.change, self.change_since = d, self.loop.now
        if self.phase in (Phase.FINISHING, Phase.DONE):
            self._change_done()              # converged: nothing left to reshape or pause
            return
        target = target_of(d, self.spec.max_workers, self.spec.max_servers, self.spec.min_workers,
                           self.spec.min_servers)
        if d.run_state is api.RunState.PAUSE and self.phase in (Phase.TRAINING, Phase.RESHAPING):
            self.target = (target.workers, target.servers)
            self._pause()
            return
        if self.phase is Phase.PAUSED:
            if d.run_state is api.RunState.PAUSE:
                self._change_done()          # already paused
                return
            self._set_target(d, target)
            self.run_state = d.run_state
            self._on(PhaseEvent.RESUME)      # asks for the target again, restarts once it holds it
            return
        if d.executor_resource is not None and d.executor_resource != self.executor_resource:
            # Executors of another size are new containers, every one: the job restarts from a
            # checkpoint (the real AM pauses and resumes at the new size).
            self._set_target(d, target)
            self.restarting = True
            self._pause()
            return
        self._set_target(d, target)
        if self.phase is not Phase.TRAINING:
            self._change_done()
            return
        if self._placed_as_asked():
            self._change_done()              # already that shape, where it should be

    def _set_target(self, d: api.ShapeDirective, target: Shape) -> None:
        self.target = (target.workers, target.servers)
        self.allowed_nodes = tuple(d.nodes)
        per_node = {p.node: (p.workers, p.servers) for p in d.placement}
        placed = (sum(w for w, _ in per_node.values()), sum(x for _, x in per_node.values()))
        self.per_node = per_node if per_node and placed == self.target else {}
        if d.executor_resource is not None:
            self.executor_resource = d.executor_resource

    def _placed_as_asked(self) -> bool:
        chosen = set(self._chosen())
        return self.active == self.target and all(c in chosen for c in self.active_ids if c in self.containers)

    def _change_done(self) -> None:
        """The running change ended: the tracker hands over the directive kept meanwhile, if any."""
        if self.change is None:
            return
        self.change = None
        nxt = self.tracker.done()
        if nxt is not None:
            self._apply(nxt)

    def _check_launch_timeout(self) -> None:
        """A change whose executors did not come within the launch timeout fails, as the real AM's
        does (LaunchFailed): the job goes on at its shape, the asks are withdrawn and what was
        granted for the change is released (the real AM retires what started)."""
        if (self.change is not None and self.phase is Phase.TRAINING
                and self.loop.now - self.change_since > self.timings.launch_timeout_s):
            self.target = self.active
            self.allowed_nodes = ()
            self.per_node = {}
            for cid in [c for c in self.containers if c not in self.active_ids]:
                self._release(cid)
            self._change_done()

    def _progress_shape(self) -> None:
        """Move the job on once it holds what it waits for (start, reshape, resume)."""
        held = self._held()
        have_all = held[0] >= self.target[0] and held[1] >= self.target[1]
        if self.phase is Phase.GATHERING and have_all:
            resuming = self.record.start is not None
            self._on(PhaseEvent.GATHERED)
            self.loop.after(self._restart_cost() if resuming else self.cal.startup_s, self._start_training)
        elif self.phase is Phase.TRAINING and self.change is not None and have_all and not self._placed_as_asked():
            # All or nothing, as the real AM's reshape: it starts once every new executor is up.
            self._reshape()

    # ----- training ---------------------------------------------------------------------------
    def _start_training(self) -> None:
        if self.phase != Phase.LAUNCHING:
            return
        self._drop_extra(self.target)
        if self.record.start is None:
            self.record.start = self.loop.now
        self._on(PhaseEvent.STARTED)
        self._set_shape(self.target)
        resumed = self.change is not None
        first = self.tracker.ready() if self.tracker.state is TrackerState.WAITING else None
        if resumed:
            self.restarting = False
            self._change_done()
        if first is not None:
            self._apply(first)

    def _set_shape(self, shape: tuple[int, int]) -> None:
        self._advance()
        self.active = shape
        self.active_ids = self._pick(shape)
        self.iterations_at_reshape = self.iterations
        self.record.shapes.append((self.loop.now, shape[0], shape[1]))
        training = self.phase == Phase.TRAINING and shape[0] >= 1 and shape[1] >= 1
        self.epoch_s = self.solo_epoch_s if training else 0.0
        self._set_rate(1.0 / self.epoch_s if training else 0.0)
        self.on_load_change(self)

    @property
    def solo_epoch_s(self) -> float:
        """The epoch time at the active shape alone on idle nodes (the calibrated speed function)."""
        w, s = self.active
        return self.model.epoch_time(w, s, self.job.data_scale) if w >= 1 and s >= 1 else 0.0

    @property
    def training(self) -> bool:
        return self.phase is Phase.TRAINING and self.rate > 0.0

    def set_epoch_time(self, epoch_s: float) -> None:
        """The iteration-time model's epoch time where the job runs now (contention included)."""
        if self.phase is not Phase.TRAINING or epoch_s <= 0.0 or abs(epoch_s - self.epoch_s) <= 1e-12:
            return
        self.epoch_s = epoch_s
        self._set_rate(1.0 / epoch_s)

    def truth(self) -> JobTruth:
        """What only the simulator knows of the job, for the optimus-truth policy (sim/optimus_truth.py)."""
        self._advance()
        return JobTruth(remaining_epochs=max(0.0, self.target_epochs - self.epochs),
                        theta=tuple(t * self.job.data_scale for t in self.model.theta),
                        change_cost_s=self._restart_cost() if self.job.elastic_mode == "kill" else self._reshape_cost(),
                        busy=self.change is not None or self.phase is not Phase.TRAINING)

    def training_executors(self) -> list[tuple[str, Held]]:
        """The containers the job trains on now (none unless it trains)."""
        if not self.training:
            return []
        return [(c, self.containers[c]) for c in self.active_ids if c in self.containers]

    def _pick(self, shape: tuple[int, int]) -> tuple[str, ...]:
        """The usable containers that make up `shape` (the oldest of each role first, within each
        node's share where the placement gives one)."""
        keep = {WORKER: shape[0], SERVER: shape[1]}
        out = []
        for cid in self._chosen():
            h = self.containers[cid]
            if keep[h.role] > 0:
                keep[h.role] -= 1
                out.append(cid)
        return tuple(out)

    def _reshape(self) -> None:
        """Stall for the reshape (EPS) or restart (kill-based) cost, then train at the new shape."""
        self._on(PhaseEvent.RESHAPE)
        self.record.reshapes += 1
        self._set_rate(0.0)
        self.on_load_change(self)
        self.loop.after(self._restart_cost() if self.job.elastic_mode == "kill" else self._reshape_cost(),
                        self._reshaped)

    def _reshape_cost(self) -> float:
        return self.cal.reshape_cost(self.model_mb, self.job.data_scale)

    def _restart_cost(self) -> float:
        return self.cal.restart_cost(self.model_mb, self.job.data_scale)

    def _reshaped(self) -> None:
        if self.phase != Phase.RESHAPING:
            return
        self._drop_extra(self.target)
        self._on(PhaseEvent.RESHAPED)
        self._set_shape(self.target)
        self._change_done()

    def _drop_extra(self, shape: tuple[int, int]) -> None:
        """Release executors beyond `shape`, and those of the wrong size or on a node the placement
        leaves out (the newest of a role go first, as the real AM removes them)."""
        keep = set(self._pick(shape))
        for cid in sorted(self.containers, reverse=True):
            if cid not in keep:
                self._release(cid)

    def _release(self, cid: str) -> None:
        self.containers.pop(cid, None)
        self.releases.append(cid)

    def _pause(self) -> None:
        self._on(PhaseEvent.PAUSE)
        self.record.pauses += 1
        self._set_rate(0.0)
        self.on_load_change(self)
        self.loop.after(self.cal.pause_s, self._paused)

    def _paused(self) -> None:
        if self.phase != Phase.PAUSING:
            return
        for cid in list(self.containers):
            self._release(cid)
        self._on(PhaseEvent.PAUSED)
        self._set_shape((0, 0))
        if self.restarting:
            self._on(PhaseEvent.RESUME)      # a restart at a new executor size: ask again at once
        else:
            self._change_done()

    @property
    def iterations(self) -> int:
        return int(self.epochs * self.cal.clocks_per_epoch)

    def _advance(self) -> None:
        now = self.loop.now
        if self.rate > 0.0:
            self.epochs = min(float(self.target_epochs), self.epochs + self.rate * (now - self.last_t))
        self.last_t = now

    def _set_rate(self, rate: float) -> None:
        self._advance()
        self.rate = rate
        self.generation += 1
        self._report = None
        if rate > 0.0:
            left = max(0.0, self.target_epochs - self.epochs)
            self.loop.after(left / rate, self._maybe_converged, self.generation)

    def _maybe_converged(self, generation: int) -> None:
        if generation != self.generation or self.phase != Phase.TRAINING:
            return
        self._advance()
        self.epochs = float(self.target_epochs)
        self._on(PhaseEvent.CONVERGE)
        self._set_rate(0.0)
        self.on_load_change(self)
        self.loop.after(self.cal.finish_s, self._finish)

    def _finish(self) -> None:
        if self.phase is Phase.DONE:
            return
        self._advance()
        self.core.am_finish(self.claims, api.AmFinishRequest(final_status=FinalStatus.SUCCEEDED.value,
                                                             diagnostics="converged (simulated)"))
        self.containers.clear()
        self.nodes[self.am_node].exit(self.am_container)
        self._stop("SUCCEEDED")

    def _stop(self, status: str) -> None:
        was_training = self.training
        self._allocating = False
        self._on(PhaseEvent.STOP)
        self.rate = 0.0
        self.generation += 1
        self.record.end = self.loop.now
        self.record.final_status = status
        self.record.epochs = int(self.epochs)
        if was_training:
            self.on_load_change(self)
        self.on_done(self)

    # ----- the job report ---------------------------------------------------------------------
    def report(self) -> JobReport:
        """The JobReport a real AM would send now (rebuilt when an epoch ends or the shape changes)."""
        done = int(math.floor(self.epochs + 1e-9))
        if self._report is not None and done == self._reported_epochs:
            self._report.iterations = self.iterations
            self._report.speed_iterations = max(0, self.iterations - self.iterations_at_reshape)
            self._report.early_feedback = self.iterations >= self.early_feedback_iterations
            self._report.clock_objectives = self.clock_objectives()
            # A change starts and ends between epochs: a stale `changing` made a job carrying out a
            # reshape look idle to the policies and the queue reclaim (which then shrank it anyway).
            self._report.changing = self.phase == Phase.RESHAPING or self.change is not None
            self._report.phase = self.phase.value
            self._report.directive_version = self.tracker.applied_version
            return self._report
        w, s = self.active
        epoch_s = self.epoch_s if w >= 1 and s >= 1 else 0.0
        if done > self._reported_epochs and epoch_s > 0.0:
            self.epoch_times = (self.epoch_times + [epoch_s] * min(done - self._reported_epochs, MAX_EPOCH_TIMES))[
                -MAX_EPOCH_TIMES:]
        self._reported_epochs = done
        first = max(1, done - MAX_OBJECTIVES + 1)
        # Reports number epochs from 0 (the objective after k epochs is epoch k - 1's).
        objectives = [EpochObjective(e - 1, self.cal.objective(e)) for e in range(first, done + 1)]
        # The compute share of the epoch as the speed function splits it, slowed as the whole epoch is.
        slow = epoch_s / self.solo_epoch_s if epoch_s > 0.0 and self.solo_epoch_s > 0.0 else 1.0
        compute = self.model.theta[0] * self.job.data_scale / w * slow if w >= 1 else 0.0
        per_clock = 1.0 / self.cal.clocks_per_epoch
        iterations = self.iterations
        speed_its = max(0, iterations - self.iterations_at_reshape)
        self._report = JobReport(
            workers=w, servers=s, started=self.record.start is not None,
            changing=self.phase == Phase.RESHAPING or self.change is not None, iterations=iterations,
            early_feedback=iterations >= self.early_feedback_iterations,
            early_feedback_iterations=self.early_feedback_iterations,
            speed=(self.cal.clocks_per_epoch / epoch_s) if epoch_s > 0.0 and self.rate > 0.0 else 0.0,
            speed_iterations=speed_its,
            executor_resource=self.executor_resource,
            directive_version=self.tracker.applied_version, phase=self.phase.value,
            epoch=done - 1 if done >= 1 else None, epoch_time_s=self.epoch_times[-1] if self.epoch_times else None,
            objective=self.cal.objective(done) if done >= 1 else None, epoch_times=list(self.epoch_times),
            initial_objective=self.cal.objective(0), objectives=objectives,
            clock_objectives=self.clock_objectives(),
            worker_times=WorkerTiming(compute_s=compute * per_clock, comm_s=max(0.0, epoch_s - compute) * per_clock,
                                      workers=w),
            server_times=ServerTiming(service_s=0.0, servers=0))
        return self._report

    def clock_objectives(self) -> list[ClockObjective]:
        """The objective every `CLOCK_OBJECTIVE_EVERY` of an epoch's clocks so far (what an AM
        sampling its training loss per clock would report, JobReport.clock_objectives): between
        two epochs' objectives it follows the shape of an Optimus curve through the job's own
        objectives (`clock_shape`), so it meets each epoch's exactly and falls fastest early in an
        epoch where the objectives do (a straight line from the initial objective to the first
        epoch's would be a shape no SGD loss has)."""
        cpe = self.cal.clocks_per_epoch
        step = max(1, int(cpe * CLOCK_OBJECTIVE_EVERY))
        points = self._clock_points
        if points and points[-1][0] > self.iterations:
            points.clear()                     # back to an earlier clock
        clock = points[-1][0] + step if points else step
        if clock > self.iterations and self._clock_report is not None:
            return self._clock_report          # nothing new since the last report
        curve = self.clock_shape()
        while clock <= self.iterations:
            k = clock / cpe
            lo = int(math.floor(k))
            at_lo, at_hi = self.cal.objective(lo), self.cal.objective(lo + 1)
            c_lo, c_hi = float(curve.loss(lo)), float(curve.loss(lo + 1))
            frac = (float(curve.loss(k)) - c_lo) / (c_hi - c_lo) if c_hi != c_lo else k - lo
            points.append((clock, k, at_lo + (at_hi - at_lo) * frac))
            clock += step
        self._clock_report = recent_clock_objectives(points)
        return self._clock_report

    def clock_shape(self) -> ObjectiveCurve:
        """The Optimus curve fitted to the objectives the job reports at its first epochs, initial
        included (models/optimus_fit.py, least squares on the objective itself: its initial drop
        counts), else the app's curve."""
        if self._clock_shape is None:
            ks = np.arange(0, CLOCK_SHAPE_EPOCHS + 1, dtype=float)
            fitted = fit_loss_curve(ks, np.array([self.cal.objective(int(k)) for k in ks]))
            self._clock_shape = fitted if fitted is not None else self.cal.curve()
        return self._clock_shape

    @property
    def early_feedback_iterations(self) -> int:
        """The job spec's (EPS §2.1: the user sets how many iterations make early feedback)."""
        return self.spec.early_feedback_iterations


__all__ = ["Held", "JobTimings", "PHASE_TRANSITIONS", "Phase", "PhaseEvent", "SimJob", "SimPhaseError"]
