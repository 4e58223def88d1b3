"""A simulated PS job and its ApplicationMaster, talking to the RM core as a real PS AM does.

Life of a job (times from the app's calibration, sim/calibration.py):

    arrival -> submit (new-application, submit, saved)          the core queues the AM
    AM container allocated (LaunchAm effect) -> +am_start_s -> register, allocate loop starts
    asks for its workers and servers; all granted -> +startup_s -> TRAINING (report: started)
    TRAINING: epochs advance at 1 / T(w, s) (models.ps_iteration_time) until the job's loss curve
      (sim/convergence.py) meets its threshold -> +finish_s -> finish (SUCCEEDED), AM exits
    a directive (AllocateResponse.shape_directive) sets the target shape: missing executors are
      asked for, and once granted (or for a removal at once) training stalls for reshape_s (EPS,
      in place) or restart_s (elastic_mode "kill": checkpoint + restart) and goes on at the new shape;
      run_state "pause" stalls pause_s, releases every executor and waits; "resume" (or "run"
      after a pause) asks for the shape again and restarts after restart_s.
The job's phases follow PHASE_TRANSITIONS (a TransitionTable): an event out of place raises.

Every allocate carries a JobReport (protocol/job_report.py) with the fields a real AM fills:
shape, started / changing, iterations, early feedback, speed over the iterations since the last
reshape, executor resource, directive version, phase, epochs with their times and objectives (from
the loss curve) and per-worker compute / communication times split as the epoch-time model does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, Optional

import msgspec

from protocol import internal_api as api
from protocol import ps_job_spec
from protocol.job_report import EpochObjective, JobReport, ServerTiming, WorkerTiming, MAX_EPOCH_TIMES, MAX_OBJECTIVES
from protocol.records import FinalStatus, Resource
from protocol.state_machine import TransitionTable
from rm.model import AmSpec

from .calibration import AppCalibration
from .job_record import JobRecord
from .event_loop import EventLoop
from .sim_node import SimNode
from .trace import TraceJob
from protocol.errors import StateError

if TYPE_CHECKING:
    from rm.core import LaunchAm, ResourceManagerCore

WORKER, SERVER = "worker", "server"
ASK_ID = {WORKER: 1, SERVER: 2}


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


class SimJob:
    """One trace job: submits itself to the core, then plays its AM (see the module doc)."""

    def __init__(self, job: TraceJob, cal: AppCalibration, loop: EventLoop, core: "ResourceManagerCore",
                 nodes: dict[str, SimNode], timings: JobTimings = JobTimings(),
                 on_done: Callable[["SimJob"], None] = lambda j: None):
        self.job, self.cal, self.loop, self.core, self.nodes = job, cal, loop, core, nodes
        self.timings = timings
        self.on_done = on_done
        self.model = cal.epoch_model()
        self.curve = cal.curve()
        max_epochs = job.max_epochs or int(job.hparams.get("max_epochs", cal.max_epochs))
        self.target_epochs = cal.epochs_to_converge(job.threshold, max_epochs)
        self.record = JobRecord(job.name, job.app, job.user, job.queue, target_epochs=self.target_epochs)
        self.phase = Phase.SUBMITTED
        self.app_id = ""
        self.attempt_id = ""
        self.am_container = ""
        self.am_node = ""
        self.response_id = 0
        self.containers: dict[str, tuple[str, str]] = {}     # cid -> (role, node id)
        self.active = (0, 0)                                  # (workers, servers) training now
        self.target = (job.workers, job.servers)
        self.directive_version = 0
        self.run_state = api.RunState.RUN
        self.releases: list[str] = []
        self.preferred_nodes: tuple[str, ...] = ()
        self.epochs = 0.0
        self.rate = 0.0                                       # epochs per second now
        self.last_t = 0.0
        self.generation = 0                                   # invalidates scheduled convergence events
        self.iterations_at_reshape = 0
        self.epoch_times: list[float] = []
        self._reported_epochs = 0
        self._report: Optional[JobReport] = None
        self._allocating = False

    # ----- submission and AM start ------------------------------------------------------------
    def spec_json(self) -> dict[str, object]:
        """The PS job spec the job is submitted with (what `elastane ps submit` would send)."""
        j = self.job
        hparams = dict(j.hparams)
        spec = ps_job_spec.PSJobSpec(app=j.app, hparams=hparams, workers=j.workers, servers=j.servers,
                                     max_workers=j.shape_max[0], max_servers=j.shape_max[1], sync=j.sync,
                                     convergence_threshold=j.threshold, executor_memory_mb=j.executor_memory_mb,
                                     executor_vcores=j.executor_vcores, elastic_mode=j.elastic_mode,
                                     max_epochs=j.max_epochs)
        out = spec.to_json()
        # A spec that knows a minimum shape (Dorm's n_min) gets the trace's; today's has none.
        names = {f.name for f in msgspec.structs.fields(ps_job_spec.PSJobSpec)}
        for key, value in (("min_workers", j.shape_min[0]), ("min_servers", j.shape_min[1])):
            if key in names:
                out[key] = value
        return out

    def submit(self) -> None:
        self.record.arrival = self.loop.now
        core = self.core
        self.app_id = core.new_application()
        self.record.app_id = self.app_id
        am = AmSpec([ps_job_spec.AM_COMMAND], {}, {}, Resource(self.timings.am_memory_mb, 1))
        core.submit(self.app_id, self.job.user, self.job.name, self.job.queue, ps_job_spec.APPLICATION_TYPE, am,
                    1, {}, {ps_job_spec.ELASTANE_FIELD: self.spec_json()})
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
        self.core.am_register(self.claims, api.AmRegisterRequest(tracking_url=f"http://sim/{self.app_id}"))
        self.record.am_start = self.loop.now
        self._on(PhaseEvent.REGISTER)
        self._allocating = True
        self._allocate()

    def _on(self, event: PhaseEvent) -> None:
        """Take `event` through PHASE_TRANSITIONS (SimPhaseError if the phase does not take it)."""
        self.phase = PHASE_TRANSITIONS.next(self.phase, event)

    # ----- the allocate loop ------------------------------------------------------------------
    def _held(self) -> tuple[int, int]:
        roles = [r for r, _ in self.containers.values()]
        return roles.count(WORKER), roles.count(SERVER)

    def _wanted(self) -> tuple[int, int]:
        """Executors the job should hold now: none while paused or finishing, else the target."""
        if self.phase in (Phase.PAUSED, Phase.PAUSING, Phase.FINISHING, Phase.DONE):
            return (0, 0)
        return self.target

    def _asks(self) -> list[api.ResourceAsk]:
        held = self._held()
        want = self._wanted()
        r = Resource(self.job.executor_memory_mb, self.job.executor_vcores)
        # A directive's placement is passed on as a node preference (relaxed: any node will do).
        return [api.ResourceAsk(ask_id=ASK_ID[role], count=max(0, want[i] - held[i]), resource=r, tag=role,
                                nodes=list(self.preferred_nodes))
                for i, role in enumerate((WORKER, SERVER))]

    def _allocate(self) -> None:
        if not self._allocating:
            return
        self._advance()
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
            self.containers[c.container_id] = (role, c.node_id)
            self.nodes[c.node_id].start(c.container_id, self.app_id)
        for s in resp.completed:
            self.containers.pop(s.container_id, None)
        if resp.shape_directive is not None:
            self._directive(resp.shape_directive)
        self._progress_shape()
        pending = any(a.count for a in asks)
        self.loop.after(self.timings.pending_interval_s if pending else self.timings.allocate_interval_s,
                        self._allocate)

    def _directive(self, d: api.ShapeDirective) -> None:
        self.directive_version = d.version
        if d.workers >= 1 and d.servers >= 1:
            self.target = (d.workers, d.servers)
            self.preferred_nodes = tuple(d.nodes)
        if d.run_state == api.RunState.PAUSE and self.phase in (Phase.TRAINING, Phase.RESHAPING):
            self._pause()
        elif d.run_state != api.RunState.PAUSE and self.phase == Phase.PAUSED:
            self._on(PhaseEvent.RESUME)       # asks for the target again, restarts once it holds it
            self.run_state = d.run_state

    def _progress_shape(self) -> None:
        """Move the job on once it holds what it waits for (start, reshape, resume)."""
        held = self._held()
        if self.phase == Phase.GATHERING and held[0] >= self.target[0] and held[1] >= self.target[1]:
            resuming = self.record.start is not None
            self._on(PhaseEvent.GATHERED)
            self.loop.after(self.cal.restart_s if resuming else self.cal.startup_s, self._start_training)
        elif self.phase == Phase.TRAINING and self._reshape_ready(held) != self.active:
            self._reshape(held)

    def _reshape_ready(self, held: tuple[int, int]) -> tuple[int, int]:
        """The shape the job can move to now: the target, as far as the executors held allow."""
        return (min(self.target[0], held[0]), min(self.target[1], held[1]))

    # ----- training ---------------------------------------------------------------------------
    def _start_training(self) -> None:
        if self.phase != Phase.LAUNCHING:
            return
        held = self._held()
        shape = self._reshape_ready(held)
        self._drop_extra(shape)
        if self.record.start is None:
            self.record.start = self.loop.now
        self._on(PhaseEvent.STARTED)
        self._set_shape(shape)

    def _set_shape(self, shape: tuple[int, int]) -> None:
        self._advance()
        self.active = shape
        self.iterations_at_reshape = self.iterations
        self.record.shapes.append((self.loop.now, shape[0], shape[1]))
        self._set_rate(1.0 / self.model.epoch_time(shape[0], shape[1], self.job.data_scale)
                       if self.phase == Phase.TRAINING and shape[0] >= 1 and shape[1] >= 1 else 0.0)

    def _reshape(self, held: tuple[int, int]) -> None:
        """Stall for the reshape (EPS) or restart (kill-based) cost, then train at the new shape."""
        self._on(PhaseEvent.RESHAPE)
        self.record.reshapes += 1
        self._set_rate(0.0)
        cost = self.cal.restart_s if self.job.elastic_mode == "kill" else self.cal.reshape_s
        self.loop.after(cost, self._reshaped)

    def _reshaped(self) -> None:
        if self.phase != Phase.RESHAPING:
            return
        shape = self._reshape_ready(self._held())
        self._drop_extra(shape)
        self._on(PhaseEvent.RESHAPED)
        if shape[0] < 1 or shape[1] < 1:     # a directive to zero: hold what it had
            shape = self.active
        self._set_shape(shape)

    def _drop_extra(self, shape: tuple[int, int]) -> None:
        """Release executors beyond `shape` (the newest first, as the real AM removes them)."""
        keep = {WORKER: shape[0], SERVER: shape[1]}
        for cid in sorted(self.containers, reverse=True):
            role, _ = self.containers[cid]
            if keep[role] > 0:
                keep[role] -= 1
            else:
                self._release(cid)

    def _release(self, cid: str) -> None:
        self.containers.pop(cid, None)
        self.releases.append(cid)

    def _pause(self) -> None:
        self._on(PhaseEvent.PAUSE)
        self.record.pauses += 1
        self._set_rate(0.0)
        self.loop.after(self.cal.pause_s, self._paused)

    def _paused(self) -> None:
        if self.phase != Phase.PAUSING:
            return
        for cid in list(self.containers):
            self._release(cid)
        self._on(PhaseEvent.PAUSED)
        self._set_shape((0, 0))

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
        self.loop.after(self.cal.finish_s, self._finish)

    def _finish(self) -> None:
        self._advance()
        self.core.am_finish(self.claims, api.AmFinishRequest(final_status=FinalStatus.SUCCEEDED.value,
                                                             diagnostics="converged (simulated)"))
        self.containers.clear()
        self.nodes[self.am_node].exit(self.am_container)
        self._stop("SUCCEEDED")

    def _stop(self, status: str) -> None:
        self._allocating = False
        self._on(PhaseEvent.STOP)
        self.record.end = self.loop.now
        self.record.final_status = status
        self.record.epochs = int(self.epochs)
        self.on_done(self)

    # ----- the job report ---------------------------------------------------------------------
    def report(self) -> JobReport:
        """The JobReport a real AM would send now (rebuilt when an epoch ends or the shape changes)."""
        done = int(math.floor(self.epochs + 1e-9))
        if self._report is not None and done == self._reported_epochs:
            self._report.iterations = self.iterations
            self._report.speed_iterations = max(0, self.iterations - self.iterations_at_reshape)
            self._report.early_feedback = self.iterations >= self.early_feedback_iterations
            return self._report
        w, s = self.active
        epoch_s = self.model.epoch_time(w, s, self.job.data_scale) if w >= 1 and s >= 1 else 0.0
        if done > self._reported_epochs and epoch_s > 0.0:
            self.epoch_times = (self.epoch_times + [epoch_s] * min(done - self._reported_epochs, MAX_EPOCH_TIMES))[
                -MAX_EPOCH_TIMES:]
        self._reported_epochs = done
        first = max(1, done - MAX_OBJECTIVES + 1)
        # Reports number epochs from 0 (the objective after k epochs is epoch k - 1's).
        sign = self.cal.objective_sign
        objectives = [EpochObjective(e - 1, sign * self.curve.loss(e)) for e in range(first, done + 1)]
        compute = self.model.theta[0] * self.job.data_scale / w if w >= 1 else 0.0
        per_clock = 1.0 / self.cal.clocks_per_epoch
        iterations = self.iterations
        speed_its = max(0, iterations - self.iterations_at_reshape)
        self._report = JobReport(
            workers=w, servers=s, started=self.record.start is not None,
            changing=self.phase == Phase.RESHAPING, iterations=iterations,
            early_feedback=iterations >= self.early_feedback_iterations,
            early_feedback_iterations=self.early_feedback_iterations,
            speed=(self.cal.clocks_per_epoch / epoch_s) if epoch_s > 0.0 and self.rate > 0.0 else 0.0,
            speed_iterations=speed_its,
            executor_resource=Resource(self.job.executor_memory_mb, self.job.executor_vcores),
            directive_version=self.directive_version, phase=self.phase.value,
            epoch=done - 1 if done >= 1 else None, epoch_time_s=self.epoch_times[-1] if self.epoch_times else None,
            objective=sign * self.curve.loss(done) if done >= 1 else None, epoch_times=list(self.epoch_times),
            initial_objective=sign * self.curve.loss(0), objectives=objectives,
            worker_times=WorkerTiming(compute_s=compute * per_clock, comm_s=max(0.0, epoch_s - compute) * per_clock,
                                      workers=w),
            server_times=ServerTiming(service_s=0.0, servers=0))
        return self._report

    @property
    def early_feedback_iterations(self) -> int:
        return 100


__all__ = ["JobTimings", "PHASE_TRANSITIONS", "Phase", "PhaseEvent", "SimJob", "SimPhaseError"]
