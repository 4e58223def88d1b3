"""A simulated job's convergence: the Optimus loss curve l(k) = 1/(β0·k + β1) + β2 (Optimus eq. 1).

k counts finished epochs (k = 0: the initial model). A job converges as the real apps decide it
(psruntime.apps.base.is_converged): after epoch k >= 2 when |l(k) - l(k-1)| / |l(k-1)| < threshold,
or at its epoch limit. `fit_curve` recovers β from a measured objective history (NNLS on
1/(l - β2) for a grid of β2 below the smallest loss, keeping the best fit), which is how the
calibration turns a real run's objectives into the curve the simulator follows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares, nnls
from protocol.errors import AppError


class CurveError(AppError, ValueError):
    """A loss curve or history that cannot be used."""


@dataclass(frozen=True)
class LossCurve:
    """β0, β1 (> 0 together: the loss falls) and β2 (the loss floor), all non-negative."""

    beta0: float
    beta1: float
    beta2: float

    def __post_init__(self) -> None:
        vals = (self.beta0, self.beta1, self.beta2)
        if any(not (math.isfinite(v) and v >= 0.0) for v in vals):
            raise CurveError(f"beta must be finite and non-negative, got {list(vals)}")
        if self.beta1 <= 0.0:
            raise CurveError("beta1 must be positive (l(0) = 1/beta1 + beta2 must be finite)")

    def loss(self, k: float) -> float:
        return 1.0 / (self.beta0 * k + self.beta1) + self.beta2

    def epochs_to_converge(self, threshold: float, max_epochs: int) -> int:
        """The epoch after which a job with this curve stops (see the module doc)."""
        if max_epochs < 1:
            raise CurveError(f"max_epochs must be >= 1, got {max_epochs}")
        k = np.arange(2, max_epochs + 1, dtype=float)
        if k.size == 0:
            return max_epochs
        prev = 1.0 / (self.beta0 * (k - 1) + self.beta1) + self.beta2
        cur = 1.0 / (self.beta0 * k + self.beta1) + self.beta2
        done = np.nonzero(np.abs(cur - prev) / np.maximum(np.abs(prev), 1e-12) < threshold)[0]
        return int(k[done[0]]) if done.size else max_epochs


def fit_curve(history: Sequence[tuple[float, float]], grid: int = 200) -> LossCurve:
    """Fit β to (epoch, loss) points (epoch 0 may be the initial objective)."""
    pts = [(float(k), float(v)) for k, v in history if math.isfinite(v)]
    if len(pts) < 3:
        raise CurveError(f"need >= 3 finite (epoch, loss) points to fit the curve, got {len(pts)}")
    ks = np.array([p[0] for p in pts])
    ls = np.array([p[1] for p in pts])
    low = float(ls.min())
    if low <= 0.0:
        # The form has a non-negative floor: shift so the smallest loss is positive (a constant
        # shift does not change which epoch converges only when the shift is small; report it).
        raise CurveError(f"losses must be positive for this curve, the smallest is {low}")
    best: tuple[float, LossCurve] | None = None
    design = np.column_stack([ks, np.ones_like(ks)])
    for b2 in np.linspace(0.0, low * 0.999, grid):
        y = 1.0 / (ls - b2)
        (b0, b1), _ = nnls(design, y)
        if b1 <= 0.0:
            continue
        pred = 1.0 / (b0 * ks + b1) + b2
        err = float(np.sum(((pred - ls) / ls) ** 2))
        if best is None or err < best[0]:
            best = (err, LossCurve(float(b0), float(b1), float(b2)))
    if best is None:
        # Every NNLS fit wants a negative intercept: losses that fall faster later than earlier
        # (NMF's plateau, then its escape: 0.0229 over epochs 1-5, then 0.0045 by epoch 12). The
        # form cannot follow that; take its closest member, by bounded least squares on the same
        # relative error, rather than no curve (the measured epochs are kept beside it).
        return _closest_curve(ks, ls, low)
    return best[1]


def _closest_curve(ks: np.ndarray, ls: np.ndarray, low: float) -> LossCurve:
    def rel(p: np.ndarray) -> np.ndarray:
        return np.asarray((1.0 / (p[0] * ks + p[1]) + p[2] - ls) / ls)
    start = np.array([1.0, 1.0 / max(float(ls[0]), 1e-12), 0.0])
    fit = least_squares(rel, start, bounds=([1e-12, 1e-12, 0.0], [np.inf, np.inf, low * 0.999]))
    if not fit.success:
        raise CurveError(f"no curve of the Optimus form fits these losses ({fit.message})")
    b0, b1, b2 = (float(x) for x in fit.x)
    return LossCurve(b0, b1, b2)


__all__ = ["CurveError", "LossCurve", "fit_curve"]
