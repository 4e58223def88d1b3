"""Epoch time of a PS job as a function of its shape: Optimus's synchronous speed form (eq. 4).

Optimus models the time of one training step of a synchronous job with p servers and w workers as

    t_step(p, w) = θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p      (all θ >= 0)

(computation split over the workers, a fixed overhead, the servers' share of the workers' traffic,
per-worker and per-server coordination). An epoch is D/M steps, so the epoch time has the same form
with the θs scaled by D/M; Elastane fits the epoch-time form directly (the AM reports epoch times,
protocol.job_report) and scales it by the data size relative to the data the θs were measured on:

    T(w, s) = data_scale · (θ0/w + θ1 + θ2·w/s + θ3·w + θ4·s)

`fit` recovers the θs from measured (workers, servers, epoch time) samples with NNLS
(`scipy.optimize.nnls`), as Optimus does. Used by the simulator (sim/) to advance simulated jobs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from scipy.optimize import nnls
from protocol.errors import PlanningError

N_THETA = 5


class EpochTimeError(PlanningError, ValueError):
    """A shape or a sample set the model cannot evaluate or fit."""


def features(workers: int, servers: int) -> np.ndarray:
    """The regressors of T(w, s): [1/w, 1, w/s, w, s]."""
    if workers < 1 or servers < 1:
        raise EpochTimeError(f"a PS job needs >= 1 worker and >= 1 server, got ({workers}, {servers})")
    return np.array([1.0 / workers, 1.0, workers / servers, float(workers), float(servers)])


@dataclass(frozen=True)
class EpochTimeModel:
    """θ0..θ4 of the epoch-time form (seconds per epoch on the reference data)."""

    theta: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.theta) != N_THETA:
            raise EpochTimeError(f"theta needs {N_THETA} coefficients, got {len(self.theta)}")
        if any(not (math.isfinite(t) and t >= 0.0) for t in self.theta):
            raise EpochTimeError(f"theta must be finite and non-negative, got {list(self.theta)}")
        if sum(self.theta) <= 0.0:
            raise EpochTimeError("theta is all zero: every shape would take no time")

    def epoch_time(self, workers: int, servers: int, data_scale: float = 1.0) -> float:
        """Seconds per epoch with `workers` and `servers` on `data_scale` times the reference data."""
        return data_scale * float(np.dot(self.theta, features(workers, servers)))

    def speed(self, workers: int, servers: int, data_scale: float = 1.0) -> float:
        """Epochs per second (Optimus's f(p, w) per epoch)."""
        return 1.0 / self.epoch_time(workers, servers, data_scale)


def fit(samples: Iterable[tuple[int, int, float]]) -> EpochTimeModel:
    """NNLS fit of θ to (workers, servers, epoch seconds) samples (relative error weighting, so
    slow and fast shapes count alike)."""
    rows: list[np.ndarray] = []
    ys: list[float] = []
    for w, s, t in samples:
        if not (math.isfinite(t) and t > 0.0):
            raise EpochTimeError(f"epoch time must be a positive number, got {t}")
        rows.append(features(w, s) / t)
        ys.append(1.0)
    if not rows:
        raise EpochTimeError("no samples to fit")
    theta, _ = nnls(np.vstack(rows), np.array(ys))
    if float(theta.sum()) <= 0.0:
        raise EpochTimeError("the fit gave all-zero coefficients")
    return EpochTimeModel(tuple(float(t) for t in theta))


def relative_errors(model: EpochTimeModel, samples: Sequence[tuple[int, int, float]]) -> list[float]:
    """|predicted - measured| / measured per sample."""
    return [abs(model.epoch_time(w, s) - t) / t for w, s, t in samples]


__all__ = ["EpochTimeError", "EpochTimeModel", "N_THETA", "features", "fit", "relative_errors"]
