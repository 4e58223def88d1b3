"""The WORKER role's training loop: PULL (blocking) -> COMP -> PUSH (asynchronous) per mini-batch.

Written against the app interface of psruntime.apps.base. One clock is one epoch: at the end of an
epoch a worker flushes its pushes (so servers hold them), ticks its clock and, under BSP, waits for
every other worker to finish the epoch before computing its objective part and starting the next.
Per mini-batch it reports compute and communication time (what the AM's optimizer needs).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from psruntime.apps.base import KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.clock_client import RemoteClock
from psruntime.store_client import StoreClient

INIT_CHUNK_KEYS = 4096


@dataclass(frozen=True)
class BatchReport:
    """Timing of one mini-batch (seconds): pull and push are COMM, compute is COMP."""

    epoch: int
    block_index: int
    rows: int
    pull_s: float
    compute_s: float
    push_s: float


@dataclass(frozen=True)
class EpochReport:
    """One epoch of one worker: its objective part (after the clock) and summed timings."""

    epoch: int
    objective: ObjectivePart
    batches: int
    compute_s: float
    comm_s: float
    clock: int


async def pull_key_values(store: StoreClient, keys: np.ndarray, key_length: int) -> KeyValues:
    """Pull int64 `keys` as a KeyValues (a key never written reads as zeros).

    One array-form request per owner: the reply's (len(keys), key_length) float32 array is used as
    is (with one owner) or gathered once, with no Python work per key.
    """
    values, _found = await store.pull_array(keys, (key_length,), np.float32)
    return KeyValues(keys, values)


async def push_key_values(store: StoreClient, deltas: KeyValues | None) -> None:
    """Push `deltas` (value += delta at the owners) as one array-form update per owner."""
    if deltas is not None and len(deltas):
        await store.push_array(deltas.keys, deltas.values)


async def init_model(store: StoreClient, app: PSApp) -> None:
    """Put every model key's initial value (done once per job, by the AM or the first worker)."""
    keys = app.model_keys()
    for start in range(0, len(keys), INIT_CHUNK_KEYS):
        chunk = keys[start:start + INIT_CHUNK_KEYS]
        await store.put_array(chunk, app.init_value(chunk))


class WorkerLoop:
    """Trains `app` on `blocks` against the store, in step with the other workers via `clock`."""

    def __init__(self, app: PSApp, blocks: Sequence[DataBlock], store: StoreClient,
                 clock: RemoteClock | None = None, num_workers: Callable[[], int] | int = 1,
                 on_batch: Callable[[BatchReport], None] | None = None) -> None:
        self.app = app
        self.blocks = list(blocks)
        self.store = store
        self.clock = clock
        self._num_workers = num_workers
        self._on_batch = on_batch
        self.clock_value = 0

    def num_workers(self) -> int:
        return self._num_workers() if callable(self._num_workers) else self._num_workers

    async def initialise(self) -> None:
        """Initialise each block's local state and push the deltas that come with it."""
        for block in self.blocks:
            await push_key_values(self.store, self.app.init_block(block))
        await self.store.flush()

    async def run_epoch(self, epoch: int, stop: asyncio.Event | None = None) -> EpochReport:
        app = self.app
        n_batches, comp, comm = 0, 0.0, 0.0
        for block in self.blocks:
            for batch in app.batches(block):
                if stop is not None and stop.is_set():
                    break
                t0 = time.perf_counter()
                params = await pull_key_values(self.store, app.keys_for_batch(batch), app.key_length)
                t1 = time.perf_counter()
                deltas = app.compute(batch, params, StepContext(epoch, self.num_workers()))
                t2 = time.perf_counter()
                await push_key_values(self.store, deltas)
                t3 = time.perf_counter()
                del params, deltas   # not held across the next batch's pull (the worker's peak)
                n_batches += 1
                comp += t2 - t1
                comm += (t1 - t0) + (t3 - t2)
                if self._on_batch is not None:
                    self._on_batch(BatchReport(epoch, block.block_index, batch.size, t1 - t0, t2 - t1, t3 - t2))
        await self.store.flush()  # BSP: this epoch's pushes are applied before the clock moves
        if self.clock is not None:
            self.clock_value = await self.clock.tick()
        else:
            self.clock_value += 1
        part = ObjectivePart()
        for block in self.blocks:
            part = part + app.objective(block, await pull_key_values(self.store, app.objective_keys(block),
                                                                     app.key_length))
        return EpochReport(epoch, part, n_batches, comp, comm, self.clock_value)

    async def run(self, epochs: int, stop: asyncio.Event | None = None) -> list[EpochReport]:
        reports = []
        for epoch in range(epochs):
            if stop is not None and stop.is_set():
                break
            reports.append(await self.run_epoch(epoch, stop))
        return reports
