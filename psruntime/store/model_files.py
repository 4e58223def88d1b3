"""The arrays of a model output (docs/model_output.md; the metadata is `protocol.model_output`):
`model.npz` with one float32 array "values" of (num_keys, key_length), row k the value of key k.

`model_from_blocks` assembles that array from a checkpoint's blocks (psruntime.store.checkpoint's
format, what the AM gathers from the servers), `write_model` writes a model directory (arrays
first, metadata.json last: a directory without it is incomplete), `read_values` reads the arrays
back, checked against the metadata.
"""
from __future__ import annotations

import io
from typing import Mapping

import numpy as np

from protocol.durable_storage import DurableDir
from protocol.model_output import (METADATA_FILE, MODEL_FILE, VALUES_ARRAY, ModelMetadata, ModelOutputError,
                                   encode_metadata)
from psruntime.store.block_store import BlockArrays


def model_from_blocks(blocks: Mapping[int, BlockArrays], num_keys: int, key_length: int) -> np.ndarray:
    """The dense (num_keys, key_length) float32 model from every block of a checkpoint; keys that
    are not model keys (counters such as "eps:minibatches") are left out. ModelOutputError naming
    the keys a checkpoint lacks or a value of the wrong length."""
    values = np.zeros((num_keys, key_length), np.float32)
    seen = np.zeros(num_keys, bool)
    for b, data in blocks.items():
        keys = np.asarray(data.keys, np.int64)
        if not len(keys) or data.values is None:
            continue
        rows = np.asarray(data.values).reshape(len(keys), -1)
        if rows.shape[1] != key_length:
            raise ModelOutputError(f"block {b} holds values of length {rows.shape[1]}, the model's keys {key_length}")
        inside = (keys >= 0) & (keys < num_keys)
        values[keys[inside]] = rows[inside]
        seen[keys[inside]] = True
    if not seen.all():
        missing = np.flatnonzero(~seen)
        raise ModelOutputError(f"the checkpoint lacks {len(missing)} of {num_keys} model keys (first {missing[:5].tolist()})")
    return values


def uncommit(d: DurableDir) -> None:
    """Mark the model directory `d` incomplete before anything of it is written again (a job rerun
    with the same `output`, an epoch written twice): its old metadata.json goes first. Left in
    place, it described the new files while they were written -- for good if the write then
    failed -- and the shapes agreeing, nothing would tell."""
    d.remove_file(METADATA_FILE)


def write_model(d: DurableDir, values: np.ndarray, meta: ModelMetadata) -> None:
    """Write the model directory `d`: model.npz, then metadata.json (which completes it); a
    directory written before is uncommitted first."""
    if values.shape != (meta.num_keys, meta.key_length):
        raise ModelOutputError(f"values of shape {values.shape} for a model of {meta.num_keys} x {meta.key_length}")
    buf = io.BytesIO()
    np.savez(buf, **{VALUES_ARRAY: np.ascontiguousarray(values, np.float32)})  # type: ignore[arg-type]  # see psruntime/store/checkpoint.py
    d.makedirs()
    uncommit(d)
    d.write_bytes(MODEL_FILE, buf.getvalue())
    d.write_bytes(METADATA_FILE, encode_metadata(meta))


def read_values(d: DurableDir, meta: ModelMetadata) -> np.ndarray:
    """The values of the model directory `d`, checked against its metadata; OSError when it cannot
    be read, ModelOutputError when it is not the model the metadata describes."""
    raw = d.read_bytes(MODEL_FILE)
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            values = z[VALUES_ARRAY]
    except (KeyError, ValueError, OSError) as e:
        raise ModelOutputError(f"{d.url}/{MODEL_FILE} is not a model's arrays: {e}") from None
    if values.shape != (meta.num_keys, meta.key_length) or values.dtype != np.float32:
        raise ModelOutputError(f"{d.url}/{MODEL_FILE} holds {values.dtype} {values.shape}, its metadata says "
                               f"float32 ({meta.num_keys}, {meta.key_length})")
    return values
