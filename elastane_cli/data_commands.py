"""`elastane data`: write dataset directories (docs/dataset_format.md) for PS jobs' `data.path`.

    elastane data generate --app mlr --preset tiny --set num_samples=4000 --out /data/mlr
    elastane data import-libsvm --app mlr --input train.svm --heldout-fraction 0.1 --out /data/a9a
    elastane data import-triplets --input ratings.csv --heldout ratings-test.csv --out /data/ml
    elastane data import-docword --input docword.kos.txt --heldout-fraction 0.05 --out /data/kos
    elastane data check /data/mlr

Bad input files exit 2 with `file:line: problem`.
"""
from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from protocol.dataset_manifest import MANIFEST_NAME, DatasetError, DatasetManifest, load_manifest
from protocol.ps_app_schemas import APP_SCHEMAS, PRESET_NAMES

from .arg_types import positive_int
from .context import CliContext
from .errors import EXIT_OK, OperationFailed, UsageError
from .ps_commands import parse_assignment


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    data = sub.add_parser("data", help="write and check dataset directories for PS jobs (data.path)")
    acts = data.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = acts.add_parser("generate", help="write an app's generated (synthetic) data as a dataset",
                        description="Write exactly the blocks a job with the same app, preset and data "
                                    "fields would generate, so it can be rerun from files.")
    p.add_argument("--app", required=True, choices=sorted(APP_SCHEMAS))
    p.add_argument("--preset", choices=PRESET_NAMES, default="tiny", help="data size preset (default tiny)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                   help="a data-spec field, e.g. num_samples=4000 (repeatable)")
    _out(p)
    p.set_defaults(func=cmd_generate)

    p = acts.add_parser("import-libsvm", help="import libsvm/svmlight rows for mlr or lasso")
    p.add_argument("--app", required=True, choices=("mlr", "lasso"))
    p.add_argument("--num-features", type=positive_int("--num-features"), help="feature count (default: largest index + 1)")
    p.add_argument("--num-classes", type=positive_int("--num-classes"), help="mlr classes (default: largest label + 1)")
    _import_options(p, index_base=1)
    p.set_defaults(func=cmd_import_libsvm)

    p = acts.add_parser("import-triplets", help="import `user item value` triplets (csv/tsv/space) for nmf")
    p.add_argument("--num-items", type=positive_int("--num-items"), help="item count (default: largest item id + 1)")
    _import_options(p, index_base=0)
    p.set_defaults(func=cmd_import_triplets)

    p = acts.add_parser("import-docword", help="import a UCI bag-of-words docword file for lda")
    _import_options(p, index_base=1)
    p.set_defaults(func=cmd_import_docword)

    p = acts.add_parser("check", help="check a dataset directory: manifest and every block file")
    p.add_argument("path", help="the dataset directory")
    p.set_defaults(func=cmd_check)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1 (exclusive)")
    return value


def _out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="the dataset directory to create (must be new)")


def _import_options(p: argparse.ArgumentParser, index_base: int) -> None:
    p.add_argument("--input", required=True, metavar="FILE", help="the training rows")
    held = p.add_mutually_exclusive_group(required=True)
    held.add_argument("--heldout-fraction", type=_fraction, metavar="F", help="hold out this fraction of the rows")
    held.add_argument("--heldout", metavar="FILE", help="held-out rows, in the same format")
    p.add_argument("--rows-per-block", type=positive_int("--rows-per-block"), default=1000, help="rows per block file (default 1000)")
    p.add_argument("--index-base", type=int, choices=(0, 1), default=index_base,
                   help=f"the first feature/item/word id in the file (default {index_base})")
    _out(p)


def _prepare_out(out: str) -> str:
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):    # bad input, not a failed write
        raise UsageError(f"--out {out}: is a file, not a directory; choose a new directory")
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):
        raise UsageError(f"--out {out}: already holds a dataset ({MANIFEST_NAME}); choose a new directory")
    if os.path.isdir(path) and os.listdir(path):
        raise UsageError(f"--out {out}: the directory is not empty")
    return path


def _report(ctx: CliContext, path: str, m: DatasetManifest) -> int:
    dims = ", ".join(f"{k}={v}" for k, v in m.spec.items())
    ctx.out.write(f"wrote {m.app} dataset {path}: {len(m.train)} training and {len(m.heldout)} held-out "
                  f"block files ({dims})\nuse it with: --set data.path={path}\n")
    return EXIT_OK


def cmd_generate(args: argparse.Namespace, ctx: CliContext) -> int:
    from psruntime.apps.base import AppConfigError
    from psruntime.apps.dataset_files import write_generated
    from psruntime.apps.registry import create_app

    fields: dict[str, Any] = {}
    for text in args.sets:
        path, value = parse_assignment(text, "--set")
        fields[".".join(path)] = value
    if "path" in fields:
        raise UsageError("--set path: generate writes generated data; path is where it goes (--out)")
    try:
        app = create_app(args.app, fields, {}, preset=args.preset)
    except AppConfigError as e:
        raise UsageError(str(e)) from None
    out = _prepare_out(args.out)
    try:
        return _report(ctx, out, write_generated(app, out))
    except OSError as e:
        raise OperationFailed(f"cannot write {out}: {e}") from None


def _run_import(ctx: CliContext, args: argparse.Namespace, run: Any) -> int:
    from psruntime.apps.text_importers import ImportOptions, TextFormatError

    opts = ImportOptions(rows_per_block=args.rows_per_block, heldout_fraction=args.heldout_fraction,
                         heldout_file=args.heldout, index_base=args.index_base)
    out = _prepare_out(args.out)
    existed = os.path.isdir(out)
    try:
        return _report(ctx, out, run(out, opts))
    except (TextFormatError, OSError) as e:
        # Leave nothing half written: the directory was new or empty.
        shutil.rmtree(out, ignore_errors=True) if not existed else _empty(out)
        if isinstance(e, TextFormatError):
            raise UsageError(str(e)) from None
        raise OperationFailed(f"cannot write {out}: {e}") from None


def _empty(path: str) -> None:
    for name in os.listdir(path):
        full = os.path.join(path, name)
        shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.unlink(full)


def cmd_import_libsvm(args: argparse.Namespace, ctx: CliContext) -> int:
    from psruntime.apps.text_importers import import_libsvm

    if args.num_classes is not None and args.app != "mlr":
        raise UsageError("--num-classes is for --app mlr")
    return _run_import(ctx, args, lambda out, opts: import_libsvm(args.app, args.input, out, opts,
                                                                 args.num_features, args.num_classes))


def cmd_import_triplets(args: argparse.Namespace, ctx: CliContext) -> int:
    from psruntime.apps.text_importers import import_triplets

    return _run_import(ctx, args, lambda out, opts: import_triplets(args.input, out, opts, args.num_items))


def cmd_import_docword(args: argparse.Namespace, ctx: CliContext) -> int:
    from psruntime.apps.text_importers import import_docword

    return _run_import(ctx, args, lambda out, opts: import_docword(args.input, out, opts))


def cmd_check(args: argparse.Namespace, ctx: CliContext) -> int:
    from psruntime.apps.base import AppConfigError
    from psruntime.apps.dataset_files import DatasetFileError
    from psruntime.apps.registry import create_app

    path = os.path.abspath(args.path)
    try:
        m = load_manifest(path)
        app = create_app(m.app, {"path": path})
        for b in range(len(m.train)):
            app.input_block(b)
        for b in range(len(m.heldout)):
            app.input_block(b, heldout=True)
    except DatasetError as e:
        raise UsageError(f"{path}: {e.detail}") from None
    except (AppConfigError, DatasetFileError) as e:
        raise UsageError(str(e)) from None
    ctx.out.write(f"ok: {m.app} dataset {path}, {len(m.train)} training and {len(m.heldout)} held-out blocks, "
                  + ", ".join(f"{k}={v}" for k, v in m.spec.items()) + "\n")
    return EXIT_OK
