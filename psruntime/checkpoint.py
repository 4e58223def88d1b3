"""Checkpoints of store blocks: one .npz file per block plus a JSON manifest, written atomically.

Layout of a checkpoint directory (format 2)::

    manifest-<executor>.json   {"format": 2, "num_blocks", "table_version",
                                "blocks": {"<b>": {"file": "block_<b>.npz", "other_keys": [...]}}}
    block_<b>.npz              arrays "keys" (int64, sorted) and "values" (rows of those keys), and
                               "other_<i>" for the i-th of the block's other keys (str keys such as
                               the audit counter, or int keys of another layout) -- no pickle

A block is written to a temporary name and renamed into place; the manifest is written last (and
renamed), so a crash mid-checkpoint leaves the previous manifest intact. Several executors may
checkpoint into the same directory (each its own blocks): each writes `manifest-<executor>.json`;
`load_manifests` merges them.

The older format 1 (`"blocks": {"<b>": [[key, "block_<b>/<i>.npy"], ...]}`, one .npy per key) is
still read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Union

import numpy as np

from psruntime.block_store import BlockArrays, BlockStore

FORMAT = 2
# A block's entry in a manifest: {"file", "other_keys"} (format 2) or [[key, file], ...] (format 1).
BlockEntry = Union[dict[str, Any], list[list[Any]]]


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, incomplete or for another job shape."""


def _write_block(root: Path, block: int, data: BlockArrays) -> str:
    name = f"block_{block}.npz"
    arrays: dict[str, np.ndarray] = {"keys": np.asarray(data.keys, np.int64)}
    if data.values is not None:
        arrays["values"] = data.values
    for i, a in enumerate(data.other_arrays):
        arrays[f"other_{i}"] = np.asarray(a)
    tmp = root / f".{name}.tmp"
    with open(tmp, "wb") as f:          # a file object: np.savez appends no suffix
        np.savez(f, **arrays)
    os.replace(tmp, root / name)
    return name


def save_blocks(store: BlockStore, blocks: list[int], directory: str | os.PathLike[str], executor_id: str,
                table_version: int) -> Path:
    """Write `blocks` of `store` under `directory` (one file per block); returns the manifest path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": FORMAT, "num_blocks": store.num_blocks, "table_version": table_version,
                                "blocks": {}}
    for b in blocks:
        data = store.export_arrays(b)
        manifest["blocks"][str(b)] = {"file": _write_block(root, b, data), "other_keys": list(data.other_keys)}
    path = root / f"manifest-{executor_id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)  # a crash mid-checkpoint leaves the previous manifest intact
    return path


def load_manifests(directory: str | os.PathLike[str], num_blocks: int) -> dict[int, BlockEntry]:
    """Merge every executor's manifest in `directory`: block -> its entry (either format)."""
    root = Path(directory)
    paths = sorted(root.glob("manifest-*.json"))
    if not paths:
        raise CheckpointError(f"no checkpoint manifest in {root}")
    blocks: dict[int, BlockEntry] = {}
    for p in paths:
        try:
            m = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"unreadable manifest {p}: {e}") from None
        if m.get("num_blocks") != num_blocks:
            raise CheckpointError(f"{p} is for {m.get('num_blocks')} blocks, this job has {num_blocks}")
        for b, entry in m.get("blocks", {}).items():
            blocks[int(b)] = entry
    return blocks


def read_block(directory: str | os.PathLike[str], block: int, entry: BlockEntry) -> BlockArrays:
    """One block of a checkpoint as arrays (either format)."""
    root = Path(directory)
    try:
        if isinstance(entry, list):          # format 1: one .npy per key
            keys = [k for k, _ in entry]
            arrays = [np.load(root / name, allow_pickle=False) for _, name in entry]
            dense = [(k, a) for k, a in zip(keys, arrays) if isinstance(k, int) and not isinstance(k, bool)]
            other = [(k, a) for k, a in zip(keys, arrays) if not (isinstance(k, int) and not isinstance(k, bool))]
            shapes = {(a.dtype.str, a.shape) for _, a in dense}
            if len(shapes) > 1:          # int keys of several layouts: let the store sort them out
                return BlockArrays(np.zeros(0, np.int64), None, keys, arrays)
            return BlockArrays(np.array([k for k, _ in dense], np.int64),
                               np.stack([a for _, a in dense]) if dense else None,
                               [k for k, _ in other], [a for _, a in other])
        other_keys = list(entry["other_keys"])
        with np.load(root / entry["file"], allow_pickle=False) as z:
            keys = z["keys"]
            values = z["values"] if "values" in z.files else None
            others = [z[f"other_{i}"] for i in range(len(other_keys))]
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"block {block} of the checkpoint at {root} is unreadable: {e}") from None
    return BlockArrays(keys, values, other_keys, others)


def load_blocks(directory: str | os.PathLike[str], num_blocks: int) -> dict[int, BlockArrays]:
    """Every block of the checkpoint in `directory`, as arrays."""
    return {b: read_block(directory, b, e) for b, e in load_manifests(directory, num_blocks).items()}


def restore_blocks(store: BlockStore, blocks: list[int], directory: str | os.PathLike[str]) -> None:
    """Load `blocks` from the checkpoint in `directory` into `store` (replacing their contents)."""
    root = Path(directory)
    manifest = load_manifests(root, store.num_blocks)
    missing = [b for b in blocks if b not in manifest]
    if missing:
        raise CheckpointError(f"blocks {missing} are not in the checkpoint at {root}")
    for b in blocks:
        entry = manifest[b]
        if isinstance(entry, list):      # format 1: the store's per-key import keeps its layout rules
            keys = [k for k, _ in entry]
            store.import_block(b, keys, [np.load(root / name, allow_pickle=False) for _, name in entry])
        else:
            store.import_arrays(b, read_block(root, b, entry))
