"""The PS AM's job status as one record: `job_status` projects the AM's parts into a
protocol.ps_status.PsStatus, which `GET /status` serves (appmaster.ps.runtime.status_server) and
`status.json` keeps once the AM exits (protocol.ps_status.FINAL_STATUS_FILE); every reader decodes
that same Struct (`decode_status` / `read_status`).

The parts that keep their own records (the pool's shape, held-out scores, directives, Cruise,
suspension, spill, the checkpoints written) give them as Structs; the one that answers JSON of its
own (the metrics) is converted here into their typed sections, so a section of the wrong shape
fails when the status is built, not in a reader.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import msgspec

from protocol.ps_status import MetricsStatus, PsStatus

from ..executor_status import spill_status

if TYPE_CHECKING:
    from .master import PSApplicationMaster

S = TypeVar("S", bound=msgspec.Struct)


def _typed(obj: object, kind: type[S]) -> S:
    """A part's own JSON as its status section (a Struct passes through)."""
    return msgspec.convert(obj, kind)


def job_status(am: "PSApplicationMaster") -> PsStatus:
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
        checkpoints=list(am.checkpointer.written),
        heldout=am.heldout.tracker.status(am.heldout.disabled_reason),
        stop_criterion=am.stop_criterion,
        final_metrics=dict(am.final_metrics) if am.final_metrics is not None else None,
        model_mb=round(am.app.model_nbytes() / 2**20, 3), data_mb=round(am.app.data_nbytes() / 2**20, 3),
        elastic_mode=am.spec.elastic_mode, shape_history=list(am.shape_history),
        shape_changes=am.shape_history.total,
        directives=list(am.directive_history), eps=am.eps_status(),
        optimizer=am.spec.optimizer, cruise=am.cruise_status(),
        resumed_from=am.resumed_from, recovery=am.recovery_status(),
        suspension=am.suspension_status(), spill=spill_status(am.pool.live()),
        stragglers=am.straggler_status())


__all__ = ["job_status"]
