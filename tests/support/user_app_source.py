"""The source of tiny user apps (least-squares linear regression) written only against
elastane.app_api, numpy and msgspec, as a user would: tests write them to a file of their own and
ship it with `--py-files`. `FAIL_IN_COMPUTE` makes compute raise (a user's bug); the file app
reads its rows from a data file shipped with the job."""
from __future__ import annotations

import os

LINREG_SOURCE = '''
"""A user's linear regression: y = x . w + noise, squared loss, SGD."""
from functools import cached_property
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


# A user's app that trains on a data file shipped with the job (`--files linreg.npz`, or a YARN
# local resource), opened by its relative name in the working dir, as a user writes it: arrays
# x_train, y_train, x_heldout, y_heldout. Its DATA_PATH_FIELD lets `--data` point it at another
# file. Appended to LINREG_SOURCE: it subclasses LinRegApp, whose math it keeps.
FILE_LINREG_SOURCE = '''

class FileSpec(msgspec.Struct, forbid_unknown_fields=True):
    data_file: str = "linreg.npz"
    rows_per_block: Annotated[int, msgspec.Meta(ge=1)] = 100
    seed: Annotated[int, msgspec.Meta(ge=0)] = 0


class FileHParams(LinRegHParams, forbid_unknown_fields=True):
    max_epochs: Annotated[int, msgspec.Meta(ge=1)] = {max_epochs}


class FileLinRegApp(LinRegApp):
    """The same regression on the rows of a data file, opened by its name in the working dir."""
    name = "filelinreg"
    Spec = FileSpec
    HParams = FileHParams
    HELDOUT_METRIC = "rmse"
    DATA_PATH_FIELD = "data_file"

    @cached_property
    def arrays(self):
        with np.load(self.spec.data_file, allow_pickle=False) as z:
            return {{k: np.asarray(z[k], np.float32) for k in ("x_train", "y_train", "x_heldout", "y_heldout")}}

    @property
    def num_rows(self):
        return len(self.arrays["y_train"])

    @property
    def num_heldout_rows(self):
        return len(self.arrays["y_heldout"])

    @property
    def num_keys(self):
        return self.arrays["x_train"].shape[1]

    def generate_block(self, block_index, heldout=False):
        part = "heldout" if heldout else "train"
        x, y = self.arrays["x_" + part], self.arrays["y_" + part]
        start = block_index * self.rows_per_block
        stop = min(start + self.rows_per_block, len(y))
        return DataBlock(self.name, block_index, start, stop - start, {{"x": x[start:stop], "y": y[start:stop]}})

    def data_nbytes(self):
        return self.num_rows * (self.num_keys + 1) * 4

    def predict(self, block, params):
        return block.data["x"] @ params.values[:, 0]
'''


def file_linreg_source(max_epochs: int = 5) -> str:
    """A module with LinRegApp and FileLinRegApp, its subclass on a data file ("module:FileLinRegApp")."""
    return linreg_source() + FILE_LINREG_SOURCE.format(max_epochs=max_epochs)


def write_linreg_data(path: "os.PathLike[str] | str", rows: int = 600, heldout: int = 200, features: int = 6,
                      seed: int = 0, noise: float = 0.01) -> None:
    """The data file FILE_LINREG_SOURCE's app reads: y = x . w + noise, w fixed by `seed`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = rng.normal(size=features)
    x = rng.normal(size=(rows + heldout, features)).astype(np.float32)
    y = (x @ w + noise * rng.normal(size=rows + heldout)).astype(np.float32)
    np.savez(path, x_train=x[:rows], y_train=y[:rows], x_heldout=x[rows:], y_heldout=y[rows:])
