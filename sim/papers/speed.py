"""Epoch time over Optimus's general speed features, for synthetic apps whose speed function is a
paper's rather than one fitted on Elastane's executors.

The simulator's apps use models.ps_iteration_time's form T(w, s) = θ·[1/w, 1, w/s, w, s] (Optimus
eq. 4, the synchronous form). Optimus's asynchronous form (eq. 3, f(p, w) = w / (θ0 + θ1·w/p +
θ2·w + θ3·p)) per unit of progress is θ0/w + θ1/p + θ2 + θ3·p/w, which needs 1/p and p/w: this
model takes coefficients over models.optimus_fit.FEATURES' seven features [1/w, 1/p, 1, w/p, w, p,
p/w] and so holds either form exactly. It is an EpochTimeModel (same `epoch_time` / `speed`), so
the simulator's job uses it unchanged; `theta[0]` is the 1/w (compute) coefficient in both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from models.ps_iteration_time import EpochTimeError, EpochTimeModel

from ..calibration import AppCalibration

N_FEATURES = 7


def feature_vector(workers: int, servers: int) -> tuple[float, ...]:
    """[1/w, 1/p, 1, w/p, w, p, p/w] (models.optimus_fit.FEATURES' order)."""
    if workers < 1 or servers < 1:
        raise EpochTimeError(f"a PS job needs >= 1 worker and >= 1 server, got ({workers}, {servers})")
    w, p = float(workers), float(servers)
    return (1.0 / w, 1.0 / p, 1.0, w / p, w, p, p / w)


@dataclass(frozen=True)
class FeatureEpochTimeModel(EpochTimeModel):
    """Seconds per epoch on the reference data as θ · feature_vector(w, s) (seven coefficients)."""

    def __post_init__(self) -> None:
        if len(self.theta) != N_FEATURES:
            raise EpochTimeError(f"theta needs {N_FEATURES} coefficients, got {len(self.theta)}")
        if any(not (math.isfinite(t) and t >= 0.0) for t in self.theta):
            raise EpochTimeError(f"theta must be finite and non-negative, got {list(self.theta)}")
        if sum(self.theta) <= 0.0:
            raise EpochTimeError("theta is all zero: every shape would take no time")

    def epoch_time(self, workers: int, servers: int, data_scale: float = 1.0) -> float:
        return data_scale * sum(t * f for t, f in zip(self.theta, feature_vector(workers, servers)))


class PaperAppCalibration(AppCalibration, kw_only=True):
    """A synthetic app's calibration: as an AppCalibration, with its true epoch time over the seven
    features (`features`); `theta` holds the five-feature form's best fit to it, for readers that
    only know that form (exact for a synchronous job type)."""

    features: list[float]

    def epoch_model(self) -> EpochTimeModel:
        return FeatureEpochTimeModel(tuple(self.features))


def project_theta(model: FeatureEpochTimeModel, max_workers: int, max_servers: int) -> list[float]:
    """The five-feature form (models.ps_iteration_time) nearest `model` over shapes up to the
    bounds (relative-error NNLS, as the simulator's calibration fits measured samples)."""
    from models.ps_iteration_time import fit  # noqa: PLC0415 (numpy/scipy: only when asked)
    samples = [(w, s, model.epoch_time(w, s)) for w in range(1, max_workers + 1) for s in range(1, max_servers + 1)]
    return list(fit(samples).theta)


__all__ = ["FeatureEpochTimeModel", "N_FEATURES", "PaperAppCalibration", "feature_vector", "project_theta"]
