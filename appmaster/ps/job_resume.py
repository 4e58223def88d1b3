"""What a checkpoint records about a PS job besides its model, and how a new AM attempt continues
the job from the latest checkpoint an earlier attempt left in the durable AM dir -- storage every
host reads (rm.toml `checkpoint_dir`: a shared mount or an fsspec URL), so the new attempt may run
on another host than the one that wrote it.

The job record (written into each checkpoint's `job.json` by appmaster.ps.checkpoints) holds the
spec, the attempt, the objective and shape histories and the progress counters (iterations,
clocks, the exactly-once audit's mini-batch count), so a resumed job's epoch count, histories and
audit continue where the checkpoint was taken. Resuming itself is the reconfiguration layer's
`restart_on` step, which also puts back the workers' block state of apps that keep training state
on their workers (NMF, LDA): their checkpoints hold it.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Optional

from protocol.ps_job_spec import PSJobSpec
from protocol.shape_history import ShapeChange, history_json
from psruntime.apps.base import AnyPSApp

from .checkpoints import Checkpointer, StoredCheckpoint
from .clock_loop import ClockLoop
from .executor_pool import ExecutorRecord
from .metrics import EpochRecord, JobMetrics
from .reconfiguration import Reconfiguration, keeps_worker_state

log = logging.getLogger(__name__)


def job_record(spec: PSJobSpec, attempt_id: str, metrics: JobMetrics, shape_history: list[ShapeChange],
               loop: ClockLoop) -> dict[str, Any]:
    """What a checkpoint records about the job besides the model (see the module doc)."""
    return {"spec": spec.to_json(), "attempt_id": attempt_id, "initial_objective": metrics.initial_objective,
            "objective_history": [e.to_json() for e in metrics.epochs], "shape_history": history_json(shape_history),
            "iterations": loop.iterations, "clocks": loop.clocks_done, "minibatches_run": loop.minibatches_run}


def resumable_checkpoint(checkpointer: Checkpointer, spec: PSJobSpec, app: AnyPSApp) -> Optional[StoredCheckpoint]:
    """The job's latest checkpoint in the durable AM dir (an earlier attempt's), if this attempt
    can continue from it; None to start from the initial model."""
    latest = checkpointer.latest()
    if latest is None:
        return None
    rec = latest.record
    if (rec.spec or {}).get("app") != spec.app or rec.objective_history is None:
        log.warning("checkpoint %s is not this job's (or predates resumable checkpoints): starting over", latest.dir)
        return None
    if keeps_worker_state(app) and not rec.worker_state:
        log.warning("checkpoint %s predates worker-state checkpoints, which %s needs: starting over",
                    latest.dir, spec.app)
        return None
    return latest


async def resume_job(checkpoint: StoredCheckpoint, servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                     metrics: JobMetrics, steps: Reconfiguration) -> dict[str, Any]:
    """Continue the job from `checkpoint` (an earlier attempt's, from `resumable_checkpoint`) on
    new executors: its epochs and objective history carry on and training resumes at the
    checkpoint's place in the epoch. Returns what the status reports as `resumed_from`."""
    checkpoint = await steps.checkpointer.fetch(checkpoint)      # a remote one is read from a local copy
    rec = checkpoint.record
    metrics.initial_objective = float(rec.initial_objective or 0.0)
    for e in rec.objective_history or []:
        metrics.record_epoch(EpochRecord(epoch=int(e["epoch"]), objective=float(e["objective"]),
                                         epoch_time_s=float(e["epoch_time_s"]), time=float(e["time"])))
    restored = await steps.continue_from_checkpoint(servers, workers, checkpoint.dir, rec)
    log.info("resumed from checkpoint %s of %s: epoch %d, objective %.6g", checkpoint.dir, rec.attempt_id,
             rec.epoch, restored)
    return {"dir": checkpoint.dir, "url": checkpoint.url, "epoch": rec.epoch, "clock": rec.clock,
            "attempt_id": rec.attempt_id, "objective": rec.objective,
            "objective_restored": restored, "checkpoint_time": rec.time, "time": time.time()}
