"""A simulated PS job and its ApplicationMaster, talking to the RM core as a real PS AM does and
deciding what to do with the real AM's own controller (appmaster/ps/controller).

The simulated AM is an interpreter of the controller, as the real AM is: it turns what happens to
the job in the simulation into the controller's events and carries out the instructions that come
back, charging each step its calibrated cost (sim/step_costs.py). The job's phases are therefore
the controller's (appmaster.ps.controller.Phase, one lifecycle TransitionTable); this module keeps
none of its own. What the simulated AM does:

    arrival -> submit (new-application, submit, saved)          the core queues the AM
    AM container allocated (LaunchAm effect) -> +am_start_s -> register    -> Registered
    every allocate: granted containers -> ContainersAllocated (LaunchExecutor starts each on its
      node: ExecutorReady), completed ones -> ContainersCompleted (a loss unless retired), a new
      shape directive -> DirectiveArrived, SHUTDOWN -> StopRequested
    training: epochs advance at 1 / T, T the epoch time the simulator's iteration-time model gives
      (sim/iteration_time.py); each epoch's end -> ClockDone + EpochDone (its calibrated objective);
      the job's epoch count (sim/calibration.py) reached -> TrainingEnded

    StartExecutors     ask rows to the RM core (one strict row per node for `per_node`, strict on
                       `nodes`, else anywhere); StepDone once every executor is granted and up,
                       StepFailed after the launch timeout (not for the job's first executors)
    RetireExecutors    release the containers (at the step's end)
    PauseTraining / ResumeTraining   stop / restart epoch progress
    WriteCheckpoint    remembers the epochs trained (RestoreCheckpoint goes back to them)
    AdoptExecutors     StepFailed: no simulated attempt leaves executors to take over
    RebuildServers     the lost servers' blocks to their replacements (after its share of the cost)
    other steps        StepDone after their share of the change's calibrated cost; training stalls
                       while any step but StartExecutors runs (EPS: reshape_cost, as before)
    ReportProgress     the job report every allocate carries says it (changing, directive version)
    Finish             unregister (SUCCEEDED / FAILED) or, stopped, just end

Every allocate carries a JobReport (protocol/job_report.py) with the fields a real AM fills:
shape, started / changing, iterations, early feedback (after the spec's
`early_feedback_iterations`), speed over the iterations since the last reshape, executor resource,
the directive version acted on, the controller's phase, epochs with their times and objectives (the
measured run's where it has them, the curve beyond: the same ones the job's epoch count comes from)
and per-worker compute / communication times split as the epoch-time model does.

`replay_directives` (sim/am_replay.py) replays given directives at given times on one simulated job
and returns its (phase, instruction kind) log: what a cluster test compares with the real AM's.
Inputs from outside the controller that the simulator does not model come in through `outside`
(a scale request at the AM's endpoint, a plan Cruise's optimizer proposed) and `plans` (the ops
Cruise's optimizer answers a ComputePlan step with); without them, ComputePlan fails: the
simulator runs no Cruise optimizer.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Union

import numpy as np

from appmaster.ps.controller import Phase, handle
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.records import ExecutorInfo, Holdings, PlanOp, Role
from appmaster.ps.controller.state import Change, ChangeKind, ExecutorState, JobState
from appmaster.ps.job_progress import DEFAULT_EARLY_FEEDBACK_ITERATIONS
from models.optimus_fit import LossCurve as FittedCurve
from models.optimus_fit import fit_loss_curve
from protocol import internal_api as api
from protocol import ps_job_spec
from protocol.job_report import (MAX_EPOCH_TIMES, MAX_OBJECTIVES, ClockObjective, EpochObjective, JobReport,
                                 ServerTiming, WorkerTiming, recent_clock_objectives)
from protocol.json_types import JsonObject
from protocol.records import Resource
from psruntime.apps.random_streams import partition_block_range
from rm.model import AmSpec

from .calibration import AppCalibration
from .convergence import LossCurve
from .event_loop import EventLoop
from .job_record import JobRecord
from .optimus_truth import JobTruth
from .sim_node import SimNode
from .step_costs import step_cost
from .trace import TraceJob

ObjectiveCurve = Union[FittedCurve, LossCurve]     # either has loss(k): the shape is all that is used

if TYPE_CHECKING:
    from rm.core import LaunchAm, ResourceManagerCore

WORKER, SERVER = Role.WORKER.value, Role.SERVER.value
CLOCK_OBJECTIVE_EVERY = 1 / 8     # of an epoch: how often a simulated AM samples its objective
CLOCK_SHAPE_EPOCHS = 10           # the first epochs whose objectives shape the per-clock ones
# The real AM's wait for a change's new executors (appmaster/ps/reconfiguration.py LAUNCH_TIMEOUT_S;
# not imported: that module pulls in the AM's I/O).
LAUNCH_TIMEOUT_S = 120.0
# The change whose StartExecutors waits as long as it takes: a job's first executors (the AM
# starts them without a launch timeout; every later change has one, and its planner decides what a
# failure means: a resume retries, a newer directive kept meanwhile supersedes it).
WAITS_FOR_EXECUTORS = frozenset({ChangeKind.START})
# Apps that keep training state on their workers (appmaster/ps/reconfiguration.keeps_worker_state:
# per-block local state); the controller plans their checkpoints and recoveries accordingly.
KEEPS_WORKER_STATE = frozenset({"nmf", "lda"})
# Input splits per worker of the job's largest shape when the job's data has fewer input blocks
# than that (or none known: a user app): the simulated data is split at least this finely, so the
# controller's EPS planner always has splits to hand new workers.
SPLITS_PER_WORKER = 8
CONVERGED = "converged (simulated)"


@dataclass(frozen=True)
class JobTimings:
    """How often a simulated AM talks to the RM (the real AM's defaults: appmaster/am_client.py)."""

    allocate_interval_s: float = 1.0
    pending_interval_s: float = 0.25
    am_memory_mb: int = 512
    # How long a change waits for the executors it asked for before its StartExecutors fails (the
    # real AM's launch timeout, appmaster/ps/reconfiguration.py).
    launch_timeout_s: float = LAUNCH_TIMEOUT_S


@dataclass(frozen=True)
class Held:
    """One executor container the job holds: its role, node and size."""

    role: str
    node: str
    resource: Resource


@dataclass
class _AskRow:
    """One ask row a StartExecutors step sent the RM: `count` of `role` on `nodes` (strict) or anywhere."""

    ask_id: int
    step: int
    role: Role
    count: int
    nodes: list[str]
    granted: int = 0


@dataclass
class _Starting:
    """A StartExecutors step in flight: its ask rows and the executors granted for it so far."""

    step: ins.StartExecutors
    rows: list[_AskRow]
    granted: list[ExecutorInfo] = field(default_factory=list)
    ready: set[str] = field(default_factory=set)


@dataclass
class AmLog:
    """What the simulated AM's controller saw and said: every event (its time, its kind and the
    phase the job was in after it) and every instruction's kind, in order (part 5 of issue 35
    compares them with the real AM's log)."""

    events: list[tuple[float, str, Phase]] = field(default_factory=list)
    instructions: list[str] = field(default_factory=list)
    per_event: list[tuple[Phase, list[str]]] = field(default_factory=list)   # (phase after, its instructions)

    def record(self, event: ev.Event, out: list[ins.Instruction], phase: Phase) -> None:
        kinds = [type(i).__name__ for i in out]
        self.events.append((event.at, type(event).__name__, phase))
        self.instructions.extend(kinds)
        self.per_event.append((phase, kinds))


class SimJob:
    """One trace job: submits itself to the core, then plays its AM (see the module doc).

    `on_load_change` is called whenever the executors this job trains on change (it starts,
    reshapes, pauses, finishes): the simulator then asks its iteration-time model for every
    training job's epoch time again (sim/iteration_time.py) and calls `set_epoch_time`.
    `spec`: the PS job spec to run (default: the trace job's, with the epoch limit the simulator
    stops the job at); `log`: record the controller's events and instructions (`AmLog`)."""

    def __init__(self, job: TraceJob, cal: AppCalibration, loop: EventLoop, core: "ResourceManagerCore",
                 nodes: dict[str, SimNode], timings: JobTimings = JobTimings(),
                 on_done: Callable[["SimJob"], None] = lambda j: None,
                 on_load_change: Callable[["SimJob"], None] = lambda j: None,
                 spec: Optional[ps_job_spec.PSJobSpec] = None, log: bool = False):
        self.job, self.cal, self.loop, self.core, self.nodes = job, cal, loop, core, nodes
        self.timings = timings
        self.on_done = on_done
        self.on_load_change = on_load_change
        self.model = cal.epoch_model()
        self.curve = cal.curve()
        max_epochs = job.max_epochs or int(job.hparams.get("max_epochs", cal.max_epochs))
        if spec is not None and spec.max_epochs is not None:
            max_epochs = spec.max_epochs
        self.max_epochs = max_epochs
        self.target_epochs = cal.epochs_to_converge(job.threshold, max_epochs)
        self.spec = spec if spec is not None else self._spec()
        # The job's parameter state (a trace may set it; the app's reference model otherwise).
        self.model_mb = job.model_mb if job.model_mb is not None else cal.model_mb
        self.record = JobRecord(job.name, job.app, job.user, job.queue, target_epochs=self.target_epochs)
        # The controller's state of the job: its phases, executors, the change in its slot.
        self.state = JobState(spec=self.spec, keeps_worker_state=job.app in KEEPS_WORKER_STATE,
                              memory_mb=self.spec.executor_memory_mb, vcores=self.spec.executor_vcores)
        self.log: Optional[AmLog] = AmLog() if log else None
        # Cruise's answers to ComputePlan, in order (module doc): a replay gives the real optimizer's.
        self.plans: deque[list[PlanOp]] = deque()
        self.app_id = ""
        self.attempt_id = ""
        self.am_container = ""
        self.am_node = ""
        self.response_id = 0
        self.registered = False
        self.stopped = False
        self.containers: dict[str, Held] = {}                 # containers held (granted, not released)
        self.executor_of: dict[str, ExecutorInfo] = {}        # container id -> its executor
        self.container_of: dict[str, str] = {}                # executor id -> its container
        self.active = (0, 0)                                  # (workers, servers) training now / last
        self.active_ids: tuple[str, ...] = ()                 # the containers training now / last
        self.releases: list[str] = []
        # The interpreter's own: steps in flight, the ask rows sent, checkpoints written.
        self._events: deque[ev.Event] = deque()
        self._draining = False
        self._starting: dict[int, _Starting] = {}             # StartExecutors steps in flight
        self._rows: dict[int, _AskRow] = {}                   # ask id -> row
        self._next_ask = 1
        self._sent_asks: set[int] = set()                     # rows sent last (withdrawn when dropped)
        self._timed: dict[int, int] = {}                      # step in flight -> its timer's token
        self._stalling: set[int] = set()                      # steps in flight that stall training
        self._instr: dict[int, ins.StepInstruction] = {}      # every step in flight
        self._tokens = 0
        self._halted = False                                  # PauseTraining done, no resume yet
        self._ended = False                                   # TrainingEnded sent
        self._saved: dict[str, float] = {}                    # checkpoint directory -> epochs trained
        self._executors = {Role.WORKER: 0, Role.SERVER: 0}
        self._reported = (False, 0)                           # the last ReportProgress: changing, version
        self.epochs = 0.0
        self.rate = 0.0                                       # epochs per second now
        self.epoch_s = 0.0                                    # the epoch time now (contention included)
        self.last_t = 0.0
        self.generation = 0                                   # invalidates scheduled epoch ends
        self.iterations_at_reshape = 0
        self.epoch_times: list[float] = []
        self._reported_epochs = 0
        self._report: Optional[JobReport] = None
        self._clock_points: list[tuple[int, float, float]] = []     # (clock, epochs, objective)
        self._clock_report: Optional[list[ClockObjective]] = None
        self._clock_shape: Optional[ObjectiveCurve] = None
        self._allocating = False
        self._allocation = 0                                  # the allocate call due (older ones are void)
        self._wake_due = False

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

    def spec_json(self) -> JsonObject:
        """The PS job spec the job is submitted with (what `elastane ps submit` would send). It
        carries the epoch limit the simulator stops the job at, so a policy sees the same one."""
        return self.spec.to_json()

    @property
    def phase(self) -> Phase:
        """The controller's phase of the job."""
        return self.state.phase

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
    def claims(self) -> JsonObject:
        return {"app_id": self.app_id, "attempt_id": self.attempt_id, "user": self.job.user}

    def _register(self) -> None:
        if self.registered or self.stopped:
            return      # a later attempt of an AM that registered (or ended) already
        resp = self.core.am_register(self.claims, api.AmRegisterRequest(tracking_url=f"http://sim/{self.app_id}"))
        self.registered = True
        self.record.am_start = self.loop.now
        self._allocating = True
        self._send(ev.Registered(at=self.loop.now, policy_places_new_jobs=resp.policy_places_new_jobs))
        self._heartbeat_now()

    # ----- the controller ---------------------------------------------------------------------
    def outside(self, event: ev.Event) -> None:
        """An input from outside the simulated cluster (module doc), handed to the controller now;
        none once the job has ended."""
        if self.registered and not self.stopped:
            self._send(event)

    def _send(self, *events: ev.Event) -> None:
        """Hand events to the controller and carry out what it says; events the steps raise meanwhile
        (a step that costs nothing ends at once) queue behind, so each `handle` sees them in order."""
        self._events.extend(events)
        if self._draining:
            return
        self._draining = True
        try:
            while self._events:
                e = self._events.popleft()
                running = self.state.change
                _, out = handle(self.state, e)
                if self.log is not None:
                    self.log.record(e, out, self.state.phase)
                if running is not None and self.state.change is not running:
                    self._change_ended(running)
                for i in out:
                    self._do(i)
        finally:
            self._draining = False
        self._retime()

    def _change_ended(self, change: Change) -> None:
        """Count a change that succeeded as the records did: reshapes (EPS, a restart, a plan) and
        pauses (a pause, a migration through a checkpoint)."""
        if change.error:
            return
        if change.kind in (ChangeKind.EPS, ChangeKind.RESTART, ChangeKind.PLAN, ChangeKind.STRAGGLER):
            self.record.reshapes += 1
        elif change.kind in (ChangeKind.PAUSE, ChangeKind.MIGRATE):
            self.record.pauses += 1

    def _do(self, i: ins.Instruction) -> None:
        """Carry out one instruction (module doc)."""
        if isinstance(i, ins.StartExecutors):
            self._start_executors(i)
        elif isinstance(i, ins.STEP_TYPES):
            self._begin_step(i)      # type: ignore[arg-type]
        elif isinstance(i, ins.LaunchExecutor):
            self._launch(i.container_id)
        elif isinstance(i, ins.ReleaseContainer):
            self._release(i.container_id)
        elif isinstance(i, ins.WithdrawAsks):
            self._drop_rows(i.step)
        elif isinstance(i, ins.CancelSteps):
            for step in i.steps:
                self._cancel(step)
        elif isinstance(i, ins.ReportProgress):
            self._reported = (i.changing, i.directive_version)
            self._report = None
        elif isinstance(i, ins.SetTimer):
            self.loop.at(i.at, self._timer, i.timer)
        elif isinstance(i, ins.Finish):
            self._finish(i)
        # Reply: the simulated AM has no endpoint, so nobody waits for an answer.

    def _timer(self, name: str) -> None:
        if not self.stopped:
            self._send(ev.TimerFired(at=self.loop.now, timer=name))

    # ----- executors: asks, grants, launches --------------------------------------------------
    def _start_executors(self, step: ins.StartExecutors) -> None:
        if step.per_node:
            wanted = [(n, [node]) for node, n in sorted(step.per_node.items())]
        else:
            wanted = [(step.count, list(step.nodes))]
        rows = []
        for count, nodes in wanted:
            row = _AskRow(self._next_ask, step.step, step.role, count, nodes)
            self._next_ask += 1
            self._rows[row.ask_id] = row
            rows.append(row)
        self._starting[step.step] = _Starting(step, rows)
        self._heartbeat_now()
        self._instr[step.step] = step
        change = self.state.change
        if change is None or change.kind not in WAITS_FOR_EXECUTORS:
            token = self._token(step.step)
            self.loop.after(self.timings.launch_timeout_s, self._launch_timeout, step.step, token)
        self._maybe_started(step.step)

    def _token(self, step: int) -> int:
        self._tokens += 1
        self._timed[step] = self._tokens
        return self._tokens

    def _launch_timeout(self, step: int, token: int) -> None:
        if self._timed.get(step) != token or step not in self._starting:
            return
        s = self._starting[step]
        self._close(step)
        self._send(ev.StepFailed(at=self.loop.now, step=step, executors=list(s.granted),
                                 error=f"{len(s.ready)} of {sum(r.count for r in s.rows)} new "
                                       f"{s.step.role.value}s started within {self.timings.launch_timeout_s:g} s"))

    def _granted(self, c: api.AllocatedContainer) -> Optional[ExecutorInfo]:
        """A container the RM granted: the executor of the step whose ask it answers, or None
        (surplus: an ask withdrawn after the RM had granted it) -- then it goes back at once."""
        row = self._rows.get(c.ask_id)
        if row is None or row.granted >= row.count or row.step not in self._starting:
            self.releases.append(c.container_id)
            return None
        row.granted += 1
        # Named as the AM names them (worker-0, worker-1, ...: a count per role from 0), so a
        # recorded Cruise plan's ops name the same executors here.
        info = ExecutorInfo(executor_id=f"{row.role.value}-{self._executors[row.role]}", role=row.role,
                            container_id=c.container_id, node=c.node_id)
        self._executors[row.role] += 1
        self.containers[c.container_id] = Held(row.role.value, c.node_id, c.resource)
        self.executor_of[c.container_id] = info
        self.container_of[info.executor_id] = c.container_id
        self._starting[row.step].granted.append(info)
        return info

    def _launch(self, container_id: str) -> None:
        """LaunchExecutor: its process starts on the node and announces itself (no cost of its own:
        the calibrated figures run from the grant)."""
        info = self.executor_of.get(container_id)
        if info is None or container_id not in self.containers:
            return
        self.nodes[info.node].start(container_id, self.app_id)
        self._events.append(ev.ExecutorReady(at=self.loop.now, executor=info))
        for step, s in self._starting.items():
            if info in s.granted:
                s.ready.add(info.executor_id)
                self._maybe_started(step)
                break

    def _maybe_started(self, step: int) -> None:
        s = self._starting.get(step)
        if s is None or len(s.ready) < sum(r.count for r in s.rows):
            return
        self._close(step)
        self._events.append(ev.StepDone(at=self.loop.now, step=step, executors=list(s.granted)))

    def _close(self, step: int) -> None:
        """A step ended: its timer, ask rows and bookkeeping go."""
        self._timed.pop(step, None)
        self._stalling.discard(step)
        self._instr.pop(step, None)
        self._starting.pop(step, None)
        self._drop_rows(step)

    def _drop_rows(self, step: int) -> None:
        for ask_id in [a for a, r in self._rows.items() if r.step == step]:
            del self._rows[ask_id]

    def _cancel(self, step: int) -> None:
        """CancelSteps: a running step stops and answers StepFailed (cancelled)."""
        if step not in self._instr:
            return
        s = self._starting.get(step)
        self._close(step)
        self._events.append(ev.StepFailed(at=self.loop.now, step=step, error="cancelled", cancelled=True,
                                          executors=list(s.granted) if s is not None else []))

    def _release(self, cid: str) -> None:
        if self.containers.pop(cid, None) is not None:
            self.releases.append(cid)
            self._heartbeat_now()

    # ----- the other steps ----------------------------------------------------------------------
    def _begin_step(self, step: ins.StepInstruction) -> None:
        """A step other than StartExecutors: it stalls training while it runs and ends after its
        calibrated cost (sim/step_costs.py)."""
        self._instr[step.step] = step
        self._stalling.add(step.step)
        if isinstance(step, ins.PauseTraining):
            self._halted = True
        cost = step_cost(self.cal, step, self.state.change, self.model_mb, self.job.data_scale, self._halted)
        if cost > 0.0:
            token = self._token(step.step)
            self.loop.after(cost, self._step_due, step.step, token)
        else:
            self._events.append(self._end_step(step))

    def _step_due(self, step: int, token: int) -> None:
        instr = self._instr.get(step)
        if self._timed.get(step) != token or instr is None or self.stopped:
            return
        self._send(self._end_step(instr))

    def _end_step(self, step: ins.StepInstruction) -> ev.Event:
        """What a step did, as the event that closes it."""
        self._close(step.step)
        now = self.loop.now
        if isinstance(step, ins.RetireExecutors):
            for eid in step.executors:
                self._release(self.container_of.get(eid, ""))
        elif isinstance(step, ins.WriteCheckpoint):
            self._advance()
            directory = f"sim/{self.app_id}/checkpoint-{len(self._saved) + 1}"
            self._saved[directory] = self.epochs
            return ev.StepDone(at=now, step=step.step, directory=directory)
        elif isinstance(step, ins.SetupTraining):
            self._halted = False
            return ev.StepDone(at=now, step=step.step,
                               holdings=self._holdings(self.state.ids(Role.SERVER), self.state.ids(Role.WORKER)))
        elif isinstance(step, ins.RestoreCheckpoint):
            self._advance()
            self.epochs = self._saved.get(step.directory, self.epochs)
            self._ended = False
            self._halted = False
            self._report = None
            return ev.StepDone(at=now, step=step.step, holdings=self._holdings(step.servers, step.workers))
        elif isinstance(step, ins.ResumeTraining):
            self._halted = False
        elif isinstance(step, ins.RebuildServers):
            h = self.state.holdings
            blocks = {s: list(b) for s, b in h.blocks.items() if s not in step.lost}
            for old, new in zip(step.lost, step.new):
                blocks[new] = list(h.blocks.get(old, []))
            return ev.StepDone(at=now, step=step.step, holdings=Holdings(blocks=blocks, splits=h.splits,
                                                                         inactive=h.inactive))
        elif isinstance(step, ins.AdoptExecutors):
            # A simulated attempt never fails and leaves executors behind (a replayed AM log's
            # take-over starts new executors here, as a failed one does).
            return ev.StepFailed(at=now, step=step.step, error="the simulator keeps no executors across attempts")
        elif isinstance(step, ins.ComputePlan):
            if self.plans:
                return ev.StepDone(at=now, step=step.step, ops=self.plans.popleft())
            return ev.StepFailed(at=now, step=step.step, error="the simulator runs no Cruise optimizer")
        return ev.StepDone(at=now, step=step.step)

    def _holdings(self, servers: list[str], workers: list[str]) -> Holdings:
        """Model blocks round-robin over the servers and input splits in contiguous partitions over
        the workers, as the AM's set-up places them (the splits are the data's input blocks, so a
        recorded Cruise plan's split ids name the same splits here; see SPLITS_PER_WORKER)."""
        blocks: dict[str, list[int]] = {s: [] for s in servers}
        for b in range(self.spec.num_blocks if servers else 0):
            blocks[servers[b % len(servers)]].append(b)
        most = max(self.spec.workers, self.spec.max_workers or 0)
        schema, data = self.spec.schema, self.spec.typed_data
        known = schema.num_input_blocks(data) if schema is not None and data is not None else 0
        total = known if known >= SPLITS_PER_WORKER * most else SPLITS_PER_WORKER * most
        splits = {w: list(partition_block_range(total, i, len(workers))) for i, w in enumerate(workers)}
        return Holdings(blocks=blocks, splits=splits)

    def _finish(self, f: ins.Finish) -> None:
        """Finish: unregister with the final status (None: stopped by the RM, no unregister)."""
        if self.stopped:
            return
        self._advance()
        if f.final_status is None:
            self._stop("KILLED")
            return
        self.core.am_finish(self.claims, api.AmFinishRequest(final_status=f.final_status, diagnostics=f.diagnostics))
        self.containers.clear()
        self.nodes[self.am_node].exit(self.am_container)
        self._stop(f.final_status)

    def _stop(self, status: str) -> None:
        was_training = self.training
        self.stopped = True
        self._allocating = False
        self.rate = 0.0
        self.generation += 1
        self._timed.clear()
        self.record.end = self.loop.now
        self.record.final_status = status
        self.record.epochs = int(self.epochs)
        if was_training:
            self.on_load_change(self)
        self.on_done(self)

    # ----- the allocate loop ------------------------------------------------------------------
    @property
    def executor_resource(self) -> Resource:
        """Each executor's container now: the spec's, or the size a directive set (the controller's)."""
        st = self.state
        return Resource(st.memory_mb or self.spec.executor_memory_mb, st.vcores or self.spec.executor_vcores)

    def _asks(self) -> list[api.ResourceAsk]:
        r = self.executor_resource
        asks = [api.ResourceAsk(ask_id=row.ask_id, count=row.count - row.granted, resource=r, tag=row.role.value,
                                nodes=list(row.nodes), relax_locality=not row.nodes)
                for row in self._rows.values() if row.count > row.granted]
        # The core keeps an ask row until told otherwise: rows no longer wanted are withdrawn.
        ids = {a.ask_id for a in asks}
        asks += [api.ResourceAsk(ask_id=x, count=0, resource=r, tag=WORKER) for x in sorted(self._sent_asks - ids)]
        self._sent_asks = ids
        return asks

    def _heartbeat_now(self) -> None:
        """Allocate at once rather than at the next interval: the real AM's client does so when it
        adds an ask or releases a container (appmaster/am_client.py `heartbeat_now`)."""
        if self._allocating and not self._wake_due:
            self._wake_due = True
            self._allocation += 1
            self.loop.after(0.0, self._allocate, self._allocation)

    def _allocate(self, allocation: int) -> None:
        if not self._allocating or allocation != self._allocation:
            return
        self._wake_due = False
        self._advance()
        asks = self._asks()
        releases, self.releases = self.releases, []
        self.response_id += 1
        req = api.AllocateRequest(response_id=self.response_id, asks=asks, releases=releases,
                                  progress=min(1.0, self.epochs / max(1, self.target_epochs)), shape=self.report())
        resp = self.core.allocate(self.claims, req)
        if resp.action == "SHUTDOWN":
            self._send(ev.StopRequested(at=self.loop.now, reason="the RM shut the AM down"))
            if not self.stopped:
                self._stop("KILLED")
            return
        self.response_id = resp.response_id
        events: list[ev.Event] = []
        granted = [info for info in (self._granted(c) for c in resp.allocated) if info is not None]
        if granted:
            events.append(ev.ContainersAllocated(at=self.loop.now, containers=granted))
        ended = []
        for st in resp.completed:
            self.containers.pop(st.container_id, None)
            self._ungrant(st.container_id)
            if st.container_id in self.state.containers:
                ended.append((st.container_id, f"container {st.container_id} ended: exit status {st.exit_status}"
                                               + (f" ({st.diagnostics})" if st.diagnostics else "")))
        if ended:
            events.append(ev.ContainersCompleted(at=self.loop.now, containers=ended))
        if resp.shape_directive is not None:
            events.append(ev.DirectiveArrived(at=self.loop.now, directive=resp.shape_directive))
        if events:
            self._send(*events)
        if self.stopped:
            return
        if self._wake_due:
            return          # a step asked or released meanwhile: the next allocate is due now
        pending = any(r.count > r.granted for r in self._rows.values())
        self._allocation += 1
        self.loop.after(self.timings.pending_interval_s if pending else self.timings.allocate_interval_s,
                        self._allocate, self._allocation)

    def _ungrant(self, cid: str) -> None:
        """A container granted for a step still in flight ended before the step did: ask again."""
        info = self.executor_of.get(cid)
        if info is None:
            return
        for s in self._starting.values():
            if info in s.granted:
                s.granted.remove(info)
                s.ready.discard(info.executor_id)
                for row in s.rows:
                    if row.role is info.role and (not row.nodes or info.node in row.nodes) and row.granted > 0:
                        row.granted -= 1
                        break
                return

    # ----- training ---------------------------------------------------------------------------
    def _members(self) -> tuple[tuple[int, int], tuple[str, ...]]:
        """The shape that trains and its containers: the controller's ready executors but those a
        StartExecutors still in flight brought (they join once all of theirs are up)."""
        starting = {x.executor_id for s in self._starting.values() for x in s.granted}
        ready = [e.info for e in self.state.executors.values()
                 if e.state is ExecutorState.READY and e.executor_id not in starting]
        workers = sum(1 for x in ready if x.role is Role.WORKER)
        return (workers, len(ready) - workers), tuple(sorted(x.container_id for x in ready))

    def _trains_now(self, shape: tuple[int, int]) -> bool:
        """Whether epochs advance now: the controller's phase trains, the job holds one of each role,
        training was not stopped (paused by a step, ended) and no step that stalls it runs."""
        st = self.state
        # A recovery stalls training too: a BSP clock cannot end without the lost executor's part.
        if self.stopped or self._ended or not st.phase.trains or self._stalling or st.phase is Phase.RECOVERING:
            return False
        if self._halted and st.change is not None:
            return False
        return shape[0] >= 1 and shape[1] >= 1

    def _retime(self) -> None:
        """After the controller moved: start, stop or go on training, at the shape it has now."""
        if self.stopped:
            return
        shape, ids = self._members()
        trains = self._trains_now(shape)
        moved = (shape, ids) != (self.active, self.active_ids)
        # A change whose steps all cost nothing ends within the same drain of events: training never
        # stopped for it (rate > 0 throughout), yet the job trains at the shape it left.
        if trains and (self.rate <= 0.0 or moved):
            if moved:
                self._advance()
                self.active, self.active_ids = shape, ids
                self.iterations_at_reshape = self.iterations
                self.record.shapes.append((self.loop.now, shape[0], shape[1]))
            if self.record.start is None:
                self.record.start = self.loop.now
            self.epoch_s = self.solo_epoch_s
            self._set_rate(1.0 / self.epoch_s)
            self.on_load_change(self)
        elif not trains and self.rate > 0.0:
            self._set_rate(0.0)
            self.on_load_change(self)
        if shape == (0, 0) and self.active != (0, 0):
            # Every executor gone (a pause, a restart or recovery between its retire and its start).
            self.active, self.active_ids = (0, 0), ()
            self.record.shapes.append((self.loop.now, 0, 0))
            self._report = None

    @property
    def solo_epoch_s(self) -> float:
        """The epoch time at the active shape alone on idle nodes (the calibrated speed function)."""
        w, s = self.active
        return self.model.epoch_time(w, s, self.job.data_scale) if w >= 1 and s >= 1 else 0.0

    @property
    def training(self) -> bool:
        return self.rate > 0.0

    def set_epoch_time(self, epoch_s: float) -> None:
        """The iteration-time model's epoch time where the job runs now (contention included)."""
        if not self.training or epoch_s <= 0.0 or abs(epoch_s - self.epoch_s) <= 1e-12:
            return
        self.epoch_s = epoch_s
        self._set_rate(1.0 / epoch_s)

    def truth(self) -> JobTruth:
        """What only the simulator knows of the job, for the optimus-truth policy (sim/optimus_truth.py)."""
        self._advance()
        return JobTruth(remaining_epochs=max(0.0, self.target_epochs - self.epochs),
                        theta=tuple(t * self.job.data_scale for t in self.model.theta),
                        change_cost_s=self._restart_cost() if self.job.elastic_mode == "kill" else self._reshape_cost(),
                        busy=self.state.change is not None or self.state.phase is not Phase.TRAINING)

    def training_executors(self) -> list[tuple[str, Held]]:
        """The containers the job trains on now (none unless it trains)."""
        if not self.training:
            return []
        return [(c, self.containers[c]) for c in self.active_ids if c in self.containers]

    def _reshape_cost(self) -> float:
        return self.cal.reshape_cost(self.model_mb, self.job.data_scale)

    def _restart_cost(self) -> float:
        return self.cal.restart_cost(self.model_mb, self.job.data_scale)

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
            self._next_epoch_end()

    def _next_epoch_end(self) -> None:
        """Schedule the end of the epoch in progress at the rate now (the generation voids it when
        the rate changes first)."""
        nxt = min(self.target_epochs, math.floor(self.epochs + 1e-9) + 1)
        self.loop.after(max(0.0, nxt - self.epochs) / self.rate, self._epoch_end, self.generation, nxt)

    def _epoch_end(self, generation: int, epoch: int) -> None:
        """An epoch ended: its clock boundary and objective to the controller; at the job's epoch
        count, the end of training."""
        if generation != self.generation or self.stopped:
            return
        self._advance()
        self.epochs = float(epoch)
        its = self.iterations
        events: list[ev.Event] = [ev.ClockDone(at=self.loop.now, clock=its, epoch=epoch - 1, iterations=its),
                                  ev.EpochDone(at=self.loop.now, epoch=epoch - 1, objective=self.cal.objective(epoch),
                                               epoch_time_s=self.epoch_s)]
        if epoch >= self.target_epochs:
            self._ended = True
            events.append(ev.TrainingEnded(at=self.loop.now, criterion=CONVERGED))
        else:
            self._next_epoch_end()
        self._send(*events)

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
            self._report.changing, self._report.directive_version = self._reported
            self._report.directive_refused = self.state.refused_directive
            self._report.phase = self.state.phase.value
            self._report.paused = self.state.phase is Phase.PAUSED
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
            changing=self._reported[0], iterations=iterations,
            early_feedback=iterations >= self.early_feedback_iterations,
            early_feedback_iterations=self.early_feedback_iterations,
            speed=(self.cal.clocks_per_epoch / epoch_s) if epoch_s > 0.0 and self.rate > 0.0 else 0.0,
            speed_iterations=speed_its,
            executor_resource=self.executor_resource,
            directive_version=self._reported[1], directive_refused=self.state.refused_directive,
            phase=self.state.phase.value,
            paused=self.state.phase is Phase.PAUSED,
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


__all__ = ["AmLog", "CONVERGED", "Held", "JobTimings", "LAUNCH_TIMEOUT_S", "SimJob"]
