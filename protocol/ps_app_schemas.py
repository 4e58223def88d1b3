"""Data specs, hyper-parameters and size presets of the PS ML apps, as msgspec Structs.

They live in `protocol` (not in `psruntime.apps`) so that the RM can validate a PS job spec at
submission without importing the runtime: imports go protocol <- rm, psruntime <- appmaster.
`psruntime.apps.<app>` binds each app's math to these schemas (`Spec`, `HParams`, `PRESETS`).

JSON field names are snake_case, exactly the Struct field names.

A preset names both data sizes (`*_PRESETS`) and the hyper-parameters a default run at those sizes
trains with (`*_PRESET_HPARAMS`, under the job's own `hparams`): sizes with enough rows per model
parameter that the model can generalize, and regularization, step sizes and epochs under which a
default run gets close to the generator's true model on held-out data (tests/unit/test_presets_quality.py
at `tiny`, bench/training.py at `small` and `medium`). `large` is sized for scale, not for quality.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional, Union

import msgspec

from .json_types import JsonObject

Pos = Annotated[int, msgspec.Meta(ge=1)]
PosFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]


# ----- mlr ---------------------------------------------------------------------------------------

class MLRSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Size and shape of the synthetic MLR data."""

    num_samples: Pos = 2000
    num_features: Pos = 200
    num_classes: Annotated[int, msgspec.Meta(ge=2)] = 5
    nnz_per_sample: Pos = 20
    logit_scale: PosFloat = 4.0   # std of the true logits: larger = less label noise
    num_heldout: Pos = 500
    rows_per_block: Pos = 250
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0
    # A dataset directory (docs/dataset_format.md): the data comes from its files and the
    # dimensions from its dataset.json (see protocol.dataset_manifest.resolve_data_spec).
    path: Optional[str] = None

    def __post_init__(self) -> None:
        if self.nnz_per_sample > self.num_features:
            raise ValueError("nnz_per_sample must be <= num_features")


class MLRHParams(msgspec.Struct, forbid_unknown_fields=True):
    """SGD hyper-parameters of MLR."""

    learning_rate: PosFloat = 0.5
    lr_decay: NonNegFloat = 0.0        # lr_epoch = learning_rate / (1 + lr_decay * epoch)
    l2: NonNegFloat = 0.0
    batch_size: Pos = 50
    features_per_key: Pos = 4
    convergence_threshold: PosFloat = 1e-3
    max_epochs: Pos = 20


# Ten or more training rows per weight (features x classes): with fewer, the dense true weights
# cannot be learned and held-out accuracy stays far below the true model's, whatever the L2.
MLR_PRESETS: dict[str, JsonObject] = {
    "tiny": {"num_features": 80, "nnz_per_sample": 10, "num_heldout": 2000},
    "small": {"num_samples": 100_000, "num_features": 500, "num_classes": 20,
              "nnz_per_sample": 25, "num_heldout": 5000, "rows_per_block": 2000},
    "medium": {"num_samples": 1_000_000, "num_features": 2000, "num_classes": 50,
               "nnz_per_sample": 50, "num_heldout": 20_000, "rows_per_block": 10_000},
    "large": {"num_samples": 2_000_000, "num_features": 160_000, "num_classes": 100,
              "nnz_per_sample": 100, "num_heldout": 50_000, "rows_per_block": 10_000},
}
_MLR_HPARAMS: JsonObject = {"learning_rate": 1.0, "lr_decay": 0.05, "l2": 1e-4, "max_epochs": 20}
MLR_PRESET_HPARAMS: dict[str, JsonObject] = {p: dict(_MLR_HPARAMS) for p in MLR_PRESETS}
# The true weights' |W*|^2 grows as features x classes / nnz_per_sample (their std is scaled so the
# logits' is fixed): 5x small's at medium, so the same L2 shrank the model 5x harder -- held-out
# accuracy 0.519 vs the true model's 0.598 (l2 1e-4) against 0.567 with l2 scaled down 5x.
MLR_PRESET_HPARAMS["medium"]["l2"] = 2e-5


# ----- nmf ---------------------------------------------------------------------------------------

class NMFSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Size and shape of the synthetic NMF data."""

    num_users: Pos = 600
    num_items: Pos = 200
    rank: Pos = 5
    observed_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.2
    noise_std: NonNegFloat = 0.05
    num_heldout: Pos = 100
    rows_per_block: Pos = 100
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0
    # A dataset directory (docs/dataset_format.md): the data comes from its files and the
    # dimensions from its dataset.json (see protocol.dataset_manifest.resolve_data_spec).
    path: Optional[str] = None


class NMFHParams(msgspec.Struct, forbid_unknown_fields=True):
    """Projected SGD hyper-parameters of NMF."""

    rank: Pos = 5
    learning_rate: PosFloat = 0.3
    lr_decay: NonNegFloat = 0.0
    l2: NonNegFloat = 0.0
    batch_size: Pos = 20
    init_scale: Optional[PosFloat] = None   # factors start U(0, init_scale); default 2/sqrt(rank)
    # How the batch's (worker-local) user rows keep up with H: fitted by least squares against the
    # pulled H before the step (`user_solve`), and/or `user_steps` projected steps per push.
    user_solve: bool = False
    user_steps: Pos = 1
    convergence_threshold: PosFloat = 1e-3
    max_epochs: Pos = 30


# Every item rated ~100 times per 1000 users, so a mini-batch of 50 users steps each item's factors
# on a few ratings, not on one; a low rank: non-negative factors share a large mean, which
# makes the SGD steps crawl in the other rank - 1 directions (condition number ~3 x rank).
NMF_PRESETS: dict[str, JsonObject] = {
    "tiny": {},
    "small": {"num_users": 20_000, "num_items": 1000, "rank": 5, "observed_fraction": 0.1,
              "num_heldout": 500, "rows_per_block": 1000},
    "medium": {"num_users": 200_000, "num_items": 4000, "rank": 10, "observed_fraction": 0.025,
               "num_heldout": 1000, "rows_per_block": 5000},
    "large": {"num_users": 1_000_000, "num_items": 50_000, "rank": 100, "observed_fraction": 0.005,
              "num_heldout": 2000, "rows_per_block": 10_000},
}
# A user row is visited once per epoch while H steps every batch: several local steps on it per
# push (`user_steps`), or from `small` on (many batches per epoch) a least-squares fit against
# the pulled H (`user_solve`), keep W up with H. The model's rank is the data's: a rank-5 model of
# rank-20 data stalls far above the noise.
_NMF_HPARAMS: JsonObject = {"learning_rate": 0.3, "batch_size": 50, "user_solve": True, "max_epochs": 30}
NMF_PRESET_HPARAMS: dict[str, JsonObject] = {
    p: {**_NMF_HPARAMS, "rank": sizes.get("rank", NMFSpec().rank)} for p, sizes in NMF_PRESETS.items()}
NMF_PRESET_HPARAMS["tiny"].update(learning_rate=0.6, user_solve=False, user_steps=8)


# ----- lda ---------------------------------------------------------------------------------------

class LDASpec(msgspec.Struct, forbid_unknown_fields=True):
    """Size and shape of the synthetic corpus."""

    num_docs: Pos = 300
    vocab_size: Pos = 200
    num_topics: Pos = 5
    doc_length: Pos = 40                  # mean tokens per document (Poisson, at least 1)
    alpha_true: PosFloat = 0.1
    beta_true: PosFloat = 0.05
    num_heldout: Pos = 50
    rows_per_block: Pos = 100
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0
    # A dataset directory (docs/dataset_format.md): the data comes from its files and the
    # dimensions from its dataset.json (see protocol.dataset_manifest.resolve_data_spec).
    path: Optional[str] = None


class LDAHParams(msgspec.Struct, forbid_unknown_fields=True):
    """Gibbs sampling hyper-parameters of LDA."""

    num_topics: Pos = 5
    alpha: PosFloat = 0.1
    beta: PosFloat = 0.01
    batch_size: Pos = 50
    convergence_threshold: PosFloat = 1e-3
    max_epochs: Pos = 30


# Tens of tokens or more per topic-word count, and few enough topics that ~30 Gibbs sweeps mix:
# at 50 topics over 10 000 words 30 sweeps left the held-out perplexity 1.7x the true topics'.
LDA_PRESETS: dict[str, JsonObject] = {
    "tiny": {},
    "small": {"num_docs": 20_000, "vocab_size": 2000, "num_topics": 20, "doc_length": 100,
              "num_heldout": 500, "rows_per_block": 1000},
    "medium": {"num_docs": 300_000, "vocab_size": 5000, "num_topics": 30, "doc_length": 150,
               "num_heldout": 1000, "rows_per_block": 5000},
    "large": {"num_docs": 2_000_000, "vocab_size": 140_000, "num_topics": 400, "doc_length": 90,
              "num_heldout": 2000, "rows_per_block": 10_000},
}
# Smaller batches: the counts a batch samples against are refreshed per batch, and with 50
# documents the sampler settles well below the true topics' held-out likelihood.
_LDA_HPARAMS: JsonObject = {"batch_size": 20, "max_epochs": 30}
# As many topics as the corpus was generated with.
LDA_PRESET_HPARAMS: dict[str, JsonObject] = {
    p: {**_LDA_HPARAMS, "num_topics": sizes.get("num_topics", LDASpec().num_topics)} for p, sizes in LDA_PRESETS.items()}


# ----- lasso -------------------------------------------------------------------------------------

class LassoSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Size and shape of the synthetic Lasso data."""

    num_samples: Pos = 2000
    num_features: Pos = 200
    nnz_per_sample: Pos = 20
    support_size: Pos = 10
    noise_std: NonNegFloat = 0.1
    num_heldout: Pos = 500
    rows_per_block: Pos = 250
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0
    # A dataset directory (docs/dataset_format.md): the data comes from its files and the
    # dimensions from its dataset.json (see protocol.dataset_manifest.resolve_data_spec).
    path: Optional[str] = None

    def __post_init__(self) -> None:
        if self.nnz_per_sample > self.num_features:
            raise ValueError("nnz_per_sample must be <= num_features")
        if self.support_size > self.num_features and self.path is None:   # no truth to draw with files
            raise ValueError("support_size must be <= num_features")


class LassoHParams(msgspec.Struct, forbid_unknown_fields=True):
    """Proximal SGD hyper-parameters of Lasso."""

    learning_rate: PosFloat = 0.05
    lr_decay: NonNegFloat = 0.0
    # Default: 0.02 * nnz_per_sample / num_features, i.e. 2% of the loss gradient at w = 0 of a
    # unit-weight support feature (E[x_j y] = w*_j nnz/D for these N(0, 1) sparse features). It
    # also shrinks every support weight by ~2%: at 10% that bias alone made the held-out RMSE ~1.5x
    # the noise. Fewer off-support weights are exactly 0 than at 10%; support_threshold still
    # separates the support.
    l1: Optional[NonNegFloat] = None
    batch_size: Pos = 50
    features_per_key: Pos = 16
    scale_lr_with_workers: bool = True   # lr * num_workers for the averaged pushes (see module doc)
    support_threshold: PosFloat = 0.05   # |w_j| above this counts as "in the support"
    convergence_threshold: PosFloat = 1e-3
    max_epochs: Pos = 30


LASSO_PRESETS: dict[str, JsonObject] = {
    "tiny": {},
    "small": {"num_samples": 50_000, "num_features": 20_000, "nnz_per_sample": 50,
              "support_size": 200, "num_heldout": 5000, "rows_per_block": 2000},
    "medium": {"num_samples": 1_000_000, "num_features": 200_000, "nnz_per_sample": 50,
               "support_size": 2000, "num_heldout": 20_000, "rows_per_block": 10_000},
    "large": {"num_samples": 4_000_000, "num_features": 1_000_000, "nnz_per_sample": 50,
              "support_size": 10_000, "num_heldout": 50_000, "rows_per_block": 20_000},
}
_LASSO_HPARAMS: JsonObject = {"learning_rate": 0.15, "max_epochs": 30}
LASSO_PRESET_HPARAMS: dict[str, JsonObject] = {p: dict(_LASSO_HPARAMS) for p in LASSO_PRESETS}


# A built-in app's data spec and hyper-parameters, decoded: what `PSJobSpec.typed_data` /
# `typed_hparams` hold. Every HParams has `max_epochs`, `convergence_threshold` and `batch_size`,
# every Spec `rows_per_block`, `num_heldout` and `path`, so readers of those need no isinstance.
AppData = Union[MLRSpec, NMFSpec, LDASpec, LassoSpec]
AppHParams = Union[MLRHParams, NMFHParams, LDAHParams, LassoHParams]


@dataclass(frozen=True)
class AppSchema:
    """One app's configuration schema: data spec, hyper-parameters, presets (data sizes and the
    hyper-parameters that go with them), and which data-spec field counts the input rows (what
    workers partition)."""

    name: str
    spec: type[AppData]
    hparams: type[AppHParams]
    presets: dict[str, JsonObject]
    rows_field: str
    preset_hparams: dict[str, JsonObject]

    def num_input_blocks(self, spec: AppData) -> int:
        """How many input blocks the data has (the most workers that can get data)."""
        rows = int(getattr(spec, self.rows_field))
        return -(-rows // spec.rows_per_block)


APP_SCHEMAS: dict[str, AppSchema] = {
    "mlr": AppSchema("mlr", MLRSpec, MLRHParams, MLR_PRESETS, "num_samples", MLR_PRESET_HPARAMS),
    "nmf": AppSchema("nmf", NMFSpec, NMFHParams, NMF_PRESETS, "num_users", NMF_PRESET_HPARAMS),
    "lda": AppSchema("lda", LDASpec, LDAHParams, LDA_PRESETS, "num_docs", LDA_PRESET_HPARAMS),
    "lasso": AppSchema("lasso", LassoSpec, LassoHParams, LASSO_PRESETS, "num_samples", LASSO_PRESET_HPARAMS),
}
PRESET_NAMES: tuple[str, ...] = ("tiny", "small", "medium", "large")
