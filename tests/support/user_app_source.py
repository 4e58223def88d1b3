"""The source of a tiny user app (least-squares linear regression) written only against
elastane.app_api, numpy and msgspec, as a user would: tests write it to a file of their own and
ship it with `--py-files`. `FAIL_IN_COMPUTE` makes compute raise (a user's bug)."""
from __future__ import annotations

LINREG_SOURCE = '''
"""A user's linear regression: y = x . w + noise, squared loss, SGD."""
from typing import Annotated

import msgspec
import numpy as np

from elastane.app_api import DataBlock, KeyValues, ObjectivePart, PSApp

FAIL_IN_COMPUTE = {fail}


class LinRegSpec(msgspec.Struct, forbid_unknown_fields=True):
    num_samples: Annotated[int, msgspec.Meta(ge=1)] = 800
    num_features: Annotated[int, msgspec.Meta(ge=1)] = 8
    num_heldout: Annotated[int, msgspec.Meta(ge=1)] = 200
    rows_per_block: Annotated[int, msgspec.Meta(ge=1)] = 100
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0


class LinRegHParams(msgspec.Struct, forbid_unknown_fields=True):
    learning_rate: Annotated[float, msgspec.Meta(gt=0)] = 0.1
    batch_size: Annotated[int, msgspec.Meta(ge=1)] = 20
    convergence_threshold: Annotated[float, msgspec.Meta(gt=0)] = 1e-9
    max_epochs: Annotated[int, msgspec.Meta(ge=1)] = 5


class LinRegApp(PSApp):
    name = "linreg"
    Spec = LinRegSpec
    HParams = LinRegHParams
    ENTRY_FIELDS = ()
    ROW_FIELDS = ("x", "y")

    @property
    def num_rows(self):
        return self.spec.num_samples

    @property
    def num_keys(self):
        return self.spec.num_features

    @property
    def key_length(self):
        return 1

    def true_weights(self):
        return np.random.default_rng([self.seed, 7]).normal(size=self.spec.num_features)

    def generate_block(self, block_index, heldout=False):
        total = self.spec.num_heldout if heldout else self.spec.num_samples
        start = block_index * self.rows_per_block
        n = min(self.rows_per_block, total - start)
        rng = np.random.default_rng([self.seed, int(heldout), block_index])
        x = rng.normal(size=(n, self.spec.num_features)).astype(np.float32)
        y = (x @ self.true_weights() + 0.01 * rng.normal(size=n)).astype(np.float32)
        return DataBlock(self.name, block_index, start, n, {{"x": x, "y": y}})

    def data_nbytes(self):
        return self.spec.num_samples * (self.spec.num_features + 1) * 4

    def init_value(self, keys):
        return np.zeros((len(keys), 1), dtype=np.float32)

    def keys_for_batch(self, batch):
        return self.model_keys()

    def compute(self, batch, params, ctx):
        if FAIL_IN_COMPUTE:
            raise ZeroDivisionError("linreg: a bug in the user's compute")
        x = batch.block.data["x"][batch.start:batch.stop]
        y = batch.block.data["y"][batch.start:batch.stop]
        w = params.values[:, 0]
        grad = x.T @ (x @ w - y) / max(batch.size, 1)
        step = -self.hparams.learning_rate * grad / ctx.num_workers
        return KeyValues(params.keys, step.astype(np.float32)[:, None])

    def objective_keys(self, block):
        return self.model_keys()

    def objective(self, block, params):
        r = block.data["x"] @ params.values[:, 0] - block.data["y"]
        return ObjectivePart(float(np.sum(r * r)), block.num_rows)

    def evaluate(self, model, heldout):
        sq = sum(float(np.sum((b.data["x"] @ model[:, 0] - b.data["y"]) ** 2)) for b in heldout)
        n = sum(b.num_rows for b in heldout)
        return {{"rmse": float(np.sqrt(sq / max(n, 1)))}}
'''


def linreg_source(fail_in_compute: bool = False) -> str:
    return LINREG_SOURCE.format(fail=fail_in_compute)
