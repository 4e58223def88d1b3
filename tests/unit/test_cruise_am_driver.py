"""CruiseDriver: metrics from epochs and status polls -> the optimizer's decision at an epoch
boundary -> its plan proposed to the PS-job controller, which runs it (the scripted world answers
the controller's steps as the AM's interpreter would) -> the plan's record with predicted and
measured epoch times once its change ends. RM directives reach Cruise as the controller's
ComputePlan step. Fakes for the training parts the driver reads; no processes."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from appmaster.cruise.optimizer import CruiseConfig, CruiseOptimizer, JobSizes
from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.records import Role
from appmaster.ps.controller.state import Change, ChangeKind
from appmaster.ps.cruise_driver import MAX_PLAN_FAILURES, CruiseDriver
from appmaster.ps.metrics import EpochRecord, JobMetrics
from protocol import executor_ops as ops
from protocol.internal_api import ShapeDirective
from tests.support.controller_world import World, job_state

SPLITS_PER_WORKER, MODEL_BLOCKS, ROWS, BATCH = 8, 10, 50, 10
LINK_BPS = 8_000_000            # 1 MB/s per executor
MODEL_BYTES = 200_000           # pulled and pushed per mini-batch


class CruiseWorld(World):
    """The scripted world with the AM's two Cruise hooks: ComputePlan is answered by the driver's
    `plan_for`, and a PLAN change that leaves the slot is handed to the driver's `ended`."""

    driver: Optional[CruiseDriver] = None
    ended: list[Change]

    def send(self, event: ev.Event) -> list[ins.Instruction]:
        before = self.job.change
        out = super().send(event)
        if (self.driver is not None and before is not None and before.kind is ChangeKind.PLAN
                and self.job.change is not before and not any(c is before for c in self.ended)):
            self.ended.append(before)
            self.driver.ended(before, self.at())
        return out

    def answer(self, step: ins.StepInstruction, holdings: Any = None) -> list[ins.Instruction]:
        if isinstance(step, ins.ComputePlan) and self.driver is not None:
            self.held.pop(step.step, None)
            try:
                plan = self.driver.plan_for(step)
            except Exception as e:  # noqa: BLE001 - the interpreter's StepFailed
                return self.send(ev.StepFailed(at=self.at(), step=step.step, error=str(e)))
            return self.send(ev.StepDone(at=self.at(), step=step.step, ops=plan))
        return super().answer(step, holdings)


class FakeMembership:
    def __init__(self, w: World) -> None:
        self.w = w

    def _recs(self, role: Role) -> list[Any]:
        h = self.w.job.holdings
        held = h.splits if role is Role.WORKER else h.blocks
        return [SimpleNamespace(executor_id=e, blocks=list(held.get(e, []))) for e in self.w.job.ids(role)]

    @property
    def workers(self) -> list[Any]:
        return self._recs(Role.WORKER)

    @property
    def servers(self) -> list[Any]:
        return self._recs(Role.SERVER)

    def shape(self) -> tuple[int, int]:
        return self.w.job.shape


class FakeRpc:
    """Answers the status op the driver polls with the training counters the test sets."""

    def __init__(self, samples: dict[str, int]) -> None:
        self.samples = samples

    async def call(self, rec: Any, request: Any, reply: Any) -> Any:
        assert isinstance(request, ops.Status) and reply is ops.StatusReply
        samples = self.samples.get(rec.executor_id, 0)
        return ops.StatusReply(link_bps=LINK_BPS, train_counters={"samples": samples,
                                                                  "bytes": samples // BATCH * MODEL_BYTES})


class FakeTraining:
    """The parts of appmaster.ps.training.Training the driver reads, over the world's job."""

    def __init__(self, w: World) -> None:
        self.metrics = JobMetrics()
        self.loop = SimpleNamespace(epochs_done=0)
        self.membership = FakeMembership(w)
        self.samples: dict[str, int] = {}
        self.rpc = FakeRpc(self.samples)


def _world(workers: int, servers: int, gain: float = 0.05) -> tuple[CruiseDriver, CruiseWorld, FakeTraining]:
    w = CruiseWorld(job_state(workers=workers, servers=servers, blocks=MODEL_BLOCKS, optimizer="cruise"),
                    now=1000.0)
    w.ended = []
    w.start()
    assert w.job.phase is Phase.TRAINING
    t = FakeTraining(w)
    splits = sum(len(s) for s in w.job.holdings.splits.values())
    opt = CruiseOptimizer(JobSizes(splits, ROWS, MODEL_BLOCKS, BATCH, 2 * MODEL_BYTES),
                          CruiseConfig(min_batches=5, min_interval_s=0.0, gain_threshold=gain), clock=lambda: 0.0)
    d = CruiseDriver(opt, t, lambda: w.job.holdings, block_bytes=lambda: 100.0,   # type: ignore[arg-type]
                     wall_clock=w.at)
    t.metrics.batch_listeners.append(d.on_batches)
    w.driver = d
    return d, w, t


def _epoch(w: World, t: FakeTraining, n: int, seconds: float) -> EpochRecord:
    """Every worker trains its splits: 10 ms compute per mini-batch, communication from the link
    (its push, and its share of the busiest server's pulls: the cost model's exchange, no latency).
    The epoch ends `seconds` after the world's clock."""
    link = LINK_BPS / 8
    h = w.job.holdings
    busiest = max(len(h.blocks.get(s, [])) for s in w.job.ids(Role.SERVER))
    workers = w.job.ids(Role.WORKER)
    comm = MODEL_BYTES / 2 / link + busiest * MODEL_BYTES / 2 / MODEL_BLOCKS * len(workers) / link
    for x in workers:
        batches = len(h.splits.get(x, [])) * ROWS // BATCH
        t.metrics.record_batches(x, [0.01] * batches, [comm] * batches)
        t.samples[x] = t.samples.get(x, 0) + batches * BATCH
    t.loop.epochs_done = n + 1
    w.now += seconds
    rec = EpochRecord(n, 1.0 / (n + 1), seconds, w.now)
    t.metrics.record_epoch(rec)
    return rec


def _owned_once(w: World, splits: int) -> None:
    h = w.job.holdings
    assert sorted(b for bs in h.splits.values() for b in bs) == list(range(splits))
    assert sorted(b for bs in h.blocks.values() for b in bs) == list(range(MODEL_BLOCKS))


async def test_bad_split_is_reconfigured_and_measured() -> None:
    d, w, t = _world(workers=5, servers=1)
    w.hold = {ins.StageSplits}                      # the plan's hand-offs run alongside training
    first = await d.on_epoch(_epoch(w, t, 0, 8.0), w.job, w.send)
    assert first is not None and first.action == "reconfigure" and first.target is not None
    assert d.running and w.job.phase is Phase.EXECUTING_PLAN
    (workers, servers) = first.target.shape
    assert servers > 1 and workers + servers == 6
    # Training goes on while the plan runs; no second decision meanwhile.
    assert await d.on_epoch(_epoch(w, t, 1, 8.0), w.job, w.send) is None
    assert d.status(w.job.change).running and d.status(w.job.change).current_plan is not None
    w.hold = set()
    for s in w.held_of(ins.StageSplits):
        w.answer(s)
    assert not d.running and w.job.change is None and d.optimizer.in_progress is None
    assert w.job.shape == (workers, servers) == d.shape()
    _owned_once(w, 5 * SPLITS_PER_WORKER)           # every input split and model block owned exactly once
    for n in (2, 3):
        await d.on_epoch(_epoch(w, t, n, 4.0), w.job, w.send)
    st = d.status(w.job.change)
    assert len(st.plan_history) == 1 and not st.running
    h = st.plan_history[0]
    assert h.shape_before == [5, 1] and h.shape_after == [workers, servers]
    assert h.measured_epoch_before_s == 8.0 and h.measured_epoch_after_s == 4.0
    assert h.predicted_epoch_after_s is not None and h.predicted_epoch_before_s is not None
    assert h.predicted_epoch_after_s < h.predicted_epoch_before_s
    assert h.run is not None and h.run.ok and h.error == "" and h.bytes_moved > 0
    assert {op["op"] for op in h.run.plan["ops"]} >= {"switch", "move"}


async def test_no_decision_before_min_batches_or_under_gain_threshold() -> None:
    d, w, t = _world(workers=5, servers=1, gain=0.99)
    t.metrics.record_batches("worker-1", [0.01] * 2, [0.4] * 2)     # too few mini-batches
    assert await d.on_epoch(EpochRecord(0, 1.0, 1.0, 1.0), w.job, w.send) is None
    assert "mini-batches" in (d.optimizer.why_not_ready() or "")
    decision = await d.on_epoch(_epoch(w, t, 1, 8.0), w.job, w.send)
    assert decision is not None and decision.action == "skip" and "gain" in decision.reason
    assert not d.running and d.history == [] and not w.of(ins.MoveModelBlocks)


async def test_a_proposal_the_controller_does_not_take_is_withdrawn() -> None:
    d, w, t = _world(workers=5, servers=1)
    w.hold = {ins.StartExecutors}

    def busy_then_feed(e: ev.Event) -> None:       # a /scale got the slot while the driver polled
        w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
        w.send(e)

    decision = await d.on_epoch(_epoch(w, t, 0, 8.0), w.job, busy_then_feed)
    assert decision is not None and decision.action == "reconfigure"
    assert w.job.phase is Phase.RESHAPING and not d.running and d.history == []
    assert d.optimizer.in_progress is None and d.optimizer.why_not_ready() != "a reconfiguration is in progress"
    assert await d.on_epoch(_epoch(w, t, 1, 8.0), w.job, w.send) is None      # the job is busy: no decision


async def test_failed_plans_are_recorded_and_cruise_stops_after_repeated_failures() -> None:
    d, w, t = _world(workers=5, servers=1)
    for n in range(MAX_PLAN_FAILURES):
        w.hold = {ins.StageSplits}
        decision = await d.on_epoch(_epoch(w, t, n, 8.0), w.job, w.send)   # measured anew after a failure
        assert decision is not None and decision.action == "reconfigure", decision
        w.hold = set()
        for s in w.held_of(ins.StageSplits):
            w.fail(s, "link down")     # no split changed hands: every worker trains the next epoch
        assert not d.running and w.job.phase is Phase.TRAINING
        rec = d.history[-1]
        assert "link down" in rec.error and d.last_error == rec.error and d.failures == n + 1
        assert rec.run is not None and not rec.run.ok and d.optimizer.in_progress is None
        _owned_once(w, 5 * SPLITS_PER_WORKER)
    assert await d.on_epoch(_epoch(w, t, 9, 8.0), w.job, w.send) is None
    assert "Cruise stopped reconfiguring" in (d.status().why_not_ready or "")


async def test_rm_directive_shrinking_the_job_is_planned_by_cruise() -> None:
    d, w, t = _world(workers=3, servers=3)
    await d.on_epoch(_epoch(w, t, 0, 4.0), w.job, w.send)
    d.optimizer.trigger.min_batches = 10 ** 6                  # only the directive's capacity decides now
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=2, servers=2, version=1)))
    decision = d.optimizer.decisions[-1]
    assert decision.trigger == "capacity" and decision.action == "reconfigure" and decision.plan is not None
    assert decision.target is not None and sum(decision.target.shape) == 4
    assert any(op.to_json()["op"] == "delete" for op in decision.plan.ops.values())
    assert sum(w.job.shape) == 4 and w.job.phase is Phase.TRAINING and w.job.applied_directive == 1
    assert d.history[-1].decision is decision and d.history[-1].error == ""
    _owned_once(w, 3 * SPLITS_PER_WORKER)


async def test_rm_directive_growing_the_job_adds_on_its_nodes() -> None:
    d, w, t = _world(workers=5, servers=1)
    await d.on_epoch(_epoch(w, t, 0, 8.0), w.job, w.send)        # the bad split's plan runs at once
    shape = w.job.shape
    assert not d.running and len(d.history) == 1 and shape != (5, 1)
    n = len(w.log)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=5, servers=3, version=1,
                                                                   nodes=["n2"])))
    (compute,) = w.of(ins.ComputePlan)
    assert compute.workers + compute.servers == 8
    decision = d.history[-1].decision
    assert decision.trigger == "capacity" and decision.target is not None and sum(decision.target.shape) == 8
    starts = [i for i in w.log[n:] if isinstance(i, ins.StartExecutors)]
    assert starts and all(s.nodes == ["n2"] for s in starts)
    assert sum(w.job.shape) == 8 and d.history[-1].error == "" and d.history[-1].shape_after == w.job.shape
    _owned_once(w, 5 * SPLITS_PER_WORKER)


async def test_a_directive_cruise_cannot_plan_fails_only_its_change() -> None:
    d, w, _ = _world(workers=2, servers=1)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=2, servers=2, version=1)))
    assert "Cruise could not plan" in w.job.diagnostics and "cannot decide" in w.job.diagnostics
    assert w.job.phase is Phase.TRAINING and w.job.shape == (2, 1) and d.history == []
