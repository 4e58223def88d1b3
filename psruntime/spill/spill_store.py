"""Blocks spilled to local disk as lz4 frames (Harmony's dynamic data reloading, §4.3.3).

One file per spilled block, `<name>.lz4` under the store's directory (by default the container's
working directory's `spill/`, whose bytes the NM's metrics count). A file is one `lz4.frame`
whose content is::

    b"ELSPILL1"  u32 little-endian header length  JSON header  raw buffers back to back

The JSON header is `{"content": <the caller's header>, "buffers": [[dtype, shape], ...]}`; the
buffers are plain numeric numpy arrays (no pickle): an input block's arrays as
`DataBlock.to_buffers` lists them (a CSR matrix is its indptr / indices / values arrays), a model
block's as `psruntime.store.checkpoint.pack_blocks` lays them out. Files are written to a temporary name
and renamed, so a reader never sees half a block.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Sequence

import lz4.frame  # type: ignore[import-untyped]  # lz4 ships no type information
import numpy as np

from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.store.block_store import BlockArrays
from psruntime.store.checkpoint import CheckpointError, pack_blocks, unpack_blocks
from protocol.errors import HostError

SPILL_DIR = "spill"
MAGIC = b"ELSPILL1"
_LEN = struct.Struct("<I")
_NUMERIC = frozenset("biuf")


class SpillError(HostError, RuntimeError):
    """A spilled block that is not on disk, or a file that cannot be read back; names the file."""


def default_spill_dir() -> Path:
    """`spill/` under the container's working dir (the NM's local disk for this container)."""
    return Path(os.environ.get("PWD") or os.getcwd()) / SPILL_DIR


def _prefix(header: dict[str, Any], arrays: Sequence[np.ndarray]) -> bytes:
    descs = []
    for a in arrays:
        if a.dtype.kind not in _NUMERIC:
            raise SpillError(f"cannot spill an array of non-numeric dtype {a.dtype}")
        descs.append([a.dtype.str, list(a.shape)])
    raw = json.dumps({"content": header, "buffers": descs}).encode()
    return MAGIC + _LEN.pack(len(raw)) + raw


def encode(header: dict[str, Any], arrays: Sequence[np.ndarray]) -> bytes:
    """The compressed file content for `header` and `arrays` (in memory: tests, small blocks)."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    c = lz4.frame.LZ4FrameCompressor()
    parts = [c.begin(), c.compress(_prefix(header, arrays))]
    parts.extend(c.compress(a.data.cast("B")) for a in arrays if a.nbytes)
    parts.append(c.flush())
    return b"".join(parts)


def decode(compressed: bytes, what: str = "spilled block") -> tuple[dict[str, Any], list[np.ndarray]]:
    """(header, arrays) of a file's content; the arrays are read-only views of one decompressed
    buffer. SpillError naming `what` when it is not a spill frame or does not add up."""
    try:
        raw = lz4.frame.decompress(compressed)
    except RuntimeError as e:
        raise SpillError(f"{what}: not an lz4 frame: {e}") from None
    try:
        if raw[:len(MAGIC)] != MAGIC:
            raise SpillError(f"{what}: not a spill file (bad magic)")
        (n,) = _LEN.unpack_from(raw, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        meta = json.loads(raw[start:start + n])
        offset = start + n
        view = memoryview(raw)
        arrays: list[np.ndarray] = []
        for dtype_str, shape in meta["buffers"]:
            dtype = np.dtype(dtype_str)
            if dtype.kind not in _NUMERIC:
                raise SpillError(f"{what}: buffer of non-numeric dtype {dtype}")
            shape = tuple(int(s) for s in shape)
            size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if offset + size > len(raw):
                raise SpillError(f"{what}: truncated ({len(raw)} bytes, buffers need more)")
            arrays.append(np.frombuffer(view[offset:offset + size], dtype).reshape(shape))
            offset += size
        if offset != len(raw):
            raise SpillError(f"{what}: {len(raw) - offset} trailing bytes")
        return meta["content"], arrays
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise SpillError(f"{what}: corrupt header: {e}") from None


class SpillStore:
    """The spilled blocks of one executor, one lz4 frame file each, in directory `root`."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_spill_dir()

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.lz4"

    # -- raw ---------------------------------------------------------------------------------
    def write(self, name: str, header: dict[str, Any], arrays: Sequence[np.ndarray]) -> int:
        """Write `name` (replacing it), streaming the buffers through the compressor so no
        uncompressed copy of the block is made; returns the bytes on disk."""
        self.root.mkdir(parents=True, exist_ok=True)
        arrays = [np.ascontiguousarray(a) for a in arrays]
        path = self._path(name)
        tmp = path.with_suffix(".tmp")
        c = lz4.frame.LZ4FrameCompressor()
        with open(tmp, "wb") as f:
            f.write(c.begin())
            f.write(c.compress(_prefix(header, arrays)))
            for a in arrays:
                if a.nbytes:
                    f.write(c.compress(a.data.cast("B")))
            f.write(c.flush())
        os.replace(tmp, path)
        return path.stat().st_size

    def read(self, name: str) -> tuple[dict[str, Any], list[np.ndarray]]:
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
        return self.write(self.model_name(block), {"blocks": descs}, arrays)

    def get_model(self, block: int, num_blocks: int) -> BlockArrays:
        header, arrays = self.read(self.model_name(block))
        try:
            items = unpack_blocks(header.get("blocks"), arrays, num_blocks)
        except CheckpointError as e:
            raise SpillError(f"spilled model block {block}: {e}") from None
        if len(items) != 1 or items[0][0] != block:
            raise SpillError(f"spill file of model block {block} holds blocks {[b for b, _ in items]}")
        return items[0][1]
