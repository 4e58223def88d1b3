"""Blocks spilled to local disk (Harmony's dynamic data reloading, §4.3.3).

One file per spilled block, `<name>.lz4` under the store's directory (by default the container's
working directory's `spill/`, whose bytes the NM's metrics count). A file is a
`psruntime.store.buffer_file` with every buffer lz4-compressed: the caller's header as its content,
then the buffers, plain numeric numpy arrays (no pickle): an input block's arrays as
`DataBlock.to_buffers` lists them (a CSR matrix is its indptr / indices / values arrays), a model
block's as `psruntime.store.checkpoint.pack_blocks` lays them out. Files are written atomically but
not fsynced (`write_atomic(durable=False)`: a spill dies with its process), so a reader never sees
half a block.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.store import buffer_file
from psruntime.store.block_store import BlockArrays
from psruntime.store.checkpoint import CheckpointError, pack_blocks, unpack_blocks
from protocol.errors import HostError
from protocol.json_types import JsonObject

SPILL_DIR = "spill"


class SpillError(HostError, RuntimeError):
    """A spilled block that is not on disk, or a file that cannot be read back; names the file."""


def default_spill_dir() -> Path:
    """`spill/` under the container's working dir (the NM's local disk for this container)."""
    return Path(os.environ.get("PWD") or os.getcwd()) / SPILL_DIR


def encode(header: JsonObject, arrays: Sequence[np.ndarray]) -> bytes:
    """The file content for `header` and `arrays` (in memory: tests, small blocks)."""
    try:
        return b"".join(buffer_file.encode(header, arrays, compress=True))
    except buffer_file.BufferFileError as e:
        raise SpillError(f"cannot spill: {e}") from None


def decode(raw: bytes, what: str = "spilled block") -> tuple[JsonObject, list[np.ndarray]]:
    """(header, arrays) of a file's content; the arrays are read-only. SpillError naming `what`
    when it is not a spill file or does not add up."""
    try:
        return buffer_file.decode(raw, what)
    except buffer_file.BufferFileError as e:
        raise SpillError(str(e)) from None


class SpillStore:
    """The spilled blocks of one executor, one lz4 frame file each, in directory `root`."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_spill_dir()

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.lz4"

    # -- raw ---------------------------------------------------------------------------------
    def write(self, name: str, header: JsonObject, arrays: Sequence[np.ndarray]) -> int:
        """Write `name` (replacing it; atomic, not fsynced), each buffer lz4-compressed on its own so
        no uncompressed copy of the block is made; returns the bytes on disk."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            return buffer_file.write(self._path(name), header, arrays, compress=True, durable=False)
        except buffer_file.BufferFileError as e:
            raise SpillError(f"cannot spill {name}: {e}") from None

    def read(self, name: str) -> tuple[JsonObject, list[np.ndarray]]:
        path = self._path(name)
        try:
            compressed = path.read_bytes()
        except FileNotFoundError:
            raise SpillError(f"{name} is not spilled in {self.root}") from None
        return decode(compressed, str(path))

    def contains(self, name: str) -> bool:
        return self._path(name).exists()

    def discard(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.lz4"))

    def nbytes_of(self, name: str) -> int:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            return 0

    def nbytes(self) -> int:
        """Bytes of all spill files on disk (what `spilled_mb` reports)."""
        if not self.root.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.root.glob("*.lz4"))

    # -- input blocks ------------------------------------------------------------------------
    @staticmethod
    def input_name(block_index: int) -> str:
        return f"input-{block_index:06d}"

    def put_input(self, block: DataBlock) -> int:
        """Spill the input data of `block` (immutable, so written once; its mutable worker-local
        state stays in memory with the block)."""
        header, arrays = DataBlock(block.app, block.block_index, block.row_start, block.num_rows,
                                   block.data).to_buffers()
        return self.write(self.input_name(block.block_index), header, arrays)

    def get_input(self, block_index: int) -> DataBlock:
        """The spilled input block `block_index` (data only; read-only arrays)."""
        header, arrays = self.read(self.input_name(block_index))
        try:
            block = DataBlock.from_buffers(header, arrays)
        except BlockFormatError as e:
            raise SpillError(f"spilled input block {block_index}: {e}") from None
        if block.block_index != block_index:
            raise SpillError(f"spill file of input block {block_index} holds block {block.block_index}")
        return block

    # -- model blocks ------------------------------------------------------------------------
    @staticmethod
    def model_name(block: int) -> str:
        return f"model-{block:06d}"

    def put_model(self, block: int, data: BlockArrays) -> int:
        """Spill model block `block` in the checkpoint wire form (psruntime.store.checkpoint.pack_blocks)."""
        descs, arrays = pack_blocks([(block, data)])
        return self.write(self.model_name(block), {"blocks": [*descs]}, arrays)

    def get_model(self, block: int, num_blocks: int) -> BlockArrays:
        header, arrays = self.read(self.model_name(block))
        try:
            items = unpack_blocks(header.get("blocks"), arrays, num_blocks)
        except CheckpointError as e:
            raise SpillError(f"spilled model block {block}: {e}") from None
        if len(items) != 1 or items[0][0] != block:
            raise SpillError(f"spill file of model block {block} holds blocks {[b for b, _ in items]}")
        return items[0][1]
