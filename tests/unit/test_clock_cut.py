"""A step that waits for the clock boundary ends the running clock early (EndClock): the workers
stop after their mini-batch in progress, flushed, and the epoch goes on from there in the next
clock -- so an EPS switch-over waits about one mini-batch, not the rest of a clock.

On the real AM over in-process executors (tests/support/ps_inprocess.py): a worker is held in
the middle of a clock that is its whole pass of the epoch until an EPS add offers its commit;
the clock then ends early, the epoch takes a second clock, and every mini-batch is still applied
exactly once (the audit). And the worker's pipeline on its own: a cut ends the step like its
batch limit, not like a stop (no error), and the next step goes on where it ended."""
from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable

from protocol.records import FinalStatus
from psruntime.apps.base import StepContext
from psruntime.executor import Executor
from psruntime.training_pipeline import Subtask, TrainingPipeline, epoch_position, set_epoch_position
from ps_inprocess import SPEC, PsJob
from store_cluster import executor_cluster, mlr_half

BATCHES_PER_WORKER_EPOCH = 2000 // 50 // 2      # MLR's default data: 2000 rows, batches of 50, 2 workers


class HoldsAtBatch:
    """worker-0's subtask runner: before its mini-batch number `at` (counted over the job) it
    starts `change` and waits until that change offers a boundary step (`wanted`)."""

    def __init__(self, executor: Executor, at: int, change: Callable[[], None], wanted: asyncio.Event,
                 kind: Subtask = Subtask.PULL) -> None:
        self.executor, self.at, self.change, self.wanted = executor, at, change, wanted
        self.kind = kind          # the subtask it holds at (in sync windows not every batch pulls)
        self.fired = False

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        if kind is self.kind and not self.fired and self.executor.app_role.pipeline.counters["batches"] == self.at:
            self.fired = True
            self.change()
            await self.wanted.wait()
        return await work()


def add_a_worker_when_held(job: PsJob, at: int, kind: Subtask) -> list[asyncio.Future[Any]]:
    """worker-0 holds before its mini-batch `at` (at that subtask) while an EPS add of one worker
    is asked for, until the add offers its boundary step; the add's future is in the list."""
    wanted = asyncio.Event()
    boundaries = job.loop.boundaries
    offer = boundaries.at_boundary

    def at_boundary(fn: Any) -> Any:
        wanted.set()
        return offer(fn)
    boundaries.at_boundary = at_boundary
    scaled: list[asyncio.Future[Any]] = []

    def change() -> None:
        scaled.append(asyncio.ensure_future(job.master.request_scale(1, 0)))

    def on_launch(eid: str, ex: Executor) -> None:
        if eid == "worker-0":
            ex.app_role.pipeline.runner = HoldsAtBatch(ex, at, change, wanted, kind)
    job.am.on_launch = on_launch
    return scaled


async def test_an_eps_commit_ends_the_running_clock_early_and_every_batch_runs_once(tmp_path: Path) -> None:
    # One clock is a worker's whole pass of the epoch: without the cut, a commit offered in it
    # would wait for the epoch's end.
    job = PsJob(tmp_path / "job", {**SPEC, "max_epochs": 3, "clock_batches": BATCHES_PER_WORKER_EPOCH})
    try:
        # in epoch 1, before worker-0's 4th mini-batch
        scaled = add_a_worker_when_held(job, BATCHES_PER_WORKER_EPOCH + 3, Subtask.PULL)
        clocks: Counter[int] = Counter()
        job.trigger_after_clock(lambda: clocks.update([job.loop.epochs_done]))

        assert await job.run() is FinalStatus.SUCCEEDED
        [records] = [await s for s in scaled]
        assert [(r.op, r.ok) for r in records] == [("add_workers", True)], records
        assert records[0].splits_moved > 0
        # Epoch 0 in one clock; epoch 1's clock was cut at the commit and a second one finished it.
        assert clocks[0] == 1 and clocks[1] >= 2, clocks
        loop = job.loop
        assert [e.epoch for e in job.epochs] == [0, 1, 2]
        assert loop.audit_mismatches == [], loop.audit_mismatches
        assert loop.minibatches_applied == loop.minibatches_run == 3 * 2 * BATCHES_PER_WORKER_EPOCH
    finally:
        await job.close()


async def test_in_sync_windows_an_eps_commit_cuts_the_clock_at_a_windows_end_and_every_batch_runs_once(
        tmp_path: Path) -> None:
    # Windows of 3 (sync_batches): the cut is asked for in the middle of a window; the worker
    # finishes that window, the new worker takes splits where it ended, and the exactly-once
    # audit holds.
    job = PsJob(tmp_path / "job", {**SPEC, "max_epochs": 3, "clock_batches": BATCHES_PER_WORKER_EPOCH,
                                   "sync_batches": 3})
    try:
        # in epoch 1, before worker-0's 5th mini-batch: the second window's middle
        scaled = add_a_worker_when_held(job, BATCHES_PER_WORKER_EPOCH + 4, Subtask.COMP)
        steps: list[tuple[str, int]] = []          # (worker, mini-batches) of every step run
        job.loop.metrics.batch_listeners.append(lambda worker, compute, _comm: steps.append((worker, len(compute))))
        # Where every input block stands after each clock.
        rows = {b.block_index: b.num_rows for b in job.app.generate_partition(0, 1).blocks}
        stood: list[int] = []
        job.trigger_after_clock(lambda: stood.extend(
            row for _, row in job.loop.clock_start_positions(range(job.app.num_blocks)).values()))
        assert await job.run() is FinalStatus.SUCCEEDED
        [records] = [await s for s in scaled]
        assert [(r.op, r.ok) for r in records] == [("add_workers", True)], records
        assert records[0].splits_moved > 0
        loop = job.loop
        assert [e.epoch for e in job.epochs] == [0, 1, 2]
        assert loop.audit_mismatches == [], loop.audit_mismatches
        assert loop.minibatches_applied == loop.minibatches_run == 3 * 2 * BATCHES_PER_WORKER_EPOCH
        # worker-0's epoch-1 step was cut, past the mini-batch it was held at, at a window's end
        # (where its step began, windows are runs of 3 over its blocks).
        first, cut, *_ = [n for worker, n in steps if worker == "worker-0"]
        assert first == BATCHES_PER_WORKER_EPOCH and 4 < cut < BATCHES_PER_WORKER_EPOCH and cut % 3 == 0, steps
        assert any(0 < r < max(rows.values()) for r in stood)          # some clock ended mid-block
    finally:
        await job.close()


async def test_a_cut_ends_the_pipelines_step_after_the_batch_in_progress() -> None:
    async with executor_cluster(2, 8) as cluster:
        app, store, blocks = await mlr_half(cluster)
        pipeline = TrainingPipeline()
        cut = asyncio.Event()
        batch = int(app.hparams.batch_size)

        async def cut_in_first_batch(kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
            result = await work()
            if kind is Subtask.PUSH:
                cut.set()
            return result
        pipeline.runner.run = cut_in_first_batch     # type: ignore[method-assign]
        first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=5, cut=cut)
        assert first.batches == 1 and epoch_position(blocks[0], 0) == batch    # that batch counts
        cut.clear()
        rest = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=2, cut=cut)
        assert rest.batches == 1 and epoch_position(blocks[0], 0) == 2 * batch  # goes on from there


async def test_a_cut_during_a_pull_ends_the_step_before_that_batch_or_window_runs() -> None:
    # The AM's EndClock arriving while a batch (or a sync window) pulls: nothing of it was computed
    # or pushed, so the step ends there -- a commit waits for the pull, not also for the COMP --
    # and the next step runs it from the same position.
    async with executor_cluster(2, 8) as cluster:
        app, store, blocks = await mlr_half(cluster)
        batch = int(app.hparams.batch_size)
        for k, done in ((1, 1), (3, 3)):
            for b in blocks:
                set_epoch_position(b, 0, 0)
            pipeline = TrainingPipeline()
            pipeline.sync_batches = k
            cut = asyncio.Event()
            kinds: list[Subtask] = []

            async def cut_in_second_pull(kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
                kinds.append(kind)
                if kind is Subtask.PULL and kinds.count(Subtask.PULL) == 2:
                    cut.set()
                return await work()
            pipeline.runner.run = cut_in_second_pull     # type: ignore[method-assign]
            first = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=20, cut=cut)
            assert first.batches == done, (k, kinds)
            assert kinds.count(Subtask.PUSH) == done // k + 1        # its windows' and the closing flush
            assert epoch_position(blocks[0], 0) == done * batch
            cut.clear()
            rest = await pipeline.run_batches(app, store, blocks, StepContext(0, 2), limit=1, cut=cut)
            assert rest.batches == k                                          # goes on from there
            assert sum(epoch_position(b, 0) for b in blocks) == (done + k) * batch
            pipeline.close()
