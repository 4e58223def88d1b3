"""Held-out quality while a PS job trains: scored every few epochs off the critical path, early
stopping on it, and a warning when it and the training objective diverge.

At an epoch boundary the AM pulls the model (one round trip, nothing in flight under BSP) and hands
it to `HeldoutMonitor.submit`, which scores it in a thread while the next epoch trains; an epoch
that ends while a score is still running is skipped, so the BSP loop never waits on scoring.
`HeldoutTracker` is the pure part: it folds each score into the history, the best point, the early
stopping decision (no better held-out metric for `patience` epochs) and the divergence warning
(the training objective improved since the best held-out point while held-out got worse).
"""
from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from protocol.job_report import finite
from protocol.ps_status import HeldoutPointRecord, HeldoutStatus
from psruntime.apps.base import AnyPSApp
from psruntime.apps.blocks import DataBlock
from psruntime.apps.quality import HELDOUT_METRICS, HeldoutMetric, heldout_metric

log = logging.getLogger(__name__)

# Scoring holds the pulled model plus the app's working copies of it (float64 products, ...):
# about this many model-sizes; it must fit in half of the AM's container with room to spare.
SCORING_MODEL_COPIES = 4


def heldout_too_big(model_nbytes: int, am_memory_mb: Optional[str]) -> Optional[str]:
    """Why the AM should not score the model while training (None: it may): a model whose
    scoring would take more than half of the AM container's memory (`CONTAINER_MEMORY_MB`)
    would get the AM killed for memory (-104) in the middle of training."""
    if not am_memory_mb or not am_memory_mb.isdigit():
        return None
    need = SCORING_MODEL_COPIES * model_nbytes
    budget = int(am_memory_mb) * 2**20 // 2
    if need <= budget:
        return None
    return (f"a {model_nbytes / 2**20:.0f} MB model needs about {need / 2**20:.0f} MB to score, more than half "
            f"of the AM's {am_memory_mb} MB container (give the AM more memory for held-out scores)")


# Divergence: the held-out metric is this much (relative) worse than its best while the training
# objective is better than at that point -- small wobbles of the held-out score are no warning.
DIVERGENCE_TOLERANCE = 0.01


@dataclass(frozen=True)
class HeldoutPoint:
    """The held-out metrics of the model after `epoch`, and the training objective then."""

    epoch: int
    value: float                 # the app's held-out metric (HeldoutMetric.name)
    objective: float             # the training objective after the same epoch
    metrics: dict[str, float]

    def record(self) -> HeldoutPointRecord:
        """The point as the job status serves it (a non-finite figure as None, as JSON has it)."""
        return HeldoutPointRecord(epoch=self.epoch, value=finite(self.value), objective=finite(self.objective),
                                  metrics={k: finite(v) for k, v in self.metrics.items()})


@dataclass
class HeldoutTracker:
    """History, best point, early stopping and divergence of the held-out metric (pure)."""

    metric: HeldoutMetric
    maximize_objective: bool
    patience: Optional[int] = None
    history: list[HeldoutPoint] = field(default_factory=list)
    best: Optional[HeldoutPoint] = None
    warning: Optional[str] = None

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.metric.maximize else a < b

    def add(self, point: HeldoutPoint) -> None:
        """Fold in the score of one epoch (scores arrive in epoch order)."""
        self.history.append(point)
        if math.isfinite(point.value) and (self.best is None or self._better(point.value, self.best.value)):
            self.best = point
        self.warning = self._divergence(point)
        if self.warning:
            log.warning("%s", self.warning)

    def _divergence(self, last: HeldoutPoint) -> Optional[str]:
        best = self.best
        if best is None or best is last or not (math.isfinite(last.value) and math.isfinite(last.objective)):
            return None
        worse = (best.value - last.value) if self.metric.maximize else (last.value - best.value)
        improved = (last.objective > best.objective) if self.maximize_objective else (last.objective < best.objective)
        if improved and worse > DIVERGENCE_TOLERANCE * max(abs(best.value), 1e-12):
            return (f"the training objective improved since epoch {best.epoch + 1} "
                    f"({best.objective:.4g} -> {last.objective:.4g}) while held-out {self.metric.name} worsened "
                    f"({best.value:.4g} -> {last.value:.4g}): the model overfits")
        return None

    def should_stop(self) -> bool:
        """Early stopping: a score `patience` epochs or more after the best one and no better.
        Counted over scored epochs: an epoch whose score is pending or was skipped is no evidence."""
        if self.patience is None or self.best is None or not self.history:
            return False
        return self.history[-1].epoch - self.best.epoch >= self.patience

    def stop_reason(self) -> str:
        assert self.best is not None
        return (f"early stopping: held-out {self.metric.name} did not improve for {self.patience} epochs "
                f"(best {self.best.value:.4g} after epoch {self.best.epoch + 1})")

    def status(self, disabled: Optional[str] = None) -> HeldoutStatus:
        """The job status's "heldout" section (protocol.ps_status); `disabled`: why scoring is off."""
        last = self.history[-1] if self.history else None
        return HeldoutStatus(metric=self.metric.name, maximize=self.metric.maximize,
                             true_model_metric=self.metric.true_model,
                             value=finite(last.value) if last else None,
                             true_model_value=finite(last.metrics.get(self.metric.true_model)) if last else None,
                             epoch=last.epoch if last else None,
                             best=self.best.record() if self.best else None,
                             early_stopping=self.patience, warning=self.warning,
                             history=[p.record() for p in self.history], disabled=disabled)


def app_heldout_metric(app: AnyPSApp) -> HeldoutMetric:
    """The metric a built-in app is watched by; a user's app names its own (the optional class
    attribute HELDOUT_METRIC, a key of what its `evaluate` returns; docs/app_api.md), with
    `maximize` its direction and no true model to compare with."""
    own = getattr(app, "HELDOUT_METRIC", None)
    if own is None and app.name in HELDOUT_METRICS:
        return heldout_metric(app.name)
    return HeldoutMetric(str(own or ""), bool(app.maximize), "")


class HeldoutMonitor:
    """Scores the model every `every` epochs in a thread (see the module doc)."""

    def __init__(self, app: AnyPSApp, every: int, patience: Optional[int] = None,
                 am_memory_mb: Optional[str] = None) -> None:
        self.app = app
        # Why scoring while training is off (the status shows it): a model too big for the AM.
        self.disabled_reason = heldout_too_big(app.model_nbytes(), am_memory_mb) if am_memory_mb else None
        if self.disabled_reason:
            log.warning("no held-out scoring while training: %s", self.disabled_reason)
        self.every = 0 if self.disabled_reason else every
        self.tracker = HeldoutTracker(app_heldout_metric(app), app.maximize, patience)
        self._heldout: Optional[list[DataBlock]] = None
        self._scoring: Optional[asyncio.Task[None]] = None

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def due(self, epoch: int) -> bool:
        """Whether the model after `epoch` (0-based) is to be scored: every `every` epochs, and
        not while the last score is still running (that epoch is skipped, nothing waits)."""
        return self.enabled and (epoch + 1) % self.every == 0 and not self.busy

    @property
    def busy(self) -> bool:
        return self._scoring is not None and not self._scoring.done()

    def submit(self, epoch: int, objective: float, model: np.ndarray) -> None:
        """Score `model` (the model after `epoch`) in a thread; the result lands in `tracker`."""
        self._scoring = asyncio.create_task(self._score(epoch, objective, model), name=f"heldout-{epoch}")

    async def score_final(self, epoch: int, objective: float, model: np.ndarray) -> dict[str, float]:
        """The final model's held-out metrics (after a score in flight ends); a point of the
        history too unless that epoch was scored already."""
        await self.drain()
        metrics = await asyncio.to_thread(self._evaluate, model)
        last = self.tracker.history[-1] if self.tracker.history else None
        if epoch >= 0 and (last is None or last.epoch < epoch):
            self._record(epoch, objective, metrics)
        return metrics

    async def _score(self, epoch: int, objective: float, model: np.ndarray) -> None:
        try:
            metrics = await asyncio.to_thread(self._evaluate, model)
        except Exception:  # noqa: BLE001 - a failed score loses a point of the curve, not the job
            log.warning("held-out evaluation after epoch %d failed", epoch + 1, exc_info=True)
            return
        self._record(epoch, objective, metrics)

    def _record(self, epoch: int, objective: float, metrics: dict[str, float]) -> None:
        value = float(metrics.get(self.tracker.metric.name, math.nan))
        self.tracker.add(HeldoutPoint(epoch, value, objective, metrics))
        log.info("held-out after epoch %d: %s %.6g", epoch + 1, self.tracker.metric.name, value)

    def _evaluate(self, model: np.ndarray) -> dict[str, float]:
        if self._heldout is None:   # generated (or read) once, in the scoring thread
            self._heldout = self.app.generate_heldout()
        return self.app.evaluate(model, self._heldout)

    async def drain(self) -> None:
        """Wait for a score in flight (at the job's end, so its point is not lost)."""
        if self._scoring is not None:
            await asyncio.gather(self._scoring, return_exceptions=True)

    def cancel(self) -> None:
        if self._scoring is not None:
            self._scoring.cancel()

