"""`elastane model show | evaluate | predict OUTPUT [--data PATH]`: a PS job's model output read back
(docs/model_output.md) -- no cluster needed, only the output's location.

OUTPUT is a job's `output` URL (its final model) or one of its `epoch-N` directories. `--data` is
other data whose held-out rows are scored / predicted: a built-in app's dataset directory
(docs/dataset_format.md), or the file or directory a user app's reader opens (its class's
DATA_PATH_FIELD, docs/app_api.md); without it, the job's own held-out data (regenerated or re-read
from the data spec in the metadata, with the job's shipped files the model carries). Whatever
cannot be read exits 2 naming it: `OUTPUT`, `--data` or the job's own data.
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from .context import CliContext
from .errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from elastane.model_output import SavedModel


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    model = sub.add_parser("model", help="show, evaluate or predict with a PS job's saved model (its output)")
    acts = model.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = acts.add_parser("show", help="print the model's metadata (app, hyper-parameters, data, metrics)")
    _output(p)
    p.add_argument("--json", action="store_true", help="the whole metadata as JSON")
    p.set_defaults(func=cmd_show)

    p = acts.add_parser("evaluate", help="the app's held-out metrics of the model")
    _output(p)
    _data(p)
    p.add_argument("--json", action="store_true", help="the metrics as a JSON object")
    p.set_defaults(func=cmd_evaluate)

    p = acts.add_parser("predict", help="the model's predictions, one line per row (or entry)")
    _output(p)
    _data(p)
    p.add_argument("--out", metavar="FILE.npy", help="write the predictions as a .npy array instead")
    p.set_defaults(func=cmd_predict)


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("output", metavar="OUTPUT", help="the job's output URL or one of its epoch-N directories")


def _data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="PATH", help="a built-in app's dataset directory, or the data path a user "
                                                  "app reads (default: the job's own held-out data)")


def _input_error(args: argparse.Namespace, e: Exception) -> UsageError:
    """Exit 2 naming the input that could not be read: --data when given, else the job's own data
    (the error names it)."""
    return UsageError(f"--data: {e}" if args.data else str(e))


def _load(args: argparse.Namespace) -> "SavedModel":
    from elastane.model_output import ModelOutputError, load_model   # numpy and the apps: only here

    try:
        return load_model(args.output)
    except ModelOutputError as e:
        raise UsageError(f"OUTPUT: {e}") from None


def _describe(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.6g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in metrics.items())


def _files(model: "SavedModel") -> str:
    """The job's shipped files the model keeps: copied into it, or referenced at their URL."""
    return ", ".join(f"{f.name} (copied, {f.size} bytes)" if f.copied else
                     f"{f.name} ({f.type.lower()} at {f.resource}, {f.size} bytes)" for f in model.metadata.files)


def cmd_show(args: argparse.Namespace, ctx: CliContext) -> int:
    model = _load(args)
    d = model.describe()
    if args.json:
        print(json.dumps(d, indent=2), file=ctx.out)
        return EXIT_OK
    m = model.metadata
    app = m.app
    lines = [
        f"model:      {model.url} ({m.kind}, after {m.epoch} epochs)",
        f"app:        {app.name} ({app.cls}{', version ' + app.version if app.version else ''})",
        f"shape:      {m.num_keys} keys x {m.key_length} (float32)",
        f"objective:  {m.objective} (initial {m.initial_objective}; {'higher' if m.maximize else 'lower'} is better)",
        f"held-out:   {_describe(m.heldout_metrics) or '-'}",
        f"hparams:    {json.dumps(m.hparams, sort_keys=True)}",
        f"data:       {json.dumps(m.data, sort_keys=True)}",
        f"preset:     {m.preset}",
        f"reshapes:   {len(m.shape_history)}",
        f"files:      {_files(model) or '-'}",
        f"written by: elastane {m.elastane_version} ({m.attempt_id or 'unknown attempt'})",
    ]
    print("\n".join(lines), file=ctx.out)
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace, ctx: CliContext) -> int:
    from elastane.model_output import ModelOutputError

    model = _load(args)
    try:
        metrics = model.evaluate(args.data)
    except ModelOutputError as e:
        raise _input_error(args, e) from None
    if args.json:
        print(json.dumps(metrics), file=ctx.out)
    else:
        for k, v in metrics.items():
            print(f"{k}\t{v:.6g}", file=ctx.out)
    return EXIT_OK


def cmd_predict(args: argparse.Namespace, ctx: CliContext) -> int:
    import numpy as np

    from elastane.model_output import ModelOutputError

    model = _load(args)
    try:
        pred = model.predict(args.data)
    except ModelOutputError as e:
        raise _input_error(args, e) from None
    except NotImplementedError as e:
        raise UsageError(str(e)) from None
    if args.out:
        try:
            np.save(args.out, pred)
        except OSError as e:
            raise UsageError(f"--out: {e}") from None
        print(f"{len(pred)} predictions of shape {pred.shape[1:] or 'scalar'} written to {args.out}", file=ctx.out)
        return EXIT_OK
    for row in pred.reshape(len(pred), -1):
        ctx.out.write("\t".join(f"{v:.6g}" for v in row) + "\n")
    return EXIT_OK
