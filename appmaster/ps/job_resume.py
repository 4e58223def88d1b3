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

from .checkpoints import Checkpointer
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


def resumable_checkpoint(checkpointer: Checkpointer, spec: PSJobSpec, app: AnyPSApp) -> Optional[dict[str, Any]]:
    """The job's latest checkpoint in the durable AM dir (an earlier attempt's), if this attempt
    can continue from it; None to start from the initial model."""
    latest = checkpointer.latest()
    if latest is None:
        return None
    if (latest.get("spec") or {}).get("app") != spec.app or "objective_history" not in latest:
        log.warning("checkpoint %s is not this job's (or predates resumable checkpoints): starting over",
                    latest["dir"])
        return None
    if keeps_worker_state(app) and not latest.get("worker_state"):
        log.warning("checkpoint %s predates worker-state checkpoints, which %s needs: starting over",
                    latest["dir"], spec.app)
        return None
    return latest


async def resume_job(manifest: dict[str, Any], servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                     metrics: JobMetrics, steps: Reconfiguration) -> dict[str, Any]:
    """Continue the job from `manifest` (an earlier attempt's checkpoint, from `resumable_checkpoint`)
    on new executors: its epochs and objective history carry on and training resumes at the
    checkpoint's place in the epoch. Returns what the status reports as `resumed_from`."""
    manifest = await steps.checkpointer.fetch(manifest)      # a remote one is read from a local copy
    metrics.initial_objective = float(manifest["initial_objective"])
    for e in manifest["objective_history"]:
        metrics.record_epoch(EpochRecord(epoch=int(e["epoch"]), objective=float(e["objective"]),
                                         epoch_time_s=float(e["epoch_time_s"]), time=float(e["time"])))
    restored = await steps.continue_from_checkpoint(servers, workers, manifest["dir"], manifest)
    log.info("resumed from checkpoint %s of %s: epoch %d, objective %.6g", manifest["dir"],
             manifest.get("attempt_id"), manifest["epoch"], restored)
    return {"dir": manifest["dir"], "url": manifest.get("url", manifest["dir"]), "epoch": int(manifest["epoch"]), "clock": int(manifest.get("clock", 0)),
            "attempt_id": manifest.get("attempt_id"), "objective": manifest.get("objective"),
            "objective_restored": restored, "checkpoint_time": manifest.get("time"), "time": time.time()}
