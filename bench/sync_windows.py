"""What sync windows do to an app's convergence: W workers in lockstep against the sequential loop.

    .venv/bin/python bench/sync_windows.py [--quick] [--apps mlr,nmf,lasso] [--workers 2,4,8]
                                           [--sync-batches 1,32] [--merge sum,avg] [--epochs 6]
                                           [--preset small] [--seed 0]

The question bench/scaling.py's objective check asks (a PS job's objective within 1 % of the
single process's), asked without the testbed, its timing or its noise: how far does a job's
objective move from the sequential loop's (psruntime.apps.single_process, the baseline of the same
run) when W workers train in sync windows of k mini-batches (docs/internals.md, "Sync windows")?
It is how bench/scaling.py's k = 32 was chosen (on another data seed than the one it measures).

Per app, each (W, k, merge) runs in this one process, in lockstep:
- worker w trains the blocks a PS worker w of W gets (`PSApp.generate_partition`), cut into the
  windows a worker cuts (`psruntime.training_pipeline.step_windows`);
- every worker's window i starts from the same model (the one after every worker's window i - 1)
  and reads its own writes inside the window, as the worker's write-back cache gives it;
- at the window's end the workers' window sums are merged into the model: `sum` (the default) is
  what the servers do (each push is added); `--merge avg` also divides the merged sum by W (model
  averaging) -- an alternative studied for NMF, not the system's rule. Lasso's pushes are already
  averages (psruntime/apps/lasso.py divides inside the app), so `avg` divides its twice.
Lockstep is the BSP schedule with equal worker speeds: on the testbed a worker's pull may also see
some of the other workers' pushes of the same window, as their timing falls, so the figures are a
property of the windows and the merge, not of one run's timing.

Per run: the objective after every epoch, `final_rel_diff` (the last epoch's against the
sequential loop's) and `max_rel_diff` (over the epochs). Last line, JSON: {"<app>": {"sequential":
[objectives], "runs": [{"workers", "sync_batches", "merge", "objectives", "final_rel_diff",
"max_rel_diff"}]}, ...}. `--quick`: the tiny presets, 2 epochs, W 1 and 2, k 1 and 4 (checks that it
runs; at W 1 the lockstep is the sequential loop, which its test checks).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psruntime.apps.base import KeyValues, PSApp, StepContext  # noqa: E402
from psruntime.apps.registry import APP_NAMES, create_app  # noqa: E402
from psruntime.apps.single_process import DenseModel, epoch_objective, train_single_process  # noqa: E402
from psruntime.training_pipeline import step_windows  # noqa: E402

MERGES = ("sum", "avg")


def make_app(name: str, ns: argparse.Namespace) -> PSApp[Any, Any]:
    """The app at the run's preset and data seed, never stopping early."""
    return create_app(name, {"seed": ns.seed}, {"convergence_threshold": 1e-12}, preset=ns.preset)


def sequential(name: str, ns: argparse.Namespace) -> list[float]:
    """The single process's objectives: the initial one, then one per epoch."""
    result, _ = train_single_process(make_app(name, ns), max_epochs=ns.epochs, evaluate=False)
    return [result.initial_objective, *(e.objective for e in result.epochs)]


def lockstep(name: str, ns: argparse.Namespace, workers: int, k: int, merge: str) -> list[float]:
    """The objectives of `workers` workers training in windows of `k`, in lockstep (module doc)."""
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    app = make_app(name, ns)
    model = DenseModel(app)
    parts = [app.generate_partition(w, workers).blocks for w in range(workers)]
    every = [b for p in parts for b in p]
    for block in every:
        model.push(app.init_block(block))
    history = [epoch_objective(app, every, model)]
    for epoch in range(ns.epochs):
        ctx = StepContext(epoch=epoch, num_workers=workers)
        windows = [list(step_windows(app, blocks, epoch, k)) for blocks in parts]
        for i in range(max(len(w) for w in windows)):
            base = model.values.copy()
            total = np.zeros_like(base)
            for mine in windows:
                if i >= len(mine):
                    continue                        # this worker's share of the epoch is done
                cache = base.copy()                 # the window's reads see its own writes
                for batch in mine[i]:
                    keys = app.keys_for_batch(batch)
                    deltas = app.compute(batch, KeyValues(keys, cache[keys]), ctx)
                    if deltas is not None and len(deltas):
                        np.add.at(cache, deltas.keys, deltas.values)
                total += cache - base
            model.values = base + (total / workers if merge == "avg" else total)
        history.append(epoch_objective(app, every, model))
    return history


def rel_diff(value: float, reference: float) -> Optional[float]:
    if not (np.isfinite(value) and np.isfinite(reference)) or reference == 0:
        return None
    return round(abs(value - reference) / abs(reference), 5)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--apps", default="mlr,nmf,lasso")
    p.add_argument("--workers", default="2,4,8")
    p.add_argument("--sync-batches", default="1,32")
    p.add_argument("--merge", default="sum", help="sum (the servers' rule) and/or avg, comma-separated")
    p.add_argument("--epochs", type=int, default=None, help="default 6 (--quick: 2)")
    p.add_argument("--preset", default=None, help="the apps' data preset (default small; --quick: tiny)")
    p.add_argument("--seed", type=int, default=0, help="the data seed")
    p.add_argument("--quick", action="store_true", help="tiny presets, 2 epochs, 1 and 2 workers, k 1 and 4")
    ns = p.parse_args(argv)

    def ints(text: str, what: str) -> list[int]:
        try:
            xs = [int(x) for x in text.split(",") if x]
        except ValueError:
            p.error(f"{what} must be comma-separated integers, got {text!r}")
        if not xs or min(xs) < 1:
            p.error(f"{what} must be integers >= 1, got {text!r}")
        return xs

    ns.apps = [a for a in ns.apps.split(",") if a]
    for a in ns.apps:
        if a not in APP_NAMES:
            p.error(f"unknown app {a!r} (one of {', '.join(APP_NAMES)})")
    ns.merges = [m for m in ns.merge.split(",") if m]
    for m in ns.merges:
        if m not in MERGES:
            p.error(f"--merge takes {', '.join(MERGES)}, got {m!r}")
    if ns.quick:
        ns.workers, ns.sync_batches = "1,2", "1,4"
        ns.epochs = ns.epochs or 2
        ns.preset = ns.preset or "tiny"
    ns.worker_counts = ints(ns.workers, "--workers")
    ns.windows = ints(ns.sync_batches, "--sync-batches")
    ns.epochs = ns.epochs or 6
    ns.preset = ns.preset or "small"
    if ns.epochs < 1:
        p.error("--epochs must be >= 1")
    return ns


def main(argv: Optional[Sequence[str]] = None) -> int:
    ns = parse_args(argv)
    out: dict[str, Any] = {}
    for name in ns.apps:
        base = sequential(name, ns)
        print(f"{name} sequential: {' '.join(f'{x:.5g}' for x in base)}", file=sys.stderr, flush=True)
        runs = []
        for w in ns.worker_counts:
            for k in ns.windows:
                for merge in ns.merges:
                    h = lockstep(name, ns, w, k, merge)
                    diffs = [rel_diff(a, b) for a, b in zip(h[1:], base[1:])]
                    known = [d for d in diffs if d is not None]
                    run = {"workers": w, "sync_batches": k, "merge": merge, "objectives": [float(x) for x in h],
                           "final_rel_diff": diffs[-1], "max_rel_diff": max(known) if known else None}
                    runs.append(run)
                    print(f"{name} W={w} k={k} {merge}: {' '.join(f'{x:.5g}' for x in h)} "
                          f"final {run['final_rel_diff']}", file=sys.stderr, flush=True)
        out[name] = {"sequential": [float(x) for x in base], "runs": runs}
    out.update({"preset": ns.preset, "epochs": ns.epochs, "seed": ns.seed})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
