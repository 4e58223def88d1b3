"""Block files of a dataset directory (docs/dataset_format.md): write them, read and check them.

Each block is one uncompressed `.npz` holding exactly the arrays of the app's `DataBlock.data`
(protocol.dataset_manifest.BLOCK_ARRAYS), loaded with `allow_pickle=False`. `dataset.json` is
written last, through a temporary file and a rename, so a directory whose writing was interrupted
has no manifest and is refused rather than half read.
"""
from __future__ import annotations

import hashlib
import io
import os
import zipfile
from typing import TYPE_CHECKING, Mapping

import msgspec
import numpy as np

from protocol import durable_storage
from protocol.durable_storage import write_atomic
from protocol.dataset_manifest import (BLOCK_ARRAYS, DIMENSION_FIELDS, ENTRY_ARRAYS, FORMAT_NAME, FORMAT_VERSION, INDEX_BOUNDS,
                                       MANIFEST_NAME, ROW_ARRAYS, BlockEntry, DatasetManifest, check_manifest)
from psruntime.apps.blocks import DataBlock
from psruntime.apps.random_streams import num_blocks
from protocol.errors import AppError
from protocol.json_types import JsonValue, json_int

if TYPE_CHECKING:
    from psruntime.apps.base import PSApp

PARTS = ("train", "heldout")


class DatasetFileError(AppError, ValueError):
    """A block file that is missing, damaged or inconsistent with dataset.json; names the file."""


def block_file_name(part: str, index: int) -> str:
    """Path of a block file relative to the dataset directory."""
    return f"{part}/block-{index:06d}.npz"


def check_block_arrays(app: str, arrays: Mapping[str, np.ndarray], rows: int, bounds: Mapping[str, int],
                       where: str) -> int:
    """Check a block's arrays: exactly the app's names and dtypes, CSR shape, indices in range.
    Returns the number of entries; DatasetFileError(`where`: problem) otherwise."""
    want = BLOCK_ARRAYS[app]
    if set(arrays) != set(want):
        raise DatasetFileError(f"{where}: holds arrays {sorted(arrays)}, expected {sorted(want)}")
    for name, dtype in want.items():
        if arrays[name].dtype != np.dtype(dtype) or arrays[name].ndim != 1:
            raise DatasetFileError(f"{where}: array {name!r} is {arrays[name].dtype} {arrays[name].shape}, "
                                   f"expected 1-D {np.dtype(dtype)}")
    ip = arrays["indptr"]
    if len(ip) != rows + 1 or ip[0] != 0 or (rows and np.any(np.diff(ip) < 0)):
        raise DatasetFileError(f"{where}: indptr must be {rows + 1} non-decreasing offsets starting at 0")
    entries = int(ip[-1])
    for name in ENTRY_ARRAYS[app]:
        if len(arrays[name]) != entries:
            raise DatasetFileError(f"{where}: array {name!r} has {len(arrays[name])} entries, indptr says {entries}")
    for name in ROW_ARRAYS[app]:
        if len(arrays[name]) != rows:
            raise DatasetFileError(f"{where}: array {name!r} has {len(arrays[name])} rows, expected {rows}")
    for name, field in INDEX_BOUNDS[app].items():
        a = arrays[name]
        if len(a) and (int(a.min()) < 0 or int(a.max()) >= bounds[field]):
            raise DatasetFileError(f"{where}: array {name!r} has values outside [0, {bounds[field]}) ({field})")
    for name in arrays:
        if arrays[name].dtype.kind == "f" and not np.all(np.isfinite(arrays[name])):
            raise DatasetFileError(f"{where}: array {name!r} has non-finite values")
    return entries


def read_block(directory: str, manifest: DatasetManifest, part: str, index: int,
               bounds: Mapping[str, int]) -> DataBlock:
    """Load block `index` of `part` ("train" / "heldout") as a DataBlock, checking it against the
    manifest (checksum, arrays, rows) and `bounds` (the data spec's dimensions)."""
    entry = getattr(manifest, part)[index]
    where = durable_storage.join(directory, *entry.file.split("/"))   # a path, or a URL (s3://...)
    try:
        raw = durable_storage.read_url(where)
    except Exception as e:  # noqa: BLE001 - an object store's client raises its own errors
        raise DatasetFileError(f"{where}: cannot read block file: {durable_storage.describe_error(e)}") from None
    if hashlib.sha256(raw).hexdigest() != entry.sha256:
        raise DatasetFileError(f"{where}: damaged block file (sha256 differs from {MANIFEST_NAME})")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise DatasetFileError(f"{where}: not a readable .npz of numeric arrays: {e}") from None
    entries = check_block_arrays(manifest.app, arrays, entry.rows, bounds, where)
    if entries != entry.entries:
        raise DatasetFileError(f"{where}: has {entries} entries, {MANIFEST_NAME} says {entry.entries}")
    row_start = index * json_int(manifest.spec["rows_per_block"])
    return DataBlock(manifest.app, index, row_start, entry.rows, arrays)


class DatasetWriter:
    """Writes a dataset directory block by block; `finish` writes dataset.json.

    Blocks of each part must be added in order, each of `rows_per_block` rows except the last.
    """

    def __init__(self, directory: str, app: str, rows_per_block: int) -> None:
        if app not in BLOCK_ARRAYS:
            raise ValueError(f"unknown app {app!r}")
        self.directory = os.path.abspath(directory)
        self.app = app
        self.rows_per_block = rows_per_block
        self.blocks: dict[str, list[BlockEntry]] = {p: [] for p in PARTS}
        if os.path.exists(os.path.join(self.directory, MANIFEST_NAME)):
            # Never mix the blocks of two datasets: the old manifest would describe new files.
            raise FileExistsError(f"{self.directory} already holds a dataset ({MANIFEST_NAME}); choose a new directory")
        for p in PARTS:
            os.makedirs(os.path.join(self.directory, p), exist_ok=True)

    def rows(self, part: str) -> int:
        return sum(e.rows for e in self.blocks[part])

    def entries(self, part: str) -> int:
        return sum(e.entries for e in self.blocks[part])

    def add_block(self, part: str, data: Mapping[str, np.ndarray]) -> BlockEntry:
        """Write the next block of `part`; the arrays are checked for names, dtypes and shape."""
        rows = len(data["indptr"]) - 1
        listed = self.blocks[part]
        if listed and listed[-1].rows != self.rows_per_block:
            raise ValueError(f"{part}: a block after a short block ({listed[-1].rows} rows)")
        if not 0 < rows <= self.rows_per_block:
            raise ValueError(f"{part}: a block needs 1..{self.rows_per_block} rows, got {rows}")
        name = block_file_name(part, len(listed))
        entries = check_block_arrays(self.app, data, rows, _no_bounds(self.app), name)
        buf = io.BytesIO()
        # mypy checks the ** mapping against savez's allow_pickle too (python/mypy#1969); no field is named so
        np.savez(buf, **{k: np.ascontiguousarray(v) for k, v in data.items()})  # type: ignore[arg-type]
        raw = buf.getvalue()
        with open(os.path.join(self.directory, name), "wb") as f:
            f.write(raw)
        entry = BlockEntry(file=name, rows=rows, entries=entries, sha256=hashlib.sha256(raw).hexdigest())
        listed.append(entry)
        return entry

    def finish(self, spec: Mapping[str, JsonValue], source: Mapping[str, JsonValue]) -> DatasetManifest:
        """Write dataset.json with `spec` (the app's dimension fields) and return it."""
        manifest = check_manifest(DatasetManifest(format=FORMAT_NAME, version=FORMAT_VERSION, app=self.app,
                                                  spec=dict(spec), train=self.blocks["train"],
                                                  heldout=self.blocks["heldout"], source=dict(source)),
                                  os.path.join(self.directory, MANIFEST_NAME))
        # durable: a prepared dataset is read by later jobs
        write_atomic(os.path.join(self.directory, MANIFEST_NAME),
                     msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n")
        return manifest


def write_generated(app: "PSApp", directory: str) -> DatasetManifest:
    """Write the app's generated data (every training and held-out block) as a dataset, so a
    synthetic job can be rerun from files; one block in memory at a time."""
    writer = DatasetWriter(directory, app.name, app.rows_per_block)
    for part, count in (("train", app.num_blocks), ("heldout", num_blocks(app.num_heldout_rows, app.rows_per_block))):
        for b in range(count):
            writer.add_block(part, app.generate_block(b, heldout=part == "heldout").data)
    app.release_generation_caches()
    spec = msgspec.to_builtins(app.spec)
    dims = {name: spec[name] for name in DIMENSION_FIELDS[app.name]}
    return writer.finish(dims, {"generator": {"app": app.name, "spec": spec}})


def _no_bounds(app: str) -> dict[str, int]:
    # While writing, the dimensions are not known yet (importers learn them from the data).
    return {field: np.iinfo(np.int64).max for field in INDEX_BOUNDS[app].values()}


def mean_entries(entries: int, rows: int) -> int:
    """Mean entries per row rounded up, at least 1 (nnz_per_sample / doc_length in a dataset spec)."""
    return max(1, -(-entries // max(rows, 1)))


__all__ = ["DatasetFileError", "DatasetWriter", "block_file_name", "check_block_arrays", "mean_entries",
           "read_block", "write_generated"]
