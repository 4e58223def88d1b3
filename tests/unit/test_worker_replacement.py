"""A lost worker is replaced and training goes on from the clock it was lost in, against real
in-process executors (localhost sockets, no RM; a stand-in AM starts new executors in this event
loop): the clock loop keeps each input block's position from the run_clock replies, the
replacement takes over the lost worker's splits where they stood when the clock began, runs the
clock again alone, and the servers drop the pushes the lost worker had made already, so the
exactly-once audit holds and the objective stays that of an undisturbed run."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import pytest

from appmaster.container_book import AmContainer
from appmaster.ps.checkpoints import Checkpointer
from appmaster.ps.executor_pool import ExecutorPool, ExecutorState, Role
from appmaster.ps.executor_rpc import ExecutorCallError
from appmaster.ps.job import JobPhase
from appmaster.ps.metrics import EpochRecord, JobMetrics
from appmaster.ps.reconfiguration import Reconfiguration
from appmaster.ps.recovery import ExecutorRecovery
from appmaster.ps.training import Training
from protocol.ps_job_spec import validate
from protocol.records import Resource
from elastane_cli.ps_scale_command import change_rows
from protocol import codec
from protocol.shape_history import ReplaceWorkerChange, ShapeChange, decode_history
from psruntime.apps.registry import create_app
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.executor import Executor
from psruntime.wire.frame_codec import Frame
from psruntime.training_pipeline import Subtask

SPEC = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 3, "convergence_threshold": 1e-12,
        "audit_updates": True, "clock_batches": 4}
BATCHES_PER_WORKER_EPOCH = 2000 // 50 // 2      # MLR's default data: 2000 rows, batches of 50


class InProcessAM:
    """Stands in for the AM's RM client: an ask starts in-process executors that announce
    themselves to the pool, as launched containers do."""

    def __init__(self, pool: ExecutorPool, num_blocks: int) -> None:
        self.pool = pool
        self.num_blocks = num_blocks
        self.executors: dict[str, Executor] = {}
        self.asks: list[tuple[str, int]] = []
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def add_ask(self, n: int, resource: Resource, tag: str, nodes: Any = None, relax_locality: bool = True) -> int:
        self.asks.append((tag, n))
        t = asyncio.ensure_future(self.start(Role(tag), n))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return len(self.asks)

    def set_ask_count(self, ask_id: int, n: int) -> None:
        pass

    async def stop(self, container: AmContainer) -> None:
        rec = self.pool.by_container(container.container_id)
        if rec is not None and rec.executor_id in self.executors:
            await self.executors[rec.executor_id].stop()

    async def start(self, role: Role, n: int) -> None:
        for _ in range(n):
            self._seq += 1
            c = AmContainer(container_id=f"container_1_0001_01_{self._seq:06d}", node_id="n1:1",
                            node_http_address="n1:1", resource=Resource(256, 1), token="t", tag=role.value)
            rec = self.pool.add(role, c)
            ex = Executor(rec.executor_id, self.num_blocks, role=role.value)
            self.executors[rec.executor_id] = ex
            address = await ex.start()
            self.pool.handle_frame(Frame({"op": "executor_ready", "executor_id": rec.executor_id,
                                          "address": address, "pid": 1}))

    async def close(self) -> None:
        for ex in self.executors.values():
            await ex.stop()


class Job:
    """The AM's training parts, reconfiguration steps and recovery over in-process executors."""

    def __init__(self, tmp_path: Path, spec: Optional[dict[str, Any]] = None) -> None:
        self.spec = validate(spec or SPEC)
        self.app = create_app(self.spec.app, self.spec.app_data(), self.spec.app_hparams())
        self.pool = ExecutorPool(self.spec.num_blocks, am_address="127.0.0.1:1")
        self.client = DataPlaneClient()
        self.metrics = JobMetrics()
        self.am = InProcessAM(self.pool, self.spec.num_blocks)
        self.training = Training.build(self.spec, self.app, self.pool, self.metrics, self.client)
        self.steps = Reconfiguration(self.am, self.training, Checkpointer(tmp_path / "ckpt", self.client),  # type: ignore[arg-type]
                                     Resource(256, 1), set(), started=lambda: True, launch_timeout_s=10)
        self.records: list[ShapeChange] = []
        self.recovery = ExecutorRecovery(self.spec, self.app, self.steps, lambda: JobPhase.TRAINING,
                                         on_record=self.records.append)
        self.training.loop.replace_lost_workers = self.recovery.replace_lost_workers
        self.epochs: list[EpochRecord] = []

    async def setup(self) -> None:
        await self.am.start(Role.SERVER, self.spec.servers)
        await self.am.start(Role.WORKER, self.spec.workers)
        await self.training.setup(self.pool.ready(Role.SERVER), self.pool.ready(Role.WORKER))
        await self.steps.checkpoint(0, {})          # what the checkpoint path would go back to

    def report_lost(self, executor_id: str) -> None:
        """What the master does when the RM reports the container's exit."""
        rec = self.pool.executors[executor_id]
        c = rec.container
        self.pool.mark_exited(AmContainer(c.container_id, c.node_id, c.node_http_address, c.resource, c.token,
                                          tag=c.tag, exit_status=-100))
        assert self.recovery.on_lost(rec.describe_exit(256), rec) is None

    async def train(self) -> None:
        async def on_epoch(rec: EpochRecord) -> None:
            self.epochs.append(rec)
        await self.training.loop.train(on_epoch)

    async def close(self) -> None:
        if self.training.placement.placed:
            await self.training.placement.controller.close()
        await self.client.close()
        await self.am.close()


class DiesBeforeBatch:
    """A worker's subtask runner that kills its executor just before the mini-batch after its
    `n`-th (its pushes so far applied): as a process killed in the middle of a clock."""

    def __init__(self, executor: Executor, n: int, on_death: Callable[[], None]) -> None:
        self.executor = executor
        self.n = n
        self.on_death = on_death
        self.died = False
        self.stopping: Optional[asyncio.Future[None]] = None

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        role = self.executor.app_role
        if kind is Subtask.PULL and not self.died and role.pipeline.counters["batches"] == self.n:
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
    made: list[Job] = []

    def make(spec: Optional[dict[str, Any]] = None) -> Job:
        job = Job(tmp_path / f"job{len(made)}", spec)
        made.append(job)
        return job

    yield make
    for j in made:
        await j.close()


def check_exact(job: Job) -> None:
    loop = job.training.loop
    assert [e.epoch for e in job.epochs] == list(range(job.spec.max_epochs))
    assert loop.audit_mismatches == [], loop.audit_mismatches
    assert loop.minibatches_applied == loop.minibatches_run == job.spec.max_epochs * 2 * BATCHES_PER_WORKER_EPOCH


async def test_a_worker_lost_mid_clock_is_replaced_and_its_clock_redone_exactly_once(jobs) -> None:
    reference = jobs()
    await reference.setup()
    await reference.train()
    check_exact(reference)

    job = jobs()
    await job.setup()
    lost = job.pool.executors["worker-1"]
    splits = list(lost.blocks)
    # Dies in epoch 1, in its second clock (batches 5-8 of the epoch), after pushing two of them.
    die_at = BATCHES_PER_WORKER_EPOCH + SPEC["clock_batches"] + 2
    victim = job.am.executors["worker-1"]
    victim.app_role.pipeline.runner = DiesBeforeBatch(victim, die_at, lambda: job.report_lost("worker-1"))
    await job.train()

    check_exact(job)
    [rec] = job.records
    assert type(rec) is ReplaceWorkerChange and rec.changed and rec.error == "" and rec.clock_redone, rec
    assert rec.epochs_redone == 0 and rec.epoch == 1 and "worker-1 (" in rec.lost[0], rec
    assert rec.replacements == {"worker-1": "worker-2"}
    assert job.recovery.failures == 1 and job.recovery.replacements == 1 and job.recovery.recoveries == 1
    # The ledger, the barrier and the replacement's record name the replacement with the lost splits.
    ledger = job.steps.splits()
    assert ledger.active_of("worker-2") == splits and "worker-1" not in ledger.active
    assert job.training.membership.worker_ids() == ["worker-0", "worker-2"]
    assert job.pool.executors["worker-2"].blocks == splits and job.pool.executors["worker-1"].state is ExecutorState.EXITED
    # The two mini-batches pushed before the loss were pushed again by the redo and dropped.
    repeats = sum(job.am.executors[s.executor_id].service.applied_pushes.repeats for s in job.pool.servers)
    assert repeats >= 2 * 2, repeats       # deltas and audit count of each, per block they reached
    # The positions the loop keeps: every block at the end of the last epoch.
    last = job.spec.max_epochs - 1
    assert job.training.loop.clock_start_positions(range(job.app.num_blocks)) == {
        b: (last, 250) for b in range(job.app.num_blocks)}
    final, want = job.epochs[-1].objective, reference.epochs[-1].objective
    assert abs(final - want) <= 0.01 * abs(want), (final, want)


async def test_a_worker_lost_between_clocks_is_replaced_before_training_resumes(jobs) -> None:
    job = jobs()
    await job.setup()
    job.training.loop.stop()
    await job.train()                                    # stops at the first clock boundary: nothing ran
    await job.am.executors["worker-0"].stop()
    job.report_lost("worker-0")
    assert not job.recovery.rollback_needed
    await job.recovery.recover()
    job.training.loop.resume()
    await job.train()
    check_exact(job)
    [rec] = job.records
    assert type(rec) is ReplaceWorkerChange and not rec.clock_redone and rec.replacements == {"worker-0": "worker-2"}
    assert job.training.membership.worker_ids() == ["worker-1", "worker-2"]
    # What `elastane ps scale` reads of it, after the trip through the AM's /status JSON.
    [back] = decode_history(codec.loads(codec.dumps({"shape_history": [rec]}))["shape_history"])
    assert back == rec
    assert change_rows([back]) == [["replace", "-", "2/2", f"{rec.seconds:.2f}s", "-", f"{rec.lost_s:.3f}s", "+0"]]


async def test_the_clock_loop_keeps_where_each_block_stood(jobs) -> None:
    job = jobs()
    await job.setup()
    loop = job.training.loop
    assert loop.clock_start_positions([0, 5]) == {0: (0, 0), 5: (0, 0)}    # nothing trained yet
    seen: list[dict[int, tuple[int, int]]] = []
    loop.on_clock = lambda: seen.append(loop.clock_start_positions(range(8)))
    await job.train()
    per_clock = SPEC["clock_batches"] * 50
    # Each worker trains its blocks in order: after its first clock of epoch 0, its first block
    # (250 rows) is done and the second has started.
    assert seen[0] == {0: (0, 200), 1: (0, 0), 2: (0, 0), 3: (0, 0), 4: (0, 200), 5: (0, 0), 6: (0, 0), 7: (0, 0)}
    assert seen[1][0] == (0, 250) and seen[1][1] == (0, 2 * per_clock - 250)
    assert seen[-1] == {b: (2, 250) for b in range(8)}
    loop.reset_positions({3: (2, 100)})
    assert loop.clock_start_positions([3, 4]) == {3: (2, 100), 4: (0, 0)}


async def test_a_run_clock_failure_that_is_no_worker_loss_is_raised(jobs) -> None:
    """The other workers' clock still counts (the audit), and the failure reaches the master."""
    job = jobs({**SPEC, "max_executor_failures": 1})
    await job.setup()
    await job.am.executors["server-1"].stop()
    job.report_lost("server-1")
    assert job.recovery.rollback_needed
    with pytest.raises(ExecutorCallError):
        await job.train()
    assert job.records == [] and job.recovery.pending
    assert job.training.loop.epochs_done == 0
