"""The PS ApplicationMaster: one parameter-server training job from launch to final status.

Phases (appmaster.ps.job): register with the RM (tracking URL = the status server) -> ask for S
server containers and launch executors in them -> the same for W workers -> set up (blocks
round-robin over servers, partitions over workers) -> train in clocks, epoch by epoch -> final checkpoint and
held-out evaluation -> unregister SUCCEEDED with "final objective X after N epochs (...)".

An executor container that ends while the job needs it, and was not retired on purpose, is a loss
(the RM reports its completion: it died, was killed, or its node was lost). The executor pool
learns it and fails every request still waiting on it (appmaster.ps.executor_pool), and
appmaster.ps.recovery recovers: a lost worker is replaced and training goes on; otherwise every
executor is replaced and the job goes back to its latest checkpoint. A worker that stops answering
is given up after the clock loop's reply deadline and its container stopped, so its loss comes the
same way. Only beyond the spec's max_executor_failures (or with nothing to recover from) is the job
failed: every executor is stopped and the AM unregisters FAILED naming the executor, its role,
container and exit status.
SIGTERM or the RM's shutdown stops the executors and exits without unregistering (the RM has
already decided the app's fate), like YARN's distributed shell.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np

from protocol import container_env, tokens
from protocol.checkpoint_manifest import JobRecord
from protocol.durable_storage import DurableDir
from protocol.internal_api import ShapeDirective, counts_on_nodes
from protocol.job_report import finite, recent_epoch_times, recent_objectives
from protocol.shape_history import ShapeChange
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import FINAL_STATUS_FILE, PsStatus, ResumedFrom, encode_status
from protocol.records import FinalStatus, Resource
from protocol.remote_exception import ApiError, BadRequest, Conflict
from psruntime.apps.quality import check_quality
from psruntime.apps.registry import create_job_app
from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer
from psruntime.wire.dataplane_auth import secret_key
from psruntime.store.store_client import StoreClientError

from ..am_client import ApplicationMaster
from ..am_events import ContainersAllocated, ContainersCompleted, NodesUpdated, ShapeChanged, Shutdown
from ..container_book import AmContainer
from .checkpoints import Checkpointer
from .cruise_driver import CruiseDriver, build_cruise_driver
from .directives import DirectiveHandler, ProgressTracker, Reshaper, Shape
from .elastic_ops import ElasticOpError, ElasticOps
from .executor_pool import ExecutorPool, ExecutorRecord, ExecutorState, Role
from .executor_rpc import ExecutorCallError
from .executor_status import spill_report
from .heldout_monitor import HeldoutMonitor
from .job import JobEvent, JobPhase, JobStateMachine
from .job_resume import job_record, resumable_checkpoint, resume_job
from .kill_restart import KillRestart, ResizeReply
from .metrics import EpochRecord, JobMetrics
from .model_output import ModelOutput, read_init_from, warm_start
from .reconfiguration import LaunchFailed, Reconfiguration
from .recovery import LOSS_REPORT_WAIT_S, ExecutorRecovery
from .status_server import ControlAuth, StatusServer
from .status_view import job_status
from .suspension import JobSuspension
from .stragglers import StragglerWatch, WorkerPace
from .training import Training
from .user_errors import user_error, user_failure

log = logging.getLogger(__name__)

EXECUTOR_START_TIMEOUT_S = 120.0    # containers granted and executors announced
FAILURE_REPORT_GRACE_S = 10.0       # how long a failed call waits for the container's exit status
STATUS_POLL_S = 2.0


class PSApplicationMaster:
    """Runs one PS job (see the module doc); `run()` returns the final status, None if stopped."""

    def __init__(self, am: ApplicationMaster, spec: PSJobSpec, am_dir: str | Path, host: str = "127.0.0.1",
                 python: str = "python") -> None:
        self.am = am
        self.spec = spec
        self.host = host
        self.app = create_job_app(spec)     # a user app's errors: appmaster.ps.user_errors
        self.job = JobStateMachine()
        self.metrics = JobMetrics()
        # Job traffic is authenticated with the attempt's secret from the RM; an AM started without
        # one (by hand) makes its own, so its executors and data plane are never unauthenticated.
        job_secret = am.identity.job_secret
        if not job_secret:
            log.warning("no %s in the environment: using a secret of this AM's own", container_env.JOB_SECRET)
            job_secret = tokens.generate_secret()
        key = secret_key(job_secret)
        self.client = DataPlaneClient(secret=key)
        # The pool marks a lost executor's address lost on the client: what waits on it ends.
        self.pool = ExecutorPool(spec.num_blocks, python=python, job_secret=job_secret,
                                 use_arbiter=spec.use_arbiter, links=self.client, resources=spec.resources)
        self.data_server = DataPlaneServer(self.pool.handle_frame, host, 0, secret=key)
        self.status_server = StatusServer(self.status, self.request_checkpoint, host, 0, scale=self.request_scale,
                                          control_auth=ControlAuth(job_secret, am.identity.attempt_id))
        self.am_dir = DurableDir(am_dir)    # a path or an fsspec URL every host reads (rm.toml checkpoint_dir)
        self.checkpointer = Checkpointer(self.am_dir.child("checkpoints"), self.client)
        self.training = Training.build(spec, self.app, self.pool, self.metrics, self.client,
                                       on_clock=self._after_clock)
        self.resource = Resource(spec.executor_memory_mb, spec.executor_vcores)
        self.final_metrics: Optional[dict[str, float]] = None
        self.resumed_from: Optional[ResumedFrom] = None   # the checkpoint an earlier attempt left
        self.model_output: Optional[ModelOutput] = None       # the job's `output`, made when first written
        # Held-out quality every few epochs, scored in a thread while training goes on -- unless
        # a copy of the model and its scoring would crowd the AM's own container.
        self.heldout = HeldoutMonitor(self.app, spec.heldout_every_epochs, spec.early_stopping,
                                      am_memory_mb=os.environ.get(container_env.CONTAINER_MEMORY_MB))
        self.stop_criterion: Optional[str] = None     # what ended training (final diagnostics)
        self.started = time.time()
        self._failure: asyncio.Future[str] | None = None
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._checkpoint_requests: list[asyncio.Future[dict[str, Any]]] = []
        # Workers given up on after the clock's reply deadline (container id -> why): stopped here,
        # their loss comes back as their containers' completion.
        self.unresponsive: dict[str, str] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self.training.loop.on_unresponsive = self._stop_unresponsive
        # Elastic scaling: the reconfiguration steps, the mechanism composed of them that changes
        # the shape (EPS's functions, or the kill-based baseline for elastic_mode "kill"; Cruise
        # on top when the optimizer is "cruise"), the RM's shape directives acted on through it,
        # and every change made so far.
        self.retiring: set[str] = set()          # containers stopped on purpose: their exit is no failure
        self.shape_history: list[ShapeChange] = []
        self.steps = Reconfiguration(am, self.training, self.checkpointer, self.resource, self.retiring,
                                     started=lambda: self.job.phase is JobPhase.TRAINING)
        self.elastic: ElasticOps | KillRestart = (
            KillRestart(spec, self.app, self.steps, lambda: self.job.phase, on_record=self.record_shape_change,
                        job_record=self.job_record)
            if spec.elastic_mode == "kill" else
            ElasticOps(spec, self.steps, lambda: self.job.phase, on_start=self._publish_shape,
                       on_record=self.record_shape_change))
        self.recovery = ExecutorRecovery(spec, self.app, self.steps, lambda: self.job.phase,
                                         on_record=self.record_shape_change)
        if self.recovery.enabled:      # a worker lost mid-clock is replaced inside the clock loop
            self.training.loop.replace_lost_workers = self.recovery.replace_lost_workers
        # Harmony's pause / resume (directive run states): a checkpoint and no executors in between.
        self.suspension = JobSuspension(self.steps, self.job_record, on_record=self.record_shape_change,
                                        on_state=self._publish_shape)
        self.progress = ProgressTracker(spec.early_feedback_iterations)
        self.stragglers = StragglerWatch()     # Optimus §5.2: slow workers replaced at epoch ends
        self.cruise: Optional[CruiseDriver] = None    # optimizer "cruise": built once training is set up
        self.directives = DirectiveHandler(self._reshaper, self.live_shape, spec.max_workers,
                                           spec.max_servers, on_change=self._on_directive_change,
                                           placed=self.pool.placed, suspender=self.suspension,
                                           min_workers=spec.min_workers, min_servers=spec.min_servers,
                                           executor_resource=lambda: self.steps.resource,
                                           on_group=self._set_harmony_group)

    # -- public ------------------------------------------------------------------------------
    def request_stop(self, reason: str = "stopped by SIGTERM") -> None:
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    def status(self) -> PsStatus:
        """The job status the HTTP endpoint serves and status.json keeps (appmaster.ps.status_view)."""
        return job_status(self)

    def max_epochs(self) -> Optional[int]:
        """The app's epoch limit (its hyper-parameters' max_epochs), None for an app without one."""
        limit = getattr(self.app.hparams, "max_epochs", None)
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    async def request_scale(self, workers: int, servers: int) -> list[ResizeReply]:
        """POST /scale: a relative change of workers and servers with EPS's functions, or one
        restart with the new shape under the kill-based baseline (elastic_mode "kill")."""
        if self.suspension.paused:
            raise Conflict(f"the job is {self.suspension.state.value.lower()}: its shape changes when it resumes")
        if isinstance(self.elastic, KillRestart):
            shape = self.live_shape()
            return [await self.elastic.resize(shape.workers + workers, shape.servers + servers)]
        if not isinstance(self.elastic, ElasticOps):
            raise Conflict(f"this job's elastic_mode is {self.spec.elastic_mode!r}: /scale needs \"eps\"")
        try:
            return [r.to_json() for r in await self.elastic.scale(workers, servers)]
        except ElasticOpError as e:
            raise {400: BadRequest, 409: Conflict}.get(e.http_status, ApiError)(str(e)) from None

    def _set_harmony_group(self, group: Optional[str]) -> None:
        self.pool.harmony_group = group     # the applied directive's: for the executors launched from now on

    def _reshaper(self) -> Reshaper:
        return self.cruise if self.cruise is not None else self.elastic

    def live_shape(self) -> Shape:
        """Workers and servers serving now (launched executors that announced themselves)."""
        return Shape(len(self.pool.of_role(Role.WORKER, ExecutorState.READY)),
                     len(self.pool.of_role(Role.SERVER, ExecutorState.READY)))

    def record_shape_change(self, record: ShapeChange) -> None:
        """Add one finished (or failed) shape change to the history the status serves."""
        self.shape_history.append(record)
        self.progress.change_ended(time.time())     # speed is measured on the new shape from now
        self._publish_shape()

    async def request_checkpoint(self) -> dict[str, Any]:
        """Checkpoint at the next epoch boundary (now, if training is between epochs)."""
        if self.job.phase is not JobPhase.TRAINING:
            raise Conflict(f"no checkpoint in phase {self.job.phase.value}: the model exists only while training")
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._checkpoint_requests.append(fut)
        return await fut

    async def run(self) -> Optional[FinalStatus]:
        self._failure = asyncio.get_running_loop().create_future()
        await asyncio.to_thread(self.am_dir.makedirs)    # a request on an object store
        self.pool.am_address = await self.data_server.start()
        url = await self.status_server.start()
        pump = asyncio.create_task(self._pump_events(), name="ps-am-events")
        drive = asyncio.create_task(self._drive(url), name="ps-am-drive")
        stop = asyncio.create_task(self._stop.wait())
        try:
            waits: set[asyncio.Future[Any]] = {drive, self._failure, stop}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return await self._conclude(drive)
        finally:
            for t in (pump, drive, stop):
                t.cancel()
            self.heldout.cancel()
            await asyncio.gather(pump, drive, stop, return_exceptions=True)
            await self.directives.close()
            if self.cruise is not None:
                await self.cruise.close()
            self._resolve_checkpoints(Conflict(f"the job ended ({self.job.phase.value})"))
            self._write_final_status()
            await self.status_server.stop()
            await self.data_server.stop()
            await self.client.close()

    def _write_final_status(self) -> None:
        """Leave the last status in the AM dir: the HTTP endpoint goes away with the AM."""
        try:
            self.am_dir.write_bytes(FINAL_STATUS_FILE, encode_status(self.status()))
        except OSError as e:
            log.warning("could not write the final status: %s", e)
        except msgspec.ValidationError as e:    # a part's section of the wrong shape: the job's end stands
            log.error("could not build the final status: %s", e)

    # -- the phases --------------------------------------------------------------------------
    async def _drive(self, url: str) -> str:
        await self.am.register(self.host, self.status_server.port, url)
        self.job.apply(JobEvent.REGISTERED)
        init_values = await self._read_init_from()
        first = await self._first_directive()
        await self._launch(Role.SERVER, first.servers if first else self.spec.servers, first)
        self.job.apply(JobEvent.SERVERS_READY)
        await self._launch(Role.WORKER, first.workers if first else self.spec.workers, first)
        self.job.apply(JobEvent.WORKERS_READY)
        self._publish_shape()
        servers, workers = self.pool.ready(Role.SERVER), self.pool.ready(Role.WORKER)
        # In a thread: on an object store the look-up is a listing and a read per checkpoint, round
        # trips that would otherwise hold up this loop (and the RM heartbeats it sends).
        resume = await asyncio.to_thread(resumable_checkpoint, self.checkpointer, self.spec, self.app)
        if resume is None:
            await self.training.setup(servers, workers)
            if init_values is not None:
                await warm_start(self.training, init_values)
        else:      # a new attempt: continue from the checkpoint the failed one left
            self.shape_history = list(resume.record.shape_history)
            self.resumed_from = await resume_job(resume, servers, workers, self.metrics, self.steps)
        self.job.apply(JobEvent.INITIALISED)
        self.progress.start(time.time())
        self._publish_shape()
        if self.spec.optimizer == "cruise" and isinstance(self.elastic, ElasticOps):
            # RM directives go through Cruise from now on
            self.cruise = build_cruise_driver(self.spec, self.app, self.steps, on_change=self._on_directive_change)
        self.directives.training_started()
        if self.recovery.enabled and not self.checkpointer.written:
            await self._checkpoint(self.training.loop.epochs_done)    # what a recovery goes back to
        poller = asyncio.create_task(self._poll_status())
        try:
            await self._train()
        finally:
            poller.cancel()
        self.job.apply(JobEvent.TRAINED)
        epochs = self.training.loop.epochs_done
        if not self.checkpointer.written or self.checkpointer.written[-1]["epoch"] != epochs:
            await self._checkpoint(epochs)
        final = self.metrics.objectives[-1] if self.metrics.objectives else self.metrics.initial_objective
        self.stop_criterion = self._stop_criterion()
        self.final_metrics = await self.heldout.score_final(epochs - 1, final if final is not None else float("nan"),
                                                            await self.training.evaluation.model())
        await self._write_output("final", epochs)
        await self.training.status.refresh()
        # A user's app has no generator's true model to be held against.
        quality = None if self.spec.is_user_app else check_quality(self.app.name, self.final_metrics)
        warning = self.heldout.tracker.warning
        # The held-out metrics stay last: `elastane ps` reads them from there (elastane_cli.ps_reports).
        return (f"final objective {final:.6g} after {epochs} epochs ({self.stop_criterion}"
                f"; initial {self.metrics.initial_objective:.6g}"
                f"{'; ' + quality.describe() if quality else ''}{'; warning: ' + warning if warning else ''}"
                f"; {_describe_metrics(self.final_metrics)})")

    def _stop_criterion(self) -> str:
        """Which criterion ended training: early stopping, the training objective, the epoch limit."""
        loop = self.training.loop
        if loop.early_stop is not None:
            return loop.early_stop
        if len(self.metrics.objectives) < int(self.app.hparams.max_epochs):
            return (f"converged on the training objective (relative change below "
                    f"{float(self.app.hparams.convergence_threshold):g})")
        return "epoch limit"

    async def _train(self) -> None:
        """Train to the end; after an executor loss the job may survive (appmaster.ps.recovery):
        a lost worker is replaced inside the clock loop, or here when training stopped first;
        otherwise its executors are replaced, it goes back to the latest checkpoint, and trains on."""
        while True:
            try:
                if isinstance(self.elastic, KillRestart):
                    await self.elastic.train_with_restarts(self._after_epoch)
                else:
                    await self.training.loop.train(self._after_epoch)
            except (ExecutorCallError, StoreClientError) as e:
                # A call to a dead executor (a control op, or the AM's own store client: the audit,
                # the model) usually fails before its container's exit reaches us. A user app's
                # error is no loss: it fails the job at once.
                if user_error(e) is not None or not await self.recovery.loss_reported(LOSS_REPORT_WAIT_S):
                    raise
            if await self.suspension.hold_if_requested(self._stop.is_set):
                continue        # paused, then resumed from the pause's checkpoint: train on
            if not self.recovery.pending or self._stop.is_set():
                return
            await self.recovery.recover()
            self._publish_shape()

    def job_record(self) -> JobRecord:
        """What a checkpoint records about the job besides the model (appmaster.ps.job_resume)."""
        return job_record(self.spec, self.am.identity.attempt_id, self.metrics, self.shape_history,
                          self.training.loop)

    async def _first_directive(self) -> Optional[ShapeDirective]:
        """Under a policy that places new jobs (the RM says so at registration: Harmony), the
        first directive that runs the job: how many executors it starts with, of what size, and
        where. Without one it would start its submitted shape wherever first fit puts it, then
        move at once (Harmony's profiling node); a job whose spec has a placement keeps it."""
        reg = self.am.registration
        if reg is None or not reg.policy_places_new_jobs or self.spec.placement:
            return None
        log.info("the RM's policy places new jobs: waiting for its first directive before starting executors")
        d = await self.directives.first_run_directive()
        if d.executor_resource is not None:
            self.resource = self.steps.resource = d.executor_resource
        log.info("first directive v%d: %d workers, %d servers on %s", d.version, d.workers, d.servers,
                 [(p.node, p.workers, p.servers) for p in d.placement] or "any node")
        return d

    async def _launch(self, role: Role, count: int, first: Optional[ShapeDirective] = None) -> None:
        """The job's first executors of `role`: where `first` (the policy's first directive, see
        `_first_directive`) or else the spec's `placement` puts them (one strict
        ask per node, `Reconfiguration.start_placed`; a node that is unknown or full waits like any
        ask, until the launch timeout), else anywhere they fit. Only this first launch (and a new
        attempt's, which is a first launch too) obeys the placement: later starts follow their own
        request -- a kill-based reshape or a resume the directive's placement, a recovery that
        restarts the spec's shape anywhere -- since by then the policy, not the spec, places the job."""
        if first is not None and first.placement:
            placement, whose = first.placement, "the policy's first directive"
        else:
            placement, whose = self.spec.placement, "the spec's placement"
        per_node = counts_on_nodes(placement, role)
        if not per_node:
            self.am.add_ask(count, self.resource, tag=role.value)
            await self.pool.wait_ready(role, count, EXECUTOR_START_TIMEOUT_S)
            return
        try:
            await self.steps.start_placed(role, per_node)
        except LaunchFailed as e:
            raise LaunchFailed(f"{e} ({whose} asks for them on exactly {per_node})") from None

    def _batches_by_worker(self) -> dict[str, int]:
        live = self.pool.of_role(Role.WORKER, ExecutorState.READY)
        return {w.executor_id: self.metrics.workers[w.executor_id].compute_s.count
                for w in live if w.executor_id in self.metrics.workers}

    def _after_clock(self) -> None:
        """After every BSP clock: the iterations (early feedback, speed) reach the RM per clock."""
        self.progress.on_clock(self._batches_by_worker(), time.time())
        self._publish_shape()

    async def _after_epoch(self, rec: EpochRecord) -> None:
        self.am.set_progress(min(1.0, rec.epoch / max(1, int(self.app.hparams.max_epochs))))
        self.progress.on_epoch(self._batches_by_worker(), rec.time)
        self._publish_shape(rec)
        await self._replace_straggler()
        await self._watch_heldout(rec)
        every = self.spec.checkpoint_every_epochs
        due = every > 0 and (rec.epoch + 1) % every == 0
        if due or self._checkpoint_requests:
            await self._checkpoint(rec.epoch + 1)
        if self.cruise is not None and not self._stop.is_set():
            await self.cruise.on_epoch(rec)
        if self._stop.is_set():
            self.training.loop.stop()

    async def _replace_straggler(self) -> None:
        """Optimus §5.2 at an epoch end, for a job that asks for it (`replace_stragglers`): a worker
        confirmed much slower than its peers is replaced (appmaster.ps.stragglers,
        ExecutorRecovery.replace_straggler)."""
        if not self.spec.replace_stragglers:
            return
        paces = []
        for w in self.training.membership.workers:
            t = self.metrics.workers.get(w.executor_id)
            if t is not None and t.compute_s.value is not None and t.comm_s.value is not None:
                paces.append(WorkerPace(w.executor_id, t.compute_s.value + t.comm_s.value, t.compute_s.count))
        slow = self.stragglers.check(paces)
        if slow is None or self._stop.is_set():
            return
        worker = next(w for w in self.training.membership.workers if w.executor_id == slow.worker)
        log.info("straggler: %s; replacing it", slow.describe())
        new = await self.recovery.replace_straggler(worker, slow.describe())
        if new is not None:
            self.stragglers.record(slow, new.executor_id)
            self.metrics.workers.pop(slow.worker, None)
            self._publish_shape()

    async def _watch_heldout(self, rec: EpochRecord) -> None:
        """Every few epochs hand the model to the held-out monitor (pulled now, at the epoch
        boundary; scored in a thread while the next epoch trains), and end training when early
        stopping says so."""
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

    async def _checkpoint(self, epoch: int) -> dict[str, Any]:
        objective = self.metrics.objectives[-1] if self.metrics.objectives else self.metrics.initial_objective
        try:
            info = await self.steps.checkpoint(epoch, msgspec.structs.replace(self.job_record(), objective=objective))
        except Exception as e:
            self._resolve_checkpoints(e)
            raise
        self._resolve_checkpoints(info)
        log.info("checkpoint of epoch %d in %s", epoch, info["dir"])
        if self.spec.checkpoint_every_epochs and epoch > 0:
            await self._write_output("checkpoint", epoch)
        return info

    # -- model output and warm start (appmaster.ps.model_output, docs/model_output.md) -------
    async def _read_init_from(self) -> Optional[np.ndarray]:
        """The saved model's values `init_from` names (checked against this job's app and shape),
        None without one or when a checkpoint of an earlier attempt will be resumed instead."""
        if not self.spec.init_from or await asyncio.to_thread(self.checkpointer.latest) is not None:
            return None
        _meta, values = await asyncio.to_thread(read_init_from, self.spec.init_from, self.app)
        return values

    async def _write_output(self, kind: str, epoch: int) -> None:
        """The model of the latest checkpoint (after `epoch` epochs) to `output`, if the job has one."""
        last = self.checkpointer.last
        if not self.spec.output or last is None:
            return
        if self.model_output is None:
            self.model_output = ModelOutput(self.spec, self.app, self.am.identity.attempt_id)
        points = self.heldout.tracker.history
        heldout, heldout_epoch = ((self.final_metrics, epoch) if kind == "final" else
                                  (points[-1].metrics, epoch) if points and points[-1].epoch == epoch - 1 else
                                  (None, None))
        meta = self.model_output.metadata(kind, epoch, self.metrics.objectives, self.metrics.initial_objective,
                                          heldout, heldout_epoch, self.shape_history)
        await self.model_output.write(last["dir"], meta)

    def _resolve_checkpoints(self, outcome: dict[str, Any] | BaseException) -> None:
        pending, self._checkpoint_requests = self._checkpoint_requests, []
        for fut in pending:
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    def _publish_shape(self, rec: EpochRecord | None = None) -> None:
        """The job report (protocol.job_report) the RM's policy reads on each heartbeat."""
        m = self.metrics
        extra: dict[str, Any] = {}
        last = rec or (m.epochs[-1] if m.epochs else None)
        if last is not None:
            extra.update(epoch=last.epoch, epoch_time_s=max(0.0, last.epoch_time_s), objective=finite(last.objective))
        live = self.pool.live()
        ready = {e.executor_id for e in live if e.state is ExecutorState.READY}
        extra.update(phase=self.job.phase.value, epoch_times=recent_epoch_times(e.epoch_time_s for e in m.epochs),
                     initial_objective=finite(m.initial_objective),
                     objectives=recent_objectives((e.epoch, e.objective) for e in m.epochs),
                     clock_objectives=m.clock_objectives.report(),
                     worker_times=m.worker_timing(ready), server_times=m.server_timing(ready),
                     memory_mb=sum(e.rss_bytes for e in live) / (1024 * 1024),
                     paused=self.suspension.paused, **spill_report(live))
        self.progress.changing = self.directives.busy or self.steps.busy or self.elastic.changing
        self.am.set_shape(self.progress.report(self.live_shape(), self.steps.resource, self.directives.applied_version,
                                               **extra))

    def _on_directive_change(self, running: bool) -> None:
        if running:
            self.progress.change_started()
        else:
            self.progress.change_ended(time.time())
        self._publish_shape()
        if not running:     # the RM's record of the job (what `ps scale` waits for) gets the new shape now
            self.am.heartbeat_now()

    async def _poll_status(self) -> None:
        while True:
            await asyncio.sleep(STATUS_POLL_S)
            try:
                await self.training.status.refresh()
            except Exception:  # noqa: BLE001 - status is best effort; failures surface elsewhere
                log.debug("status poll failed", exc_info=True)

    # -- RM events ---------------------------------------------------------------------------
    async def _pump_events(self) -> None:
        while True:
            ev = await self.am.next_event()
            if isinstance(ev, ContainersAllocated):
                await asyncio.gather(*(self._launch_executor(c) for c in ev.containers))
            elif isinstance(ev, ContainersCompleted):
                for c in ev.containers:
                    self._on_completed(c)
            elif isinstance(ev, NodesUpdated):
                for n in ev.nodes:
                    log.info("node %s is now %s", n.node_id, n.state)
            elif isinstance(ev, ShapeChanged):
                self.directives.on_directive(ev.directive)
            elif isinstance(ev, Shutdown):
                self.request_stop(ev.reason)
                return

    async def _launch_executor(self, c: AmContainer) -> None:
        try:
            role = Role(c.tag)
        except ValueError:
            log.warning("releasing container %s with unknown tag %r", c.container_id, c.tag)
            self.am.release(c)
            return
        rec = self.pool.add(role, c)
        ok = await self.am.launch(c, self.pool.launch_context(rec))
        log.info("launched %s in %s on %s: %s", rec.executor_id, c.container_id, c.node_id,
                 "ok" if ok else c.diagnostics)

    def _on_completed(self, c: AmContainer) -> None:
        rec = self.pool.mark_exited(c)
        if rec is None:
            return
        if c.container_id in self.retiring:
            log.info("retired %s (%s, %s) exited", rec.executor_id, rec.role.value, c.container_id)
            return
        text = rec.describe_exit(self.spec.executor_memory_mb)
        if c.container_id in self.unresponsive:
            text += f"; stopped by the AM: {self.unresponsive[c.container_id]}"
        if self.job.phase.executors_expected_alive:
            fatal = self.recovery.on_lost(text, rec)
            if fatal is None:
                if self.recovery.rollback_needed:
                    self.training.loop.stop()  # training returns at its next boundary, then recovers
                return                         # (a lost worker is replaced at its next clock)
            log.error("executor lost: %s", fatal)
            self._fail(fatal)
        else:
            log.info("%s", text)

    def _stop_unresponsive(self, rec: ExecutorRecord, why: str) -> None:
        """The clock loop gave `rec` up (no reply by its deadline): stop its container, so that its
        completion reports the loss and the job recovers as from any other (a hung process never
        exits on its own; one on a dead node is released through the RM)."""
        self.unresponsive[rec.container_id] = why
        task = asyncio.ensure_future(self._stop_container(rec))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop_container(self, rec: ExecutorRecord) -> None:
        try:
            await self.am.stop(rec.container)
        except Exception:  # noqa: BLE001 - the RM's expiry of its node still reports it
            log.warning("could not stop %s (%s)", rec.executor_id, rec.container_id, exc_info=True)

    def _fail(self, diagnostics: str) -> None:
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(diagnostics)

    # -- the end ---------------------------------------------------------------------------
    async def _conclude(self, drive: asyncio.Task[str]) -> Optional[FinalStatus]:
        assert self._failure is not None
        if drive.done() and not drive.cancelled() and drive.exception() is None:
            self.job.apply(JobEvent.FINISHED, drive.result())
            await self._stop_executors()
            self._write_final_status()
            await self.am.finish(FinalStatus.SUCCEEDED, self.job.diagnostics)
            return FinalStatus.SUCCEEDED
        if self._stop.is_set() and not self._failure.done():
            self.job.try_apply(JobEvent.STOP, self._stop_reason)
            await self._stop_executors()
            return None
        diagnostics = await self._failure_diagnostics(drive)
        self.job.try_apply(JobEvent.FAIL, diagnostics)
        await self._stop_executors()
        if self._stop.is_set():
            return None          # stopped meanwhile: the RM already decided the app's fate
        self._write_final_status()
        await self.am.finish(FinalStatus.FAILED, diagnostics)
        return FinalStatus.FAILED

    async def _failure_diagnostics(self, drive: asyncio.Task[str]) -> str:
        assert self._failure is not None
        if self._failure.done():
            return self._failure.result()
        err = drive.exception() if drive.done() and not drive.cancelled() else None
        if err is not None and (user := user_failure(self.spec, err)) is not None:
            return user
        if isinstance(err, ExecutorCallError):
            # The executor probably died: its container's exit status names why; wait for it briefly.
            try:
                return await asyncio.wait_for(asyncio.shield(self._failure), FAILURE_REPORT_GRACE_S)
            except asyncio.TimeoutError:
                return str(err)
        log.error("PS job failed", exc_info=err)
        return f"PS job failed in phase {self.job.phase.value}: {type(err).__name__}: {err}"

    async def _stop_executors(self) -> None:
        self.training.loop.stop()
        await self.training.rpc.shutdown(self.pool.live())
        try:
            await asyncio.wait_for(self.am.stop_all(), 15.0)
        except asyncio.TimeoutError:
            log.warning("stopping executor containers timed out")


def _describe_metrics(metrics: dict[str, float] | None) -> str:
    if not metrics:
        return "no held-out metrics"
    return "held-out " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
