"""Per-app coefficients the simulator runs on, measured by `elastane sim calibrate` on a real cluster.

A calibration file (JSON; sim/calibration.json is the default, measured on this project's dev
machine) holds, per app:

- `reference`: the job the coefficients were measured with (data / hparams / executor size): a trace
  job's `data_scale` is relative to this data;
- `theta`: the epoch-time form of models.ps_iteration_time (seconds per epoch on the reference data)
  and the measured `samples` [workers, servers, epoch seconds] it was fitted to;
- `clocks_per_epoch`: iterations (BSP clocks) per epoch, so simulated reports count iterations;
- `loss_curve`: β0, β1, β2 of the Optimus curve fitted to a real run's objectives (times
  `objective_sign`: -1 for an objective that rises, LDA's log-likelihood), and that run's
  objectives (`convergence_history`): a job's epoch count is where they meet its threshold, the
  curve's prediction when they never do;
- costs in seconds, measured on the cluster: `am_start_s` (AM container allocated -> registered),
  `startup_s` (executors granted -> training starts), `finish_s` (converged -> AM unregistered),
  `reshape_s` (an EPS add / remove, training stalled), `restart_s` (the kill-based restart from a
  checkpoint; also a resume after a pause), `pause_s` (checkpoint and release on a pause).
- how those costs grow with the job (issue 25: constant costs made a resize of a 1 GB model as cheap
  as one of a 1 MB model): `model_mb` is the reference job's parameter state; an EPS reshape moves
  parameter blocks between servers, so it costs `reshape_s + reshape_s_per_mb * (model_mb' -
  model_mb)`; a kill-based restart checkpoints and restores the whole model and regenerates the
  input data, so it costs `restart_s + restart_s_per_mb * (model_mb' - model_mb) + restart_data_s *
  (data_scale - 1)` (never below a quarter of the reference cost: the fixed part -- stopping,
  launching, registering -- stays). The per-MB and per-data figures are bench/eps_overhead.py's
  (see `MEASURED_COSTS` for the run and what it could not separate).

How the epoch-time samples become θ (issue 33, "calibration that holds": `fit_app`):

- every measurement is kept as a `CalibrationSample` (`shape_samples`), with the machine's busy
  share and load per core over it and, when the machine was saturated, why it was refused
  (elastane_cli/machine_load.py); a refused sample enters no fit and no statistic;
- a shape counts once it has `MIN_REPEATS` accepted samples; its epoch time is their median and
  `shape_spread` keeps (workers, servers, accepted repeats, (max - min) / median);
- some shapes inside the measured range are held out (`holdout_shapes`: never the smallest or the
  largest in either role, so the fitted range is the measured one); θ is fitted on the others
  (`samples`) and its relative error on the held-out medians (`holdout_samples`) is
  `holdout_error` (mean) / `holdout_error_max`: θ is the fit that never saw them, so the error is
  the error of the θ the simulator uses;
- `measured_range()` is the largest workers and servers measured (fitted or held out): a
  simulated job at a shape beyond it runs on an extrapolation, which the simulator counts
  (`SimResult.extrapolated_job_share`).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated, Iterable, Literal, Optional, Sequence

import msgspec

from models.ps_iteration_time import EpochTimeError, EpochTimeModel, fit as fit_epoch_time

from .convergence import CurveError, LossCurve
from protocol.errors import ConfigurationError, PlanningError
from protocol.json_types import JsonObject

DEFAULT_PATH = Path(__file__).resolve().parent / "calibration.json"
# How resize costs grow with the job (module doc): training time lost per MB of parameter state
# (EPS: blocks handed between servers; kill: checkpointed and restored) and per reference data size
# regenerated on a restart. From bench/eps_overhead.py --features 20000 --rounds 1 (MLR, 9.8 MiB
# over 3 servers, 3 workers; 2026-11-26, host load average ~20) against the calibration's tiny MLR
# (0.0015 MiB): EPS lost 0.09 s (remove) and 0.03 s (add) -- the blocks move while training goes on,
# below the 0.5 s the tiny job's reshape lost, so no growth was measured and the EPS figure is 0;
# the kill-based restart lost 12.2 s (remove) and 13.3 s (add) against 3.0 s: (12.7 - 3.0) / 9.8 =
# 0.99 s per MiB. That run changed the data too (6000 samples x 20000 features against 20000 x 80),
# which one run cannot separate from the model: the per-MiB figure includes it, `restart_data_s`
# stays 0 until a run varies the data alone.
MEASURED_COSTS: dict[str, float] = {"reshape_s_per_mb": 0.0, "restart_s_per_mb": 0.99, "restart_data_s": 0.0}
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]
MIN_REPEATS = 3             # accepted samples a shape needs before it enters a fit


class CalibrationError(ConfigurationError, ValueError):
    """A calibration file that cannot be read or used."""


class CalibrationSample(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One measured epoch time of a shape, with the machine's state while it was measured."""

    workers: Annotated[int, msgspec.Meta(ge=1)]
    servers: Annotated[int, msgspec.Meta(ge=1)]
    epoch_s: Optional[NonNegFloat] = None     # None: the run gave no epoch time (failed)
    repeat: int = 0
    busy_share: Optional[float] = None        # share of the machine's cores busy over the run
    load_per_core: Optional[float] = None     # 1-minute load average over the cores
    refused: str = ""                         # why it was refused (saturated, failed); "" = accepted

    @property
    def accepted(self) -> bool:
        return not self.refused and self.epoch_s is not None and self.epoch_s > 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.workers, self.servers)


class ShapeStat(msgspec.Struct, frozen=True):
    """A shape's accepted repeats: how many, their median epoch time and their spread."""

    workers: int
    servers: int
    repeats: int
    median_s: float
    spread: float        # (max - min) / median over the accepted repeats


class AppFit(msgspec.Struct, frozen=True):
    """What `fit_app` made of one app's samples."""

    theta: tuple[float, ...]
    fitted: tuple[ShapeStat, ...]         # the shapes θ was fitted on
    held_out: tuple[ShapeStat, ...]       # measured, left out of the fit, predicted
    holdout_error: Optional[float]        # mean |predicted - measured| / measured over held_out
    holdout_error_max: Optional[float]
    too_few: tuple[tuple[int, int], ...]  # shapes with fewer than min_repeats accepted samples
    refused: int                          # samples refused (saturated or failed)

    @property
    def spread_max(self) -> float:
        return max((s.spread for s in (*self.fitted, *self.held_out)), default=0.0)


class CalibrationFitError(PlanningError, ValueError):
    """Too few usable samples to fit an app."""


def shape_stats(samples: Iterable[CalibrationSample], min_repeats: int = MIN_REPEATS
                ) -> tuple[list[ShapeStat], list[tuple[int, int]]]:
    """Per shape its accepted samples' statistics (shapes with at least `min_repeats` of them), and
    the shapes that have fewer. Refused samples are not looked at."""
    by_shape: dict[tuple[int, int], list[float]] = {}
    seen: set[tuple[int, int]] = set()
    for smp in samples:
        seen.add(smp.shape)
        if smp.accepted:
            by_shape.setdefault(smp.shape, []).append(float(smp.epoch_s or 0.0))
    stats = []
    for (w, s), times in sorted(by_shape.items()):
        if len(times) < min_repeats:
            continue
        med = statistics.median(times)
        stats.append(ShapeStat(w, s, len(times), med, (max(times) - min(times)) / med if med > 0 else 0.0))
    kept = {(st.workers, st.servers) for st in stats}
    return stats, sorted(seen - kept)


def holdout_shapes(shapes: Sequence[tuple[int, int]], every: int = 3) -> list[tuple[int, int]]:
    """The shapes to hold out of a fit: every `every`-th by executors of those strictly inside the
    measured range (not the fewest or most workers, not the fewest or most servers), so the fit
    still spans the whole range. None when fewer than 6 shapes: a 5-term θ needs the rest."""
    if len(shapes) < 6:
        return []
    ws = [w for w, _ in shapes]
    ss = [s for _, s in shapes]
    inner = sorted((sh for sh in shapes if min(ws) < sh[0] < max(ws) and min(ss) < sh[1] < max(ss)),
                   key=lambda sh: (sh[0] + sh[1], sh))
    out = inner[every // 2::every]
    while len(shapes) - len(out) < 5 and out:
        out.pop()
    return out


def fit_app(samples: Sequence[CalibrationSample], min_repeats: int = MIN_REPEATS,
            holdout: Optional[Sequence[tuple[int, int]]] = None) -> AppFit:
    """θ from the accepted samples (module doc): shapes with `min_repeats` accepted samples, their
    medians, `holdout` (default `holdout_shapes`) left out and predicted."""
    stats, too_few = shape_stats(samples, min_repeats)
    if not stats:
        raise CalibrationFitError(f"no shape has {min_repeats} accepted samples "
                                  f"({sum(not x.accepted for x in samples)} of {len(samples)} refused)")
    shapes = [(st.workers, st.servers) for st in stats]
    out = set(holdout_shapes(shapes) if holdout is None else holdout)
    fitted = tuple(st for st in stats if (st.workers, st.servers) not in out)
    held = tuple(st for st in stats if (st.workers, st.servers) in out)
    if not fitted:
        raise CalibrationFitError("every shape was held out: nothing left to fit")
    model = fit_epoch_time([(st.workers, st.servers, st.median_s) for st in fitted])
    errors = [abs(model.epoch_time(st.workers, st.servers) - st.median_s) / st.median_s for st in held]
    return AppFit(tuple(round(t, 6) for t in model.theta), fitted, held,
                  round(statistics.fmean(errors), 4) if errors else None, round(max(errors), 4) if errors else None,
                  tuple(too_few), sum(not x.accepted for x in samples))


class AppCalibration(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One app's coefficients (see the module doc)."""

    theta: list[float]
    loss_curve: list[float]
    clocks_per_epoch: Annotated[float, msgspec.Meta(gt=0.0)] = 10.0
    reference: JsonObject = {}
    samples: list[list[float]] = []
    initial_objective: Optional[float] = None
    histories: list[list[list[float]]] = []     # per calibration run its [epochs done, objective] points
    # The objectives after 1, 2, ... epochs of the reference run (the one the curve is fitted on):
    # where they meet a job's threshold they give its epoch count, the curve extrapolates beyond.
    convergence_history: list[float] = []
    runs: list[JsonObject] = []                 # what each calibration run measured (shape, JCT, times, epochs)
    am_start_s: NonNegFloat = 2.0
    startup_s: NonNegFloat = 3.0
    finish_s: NonNegFloat = 1.0
    reshape_s: NonNegFloat = 2.0
    restart_s: NonNegFloat = 6.0
    pause_s: NonNegFloat = 2.0
    model_mb: NonNegFloat = 0.0               # the reference job's parameter state (0: unknown, no scaling)
    reshape_s_per_mb: NonNegFloat = MEASURED_COSTS["reshape_s_per_mb"]
    restart_s_per_mb: NonNegFloat = MEASURED_COSTS["restart_s_per_mb"]
    restart_data_s: NonNegFloat = MEASURED_COSTS["restart_data_s"]
    max_epochs: Annotated[int, msgspec.Meta(ge=1)] = 1000    # the app's epoch limit when a job sets none
    # -1 for apps whose objective rises as they learn (LDA's log-likelihood): the curve is fitted to
    # -objective, and simulated reports give -l(k). The convergence test is the same either way.
    objective_sign: Literal[1, -1] = 1
    # Issue 33 (module doc, `fit_app`): every sample with the machine's state, the shapes' spread
    # over their repeats, the held-out shapes and the fit's error on them.
    shape_samples: list[CalibrationSample] = []
    shape_spread: list[list[float]] = []        # [workers, servers, accepted repeats, spread]
    holdout_samples: list[list[float]] = []     # [workers, servers, median epoch s], not fitted
    holdout_error: Optional[float] = None
    holdout_error_max: Optional[float] = None

    def measured_range(self) -> Optional[tuple[int, int]]:
        """The most workers and the most servers measured (fitted or held out); None when the
        calibration has no samples (a speed function given, not measured: nothing to extrapolate)."""
        shapes = [(int(w), int(s)) for w, s, *_ in (*self.samples, *self.holdout_samples)]
        if not shapes:
            return None
        return max(w for w, _ in shapes), max(s for _, s in shapes)

    def beyond_range(self, workers: int, servers: int) -> bool:
        """Whether the epoch time at this shape is an extrapolation of the measured range."""
        rng = self.measured_range()
        return rng is not None and (workers > rng[0] or servers > rng[1])

    def reshape_cost(self, model_mb: float, data_scale: float = 1.0) -> float:
        """Training time an EPS reshape of a job with `model_mb` of parameters loses (module doc)."""
        extra = self.reshape_s_per_mb * (model_mb - self.model_mb) if self.model_mb > 0 else 0.0
        return max(0.25 * self.reshape_s, self.reshape_s + extra)

    def restart_cost(self, model_mb: float, data_scale: float = 1.0) -> float:
        """Training time a kill-based restart (or a resume) of such a job on `data_scale` loses."""
        extra = self.restart_s_per_mb * (model_mb - self.model_mb) if self.model_mb > 0 else 0.0
        extra += self.restart_data_s * (data_scale - 1.0)
        return max(0.25 * self.restart_s, self.restart_s + extra)

    def objective(self, epochs: int) -> float:
        """The objective after `epochs` epochs, as the app reports it: the measured reference run's
        where it has them (the same values the job's epoch count comes from), beyond them the
        fitted curve, scaled to meet the last measured value (no jump where the two meet)."""
        h = self.convergence_history
        curve = self.curve()
        if epochs == 0 and self.initial_objective is not None and h:
            return self.initial_objective
        if 1 <= epochs <= len(h):
            return h[epochs - 1]
        if not h:
            return self.objective_sign * curve.loss(epochs)
        at_last = curve.loss(len(h))
        scale = (self.objective_sign * h[-1]) / at_last if at_last > 0 else 1.0
        return self.objective_sign * curve.loss(epochs) * scale

    def epoch_model(self) -> EpochTimeModel:
        return EpochTimeModel(tuple(self.theta))

    def epochs_to_converge(self, threshold: float, max_epochs: int) -> int:
        """The epoch a job with this threshold stops after: as the measured reference run would
        (the apps' own test on its objectives), or, when it never meets the threshold, as the
        fitted curve predicts (at least one epoch past the measured ones)."""
        h = self.convergence_history
        for k in range(2, min(len(h), max_epochs) + 1):
            prev, cur = h[k - 2], h[k - 1]
            if abs(cur - prev) / max(abs(prev), 1e-12) < threshold:
                return k
        if len(h) >= max_epochs:
            return max_epochs
        return min(max_epochs, max(len(h) + 1, self.curve().epochs_to_converge(threshold, max_epochs)))

    def curve(self) -> LossCurve:
        if len(self.loss_curve) != 3:
            raise CurveError(f"loss_curve needs 3 coefficients, got {len(self.loss_curve)}")
        return LossCurve(*self.loss_curve)


class Calibration(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A calibration file: per app its coefficients, and where they were measured."""

    apps: dict[str, AppCalibration]
    measured_on: str = ""
    note: str = ""
    # The CPU one vcore had when it was measured (the testbed hosts' budgets shared out by vcore;
    # 0: not recorded): the simulator's executors train at that speed.
    core_per_vcore: NonNegFloat = 0.0
    # Whether each testbed host was pinned to one CPU (files before this was recorded: not): a
    # check of the simulator on real hosts runs on hosts like those it was calibrated on.
    pinned_hosts: bool = False

    def app(self, name: str) -> AppCalibration:
        try:
            return self.apps[name]
        except KeyError:
            raise CalibrationError(f"the calibration has no app {name!r}; it has: "
                                   f"{', '.join(sorted(self.apps)) or 'none'}") from None


def load(path: Path = DEFAULT_PATH) -> Calibration:
    """Read and check a calibration file (CalibrationError naming the problem otherwise)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CalibrationError(f"cannot read calibration {path}: {e.strerror or e}") from None
    try:
        cal = msgspec.json.decode(raw, type=Calibration)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise CalibrationError(f"calibration {path}: {e}") from None
    for name, app in cal.apps.items():
        try:
            app.epoch_model()
            app.curve()
        except (EpochTimeError, CurveError) as e:
            raise CalibrationError(f"calibration {path}: app {name}: {e}") from None
    return cal


def save(cal: Calibration, path: Path) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(cal), indent=2) + b"\n")


__all__ = ["AppCalibration", "AppFit", "Calibration", "CalibrationError", "CalibrationFitError", "CalibrationSample",
           "DEFAULT_PATH", "MIN_REPEATS", "ShapeStat", "fit_app", "holdout_shapes", "load", "save", "shape_stats"]
