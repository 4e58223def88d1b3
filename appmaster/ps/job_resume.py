"""What a checkpoint records about a PS job besides its model, and how a new AM attempt continues
the job from the latest checkpoint an earlier attempt left in the durable AM dir -- storage every
host reads (rm.toml `checkpoint_dir`: a shared mount or an fsspec URL), so the new attempt may run
on another host than the one that wrote it.

The job record (protocol.checkpoint_manifest.JobRecord, written into each checkpoint's `job.json`
as part of its JobCheckpoint by appmaster.ps.checkpoints) holds the spec, the attempt, the objective and shape histories and the progress counters (iterations,
clocks, the exactly-once audit's mini-batch count), so a resumed job's epoch count, histories and
audit continue where the checkpoint was taken. Resuming itself is the reconfiguration layer's
`restart_on` step, which also puts back the workers' block state of apps that keep training state
on their workers (NMF, LDA): their checkpoints hold it.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from protocol.checkpoint_manifest import JobRecord
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import ResumedFrom
from protocol.shape_history import ShapeChange
from psruntime.apps.base import AnyPSApp

from .checkpoints import Checkpointer, StoredCheckpoint
from .clock_loop import ClockLoop
from .runtime.executor_pool import ExecutorRecord
from .metrics import EpochRecord, JobMetrics
from .reconfiguration import Reconfiguration, keeps_worker_state

log = logging.getLogger(__name__)


def job_record(spec: PSJobSpec, attempt_id: str, metrics: JobMetrics, shape_history: list[ShapeChange],
               loop: ClockLoop) -> JobRecord:
    """What a checkpoint records about the job besides the model (see the module doc)."""
    return JobRecord(spec=spec, attempt_id=attempt_id, initial_objective=metrics.initial_objective,
                     objective_history=[e.result() for e in metrics.epochs], shape_history=list(shape_history),
                     iterations=loop.iterations, clocks=loop.clocks_done, minibatches_run=loop.minibatches_run)


def restore_metrics(metrics: JobMetrics, rec: JobRecord) -> None:
    """The initial objective and the epochs' objectives a record (a checkpoint's, or an attempt's
    handover) holds, into a new attempt's metrics."""
    metrics.initial_objective = float(rec.initial_objective or 0.0)
    for e in rec.objective_history or []:     # an objective written as null was not finite
        metrics.record_epoch(EpochRecord(epoch=e.epoch, objective=float("nan") if e.objective is None else e.objective,
                                         epoch_time_s=e.epoch_time_s, time=e.time,
                                         evaluation_s=e.evaluation_s))


def resumable_checkpoint(checkpointer: Checkpointer, spec: PSJobSpec, app: AnyPSApp) -> Optional[StoredCheckpoint]:
    """The job's latest checkpoint in the durable AM dir (an earlier attempt's), if this attempt
    can continue from it; None to start from the initial model."""
    latest = checkpointer.latest()
    if latest is None:
        return None
    rec = latest.record
    if rec.spec is None or rec.spec.app != spec.app or rec.objective_history is None:
        log.warning("checkpoint %s is not this job's (or predates resumable checkpoints, or its spec is another "
                    "version's): starting over", latest.dir)
        return None
    if keeps_worker_state(app) and not rec.worker_state:
        log.warning("checkpoint %s predates worker-state checkpoints, which %s needs: starting over",
                    latest.dir, spec.app)
        return None
    return latest


async def resume_job(checkpoint: StoredCheckpoint, servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                     metrics: JobMetrics, steps: Reconfiguration) -> ResumedFrom:
    """Continue the job from `checkpoint` (an earlier attempt's, from `resumable_checkpoint`) on
    new executors: its epochs and objective history carry on and training resumes at the
    checkpoint's place in the epoch. Returns what the status reports as `resumed_from`."""
    checkpoint = await steps.checkpointer.fetch(checkpoint)      # a remote one is read from a local copy
    rec = checkpoint.record
    restore_metrics(metrics, rec)
    restored = await steps.continue_from_checkpoint(servers, workers, checkpoint.dir, rec)
    log.info("resumed from checkpoint %s of %s: epoch %d, objective %.6g", checkpoint.dir, rec.attempt_id,
             rec.epoch, restored)
    return ResumedFrom(dir=checkpoint.dir, url=checkpoint.url, epoch=rec.epoch, clock=rec.clock,
                       attempt_id=rec.attempt_id, objective=rec.objective, objective_restored=restored,
                       checkpoint_time=rec.time, time=time.time())
