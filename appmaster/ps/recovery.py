"""A PS job survives lost executors: replace them and go back to the latest checkpoint.

When an executor's container ends while the job trains (its process died, it was killed for
memory, or its node was lost) and it was not retired on purpose, the master hands the loss here
instead of failing the job, as long as the job has losses to spare (`max_executor_failures`, YARN's
max-failures) and a checkpoint to go back to (the master checkpoints once right after setup, so
there always is one). Recovery is a composition of the reconfiguration layer's steps:

    retire_all       every executor of the job stops (the survivors hold model blocks or input
                     positions that are ahead of the checkpoint, so none of them is kept)
    start_executors  as many servers and workers as the job had, anywhere the RM has room (a lost
                     node is out of the pool once the RM declares it LOST; a launch that fails on
                     a dead node is retried)
    restart_on       the checkpoint's model onto the new servers, every worker back at the
                     checkpoint's place in its epoch; epochs after the checkpoint are trained
                     again, so no update is lost or applied twice

The job's objective history is cut back to the checkpoint's epoch and goes on from there; each
recovery is in the shape history with what was lost, the checkpoint, the epochs redone and its
duration. What a user trades: a shorter `checkpoint_every_epochs` redoes less work after a loss
and costs one checkpoint (every server's blocks to the AM) per that many epochs.

Apps that keep training state on their workers (NMF's user factors, LDA's topic assignments) are
not recovered: a checkpoint holds only the servers' model, and LDA's restored topic counts would
be counted twice against fresh assignments. Such a job fails at its first loss, as before.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from protocol.ps_job_spec import PSJobSpec
from psruntime.apps.base import AnyPSApp

from .checkpoints import JOB_MANIFEST
from .executor_pool import ExecutorRecord, Role
from .job import JobPhase
from .kill_restart import keeps_worker_state
from .reconfiguration import LaunchFailed, Reconfiguration

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 90.0     # the old executors reported gone (a lost node's after the RM's expiry)
LAUNCH_TRIES = 3             # new executors: a launch onto a node that just died fails once


class ExecutorRecovery:
    """Counts a job's executor losses and carries out recoveries (see the module doc)."""

    def __init__(self, spec: PSJobSpec, app: AnyPSApp, steps: Reconfiguration, phase: Callable[[], JobPhase],
                 on_record: Callable[[dict[str, Any]], None], wall_clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.app = app
        self.steps = steps
        self.training = steps.training
        self.phase = phase
        self.on_record = on_record
        self.wall_clock = wall_clock
        self.losses: list[str] = []          # every executor loss of the job, in order
        self.pending: list[str] = []         # losses not recovered from yet
        self.failures = 0                    # loss events: losses reported together count once
        self.recoveries = 0
        self._reported = asyncio.Event()

    @property
    def enabled(self) -> bool:
        """Whether this job can be recovered at all (its app and its limit allow it)."""
        return self.spec.max_executor_failures > 0 and not keeps_worker_state(self.app)

    def why_not(self) -> Optional[str]:
        """Why a loss now cannot be recovered from (None: it can)."""
        if self.spec.max_executor_failures == 0:
            return "max_executor_failures is 0"
        if keeps_worker_state(self.app):
            return f"{self.spec.app} keeps training state on its workers, which checkpoints do not hold"
        if self.phase() is not JobPhase.TRAINING:
            return f"the job is {self.phase().value}, not training"
        if self.steps.checkpointer.last is None:
            return "no checkpoint to go back to yet"
        if self.failures >= self.spec.max_executor_failures:
            return (f"gave up after {self.failures + 1} executor failures "
                    f"(max_executor_failures {self.spec.max_executor_failures})")
        return None

    def on_lost(self, description: str) -> Optional[str]:
        """An executor was lost (`description` names it and why). Returns None when the job will
        recover from it, else the diagnostics to fail the job with."""
        self.losses.append(description)
        if self.pending:                     # the same event (e.g. a lost node's executors): one recovery
            self.pending.append(description)
            return None
        why = self.why_not()
        if why is not None:
            return f"{why}; the last: {description}" if self.failures else description
        self.failures += 1
        self.pending.append(description)
        self._reported.set()
        log.warning("executor lost (failure %d of %d the job survives): %s; going back to the latest checkpoint",
                    self.failures, self.spec.max_executor_failures, description)
        return None

    async def loss_reported(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a loss to be reported (a failed call to an executor usually
        comes before its container's exit reaches the AM); True if one is pending."""
        if self.pending:
            return True
        self._reported.clear()
        try:
            await asyncio.wait_for(self._reported.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        return bool(self.pending)

    async def recover(self) -> dict[str, Any]:
        """Replace every executor and continue from the latest checkpoint (module doc); returns
        the shape-history record."""
        async with self.steps.exclusive_when_free("recovery"):
            return await self._recover()

    async def _recover(self) -> dict[str, Any]:
        steps, loop, metrics = self.steps, self.training.loop, self.training.metrics
        t0 = time.perf_counter()
        lost, self.pending = list(self.pending), []
        workers, servers = self.training.membership.shape()
        last = steps.checkpointer.last
        assert last is not None        # why_not() refused the loss otherwise
        manifest = json.loads((Path(last["dir"]) / JOB_MANIFEST).read_text())
        epoch_before = loop.epochs_done
        record: dict[str, Any] = {"mode": "recovery", "op": "recover", "time": self.wall_clock(), "lost": lost,
                                  "workers": workers, "servers": servers, "checkpoint": last["dir"],
                                  "epoch": int(manifest["epoch"]), "epochs_redone": epoch_before - int(manifest["epoch"]),
                                  "checkpoint_time": manifest.get("time"),
                                  "before": {"workers": workers, "servers": servers},
                                  "after": {"workers": workers, "servers": servers}, "changed": False, "error": ""}
        try:
            await steps.retire_all(RELEASE_TIMEOUT_S)
            new_servers, new_workers = await asyncio.gather(self._start(Role.SERVER, servers),
                                                            self._start(Role.WORKER, workers))
            metrics.truncate_epochs(int(manifest["epoch"]))
            loop.continue_from(int(manifest["epoch"]), int(manifest.get("iterations", loop.iterations)),
                               int(manifest.get("clocks", loop.clocks_done)), manifest.get("minibatches_run"))
            positions = {int(b): (int(p[0]), int(p[1])) for b, p in (manifest.get("positions") or {}).items()}
            record["objective_restored"] = await steps.restart_on(new_servers, new_workers, last["dir"], positions)
            record["changed"] = True
        except BaseException as e:
            record["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            record["seconds"] = record["duration_s"] = record["lost_s"] = round(time.perf_counter() - t0, 4)
            self.on_record(record)
        self.recoveries += 1
        log.info("recovered from %s in %.2fs: %d workers, %d servers from the checkpoint of epoch %d "
                 "(%d epochs to redo)", "; ".join(lost), record["seconds"], workers, servers, record["epoch"],
                 record["epochs_redone"])
        return record

    async def _start(self, role: Role, n: int) -> list[ExecutorRecord]:
        for attempt in range(1, LAUNCH_TRIES + 1):
            try:
                return await self.steps.start_executors(role, n)
            except LaunchFailed as e:
                if attempt == LAUNCH_TRIES:
                    raise
                log.warning("recovery: %s; trying again", e)
        raise AssertionError("unreachable")

    def status_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "max_executor_failures": self.spec.max_executor_failures,
                "failures": self.failures, "losses": list(self.losses), "recoveries": self.recoveries}
