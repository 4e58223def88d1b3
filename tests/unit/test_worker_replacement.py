"""A lost worker is replaced and training goes on from the clock it was lost in, against the real
AM (the PS-job controller and its interpreter) over real in-process executors
(tests/support/ps_inprocess.py: localhost sockets, no RM; a stand-in RM client starts new
executors in this event loop): the clock loop keeps each input block's position from the
run_clock replies, the controller's recovery puts a replacement in the lost worker's place with
its splits where they stood when the clock began, the clock runs again on it, and the servers drop
the pushes the lost worker had made already, so the exactly-once audit holds and the objective
stays that of an undisturbed run."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import pytest

from appmaster.ps.controller import Phase
from appmaster.ps.runtime.executor_pool import ExecutorState
from elastane_cli.ps_scale_command import change_rows
from protocol import codec
from protocol.records import FinalStatus
from protocol.shape_history import RebuildServerChange, RecoveryChange, ReplaceWorkerChange, ShapeChange, decode_history
from psruntime.executor import Executor
from psruntime.training_pipeline import Subtask
from ps_inprocess import SPEC, PsJob

BATCHES_PER_WORKER_EPOCH = 2000 // 50 // 2      # MLR's default data: 2000 rows, batches of 50


class DiesBeforeBatch:
    """A worker's subtask runner that kills its executor just before the mini-batch after its
    `n`-th (its pushes so far applied): as a process killed in the middle of a clock."""

    def __init__(self, executor: Executor, n: int, on_death: Callable[[], None],
                 kind: Subtask = Subtask.PULL) -> None:
        self.executor = executor
        self.n = n
        self.kind = kind          # the subtask it dies at (in sync windows not every batch pulls)
        self.on_death = on_death
        self.died = False
        self.stopping: Optional[asyncio.Future[None]] = None

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        role = self.executor.app_role
        if kind is self.kind and not self.died and role.pipeline.counters["batches"] == self.n:
            self.died = True
            assert role.store is not None
            await role.store.flush()
            # Its connections close, unanswered, and its container's exit is reported. (Stopping
            # is not awaited to its end here: the server waits for this very request's handler.)
            self.stopping = asyncio.ensure_future(self.executor.stop())
            await asyncio.sleep(0)          # one step: the stop closes every connection
            self.on_death()
            raise ConnectionError(f"{self.executor.executor_id} died")
        return await work()


@pytest.fixture
async def jobs(tmp_path: Path):
    made: list[PsJob] = []

    def make(spec: Optional[dict[str, Any]] = None) -> PsJob:
        job = PsJob(tmp_path / f"job{len(made)}", spec)
        made.append(job)
        return job

    yield make
    for j in made:
        await j.close()


def check_exact(job: PsJob) -> None:
    loop = job.loop
    assert [e.epoch for e in job.epochs] == list(range(job.spec.max_epochs))
    assert loop.audit_mismatches == [], loop.audit_mismatches
    assert loop.minibatches_applied == loop.minibatches_run == job.spec.max_epochs * 2 * BATCHES_PER_WORKER_EPOCH


def records(job: PsJob, kind: type) -> list[ShapeChange]:
    return [r for r in job.master.shape_history if isinstance(r, kind)]


def pause_after_clock(job: PsJob, n: int) -> asyncio.Event:
    """Training stops at the clock boundary after its `n`-th clock (no clock runs from then on
    until the test lets it run again); the event is set once it has stopped."""
    stopped = asyncio.Event()

    def hook() -> None:
        if job.loop.clocks_done == n and not stopped.is_set():
            job.master.steps.pause()
            stopped.set()
    job.trigger_after_clock(hook)
    return stopped


async def paused(job: PsJob, stopped: asyncio.Event) -> None:
    await asyncio.wait_for(stopped.wait(), 60)
    await asyncio.wait_for(job.master.interp.trained.wait(), 60)     # the train task has returned


async def test_a_worker_lost_mid_clock_is_replaced_and_its_clock_redone_exactly_once(jobs) -> None:
    reference = jobs()
    assert await reference.run() is FinalStatus.SUCCEEDED
    check_exact(reference)

    job = jobs()
    splits: list[int] = []
    # Dies in epoch 1, in its second clock (batches 5-8 of the epoch), after pushing two of them.
    die_at = BATCHES_PER_WORKER_EPOCH + SPEC["clock_batches"] + 2

    def on_death() -> None:
        splits.extend(job.master.steps.splits().active_of("worker-1"))
        job.report_lost("worker-1")

    def on_launch(eid: str, ex: Executor) -> None:
        if eid == "worker-1":
            ex.app_role.pipeline.runner = DiesBeforeBatch(ex, die_at, on_death)
    job.am.on_launch = on_launch
    assert await job.run() is FinalStatus.SUCCEEDED

    check_exact(job)
    [rec] = records(job, ReplaceWorkerChange)
    assert type(rec) is ReplaceWorkerChange and rec.changed and rec.error == "" and rec.clock_redone, rec
    assert rec.epochs_redone == 0 and rec.epoch == 1 and "worker-1 (" in rec.lost[0], rec
    assert rec.replacements == {"worker-1": "worker-2"}
    assert job.job.failures == 1 and job.master.replacements == 1 and job.master.recoveries == 1
    assert not records(job, RecoveryChange)                   # no checkpoint was gone back to
    # The ledger, the barrier and the replacement's record name the replacement with the lost splits.
    ledger = job.master.steps.splits()
    assert splits and ledger.active_of("worker-2") == splits and "worker-1" not in ledger.active
    assert job.training.membership.worker_ids() == ["worker-0", "worker-2"]
    assert job.pool.executors["worker-2"].blocks == splits
    assert job.pool.executors["worker-1"].state is ExecutorState.EXITED
    # The two mini-batches pushed before the loss were pushed again by the redo and dropped.
    repeats = sum(job.executor(s.executor_id).service.applied_pushes.repeats for s in job.pool.servers)
    assert repeats >= 2 * 2, repeats       # deltas and audit count of each, per block they reached
    # The positions the loop keeps: every block at the end of the last epoch.
    last = job.spec.max_epochs - 1
    assert job.loop.clock_start_positions(range(job.app.num_blocks)) == {
        b: (last, 250) for b in range(job.app.num_blocks)}
    final, want = job.epochs[-1].objective, reference.epochs[-1].objective
    assert abs(final - want) <= 0.01 * abs(want), (final, want)


async def test_in_sync_windows_a_worker_lost_mid_clock_has_its_clock_redone_exactly_once(jobs) -> None:
    # Windows of 2 mini-batches (sync_batches): the lost worker had pushed the clock's first window
    # and was in its second, unpushed, when it died. The redo pushes the first again under the same
    # push ids (dropped by the servers) and the second for the first time.
    spec = {**SPEC, "sync_batches": 2}
    reference = jobs(spec)
    assert await reference.run() is FinalStatus.SUCCEEDED
    check_exact(reference)

    job = jobs(spec)
    die_at = BATCHES_PER_WORKER_EPOCH + SPEC["clock_batches"] + 3

    def on_launch(eid: str, ex: Executor) -> None:
        if eid == "worker-1":
            ex.app_role.pipeline.runner = DiesBeforeBatch(ex, die_at, lambda: job.report_lost("worker-1"),
                                                          Subtask.COMP)
    job.am.on_launch = on_launch
    assert await job.run() is FinalStatus.SUCCEEDED

    check_exact(job)
    [rec] = records(job, ReplaceWorkerChange)
    assert rec.changed and rec.clock_redone and rec.epoch == 1, rec
    repeats = sum(job.executor(s.executor_id).service.applied_pushes.repeats for s in job.pool.servers)
    assert repeats >= 2, repeats           # the first window's deltas and count, dropped
    final, want = job.epochs[-1].objective, reference.epochs[-1].objective
    assert abs(final - want) <= 0.01 * abs(want), (final, want)


async def test_a_worker_lost_between_clocks_is_replaced_before_training_resumes(jobs) -> None:
    job = jobs()
    stopped = pause_after_clock(job, 1)
    job.start()
    await paused(job, stopped)                            # at a clock boundary: no clock runs
    job.kill("worker-0")
    await job.until(lambda: job.master.recoveries == 1 and job.job.change is None, "the replacement")
    assert job.job.phase is Phase.TRAINING and job.loop.clocks_done == 1
    job.master.interp.start_training()                    # training goes on where it stopped
    assert await job.run() is FinalStatus.SUCCEEDED
    check_exact(job)
    [rec] = records(job, ReplaceWorkerChange)
    assert type(rec) is ReplaceWorkerChange and not rec.clock_redone and rec.replacements == {"worker-0": "worker-2"}
    assert job.training.membership.worker_ids() == ["worker-1", "worker-2"]
    # What `elastane ps scale` reads of it, after the trip through the AM's /status JSON.
    [back] = decode_history(codec.loads(codec.dumps({"shape_history": [rec]}))["shape_history"])
    assert back == rec
    assert change_rows([back]) == [["replace", "-", "2/2", f"{rec.seconds:.2f}s", "-", f"{rec.lost_s:.3f}s", "+0"]]


async def test_two_workers_lost_together_get_one_replacement_each(jobs) -> None:
    # A host with both workers crashes: two losses, two replacement starts of one role running at
    # once. Each must take the executor in its own container (not both the first one ready), or
    # the second takeover names a worker nobody replaced and the job falls back to a checkpoint.
    job = jobs()
    stopped = pause_after_clock(job, 1)
    job.start()
    await paused(job, stopped)
    gate = job.am.launch_gate = asyncio.Event()           # both starts wait before either is up
    job.kill("worker-0")
    job.kill("worker-1")
    await job.until(lambda: len(job.am.asks) >= 4, "both replacements asked for")
    gate.set()
    await job.until(lambda: job.master.recoveries == 1 and job.job.change is None, "the replacement")
    job.master.interp.start_training()
    assert await job.run() is FinalStatus.SUCCEEDED
    check_exact(job)
    assert not records(job, RecoveryChange)
    [rec] = records(job, ReplaceWorkerChange)
    assert type(rec) is ReplaceWorkerChange and rec.error == "", rec
    assert sorted(rec.replacements) == ["worker-0", "worker-1"], rec.replacements
    assert sorted(rec.replacements.values()) == ["worker-2", "worker-3"], rec.replacements
    assert job.training.membership.worker_ids() == ["worker-2", "worker-3"]


async def test_the_clock_loop_keeps_where_each_block_stood(jobs) -> None:
    job = jobs()
    loop = job.loop
    assert loop.clock_start_positions([0, 5]) == {0: (0, 0), 5: (0, 0)}    # nothing trained yet
    seen: list[dict[int, tuple[int, int]]] = []
    job.trigger_after_clock(lambda: seen.append(loop.clock_start_positions(range(8))))
    assert await job.run() is FinalStatus.SUCCEEDED
    per_clock = SPEC["clock_batches"] * 50
    # Each worker trains its blocks in order: after its first clock of epoch 0, its first block
    # (250 rows) is done and the second has started.
    assert seen[0] == {0: (0, 200), 1: (0, 0), 2: (0, 0), 3: (0, 0), 4: (0, 200), 5: (0, 0), 6: (0, 0), 7: (0, 0)}
    assert seen[1][0] == (0, 250) and seen[1][1] == (0, 2 * per_clock - 250)
    assert seen[-1] == {b: (2, 250) for b in range(8)}
    loop.reset_positions({3: (2, 100)})
    assert loop.clock_start_positions([3, 4]) == {3: (2, 100), 4: (0, 0)}


class KillsBeforeBatch:
    """A worker's subtask runner that, just before its `n`-th mini-batch, has `victim` killed
    (its pushes so far applied) and then goes on: its next pull from the dead server fails."""

    def __init__(self, executor: Executor, n: int, kill: Callable[[], None]) -> None:
        self.executor = executor
        self.n = n
        self.kill = kill
        self.done = False

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        role = self.executor.app_role
        if kind is Subtask.PULL and not self.done and role.pipeline.counters["batches"] == self.n:
            self.done = True
            assert role.store is not None
            await role.store.flush()
            self.kill()
        return await work()


async def test_a_server_lost_in_the_middle_of_a_clock_is_rebuilt_and_the_clock_runs_again(jobs) -> None:
    """A server lost in the middle of a clock is no worker to replace: the clock's failure reaches
    the master, the lost server is rebuilt on a new one (the initial checkpoint's blocks plus the
    workers' pushes since, their push logs) while training waits, and the clock runs again from
    where it began -- every mini-batch applied exactly once, the audit count included, no epoch
    redone and no checkpoint gone back to."""
    reference = jobs({**SPEC, "max_executor_failures": 1})
    assert await reference.run() is FinalStatus.SUCCEEDED
    job = jobs({**SPEC, "max_executor_failures": 1, "push_log": True})

    def on_launch(eid: str, ex: Executor) -> None:
        if eid == "worker-0":
            ex.app_role.pipeline.runner = KillsBeforeBatch(ex, SPEC["clock_batches"] + 2,
                                                           lambda: job.kill("server-1"))
    job.am.on_launch = on_launch
    assert await job.run() is FinalStatus.SUCCEEDED
    final, want = job.epochs[-1].objective, reference.epochs[-1].objective
    assert abs(final - want) <= 1e-3 * abs(want), (final, want)      # the rebuilt blocks held the model
    assert job.train_errors == []             # training went on after the rebuild
    assert not records(job, RecoveryChange) and [type(r) for r in records(job, ReplaceWorkerChange)] == [
        RebuildServerChange]
    [rec] = records(job, RebuildServerChange)
    assert rec.changed and rec.error == "" and "server-1 (" in rec.lost[0], rec
    assert rec.replacements == {"server-1": "server-2"} and rec.keys_replayed > 0 and rec.epochs_redone == 0, rec
    assert job.job.failures == 1 and job.master.replacements == 0 and job.master.recoveries == 1
    check_exact(job)
