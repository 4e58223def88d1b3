"""Optimus's performance models (Peng et al., EuroSys'18, §3): the loss curve and the speed function.

* **Loss curve** (§3.1, eq. 1): l = 1/(β0·k + β1) + β2, β ≥ 0, k = epochs trained. Pre-processing as
  the paper: losses are normalised by the largest seen so far, and a point outside [the minimum of
  the next 5, the maximum of the previous 5] is an outlier replaced by the mean of its neighbours.
  Long histories are averaged into at most `MAX_FIT_POINTS` points (§3.1: "average the values of
  several data points ... as a single data point").
  Eq. 1 is not linear in β2, so the fit is NNLS in (β0, β1) for each β2 on a grid in [0, min l),
  keeping the β2 whose curve has the least squared error in loss space (the linearised NNLS rows
  are weighted by (l − β2)², the derivative of 1/y, so its least squares approximates that error),
  then a finer grid around the best. The best grid point is solved again with
  `scipy.optimize.nnls`; the grid itself uses the same 2-variable NNLS in closed form, vectorised
  over many jobs at once (`fit_loss_curves`), because the RM refits thousands of jobs per round.
* **Objectives of either sign and direction** (`orientation`): eq. 1 needs a positive, falling
  loss, but an app may report an objective that rises as it learns or is negative (LDA's
  log-likelihood). The fit runs on y = sign·x + offset: sign -1 when the series rises (its last
  point above its first), and an offset only when sign·x is not all positive (it lifts the lowest
  point to the series' span). The curve keeps both and predicts in the app's own units; the
  convergence test stays the runtime's relative test on the raw objective, |Δx| / |x|, which a
  sign flip leaves alone and an offset changes (so with one it is solved numerically).
* **Points per clock** (`loss_points`): besides the initial objective (k = 0) and each finished
  epoch (k = e + 1), an AM may report the objective every few clocks with the fractional epochs
  trained then (JobReport.clock_objectives); those points go in at their fractional k, so a job of
  a few epochs is fitted during its first one. A fit needs `MIN_LOSS_POINTS` points spanning at
  least `MIN_FIT_SPAN` epochs.
* **Remaining epochs**: the job converges when an epoch lowers the loss by less than `threshold`
  relative to the previous one (the PS runtime's test, psruntime/apps/base.py); on the fitted
  curve that first happens at the k solving a quadratic (`LossCurve.epochs_to_converge`).
* **Speed function** (§3.2): eq. 3 for asynchronous training, f(p, w) = w / (θ0 + θ1·w/p + θ2·w +
  θ3·p), and eq. 4 for synchronous, f(p, w) = 1 / (θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p) (M, the
  fixed global batch, is folded into θ0). Both are linear in θ once inverted, so NNLS fits 1/f on
  the features, each row scaled by the measured f so the residuals are relative speed errors.
  Departure: the paper pre-runs each job at ~5 (p, w) pairs before it starts; Elastane does not
  (a pre-run costs a restart per shape), so the fit adds pseudo-samples from a prior speed
  function scaled to the job's own measured speeds, with a total weight (`PRIOR_WEIGHT`, or
  `APP_PRIOR_WEIGHT` for a per-app prior) divided by the number of distinct shapes sampled, so
  real samples soon outweigh it. The prior is per app where one is known (`app_prior`: our four
  apps' epoch-time θ as `elastane sim calibrate` measured them, docs/simulator.md; the policy adds
  what it learns from other jobs of the app) -- for NMF and Lasso every extra server slows the job,
  which the paper's ResNet-50 reference (`reference`, the fallback) says the opposite of. With
  samples at one shape only, the fit is the prior scaled to it.

Speeds may be in any unit (the policy uses epochs per second); remaining time = epochs / speed.
"""
from __future__ import annotations

import functools
import math
from itertools import chain
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import nnls

Array = NDArray[np.float64]

OUTLIER_WINDOW = 5          # §3.1: neighbours = the previous / subsequent 5 points
MAX_FIT_POINTS = 32         # longer histories are averaged into this many points
MIN_LOSS_POINTS = 4         # fewer (initial objective included) and there is no curve
MIN_FIT_SPAN = 0.5          # epochs the points must span (per-clock points of a quarter epoch say little)
BETA2_GRID = 32             # coarse grid over β2 in [0, min l), then as many points around the best
FIT_BLOCK_ROWS = 512        # jobs fitted at a time (their grid temporaries stay in cache)
PRIOR_WEIGHT = 0.5          # total weight of the reference pseudo-samples (a real sample weighs 1)
APP_PRIOR_WEIGHT = 2.0      # a per-app prior was measured on the same app: it weighs more

# General speed features; eq. 3 and eq. 4 each use some of them (1/f = θ · features).
FEATURES = ("1/w", "1/p", "1", "w/p", "w", "p", "p/w")
SYNC_FEATURES = (0, 2, 3, 4, 5)       # eq. 4: θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p
ASYNC_FEATURES = (0, 1, 2, 6)         # eq. 3 divided by w: θ0/w + θ1/p + θ2 + θ3·p/w
# Reference coefficients (Table 2, ResNet-50). Sync: the M/w term is Table 2's 1.02 with M = 16
# (the paper does not give M; 16 keeps the reference's optimum at a few tens of workers).
SYNC_REFERENCE = (1.02 * 16, 2.78, 4.92, 0.0, 0.02)
ASYNC_REFERENCE = (2.83, 3.92, 0.0, 0.11)
# Per-app priors: the epoch-time θ of models/ps_iteration_time.py (T = θ0/w + θ1 + θ2·w/s + θ3·w +
# θ4·s, eq. 4's form) that `elastane sim calibrate` measured for the built-in apps on the testbed
# (4 budgeted hosts of 0.375 core, hosts floating over the cores, AMs on the master, a quiet
# machine, 3 repeats a shape up to 16 x 8; 2026-11-29 06:31-06:54 UTC, the calibration shipped
# before today's sim/calibration.json). Only their shape matters: the fit scales them to each job.
# They are not independent of the simulator's truth: sim/calibration.json is a later calibration
# of the same apps on the same testbed, with its hosts pinned to cores (17:21-17:43 UTC the same
# day), so in the simulator the prior is an earlier measurement of what it simulates, as an
# operator's calibration of their cluster would be. bench/optimus_prior_effect.py measures what
# that buys against the dev-machine priors these replaced, the paper's reference, a flat prior and
# the simulated truth's own θ (docs/simulator.md, "Optimus's priors and the simulated truth").
APP_PRIORS: dict[str, tuple[float, float, float, float, float]] = {
    "mlr": (0.94289, 0.578115, 0.0, 0.020134, 0.006829),
    "nmf": (4.361352, 0.042556, 0.0, 0.001384, 0.02916),
    "lda": (4.957195, 0.0, 0.0, 0.013413, 0.02227),
    "lasso": (0.964197, 0.481427, 0.0, 0.018488, 0.018201),
}


# ===== loss curve ================================================================================

@dataclass(frozen=True)
class LossCurve:
    """A fitted eq. 1 in normalised units (losses divided by `scale`); `rss` its residual. The
    losses fitted were y = sign·x + offset of the app's objective x (`orientation`)."""

    beta0: float
    beta1: float
    beta2: float
    scale: float = 1.0
    rss: float = 0.0
    sign: float = 1.0
    offset: float = 0.0

    def fitted(self, k: float | Array) -> float | Array:
        """The curve in the fit's units (y, positive and falling) after `k` epochs."""
        return self.scale * (1.0 / (self.beta0 * np.asarray(k, dtype=float) + self.beta1) + self.beta2)

    def loss(self, k: float | Array) -> float | Array:
        """The predicted objective, in the app's own units and sign, after `k` epochs."""
        return self.sign * (self.fitted(k) - self.offset)

    def raw(self) -> tuple[float, float, float]:
        """(β0, β1, β2) of the curve in raw loss units: s·(1/(b0 k + b1) + b2) = 1/(b0/s k + b1/s) + s b2."""
        return self.beta0 / self.scale, self.beta1 / self.scale, self.beta2 * self.scale

    def epochs_to_converge(self, threshold: float) -> float:
        """The first k at which epoch k lowers the loss by less than `threshold` relative to epoch
        k-1 (inf if never; 0 for a flat curve). With a = β0(k-1) + β1 the relative drop is
        β0 / ((a + β0)(1 + β2·a)) < δ, i.e. δβ2·a² + δ(1 + β2β0)·a + β0(δ - 1) > 0."""
        b0, b1, b2, d = self.beta0, self.beta1, self.beta2, threshold
        if b0 <= 0.0:
            return 0.0
        if d >= 1.0:
            return 1.0
        if self.offset != 0.0:
            return _converge_numerically(self, d)
        qa, qb, qc = d * b2, d * (1.0 + b2 * b0), b0 * (d - 1.0)
        if qa > 0.0:
            a = (-qb + math.sqrt(qb * qb - 4.0 * qa * qc)) / (2.0 * qa)
        else:
            a = -qc / qb
        return max(1.0, math.floor((a - b1) / b0 + 1.0) + 1.0)

    def remaining_epochs(self, trained: float, threshold: float) -> float:
        """Epochs still to train after `trained` ones until the curve says converged (>= 0)."""
        return max(0.0, self.epochs_to_converge(threshold) - trained)


MAX_PREDICTED_EPOCHS = 100_000    # the numeric convergence search looks no further


@functools.lru_cache(maxsize=4096)
def _converge_numerically(curve: LossCurve, threshold: float) -> float:
    """`epochs_to_converge` for a curve fitted with an offset: the runtime's relative test on the
    raw objective x = sign·(y − offset), i.e. |y(k) − y(k−1)| / |y(k−1) − offset| < threshold,
    searched over k = 2, 3, ... in growing blocks (inf when never within MAX_PREDICTED_EPOCHS)."""
    start, size = 2, 256
    while start <= MAX_PREDICTED_EPOCHS:
        k = np.arange(start, min(start + size, MAX_PREDICTED_EPOCHS + 1), dtype=float)
        prev = np.asarray(curve.fitted(k - 1.0))
        rel = np.abs(np.asarray(curve.fitted(k)) - prev) / np.maximum(np.abs(prev - curve.offset), 1e-300)
        hit = np.nonzero(rel < threshold)[0]
        if hit.size:
            return float(k[hit[0]])
        start, size = start + size, size * 4
    return math.inf


def orientation(losses: Sequence[float] | Array) -> tuple[float, float]:
    """(sign, offset) that make an objective series a positive, falling loss y = sign·x + offset
    (see the module doc): sign -1 when it rises (last point above the first), an offset lifting
    the lowest point to the series' span when sign·x is not all positive."""
    x = np.asarray(losses, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return 1.0, 0.0
    sign = -1.0 if x[-1] > x[0] else 1.0
    y = sign * x
    low = float(y.min())
    if low > 0.0:
        return sign, 0.0
    span = float(y.max()) - low
    return sign, span - low if span > 0.0 else 1.0 - low


def loss_points(initial: Optional[float], history: Iterable[tuple[int, float]],
                clock_points: Iterable[tuple[float, float]] = ()) -> tuple[Array, Array]:
    """(k, loss) points of a job: the initial objective at k = 0, each finished epoch e at
    k = e + 1 (epochs trained) and each per-clock point (fractional epochs trained, objective) at
    its k; sorted by k, non-finite values dropped (an epoch's own point wins over a clock point at
    the same k)."""
    hist = list(history)
    clock = list(clock_points)
    return loss_arrays(initial, [e for e, _ in hist], [o for _, o in hist], [k for k, _ in clock], [o for _, o in clock])


def loss_arrays(initial: Optional[float], epochs: Sequence[int], objectives: Sequence[float],
                clock_k: Sequence[float], clock_objectives: Sequence[float]) -> tuple[Array, Array]:
    """`loss_points` from parallel sequences (what the RM keeps per job), vectorised: the RM builds
    these for thousands of jobs per round."""
    if not len(clock_k):       # epochs come in order, one point each: nothing to merge
        ks = np.floor(np.asarray(epochs, dtype=float)) + 1.0
        ls = np.asarray(objectives, dtype=float)
        if initial is not None:
            ks, ls = np.concatenate([[0.0], ks]), np.concatenate([[initial], ls])
        if (len(ks) < 2 or bool(np.all(np.diff(ks) > 0))) and bool(np.isfinite(ls).all()):
            return ks, ls
    # Clock points first, then the initial objective, then the epochs: where two share a k the
    # later one -- an epoch's -- is kept.
    ks = np.concatenate([np.asarray(clock_k, dtype=float), [0.0] if initial is not None else [],
                         np.floor(np.asarray(epochs, dtype=float)) + 1.0])
    ls = np.concatenate([np.asarray(clock_objectives, dtype=float), [initial] if initial is not None else [],
                         np.asarray(objectives, dtype=float)])
    keep = np.isfinite(ks) & np.isfinite(ls) & (ks >= 0.0)
    ks, ls = ks[keep][::-1], ls[keep][::-1]
    out_k, last = np.unique(ks, return_index=True)        # first in reverse = last given
    return out_k, ls[last]


def _scatter(flat: Array, lengths: NDArray[np.int64], width: int, fill: float) -> Array:
    """Rows of consecutive lengths `lengths` of `flat`, left-aligned in a len(lengths) x width
    matrix filled with `fill` beyond each row's end (one numpy scatter, no per-row copy)."""
    out = np.full((len(lengths), width), fill)
    if len(flat):
        starts = np.cumsum(lengths) - lengths
        rows = np.repeat(np.arange(len(lengths)), lengths)
        out[rows, np.arange(len(flat)) - np.repeat(starts, lengths)] = flat
    return out


def _pad(series: Sequence[tuple[Array, Array]]) -> tuple[Array, Array, NDArray[np.bool_], NDArray[np.int64]]:
    """Series as J x N matrices (k, loss, mask) left-aligned (k 0 and loss 1 past a row's end),
    and their lengths."""
    ks = [np.asarray(s[0], dtype=float) for s in series]
    lengths = np.fromiter(map(len, ks), dtype=np.int64, count=len(ks))
    n = int(lengths.max()) if len(lengths) else 0
    if not len(ks):
        return np.zeros((0, 0)), np.ones((0, 0)), np.zeros((0, 0), dtype=bool), lengths
    k = _scatter(np.concatenate(ks), lengths, n, 0.0)
    loss = _scatter(np.concatenate([np.asarray(s[1], dtype=float) for s in series]), lengths, n, 1.0)
    mask = np.arange(n)[None, :] < lengths[:, None]
    return k, loss, mask, lengths


def _remove_outliers(loss: Array, mask: NDArray[np.bool_], lengths: NDArray[np.int64], window: int) -> Array:
    """`remove_outliers` on every row of a padded matrix at once."""
    J, n = loss.shape
    hi = np.full((J, n), -np.inf)
    lo = np.full((J, n), np.inf)
    beyond = np.where(mask, loss, np.inf)      # past a row's end nothing counts as subsequent
    for d in range(1, min(window, n - 1) + 1):
        np.maximum(hi[:, d:], loss[:, :-d], out=hi[:, d:])       # previous
        np.minimum(lo[:, :-d], beyond[:, d:], out=lo[:, :-d])    # subsequent
    col = np.arange(n)[None, :]
    bad = mask & ((loss > hi) | (loss < lo)) & (col > 0) & (col < lengths[:, None] - 1)
    if not bad.any():
        return loss
    left = np.concatenate([loss[:, :1], loss[:, :-1]], axis=1)
    right = np.concatenate([loss[:, 1:], loss[:, -1:]], axis=1)
    return np.where(bad, 0.5 * (left + right), loss)


def remove_outliers(losses: Array, window: int = OUTLIER_WINDOW) -> Array:
    """§3.1: a point above the max of its previous `window` or below the min of its next `window`
    is replaced by the mean of its two neighbours (the first and last points are kept)."""
    x = np.asarray(losses, dtype=float)
    if len(x) < 3:
        return x.copy()
    k, loss, mask, lengths = _pad([(np.arange(len(x), dtype=float), x)])
    out: Array = _remove_outliers(loss, mask, lengths, window)[0]
    return out


def _prepare(k: Array, loss: Array, mask: NDArray[np.bool_], lengths: NDArray[np.int64],
             max_points: int) -> tuple[Array, Array, NDArray[np.bool_], Array]:
    """`prepare` on padded rows: returns (k, l, mask, scale) with at most `max_points` columns."""
    scale = np.where(mask, loss, -np.inf).max(axis=1)
    loss = _remove_outliers(loss, mask, lengths, OUTLIER_WINDOW) / scale[:, None]
    if loss.shape[1] <= max_points:
        return k, loss, mask, scale
    # Rows longer than max_points: means of consecutive near-equal groups, from prefix sums.
    long = lengths > max_points
    starts = (np.arange(max_points)[None, :] * lengths[:, None]) // max_points
    ends = np.concatenate([starts[:, 1:], lengths[:, None]], axis=1)
    zero = np.zeros((len(k), 1))
    ck = np.concatenate([zero, np.cumsum(np.where(mask, k, 0.0), axis=1)], axis=1)
    cl = np.concatenate([zero, np.cumsum(np.where(mask, loss, 0.0), axis=1)], axis=1)
    size = np.maximum(ends - starts, 1)
    kb = (np.take_along_axis(ck, ends, 1) - np.take_along_axis(ck, starts, 1)) / size
    lb = (np.take_along_axis(cl, ends, 1) - np.take_along_axis(cl, starts, 1)) / size
    kb = np.where(long[:, None], kb, k[:, :max_points])
    lb = np.where(long[:, None], lb, loss[:, :max_points])
    return kb, lb, mask[:, :max_points] | long[:, None], scale


def prepare(ks: Array, losses: Array, max_points: int = MAX_FIT_POINTS) -> tuple[Array, Array, float]:
    """The paper's pre-processing: outliers replaced, losses divided by their maximum, then long
    series averaged down to `max_points` (consecutive groups). Returns (k, l, scale)."""
    k, loss, mask, lengths = _pad([(np.asarray(ks, float), np.asarray(losses, float))])
    kb, lb, mb, scale = _prepare(k, loss, mask, lengths, max_points)
    return kb[0][mb[0]], lb[0][mb[0]], float(scale[0])


def _nnls2(sw: Array, sk: Array, skk: Array, sy: Array, sky: Array) -> tuple[Array, Array, NDArray[np.bool_]]:
    """Closed-form NNLS of min Σ w (a·k + b − y)² over a, b ≥ 0, from its weighted sums (any shape);
    the third array says where the unconstrained optimum was already feasible."""
    det = skk * sw - sk * sk
    safe = np.where(det > 1e-300, det, 1.0)
    a = np.where(det > 1e-300, (sw * sky - sk * sy) / safe, -1.0)
    b = np.where(det > 1e-300, (skk * sy - sk * sky) / safe, -1.0)
    inside = (a >= 0) & (b >= 0)
    # Off the feasible quadrant the optimum lies on an axis: a only (b = 0) or b only (a = 0).
    a_only = np.maximum(0.0, sky / np.where(skk > 0, skk, 1.0))
    b_only = np.maximum(0.0, sy / np.where(sw > 0, sw, 1.0))
    cost_a = a_only * a_only * skk - 2 * a_only * sky
    cost_b = b_only * b_only * sw - 2 * b_only * sy
    use_a = cost_a < cost_b
    return (np.where(inside, a, np.where(use_a, a_only, 0.0)),
            np.where(inside, b, np.where(use_a, 0.0, b_only)), inside)


def _moments(k: Array, loss: Array, mask: NDArray[np.bool_]) -> Array:
    """M[:, p, q] = Σ k^p · l^q over each row's points (p <= 2, q <= 4)."""
    kk = np.where(mask, k, 0.0)
    m = mask.astype(float)
    out = np.empty((len(k), 3, 5))
    lq = m
    for q in range(5):
        kp = lq
        for p_ in range(3):
            out[:, p_, q] = kp.sum(axis=1)
            kp = kp * kk
        lq = lq * loss
    return out


_BINOM = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1], [1, 4, 6, 4, 1]]


def _grid_fit(moments: Array, c: Array) -> tuple[Array, Array, Array, NDArray[np.bool_]]:
    """For jobs (their `_moments`) and β2 candidates c (J x G): the NNLS (β0, β1) of each
    candidate's weighted, linearised rows and that fit's objective. The rows' sums are polynomials
    in β2 -- Σ k^p (l − β2)^n = Σ_q C(n, q) (−β2)^(n−q) M[p, q] -- so a candidate costs O(1), not
    O(points). Returns (a, b, objective, interior), each J x G."""
    powers = [np.ones_like(c)]
    for _ in range(4):
        powers.append(powers[-1] * -c)

    def S(n: int, p_: int) -> Array:      # Σ k^p (l − β2)^n
        return sum((_BINOM[n][q] * powers[n - q] * moments[:, p_, q][:, None] for q in range(n + 1)),
                   start=np.zeros_like(c))

    sw, sk, skk = S(4, 0), S(4, 1), S(4, 2)
    sy, sky, syy = S(3, 0), S(3, 1), S(2, 0)
    a, b, inside = _nnls2(sw, sk, skk, sy, sky)
    obj = a * a * skk + 2 * a * b * sk + b * b * sw - 2 * a * sky - 2 * b * sy + syy
    return a, b, obj, inside


def fittable(ks: Sequence[float] | Array) -> bool:
    """Enough points to fit: `MIN_LOSS_POINTS` of them spanning `MIN_FIT_SPAN` epochs."""
    k = np.asarray(ks, dtype=float)
    return len(k) >= MIN_LOSS_POINTS and float(k.max() - k.min()) >= MIN_FIT_SPAN


def fit_loss_curves(series: Sequence[tuple[Array, Array]]) -> list[Optional[LossCurve]]:
    """Fit eq. 1 to each (k, objective) series at once (None where there are too few points, per
    `fittable`, or a value is not finite). Each series is first made a positive, falling loss
    (`orientation`); then pre-processing per `prepare`; see the module doc for the method."""
    return _fit_padded(*_pad(series))


def _orientations(x: Array, mask: NDArray[np.bool_]) -> tuple[Array, Array]:
    """`orientation` of every row of a padded matrix at once: (sign, offset) per row."""
    fin = mask & np.isfinite(x)
    anyf = fin.any(axis=1)
    rows = np.arange(len(x))
    n = x.shape[1]
    first = x[rows, np.argmax(fin, axis=1)] if n else np.zeros(len(x))
    last = x[rows, n - 1 - np.argmax(fin[:, ::-1], axis=1)] if n else np.zeros(len(x))
    sign = np.where(anyf & (last > first), -1.0, 1.0)
    y = sign[:, None] * x
    low = np.where(fin, y, np.inf).min(axis=1, initial=np.inf)
    span = np.where(fin, y, -np.inf).max(axis=1, initial=-np.inf) - low
    with np.errstate(invalid="ignore"):     # rows with no finite value: low = inf, no offset
        offset = np.where(low > 0.0, 0.0, np.where(span > 0.0, span - low, 1.0 - low))
    return sign, offset


def _fit_padded(k: Array, x: Array, mask: NDArray[np.bool_], lengths: NDArray[np.int64]) -> list[Optional[LossCurve]]:
    """`fit_loss_curves` of series already padded (`_pad`): objectives `x`, not yet oriented."""
    out: list[Optional[LossCurve]] = [None] * len(lengths)
    if not len(lengths):
        return out
    # `fittable` per row: enough points spanning enough epochs (a NaN k makes the span NaN: no).
    span = (np.where(mask, k, -np.inf).max(axis=1, initial=-np.inf)
            - np.where(mask, k, np.inf).min(axis=1, initial=np.inf))
    with np.errstate(invalid="ignore"):
        rows = np.nonzero((lengths >= MIN_LOSS_POINTS) & (span >= MIN_FIT_SPAN))[0]
    if not len(rows):
        return out
    # The kept rows padded as they would be alone: as wide as the longest of them. They go through
    # orientation and the fit in blocks: each block's temporaries (rows x BETA2_GRID floats for the
    # grid, dozens of them) stay in cache, which halves the time for thousands of jobs. Every step
    # is per row, and every block keeps this width (a row's sums depend on the zeros padding it),
    # so a row's curve is what one pass over all rows gives.
    n = int(lengths[rows].max())
    for r in range(0, len(rows), FIT_BLOCK_ROWS):
        block = rows[r:r + FIT_BLOCK_ROWS]
        kb, xb, mb, lb = k[block, :n], x[block, :n], mask[block, :n], lengths[block]
        signs, offsets = _orientations(xb, mb)
        loss = np.where(mb, signs[:, None] * xb + offsets[:, None], 1.0)
        valid = ~np.any(mb & ~((loss > 0) & np.isfinite(loss)), axis=1)     # losses must be positive
        if not valid.any():
            continue
        if not valid.all():
            block, kb, loss, mb, lb = block[valid], kb[valid], loss[valid], mb[valid], lb[valid]
            signs, offsets = signs[valid], offsets[valid]
        fits = zip(block.tolist(), *(f.tolist() for f in _fit_rows(kb, loss, mb, lb)), signs.tolist(),
                   offsets.tolist())
        for i, b0, b1, beta2, scale, res, sign, offset in fits:
            out[i] = LossCurve(b0, b1, beta2, scale, res, sign, offset)
    return out


def _fit_rows(k: Array, loss: Array, mask: NDArray[np.bool_],
              lengths: NDArray[np.int64]) -> tuple[Array, Array, Array, Array, Array]:
    """Eq. 1 fitted to each padded row of positive losses: (β0, β1, β2, scale, rss) per row."""
    k, loss, mask, scale = _prepare(k, loss, mask, lengths, MAX_FIT_POINTS)
    J = len(k)
    rows = np.arange(J)
    moments = _moments(k, loss, mask)
    lmin = np.where(mask, loss, np.inf).min(axis=1)
    c = lmin[:, None] * (np.arange(BETA2_GRID) / BETA2_GRID)[None, :]        # β2 in [0, min l)
    _, _, obj, _ = _grid_fit(moments, c)
    best = c[rows, obj.argmin(axis=1)]
    # Refine between the best candidate's neighbours.
    step = lmin / BETA2_GRID
    lo = np.maximum(0.0, best - step)
    hi = np.minimum(lmin * (1 - 1e-6), best + step)
    c2 = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, BETA2_GRID)[None, :]
    a, b, obj2, inside = _grid_fit(moments, c2)
    pick = obj2.argmin(axis=1)
    beta2, b0, b1, interior = c2[rows, pick], a[rows, pick], b[rows, pick], inside[rows, pick]
    pred = 1.0 / np.maximum(b0[:, None] * k + b1[:, None], 1e-12) + beta2[:, None]
    res = np.where(mask, (pred - loss) ** 2, 0.0).sum(axis=1)
    for r in np.nonzero(~interior)[0]:
        # A bound is active: the chosen β2's (β0, β1) from scipy's NNLS on the same weighted rows
        # (where the unconstrained optimum is feasible it is the NNLS solution already).
        ks, ls = k[r][mask[r]], loss[r][mask[r]]
        gap = ls - beta2[r]
        wt = gap * gap
        sol, _ = nnls(np.column_stack([ks * wt, wt]), wt / gap)
        b0[r], b1[r] = sol[0], sol[1]
        res[r] = float(((1.0 / np.maximum(b0[r] * ks + b1[r], 1e-12) + beta2[r] - ls) ** 2).sum())
    return b0, b1, beta2, scale, res


def fit_loss_curve(ks: Array, losses: Array) -> Optional[LossCurve]:
    """Fit eq. 1 to one job's (k, objective) points (None: too few points, or one not finite)."""
    return fit_loss_curves([(ks, losses)])[0]


# A job's loss history as the RM keeps it: (initial objective, finished epochs, their objectives,
# per-clock fractional epochs, their objectives) -- `loss_arrays`'s arguments.
LossHistory = tuple[Optional[float], Sequence[int], Sequence[float], Sequence[float], Sequence[float]]


def fit_loss_histories(histories: Sequence[LossHistory]) -> list[Optional[LossCurve]]:
    """`fit_loss_curves` of each history's `loss_arrays`, equal to it, without building one pair of
    arrays per job: the histories with no clock points whose epochs rise and whose values are all
    finite (`loss_arrays`'s own fast path: nothing to merge or drop) go into the padded matrices
    straight from their lists, one numpy conversion for all of them; the others go through
    `loss_arrays`."""
    J = len(histories)
    is_plain = np.fromiter((not len(h[3]) and len(h[1]) == len(h[2]) for h in histories), dtype=bool, count=J)
    general = {i: loss_arrays(*histories[i]) for i in np.nonzero(~is_plain)[0].tolist()}
    has_init = np.fromiter((h[0] is not None for h in histories), dtype=np.int64, count=J) * is_plain
    counts = np.fromiter((len(h[1]) for h in histories), dtype=np.int64, count=J)
    for i, (ks, _) in general.items():
        counts[i] = len(ks)
    lengths = counts + has_init
    n = int(lengths.max()) if J else 0
    # Every row's own points after its initial objective: the plain rows' epochs and objectives,
    # the general rows' arrays, in row order.
    chunks_k: list[Iterable[float]] = [h[1] for h in histories]
    chunks_x: list[Iterable[float]] = [h[2] for h in histories]
    for i, (ks, xs) in general.items():
        chunks_k[i], chunks_x[i] = ks, xs
    total = int(counts.sum())
    flat_k = np.fromiter(chain.from_iterable(chunks_k), dtype=float, count=total)
    flat_x = np.fromiter(chain.from_iterable(chunks_x), dtype=float, count=total)
    # A plain row's epoch e is at k = e + 1 (loss_arrays: floor(e) + 1)
    on_plain = np.repeat(is_plain, counts)
    flat_k = np.where(on_plain, np.floor(flat_k) + 1.0, flat_k)
    starts = np.cumsum(counts) - counts
    rows = np.repeat(np.arange(J), counts)
    cols = np.arange(total) - np.repeat(starts, counts) + np.repeat(has_init, counts)
    k = np.zeros((J, n))
    x = np.ones((J, n))
    k[rows, cols] = flat_k
    x[rows, cols] = flat_x
    first = np.nonzero(has_init)[0]
    if len(first):      # k stays 0: the initial objective
        x[first, 0] = [histories[i][0] for i in first.tolist()]
    mask = np.arange(n)[None, :] < lengths[:, None]
    # loss_arrays's fast path holds only where the ks rise and every value is finite; other plain
    # rows are rebuilt by loss_arrays (which merges and drops), shorter or as long.
    rising = ~np.any(mask[:, 1:] & ~(np.diff(k, axis=1) > 0), axis=1) if n > 1 else np.ones(J, dtype=bool)
    finite = ~np.any(mask & ~np.isfinite(x), axis=1)
    for i in np.nonzero(is_plain & ~(rising & finite))[0].tolist():
        ks, xs = loss_arrays(*histories[i])
        k[i], x[i] = 0.0, 1.0
        k[i, :len(ks)], x[i, :len(xs)] = ks, xs
        lengths[i] = len(ks)
        mask[i] = np.arange(n) < len(ks)
    return _fit_padded(k, x, mask, lengths)


# ===== speed function ============================================================================

def features(servers: Array | float, workers: Array | float) -> Array:
    """The general speed features (`FEATURES`) of (p, w), shape (..., 7)."""
    p = np.asarray(servers, dtype=float)
    w = np.asarray(workers, dtype=float)
    return np.stack([1.0 / w, 1.0 / p, np.ones_like(p), w / p, w, p, p / w], axis=-1)


@dataclass(frozen=True)
class SpeedFunction:
    """A fitted eq. 3 / eq. 4: 1/f(p, w) = coefficients · features(p, w); `rss` of the relative errors."""

    coefficients: tuple[float, ...]      # over FEATURES (zeros for the features the mode does not use)
    sync: bool
    rss: float = 0.0

    def inverse(self, servers: Array | float, workers: Array | float) -> Array:
        """1/f: time per unit of progress at (p, w)."""
        return np.asarray(features(servers, workers) @ np.asarray(self.coefficients))

    def speed(self, servers: Array | float, workers: Array | float) -> Array:
        return 1.0 / self.inverse(servers, workers)

    def theta(self) -> tuple[float, ...]:
        """The paper's θ of eq. 4 (sync) or eq. 3 (async), in the equation's order."""
        return tuple(self.coefficients[i] for i in (SYNC_FEATURES if self.sync else ASYNC_FEATURES))


@functools.lru_cache(maxsize=2)
def reference(sync: bool) -> SpeedFunction:
    """The reference speed function (Table 2's coefficients) the pseudo-samples come from."""
    coef = [0.0] * len(FEATURES)
    for i, v in zip(SYNC_FEATURES if sync else ASYNC_FEATURES, SYNC_REFERENCE if sync else ASYNC_REFERENCE):
        coef[i] = v
    return SpeedFunction(tuple(coef), sync)


def normalised(speed: SpeedFunction) -> SpeedFunction:
    """`speed` scaled so 1/f(1 server, 1 worker) = 1: only its shape, comparable across jobs of
    different data sizes (what a prior is)."""
    at_one = inverse_speed(speed.coefficients, 1, 1)
    if not at_one > 0.0:
        return speed
    return SpeedFunction(tuple(c / at_one for c in speed.coefficients), speed.sync)


@functools.lru_cache(maxsize=64)
def app_prior(app: str, sync: bool) -> Optional[SpeedFunction]:
    """The built-in prior of app `app` (`APP_PRIORS`, normalised; None for an app without one).
    The epoch-time θ are eq. 4's terms, used for SSP jobs too: the measured epoch time is what it
    is whatever the mode, and the fit then also uses the prior's terms (`fit_speed`)."""
    theta = APP_PRIORS.get(app)
    if theta is None:
        return None
    coef = [0.0] * len(FEATURES)
    for i, v in zip(SYNC_FEATURES, theta):
        coef[i] = v
    return normalised(SpeedFunction(tuple(coef), sync))


def _ladder(most: int) -> list[int]:
    out, v = [], 1
    while v < most:
        out.append(v)
        v *= 2
    return out + [max(1, most)]


@functools.lru_cache(maxsize=1024)
def _pseudo_shapes(prior: tuple[float, ...], cols: tuple[int, ...], max_servers: int,
                   max_workers: int) -> tuple[Array, Array]:
    """The pseudo-samples' features (rows, the fit's columns) and the prior's 1/f there."""
    shapes = [(p, w) for p in _ladder(max_servers) for w in _ladder(max_workers)]
    x = features(np.array([s[0] for s in shapes], float), np.array([s[1] for s in shapes], float))
    return x[:, list(cols)], x @ np.asarray(prior)


def fit_speed(samples: Sequence[tuple[int, int, float]], sync: bool, max_servers: int = 32,
              max_workers: int = 32, prior_weight: float = PRIOR_WEIGHT,
              prior: Optional[SpeedFunction] = None) -> Optional[SpeedFunction]:
    """NNLS fit of eq. 4 (`sync`) or eq. 3 to (servers, workers, speed) samples (None: no usable
    sample). Pseudo-samples of the scaled prior (`prior`, else the paper's `reference`) over a
    ladder of shapes up to the bounds carry `prior_weight` / (distinct shapes sampled) in all (0:
    the paper's plain fit, which needs samples at enough shapes). The fit uses the mode's terms and
    any other term the prior has (an epoch-time prior's θ4·p for an SSP job).

    Samples at one shape only (and a prior) give the prior scaled to them, computed directly:
    the NNLS would return (nearly) that, and the RM refits thousands of such jobs per round."""
    ref = prior if prior is not None else reference(sync)
    if prior_weight > 0 and samples:
        # Every sample usable and at one shape (the common case, kept lean: one pass to check):
        # the same sums as the general path below.
        p, w, _ = samples[0]
        isfinite = math.isfinite
        if p >= 1 and w >= 1 and all(s[0] == p and s[1] == w and s[2] > 0 and isfinite(s[2]) for s in samples):
            fs = [s[2] for s in samples]
            at_ref = inverse_speed(ref.coefficients, p, w)
            scale = math.exp((sum(map(math.log, fs)) + len(fs) * math.log(at_ref)) / len(fs))
            inv = at_ref / scale
            return SpeedFunction(tuple([c / scale for c in ref.coefficients]), sync,
                                 sum([(inv * f - 1.0) ** 2 for f in fs]))
    good = [s for s in samples if s[0] >= 1 and s[1] >= 1 and s[2] > 0 and math.isfinite(s[2])]
    if not good:
        return None
    # The reference scaled to the job: the geometric mean of measured / reference speed.
    p, w, _ = good[0]
    if prior_weight > 0 and all(s[0] == p and s[1] == w for s in good):
        # One shape among the usable samples.
        at_ref = inverse_speed(ref.coefficients, p, w)
        scale = math.exp((sum([math.log(s[2]) for s in good]) + len(good) * math.log(at_ref)) / len(good))
        inv = at_ref / scale
        return SpeedFunction(tuple([c / scale for c in ref.coefficients]), sync,
                             sum([(inv * s[2] - 1.0) ** 2 for s in good]))
    logs: dict[tuple[int, int], list[float]] = {}
    for p, w, f in good:
        logs.setdefault((p, w), []).append(math.log(f))
    log_scale = sum(sum(v) + len(v) * math.log(inverse_speed(ref.coefficients, p, w))
                    for (p, w), v in logs.items()) / len(good)
    scale = math.exp(log_scale)
    cols = sorted(set(SYNC_FEATURES if sync else ASYNC_FEATURES) | {i for i, c in enumerate(ref.coefficients) if c > 0})
    arr = np.array(good, dtype=float)
    speed = arr[:, 2]
    X = features(arr[:, 0], arr[:, 1])[:, cols]
    A = X * speed[:, None]                      # (θ·x − 1/f)·f: the relative error of the prediction
    b = np.ones(len(good))
    if prior_weight > 0:
        xp, ref_inv = _pseudo_shapes(tuple(ref.coefficients), tuple(cols), max(1, max_servers), max(1, max_workers))
        weight = math.sqrt(prior_weight / len(logs) / len(xp))    # fades as distinct shapes come in
        A = np.vstack([A, xp * (scale * weight / ref_inv)[:, None]])
        b = np.concatenate([b, np.full(len(xp), weight)])
    # Columns scaled to unit norm so NNLS is well conditioned whatever the units.
    norms = np.sqrt((A * A).sum(axis=0))
    norms[norms == 0] = 1.0
    theta, _ = nnls(A / norms, b)
    theta = theta / norms
    if not np.any(theta > 0):
        return None
    coef = [0.0] * len(FEATURES)
    for i, v in zip(cols, theta):
        coef[i] = float(v)
    rss = float((((X @ theta) * speed - 1.0) ** 2).sum())
    return SpeedFunction(tuple(coef), sync, rss)


SHAPE_FIT_ROUNDS = 4        # fit_shape's alternations of the jobs' scales and the shared shape


def fit_shape(jobs: Sequence[Sequence[tuple[int, int, float]]], sync: bool,
              prior: Optional[SpeedFunction] = None, prior_weight: float = PRIOR_WEIGHT) -> Optional[SpeedFunction]:
    """The speed function's shape (normalised) that several jobs of one app share, each at its own
    scale (its data size), fitted on all their (servers, workers, speed) samples at once; None
    when no sample is usable.

    Alternately: each job's scale is the geometric mean of its measured over the shape's speeds,
    and the shape is `fit_speed` on every sample divided by its job's scale, seeded with `prior`
    (else the reference) at `prior_weight` as a job's own fit is. A job is sampled at the few
    shapes it was given, which tell one or two directions apart (more workers, more servers);
    its own fit keeps the prior's shape in the others, and so does the mean of such fits. Fitted
    together, one job's direction and another's add up. (Jobs that each kept one workers:servers
    ratio say little even together: along a ratio the w/p term is a constant, which each job's
    own scale takes up.)"""
    usable = [[s for s in job if s[0] >= 1 and s[1] >= 1 and s[2] > 0 and math.isfinite(s[2])] for job in jobs]
    usable = [job for job in usable if job]
    if not usable:
        return None
    shape = normalised(prior if prior is not None else reference(sync))
    for _ in range(SHAPE_FIT_ROUNDS):
        pooled: list[tuple[int, int, float]] = []
        for job in usable:
            log_scale = sum(math.log(f) + math.log(inverse_speed(shape.coefficients, p, w)) for p, w, f in job) / len(job)
            scale = math.exp(log_scale)
            pooled.extend((p, w, f / scale) for p, w, f in job)
        fit = fit_speed(pooled, sync, prior_weight=prior_weight, prior=prior)
        if fit is None:
            return None
        shape = normalised(fit)
    return shape


def inverse_speed(coefficients: Sequence[float], p: float, w: float) -> float:
    """1/f at one shape: coefficients · features(p, w), without numpy (hot paths)."""
    c = coefficients
    return c[0] / w + c[1] / p + c[2] + c[3] * w / p + c[4] * w + c[5] * p + c[6] * p / w


__all__ = ["APP_PRIORS", "APP_PRIOR_WEIGHT", "ASYNC_FEATURES", "FEATURES", "LossCurve", "MAX_FIT_POINTS",
           "MIN_FIT_SPAN", "MIN_LOSS_POINTS", "PRIOR_WEIGHT", "SYNC_FEATURES", "SpeedFunction", "app_prior",
           "features", "fit_loss_curve", "fit_loss_curves", "fit_loss_histories", "fit_shape", "fit_speed", "fittable", "inverse_speed", "loss_arrays",
           "loss_points",
           "normalised", "orientation", "prepare", "reference", "remove_outliers"]
