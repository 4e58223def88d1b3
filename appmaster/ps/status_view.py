"""The PS AM's job status as one record: `job_status` projects the AM's parts into a
protocol.ps_status.PsStatus, which `GET /status` serves (appmaster.ps.status_server) and
`status.json` keeps once the AM exits (protocol.ps_status.FINAL_STATUS_FILE); every reader decodes
that same Struct (`decode_status` / `read_status`).

The parts that keep their own records (the pool's shape, held-out scores, directives, Cruise,
suspension, spill) give them as Structs; those that answer JSON of their own (metrics, EPS,
recovery, stragglers, the checkpoints written) are converted here into their typed sections, so a
section of the wrong shape fails when the status is built, not in a reader.
"""
from __future__ import annotations

from typing import Optional, Protocol, TypeVar

import msgspec

from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import (CheckpointInfo, EpsStatus, MetricsStatus, PsStatus, RecoveryStatus, ResumedFrom,
                                StragglerStatus)
from protocol.shape_history import ShapeChange
from psruntime.apps.base import AnyPSApp

from ..am_client import ApplicationMaster
from .checkpoints import Checkpointer
from .cruise_driver import CruiseDriver
from .directives import DirectiveHandler
from .elastic_ops import ElasticOps
from .executor_pool import ExecutorPool
from .executor_status import spill_status
from .heldout_monitor import HeldoutMonitor
from .job import JobStateMachine
from .kill_restart import KillRestart
from .metrics import JobMetrics
from .recovery import ExecutorRecovery
from .stragglers import StragglerWatch
from .suspension import JobSuspension
from .training import Training

S = TypeVar("S", bound=msgspec.Struct)


class StatusSource(Protocol):
    """The parts of the PS AM the status projects (appmaster.ps.master.PSApplicationMaster has them)."""

    @property
    def am(self) -> ApplicationMaster: ...
    @property
    def spec(self) -> PSJobSpec: ...
    @property
    def app(self) -> AnyPSApp: ...
    @property
    def job(self) -> JobStateMachine: ...
    @property
    def started(self) -> float: ...
    @property
    def pool(self) -> ExecutorPool: ...
    @property
    def training(self) -> Training: ...
    @property
    def metrics(self) -> JobMetrics: ...
    @property
    def checkpointer(self) -> Checkpointer: ...
    @property
    def heldout(self) -> HeldoutMonitor: ...
    @property
    def stop_criterion(self) -> Optional[str]: ...
    @property
    def final_metrics(self) -> Optional[dict[str, float]]: ...
    @property
    def shape_history(self) -> list[ShapeChange]: ...
    @property
    def directives(self) -> DirectiveHandler: ...
    @property
    def elastic(self) -> ElasticOps | KillRestart: ...
    @property
    def cruise(self) -> Optional[CruiseDriver]: ...
    @property
    def resumed_from(self) -> Optional[ResumedFrom]: ...
    @property
    def recovery(self) -> ExecutorRecovery: ...
    @property
    def suspension(self) -> JobSuspension: ...
    @property
    def stragglers(self) -> StragglerWatch: ...

    def max_epochs(self) -> Optional[int]: ...


def _typed(obj: object, kind: type[S]) -> S:
    """A part's own JSON as its status section (a Struct passes through)."""
    return msgspec.convert(obj, kind)


def job_status(am: StatusSource) -> PsStatus:
    """The job status now: what `/status` serves and `status.json` keeps (see the module doc)."""
    loop = am.training.loop
    reg = am.am.registration
    return PsStatus(
        app=am.spec.app, attempt_id=am.am.identity.attempt_id, application_id=reg.app_id if reg else None,
        state=am.job.phase.value, diagnostics=am.job.diagnostics, spec=am.spec, started=am.started,
        shape=am.pool.shape_status(), num_blocks=am.spec.num_blocks, table_version=am.training.placement.version,
        epoch=loop.epochs_done, max_epochs=am.max_epochs(), converged=loop.converged,
        clocks=loop.clocks_done, clock_batches=loop.pacer.batches,
        initial_objective=am.metrics.initial_objective,
        objective_history=[e.result() for e in am.metrics.epochs],
        metrics=_typed(am.metrics.to_json(), MetricsStatus),
        checkpoints=[_typed(c, CheckpointInfo) for c in am.checkpointer.written],
        heldout=am.heldout.tracker.status(am.heldout.disabled_reason),
        stop_criterion=am.stop_criterion,
        final_metrics=dict(am.final_metrics) if am.final_metrics is not None else None,
        model_mb=round(am.app.model_nbytes() / 2**20, 3), data_mb=round(am.app.data_nbytes() / 2**20, 3),
        elastic_mode=am.spec.elastic_mode, shape_history=list(am.shape_history),
        directives=[d.record() for d in am.directives.history],
        eps=_typed(am.elastic.status_json(), EpsStatus) if isinstance(am.elastic, ElasticOps) else None,
        optimizer=am.spec.optimizer, cruise=am.cruise.status() if am.cruise else None,
        resumed_from=am.resumed_from, recovery=_typed(am.recovery.status_json(), RecoveryStatus),
        suspension=am.suspension.status(), spill=spill_status(am.pool.live()),
        stragglers=_typed(am.stragglers.status_json(), StragglerStatus))


__all__ = ["StatusSource", "job_status"]
