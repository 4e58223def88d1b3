"""Held-out quality while training (appmaster.ps.heldout_monitor): the best point, early stopping
counted over scored epochs, the divergence warning, and scoring off the event loop (an epoch that
ends while a score runs is skipped, nothing waits)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Sequence

import numpy as np
import pytest

from appmaster.ps.heldout_monitor import HeldoutMonitor, HeldoutPoint, HeldoutTracker
from psruntime.apps.blocks import DataBlock
from psruntime.apps.quality import HeldoutMetric, heldout_metric
from psruntime.apps.registry import create_app

CE = HeldoutMetric("cross_entropy", False, "true_model_cross_entropy")


def point(epoch: int, value: float, objective: float) -> HeldoutPoint:
    return HeldoutPoint(epoch, value, objective, {"cross_entropy": value})


def test_early_stopping_after_patience_scored_epochs_without_improvement() -> None:
    t = HeldoutTracker(CE, maximize_objective=False, patience=3)
    for e, v in enumerate([1.0, 0.8, 0.7, 0.71, 0.72]):
        t.add(point(e, v, 2.0 - e * 0.1))
        assert not t.should_stop(), e
    assert t.best is not None and t.best.epoch == 2
    t.add(point(5, 0.73, 1.4))
    assert t.should_stop()            # epoch 5 is 3 epochs after the best (2) and no better
    assert t.stop_reason().startswith("early stopping: held-out cross_entropy did not improve for 3 epochs")
    assert "best 0.7 after epoch 3" in t.stop_reason()


def test_no_early_stopping_on_epochs_not_scored_yet() -> None:
    # every second epoch scored: the best at epoch 1, the next score at epoch 3 is better
    t = HeldoutTracker(CE, maximize_objective=False, patience=2)
    t.add(point(1, 0.9, 1.0))
    assert not t.should_stop()        # however many epochs trained since: no later score yet
    t.add(point(3, 0.8, 0.9))
    t.add(point(5, 0.85, 0.8))
    assert t.should_stop()
    assert not HeldoutTracker(CE, False, patience=None, history=list(t.history), best=t.best).should_stop()


def test_divergence_warns_when_training_improves_and_heldout_worsens() -> None:
    t = HeldoutTracker(CE, maximize_objective=False)
    t.add(point(0, 1.0, 1.5))
    t.add(point(1, 0.9, 1.2))
    assert t.warning is None
    t.add(point(2, 0.905, 1.0))       # 0.6% worse: noise, no warning
    assert t.warning is None
    t.add(point(3, 0.95, 0.8))
    assert t.warning is not None and "held-out cross_entropy worsened (0.9 -> 0.95)" in t.warning
    assert "since epoch 2 (1.2 -> 0.8)" in t.warning and "overfits" in t.warning
    t.add(point(4, 0.85, 0.7))        # better again: the warning goes
    assert t.warning is None
    # both worse than at the best point: no divergence, the run is just noisy
    t.add(point(5, 0.95, 0.75))
    assert t.warning is None


def test_maximized_metric_and_objective_lda() -> None:
    m = heldout_metric("lda")
    assert m.maximize and m.name == "heldout_loglik_per_token"
    t = HeldoutTracker(m, maximize_objective=True, patience=1)
    t.add(HeldoutPoint(0, -3.3, -3.6, {}))
    t.add(HeldoutPoint(1, -3.2, -3.5, {}))
    t.add(HeldoutPoint(2, -3.3, -3.4, {}))
    assert t.best is not None and t.best.epoch == 1 and t.should_stop()
    assert t.warning is not None and "worsened (-3.2 -> -3.3)" in t.warning
    js = t.status()
    assert js.metric == "heldout_loglik_per_token" and js.value == -3.3 and js.best is not None and js.best.epoch == 1
    assert [p.epoch for p in js.history] == [0, 1, 2] and js.early_stopping == 1


class _BlockingApp:
    """An app whose evaluation waits for `release` (to see what the event loop does meanwhile)."""

    name = "mlr"
    maximize = False

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.heldout_generated = 0

    def generate_heldout(self) -> list[DataBlock]:
        self.heldout_generated += 1
        return []

    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, Any]:
        self.started.set()
        assert self.release.wait(10)
        return {"cross_entropy": float(model.sum()), "true_model_cross_entropy": 0.5}


async def test_scoring_runs_in_a_thread_and_busy_epochs_are_skipped() -> None:
    app = _BlockingApp()
    mon = HeldoutMonitor(app, every=1)   # type: ignore[arg-type]
    assert mon.due(0)
    mon.submit(0, 2.0, np.ones(3))
    await asyncio.to_thread(app.started.wait, 10)
    # the loop is free while the score runs: the next epochs are not due (skipped), not waited on
    assert mon.busy and not mon.due(1) and not mon.tracker.history
    app.release.set()
    await mon.drain()
    assert [(p.epoch, p.value) for p in mon.tracker.history] == [(0, 3.0)]
    assert mon.due(1) and mon.tracker.status().true_model_value == 0.5
    # the final score waits, and adds a point for an epoch not scored yet (only then)
    assert (await mon.score_final(4, 1.0, np.zeros(3)))["cross_entropy"] == 0.0
    await mon.score_final(4, 1.0, np.zeros(3))
    assert [p.epoch for p in mon.tracker.history] == [0, 4]
    assert app.heldout_generated == 1    # the held-out set is generated once


async def test_a_failed_score_loses_the_point_not_the_job(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app("mlr", preset="tiny")
    mon = HeldoutMonitor(app, every=2)
    assert not mon.due(0) and mon.due(1)
    mon.submit(1, 1.0, np.zeros((3, 3), np.float32))     # the wrong shape: evaluate raises
    await mon.drain()
    assert mon.tracker.history == [] and "held-out evaluation after epoch 2 failed" in caplog.text
    model = np.zeros((app.num_keys, app.key_length), np.float32)
    mon.submit(3, 1.0, model)
    await mon.drain()
    (p,) = mon.tracker.history
    assert p.epoch == 3 and p.value == pytest.approx(np.log(5)) and "true_model_cross_entropy" in p.metrics
    assert not HeldoutMonitor(app, every=0).due(1)       # 0: only the final score


def test_scoring_is_off_when_the_model_would_crowd_the_ams_container() -> None:
    from appmaster.ps.heldout_monitor import heldout_too_big

    assert heldout_too_big(10_000, "512") is None                      # a small model: scored
    assert heldout_too_big(100 * 2**20, None) is None                  # no limit known: scored
    why = heldout_too_big(100 * 2**20, "512")                          # 4 x 100 MB > 256 MB
    assert why is not None and "100 MB model" in why and "512 MB" in why
