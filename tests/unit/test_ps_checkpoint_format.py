"""Checkpoint files: one buffer file per block plus a manifest, restored as arrays; the older formats
(format 2: one .npz per block; format 1: one .npy per key) are still read."""
from __future__ import annotations

import json

import numpy as np
import pytest

from psruntime.store.block_store import BlockStore
from psruntime.store.checkpoint import CheckpointError, load_blocks, load_manifests, restore_blocks, save_blocks
from psruntime.store.ownership_table import block_of

NUM_BLOCKS = 4


def _store() -> BlockStore:
    store = BlockStore(NUM_BLOCKS)
    for b in range(NUM_BLOCKS):
        store.create_block(b)
    for k in range(40):
        store.put(k, np.full(3, k, np.float32))
    store.put("eps:minibatches", np.array([7.0], np.float32))     # a str key lives beside the dense rows
    return store


def _model(store: BlockStore) -> dict:
    return {k: np.array(store.get(k)) for b in store.block_ids() for k in store.keys(b)}


def test_one_file_per_block_and_a_round_trip(tmp_path) -> None:
    src = _store()
    path = save_blocks(src, list(range(NUM_BLOCKS)), tmp_path, "server-0", table_version=3)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"block_{b}.buf" for b in range(NUM_BLOCKS)] + ["manifest-server-0.json"]
    manifest = json.loads(path.read_text())
    assert manifest["format"] == 3 and manifest["table_version"] == 3
    assert sorted(load_manifests(tmp_path, NUM_BLOCKS)) == list(range(NUM_BLOCKS))
    dst = BlockStore(NUM_BLOCKS)
    for b in range(NUM_BLOCKS):
        dst.create_block(b)
    restore_blocks(dst, list(range(NUM_BLOCKS)), tmp_path)
    want, got = _model(src), _model(dst)
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
    arrays = load_blocks(tmp_path, NUM_BLOCKS)
    assert sum(len(a.keys) for a in arrays.values()) == 40
    assert arrays[block_of("eps:minibatches", NUM_BLOCKS)].other_keys == ["eps:minibatches"]


def test_a_format_2_checkpoint_of_npz_files_is_still_restored(tmp_path) -> None:
    src = _store()
    manifest = {"format": 2, "num_blocks": NUM_BLOCKS, "table_version": 1, "blocks": {}}
    for b in range(NUM_BLOCKS):
        data = src.export_arrays(b)
        arrays = {"keys": np.asarray(data.keys, np.int64)}
        if data.values is not None:
            arrays["values"] = data.values
        arrays.update({f"other_{i}": np.asarray(a) for i, a in enumerate(data.other_arrays)})
        np.savez(tmp_path / f"block_{b}.npz", **arrays)  # type: ignore[arg-type]
        manifest["blocks"][str(b)] = {"file": f"block_{b}.npz", "other_keys": list(data.other_keys)}
    (tmp_path / "manifest-server-0.json").write_text(json.dumps(manifest))
    dst = BlockStore(NUM_BLOCKS)
    for b in range(NUM_BLOCKS):
        dst.create_block(b)
    restore_blocks(dst, list(range(NUM_BLOCKS)), tmp_path)
    want, got = _model(src), _model(dst)
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
    assert load_blocks(tmp_path, NUM_BLOCKS)[block_of("eps:minibatches", NUM_BLOCKS)].other_keys == ["eps:minibatches"]


def test_the_older_per_key_format_is_still_restored(tmp_path) -> None:
    src = _store()
    manifest = {"num_blocks": NUM_BLOCKS, "table_version": 1, "blocks": {}}
    for b in range(NUM_BLOCKS):
        keys, arrays = src.export_block(b)
        (tmp_path / f"block_{b}").mkdir()
        entries = []
        for i, (k, a) in enumerate(zip(keys, arrays)):
            np.save(tmp_path / f"block_{b}" / f"{i}.npy", a)
            entries.append([k, f"block_{b}/{i}.npy"])
        manifest["blocks"][str(b)] = entries
    (tmp_path / "manifest-server-0.json").write_text(json.dumps(manifest))
    dst = BlockStore(NUM_BLOCKS)
    for b in range(NUM_BLOCKS):
        dst.create_block(b)
    restore_blocks(dst, list(range(NUM_BLOCKS)), tmp_path)
    want, got = _model(src), _model(dst)
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
    assert sum(len(a.keys) for a in load_blocks(tmp_path, NUM_BLOCKS).values()) == 40


def test_a_missing_or_damaged_checkpoint_is_named(tmp_path) -> None:
    dst = BlockStore(NUM_BLOCKS)
    dst.create_block(0)
    with pytest.raises(CheckpointError, match="no checkpoint manifest"):
        restore_blocks(dst, [0], tmp_path)
    save_blocks(_store(), [0, 1], tmp_path, "server-0", 1)
    with pytest.raises(CheckpointError, match=r"blocks \[2\] are not in the checkpoint"):
        restore_blocks(dst, [0, 2], tmp_path)
    (tmp_path / "block_0.buf").write_bytes(b"not a buffer file")
    before = _model(dst)
    with pytest.raises(CheckpointError, match="block 0 .* unreadable"):
        restore_blocks(dst, [0], tmp_path)
    assert _model(dst).keys() == before.keys()
    with pytest.raises(CheckpointError, match="is for 4 blocks, this job has 8"):
        load_manifests(tmp_path, 8)
