"""The on-disk dataset format of PS jobs: `dataset.json` and how it fixes an app's data spec.

A dataset directory (docs/dataset_format.md) holds `dataset.json` plus one `.npz` file per
training and per held-out block. This module is the format's definition that the RM needs at
submission (it cannot import the runtime): the manifest Struct, the arrays every app's blocks
hold (names, dtypes, which are per entry / per row), and `resolve_data_spec`, which turns a job's
`data` object with a `path` into the app's data spec with the dimensions the files define
(`recorded_data_spec`: what a saved model keeps of it, to rebuild the app from).
Reading and writing the block files is `psruntime.apps.dataset_files`.
"""
from __future__ import annotations

import math
import os
from typing import Annotated, Mapping

import msgspec
from protocol import durable_storage
from protocol.errors import AppError
from protocol.json_types import JsonObject, JsonValue, json_int

FORMAT_NAME = "elastane-dataset"
FORMAT_VERSION = 1
MANIFEST_NAME = "dataset.json"

NonNeg = Annotated[int, msgspec.Meta(ge=0)]
Pos = Annotated[int, msgspec.Meta(ge=1)]

# Arrays of one block's `data`, exactly what the app's generator makes: name -> little-endian dtype.
# "indptr" (rows + 1, int64, starting at 0) delimits each row's entries in the per-entry arrays.
BLOCK_ARRAYS: dict[str, dict[str, str]] = {
    "mlr": {"indptr": "<i8", "features": "<i4", "values": "<f4", "labels": "<i4"},
    "lasso": {"indptr": "<i8", "features": "<i4", "values": "<f4", "targets": "<f4"},
    "nmf": {"indptr": "<i8", "items": "<i4", "ratings": "<f4"},
    "lda": {"indptr": "<i8", "words": "<i4"},
}
ENTRY_ARRAYS: dict[str, tuple[str, ...]] = {"mlr": ("features", "values"), "lasso": ("features", "values"),
                                            "nmf": ("items", "ratings"), "lda": ("words",)}
ROW_ARRAYS: dict[str, tuple[str, ...]] = {"mlr": ("labels",), "lasso": ("targets",), "nmf": (), "lda": ()}
# Per-entry index arrays and the data-spec field bounding them (values in [0, bound)).
INDEX_BOUNDS: dict[str, dict[str, str]] = {"mlr": {"features": "num_features", "labels": "num_classes"},
                                           "lasso": {"features": "num_features"},
                                           "nmf": {"items": "num_items"}, "lda": {"words": "vocab_size"}}

# The data-spec fields a dataset defines (its dimensions and sizes; the last one of each app is the
# mean entries per row, which memory accounting uses), and the training-rows field.
DIMENSION_FIELDS: dict[str, tuple[str, ...]] = {
    "mlr": ("num_samples", "num_features", "num_classes", "num_heldout", "rows_per_block", "nnz_per_sample"),
    "lasso": ("num_samples", "num_features", "num_heldout", "rows_per_block", "nnz_per_sample"),
    "nmf": ("num_users", "num_items", "num_heldout", "rows_per_block", "observed_fraction"),
    "lda": ("num_docs", "vocab_size", "num_heldout", "rows_per_block", "doc_length"),
}
ROWS_FIELD: dict[str, str] = {"mlr": "num_samples", "lasso": "num_samples", "nmf": "num_users", "lda": "num_docs"}
# Fields only the generators use: meaningless (and refused) beside a path. (`seed` is not one:
# it also seeds the model's and the worker state's initial values and LDA's sampling.)
GENERATOR_FIELDS: dict[str, tuple[str, ...]] = {
    "mlr": ("logit_scale",), "lasso": ("support_size", "noise_std"),
    "nmf": ("rank", "noise_std"), "lda": ("num_topics", "alpha_true", "beta_true"),
}


class DatasetError(AppError, ValueError):
    """A dataset directory or manifest that is missing or invalid; `field` is the data-spec field
    at fault ("path" for the files themselves) and the message says what is wrong."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field
        self.detail = detail


class BlockEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One block file: its path relative to the dataset directory, rows, entries and checksum."""

    file: str
    rows: Pos
    entries: NonNeg
    sha256: str


class DatasetManifest(msgspec.Struct, forbid_unknown_fields=True):
    """`dataset.json`: what the directory holds. `spec` has the app's DIMENSION_FIELDS."""

    format: str
    version: int
    app: str
    spec: JsonObject
    train: list[BlockEntry]
    heldout: list[BlockEntry]
    source: JsonObject = {}            # provenance (generator spec or imported files); informative

    @property
    def rows_field(self) -> str:
        return ROWS_FIELD[self.app]


def block_layout(rows: int, rows_per_block: int) -> list[int]:
    """Rows of each block of `rows` rows in blocks of `rows_per_block` (the last may be short):
    the same layout as the generators (psruntime.apps.random_streams.block_row_range)."""
    full, rest = divmod(rows, rows_per_block)
    return [rows_per_block] * full + ([rest] if rest else [])


def check_manifest(m: DatasetManifest, where: str) -> DatasetManifest:
    """Consistency of a decoded manifest: format, app, dimensions and block layout."""
    if m.format != FORMAT_NAME:
        raise DatasetError("path", f"{where}: format is {m.format!r}, expected {FORMAT_NAME!r}")
    if m.version != FORMAT_VERSION:
        raise DatasetError("path", f"{where}: format version {m.version} is not supported (this is {FORMAT_VERSION})")
    if m.app not in DIMENSION_FIELDS:
        raise DatasetError("path", f"{where}: unknown app {m.app!r}; one of {sorted(DIMENSION_FIELDS)}")
    fields = DIMENSION_FIELDS[m.app]
    missing = [f for f in fields if f not in m.spec]
    extra = sorted(set(m.spec) - set(fields))
    if missing or extra:
        raise DatasetError("path", f"{where}: spec must have exactly {list(fields)}"
                           + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else ""))
    for name in fields:
        value = m.spec[name]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0)
        if name not in ("observed_fraction",) and not isinstance(value, int):
            ok = False
        if not ok:
            raise DatasetError("path", f"{where}: spec.{name} must be a positive "
                               f"{'number' if name == 'observed_fraction' else 'integer'}, got {value!r}")
    rpb = json_int(m.spec["rows_per_block"])
    for part, rows in (("train", json_int(m.spec[m.rows_field])), ("heldout", json_int(m.spec["num_heldout"]))):
        layout = block_layout(rows, rpb)
        entries: list[BlockEntry] = getattr(m, part)
        if [e.rows for e in entries] != layout:
            raise DatasetError("path", f"{where}: {part} lists blocks of {[e.rows for e in entries][:8]} rows, "
                               f"but {rows} rows in blocks of {rpb} need {len(layout)} blocks of {layout[:8]}")
        for e in entries:
            if os.path.isabs(e.file) or ".." in e.file.replace("\\", "/").split("/"):
                raise DatasetError("path", f"{where}: block file {e.file!r} must be a path inside the dataset directory")
    return m


def load_manifest(path: str, field: str = "path") -> DatasetManifest:
    """Read and check `<path>/dataset.json`; DatasetError (field `field`) says what is wrong."""
    if not isinstance(path, str) or not path:
        raise DatasetError(field, f"must be a non-empty string, got {path!r}")
    local = durable_storage.local_path(path)
    if local is None:   # an object store (s3://bucket/dataset): every node reads it there
        try:
            durable_storage.check_reachable(path)
        except durable_storage.DurableStorageError as e:
            raise DatasetError(field, str(e)) from None
        where = durable_storage.join(path, MANIFEST_NAME)
        try:
            raw = durable_storage.read_url(where)
        except Exception as e:  # noqa: BLE001 - an object store's client raises its own errors
            raise DatasetError(field, f"cannot read {where}: {durable_storage.describe_error(e)}") from None
    else:
        if not os.path.isabs(local):
            raise DatasetError(field, f"{path!r} must be an absolute path (it is read on every node)")
        if not os.path.isdir(local):
            raise DatasetError(field, f"{path!r} is not a directory (it must be readable on every node)")
        where = os.path.join(local, MANIFEST_NAME)
        try:
            with open(where, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise DatasetError(field, f"cannot read {where}: {e.strerror or e}") from None
    try:
        m = msgspec.json.decode(raw, type=DatasetManifest, strict=True)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DatasetError(field, f"{where} is not a valid dataset manifest: {e}") from None
    return check_manifest(m, where)


def resolve_data_spec(app: str, data: Mapping[str, JsonValue], base: Mapping[str, JsonValue]) -> JsonObject:
    """The app's data spec for a job's `data` object (`base`: the preset's fields under it).

    Without `data["path"]`: {**base, **data}, unchanged. With it: `data` plus the manifest's
    dimensions, and the preset plays no part (its sizes are the files', and what else it sets,
    such as NMF's generating rank, only the generators use); a dimension given in `data` must
    equal the file's, and generator-only fields are refused. The result resolves to itself, so
    the AM and executors re-check it. DatasetError's `field` names the data field at fault.
    """
    path = data.get("path")
    if path is None:
        return {**base, **data}
    if not isinstance(path, str):
        raise DatasetError("path", f"must be a string (a dataset directory), got {path!r}")
    m = load_manifest(path)
    if m.app != app:
        raise DatasetError("path", f"{path} holds {m.app} data (dataset.json app), not {app}")
    for name, value in data.items():
        if name in m.spec and value != m.spec[name]:
            raise DatasetError(name, f"{value!r} contradicts the dataset's {m.spec[name]!r} "
                               f"({data['path']}/{MANIFEST_NAME}); omit it or give the same value")
        if name in GENERATOR_FIELDS.get(app, ()):
            raise DatasetError(name, "is only used to generate synthetic data; remove it when data.path is given")
    return {**data, **m.spec}


def recorded_data_spec(app: str, spec: Mapping[str, JsonValue]) -> JsonObject:
    """The data spec to record for a job of `app` (a built-in's name) whose app was built from
    `spec` (its Struct as builtins), and to rebuild that app from: with a `path`, the spec less
    the generator-only fields, which its Struct holds at their defaults but resolve_data_spec
    refuses beside a path; otherwise (and for an app not built in) `spec` unchanged."""
    if spec.get("path") is None:
        return dict(spec)
    drop = GENERATOR_FIELDS.get(app, ())
    return {name: value for name, value in spec.items() if name not in drop}


__all__ = ["BLOCK_ARRAYS", "BlockEntry", "DIMENSION_FIELDS", "DatasetError", "DatasetManifest", "ENTRY_ARRAYS",
           "FORMAT_NAME", "FORMAT_VERSION", "INDEX_BOUNDS", "MANIFEST_NAME", "ROWS_FIELD", "ROW_ARRAYS",
           "block_layout", "check_manifest", "load_manifest", "recorded_data_spec", "resolve_data_spec"]
