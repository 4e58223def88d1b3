"""Named PS workloads whose communication is bytes on a link: models of 0.5-8 MB, pulled and pushed
whole every mini-batch, so on a capped link (50-200 Mbit/s) COMM lasts tens to hundreds of ms and
the COMP:COMM split, measured alone, spans about 80:20 to 20:80 (docs/harmony_workloads.md has the
measured table). Each is a built-in app with job-spec `data` / `hparams` overrides: usable as a job
spec (`spec(name)`) by any bench, and by bench/harmony_pair.py's `--profile`.

MLR's model is num_features x num_classes float32 and a mini-batch of B rows with nnz_per_sample
z touches every feature when B x z is well above num_features, so its pull and push carry the
whole model while its COMP grows with B x z x num_classes: the model size sets COMM, the batch
COMP. A block's rows hold the largest batch (a mini-batch never spans blocks), and every batch size
divides them (`batch_sizes`), so all of a job's mini-batches are alike.
"""
from __future__ import annotations

from typing import Any, NamedTuple

CLASSES = 100
ROWS_PER_BLOCK = 6000


class Workload(NamedTuple):
    """One workload: the app, its data and hyper-parameter overrides, and its model's size."""

    app: str
    data: dict[str, Any]
    hparams: dict[str, Any]

    @property
    def model_mb(self) -> float:
        return self.data["num_features"] * self.data["num_classes"] * 4 / 1e6


def _mlr(features: int, nnz: int, batch: int) -> Workload:
    return Workload("mlr", {"num_samples": 24_000, "num_features": features, "num_classes": CLASSES,
                            "nnz_per_sample": nnz, "rows_per_block": ROWS_PER_BLOCK, "num_heldout": 500},
                    {"batch_size": batch})


# name -> workload, from COMP-heavy to COMM-heavy at the default testbed setting (0.5 core, 100 Mbit/s)
WORKLOADS: dict[str, Workload] = {
    "mlr_0.5mb_comp": _mlr(1250, 400, 6000),
    "mlr_0.8mb": _mlr(2000, 300, 3000),
    "mlr_1.6mb": _mlr(4000, 150, 2000),
    "mlr_3.6mb": _mlr(9000, 100, 2000),
    "mlr_8mb_comm": _mlr(20_000, 100, 1000),
}


def batch_sizes(rows_per_block: int = ROWS_PER_BLOCK) -> list[int]:
    """The batch sizes that cut a block into equal mini-batches (a block's last batch is
    otherwise shorter, and a job's COMP time alternates)."""
    return [b for b in range(50, rows_per_block + 1) if rows_per_block % b == 0]


def spec(name: str, **extra: Any) -> dict[str, Any]:
    """A PS job spec (builtins) running workload `name`; `extra` adds job-spec fields."""
    w = WORKLOADS[name]
    return {"app": w.app, "data": dict(w.data), "hparams": dict(w.hparams), **extra}
