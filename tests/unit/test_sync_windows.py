"""The worker's training pipeline in sync windows (the job's sync_batches; psruntime.write_back_cache)
against in-process executors on localhost sockets: a window pushes once, may span blocks and moves
their positions past it, a clock ends at a window's end, a stopped window pushes nothing, and a
clock run again with another size applies each mini-batch once. (One worker training the sequential loop in
windows is in test_training_pipeline.py.)"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from psruntime.apps.base import StepContext
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.training_pipeline import Subtask, TrainingPipeline, TrainingStopped, epoch_position, set_epoch_position
from psruntime.wire.dataplane import DataPlaneClient
from recording_runner import RecordingRunner
from store_cluster import executor_cluster, mlr_half

NUM_BLOCKS = 8


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    async with executor_cluster(2, NUM_BLOCKS) as c:
        yield c


def windowed(k: int, runner: Any = None) -> TrainingPipeline:
    p = TrainingPipeline(runner)
    p.sync_batches = k
    return p


async def test_a_window_pushes_once_spans_blocks_and_a_clock_ends_at_a_windows_end(cluster) -> None:
    app, store, blocks = await mlr_half(cluster)
    batch_rows = int(app.hparams.batch_size)
    per_block = [len(list(app.batches(b))) for b in blocks]
    assert per_block[0] % 3 == 2       # block 0's second window takes block 1's first mini-batch
    runner = RecordingRunner()
    pipeline = windowed(3, runner)
    # A limit of 2 runs to the end of the first window: 3 mini-batches, one push (and the step's
    # closing flush, a PUSH subtask of its own).
    first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=2, count_key="audit")
    assert first.batches == 3 and runner.kinds.count(Subtask.PUSH) == 1 + 1 and runner.kinds.count(Subtask.COMP) == 3
    assert epoch_position(blocks[0], 0) == 3 * batch_rows
    # The next window: the rest of block 0 and the start of block 1, in one pull and one push.
    second = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=1, count_key="audit")
    assert second.batches == 3 and runner.kinds.count(Subtask.PULL) == 2 and runner.kinds.count(Subtask.PUSH) == 2 + 2
    assert epoch_position(blocks[0], 0) == blocks[0].num_rows and epoch_position(blocks[1], 0) == batch_rows
    rest = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), count_key="audit")
    assert first.batches + second.batches + rest.batches == sum(per_block)
    windows = 2 + -(-rest.batches // 3)
    assert runner.kinds.count(Subtask.PULL) == windows and runner.kinds.count(Subtask.PUSH) == windows + 3
    assert all(epoch_position(b, 0) == b.num_rows for b in blocks)
    audit = await store.get("audit")       # one count per mini-batch, in a push per window
    assert audit is not None and int(audit[0]) == sum(per_block)


async def test_a_stopped_window_pushes_nothing_and_keeps_its_blocks_position(cluster) -> None:
    app, store, blocks = await mlr_half(cluster)
    stop = asyncio.Event()
    comps = 0

    def after(kind: Subtask) -> None:
        nonlocal comps
        comps += kind is Subtask.COMP
        if comps == 4:          # in the second window of 3
            stop.set()
    runner = RecordingRunner(after)
    assert len(list(app.batches(blocks[0]))) >= 5
    with pytest.raises(TrainingStopped):
        await windowed(3, runner).run_batches(app, store, blocks, StepContext(0, 2), stop=stop, count_key="audit")
    assert runner.kinds.count(Subtask.PUSH) == 1 and runner.kinds.count(Subtask.COMP) == 4
    assert epoch_position(blocks[0], 0) == 3 * int(app.hparams.batch_size)
    await store.flush()
    audit = await store.get("audit")
    assert audit is not None and int(audit[0]) == 3


async def test_a_clock_run_again_with_another_size_applies_each_mini_batch_once(cluster) -> None:
    # As a replacement worker runs a lost worker's clock again: from the clock's first positions,
    # here with another batch limit. The windows depend only on the blocks and their positions, so
    # the redo pushes the same windows -- one of them spanning two blocks -- under the same ids and
    # the servers drop the ones they applied.
    app, store, blocks = await mlr_half(cluster)
    per_block = [len(list(app.batches(b))) for b in blocks]
    pipeline = windowed(3)
    first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=4, count_key="audit")
    assert epoch_position(blocks[1], 0) > 0           # the second window went into block 1
    for b in blocks:
        set_epoch_position(b, 0, 0)
    again = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=1, count_key="audit")
    assert (first.batches, again.batches) == (6, 3)     # each to a window's end
    await pipeline.run_batches(app, store, blocks, StepContext(0, 2), count_key="audit")
    audit = await store.get("audit")
    assert audit is not None and int(audit[0]) == sum(per_block)
