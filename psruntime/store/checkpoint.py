"""Checkpoints of store blocks: one buffer file per block plus a JSON manifest, written atomically;
and the wire form in which blocks travel between a server and the AM over the data plane.

Layout of a checkpoint directory (format 3)::

    manifest-<executor>.json   {"format": 3, "num_blocks", "table_version",
                                "blocks": {"<b>": {"file": "block_<b>.buf", "other_keys": [...]}}}
    block_<b>.buf              a psruntime.store.buffer_file whose content is the block's wire
                               descriptor {"blocks": [{"block", "other_keys", "has_values"}]} and
                               whose buffers are its wire buffers (`pack_blocks`): keys (int64,
                               sorted), values (rows of those keys), one per other key (str keys
                               such as the audit counter, or int keys of another layout) -- no pickle

A block is written to a temporary name and renamed into place; the manifest is written last (and
renamed), so a crash mid-checkpoint leaves the previous manifest intact. Several executors may
checkpoint into the same directory (each its own blocks): each writes `manifest-<executor>.json`;
`load_manifests` merges them. Who writes does not matter: a server writing its own blocks
(`save_blocks`) and the AM writing blocks it received over the data plane (`write_block` +
`write_manifest`) produce the same files.

Older checkpoints stay resumable: format 2 (the same manifest, `block_<b>.npz` files with arrays
"keys", "values" and "other_<i>") and format 1 (`"blocks": {"<b>": [[key, "block_<b>/<i>.npy"],
...]}`, one .npy per key) are still read.

Wire form (`pack_blocks` / `unpack_blocks`): a frame header field "blocks" lists one
`{"block", "other_keys", "has_values"}` per block and the frame's buffers are, block after block,
`keys`, then `values` if has_values, then one array per other key. `CheckpointCut` is a server's
consistent snapshot of its blocks, handed out in batches of bounded size.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import msgspec
import numpy as np

from protocol.checkpoint_manifest import FORMAT, BlockEntry, BlockManifest
from protocol.durable_storage import write_atomic
from psruntime.store import buffer_file
from psruntime.store.block_store import BlockArrays, BlockStore
from protocol.errors import AppError
from protocol.json_types import JsonObject
from psruntime.store.ownership_table import Key

__all__ = ["FORMAT", "BlockEntry", "BlockManifest"]    # re-exported: callers import them from here


class CheckpointError(AppError, ValueError):
    """A checkpoint directory that is missing, incomplete or for another job shape, or blocks on the
    wire that do not add up."""


# ===== files ======================================================================================

def write_block(directory: str | os.PathLike[str], block: int, data: BlockArrays, *,
                durable: bool = False) -> dict[str, Any]:
    """Write one block as `block_<b>.buf` (atomically); returns its manifest entry (typed as
    protocol.checkpoint_manifest.BlockEntry's object form, which callers index).
    `durable`: fsync it too (the AM's checkpointer decides that per checkpoint and syncs itself)."""
    name = f"block_{block}.buf"
    descs, arrays = pack_blocks([(block, data)])
    buffer_file.write(Path(directory) / name, {"blocks": [*descs]}, arrays, durable=durable)
    return {"file": name, "other_keys": [*data.other_keys]}


def write_manifest(directory: str | os.PathLike[str], executor_id: str, num_blocks: int, table_version: int,
                   entries: dict[int, JsonObject], *, durable: bool = False) -> Path:
    """Write `manifest-<executor_id>.json` over `entries` (block -> write_block's entry), last and
    atomically: a crash before it leaves the previous manifest intact. `durable` as write_block's."""
    manifest = BlockManifest(num_blocks=num_blocks, table_version=table_version,
                             blocks={b: e for b, e in sorted(entries.items())})
    path = Path(directory) / f"manifest-{executor_id}.json"
    write_atomic(path, msgspec.json.encode(manifest), durable=durable)
    return path


def save_blocks(store: BlockStore, blocks: list[int], directory: str | os.PathLike[str], executor_id: str,
                table_version: int) -> Path:
    """Write `blocks` of `store` under `directory` (one file per block); returns the manifest path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    # durable: an executor's own save is the checkpoint (nothing syncs it later)
    entries = {b: write_block(root, b, store.export_arrays(b), durable=True) for b in blocks}
    return write_manifest(root, executor_id, store.num_blocks, table_version, entries, durable=True)


def load_manifests(directory: str | os.PathLike[str], num_blocks: int) -> dict[int, BlockEntry]:
    """Merge every executor's manifest in `directory`: block -> its entry (any format)."""
    root = Path(directory)
    paths = sorted(root.glob("manifest-*.json"))
    if not paths:
        raise CheckpointError(f"no checkpoint manifest in {root}")
    blocks: dict[int, BlockEntry] = {}
    for p in paths:
        try:
            m = msgspec.json.decode(p.read_bytes(), type=BlockManifest)
        except (OSError, msgspec.DecodeError) as e:
            raise CheckpointError(f"unreadable manifest {p}: {e}") from None
        if m.num_blocks != num_blocks:
            raise CheckpointError(f"{p} is for {m.num_blocks} blocks, this job has {num_blocks}")
        blocks.update(m.blocks)
    return blocks


def checkpoint_entries(directory: str | os.PathLike[str], num_blocks: int, blocks: Sequence[int]
                       ) -> dict[int, BlockEntry]:
    """The manifest entries of `blocks`; CheckpointError naming any the checkpoint lacks."""
    manifest = load_manifests(directory, num_blocks)
    missing = [b for b in blocks if b not in manifest]
    if missing:
        raise CheckpointError(f"blocks {missing} are not in the checkpoint at {Path(directory)}")
    return {b: manifest[b] for b in blocks}


def read_block(directory: str | os.PathLike[str], block: int, entry: BlockEntry) -> BlockArrays:
    """One block of a checkpoint as arrays (any format)."""
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
        if str(entry["file"]).endswith(".npz"):     # format 2
            with np.load(root / entry["file"], allow_pickle=False) as z:
                keys = z["keys"]
                values = z["values"] if "values" in z.files else None
                others = [z[f"other_{i}"] for i in range(len(other_keys))]
        else:
            content, arrays = buffer_file.read(root / entry["file"])
            items = unpack_blocks(content.get("blocks"), arrays, block + 1)
            if len(items) != 1 or items[0][0] != block or list(items[0][1].other_keys) != other_keys:
                raise CheckpointError(f"the file holds blocks {[b for b, _ in items]}, not block {block} "
                                      f"with other keys {other_keys}")
            return items[0][1]
    except (OSError, KeyError, ValueError, TypeError) as e:     # BufferFileError, CheckpointError: ValueErrors
        raise CheckpointError(f"block {block} of the checkpoint at {root} is unreadable: {e}") from None
    return BlockArrays(keys, values, other_keys, others)


def load_blocks(directory: str | os.PathLike[str], num_blocks: int) -> dict[int, BlockArrays]:
    """Every block of the checkpoint in `directory`, as arrays."""
    return {b: read_block(directory, b, e) for b, e in load_manifests(directory, num_blocks).items()}


def install_blocks(store: BlockStore, items: Sequence[tuple[int, BlockArrays]]) -> None:
    """Install blocks (replacing their contents) all or nothing: if one is refused, the blocks
    installed before it get their previous contents back and the error propagates."""
    previous = {b: store.export_arrays(b) if store.has_block(b) else None for b, _ in items}
    done: list[int] = []
    try:
        for b, data in items:
            store.import_arrays(b, data)
            done.append(b)
    except Exception:
        for b in done:
            old = previous[b]
            if old is None:
                store.drop_block(b)
            else:   # views of the replaced storage: nothing wrote to it since
                store.import_arrays(b, old)
        raise


def restore_blocks(store: BlockStore, blocks: list[int], directory: str | os.PathLike[str]) -> None:
    """Load `blocks` from the checkpoint in `directory` into `store` (replacing their contents)."""
    root = Path(directory)
    entries = checkpoint_entries(root, store.num_blocks, blocks)
    for b in blocks:
        entry = entries[b]
        if isinstance(entry, list):      # format 1: the store's per-key import keeps its layout rules
            keys = [k for k, _ in entry]
            store.import_block(b, keys, [np.load(root / name, allow_pickle=False) for _, name in entry])
        else:
            store.import_arrays(b, read_block(root, b, entry))


# ===== wire =======================================================================================

def block_wire_bytes(data: BlockArrays) -> int:
    """Bytes the block's buffers take in a frame body."""
    return int(np.asarray(data.keys).nbytes) + data.nbytes


def pack_blocks(items: Sequence[tuple[int, BlockArrays]]) -> tuple[list[JsonObject], list[np.ndarray]]:
    """Blocks as a frame's "blocks" header field and its buffers (see the module docstring)."""
    descs: list[JsonObject] = []
    arrays: list[np.ndarray] = []
    for b, data in items:
        descs.append({"block": b, "other_keys": [*data.other_keys], "has_values": data.values is not None})
        arrays.append(np.asarray(data.keys, np.int64))
        if data.values is not None:
            arrays.append(data.values)
        arrays.extend(np.asarray(a) for a in data.other_arrays)
    return descs, arrays


def unpack_blocks(descs: object, arrays: Sequence[np.ndarray], num_blocks: int) -> list[tuple[int, BlockArrays]]:
    """The blocks of a frame packed by `pack_blocks` (`descs`: its "blocks" field, any value, checked
    here); CheckpointError naming what does not add up.
    The arrays stay views into the frame's body (BlockStore.import_arrays copies what it keeps)."""
    if not isinstance(descs, list):
        raise CheckpointError("field 'blocks' must be a list of {block, other_keys, has_values}")
    out: list[tuple[int, BlockArrays]] = []
    seen: set[int] = set()
    i = 0
    for n, d in enumerate(descs):
        if not isinstance(d, dict):
            raise CheckpointError(f"'blocks'[{n}] must be an object {{block, other_keys, has_values}}")
        b, other_keys, has_values = d.get("block"), d.get("other_keys"), d.get("has_values")
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < num_blocks:
            raise CheckpointError(f"'blocks'[{n}].block must be a block id in [0, {num_blocks}), got {b!r}")
        if b in seen:
            raise CheckpointError(f"block {b} is listed twice")
        seen.add(b)
        keys_of: list[Key] = [k for k in other_keys if isinstance(k, (int, str)) and not isinstance(k, bool)] \
            if isinstance(other_keys, list) else []
        if not isinstance(other_keys, list) or len(keys_of) != len(other_keys):
            raise CheckpointError(f"'blocks'[{n}].other_keys must be a list of int or str keys")
        if not isinstance(has_values, bool):
            raise CheckpointError(f"'blocks'[{n}].has_values must be true or false")
        count = 1 + int(has_values) + len(keys_of)
        if i + count > len(arrays):
            raise CheckpointError(f"block {b} needs {count} buffers but the frame has only {len(arrays) - i} left")
        keys = arrays[i]
        values = arrays[i + 1] if has_values else None
        others = list(arrays[i + 1 + int(has_values):i + count])
        i += count
        out.append((b, BlockArrays(keys, values, keys_of, others)))
    if i != len(arrays):
        raise CheckpointError(f"the blocks use {i} buffers but the frame has {len(arrays)}")
    return out


@dataclass
class CheckpointCut:
    """A server's consistent snapshot of some of its blocks, handed out in bounded batches.

    The snapshot holds `BlockStore.export_arrays` views taken in one synchronous step: the store's
    copy-on-write keeps them intact if updates arrive while batches are still being sent, so every
    batch belongs to the same cut of the model.
    """

    cut_id: int
    table_version: int
    pending: list[tuple[int, BlockArrays]] = field(default_factory=list)

    @classmethod
    def take(cls, store: BlockStore, blocks: Sequence[int], cut_id: int, table_version: int) -> "CheckpointCut":
        return cls(cut_id, table_version, [(b, store.export_arrays(b)) for b in blocks])

    @property
    def remaining(self) -> list[int]:
        return [b for b, _ in self.pending]

    def next_batch(self, max_bytes: int, frame_limit: int) -> list[tuple[int, BlockArrays]]:
        """The next blocks whose buffers add up to at most `max_bytes` (always at least one block,
        which must fit `frame_limit`, the body size a data-plane frame may have)."""
        batch: list[tuple[int, BlockArrays]] = []
        total = 0
        while self.pending:
            b, data = self.pending[0]
            size = block_wire_bytes(data)
            if size > frame_limit:
                raise CheckpointError(f"block {b} holds {size} bytes, more than one data-plane frame carries "
                                      f"({frame_limit}); use more blocks for this model")
            if batch and total + size > max_bytes:
                break
            batch.append(self.pending.pop(0))
            total += size
        return batch
