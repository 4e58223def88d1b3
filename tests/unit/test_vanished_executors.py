"""A vanished executor (its host powered off, its link cut) costs the job what a killed one does:
the RM's loss report for it -- or, for one that is alive but stopped answering, the clock's reply
deadline -- ends the AM's wait on it, and the job recovers as from any loss (appmaster.ps.recovery).

Against real in-process executors (test_worker_replacement's harness, with the pool telling the
AM's data-plane client about losses as the master wires it). A "vanished" worker here stops answering
in the middle of a clock with its process and connections up: from the AM's side that is a host
gone without a RST, which the kill-based tests (connections reset) never exercised. Each test
first shows the wait still pending once everything else is done (the hang), then delivers the
report (or lets the deadline pass) and checks the outcome."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import pytest

from appmaster.ps.clock_loop import ReplyDeadline
from appmaster.ps.executor_pool import ExecutorRecord
from appmaster.ps.executor_rpc import ExecutorLost
from appmaster.ps.job import JobPhase
from polling import async_wait_until
from protocol import executor_ops as ops
from protocol.shape_history import ReplaceWorkerChange
from psruntime.executor import Executor
from psruntime.training_pipeline import Subtask
from test_worker_replacement import BATCHES_PER_WORKER_EPOCH, SPEC, Job, check_exact

CLOCK = int(SPEC["clock_batches"])
# In epoch 1's second clock (batches 5-8 of the epoch), after two of them.
FREEZE_AT = BATCHES_PER_WORKER_EPOCH + CLOCK + 2
CLOCKS_BEFORE = BATCHES_PER_WORKER_EPOCH // CLOCK + 1      # clocks done when it freezes


class FreezesBeforeBatch:
    """A worker's subtask runner that stops answering just before the mini-batch after its `n`-th
    (its pushes so far applied): no reply to the running clock ever comes, and nothing closes."""

    def __init__(self, executor: Executor, n: int) -> None:
        self.executor = executor
        self.n = n
        self.frozen = asyncio.Event()
        self._never = asyncio.Event()

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        role = self.executor.app_role
        if kind is Subtask.PULL and role.pipeline.counters["batches"] == self.n:
            assert role.store is not None
            await role.store.flush()
            self.frozen.set()
            await self._never.wait()
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


class Watched(Job):
    """The harness's job with the master's wiring of losses (pool -> the AM's data-plane client)
    and a count of the run_clock replies the AM received, per worker."""

    def __init__(self, tmp_path: Path, spec: Optional[dict[str, Any]] = None) -> None:
        super().__init__(tmp_path, spec)
        self.pool.links = self.client
        self.clock_replies: dict[str, int] = {}
        exchange = self.training.rpc.exchange

        async def counted(rec: ExecutorRecord, request: ops.ExecutorRequest, reply: Any, arrays: Any = ()) -> Any:
            answered = await exchange(rec, request, reply, arrays)
            if isinstance(request, ops.RunClock):
                self.clock_replies[rec.executor_id] = self.clock_replies.get(rec.executor_id, 0) + 1
            return answered
        self.training.rpc.exchange = counted       # type: ignore[method-assign]

    def freeze(self, executor_id: str, at: int = FREEZE_AT) -> FreezesBeforeBatch:
        victim = self.am.executors[executor_id]
        freezer = FreezesBeforeBatch(victim, at)
        victim.app_role.pipeline.runner = freezer
        return freezer

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
    await job.setup()
    freezer = job.freeze("worker-1")
    training = asyncio.ensure_future(job.train())
    await asyncio.wait_for(freezer.frozen.wait(), 60)
    await job.replies_from("worker-0", CLOCKS_BEFORE + 1)     # the other worker's part of the clock is in
    # The hang: the clock waits for the vanished worker, and nothing else would ever end that wait.
    assert not training.done() and job.training.loop.clocks_done == CLOCKS_BEFORE

    job.report_lost("worker-1")                             # the RM's report: exit -100, node LOST
    await asyncio.wait_for(training, 60)
    check_exact(job)
    [rec] = job.records
    assert isinstance(rec, ReplaceWorkerChange)
    assert rec.clock_redone and rec.replacements == {"worker-1": "worker-2"}
    assert "worker-1 (" in rec.lost[0] and "-100" in rec.lost[0]
    assert job.training.membership.worker_ids() == ["worker-0", "worker-2"]


async def test_the_loss_report_of_a_vanished_server_ends_the_clock_its_workers_are_blocked_in(jobs) -> None:
    """Both workers stop in the middle of a clock, as when their pulls wait on a server whose host
    vanished: the server's loss ends the clock (ExecutorLost for it) for the checkpoint path."""
    job = jobs()
    await job.setup()
    frozen = [job.freeze("worker-0"), job.freeze("worker-1")]
    training = asyncio.ensure_future(job.train())
    await asyncio.wait_for(asyncio.gather(*(f.frozen.wait() for f in frozen)), 60)
    await job.replies_from("worker-0", CLOCKS_BEFORE)
    assert not training.done()

    job.report_lost("server-1")
    with pytest.raises(ExecutorLost, match=r"run_clock on server-1 .*-100") as lost:
        await asyncio.wait_for(training, 60)
    assert not lost.value.answered and lost.value.executor.executor_id == "server-1"
    assert job.recovery.rollback_needed and job.recovery.pending
    assert job.training.loop.clocks_done == CLOCKS_BEFORE      # the cut-short clock is not counted


async def test_a_worker_that_stops_answering_is_given_up_at_the_reply_deadline(jobs) -> None:
    """No report at all (a hung process on a live host): the reply deadline gives the worker up,
    the master's hook stops its container, and that report brings the usual replacement."""
    job = jobs()
    deadlines = ManualDeadlines()
    loop = job.training.loop
    loop.deadline_sleep = deadlines.sleep
    given_up: list[tuple[str, str]] = []

    def stop_container(rec: ExecutorRecord, why: str) -> None:
        given_up.append((rec.executor_id, why))
        job.report_lost(rec.executor_id)                   # what the stopped container's completion does
    loop.on_unresponsive = stop_container
    await job.setup()
    freezer = job.freeze("worker-1")
    training = asyncio.ensure_future(job.train())
    await asyncio.wait_for(freezer.frozen.wait(), 60)
    await job.replies_from("worker-0", CLOCKS_BEFORE + 1)
    assert deadlines.waiting() == [ReplyDeadline().floor_s]   # a floor far above any clock here
    deadlines.advance(ReplyDeadline().floor_s - 1)
    await asyncio.sleep(0)
    assert not training.done() and given_up == []

    deadlines.advance(1)
    await asyncio.wait_for(training, 60)
    assert given_up == [("worker-1", "no run_clock reply within 300s")]
    assert job.pool.lost["worker-1"] == "no run_clock reply within 300s"
    check_exact(job)
    [rec] = job.records
    assert isinstance(rec, ReplaceWorkerChange) and rec.replacements == {"worker-1": "worker-2"}


def test_the_reply_deadline_grows_with_the_slowest_clock_and_never_below_its_floor() -> None:
    d = ReplyDeadline(floor_s=300, factor=10)
    assert d.seconds(0.0) == 300 and d.seconds(12.0) == 300 and d.seconds(45.0) == 450


async def test_an_ssp_job_ends_its_training_on_a_vanished_workers_loss(jobs) -> None:
    """Under SSP the lost worker's runner fails: training ends for the checkpoint path instead of
    the epoch collector waiting for a part that never comes."""
    job = jobs({**SPEC, "sync": "ssp", "staleness": 1})
    await job.setup()
    freezer = job.freeze("worker-1", at=CLOCK + 2)          # in its second clock (k = 1)
    training = asyncio.ensure_future(job.train())
    await asyncio.wait_for(freezer.frozen.wait(), 60)
    await job.replies_from("worker-0", 1 + 1 + 1)            # k + staleness + 1 clocks: then it must wait
    assert not training.done()

    job.report_lost("worker-1")
    with pytest.raises(ExecutorLost, match="run_clock on worker-1"):
        await asyncio.wait_for(training, 60)
    assert job.recovery.rollback_needed


async def test_a_vanished_worker_between_clocks_fails_the_next_call_at_once(jobs) -> None:
    """Lost while no clock runs (its report came first): the next clock's call to it fails at once,
    without a connection attempt to its address, and it is replaced in the clock."""
    job = jobs()
    await job.setup()
    job.training.loop.stop()
    await job.train()
    job.report_lost("worker-0")
    assert job.client.lost(job.pool.executors["worker-0"].address)
    with pytest.raises(ExecutorLost, match="its container has ended"):
        await job.training.rpc.call(job.pool.executors["worker-0"], ops.Positions(), ops.PositionsReply)
    assert job.recovery.phase() is JobPhase.TRAINING
    job.training.loop.resume()
    await asyncio.wait_for(job.train(), 60)
    check_exact(job)
    [rec] = job.records
    assert isinstance(rec, ReplaceWorkerChange) and rec.replacements == {"worker-0": "worker-2"}
