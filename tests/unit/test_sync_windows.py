"""The worker's training pipeline in sync windows (the job's sync_batches; psruntime.write_back_cache)
against in-process executors on localhost sockets: one worker trains the sequential loop, a window
pushes once and moves its block's position past it, a clock ends at a window's end, a stopped
window pushes nothing, and a clock run again with another size applies each mini-batch once."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from psruntime.apps.base import StepContext
from psruntime.apps.registry import create_app
from psruntime.apps.single_process import DenseModel
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.store_client import StoreClient
from psruntime.training_pipeline import (Subtask, TrainingPipeline, TrainingStopped, epoch_position, init_blocks,
                                         init_model, pull_key_values, set_epoch_position)
from psruntime.wire.dataplane import DataPlaneClient
from store_cluster import executor_cluster

NUM_BLOCKS = 8


class Kinds:
    """A runner that notes each subtask's kind; `after(kind)` (if set) runs after each."""

    def __init__(self, after: Callable[[Subtask], None] | None = None) -> None:
        self.kinds: list[Subtask] = []
        self.after = after

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        self.kinds.append(kind)
        result = await work()
        if self.after is not None:
            self.after(kind)
        return result


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    async with executor_cluster(2, NUM_BLOCKS) as c:
        yield c


def windowed(k: int, runner: Any = None) -> TrainingPipeline:
    p = TrainingPipeline(runner)
    p.sync_batches = k
    return p


@pytest.mark.parametrize("name", ["mlr", "lda", "nmf"])
async def test_one_worker_in_sync_windows_trains_the_sequential_loop(cluster, name: str) -> None:
    _, ctl, dp = cluster
    app = create_app(name, preset="tiny")
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 1).blocks
    await init_blocks(store, app, blocks)
    pipeline = windowed(3)
    for epoch in range(2):
        await pipeline.run_batches(app, store, blocks, StepContext(epoch, 1))
    ref_blocks = app.generate_partition(0, 1).blocks
    model = DenseModel(app)
    for block in ref_blocks:
        model.push(app.init_block(block))
    for epoch in range(2):
        for block in ref_blocks:
            for batch in app.batches(block):
                model.push(app.compute(batch, model.pull(app.keys_for_batch(batch)), StepContext(epoch, 1)))
    trained = await pull_key_values(store, app.model_keys(), app.key_length)
    if name == "lda":
        # Counts: float32 sums of integers are exact, so the samples -- and all else -- are too.
        np.testing.assert_array_equal(trained.values, model.values)
    else:
        # The server adds a window's sum where the loop added each delta: float32 rounding only.
        np.testing.assert_allclose(trained.values, model.values, rtol=1e-4, atol=1e-5)
    assert pipeline.counters["batches"] == 2 * sum(len(list(app.batches(b))) for b in blocks)


async def test_a_window_pushes_once_and_a_clock_ends_at_a_windows_end(cluster) -> None:
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 2).blocks
    batch_rows = int(app.hparams.batch_size)
    runner = Kinds()
    pipeline = windowed(3, runner)
    # A limit of 2 runs to the end of the first window: 3 mini-batches, one push (and the step's
    # closing flush, a PUSH subtask of its own).
    first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=2, count_key="audit")
    assert first.batches == 3 and runner.kinds.count(Subtask.PUSH) == 1 + 1 and runner.kinds.count(Subtask.COMP) == 3
    assert epoch_position(blocks[0], 0) == 3 * batch_rows
    rest = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), count_key="audit")
    per_block = [len(list(app.batches(b))) for b in blocks]
    assert first.batches + rest.batches == sum(per_block)
    windows = sum(-(-n // 3) for n in per_block)      # a block's last window may be shorter
    assert windows > len(blocks)
    assert runner.kinds.count(Subtask.PUSH) == windows + 2
    assert all(epoch_position(b, 0) == b.num_rows for b in blocks)
    audit = await store.get("audit")       # one count per mini-batch, in a push per window
    assert audit is not None and int(audit[0]) == sum(per_block)


async def test_a_stopped_window_pushes_nothing_and_keeps_its_blocks_position(cluster) -> None:
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 2).blocks
    stop = asyncio.Event()
    comps = 0

    def after(kind: Subtask) -> None:
        nonlocal comps
        comps += kind is Subtask.COMP
        if comps == 4:          # in the second window of 3
            stop.set()
    runner = Kinds(after)
    assert len(list(app.batches(blocks[0]))) >= 5
    with pytest.raises(TrainingStopped):
        await windowed(3, runner).run_batches(app, store, blocks, StepContext(0, 2), stop=stop, count_key="audit")
    assert runner.kinds.count(Subtask.PUSH) == 1 and runner.kinds.count(Subtask.COMP) == 4
    assert epoch_position(blocks[0], 0) == 3 * int(app.hparams.batch_size)
    await store.flush()
    audit = await store.get("audit")
    assert audit is not None and int(audit[0]) == 3


async def test_a_clock_run_again_with_another_size_applies_each_mini_batch_once(cluster) -> None:
    # As a replacement worker runs a lost worker's clock again: from the clock's first position,
    # here with another batch limit. Windows are fixed within a block, so the redo pushes the same
    # windows under the same ids and the servers drop the ones they applied.
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    blocks = app.generate_partition(0, 2).blocks
    per_block = [len(list(app.batches(b))) for b in blocks]
    pipeline = windowed(3)
    first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=4, count_key="audit")
    for b in blocks:
        set_epoch_position(b, 0, 0)
    again = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=1, count_key="audit")
    assert (first.batches, again.batches) == (5, 3)     # each to a window's end: a block's 3 + 2, then 3
    await pipeline.run_batches(app, store, blocks, StepContext(0, 2), count_key="audit")
    audit = await store.get("audit")
    assert audit is not None and int(audit[0]) == sum(per_block)
