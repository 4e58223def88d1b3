"""Checkpoints of store blocks: one .npy file per key plus a JSON manifest, written atomically.

Layout of a checkpoint directory::

    manifest.json                      {"num_blocks", "table_version", "blocks": {"<b>": [[key, file], ...]}}
    block_<b>/<i>.npy                  the value of the i-th key of block b

Several executors may checkpoint into the same directory (each its own blocks): each writes
`manifest-<executor>.json`; `load_manifests` merges them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from psruntime.block_store import BlockStore


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, incomplete or for another job shape."""


def save_blocks(store: BlockStore, blocks: list[int], directory: str | os.PathLike[str], executor_id: str,
                table_version: int) -> Path:
    """Write `blocks` of `store` under `directory`; returns the manifest path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"num_blocks": store.num_blocks, "table_version": table_version, "blocks": {}}
    for b in blocks:
        keys, arrays = store.export_block(b)
        bdir = root / f"block_{b}"
        bdir.mkdir(exist_ok=True)
        entries = []
        for i, (k, a) in enumerate(zip(keys, arrays)):
            name = f"block_{b}/{i}.npy"
            np.save(root / name, a, allow_pickle=False)
            entries.append([k, name])
        manifest["blocks"][str(b)] = entries
    path = root / f"manifest-{executor_id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)  # a crash mid-checkpoint leaves the previous manifest intact
    return path


def load_manifests(directory: str | os.PathLike[str], num_blocks: int) -> dict[int, list[list[Any]]]:
    """Merge every executor's manifest in `directory`: block -> [[key, file], ...]."""
    root = Path(directory)
    paths = sorted(root.glob("manifest-*.json"))
    if not paths:
        raise CheckpointError(f"no checkpoint manifest in {root}")
    blocks: dict[int, list[list[Any]]] = {}
    for p in paths:
        try:
            m = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"unreadable manifest {p}: {e}") from None
        if m.get("num_blocks") != num_blocks:
            raise CheckpointError(f"{p} is for {m.get('num_blocks')} blocks, this job has {num_blocks}")
        for b, entries in m.get("blocks", {}).items():
            blocks[int(b)] = entries
    return blocks


def restore_blocks(store: BlockStore, blocks: list[int], directory: str | os.PathLike[str]) -> None:
    """Load `blocks` from the checkpoint in `directory` into `store` (replacing their contents)."""
    root = Path(directory)
    manifest = load_manifests(root, store.num_blocks)
    missing = [b for b in blocks if b not in manifest]
    if missing:
        raise CheckpointError(f"blocks {missing} are not in the checkpoint at {root}")
    for b in blocks:
        keys = [k for k, _ in manifest[b]]
        arrays = [np.load(root / name, allow_pickle=False) for _, name in manifest[b]]
        store.import_block(b, keys, arrays)
