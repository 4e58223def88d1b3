"""PlanExecutor: runs a Cruise plan's ops concurrently on a runtime, in dependency order, and
stops cleanly on a failure (a fake runtime that applies the ops to an in-memory configuration)."""
from __future__ import annotations

import asyncio
from typing import Sequence

import pytest

from appmaster.cruise.plan import BlockKind
from appmaster.cruise.plan_builder import ExecutorState, apply_plan, build_plan
from appmaster.cruise.targets import Role, Target
from appmaster.ps.plan_executor import PlanExecutor, PlanFailed
from models.cruise_cost import Assignment
from polling import async_wait_until


class FakeRuntime:
    """Applies ops to roles / owned blocks, checking each op sees a consistent state."""

    def __init__(self, current: Sequence[ExecutorState], fail_on: str = "") -> None:
        self.roles = {e.executor_id: e.role for e in current}
        self.blocks = {e.executor_id: set(e.blocks) for e in current}
        self.fail_on = fail_on
        self.log: list[str] = []
        self.active = 0
        self.max_active = 0
        self.next = 0
        self.aborted = False

    async def _work(self, name: str) -> None:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.log.append(name)
        try:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if self.fail_on and name.startswith(self.fail_on):
                raise RuntimeError(f"{name} broke")
        finally:
            self.active -= 1

    async def add(self, role: Role, n: int) -> list[str]:
        await self._work(f"add {role.value} {n}")
        ids = []
        for _ in range(n):
            eid = f"new-{self.next}"
            self.next += 1
            self.roles[eid], self.blocks[eid] = role, set()
            ids.append(eid)
        return ids

    async def delete(self, executor: str) -> None:
        assert not self.blocks[executor], f"{executor} deleted while owning {self.blocks[executor]}"
        await self._work(f"delete {executor}")
        del self.roles[executor], self.blocks[executor]

    async def switch(self, executor: str, role: Role) -> None:
        assert not self.blocks[executor], f"{executor} switched while owning {self.blocks[executor]}"
        await self._work(f"switch {executor}")
        self.roles[executor] = role

    async def move(self, kind: BlockKind, blocks: Sequence[int], src: str, dst: str, src_leaving: bool) -> int:
        assert set(blocks) <= self.blocks[src]
        await self._work(f"move {src}->{dst}")
        self.blocks[src] -= set(blocks)
        self.blocks[dst] |= set(blocks)
        return 100 * len(blocks)

    def abort(self) -> None:
        self.aborted = True

    def reset(self) -> None:
        self.aborted = False


def _bad_split() -> tuple[list[ExecutorState], Target]:
    """5 workers / 1 server (8 input blocks, 8 model blocks) -> 3 workers / 3 servers, via switches."""
    current = [ExecutorState(f"w{i}", Role.WORKER, frozenset(range(i * 8 // 5, (i + 1) * 8 // 5)))
               for i in range(5)]
    current.append(ExecutorState("s0", Role.SERVER, frozenset(range(8))))
    target = Target(Assignment({"w0": 3, "w1": 3, "w2": 2}, {"s0": 3, "w3": 3, "w4": 2}), 1.0, 1.0)
    return current, target


async def test_executes_switches_and_moves_concurrently_in_order() -> None:
    current, target = _bad_split()
    plan = build_plan(current, target)
    rt = FakeRuntime(current)
    run = await PlanExecutor(rt).execute(plan)
    assert run.ok and plan.finished
    expected = apply_plan(current, build_plan(current, target))
    assert {e: rt.roles[e] for e in rt.roles} == {e: s.role for e, s in expected.items()}
    assert {e: rt.blocks[e] for e in rt.blocks} == {e: set(s.blocks) for e, s in expected.items()}
    assert run.max_concurrency >= 2          # independent moves ran together
    assert run.bytes_moved == 100 * sum(len(op.blocks) for op in plan.ops.values() if hasattr(op, "blocks"))
    assert all(t.end_s is not None and t.end_s >= t.start_s for t in run.timings.values())
    assert run.record().ops[0].id in plan.ops


async def test_add_binds_placeholders_before_moves_onto_new_executors() -> None:
    current = [ExecutorState("w0", Role.WORKER, frozenset(range(4))),
               ExecutorState("s0", Role.SERVER, frozenset(range(4)))]
    target = Target(Assignment({"w0": 2, "slot-a": 2}, {"s0": 2, "slot-b": 2}), 1.0, 1.0)
    rt = FakeRuntime(current)
    run = await PlanExecutor(rt).execute(build_plan(current, target))
    assert run.ok
    assert sorted(len(b) for e, b in rt.blocks.items() if e.startswith("new-")) == [2, 2]
    assert rt.log.index("add worker 1") < next(i for i, x in enumerate(rt.log) if "->new-" in x)


async def test_failure_stops_new_ops_and_leaves_every_block_owned_once() -> None:
    current, target = _bad_split()
    plan = build_plan(current, target)
    rt = FakeRuntime(current, fail_on="move")
    with pytest.raises(PlanFailed) as err:
        await PlanExecutor(rt).execute(plan)
    run = err.value.run
    assert not run.ok and "broke" in run.error and rt.aborted
    assert not any(x.startswith("switch") for x in rt.log)     # switches wait for moves that failed
    for kind_role in (Role.WORKER, Role.SERVER):
        owned = [b for e, bs in rt.blocks.items() for b in bs if current_role(current, e) is kind_role]
        assert sorted(owned) == list(range(8))


def current_role(current: Sequence[ExecutorState], e: str) -> Role:
    return next(x.role for x in current if x.executor_id == e)


async def test_cancellation_cancels_running_ops() -> None:
    current, target = _bad_split()

    class Slow(FakeRuntime):
        moving = 0
        cancelled = 0

        async def move(self, *a, **k) -> int:          # type: ignore[override]
            self.moving += 1
            try:
                await asyncio.sleep(60)                 # an op that is still running when the plan is cancelled
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return 0

    rt = Slow(current)
    task = asyncio.ensure_future(PlanExecutor(rt).execute(build_plan(current, target)))
    await async_wait_until(lambda: rt.moving, 10, "a move running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.cancelled == rt.moving, (rt.cancelled, rt.moving)   # no op left running behind the plan
