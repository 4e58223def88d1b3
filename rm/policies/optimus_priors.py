"""Per-app speed-function priors for the `optimus` policy (what seeds a job's speed fit).

Optimus (§3.2) pre-runs every job at a few shapes before it starts so its speed function is fitted
from the first round. Elastane does not pre-run (each shape would cost a restart); a job's fit is
seeded instead with a prior, pseudo-samples of a speed function scaled to the job's own measured
speed (models/optimus_fit.py `fit_speed`). A prior is only a shape -- how the speed changes with
servers and workers -- so it carries from one job of an app to the next whatever their data sizes.

Per app, what the policy itself observed of it: the last `MAX_LEARNED` jobs of the app that
finished (left the policy) with speed samples at two or more shapes. The prior of an app and mode
is the shape all those jobs' samples share, fitted on them at once with each job at its own scale
(models/optimus_fit.py `fit_shape`, seeded with the built-in prior -- `app_prior`: the epoch-time
coefficients measured for the built-in apps -- or the paper's reference). A job is sampled at the
few shapes Optimus gave it, so its own fit keeps the seed's shape in the directions it was not
moved in; fitted together, the jobs' directions add up. (Until 2026-11-30 the prior was the mean
of those jobs' own normalised fits and the built-in prior, which kept the seed's shape wherever
no single job had sampled; that mean is still the prior of an app whose jobs' samples were not
stored: a state stored before then.) Without any of these the prior is the built-in one, and an app with
none gets None (the fit falls back to the paper's reference).

The same finished jobs give the app's prior on epochs (`remaining_epochs`): a job whose loss curve
cannot be fitted yet is expected to run as long as the finished jobs of its app that ran longer
than it has so far (their median), which is nearer the truth than its `max_epochs` (a cap most jobs
never reach). Pure state, no I/O.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from models.optimus_fit import APP_PRIOR_WEIGHT, FEATURES, PRIOR_WEIGHT, SpeedFunction, app_prior, fit_shape, normalised

MAX_LEARNED = 8      # finished jobs per app whose samples (or, from an older state, fits) the prior uses

# A finished job's speed samples, as the prior keeps them: its mode (True: BSP) and its
# (servers, workers, epochs/s) samples.
LearnedJob = tuple[bool, list[tuple[int, int, float]]]
MAX_LEARNED_EPOCHS = 32    # finished jobs per app whose epoch counts the epoch prior looks at


@dataclass
class AppPriors:
    """The per-app priors and what was learned for them (see the module doc)."""

    learned: dict[str, list[tuple[float, ...]]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    epochs: dict[str, list[float]] = field(default_factory=dict)
    samples: dict[str, list[LearnedJob]] = field(default_factory=dict)
    _cache: dict[tuple[str, bool, int], Optional[SpeedFunction]] = field(default_factory=dict, repr=False)

    def finished(self, app: str, epochs: float) -> None:
        """A job of `app` left after training `epochs` epochs."""
        if epochs > 0:
            kept = self.epochs.setdefault(app, [])
            kept.append(epochs)
            del kept[:-MAX_LEARNED_EPOCHS]

    def remaining_epochs(self, app: str, trained: float) -> Optional[float]:
        """The epochs a job of `app` that trained `trained` has left, by the finished jobs of the
        app that ran longer (the median of their epochs, less `trained`); None when none did."""
        longer = sorted(e for e in self.epochs.get(app, []) if e > trained)
        if not longer:
            return None
        return statistics.median(longer) - trained

    def learn(self, app: str, speed: SpeedFunction, samples: Sequence[tuple[int, int, float]] = ()) -> None:
        """A finished job of `app` whose speed function was fitted on `samples` at two or more
        shapes (without samples: its fit only, as an older state kept it)."""
        coef = normalised(speed).coefficients
        if not any(c > 0 for c in coef):
            return
        kept = self.learned.setdefault(app, [])
        kept.append(coef)
        del kept[:-MAX_LEARNED]
        if len({s[:2] for s in samples}) >= 2:
            jobs = self.samples.setdefault(app, [])
            jobs.append((speed.sync, [(int(p), int(w), float(f)) for p, w, f in samples]))
            del jobs[:-MAX_LEARNED]
        self.versions[app] = self.versions.get(app, 0) + 1
        # The app's priors of the old version are never asked for again: one stale entry per
        # finished job otherwise, deep-copied with the policy every round.
        for key in [k for k in self._cache if k[0] == app]:
            del self._cache[key]

    def version(self, app: str) -> int:
        """Changes when what the prior of `app` is changes (a cache key for the jobs' fits)."""
        return self.versions.get(app, 0)

    def prior(self, app: str, sync: bool) -> Optional[SpeedFunction]:
        """The prior of `app` (None: nothing known of it)."""
        key = (app, sync, self.version(app))
        if key not in self._cache:
            self._cache[key] = self._prior(app, sync)
        return self._cache[key]

    def _prior(self, app: str, sync: bool) -> Optional[SpeedFunction]:
        built_in = app_prior(app, sync)
        jobs = [samples for mode, samples in self.samples.get(app, []) if mode == sync]
        if jobs:
            shape = fit_shape(jobs, sync, built_in, self.weight(built_in))
            if shape is not None:
                return shape
        rows = list(self.learned.get(app, []))
        if built_in is not None:
            rows.append(built_in.coefficients)
        if not rows:
            return None
        return SpeedFunction(tuple(sum(r[i] for r in rows) / len(rows) for i in range(len(FEATURES))), sync)

    @staticmethod
    def weight(prior: Optional[SpeedFunction]) -> float:
        """The pseudo-samples' total weight: more for an app's own prior than for the reference."""
        return PRIOR_WEIGHT if prior is None else APP_PRIOR_WEIGHT


__all__ = ["AppPriors", "LearnedJob", "MAX_LEARNED", "MAX_LEARNED_EPOCHS"]
