"""A worker's disk blocks: input data kept on local disk and reloaded ahead of its use (§4.3.3).

A fraction alpha of the worker's input blocks are *disk blocks*: their (immutable) input data is
written once to the worker's `SpillStore` as an lz4 frame and dropped from memory; their mutable
worker-local state (NMF's user factors, LDA's assignments, the epoch position) stays with the
block in memory, so a spilled block is never written back. The disk blocks are spread evenly over
the block order (block i is on disk when floor((i+1) alpha) > floor(i alpha)), so memory blocks
are processed while the next disk block loads.

The training pipeline tells the reloader (its `BlockResidency`) which blocks a step visits, in
order (`plan`), and brackets each block's mini-batches with `acquire` / `release`:

- `acquire` returns once the block's data is in memory: at once for a memory block or a disk block
  already reloaded; otherwise it waits, and that wait is the *load stall* it measures.
- after `acquire`, the next `prefetch` disk blocks of the plan start loading in the reload thread
  (off the event loop: decompression releases the GIL) while this block is processed;
- `release` drops a disk block's data right after use (unless its epoch pass stopped half-way at a
  clock boundary: the next clock resumes it, so it is kept for it).

`set_alpha` changes the ratio between steps (the worker's `AlphaTuner` does it per clock):
blocks that become disk blocks are written (if not on disk yet) and dropped, blocks that become
memory blocks are loaded and kept. Neither changes what is computed: the trajectory is the same
whatever alpha is.
"""
from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from psruntime.apps.blocks import DataBlock
from psruntime.spill.spill_store import SpillStore
from psruntime.training_pipeline import block_position


def disk_positions(num_blocks: int, alpha: float) -> set[int]:
    """Positions (0..num_blocks-1) of the disk blocks for ratio alpha, spread evenly."""
    alpha = min(1.0, max(0.0, alpha))
    return {i for i in range(num_blocks) if math.floor((i + 1) * alpha + 1e-9) > math.floor(i * alpha + 1e-9)}


class BlockReloader:
    """The disk blocks of one worker and their background reloading (see the module doc)."""

    def __init__(self, store: SpillStore, alpha: float = 0.0, prefetch: int = 1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.store = store
        self.alpha = alpha
        self.prefetch = max(0, prefetch)
        self.clock = clock
        self.disk: set[int] = set()                     # block indices whose data lives on disk
        self._loading: dict[int, Future[dict[str, np.ndarray]]] = {}
        self._resident: dict[int, DataBlock] = {}      # disk blocks whose data is in memory now
        self._plan: list[DataBlock] = []
        self._pool: ThreadPoolExecutor | None = None
        # Cumulative figures (the worker reports them; the tuner differences them per step).
        self.stall_s = 0.0
        self.loads = 0
        self.spilled_bytes = 0                          # bytes written (compressed)

    # -- which blocks are on disk ------------------------------------------------------------
    def admit(self, num_blocks: int, position: int, block: DataBlock) -> None:
        """Take a freshly generated `block`, at `position` of a partition of `num_blocks` blocks:
        spill it now if it is a disk block, so a partition larger than memory never is in memory
        at once."""
        if position in disk_positions(num_blocks, self.alpha):
            self._spill(block)

    def set_alpha(self, blocks: Sequence[DataBlock], alpha: float) -> None:
        """Make the disk blocks of `blocks` those of ratio `alpha` (between steps)."""
        self.alpha = min(1.0, max(0.0, alpha))
        want = {blocks[i].block_index for i in disk_positions(len(blocks), self.alpha)}
        for b in blocks:
            if b.block_index in want and b.block_index not in self.disk:
                self._spill(b)
            elif b.block_index not in want and b.block_index in self.disk:
                self.materialize(b)

    def rebalance(self, blocks: Sequence[DataBlock]) -> None:
        """The worker's blocks changed between steps (EPS gave it splits or took some): make as many
        of them disk blocks as alpha says, moving as few as can be -- the disk blocks beyond that
        count are loaded back (the last ones), memory blocks missing from it are spilled (the last
        ones: arrivals come in split order). Left in memory, splits a worker was given stayed
        there all (the memory-bound case spill is for); chosen afresh by position, as set_alpha
        does, most blocks flipped at every arrival, each flip to memory a read on the loop."""
        want = len(disk_positions(len(blocks), self.alpha))
        on_disk = [b for b in blocks if b.block_index in self.disk]
        in_memory = [b for b in blocks if b.block_index not in self.disk]
        for b in on_disk[want:]:
            self.materialize(b)
        need = want - len(on_disk)
        for b in in_memory[len(in_memory) - need:] if need > 0 else ():
            self._spill(b)

    def _spill(self, block: DataBlock) -> None:
        if not self.store.contains(self.store.input_name(block.block_index)):
            self.spilled_bytes += self.store.put_input(block)
        self.disk.add(block.block_index)
        self._resident.pop(block.block_index, None)
        block.data = {}

    def materialize(self, block: DataBlock) -> None:
        """Make `block` a memory block again, its data loaded and kept (also before the block
        leaves this worker: EPS sends its data). Its spill file stays: the data never changes."""
        if block.block_index not in self.disk:
            return
        fut = self._loading.pop(block.block_index, None)
        if block.block_index not in self._resident:
            block.data = fut.result() if fut is not None else self._load(block.block_index)
        self.disk.discard(block.block_index)
        self._resident.pop(block.block_index, None)

    def forget(self, keep: Sequence[DataBlock]) -> None:
        """Drop what is known of blocks no longer held (those not in `keep`)."""
        held = {b.block_index for b in keep}
        for idx in list(self.disk - held):
            self.disk.discard(idx)
            self._resident.pop(idx, None)
            fut = self._loading.pop(idx, None)
            if fut is not None:
                fut.cancel()

    # -- the pipeline's side (psruntime.training_pipeline.BlockResidency) ---------------------
    def plan(self, blocks: Sequence[DataBlock]) -> None:
        """The blocks the coming step visits, in order. Disk blocks loaded for an earlier step
        and not among the first to visit now are dropped."""
        self._plan = list(blocks)
        # The first block may be one a clock boundary split (kept loaded for this step).
        keep = {b.block_index for b in self._plan[:1]} | {b.block_index for b in self._upcoming(0)}
        for idx, b in list(self._resident.items()):
            if idx not in keep:
                self._drop(b)
        for idx in list(self._loading):
            if idx not in keep:
                self._loading.pop(idx).cancel()
        self._prefetch_after(-1)

    async def acquire(self, block: DataBlock) -> None:
        idx = block.block_index
        if idx in self.disk and idx not in self._resident:
            # The load stays listed while it is awaited: a `materialize` meanwhile (EPS sending the
            # block's data while training waits for it) takes its result instead of loading the
            # block a second time, and the block is then a memory block -- not resident, which
            # `release` would drop with its spill file gone, its data lost for good.
            fut = self._loading.get(idx)
            if fut is None:
                fut = self._loading[idx] = self._submit(idx)
            t0 = self.clock()
            try:
                data = await asyncio.wrap_future(fut)
            finally:
                if self._loading.get(idx) is fut:
                    del self._loading[idx]
            self.stall_s += self.clock() - t0
            if idx in self.disk:
                block.data = data
                self._resident[idx] = block
        pos = next((i for i, b in enumerate(self._plan) if b is block), None)
        if pos is not None:
            self._prefetch_after(pos)

    def release(self, block: DataBlock) -> None:
        if block.block_index in self._resident and _pass_complete(block):
            self._drop(block)

    # -- loading -----------------------------------------------------------------------------
    def _upcoming(self, pos: int) -> list[DataBlock]:
        """The next `prefetch` disk blocks of the plan after position `pos`."""
        out = [b for b in self._plan[pos + 1:] if b.block_index in self.disk][:self.prefetch]
        return out

    def _prefetch_after(self, pos: int) -> None:
        for b in self._upcoming(pos):
            if b.block_index not in self._resident and b.block_index not in self._loading:
                self._loading[b.block_index] = self._submit(b.block_index)

    def _submit(self, idx: int) -> Future[dict[str, np.ndarray]]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reload")
        return self._pool.submit(self._load, idx)

    def _load(self, idx: int) -> dict[str, np.ndarray]:
        data = self.store.get_input(idx).data
        self.loads += 1
        return data

    def _drop(self, block: DataBlock) -> None:
        block.data = {}
        self._resident.pop(block.block_index, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _pass_complete(block: DataBlock) -> bool:
    """The block's latest epoch pass reached its last row (or it was never trained: init, objective)."""
    _, row = block_position(block)
    return row == 0 or row >= block.num_rows
