"""EPS on the AM without a cluster: the training loop's elastic hooks (a step overlapping an epoch
holds that epoch's end; a boundary step runs while no worker trains; steps offered after the end
are refused) against a scripted data plane, and the PS-job controller's EPS planner's refusals of
impossible changes (400 or 409, stepped by events in tests/support/controller_world.py), which
change nothing."""
from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from appmaster.container_book import AmContainer
from appmaster.ps.runtime.executor_pool import ExecutorPool, ExecutorState, Role
from appmaster.ps.metrics import JobMetrics
from appmaster.ps.boundary_scheduler import TrainingNotRunning
from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.planners.eps import limits
from appmaster.ps.training import Training
from polling import async_wait_until
from protocol.ps_job_spec import validate
from protocol.records import Resource
from psruntime.apps.registry import create_app
from psruntime.wire.frame_codec import Frame
from tests.support.controller_world import World, started


class ScriptedPlane:
    """Answers the AM's control ops; run_clock waits until the test opens `gate`."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.gate = asyncio.Event()
        self.running = 0

    async def request(self, address: str, header: dict[str, Any], arrays: Any = ()) -> Frame:
        op = header["op"]
        if op == "run_clock":          # one clock that is the whole epoch
            self.running += 1
            self.log.append(("run_epoch", header["epoch"]))
            await self.gate.wait()
            self.running -= 1
            return Frame({"op": "ok", "batches": 2, "epoch_done": True}, [np.zeros(2), np.zeros(2)])
        if op == "objective":
            self.log.append(("objective", None))
            # a falling objective, so the job never counts as converged early
            return Frame({"op": "ok", "value": 10.0 / len(self.log), "count": 1})
        if op == "server_objective":
            return Frame({"op": "ok", "value": 0.0})
        return Frame({"op": "ok"})


def container(seq: int) -> AmContainer:
    return AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id="host:1", node_http_address="host:1",
                       resource=Resource(512, 1), token="t")


def make(spec_json: dict[str, Any], workers: int = 2, servers: int = 2) -> tuple[Training, ScriptedPlane, ExecutorPool]:
    spec = validate({"app": "mlr", **spec_json})
    pool = ExecutorPool(spec.num_blocks)
    seq = 0
    for role, n in ((Role.SERVER, servers), (Role.WORKER, workers)):
        for _ in range(n):
            seq += 1
            rec = pool.add(role, container(seq))
            rec.state, rec.address = ExecutorState.READY, f"127.0.0.1:{1000 + seq}"
    plane = ScriptedPlane()
    app = create_app(spec.app, spec.app_data(), spec.app_hparams())
    training = Training.build(spec, app, pool, JobMetrics(), plane)  # type: ignore[arg-type]
    training.membership.set(pool.of_role(Role.SERVER), pool.of_role(Role.WORKER))
    for i, w in enumerate(training.membership.workers):
        w.blocks = list(range(i * 4, i * 4 + 4))
    return training, plane, pool


async def until(cond: Any, what: str) -> None:
    """Let the event loop run (no wall-clock pause) until `cond()` holds; fails rather than hangs."""
    await async_wait_until(cond, 10, what, interval_s=0)


async def test_overlapped_step_holds_the_epoch_end_and_boundary_step_runs_between_epochs() -> None:
    training, plane, _ = make({"max_epochs": 3, "convergence_threshold": 1e-12})
    epochs: list[int] = []

    async def on_epoch(rec: Any) -> None:
        epochs.append(rec.epoch)

    loop = asyncio.create_task(training.loop.train(on_epoch))
    await until(lambda: plane.running == 2, "both workers training")  # epoch 0 is training
    step_done = asyncio.Event()

    async def transmission() -> str:
        await step_done.wait()
        return "moved"

    overlapped = asyncio.create_task(training.loop.boundaries.overlap_epoch(transmission))
    plane.gate.set()                                              # the workers finish epoch 0 ...
    await until(lambda: plane.running == 0, "the workers done with epoch 0")
    plane.gate.clear()                                            # epoch 1 will wait for the test
    for _ in range(100):                                          # give the loop every chance to move on
        await asyncio.sleep(0)
    assert ("objective", None) not in plane.log and epochs == []  # ... but the epoch waits (barrier)
    step_done.set()
    result, waited = await overlapped
    assert result == "moved" and waited >= 0.0

    seen: list[int] = []

    async def switch() -> None:
        seen.append(plane.running)                                # nobody trains at the boundary
        training.membership.set_workers(training.membership.workers[:1])   # the clock list changes here

    await until(lambda: epochs == [0], "epoch 0 ended")
    boundary = asyncio.create_task(training.loop.boundaries.at_boundary(switch))
    await until(lambda: plane.running >= 1, "a worker training")
    plane.gate.set()
    _, lost = await boundary
    await loop
    assert seen == [0] and lost >= 0.0 and epochs == [0, 1, 2]
    # epoch 1 ran on the workers of before or after the switch, epoch 2 on one worker only
    assert [e for op, e in plane.log if op == "run_epoch"][-1:] == [2]
    assert sum(1 for op, e in plane.log if op == "run_epoch" and e == 2) == 1
    with pytest.raises(TrainingNotRunning, match="not running"):
        await training.loop.boundaries.at_boundary(switch)


async def test_clock_boundary_waits_for_the_running_clock_and_not_when_idle() -> None:
    training, plane, _ = make({"max_epochs": 2, "convergence_threshold": 1e-12})
    await training.loop.boundaries.clock_boundary()   # not training: nothing in flight, returns at once

    loop = asyncio.create_task(training.loop.train(lambda rec: asyncio.sleep(0)))
    await until(lambda: plane.running == 2, "both workers training")  # a clock is running: requests in flight
    boundary = asyncio.create_task(training.loop.boundaries.clock_boundary())
    for _ in range(100):
        await asyncio.sleep(0)
    assert not boundary.done()                     # a leaving server must not be stopped yet
    plane.gate.set()                               # the clock ends (every worker flushed)
    await boundary
    await loop
    await training.loop.boundaries.clock_boundary()   # training over: at once again


async def test_elastic_steps_need_bsp() -> None:
    training, _, _ = make({"sync": "ssp"})
    with pytest.raises(TrainingNotRunning, match="BSP"):
        await training.loop.boundaries.overlap_epoch(lambda: asyncio.sleep(0))


def eps_job(**spec: Any) -> World:
    """A training EPS job (2 workers, 2 servers, 16 splits and 8 blocks unless said otherwise)."""
    return started(**{"workers": 2, "servers": 2, **spec})


def scale(w: World, workers: Any, servers: Any, request: int = 1) -> ins.Reply:
    n = len(w.log)
    w.send(ev.ScaleRequested(at=w.at(), request=request, workers=workers, servers=servers))
    replies = [i for i in w.log[n:] if isinstance(i, ins.Reply) and i.request == request]
    assert replies, w.kinds()[n:]
    return replies[-1]


@pytest.mark.parametrize("dw,ds,msg", [
    (2, 0, "4 workers is more than this job's maximum of 3"),
    (0, 2, "4 servers is more than this job's maximum of 3"),
    (-2, 0, "at least 1 worker"),
    (0, -2, "at least 1 server"),
    (0, 0, "nothing to change"),
    ("1", 0, "signed integer"),
    (True, 0, "signed integer"),
])
async def test_impossible_changes_are_refused_and_change_nothing(dw: Any, ds: Any, msg: str) -> None:
    w = eps_job(max_workers=3, max_servers=3)
    n = len(w.log)
    reply = scale(w, dw, ds)
    assert reply.status == 400 and msg in reply.message
    assert w.log[n:] == [reply] and w.job.change is None        # no step issued, nothing recorded
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING


async def test_refused_while_busy_not_training_or_ssp() -> None:
    busy = eps_job(max_workers=4)
    busy.hold = {ins.StageSplits}
    assert busy.job.change is None
    busy.send(ev.ScaleRequested(at=busy.at(), request=1, workers=1, servers=0))   # a change is running ...
    reply = scale(busy, 1, 0, request=2)
    assert reply.status == 409 and "another change is running" in reply.message
    finishing = eps_job(max_workers=4)
    finishing.hold = {ins.ScoreModel}
    finishing.send(ev.TrainingEnded(at=finishing.at(), criterion="epoch limit"))
    reply = scale(finishing, 1, 0)
    assert finishing.job.phase is Phase.FINISHING and reply.status == 409
    assert "another change is running (finish)" in reply.message
    ssp = eps_job(sync="ssp", max_workers=3)
    reply = scale(ssp, 1, 0)
    assert reply.status == 400 and "SSP" in reply.message and ssp.job.shape == (2, 2)
    # a relative change is validated as a whole: the add never starts
    whole = eps_job(max_workers=3)
    n = len(whole.log)
    reply = scale(whole, 1, -2)
    assert reply.status == 400 and "at least 1 server" in reply.message and whole.log[n:] == [reply]


def test_limits_without_a_maximum_are_the_splits_and_blocks() -> None:
    w = eps_job()                   # 16 splits on the workers (the scripted set-up), 8 blocks
    assert w.job.spec.num_blocks == 8 and sum(len(s) for s in w.job.holdings.splits.values()) == 16
    assert limits(w.job) == (16, 8)
    capped = eps_job(max_workers=5, max_servers=3)
    assert limits(capped.job) == (5, 3)


async def test_a_split_whose_inactive_copy_the_sender_could_not_keep_is_not_in_its_inactive_dataset() -> None:
    """The sender moved both splits but kept one copy only (its disk filled): the ledger says so,
    so no later step reactivates a copy that is not there."""
    from types import SimpleNamespace  # noqa: PLC0415

    from appmaster.ps.eps_datasets import SplitLedger  # noqa: PLC0415
    from appmaster.ps.eps_decisions import Transfer  # noqa: PLC0415
    from appmaster.ps.eps_records import ElasticOpRecord  # noqa: PLC0415
    from appmaster.ps.eps_split_transfers import SplitTransmitter  # noqa: PLC0415
    from protocol import executor_ops as ops  # noqa: PLC0415

    class Rpc:
        async def call(self, rec: Any, req: Any, reply_type: Any) -> Any:
            assert isinstance(req, ops.EpsCommit) and req.keep_inactive
            return ops.EpsCommitReply(done=[1, 2], not_kept={"1": "No space left on device"}, bytes=10)
    pool = SimpleNamespace(executors={"w0": SimpleNamespace(address="127.0.0.1:1"),
                                      "w1": SimpleNamespace(address="127.0.0.1:2")})
    ledger = SplitLedger()
    ledger.add_worker("w0", [1, 2])
    ledger.add_worker("w1")
    rec = ElasticOpRecord(op="add_workers", requested=1, started=0.0, epoch_started=0, workers_before=1,
                          servers_before=1)
    await SplitTransmitter(Rpc(), pool, None).commit(  # type: ignore[arg-type]
        rec, [Transfer(1, "w0", "w1"), Transfer(2, "w0", "w1")], ledger, keep_inactive=True)
    assert ledger.active_of("w1") == [1, 2] and ledger.active_of("w0") == []
    assert ledger.inactive_of("w0") == [2] and rec.splits_moved == 2
