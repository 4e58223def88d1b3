"""A training step runs detached from the request that started it (psruntime.app_role): an AM
whose connection drops in the middle of a clock (it died; the next attempt takes its executors
over, appmaster.ps.attempt_takeover) loses only the reply. The step goes on -- the mini-batch
whose COMP already changed the worker's state in place (LDA's topic assignments) still pushes,
and its position moves past it -- until the next AM's EndClock cuts it; so the servers' topic
counts and the worker's assignments stay consistent. The executor's own stop still ends a
running step at once."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import numpy as np

from polling import async_wait_until
from psruntime.apps.lda import LDAApp
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable
from psruntime.training_pipeline import Subtask
from psruntime.wire.dataplane import DataPlaneClient

NUM_BLOCKS = 4


class HoldAfterComp:
    """The worker's subtask runner: its COMP number `at` (counted over the worker's life) runs --
    changing the block's state in place -- and then holds, before its push, until `release`."""

    def __init__(self, at: int) -> None:
        self.at, self.comps = at, 0
        self.computed = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        out = await work()
        if kind is Subtask.COMP:
            self.comps += 1
            if self.comps == self.at:
                self.computed.set()
                await self.release.wait()
        return out


def server_topic_totals(server: Executor, app: LDAApp) -> np.ndarray:
    for b in server.service.owned_blocks():
        d = server.service.store.export_arrays(b)
        i = np.flatnonzero(d.keys == app.totals_key)
        if len(i):
            return np.asarray(d.values[i[0]], np.int64)
    raise AssertionError("no topic totals row on the server")


def worker_topic_totals(worker: Executor, app: LDAApp) -> np.ndarray:
    k = app.hparams.num_topics
    return np.asarray(sum(np.bincount(b.state["z"], minlength=k) for b in worker.app_role.blocks), np.int64)


async def lda_job(runner: HoldAfterComp) -> tuple[Executor, Executor, MigrationController, DataPlaneClient, LDAApp]:
    server = Executor("server-0", NUM_BLOCKS)
    worker = Executor("worker-0", NUM_BLOCKS, role="worker", runner=runner)
    addrs = {e.executor_id: await e.start() for e in (server, worker)}
    ctl = MigrationController(OwnershipTable.round_robin(NUM_BLOCKS, ["server-0"], addrs))
    await ctl.broadcast()
    am = DataPlaneClient()
    for e in (server, worker):
        await am.request(e.address, {"op": "app_setup", "app": "lda", "preset": "tiny"})
    await am.request(worker.address, {"op": "worker_setup", "partition": 0, "num_partitions": 1})
    await am.request(worker.address, {"op": "init_model"})
    await am.request(worker.address, {"op": "init_blocks"})
    app = worker.app_role.app
    assert isinstance(app, LDAApp)
    return server, worker, ctl, am, app


async def test_a_clock_whose_am_connection_drops_mid_comp_still_pushes_and_advances() -> None:
    runner = HoldAfterComp(at=3)          # clock 0 runs COMPs 1-2; clock 1's first COMP holds
    server, worker, ctl, am, app = await lda_job(runner)
    am2 = DataPlaneClient()
    try:
        await am.request(worker.address, {"op": "run_clock", "epoch": 0, "batches": 2, "num_workers": 1,
                                          "clock": 0})
        assert np.array_equal(server_topic_totals(server, app), worker_topic_totals(worker, app))
        before = dict((await am.request(worker.address, {"op": "positions"})).header["positions"])

        clock = asyncio.ensure_future(am.request(worker.address, {"op": "run_clock", "epoch": 0, "batches": 4,
                                                                  "num_workers": 1, "clock": 1}))
        await asyncio.wait_for(runner.computed.wait(), 30)    # COMP ran (z changed), its push not sent
        conns = worker.server.connections                      # the AM's and the controller's
        await am.close()                                       # the AM is gone: its connection drops
        try:
            await clock
        except Exception:  # noqa: BLE001 - the old AM's side: no reply, whatever the error
            pass
        await async_wait_until(lambda: worker.server.connections < conns,
                               what="the worker saw the AM's connection go")
        runner.release.set()

        # The next AM attempt: EndClock, then the settled positions (after the clock has ended).
        await am2.request(worker.address, {"op": "end_clock"})
        after = dict((await am2.request(worker.address, {"op": "positions", "settled": True})).header["positions"])
        assert np.array_equal(server_topic_totals(server, app), worker_topic_totals(worker, app)), \
            "a mini-batch changed the worker's topic assignments without pushing their counts"
        assert after != before, "the held mini-batch's position moved past it"
        assert not worker.app_role.step_lock.locked()

        # ... and training goes on from there, still consistent.
        await am2.request(worker.address, {"op": "run_clock", "epoch": 0, "batches": 2, "num_workers": 1,
                                           "clock": 2})
        assert np.array_equal(server_topic_totals(server, app), worker_topic_totals(worker, app))
    finally:
        runner.release.set()
        await am2.close()
        await ctl.close()
        for e in (server, worker):
            await e.stop()


async def test_the_executors_stop_ends_a_running_clock_at_once() -> None:
    runner = HoldAfterComp(at=1)          # the first COMP holds, never released
    server, worker, ctl, am, app = await lda_job(runner)
    try:
        clock = asyncio.ensure_future(am.request(worker.address, {"op": "run_clock", "epoch": 0, "batches": 4,
                                                                  "num_workers": 1, "clock": 0}))
        await asyncio.wait_for(runner.computed.wait(), 30)
        assert worker.app_role.step_lock.locked()
        await asyncio.wait_for(worker.stop(), 10)          # SIGTERM's path: the step does not outlive it
        assert not worker.app_role.step_lock.locked()
        assert not worker.app_role._steps
        try:
            await clock
        except Exception:  # noqa: BLE001 - the AM's side of a stopped executor
            pass
    finally:
        runner.release.set()
        await am.close()
        await ctl.close()
        await server.stop()
