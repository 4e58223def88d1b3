"""A worker's inactive dataset (EPS §3.1.4): input splits kept only on local disk.

When a worker sends a split to a worker being added, it keeps the split here; if that worker is
removed later, the split is re-activated from here and only its worker-local state travels (see
appmaster.ps.eps_datasets for the validity rule). One file per split: a little-endian u32 header
length, the block's JSON header (DataBlock.to_buffers), then its raw buffers back to back. Files
are written to a temporary name and renamed, so a crash never leaves a half split behind.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from psruntime.apps.blocks import BlockFormatError, DataBlock
from protocol.errors import AppError

_LEN = struct.Struct("<I")


class InactiveStoreError(AppError, RuntimeError):
    """A split that is not in the inactive dataset, or a file that cannot be read back."""


class InactiveSplits:
    """The inactive dataset of one worker, in directory `root`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, split: int) -> Path:
        return self.root / f"split-{split:06d}.blk"

    def put(self, block: DataBlock) -> int:
        """Write `block` (data and state) as split `block.block_index`; returns the bytes written."""
        self.root.mkdir(parents=True, exist_ok=True)
        header, arrays = block.to_buffers()
        raw = json.dumps(header).encode()
        path = self._path(block.block_index)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(_LEN.pack(len(raw)))
            f.write(raw)
            for a in arrays:
                f.write(np.ascontiguousarray(a).data.cast("B"))
        os.replace(tmp, path)
        return path.stat().st_size

    def get(self, split: int) -> DataBlock:
        """Read split `split` back (its data; its state as it was when it was written)."""
        path = self._path(split)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise InactiveStoreError(f"split {split} is not in the inactive dataset at {self.root}") from None
        try:
            (n,) = _LEN.unpack_from(raw, 0)
            header = json.loads(raw[_LEN.size:_LEN.size + n])
            buffers: list[memoryview] = []
            offset = _LEN.size + n
            for _part, _name, dtype, shape in header["arrays"]:
                size = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
                buffers.append(memoryview(raw)[offset:offset + size])
                offset += size
            if offset != len(raw):
                raise BlockFormatError(f"{len(raw) - offset} trailing bytes")
            return DataBlock.from_buffers(header, buffers)
        except (BlockFormatError, ValueError, KeyError, TypeError, struct.error) as e:
            raise InactiveStoreError(f"inactive split {split} at {path} is corrupt: {e}") from None

    def contains(self, split: int) -> bool:
        return self._path(split).exists()

    def discard(self, split: int) -> None:
        self._path(split).unlink(missing_ok=True)

    def splits(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(p.stem.split("-", 1)[1]) for p in self.root.glob("split-*.blk"))

    def nbytes(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.root.glob("split-*.blk"))
