"""A server's model blocks on local disk when spilling input is not enough (dissertation §4.3.3).

Harmony spills model data only as a last resort: a subtask may touch the whole model, so a model
block must be back in memory before the access that needs it (no streaming), and since model
blocks are mutable each is written out in full when it is spilled (checkpointed: the store's
`BlockArrays` in the checkpoint wire form, `psruntime.store.checkpoint.pack_blocks`, as an lz4 frame of
the worker-side `SpillStore`). In this runtime servers hold the model and workers the input, so a
server has no input left to spill: when a job spills (`spill_alpha` set) its servers watch their
own memory, and one at or past the hard pressure limit (`alpha_tuner.HARD_PRESSURE` x its
container's memory) spills its largest model block, one per check, until it is below it.

`ModelSpill` is the store's `SpilledBlocks`: a spilled block stays held by its server (ownership,
migration and checkpoints see no difference); `BlockStore` brings it back on its next access (a
pull, a push, a move, a checkpoint), and the file is removed then, since the block will change.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from psruntime.spill.alpha_tuner import HARD_PRESSURE
from psruntime.store.block_store import BlockArrays, BlockStore
from psruntime.store.migration import BlockState
from psruntime.spill.spill_store import SpillStore
from psruntime.store.store_service import StoreService

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 1.0


class ModelSpill:
    """The model blocks of one store that are on disk (a `block_store.SpilledBlocks`)."""

    def __init__(self, store: BlockStore, files: SpillStore) -> None:
        self.store = store
        self.files = files
        self._held: set[int] = set()
        self.spills = 0
        self.reloads = 0

    def blocks(self) -> list[int]:
        return sorted(self._held)

    def holds(self, block: int) -> bool:
        return block in self._held

    def spill(self, block: int) -> int:
        """Write `block` out (all of it: it is mutable) and drop it from memory; returns the bytes
        on disk. Written first: a write that fails (disk full) leaves the block in memory, whole."""
        data = self.store.export_arrays(block)
        written = self.files.put_model(block, data)
        self.store.drop_block(block)
        self._held.add(block)
        self.spills += 1
        return written

    def take(self, block: int) -> BlockArrays:
        data = self.files.get_model(block, self.store.num_blocks)
        self.forget(block)
        self.reloads += 1
        return data

    def forget(self, block: int) -> None:
        if block in self._held:
            self._held.discard(block)
            self.files.discard(self.files.model_name(block))

    def nbytes(self) -> int:
        return sum(self.files.nbytes_of(self.files.model_name(b)) for b in self._held)


def block_to_spill(sizes: dict[int, int]) -> int | None:
    """The block to spill next: the largest in memory (ties: the lowest id); None if none is."""
    nonempty = {b: n for b, n in sizes.items() if n > 0}
    if not nonempty:
        return None
    return min(nonempty, key=lambda b: (-nonempty[b], b))


class ModelSpillMonitor:
    """Watches a server's memory and spills model blocks at the hard pressure limit."""

    def __init__(self, service: StoreService, files: SpillStore, limit_bytes: int, rss: Callable[[], int],
                 hard: float = HARD_PRESSURE) -> None:
        self.service = service
        self.spill = ModelSpill(service.store, files)
        service.store.spilled = self.spill
        self.limit_bytes = limit_bytes
        self.rss = rss
        self.hard = hard
        self._task: asyncio.Task[None] | None = None

    def check(self) -> int | None:
        """One check: the block spilled, or None (below the limit, or nothing left to spill)."""
        if self.limit_bytes <= 0 or self.rss() < self.hard * self.limit_bytes:
            return None
        store = self.service.store
        sizes = {b: store.block_nbytes(b) for b in self.service.owned_blocks()
                 if store.in_memory(b) and self.service.states.state(b) is BlockState.OWNED}
        block = block_to_spill(sizes)
        if block is not None:
            written = self.spill.spill(block)
            log.info("memory at %.0f%% of the limit: model block %d spilled (%d bytes on disk)",
                     100 * self.rss() / self.limit_bytes, block, written)
        return block

    def start(self, interval_s: float = CHECK_INTERVAL_S) -> None:
        if self._task is None and self.limit_bytes > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(interval_s))

    async def _run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a failed spill leaves the block in memory; keep serving
                log.exception("model block spill failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def figures(self) -> dict[str, int]:
        return {"spilled_bytes": self.spill.nbytes(), "model_blocks_spilled": len(self.spill.blocks()),
                "model_spills": self.spill.spills, "model_reloads": self.spill.reloads}
