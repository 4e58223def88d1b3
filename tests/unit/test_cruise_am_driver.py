"""CruiseDriver: metrics from epochs and status -> optimizer decision at an epoch boundary -> plan
run in the background -> plan history with predicted and measured epoch times (fakes for the
training controller, EPS's ledger and the runtime; no processes)."""
from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any, Sequence

from appmaster.cruise.optimizer import CruiseConfig, CruiseOptimizer, JobSizes
from appmaster.cruise.plan import BlockKind
from appmaster.cruise.targets import Role
from appmaster.ps.cruise_driver import CruiseDriver
from appmaster.ps.eps_datasets import SplitLedger
from appmaster.ps.metrics import EpochRecord, JobMetrics
from protocol import executor_ops as ops
from polling import async_wait_until
from psruntime.store.ownership_table import OwnershipTable

SPLITS, MODEL_BLOCKS, ROWS, BATCH = 10, 10, 100, 10
LINK_BPS = 8_000_000            # 1 MB/s per executor
MODEL_BYTES = 200_000           # pulled and pushed per mini-batch


class FakeMembership:
    def __init__(self, training: "FakeTraining") -> None:
        self.t = training

    @property
    def workers(self) -> list[Any]:
        return list(self.t.workers)

    @property
    def servers(self) -> list[Any]:
        return list(self.t.servers)

    def shape(self) -> tuple[int, int]:
        return len(self.t.workers), len(self.t.servers)


class FakeRpc:
    """Answers the status op the driver polls with the training counters the test sets."""

    def __init__(self, training: "FakeTraining") -> None:
        self.t = training

    async def call(self, rec: Any, request: Any, reply: Any) -> Any:
        assert isinstance(request, ops.Status) and reply is ops.StatusReply
        samples = self.t.samples[rec.executor_id]
        return ops.StatusReply(link_bps=LINK_BPS, train_counters={"samples": samples,
                                                                  "bytes": samples // BATCH * MODEL_BYTES})


class FakeTraining:
    """The parts of appmaster.ps.training.Training the driver reads."""

    def __init__(self, workers: int, servers: int) -> None:
        self.recs = {f"w{i}": SimpleNamespace(executor_id=f"w{i}", blocks=[]) for i in range(workers)}
        self.recs.update({f"s{i}": SimpleNamespace(executor_id=f"s{i}", blocks=[]) for i in range(servers)})
        self.workers = [r for k, r in self.recs.items() if k.startswith("w")]
        self.servers = [r for k, r in self.recs.items() if k.startswith("s")]
        self.table = OwnershipTable.round_robin(MODEL_BLOCKS, [s.executor_id for s in self.servers],
                                                {k: "127.0.0.1:1" for k in self.recs})
        self.metrics = JobMetrics()
        self.loop = SimpleNamespace(epochs_done=0)
        self.membership = FakeMembership(self)
        self.placement = SimpleNamespace(blocks_of=self.table.blocks_owned_by)
        self.rpc = FakeRpc(self)
        self.samples = {k: 0 for k in self.recs}


class FakeSteps:
    """The reconfiguration layer as the driver uses it: the split ledger and the change guard."""

    def __init__(self, training: FakeTraining) -> None:
        self.training = training
        self.ledger = SplitLedger()
        for i, w in enumerate(training.workers):
            self.ledger.add_worker(w.executor_id, [s for s in range(SPLITS) if s % len(training.workers) == i])
        self.current: str | None = None

    @property
    def busy(self) -> bool:
        return self.current is not None

    def splits(self) -> SplitLedger:
        return self.ledger

    @contextlib.asynccontextmanager
    async def exclusive(self, what: str) -> Any:
        assert self.current is None
        self.current = what
        try:
            yield
        finally:
            self.current = None


class FakeRuntime:
    """Applies the plan to the fakes (roles and ownership) and lets the test see the busy flag."""

    def __init__(self, training: FakeTraining, elastic: FakeSteps) -> None:
        self.t, self.e = training, elastic
        self.busy_seen = False
        self.gate = asyncio.Event()

    async def add(self, role: Role, n: int) -> list[str]:
        raise AssertionError("no adds expected")

    async def delete(self, executor: str) -> None:
        rec = self.t.recs[executor]
        if executor in self.e.ledger.active:
            self.e.ledger.remove_worker(executor)          # refuses while it holds splits
            self.t.workers.remove(rec)
        else:
            assert not self.t.table.blocks_owned_by(executor)
            self.t.servers.remove(rec)

    async def switch(self, executor: str, role: Role) -> None:
        rec = self.t.recs[executor]
        if role is Role.SERVER:
            self.e.ledger.remove_worker(executor)
            if rec in self.t.workers:
                self.t.workers.remove(rec)
            self.t.servers.append(rec)
        else:
            self.t.servers.remove(rec)
            self.e.ledger.add_worker(executor)

    async def move(self, kind: BlockKind, blocks: Sequence[int], src: str, dst: str, src_leaving: bool) -> int:
        self.busy_seen = self.e.busy
        await self.gate.wait()
        if kind is BlockKind.MODEL:
            self.t.table.assign(list(blocks), dst)
        else:
            for b in blocks:
                self.e.ledger.active[src].discard(b)
                self.e.ledger.active[dst].add(b)
        return len(blocks)

    def abort(self) -> None:
        pass

    def reset(self) -> None:
        pass


def _driver(workers: int, servers: int, gain: float = 0.05) -> tuple[CruiseDriver, FakeTraining, FakeRuntime]:
    t = FakeTraining(workers, servers)
    e = FakeSteps(t)
    rt = FakeRuntime(t, e)
    opt = CruiseOptimizer(JobSizes(SPLITS, ROWS, MODEL_BLOCKS, BATCH, 2 * MODEL_BYTES),
                          CruiseConfig(min_batches=5, min_interval_s=0.0, gain_threshold=gain), clock=lambda: 0.0)
    d = CruiseDriver(opt, e, rt, wall_clock=lambda: 1015.0)  # type: ignore[arg-type]   # between epochs 1 and 2
    t.metrics.batch_listeners.append(d.on_batches)
    return d, t, rt


def _epoch(d: CruiseDriver, t: FakeTraining, n: int, seconds: float) -> EpochRecord:
    """Every worker trains its splits: 10 ms compute per mini-batch, communication from the link
    (its push, and its share of the busiest server's pulls: the cost model's exchange, no latency)."""
    link = LINK_BPS / 8
    busiest = max(len(t.table.blocks_owned_by(x.executor_id)) for x in t.servers)
    comm = MODEL_BYTES / 2 / link + busiest * MODEL_BYTES / 2 / MODEL_BLOCKS * len(t.workers) / link
    for w in t.workers:
        batches = len(d.steps.splits().active_of(w.executor_id)) * ROWS // BATCH
        t.metrics.record_batches(w.executor_id, [0.01] * batches, [comm] * batches)
        t.samples[w.executor_id] += batches * BATCH
    t.loop.epochs_done = n + 1
    rec = EpochRecord(n, 1.0 / (n + 1), seconds, 1000.0 + 10 * n)
    t.metrics.record_epoch(rec)
    return rec


async def test_bad_split_is_reconfigured_and_measured() -> None:
    d, t, rt = _driver(workers=5, servers=1)
    first = await d.on_epoch(_epoch(d, t, 0, 8.0))
    assert first is not None and first.action == "reconfigure"
    assert d.running
    (w, s) = first.target.shape
    assert s > 1 and w + s == 6
    # Training goes on while the plan runs; no second decision meanwhile.
    await async_wait_until(lambda: rt.busy_seen, 10, "the plan task at its first op", interval_s=0)
    assert await d.on_epoch(_epoch(d, t, 1, 8.0)) is None
    assert rt.busy_seen and d.steps.busy
    rt.gate.set()
    await asyncio.wait_for(d.task, 5)
    assert not d.steps.busy and d.optimizer.in_progress is None
    assert d.shape() == (w, s)
    # Every input split and model block is owned exactly once after the plan.
    assert sorted(b for bs in d.steps.splits().active.values() for b in bs) == list(range(SPLITS))
    assert sorted(b for x in t.servers for b in t.table.blocks_owned_by(x.executor_id)) == list(range(MODEL_BLOCKS))
    for n in (2, 3):
        await d.on_epoch(_epoch(d, t, n, 4.0))
    hist = d.status().plan_history
    assert len(hist) == 1
    h = hist[0]
    assert h.shape_before == [5, 1] and h.shape_after == [w, s]
    assert h.measured_epoch_before_s == 8.0 and h.measured_epoch_after_s == 4.0
    assert h.predicted_epoch_after_s is not None and h.predicted_epoch_before_s is not None
    assert h.predicted_epoch_after_s < h.predicted_epoch_before_s
    assert h.run is not None and h.run.ok and h.error == ""


async def test_no_decision_before_min_batches_or_under_gain_threshold() -> None:
    d, t, _ = _driver(workers=5, servers=1, gain=0.99)
    t.metrics.record_batches("w0", [0.01] * 2, [0.4] * 2)     # too few mini-batches
    assert await d.on_epoch(EpochRecord(0, 1.0, 1.0, 1.0)) is None
    assert "mini-batches" in (d.optimizer.why_not_ready() or "")
    decision = await d.on_epoch(_epoch(d, t, 1, 8.0))
    assert decision is not None and decision.action == "skip" and "gain" in decision.reason
    assert not d.running and d.history == []


async def test_capacity_change_resolves_for_new_n() -> None:
    d, t, rt = _driver(workers=3, servers=3)
    await d.on_epoch(_epoch(d, t, 0, 4.0))
    d.optimizer.trigger.min_batches = 10 ** 6                  # only the capacity path decides now
    decision = await d.on_capacity_change(4)
    assert decision.trigger == "capacity" and decision.action == "reconfigure"
    assert sum(decision.target.shape) == 4
    assert any(op.to_json()["op"] == "delete" for op in decision.plan.ops.values())


async def test_rm_directive_resizes_through_cruise() -> None:
    """The directive handler calls `reshape` (one step): Cruise re-solves for W + S and waits for its plan."""
    from appmaster.ps.directives import Shape

    d, t, rt = _driver(workers=5, servers=1)
    await d.on_epoch(_epoch(d, t, 0, 8.0))
    rt.gate.set()
    await asyncio.wait_for(d.task, 5)
    shape = d.shape()
    decision = await asyncio.wait_for(d.reshape(Shape(2, 2), ()), 5)
    assert decision.trigger == "capacity" and sum(decision.target.shape) == 4
    assert sum(d.shape()) == 4 and shape != d.shape()
    assert d.history[-1].error == "" and d.history[-1].decision is decision
