"""A worker's inactive dataset (EPS §3.1.4): input splits kept only on local disk.

When a worker sends a split to a worker being added, it keeps the split here; if that worker is
removed later, the split is re-activated from here and only its worker-local state travels (see
appmaster.ps.eps_datasets for the validity rule). One file per split, a `psruntime.store.buffer_file`
(uncompressed): the block's header (DataBlock.to_buffers) as its content, then its raw buffers.
Files are written atomically, not fsynced (`write_atomic(durable=False)`: the split is rebuilt from
the dataset if the host dies), so a crash never leaves a half split behind.
"""
from __future__ import annotations

from pathlib import Path

from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.store import buffer_file
from protocol.errors import AppError


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
        return buffer_file.write(self._path(block.block_index), header, arrays, durable=False)

    def get(self, split: int) -> DataBlock:
        """Read split `split` back (its data; its state as it was when it was written)."""
        path = self._path(split)
        try:
            header, arrays = buffer_file.read(path)
        except FileNotFoundError:
            raise InactiveStoreError(f"split {split} is not in the inactive dataset at {self.root}") from None
        except buffer_file.BufferFileError as e:
            raise InactiveStoreError(f"inactive split {split} at {path} is corrupt: {e}") from None
        try:
            return DataBlock.from_buffers(header, arrays)
        except BlockFormatError as e:
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
