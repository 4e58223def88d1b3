"""Single-process baseline: train an app on all of its data in one process with the same
mini-batch math the PS workers run (pull -> compute -> push against an in-memory model).

This is the benchmark baseline ("single-process numpy of the same algorithm on the same data")
and the reference the distributed run is checked against.

    python -m psruntime.apps.single_process --app mlr --preset tiny --epochs 5

prints one line per epoch and, last, one JSON object with the whole result.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence, TextIO

import numpy as np
import orjson

from psruntime.blas_threads import limit_blas_threads_to_cgroup
from psruntime.apps.base import AppConfigError, KeyValues, ObjectivePart, OutputCheck, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.sorted_unique import strictly_increasing
from protocol.json_types import JsonObject


class DenseModel:
    """The whole model as one (num_keys, key_length) float32 array, with PS pull/push semantics."""

    def __init__(self, app: PSApp) -> None:
        self.values = app.init_value(app.model_keys())

    def pull(self, keys: np.ndarray) -> KeyValues:
        return KeyValues(keys, self.values[keys])   # fancy indexing copies, like a network pull

    def push(self, deltas: KeyValues | None) -> None:
        if deltas is not None and len(deltas):
            if strictly_increasing(deltas.keys):
                # Sorted unique keys (every app's, KeyValues' contract): a plain fancy add, several
                # times faster than np.add.at, so the baseline is as fast as numpy makes it.
                self.values[deltas.keys] += deltas.values
            else:
                np.add.at(self.values, deltas.keys, deltas.values)


@dataclass
class EpochReport:
    """One epoch: its objective after training and its training time (objective excluded)."""

    epoch: int
    objective: float
    seconds: float


@dataclass
class TrainResult:
    """Outcome of a single-process run."""

    app: str
    initial_objective: float
    epochs: list[EpochReport] = field(default_factory=list)
    converged: bool = False
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return asdict(self)


def epoch_objective(app: PSApp, blocks: Sequence[DataBlock], model: DenseModel) -> float:
    """The objective as the PS computes it: worker parts per block, server part over all keys."""
    part = ObjectivePart()
    for block in blocks:
        part = part + app.objective(block, model.pull(app.objective_keys(block)))
    return app.combine([part], [app.server_objective(model.pull(app.model_keys()))])


def train_single_process(app: PSApp, max_epochs: int | None = None, evaluate: bool = True,
                         log: TextIO | None = None, threads: int = 1) -> tuple[TrainResult, DenseModel]:
    """Train on all blocks (partition 0 of 1) until converged or `max_epochs` (default: the
    app's own limit), each COMP over `threads` threads. Returns the result and the final model.
    What the app returns is checked as the PS workers check it (`OutputCheck`: AppOutputError)."""
    blocks = app.generate_partition(0, 1).blocks
    model = DenseModel(app)
    check = OutputCheck(app)
    for block in blocks:
        model.push(check.deltas(app.init_block(block), None, "init_block"))
    history = [epoch_objective(app, blocks, model)]
    result = TrainResult(app.name, history[0])
    limit = max_epochs if max_epochs is not None else int(app.hparams.max_epochs)
    for epoch in range(limit):
        t0 = time.perf_counter()
        ctx = StepContext(epoch=epoch, num_workers=1, threads=threads)
        for block in blocks:
            for batch in app.batches(block):
                keys = check.batch_keys(app.keys_for_batch(batch))
                model.push(check.deltas(app.compute(batch, model.pull(keys), ctx), keys))
        seconds = time.perf_counter() - t0
        history.append(epoch_objective(app, blocks, model))
        result.epochs.append(EpochReport(epoch, history[-1], seconds))
        if log is not None:
            print(f"epoch {epoch} objective {history[-1]:.6g} time {seconds:.3f}s", file=log, flush=True)
        # history[0] is the untrained objective: convergence compares trained epochs only
        if app.is_converged(history[1:]):
            result.converged = True
            break
    if evaluate:
        result.metrics = app.evaluate(model.values, app.generate_heldout())
    return result, model


def main(argv: Sequence[str] | None = None) -> int:
    from psruntime.apps.registry import APP_NAMES, create_app

    p = argparse.ArgumentParser(prog="python -m psruntime.apps.single_process",
                                description="Train a PS app in one process (baseline).")
    p.add_argument("--app", required=True, choices=APP_NAMES)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--spec", default="{}", help="JSON object overriding data spec fields")
    p.add_argument("--hparams", default="{}", help="JSON object of hyper-parameters")
    p.add_argument("--epochs", type=int, default=None, help="epoch limit (default: the app's max_epochs)")
    args = p.parse_args(argv)
    try:
        app = create_app(args.app, orjson.loads(args.spec), orjson.loads(args.hparams), preset=args.preset)
    except (AppConfigError, orjson.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # As an executor does (psruntime.executor): BLAS threads no more than the CPU quota of its
    # cgroup allows, so a process under a cap spends none of it on idle BLAS threads spinning.
    limit_blas_threads_to_cgroup()
    result, _ = train_single_process(app, max_epochs=args.epochs, log=sys.stderr)
    print(orjson.dumps({**result.to_json(), "describe": app.describe()}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
