"""A vanished executor (its host powered off, its link cut) costs the job what a killed one does:
the RM's loss report for it -- or, for one that is alive but stopped answering, the clock's reply
deadline -- ends the AM's wait on it, and the job recovers as from any loss (the PS-job
controller's recovery).

Against the real AM over in-process executors (tests/support/ps_inprocess.py: the pool tells the
AM's data-plane client about losses as the master wires it). A "vanished" worker here stops
answering in the middle of a clock with its process and connections up: from the AM's side that is
a host gone without a RST, which the kill-based tests (connections reset) never exercised. Each
test first shows the wait still pending once everything else is done (the hang), then delivers
the report (or lets the deadline pass) and checks the outcome."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import pytest

from appmaster.ps.clock_loop import ReplyDeadline
from appmaster.ps.controller import Phase
from appmaster.ps.runtime.executor_pool import ExecutorRecord
from appmaster.ps.runtime.executor_rpc import ExecutorLost
from polling import async_wait_until
from protocol import executor_ops as ops
from protocol.records import FinalStatus
from protocol.shape_history import RebuildServerChange, RecoveryChange, ReplaceWorkerChange
from psruntime.executor import Executor
from psruntime.training_pipeline import Subtask
from ps_inprocess import SPEC, PsJob
from test_worker_replacement import BATCHES_PER_WORKER_EPOCH, check_exact, pause_after_clock, paused, records

CLOCK = int(SPEC["clock_batches"])
# In epoch 1's second clock (batches 5-8 of the epoch), after two of them.
FREEZE_AT = BATCHES_PER_WORKER_EPOCH + CLOCK + 2
CLOCKS_BEFORE = BATCHES_PER_WORKER_EPOCH // CLOCK + 1      # clocks done when it freezes


class FreezesBeforeBatch:
    """A worker's subtask runner that stops answering just before the mini-batch after its `n`-th
    (its pushes so far applied): no reply to the running clock comes, and nothing closes -- until
    its executor is told to stop (then the mini-batch fails, as the process would end), or to let
    go of its servers (ReleaseServers: a pull waiting on a vanished server fails then, its address
    marked lost)."""

    def __init__(self, executor: Executor, n: int, releasable: bool = True) -> None:
        self.executor = executor
        self.n = n
        self.releasable = releasable      # False: deaf to ReleaseServers too (stuck for good)
        self.frozen = asyncio.Event()

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        role = self.executor.app_role
        if kind is Subtask.PULL and role.pipeline.counters["batches"] == self.n and not self.frozen.is_set():
            assert role.store is not None
            await role.store.flush()
            self.frozen.set()
            waits = {asyncio.ensure_future(self.executor.stopped.wait())}
            if self.releasable:
                waits.add(asyncio.ensure_future(role.stop.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            raise ConnectionError(f"{self.executor.executor_id} stopped")
        return await work()


class ManualDeadlines:
    """The clock loop's deadline sleeps, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleeping: list[tuple[float, asyncio.Future[None]]] = []

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleeping.append((self.now + seconds, fut))
        await fut

    def waiting(self) -> list[float]:
        """Seconds left on each sleep still waited on."""
        return [t - self.now for t, f in self._sleeping if not f.done()]

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for t, f in self._sleeping:
            if t <= self.now and not f.done():
                f.set_result(None)


class Watched(PsJob):
    """The harness's job with a count of the run_clock replies the AM received, per worker, and
    workers that freeze."""

    def __init__(self, tmp_path: Path, spec: Optional[dict[str, Any]] = None) -> None:
        super().__init__(tmp_path, spec)
        self.clock_replies: dict[str, int] = {}
        self.freezers: dict[str, FreezesBeforeBatch] = {}
        self._freeze_at: dict[str, int] = {}
        self._releasable: dict[str, bool] = {}
        exchange = self.training.rpc.exchange

        async def counted(rec: ExecutorRecord, request: ops.ExecutorRequest, reply: Any, arrays: Any = ()) -> Any:
            answered = await exchange(rec, request, reply, arrays)
            if isinstance(request, ops.RunClock):
                self.clock_replies[rec.executor_id] = self.clock_replies.get(rec.executor_id, 0) + 1
            return answered
        self.training.rpc.exchange = counted       # type: ignore[method-assign]

        def on_launch(eid: str, ex: Executor) -> None:
            if eid in self._freeze_at:
                self.freezers[eid] = FreezesBeforeBatch(ex, self._freeze_at[eid], self._releasable[eid])
                ex.app_role.pipeline.runner = self.freezers[eid]
        self.am.on_launch = on_launch

    def freeze(self, executor_id: str, at: int = FREEZE_AT, releasable: bool = True) -> None:
        """`executor_id` (once launched) freezes before its `at`-th mini-batch."""
        self._freeze_at[executor_id] = at
        self._releasable[executor_id] = releasable

    async def frozen(self, *executor_ids: str) -> None:
        await async_wait_until(lambda: all(e in self.freezers for e in executor_ids), what="the executors launched")
        await asyncio.wait_for(asyncio.gather(*(self.freezers[e].frozen.wait() for e in executor_ids)), 60)

    async def replies_from(self, executor_id: str, n: int) -> None:
        await async_wait_until(lambda: self.clock_replies.get(executor_id, 0) >= n,
                               what=f"{n} run_clock replies from {executor_id}")


@pytest.fixture
async def jobs(tmp_path: Path) -> AsyncIterator[Callable[..., Watched]]:
    made: list[Watched] = []

    def make(spec: Optional[dict[str, Any]] = None) -> Watched:
        job = Watched(tmp_path / f"job{len(made)}", spec)
        made.append(job)
        return job

    yield make
    for j in made:
        await j.close()


async def test_the_loss_report_of_a_vanished_worker_ends_the_clock_and_it_is_replaced(jobs) -> None:
    job = jobs()
    job.freeze("worker-1")
    job.start()
    await job.frozen("worker-1")
    await job.replies_from("worker-0", CLOCKS_BEFORE + 1)     # the other worker's part of the clock is in
    # The hang: the clock waits for the vanished worker, and nothing else would ever end that wait.
    assert job.loop.clocks_done == CLOCKS_BEFORE and job.job.change is None and not job.job.lost

    job.report_lost("worker-1")                             # the RM's report: exit -100, node LOST
    assert await job.run() is FinalStatus.SUCCEEDED
    check_exact(job)
    [rec] = records(job, ReplaceWorkerChange)
    assert rec.clock_redone and rec.replacements == {"worker-1": "worker-2"}
    assert "worker-1 (" in rec.lost[0] and "-100" in rec.lost[0]
    assert job.training.membership.worker_ids() == ["worker-0", "worker-2"]


async def test_the_loss_report_of_a_vanished_server_ends_the_clock_its_workers_are_blocked_in(jobs) -> None:
    """Both workers stop in the middle of a clock, as when their pulls wait on a server whose host
    vanished: the server's loss ends the clock (the workers let go of it: their pulls fail), a new
    server is rebuilt with its blocks, and the clock runs again -- no checkpoint gone back to."""
    job = jobs({**SPEC, "push_log": True})
    job.freeze("worker-0")
    job.freeze("worker-1")
    job.start()
    await job.frozen("worker-0", "worker-1")
    await job.replies_from("worker-0", CLOCKS_BEFORE)
    assert job.loop.clocks_done == CLOCKS_BEFORE and job.train_errors == []

    job.report_lost("server-1")
    assert await job.run() is FinalStatus.SUCCEEDED
    assert job.train_errors == []                               # training went on after the rebuild
    [rec] = records(job, RebuildServerChange)
    assert rec.changed and rec.error == "" and "server-1 (" in rec.lost[0] and not records(job, RecoveryChange)
    assert rec.replacements == {"server-1": "server-2"}, rec
    check_exact(job)


async def test_a_kept_worker_stuck_for_good_sends_the_server_recovery_to_new_workers(jobs) -> None:
    """A worker that does not let go of the lost server (stuck where its lost address does not
    reach) holds the rebuild up to the clock loop's reply deadline, then the checkpoint path that
    keeps the workers up to it again; then the workers are started afresh as well, and the job goes
    on from the checkpoint."""
    job = jobs({**SPEC, "push_log": True})
    deadlines = ManualDeadlines()
    job.loop.deadline_sleep = deadlines.sleep
    job.freeze("worker-0")
    job.freeze("worker-1", releasable=False)
    job.start()
    await job.frozen("worker-0", "worker-1")
    job.report_lost("server-1")
    for stage in ("rebuild", "restore"):
        await async_wait_until(lambda: (c := job.job.change) is not None and c.stage == stage
                               and deadlines.waiting() == [ReplyDeadline().floor_s],
                               what=f"the workers' release in the recovery's {stage} waiting on its deadline")
        assert job.job.phase is Phase.RECOVERING
        deadlines.advance(ReplyDeadline().floor_s)
    assert await job.run() is FinalStatus.SUCCEEDED
    [rec] = records(job, RecoveryChange)
    assert rec.changed and rec.error == "" and rec.workers_kept == 0, rec
    assert not records(job, RebuildServerChange)
    assert "worker-2" in job.pool.executors and "worker-3" in job.pool.executors      # new workers
    assert [e.epoch for e in job.epochs] == list(range(job.spec.max_epochs))


async def test_a_node_with_a_worker_and_a_server_vanishes_in_the_middle_of_a_clock(jobs) -> None:
    """A worker and a server on one host, reported lost in one reply, the worker first: its
    replacement is issued and, the server being no worker to replace, cancelled in the same breath
    (before its task ever ran) for the checkpoint path. That step is still answered, so the
    recovery goes on; it once hung the job (the multi-host node-loss test)."""
    job = jobs()
    job.freeze("worker-0")
    job.freeze("worker-1")
    job.start()
    await job.frozen("worker-0", "worker-1")
    await job.replies_from("worker-0", CLOCKS_BEFORE)

    job.report_lost("worker-0", "server-1")
    assert await job.run() is FinalStatus.SUCCEEDED
    [rec] = records(job, RecoveryChange)
    assert rec.changed and rec.error == "" and not records(job, ReplaceWorkerChange)
    assert sorted(x.split(" ")[0] for x in rec.lost) == ["server-1", "worker-0"], rec.lost
    assert [e.epoch for e in job.epochs] == list(range(job.spec.max_epochs))


async def test_a_worker_that_stops_answering_is_given_up_at_the_reply_deadline(jobs) -> None:
    """No report at all (a hung process on a live host): the reply deadline gives the worker up,
    the master stops its container, and that report brings the usual replacement."""
    job = jobs()
    deadlines = ManualDeadlines()
    job.loop.deadline_sleep = deadlines.sleep
    job.freeze("worker-1")
    job.start()
    await job.frozen("worker-1")
    await job.replies_from("worker-0", CLOCKS_BEFORE + 1)
    assert deadlines.waiting() == [ReplyDeadline().floor_s]   # a floor far above any clock here
    deadlines.advance(ReplyDeadline().floor_s - 1)
    await asyncio.sleep(0)
    assert job.master.unresponsive == {} and not job.job.lost

    deadlines.advance(1)
    assert await job.run() is FinalStatus.SUCCEEDED
    assert list(job.master.unresponsive.values()) == ["no run_clock reply within 300s"]
    assert job.pool.lost["worker-1"] == "no run_clock reply within 300s"
    check_exact(job)
    [rec] = records(job, ReplaceWorkerChange)
    assert rec.replacements == {"worker-1": "worker-2"} and "no run_clock reply within 300s" in rec.lost[0]


def test_the_reply_deadline_grows_with_the_slowest_clock_and_never_below_its_floor() -> None:
    d = ReplyDeadline(floor_s=300, factor=10)
    assert d.seconds(0.0) == 300 and d.seconds(12.0) == 300 and d.seconds(45.0) == 450


async def test_an_ssp_job_ends_its_training_on_a_vanished_workers_loss(jobs) -> None:
    """Under SSP the lost worker's runner fails: training ends for the checkpoint path instead of
    the epoch collector waiting for a part that never comes."""
    job = jobs({**SPEC, "sync": "ssp", "staleness": 1})
    job.freeze("worker-1", at=CLOCK + 2)                     # in its second clock (k = 1)
    job.start()
    await job.frozen("worker-1")
    await job.replies_from("worker-0", 1 + 1 + 1)            # k + staleness + 1 clocks: then it must wait
    assert job.train_errors == [] and not job.job.lost

    job.report_lost("worker-1")
    assert await job.run() is FinalStatus.SUCCEEDED
    assert job.train_errors and isinstance(job.train_errors[0], ExecutorLost)
    assert "run_clock on worker-1" in str(job.train_errors[0])
    [rec] = records(job, RecoveryChange)                      # SSP: back to the checkpoint
    assert rec.changed and not records(job, ReplaceWorkerChange)


async def test_a_vanished_worker_between_clocks_fails_the_next_call_at_once(jobs) -> None:
    """Lost while no clock runs (its report came first): a call to it fails at once, without a
    connection attempt to its address, and it is replaced before training goes on."""
    job = jobs()
    stopped = pause_after_clock(job, 1)
    job.start()
    await paused(job, stopped)
    job.report_lost("worker-0")
    await job.until(lambda: "worker-0" in job.job.lost, "the loss report")
    assert job.master.client.lost(job.pool.executors["worker-0"].address)
    with pytest.raises(ExecutorLost, match="its container has ended"):
        await job.training.rpc.call(job.pool.executors["worker-0"], ops.Positions(), ops.PositionsReply)
    await job.until(lambda: job.master.recoveries == 1 and job.job.change is None, "the replacement")
    assert job.job.phase is Phase.TRAINING
    job.master.interp.start_training()
    assert await job.run() is FinalStatus.SUCCEEDED
    check_exact(job)
    [rec] = records(job, ReplaceWorkerChange)
    assert rec.replacements == {"worker-0": "worker-2"}
