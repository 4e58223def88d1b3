"""How well a trained model generalizes: each app's held-out metric and how close it must come to
the generator's true model (what a default run at a preset is expected to reach).

Targets (issue 15), on the app's held-out data against the true model scored the same way:
- mlr: held-out accuracy within 5 points of the true weights' accuracy;
- nmf, lasso: held-out RMSE within 10 % of the noise floor (the true model's held-out RMSE: NMF's
  fold-in fits each held-out user's factors from half its ratings, so its floor is above noise_std);
- lda: held-out perplexity (exp of minus the log-likelihood per token) within 10 % of the true
  topics', i.e. the log-likelihood per token at most log(1.1) below theirs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class HeldoutMetric:
    """The metric early stopping and the divergence warning watch, and its true-model counterpart."""

    name: str
    maximize: bool
    true_model: str


HELDOUT_METRICS: dict[str, HeldoutMetric] = {
    "mlr": HeldoutMetric("cross_entropy", False, "true_model_cross_entropy"),
    "nmf": HeldoutMetric("heldout_rmse", False, "true_model_heldout_rmse"),
    "lasso": HeldoutMetric("heldout_rmse", False, "true_model_heldout_rmse"),
    "lda": HeldoutMetric("heldout_loglik_per_token", True, "true_model_heldout_loglik_per_token"),
}


def heldout_metric(app: str) -> HeldoutMetric:
    return HELDOUT_METRICS[app]


@dataclass(frozen=True)
class QualityCheck:
    """One app's held-out figure against the true model's and whether it meets the target."""

    app: str
    metric: str
    value: float
    true_model_value: float
    target: str
    met: bool

    def to_json(self) -> dict[str, str | float | bool]:
        return {"metric": self.metric, "value": self.value, "true_model_value": self.true_model_value,
                "target": self.target, "met": self.met}

    def describe(self) -> str:
        return (f"{self.metric} {self.value:.4g} vs true model {self.true_model_value:.4g} "
                f"({'meets' if self.met else 'misses'} {self.target})")


def check_quality(app: str, metrics: Mapping[str, float]) -> Optional[QualityCheck]:
    """The target check of `metrics` (an app's `evaluate`); None without a true model (file data)."""
    if app == "mlr":
        if "true_model_accuracy" not in metrics:
            return None
        v, t = float(metrics["accuracy"]), float(metrics["true_model_accuracy"])
        return QualityCheck(app, "accuracy", v, t, "within 0.05 of the true model", v >= t - 0.05)
    if app in ("nmf", "lasso"):
        if "true_model_heldout_rmse" not in metrics:
            return None
        v, t = float(metrics["heldout_rmse"]), float(metrics["true_model_heldout_rmse"])
        return QualityCheck(app, "heldout_rmse", v, t, "within 10% of the noise floor", v <= 1.1 * t)
    if app == "lda":
        if "true_model_heldout_loglik_per_token" not in metrics:
            return None
        v, t = math.exp(-float(metrics["heldout_loglik_per_token"])), \
            math.exp(-float(metrics["true_model_heldout_loglik_per_token"]))
        return QualityCheck(app, "heldout_perplexity", v, t, "within 10% of the true topics'", v <= 1.1 * t)
    raise KeyError(f"no quality target for app {app!r}")
