"""The PS ApplicationMaster: one parameter-server training job from launch to final status.

The job's life and every change of its shape are the PS-job controller's (appmaster.ps.controller:
a pure state machine, the same one the simulator runs). This module is its I/O: it turns RM, NM
and executor messages into the controller's events and carries out its instructions through the
interpreter (appmaster.ps.runtime.interpreter), nothing else --

    RM allocate replies        ContainersAllocated (executors launched), ContainersCompleted (an
                               executor's end: a loss unless it was retired), DirectiveArrived,
                               Shutdown -> StopRequested
    the AM's endpoint          ScaleRequested (POST /scale), CheckpointRequested (POST /checkpoint)
    the clock loop             ClockDone, EpochDone, StragglerFound, TrainingEnded, and a failed
                               training loop (a user app's error fails the job at once)
    the interpreter            StepDone / StepFailed for each step it carried out

SIGTERM or the RM's shutdown stops the executors and exits without unregistering (the RM has
already decided the app's fate), like YARN's distributed shell.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Optional

import msgspec
import numpy as np

from protocol import container_env, tokens
from protocol.attempt_handover import AttemptHandover
from protocol.checkpoint_manifest import JobRecord
from protocol.durable_storage import DurableDir
from protocol.internal_api import ShapeDirective
from protocol.job_report import finite, recent_epoch_times, recent_objectives
from protocol.model_output import ModelOutputError
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import (CheckpointInfo, CruiseStatus, encode_status, DirectiveRecord, EpsOpStatus, EpsStatus,
                                PsStatus, RecoveryStatus, ResumedFrom, StragglerStatus, SuspensionCut, SuspensionStatus)
from protocol.records import FinalStatus, Resource
from protocol.remote_exception import ApiError, BadRequest, Conflict
from protocol.shape_history import ExecutorCounts, ReplaceWorkerChange, ShapeChange, SuspendChange, decode_history
from psruntime.apps.quality import check_quality
from psruntime.apps.registry import create_job_app
from psruntime.store.store_client import StoreClientError
from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer
from psruntime.wire.dataplane_auth import secret_key

from ...am_client import ApplicationMaster
from ...am_events import ContainersAllocated, ContainersCompleted, NodesUpdated, ShapeChanged, Shutdown
from ...container_book import AmContainer
from ..checkpoints import JOB_MANIFEST, Checkpointer, StoredCheckpoint
from ..controller import events as cev
from ..controller import instructions as ins
from ..controller.phases import Phase
from ..controller.records import ExecutorInfo, PlanOp
from ..controller.records import Role as CRole
from ..controller.state import Change, ChangeKind, JobState, Origin
from ..cruise_driver import CruiseDriver, build_cruise_driver
from ..job_progress import ProgressTracker, Shape, diff
from ..eps_records import ElasticOpRecord
from .bounded_history import BoundedHistory
from .executor_pool import ExecutorRecord, ExecutorState, Role
from .executor_rpc import ExecutorCallError
from ..executor_status import spill_report
from ..heldout_monitor import HeldoutMonitor
from ..attempt_takeover import HandoverWriter, TakeOverRefused, handover_record, read_handover, take_over
from ..job_resume import job_record, resumable_checkpoint, resume_job
from ..metrics import EpochRecord, JobMetrics
from ..model_output import ModelOutput, read_init_from, warm_start
from ..reconfiguration import Reconfiguration, keeps_worker_state
from .interpreter import (CONTROLLER_LOG_FILE, Adoption, ChangeRecords, ControllerLog, Hooks, JobInterpreter,
                          change_history)
from .status_server import ControlAuth, StatusServer
from ..stragglers import Straggler, StragglerWatch, WorkerPace
from ..training import Training
from ..user_errors import user_error, user_failure

log = logging.getLogger(__name__)

LOSS_REPORT_WAIT_S = 30.0           # a failed call waits this long for its container's exit (a lost node: its expiry)
RECOVERY_WAIT_S = 600.0             # ... and this long for the recovery from it to end
HISTORY_LIMIT = 100
FINAL_STATUS_FILE = "status.json"   # in the AM dir: the job's last status, written on exit


class PSApplicationMaster:
    """Runs one PS job (see the module doc); `run()` returns the final status, None if stopped."""

    def __init__(self, am: ApplicationMaster, spec: PSJobSpec, am_dir: str | Path, host: str = "127.0.0.1",
                 python: str = "python") -> None:
        self.am = am
        self.spec = spec
        self.host = host
        self.app = create_job_app(spec)     # a user app's errors: appmaster.ps.user_errors
        self.metrics = JobMetrics()
        job_secret = am.identity.job_secret
        if not job_secret:
            log.warning("no %s in the environment: using a secret of this AM's own", container_env.JOB_SECRET)
            job_secret = tokens.generate_secret()
        key = secret_key(job_secret)
        self.client = DataPlaneClient(secret=key)
        from .executor_pool import ExecutorPool
        self.pool = ExecutorPool(spec.num_blocks, python=python, job_secret=job_secret,
                                 use_arbiter=spec.use_arbiter, links=self.client, resources=spec.resources)
        self.data_server = DataPlaneServer(self.pool.handle_frame, host, 0, secret=key)
        self.status_server = StatusServer(self.status, self.request_checkpoint, host, 0, scale=self.request_scale,
                                          control_auth=ControlAuth(job_secret, am.identity.attempt_id))
        self.am_dir = DurableDir(am_dir)
        self.checkpointer = Checkpointer(self.am_dir.child("checkpoints"), self.client)
        self.training = Training.build(spec, self.app, self.pool, self.metrics, self.client,
                                       on_clock=self._after_clock)
        self.resource = Resource(spec.executor_memory_mb, spec.executor_vcores)
        self.final_metrics: Optional[dict[str, float]] = None
        self.resumed_from: Optional[ResumedFrom] = None
        self.model_output: Optional[ModelOutput] = None
        self.heldout = HeldoutMonitor(self.app, spec.heldout_every_epochs, spec.early_stopping,
                                      am_memory_mb=os.environ.get(container_env.CONTAINER_MEMORY_MB))
        self.stop_criterion: Optional[str] = None
        self.started = time.time()
        self.retiring: set[str] = set()
        self.unresponsive: dict[str, str] = {}
        self._stopping: set[asyncio.Future[None]] = set()
        self.training.loop.on_unresponsive = self._stop_unresponsive
        # An executor's connection dropped: its process has likely ended; ask the RM for its
        # container's end now rather than at the next heartbeat (the recovery waits on it).
        self.client.peer_closed = self._connection_dropped
        self.steps = Reconfiguration(am, self.training, self.checkpointer, self.resource, self.retiring,
                                     started=lambda: self.job.phase.trains or self.job.phase is Phase.RESTARTING)
        self.job = JobState(spec=spec, keeps_worker_state=keeps_worker_state(self.app))
        self.replaced: dict[str, str] = {}       # lost or slow worker -> its replacement
        self.interp = JobInterpreter(self.job, self.steps, Hooks(
            launch=self._launch, release=self._release, reply=self._reply, report=self._report,
            finish=self._on_finish, setup=self._setup, score=self._score, job_record=self.job_record,
            on_change_end=self._change_ended, plan=self._compute_plan, restore_attempt=self._restore_attempt,
            replaced=self.replaced.__setitem__, adopt=self._adopt))
        self.interp.train_coro = self._train
        self.interp.on_train_end = self._train_ended
        self.progress = ProgressTracker(spec.early_feedback_iterations)
        self.stragglers = StragglerWatch()
        # Each keeps its newest HISTORY_LIMIT entries and counts them all (bounded_history.py).
        self.shape_history: BoundedHistory[ShapeChange] = BoundedHistory(HISTORY_LIMIT)
        self.eps_history: BoundedHistory[ElasticOpRecord] = BoundedHistory(HISTORY_LIMIT)
        self.directive_history: BoundedHistory[DirectiveRecord] = BoundedHistory(HISTORY_LIMIT)
        self.suspend_history: BoundedHistory[SuspendChange] = BoundedHistory(HISTORY_LIMIT)
        self.pauses = 0
        self.paused_since: Optional[float] = None
        self.paused_s = 0.0
        self.cut: Optional[SuspensionCut] = None
        self._slow: Optional[Straggler] = None     # the straggler a STRAGGLER change replaces
        self._recovering_from: Optional[BaseException] = None    # a training error a recovery handles
        self.losses: list[str] = []
        self.recoveries = 0
        self.replacements = 0
        self._containers: dict[str, AmContainer] = {}
        self._requests: dict[int, asyncio.Future[ins.Reply]] = {}
        self._next_request = 1
        self._finish: Optional[asyncio.Future[ins.Finish]] = None
        self._stop_reason = ""
        self._init_values: Optional[np.ndarray] = None
        self._resume: Optional[StoredCheckpoint] = None
        self._handover_record: Optional[AttemptHandover] = None
        self._started_requests: set[int] = set()     # endpoint requests a change took (a 409 is its failure)
        self._directives: dict[int, ShapeDirective] = {}
        self._applied_version = 0
        self._recorded: set[int] = set()              # directive versions with a record
        self.training.loop.replace_lost_workers = self._replace_lost_workers
        self.cruise: Optional[CruiseDriver] = None    # optimizer "cruise": built once training is set up
        # Work-preserving AM restart (appmaster.ps.attempt_takeover): the record this attempt keeps
        # for the next one, and the failed attempt's executor containers handed to this one.
        self.handover = HandoverWriter(self.am_dir)
        self._handed: list[AmContainer] = []

    # -- public ------------------------------------------------------------------------------
    def request_stop(self, reason: str = "stopped by SIGTERM") -> None:
        if self._stop_reason:
            return
        self._stop_reason = reason
        self.interp.feed(cev.StopRequested(at=time.time(), reason=reason))

    def status(self) -> PsStatus:
        """The job status the HTTP endpoint serves (appmaster.ps.runtime.status_view)."""
        from .status_view import job_status
        return job_status(self)

    def max_epochs(self) -> Optional[int]:
        limit = getattr(self.app.hparams, "max_epochs", None)
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    def live_shape(self) -> Shape:
        return Shape(len(self.pool.of_role(Role.WORKER, ExecutorState.READY)),
                     len(self.pool.of_role(Role.SERVER, ExecutorState.READY)))

    def _connection_dropped(self, address: str) -> None:
        rec = self.pool.by_address(address)
        if rec is not None:
            self.am.expect_completion(rec.container_id)

    def job_record(self) -> JobRecord:
        return job_record(self.spec, self.am.identity.attempt_id, self.metrics, self.shape_history,
                          self.training.loop)

    def _request(self) -> tuple[int, asyncio.Future[ins.Reply]]:
        rid = self._next_request
        self._next_request += 1
        fut: asyncio.Future[ins.Reply] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        return rid, fut

    async def request_scale(self, workers: int, servers: int) -> list[ShapeChange] | list[EpsOpStatus]:
        """POST /scale: a relative change of workers and servers (EPS's functions, or one
        kill-based restart with the new shape under elastic_mode "kill"); answers the changes made:
        the shape history's records under "kill", else one EPS operation record per function called."""
        rid, fut = self._request()
        n_before = self.eps_history.total
        shape_before = self.shape_history.total
        self.interp.feed(cev.ScaleRequested(at=time.time(), request=rid, workers=workers, servers=servers))
        reply = await fut
        if reply.status == 400:
            raise BadRequest(reply.message)
        if reply.status == 409 and not self._change_started(rid):
            raise Conflict(reply.message)
        if reply.status != 200:
            raise ApiError(reply.message)
        if self.spec.elastic_mode == "kill":
            return list(self.shape_history.since(shape_before))
        return [r.status() for r in self.eps_history.since(n_before)]

    def _change_started(self, rid: int) -> bool:
        return rid in self._started_requests

    async def request_checkpoint(self) -> CheckpointInfo:
        """Checkpoint at the next epoch boundary (now, if training is between epochs)."""
        rid, fut = self._request()
        self.interp.feed(cev.CheckpointRequested(at=time.time(), request=rid))
        reply = await fut
        if reply.status != 200:
            raise Conflict(reply.message)
        last = self.checkpointer.last
        assert last is not None
        return last

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> Optional[FinalStatus]:
        loop = asyncio.get_running_loop()
        self._finish = loop.create_future()
        await asyncio.to_thread(self.am_dir.makedirs)
        self.pool.am_address = await self.data_server.start()
        url = await self.status_server.start()
        pump = asyncio.create_task(self._pump_events(), name="ps-am-events")
        poller = asyncio.create_task(self._poll_status(), name="ps-am-status")
        try:
            await self.am.register(self.host, self.status_server.port, url)
            try:
                self._init_values = await self._read_init_from()
                self._resume = await asyncio.to_thread(resumable_checkpoint, self.checkpointer, self.spec, self.app)
                adopt = await self._handed_over()
            except Exception as e:  # noqa: BLE001 - named in the job's diagnostics
                msg = user_failure(self.spec, e) or f"PS job failed in phase STARTING: {type(e).__name__}: {e}"
                log.error("%s", msg)
                self.interp.feed(cev.UserCodeError(at=time.time(), message=msg))
                return await self._conclude(await self._finish)
            reg = self.am.registration
            if reg is not None and reg.policy_places_new_jobs and not self.spec.placement:
                log.info("the RM's policy places new jobs: waiting for its first directive before starting executors")
            self.interp.feed(cev.Registered(at=time.time(),
                                            policy_places_new_jobs=bool(reg and reg.policy_places_new_jobs),
                                            resume_from=str(self._resume.dir) if self._resume else "",
                                            adopt=adopt))
            done = await self._finish
            return await self._conclude(done)
        finally:
            pump.cancel()
            poller.cancel()
            self.heldout.cancel()
            await asyncio.gather(pump, poller, return_exceptions=True)
            await self.interp.close()
            await self.handover.close()
            for rid, fut in self._requests.items():
                if not fut.done():
                    fut.set_result(ins.Reply(request=rid, status=409, message=f"the job ended ({self.job.phase.value})"))
            self._write_final_status()
            await self.status_server.stop()
            await self.data_server.stop()
            await self.client.close()

    async def _conclude(self, done: ins.Finish) -> Optional[FinalStatus]:
        await self._stop_executors()
        if done.final_status is None:
            return None
        if done.final_status == "SUCCEEDED":
            diagnostics = self._success_diagnostics()
            self.job.diagnostics = diagnostics
            self._write_final_status()
            await self.am.finish(FinalStatus.SUCCEEDED, diagnostics)
            return FinalStatus.SUCCEEDED
        diagnostics = done.diagnostics or self.job.diagnostics
        self._write_final_status()
        await self.am.finish(FinalStatus.FAILED, diagnostics)
        return FinalStatus.FAILED

    def _success_diagnostics(self) -> str:
        epochs = self.training.loop.epochs_done
        final = self.metrics.objectives[-1] if self.metrics.objectives else self.metrics.initial_objective
        quality = None if self.spec.is_user_app else check_quality(self.app.name, self.final_metrics or {})
        warning = self.heldout.tracker.warning
        return (f"final objective {final:.6g} after {epochs} epochs ({self.stop_criterion}"
                f"; initial {self.metrics.initial_objective:.6g}"
                f"{'; ' + quality.describe() if quality else ''}{'; warning: ' + warning if warning else ''}"
                f"; {_describe_metrics(self.final_metrics)})")

    def _write_final_status(self) -> None:
        try:
            self.am_dir.write_bytes(FINAL_STATUS_FILE, encode_status(self.status()))
            self.am_dir.write_bytes(CONTROLLER_LOG_FILE, msgspec.json.encode(
                ControllerLog(spec=self.spec, entries=list(self.interp.log))))
        except OSError as e:
            log.warning("could not write the final status: %s", e)
        except msgspec.ValidationError as e:    # a part's section of the wrong shape: the job's end stands
            log.error("could not build the final status: %s", e)

    async def _stop_executors(self) -> None:
        self.training.loop.stop()
        await self.training.rpc.shutdown(self.pool.live())
        try:
            async with asyncio.timeout(15.0):
                await self.am.stop_all()
        except asyncio.TimeoutError:
            log.warning("stopping executor containers timed out")

    # -- hooks the interpreter calls ---------------------------------------------------------
    async def _launch(self, container_id: str, role: Role) -> None:
        c = self._containers.pop(container_id, None)
        rec = self.pool.by_container(container_id)
        if c is None or rec is None:
            return
        ok = await self.am.launch(c, self.pool.launch_context(rec))
        log.info("launched %s in %s on %s: %s", rec.executor_id, c.container_id, c.node_id,
                 "ok" if ok else c.diagnostics)

    def _release(self, container_id: str) -> None:
        c = self._containers.pop(container_id, None)
        if c is not None:
            self.am.release(c)

    def _reply(self, r: ins.Reply) -> None:
        fut = self._requests.pop(r.request, None)
        if fut is not None and not fut.done():
            fut.set_result(r)

    def _report(self, changing: bool, directive_version: int) -> None:
        if directive_version != self._applied_version:
            # A directive acted on: its co-location group is the executors' from now on, and one
            # that needed no change is recorded as done at once (`ps scale` waits for its record).
            self._applied_version = directive_version
            d = self._directives.get(directive_version)
            if d is not None:
                self.pool.harmony_group = d.group
                if not changing and directive_version not in self._recorded:
                    self._recorded.add(directive_version)
                    w, s_ = self.job.shape
                    self.directive_history.append(DirectiveRecord(
                        version=d.version, workers=d.workers, servers=d.servers, nodes=list(d.nodes),
                        before=ExecutorCounts(w, s_), steps=[], started=time.time(), seconds=0.0,
                        reason=d.reason, group=d.group, run_state=d.run_state.value))
        if changing:
            self.progress.change_started()
        else:
            self.progress.change_ended(time.time())
        self._publish_shape()
        if not changing:
            self.am.heartbeat_now()

    def _on_finish(self, f: ins.Finish) -> None:
        if self._finish is not None and not self._finish.done():
            self._finish.set_result(f)

    async def _setup(self) -> Optional[float]:
        servers, workers = self.pool.ready(Role.SERVER), self.pool.ready(Role.WORKER)
        initial = await self.training.setup(servers, workers)
        if self._init_values is not None:
            await warm_start(self.training, self._init_values)
        self.progress.start(time.time())
        self._build_cruise()
        return initial

    async def _restore_attempt(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord]) -> ResumedFrom:
        """A new attempt continues from the checkpoint an earlier one left."""
        assert self._resume is not None
        self.shape_history = BoundedHistory(HISTORY_LIMIT, decode_history(self._resume.record.shape_history))
        self.resumed_from = resumed = await resume_job(self._resume, servers, workers, self.metrics, self.steps)
        self.progress.start(time.time())
        self._build_cruise()
        return resumed

    async def _handed_over(self) -> bool:
        """Whether this attempt may take over the executors the failed one left: the RM handed
        their containers over and that attempt left its record. Handed-over containers without a
        record run nothing this attempt can use: they are stopped."""
        handed = self.am.previous_containers()
        if not handed:
            return False
        self._handover_record = await asyncio.to_thread(read_handover, self.am_dir)
        if self._handover_record is None:
            log.info("%d containers of the previous attempt were handed over but it left no record: stopping them",
                     len(handed))
            self._stop_handed(handed)
            return False
        self._handed = handed
        return True

    def _stop_handed(self, handed: list[AmContainer]) -> None:
        for c in handed:
            self.retiring.add(c.container_id)       # their exits are no losses
            rec = self.pool.by_container(c.container_id)
            if rec is not None:
                self.pool.retire(rec)
            self._in_background(self._stop_container(c, rec.executor_id if rec else "a handed-over container"))

    async def _adopt(self) -> Adoption:
        """AdoptExecutors: take over the failed attempt's executors (appmaster.ps.attempt_takeover);
        if they cannot be, every container handed over is stopped and the step fails (the start
        goes on with new executors, from the latest checkpoint)."""
        record, handed = self._handover_record, self._handed
        self._handed = []
        t0 = time.time()
        try:
            if record is None:
                raise TakeOverRefused("no record of the previous attempt")
            got = await take_over(record, handed, self.training, self.steps)
        except Exception as e:
            log.warning("the previous attempt's executors are not taken over (%s): starting new ones", e)
            self._stop_handed(handed)
            raise
        for c in got.unused:
            log.info("releasing %s: the previous attempt's record has no executor in it", c.container_id)
        self._stop_handed(got.unused)
        self.shape_history = BoundedHistory(HISTORY_LIMIT, decode_history(record.job.shape_history))
        ckpt = self._resume
        # A recovery goes back to a checkpoint on this host's view of the durable dir (a remote one
        # is fetched when resumed from, not here): else a first checkpoint of this attempt's.
        recovery_point = str(ckpt.dir) if ckpt is not None and (Path(ckpt.dir) / JOB_MANIFEST).exists() else ""
        last = self.metrics.objectives[-1] if self.metrics.objectives else self.metrics.initial_objective
        self.resumed_from = ResumedFrom(dir=str(ckpt.dir) if ckpt else "", url=ckpt.url if ckpt else "",
                                        epoch=got.epochs_done, attempt_id=record.attempt_id, objective=last,
                                        objective_restored=last, checkpoint_time=ckpt.record.time if ckpt else 0.0,
                                        time=time.time(), adopted=True,
                                        executors_adopted=len(got.servers) + len(got.workers),
                                        takeover_s=round(time.time() - t0, 4))
        self.progress.start(time.time())
        self._build_cruise()
        await self.training.status.refresh()
        return Adoption(got.servers + got.workers, got.epochs_done, recovery_point,
                        ckpt.record.epoch if ckpt is not None and recovery_point else 0)

    def _write_handover(self) -> None:
        """The record the next attempt takes the executors over with, while no change runs."""
        if self.job.change is not None or self.job.phase is not Phase.TRAINING:
            return
        record = handover_record(self.am.identity.attempt_id, self.training, self.steps, self.job_record())
        if record is not None:
            self.handover.write(record)

    async def _score(self) -> None:
        epochs = self.training.loop.epochs_done
        final = self.metrics.objectives[-1] if self.metrics.objectives else self.metrics.initial_objective
        self.stop_criterion = self._stop_criterion()
        self.final_metrics = await self.heldout.score_final(epochs - 1, final if final is not None else float("nan"),
                                                            await self.training.evaluation.model())
        await self._write_output("final", epochs)
        await self.training.status.refresh()

    def _build_cruise(self) -> None:
        """Optimizer "cruise": its driver, once training is set up (the split count comes from the
        workers; their first epoch's mini-batch times feed it)."""
        if self.spec.optimizer == "cruise" and self.cruise is None:
            self.cruise = build_cruise_driver(self.spec, self.app, self.training, self.interp.holdings,
                                              self.steps.split_count())

    async def _compute_plan(self, s: ins.ComputePlan) -> list[PlanOp]:
        """An RM directive under Cruise: the optimizer splits the granted containers (its plan's ops)."""
        if self.cruise is None:
            raise RuntimeError("Cruise plans a directive once training is set up")
        return self.cruise.plan_for(s)

    def _save_controller_log(self) -> None:
        """The controller log so far, to the AM dir (in a thread: an object store is a request):
        after every change, so a job stopped without a clean exit leaves it up to its last one."""
        data = msgspec.json.encode(ControllerLog(spec=self.spec, entries=list(self.interp.log)))
        self._in_background(asyncio.to_thread(self._write_log, data))

    def _in_background(self, aw: Awaitable[None]) -> None:
        """Run `aw` beside the job, held until it ends (the run waits for none of them)."""
        task = asyncio.ensure_future(aw)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _write_log(self, data: bytes) -> None:
        try:
            self.am_dir.write_bytes(CONTROLLER_LOG_FILE, data)
        except OSError as e:
            log.warning("could not write the controller log: %s", e)

    def record_shape_change(self, record: ShapeChange) -> None:
        """Add one finished (or failed) shape change to the history the status serves."""
        self.shape_history.append(record)
        self.progress.change_ended(time.time())     # speed is measured on the new shape from now
        self._publish_shape()

    def _change_ended(self, change: Change, rec: ChangeRecords, parts: list[ElasticOpRecord]) -> None:
        """A change left the slot: its records join the job's histories."""
        for r in parts:
            self.eps_history.append(r)
            self.shape_history.append(r.to_history())
        for rid in change.requests:
            self._started_requests.add(rid)
        if change.kind is not ChangeKind.EPS:
            nodes = sorted({e.container.node_id for e in self.pool.live() if e.state is ExecutorState.READY})
            h = change_history(change, rec, self.job.shape, self.training.loop.epochs_done,
                               self.training.loop.clocks_done, nodes)
            if h is not None:
                self.record_shape_change(h)
                if isinstance(h, SuspendChange):
                    self.suspend_history.append(h)
        if change.kind is ChangeKind.PAUSE and not change.error:
            self.pauses += 1
            self.paused_since = time.time()
            self.cut = SuspensionCut(epoch=self.training.loop.epochs_done, clock=rec.cut_clock,
                                     checkpoint=rec.checkpoint)
        if change.kind is ChangeKind.RESUME and not change.error and self.paused_since is not None:
            self.paused_s += time.time() - self.paused_since
            self.paused_since = None
        if change.kind is ChangeKind.PLAN and self.cruise is not None:
            self.cruise.ended(change, time.time(), rec.step_bytes)
        if change.kind is ChangeKind.STRAGGLER and not change.error and self._slow is not None:
            new = rec.replacements.get(self._slow.worker)
            if new is not None:
                self.stragglers.record(self._slow, new)
                self.metrics.workers.pop(self._slow.worker, None)
            self._slow = None
        if change.kind is ChangeKind.RECOVER and not change.error:
            self.recoveries += 1
            if not change.checkpoint:
                self.replacements += len(change.lost)
        if change.origin is Origin.DIRECTIVE and change.directive_version:
            d = self._directives.get(change.directive_version)
            if d is not None:
                target = change.target
                self._recorded.add(d.version)
                if change.kind in (ChangeKind.PAUSE, ChangeKind.RESUME, ChangeKind.MIGRATE):
                    steps = [(change.kind.value, 1)]
                else:
                    delta = diff(Shape(*rec.before), Shape(target.workers, target.servers)) if target else None
                    steps = delta.steps() if delta else []
                self.directive_history.append(DirectiveRecord(
                    version=d.version, workers=d.workers, servers=d.servers, nodes=list(d.nodes),
                    before=ExecutorCounts(*rec.before), steps=steps, started=rec.started,
                    seconds=round(time.time() - rec.started, 4), error=change.error, reason=d.reason,
                    group=d.group, run_state=d.run_state.value))
        self.progress.change_ended(time.time())
        self._publish_shape()
        self._save_controller_log()
        self._write_handover()

    # -- training ----------------------------------------------------------------------------
    async def _train(self) -> None:
        """Train until the end, a pause, or a failure the job does not survive. A call to a dead
        executor usually fails before its container's exit reaches the AM: then wait for the loss
        and its recovery (the controller's) -- a lost worker replaced in place lets training go
        on from where it stopped; the checkpoint path stops it (PauseTraining) and starts it again."""
        loop = self.training.loop
        while True:
            known = len(self.job.lost)
            try:
                await loop.train(self._after_epoch)
                return
            except (ExecutorCallError, StoreClientError) as e:
                if user_error(e) is not None:
                    raise
                eid = e.executor.executor_id if isinstance(e, ExecutorCallError) else None
                job = self.job
                if not await self.interp.until(
                        lambda: job.phase.is_final or job.change is not None or bool(job.pending_losses)
                        or (eid in job.lost if eid is not None else len(job.lost) > known), LOSS_REPORT_WAIT_S):
                    raise
                await self.interp.until(lambda: job.phase.is_final or loop.stopping
                                        or (job.change is None and not job.pending_losses), RECOVERY_WAIT_S)
                if job.phase.is_final or loop.stopping:
                    self._recovering_from = e     # the recovery stopped training: this error ends it
                    raise
                # A server rebuilt meanwhile explains a worker's failed pull or push (its clock runs
                # again); otherwise an executor that failed and is still a member had no loss to
                # blame: training cannot go on.
                rebuilt = any(x.role is CRole.SERVER for x in list(job.lost.values())[known:])
                if eid is not None and not rebuilt and eid in self.training.membership.worker_ids() + \
                        self.training.membership.server_ids():
                    raise                   # nothing took its place: training cannot go on
                log.info("training goes on after the recovery from %s", e)

    def _train_ended(self, err: Optional[BaseException]) -> None:
        now = time.time()
        if err is None:
            if self.training.loop.stopping and not self._training_over():
                return                      # paused at a clock boundary: the change goes on
            self.interp.feed(cev.TrainingEnded(at=now, criterion=self._stop_criterion()))
            return
        if err is self._recovering_from:
            return                          # the recovery that stopped training goes on
        # An executor's answered UserCodeError, or the user's code raising here in the AM (its
        # objective combination, convergence test): user_failure tells them from the runtime's.
        msg = user_failure(self.spec, err)
        if msg is None and isinstance(err, (ExecutorCallError, StoreClientError)):
            msg = str(err)                  # no loss reported for it: the job cannot go on
        if msg is None:
            log.error("PS job failed", exc_info=err)
            msg = f"PS job failed in phase {self.job.phase.value}: {type(err).__name__}: {err}"
        self.interp.feed(cev.UserCodeError(at=now, message=msg))

    async def _replace_lost_workers(self, lost: list[ExecutorRecord]) -> Optional[list[ExecutorRecord]]:
        """The clock loop's hook: `lost` workers' run_clock failed. Once the controller's recovery
        has put a replacement in each one's place (its splits where they stood when the clock
        began), the loop runs the clock again on them; None (the loop raises, training stops and
        the recovery takes the checkpoint path) otherwise."""
        ids = [w.executor_id for w in lost]
        job = self.job
        self._clock_redone(ids)

        def settled() -> bool:
            if all(i in self.replaced for i in ids) or job.phase.is_final:
                return True
            change = job.change
            if change is not None:
                return change.kind is ChangeKind.RECOVER and change.stage not in ("replace",)
            return all(i in job.lost for i in ids) and not job.pending_losses

        await self.interp.until(settled, LOSS_REPORT_WAIT_S)
        self._clock_redone(ids)
        if all(i in self.replaced for i in ids):
            return [self.pool.executors[self.replaced[i]] for i in ids]
        return None

    def _clock_redone(self, lost: list[str]) -> None:
        """Workers lost in a clock the loop runs again: their replacement's record says
        clock_redone (one between clocks redoes nothing). The recovery may have ended before the
        loop came to ask: then its record is in the history already."""
        rec, change = self.interp.records, self.job.change
        if rec is not None and change is not None and change.kind is ChangeKind.RECOVER:
            rec.clock_redone = True
            return
        for h in reversed(self.shape_history):
            if isinstance(h, ReplaceWorkerChange) and isinstance(h.replacements, dict) \
                    and set(lost) & set(h.replacements):
                h.clock_redone = True
                return

    def _training_over(self) -> bool:
        loop = self.training.loop
        return loop.converged or loop.early_stop is not None or \
            loop.epochs_done >= int(self.app.hparams.max_epochs)

    def _stop_criterion(self) -> str:
        loop = self.training.loop
        if loop.early_stop is not None:
            return loop.early_stop
        if len(self.metrics.objectives) < int(self.app.hparams.max_epochs):
            return (f"converged on the training objective (relative change below "
                    f"{float(self.app.hparams.convergence_threshold):g})")
        return "epoch limit"

    def _batches_by_worker(self) -> dict[str, int]:
        live = self.pool.of_role(Role.WORKER, ExecutorState.READY)
        return {w.executor_id: self.metrics.workers[w.executor_id].compute_s.count
                for w in live if w.executor_id in self.metrics.workers}

    def _after_clock(self) -> None:
        loop = self.training.loop
        self.interp.feed(cev.ClockDone(at=time.time(), clock=loop.clocks_done, epoch=loop.epochs_done,
                                       iterations=loop.iterations))
        self.progress.on_clock(self._batches_by_worker(), time.time())
        self._publish_shape()

    async def _after_epoch(self, rec: EpochRecord) -> None:
        self._write_handover()
        # rec.epoch counts from 0: after it, rec.epoch + 1 epochs are done (1.0 after the last).
        self.am.set_progress(min(1.0, (rec.epoch + 1) / max(1, int(self.app.hparams.max_epochs))))
        self.progress.on_epoch(self._batches_by_worker(), rec.time)
        self._publish_shape(rec)
        await self._watch_heldout(rec)
        self._check_straggler()
        before = self.job.change
        self.interp.feed(cev.EpochDone(at=time.time(), epoch=rec.epoch, objective=rec.objective,
                                       epoch_time_s=rec.epoch_time_s))
        change = self.job.change
        if change is not None and change is not before and change.kind is ChangeKind.CHECKPOINT:
            await self.interp.change_ended.wait()      # the checkpoint is of this epoch boundary
            if self.spec.checkpoint_every_epochs and rec.epoch + 1 > 0:
                await self._write_output("checkpoint", rec.epoch + 1)
        if self.cruise is not None and not self._stop_reason:
            await self.cruise.on_epoch(rec, self.job, self.interp.feed)

    def _check_straggler(self) -> None:
        if not self.spec.replace_stragglers:
            return
        paces = []
        for w in self.training.membership.workers:
            t = self.metrics.workers.get(w.executor_id)
            if t is not None and t.compute_s.value is not None and t.comm_s.value is not None:
                paces.append(WorkerPace(w.executor_id, t.compute_s.value + t.comm_s.value, t.compute_s.count))
        slow = self.stragglers.check(paces)
        if slow is not None:
            log.info("straggler: %s; replacing it", slow.describe())
            self._slow = slow
            self.interp.feed(cev.StragglerFound(at=time.time(), executor_id=slow.worker, why=slow.describe()))

    async def _watch_heldout(self, rec: EpochRecord) -> None:
        if self.heldout.due(rec.epoch):
            try:
                model = await self.training.evaluation.model()
            except Exception:  # noqa: BLE001 - a missed score is no reason to fail the job
                log.warning("could not pull the model for the held-out score of epoch %d", rec.epoch + 1,
                            exc_info=True)
            else:
                self.heldout.submit(rec.epoch, rec.objective, model)
        tracker = self.heldout.tracker
        if tracker.should_stop() and self.training.loop.early_stop is None:
            log.info("%s", tracker.stop_reason())
            self.training.loop.stop_early(tracker.stop_reason())

    # -- model output and warm start ---------------------------------------------------------
    async def _read_init_from(self) -> Optional[np.ndarray]:
        if not self.spec.init_from or await asyncio.to_thread(self.checkpointer.latest) is not None:
            return None
        _meta, values = await asyncio.to_thread(read_init_from, self.spec.init_from, self.app)
        return values

    async def _write_output(self, kind: str, epoch: int) -> None:
        """The model of the checkpoint the controller recorded for `epoch` (epochs done), written to
        `<output>/final/` or `<output>/epoch-N/`. Not the checkpointer's last write: an attempt that
        took the job over wrote none (its final output was skipped), and a failed checkpoint left
        an older one there (published under this epoch's name and metadata)."""
        if not self.spec.output:
            return
        ckpt = self.job.checkpoints[-1] if self.job.checkpoints else None
        if ckpt is None or ckpt[0] != epoch or not ckpt[1]:
            if kind == "final":
                raise ModelOutputError(f"output: no checkpoint of epoch {epoch} to write the final model from "
                                       f"(latest: {ckpt})")
            log.warning("output: the checkpoint of epoch %d was not taken; %s/epoch-%d is not written",
                        epoch, self.spec.output, epoch)
            return
        if self.model_output is None:
            self.model_output = ModelOutput(self.spec, self.app, self.am.identity.attempt_id)
        points = self.heldout.tracker.history
        heldout, heldout_epoch = ((self.final_metrics, epoch) if kind == "final" else
                                  (points[-1].metrics, epoch) if points and points[-1].epoch == epoch - 1 else
                                  (None, None))
        meta = self.model_output.metadata(kind, epoch, self.metrics.objectives, self.metrics.initial_objective,
                                          heldout, heldout_epoch, self.shape_history)
        await self.model_output.write(ckpt[1], meta)

    # -- the job report ----------------------------------------------------------------------
    def _publish_shape(self, rec: EpochRecord | None = None) -> None:
        m = self.metrics
        extra: dict[str, Any] = {}
        last = rec or (m.epochs[-1] if m.epochs else None)
        if last is not None:
            extra.update(epoch=last.epoch, epoch_time_s=max(0.0, last.epoch_time_s), objective=finite(last.objective))
        live = self.pool.live()
        ready = {e.executor_id for e in live if e.state is ExecutorState.READY}
        extra.update(phase=_report_phase(self.job.phase), epoch_times=recent_epoch_times(e.epoch_time_s for e in m.epochs),
                     initial_objective=finite(m.initial_objective),
                     objectives=recent_objectives((e.epoch, e.objective) for e in m.epochs),
                     clock_objectives=m.clock_objectives.report(),
                     worker_times=m.worker_timing(ready), server_times=m.server_timing(ready),
                     memory_mb=sum(e.rss_bytes for e in live) / (1024 * 1024),
                     paused=self.job.phase is Phase.PAUSED, directive_refused=self.job.refused_directive,
                     **spill_report(live))
        self.progress.changing = self.job.change is not None and self.job.change.kind not in (
            ChangeKind.START, ChangeKind.FINISH, ChangeKind.CHECKPOINT)
        self.am.set_shape(self.progress.report(self.live_shape(), self.steps.resource, self.job.applied_directive,
                                               **extra))

    async def _poll_status(self) -> None:
        while True:
            await asyncio.sleep(2.0)
            try:
                await self.training.status.refresh()
            except Exception:  # noqa: BLE001 - status is best effort; failures surface elsewhere
                log.debug("status poll failed", exc_info=True)

    # -- RM events ---------------------------------------------------------------------------
    async def _pump_events(self) -> None:
        while True:
            ev = await self.am.next_event()
            now = time.time()
            if isinstance(ev, ContainersAllocated):
                infos, unknown = [], []
                for c in ev.containers:
                    try:
                        role = Role(c.tag)
                    except ValueError:
                        log.warning("releasing container %s with unknown tag %r", c.container_id, c.tag)
                        self._containers[c.container_id] = c
                        unknown.append(c.container_id)
                        continue
                    rec = self.pool.add(role, c)
                    self._containers[c.container_id] = c
                    infos.append(ExecutorInfo(executor_id=rec.executor_id, role=CRole(role.value),
                                              container_id=c.container_id, node=c.node_id))
                self.interp.feed(cev.ContainersAllocated(at=now, containers=infos, unknown=unknown))
            elif isinstance(ev, ContainersCompleted):
                done = []
                for c in ev.containers:
                    ended = self.pool.mark_exited(c)
                    if ended is None:
                        continue
                    if c.container_id in self.retiring:
                        log.info("retired %s (%s, %s) exited", ended.executor_id, ended.role.value, c.container_id)
                    text = ended.describe_exit(self.spec.executor_memory_mb)
                    if c.container_id in self.unresponsive:
                        text += f"; stopped by the AM: {self.unresponsive[c.container_id]}"
                    if c.container_id not in self.retiring and self.job.phase.executors_expected_alive:
                        self.losses.append(text)
                        log.warning("executor lost: %s", text)
                    done.append((c.container_id, text))
                if done:
                    self.interp.feed(cev.ContainersCompleted(at=now, containers=done))
            elif isinstance(ev, NodesUpdated):
                for n in ev.nodes:
                    log.info("node %s is now %s", n.node_id, n.state)
            elif isinstance(ev, ShapeChanged):
                d = ev.directive
                if d.version > self.job.seen_directive:
                    self._directives[d.version] = d
                self.interp.feed(cev.DirectiveArrived(at=now, directive=d))
            elif isinstance(ev, Shutdown):
                self.request_stop(ev.reason)
                return

    def _stop_unresponsive(self, rec: ExecutorRecord, why: str) -> None:
        self.unresponsive[rec.container_id] = why
        self._in_background(self._stop_container(rec.container, rec.executor_id))

    async def _stop_container(self, container: AmContainer, what: str) -> None:
        try:
            await self.am.stop(container)
        except Exception:  # noqa: BLE001 - the RM's expiry of its node still reports it
            log.warning("could not stop %s (%s)", what, container.container_id, exc_info=True)

    # -- status sections ---------------------------------------------------------------------
    def eps_status(self) -> Optional[EpsStatus]:
        if self.spec.elastic_mode != "eps":
            return None
        import msgspec
        loop = self.training.loop
        started = self.steps.ledger_ready
        from ..controller.planners.eps import limits
        w, s = limits(self.job)
        current = self.interp.records.parts if self.interp.records is not None else {}
        cur = [r for r in current.values()]
        return msgspec.convert({
            "running": self.job.change is not None and self.job.change.kind is ChangeKind.EPS,
            "current": cur[-1].status() if cur else None,
            "workers": self.training.membership.worker_ids(), "servers": self.training.membership.server_ids(),
            "minibatches_applied": loop.minibatches_applied, "minibatches_run": loop.minibatches_run,
            "audit_mismatches": list(loop.audit_mismatches),
            "history": [r.status() for r in self.eps_history],
            "limits": {"workers": w, "servers": s, "min_workers": 1, "min_servers": 1} if started else None,
            "datasets": self.steps.splits().to_json() if started else None}, EpsStatus)

    def cruise_status(self) -> Optional[CruiseStatus]:
        return self.cruise.status(self.job.change) if self.cruise is not None else None

    def recovery_status(self) -> RecoveryStatus:
        return RecoveryStatus(enabled=self.spec.max_executor_failures > 0,
                              max_executor_failures=self.spec.max_executor_failures, failures=self.job.failures,
                              losses=list(self.losses), recoveries=self.recoveries, replacements=self.replacements)

    def suspension_status(self) -> SuspensionStatus:
        state = {Phase.PAUSING: "PAUSING", Phase.PAUSED: "PAUSED", Phase.RESUMING: "RESUMING"}.get(self.job.phase,
                                                                                               "RUNNING")
        paused = self.paused_s + (time.time() - self.paused_since if self.paused_since is not None else 0.0)
        return SuspensionStatus(state=state, pauses=self.pauses, paused_s=round(paused, 3), cut=self.cut,
                                history=list(self.suspend_history))

    def straggler_status(self) -> StragglerStatus:
        return msgspec.convert(self.stragglers.status_json(), StragglerStatus)


def _report_phase(phase: Phase) -> str:
    """The job report's phase: the RM's policies know TRAINING for a job whose shape changes live."""
    return "TRAINING" if phase.trains else phase.value


def _describe_metrics(metrics: dict[str, float] | None) -> str:
    if not metrics:
        return "no held-out metrics"
    return "held-out " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
