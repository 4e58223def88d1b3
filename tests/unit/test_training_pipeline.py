"""The worker's training pipeline against in-process executors on localhost sockets: it trains
(through a block migration too) exactly as a sequential loop would, COMP runs off the event loop
(but for one after a COMP of under INLINE_MAX_S, which runs inline),
a runner sees every subtask in order, and a batch limit stops mid-epoch and resumes."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from psruntime.apps.base import Batch, KeyValues, PSApp, StepContext
from psruntime.apps.registry import create_app
from psruntime.apps.single_process import DenseModel
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.store_client import StoreClient
from psruntime.training_pipeline import (INLINE_MAX_S, POSITION, ComputeThread, Resource, Subtask, TrainingPipeline,
                                         TrainingStopped,
                                         epoch_position, init_blocks, init_model, pull_key_values)
from recording_runner import RecordingRunner
from store_cluster import executor_cluster

NUM_BLOCKS = 8


class RecordingApp:
    """The real app, with a compute that notes which batch it ran and on which thread."""

    def __init__(self, app: PSApp) -> None:
        self._app = app
        self.computed: list[tuple[int, int]] = []
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        self.computed.append((batch.block.block_index, batch.start))
        self.threads.add(threading.get_ident())
        return self._app.compute(batch, params, ctx)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    async with executor_cluster(2, NUM_BLOCKS) as c:
        yield c


async def _store(ctl: MigrationController, dp: DataPlaneClient, app: PSApp) -> StoreClient:
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    return store


def test_subtasks_name_the_resource_they_use() -> None:
    assert [k.resource for k in Subtask] == [Resource.COMM, Resource.CPU, Resource.COMM]


@pytest.mark.parametrize("name,sync_batches", [("mlr", 1), ("lda", 1), ("mlr", 3), ("lda", 3), ("nmf", 3)])
async def test_one_worker_trains_exactly_as_a_sequential_loop(cluster, name: str, sync_batches: int) -> None:
    # sync_batches 3: in sync windows (psruntime.write_back_cache) the same loop, up to rounding.
    _, ctl, dp = cluster
    app = create_app(name, preset="tiny")
    store = await _store(ctl, dp, app)
    blocks = app.generate_partition(0, 1).blocks
    await init_blocks(store, app, blocks)
    pipeline = TrainingPipeline()
    pipeline.sync_batches = sync_batches
    for epoch in range(2):
        await pipeline.run_batches(app, store, blocks, StepContext(epoch, 1))
    # The reference: the same math in one loop on a dense in-memory model (single_process).
    ref_blocks = app.generate_partition(0, 1).blocks
    model = DenseModel(app)
    for block in ref_blocks:
        model.push(app.init_block(block))
    for epoch in range(2):
        for block in ref_blocks:
            for batch in app.batches(block):
                model.push(app.compute(batch, model.pull(app.keys_for_batch(batch)), StepContext(epoch, 1)))
    trained = await pull_key_values(store, app.model_keys(), app.key_length)
    if sync_batches == 1 or name == "lda":
        # LDA's counts: float32 sums of integers are exact in windows too, so its samples are.
        np.testing.assert_array_equal(trained.values, model.values)
        for b, r in zip(blocks, ref_blocks):
            for k, v in r.state.items():
                np.testing.assert_array_equal(b.state[k], v)
    else:
        # The server adds base + (row - base) where the loop added each delta: float32 rounding only.
        np.testing.assert_allclose(trained.values, model.values, rtol=1e-4, atol=1e-5)
    assert pipeline.counters["batches"] == 2 * sum(len(list(app.batches(b))) for b in blocks)


async def test_two_workers_train_through_a_migration_and_the_loss_falls(cluster) -> None:
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = await _store(ctl, dp, app)
    moves: list[asyncio.Task[int]] = []

    def move_block_3(kind: Subtask) -> None:
        # Every few pushes of worker 0, block 3 of the model changes owner while training goes on.
        if kind is Subtask.PUSH and len(runner.kinds) % 9 == 0 and (not moves or moves[-1].done()):
            src = ctl.table.owner_of_block(3)
            moves.append(asyncio.create_task(ctl.move([3], src, "e1" if src == "e0" else "e0")))

    runner = RecordingRunner(move_block_3)
    workers = [(TrainingPipeline(runner if i == 0 else None), app.generate_partition(i, 2).blocks) for i in range(2)]
    for _, blocks in workers:
        await init_blocks(store, app, blocks)
    objectives = []
    for epoch in range(3):
        await asyncio.gather(*(p.run_batches(app, store, blocks, StepContext(epoch, 2)) for p, blocks in workers))
        await asyncio.gather(*moves)
        parts = [await p.objective(app, store, blocks) for p, blocks in workers]
        objectives.append(app.combine(parts, [0.0]))
    versions = [m.result() for m in moves]          # each move recorded, one after the other
    assert len(versions) >= 3 and versions == sorted(set(versions))
    assert all(b < a for a, b in zip(objectives, objectives[1:])), objectives
    assert objectives[-1] < np.log(5)      # better than the untrained model's cross-entropy


async def test_comp_runs_off_the_event_loop(cluster) -> None:
    executors, ctl, dp = cluster
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    release = threading.Event()

    class GatedApp(RecordingApp):
        def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
            loop.call_soon_threadsafe(started.set)
            # On the event loop this wait would hold the loop, nothing below could release it, and
            # the step would fail here instead of hanging.
            assert release.wait(10), "COMP held the event loop"
            # A COMP this long sends the next one to the thread too (a short one may run inline).
            time.sleep(2 * INLINE_MAX_S)
            return super().compute(batch, params, ctx)

    inner = create_app("mlr", preset="tiny")
    app = GatedApp(inner)
    store = await _store(ctl, dp, inner)
    blocks = inner.generate_partition(0, 1).blocks
    step = asyncio.create_task(TrainingPipeline().run_batches(app, store, blocks, StepContext(0, 1), limit=2))
    await asyncio.wait_for(started.wait(), 10)
    # While the first COMP is held: a timer callback fires, and an executor serves a request and a pull.
    fired = asyncio.Event()
    loop.call_soon(fired.set)
    await asyncio.wait_for(fired.wait(), 10)
    assert (await dp.request(executors[0].address, {"op": "ping"})).header["op"] == "ok"
    pulled = await pull_key_values(StoreClient(ctl.table, dp), np.arange(4, dtype=np.int64), inner.key_length)
    assert len(pulled) == 4 and not step.done()
    release.set()
    times = await asyncio.wait_for(step, 10)
    assert times.batches == 2 and threading.get_ident() not in app.threads and len(app.threads) == 1


async def test_a_short_comp_runs_on_the_loop_and_a_long_one_sends_the_next_to_the_thread() -> None:
    loop_thread = threading.get_ident()
    now = [0.0]
    compute = ComputeThread(clock=lambda: now[0])     # durations scripted, not measured

    def short() -> int:
        return threading.get_ident()                  # takes no time

    def long() -> int:
        now[0] += 2 * INLINE_MAX_S
        return threading.get_ident()

    try:
        ran = [await compute.call(fn) for fn in (short, short, short, long, short, short)]
    finally:
        compute.close()
    on_loop = [t == loop_thread for t in ran]
    # The first call has no measured predecessor: the thread. After a short one: inline; the call
    # after the long one: the thread again, then inline once more.
    assert on_loop == [False, True, True, True, False, True]


async def test_a_runner_sees_pull_comp_push_in_order_for_every_batch(cluster) -> None:
    _, ctl, dp = cluster
    inner = create_app("mlr", preset="tiny")
    app = RecordingApp(inner)
    store = await _store(ctl, dp, inner)
    blocks = inner.generate_partition(0, 2).blocks
    runner = RecordingRunner()
    times = await TrainingPipeline(runner).run_batches(app, store, blocks, StepContext(0, 2))
    n = sum(len(list(inner.batches(b))) for b in blocks)
    assert times.batches == len(app.computed) == n > 1
    # ... and the final flush is a PUSH too (it holds the link while the pushes are applied).
    assert runner.kinds == [Subtask.PULL, Subtask.COMP, Subtask.PUSH] * n + [Subtask.PUSH]
    assert len(times.compute) == len(times.comm) == n and min(times.compute + times.comm) >= 0


class WaitingRunner:
    """A WaitCounter runner whose every slot "waits" a fixed amount before its work (counted, not slept)."""

    WAIT = {Resource.CPU: 0.25, Resource.COMM: 0.125}

    def __init__(self) -> None:
        self.wait_s = {Resource.CPU: 0.0, Resource.COMM: 0.0}

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        self.wait_s[kind.resource] += self.WAIT[kind.resource]
        return await work()


async def test_the_step_times_say_how_much_of_each_batch_waited_for_a_grant(cluster) -> None:
    _, ctl, dp = cluster
    inner = create_app("mlr", preset="tiny")
    store = await _store(ctl, dp, inner)
    blocks = inner.generate_partition(0, 2).blocks
    times = await TrainingPipeline(WaitingRunner()).run_batches(inner, store, blocks, StepContext(0, 2))
    n = times.batches
    assert n > 1 and times.compute_wait == [0.25] * n
    # PULL and PUSH each waited; the last batch's flush (a PUSH too) counts in its communication
    assert times.comm_wait == [0.25] * (n - 1) + [0.375]
    # ... and without a counting runner nothing waited
    plain = await TrainingPipeline().run_batches(inner, store, blocks, StepContext(1, 2))
    assert plain.compute_wait == [0.0] * plain.batches == plain.comm_wait


async def test_a_batch_limit_stops_mid_epoch_and_the_next_step_resumes_there(cluster) -> None:
    _, ctl, dp = cluster
    inner = create_app("mlr", preset="tiny")
    app = RecordingApp(inner)
    store = await _store(ctl, dp, inner)
    blocks = inner.generate_partition(0, 2).blocks
    every_batch = [(b.block_index, batch.start) for b in blocks for batch in inner.batches(b)]
    pipeline = TrainingPipeline()
    first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=3, count_key="audit")
    assert first.batches == 3 and app.computed == every_batch[:3]
    assert epoch_position(blocks[0], 0) == 3 * int(inner.hparams.batch_size)
    rest = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), count_key="audit")
    assert app.computed == every_batch                       # each batch of the epoch once, in order
    assert first.batches + rest.batches == len(every_batch)
    assert all(epoch_position(b, 0) == b.num_rows for b in blocks)
    again = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), count_key="audit")
    assert again.batches == 0
    audit = await store.get("audit")          # the servers applied one count per mini-batch
    assert audit is not None and int(audit[0]) == len(every_batch)
    # The next epoch starts over from each block's first row.
    nxt = await pipeline.run_batches(app, store, blocks, StepContext(1, 2), limit=2)
    assert nxt.batches == 2 and app.computed[-2:] == every_batch[:2]
    assert [int(x) for x in blocks[0].state[POSITION]] == [1, 2 * int(inner.hparams.batch_size)]
    assert pipeline.counters["batches"] == len(every_batch) + 2


async def test_a_set_stop_event_ends_the_step_before_its_next_batch(cluster) -> None:
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = await _store(ctl, dp, app)
    blocks = app.generate_partition(0, 2).blocks
    stop = asyncio.Event()
    runner = RecordingRunner(lambda kind: stop.set() if kind is Subtask.PUSH else None)
    with pytest.raises(TrainingStopped, match="epoch 0 stopped"):
        await TrainingPipeline(runner).run_batches(app, store, blocks, StepContext(0, 2), stop=stop)
    assert runner.kinds == [Subtask.PULL, Subtask.COMP, Subtask.PUSH]
    assert epoch_position(blocks[0], 0) == int(app.hparams.batch_size)   # the batch that ran counts


async def test_app_setup_gives_a_comp_the_jobs_threads_or_the_containers_vcores(monkeypatch) -> None:
    monkeypatch.setenv("CONTAINER_VCORES", "4")
    e = Executor("worker-0", NUM_BLOCKS, role="worker")
    await e.start()
    dp = DataPlaneClient()
    try:
        await dp.request(e.address, {"op": "app_setup", "app": "mlr", "comp_threads": 3})
        assert e.app_role.pipeline.comp_threads == 3
        await dp.request(e.address, {"op": "app_setup", "app": "mlr"})        # unsaid: the vcores
        assert e.app_role.pipeline.comp_threads == 4
    finally:
        await dp.close()
        await e.stop()
