"""Directive handling of the PS AM, pure parts and the async driver with fake elastic ops:
diffing a directive against the current shape, version dedup, coalescing while a change runs,
waiting for training to start, and the shape report's progress figures (injected times)."""
from __future__ import annotations

import asyncio
from typing import Sequence

import pytest

from appmaster.ps.directives import (DirectiveHandler, DirectiveTracker, ProgressTracker, Shape, ShapeDelta,
                                     TrackerError, TrackerState, diff, target_of)
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.records import Resource


def directive(w: int, s: int, v: int) -> ShapeDirective:
    return ShapeDirective(workers=w, servers=s, version=v)


# ----- diff ---------------------------------------------------------------------------------------

def test_diff_orders_removals_before_additions() -> None:
    assert diff(Shape(3, 3), Shape(2, 2)).steps() == [("remove_servers", 1), ("remove_workers", 1)]
    assert diff(Shape(2, 2), Shape(3, 3)).steps() == [("add_servers", 1), ("add_workers", 1)]
    assert diff(Shape(2, 3), Shape(4, 1)).steps() == [("remove_servers", 2), ("add_workers", 2)]
    assert diff(Shape(2, 2), Shape(2, 2)).empty and diff(Shape(2, 2), Shape(2, 2)).steps() == []
    assert ShapeDelta(-1, 0).steps() == [("remove_workers", 1)]


def test_target_keeps_one_of_each_and_the_job_bounds() -> None:
    assert target_of(directive(0, 0, 1)) == Shape(1, 1)
    assert target_of(directive(9, 7, 1), max_workers=4, max_servers=3) == Shape(4, 3)
    assert target_of(directive(3, 2, 1), max_workers=4) == Shape(3, 2)
    # the job spec's minimums (Dorm's n_min per role) hold too
    assert target_of(directive(1, 1, 1), min_workers=2, min_servers=3) == Shape(2, 3)


# ----- tracker ------------------------------------------------------------------------------------

def test_tracker_keeps_directives_until_training_starts() -> None:
    t = DirectiveTracker()
    assert t.offer(directive(2, 2, 1)) is None and t.state is TrackerState.WAITING
    assert t.offer(directive(1, 1, 2)) is None          # the newer one replaces the kept one
    got = t.ready()
    assert got is not None and got.version == 2 and t.state is TrackerState.CHANGING
    assert t.applied_version == 2
    assert t.done() is None and t.state is TrackerState.IDLE


def test_tracker_ignores_repeated_and_older_versions() -> None:
    t = DirectiveTracker()
    t.ready()
    d = t.offer(directive(2, 2, 3))
    assert d is not None and d.version == 3
    assert t.done() is None
    assert t.offer(directive(2, 2, 3)) is None and t.state is TrackerState.IDLE      # repeat
    assert t.offer(directive(5, 5, 2)) is None and t.state is TrackerState.IDLE      # older
    assert t.applied_version == 3 and t.seen_version == 3


def test_tracker_coalesces_directives_during_a_change_to_the_latest() -> None:
    t = DirectiveTracker()
    t.ready()
    assert t.offer(directive(2, 2, 1)) is not None
    assert t.offer(directive(3, 3, 2)) is None
    assert t.offer(directive(4, 2, 3)) is None
    assert t.offer(directive(4, 2, 3)) is None            # repeat of the kept one: still one kept
    nxt = t.done()
    assert nxt is not None and (nxt.workers, nxt.servers, nxt.version) == (4, 2, 3)
    assert t.state is TrackerState.CHANGING
    assert t.done() is None and t.state is TrackerState.IDLE


def test_tracker_rejects_done_without_a_change() -> None:
    t = DirectiveTracker()
    t.ready()
    with pytest.raises(TrackerError, match="DONE is not allowed in state IDLE"):
        t.done()


# ----- progress / shape report --------------------------------------------------------------------

def test_progress_counts_rounds_and_speed_since_the_last_change() -> None:
    p = ProgressTracker(early_feedback_iterations=25)
    p.start(100.0)
    assert p.on_epoch({"worker-0": 10, "worker-1": 9}, 105.0) == 10      # a round of every worker
    assert p.on_epoch({"worker-0": 20, "worker-1": 19}, 110.0) == 20
    assert not p.early_feedback and p.speed == pytest.approx(2.0)
    p.change_started()
    assert p.changing
    p.change_ended(112.0)
    assert p.speed == 0.0 and p.speed_iterations == 0
    p.on_epoch({"worker-0": 30, "worker-1": 29, "worker-2": 4}, 116.0)   # a new worker counts from 0
    assert p.iterations == 30 and p.early_feedback and p.speed == pytest.approx(10 / 4.0)
    rep = p.report(Shape(3, 2), Resource(512, 1), 4, epoch=3, phase="TRAINING")
    assert (rep.workers, rep.servers, rep.iterations, rep.directive_version) == (3, 2, 30, 4)
    assert rep.started and rep.early_feedback and not rep.changing and (rep.epoch, rep.phase) == (3, "TRAINING")
    assert rep.executor_resource == Resource(512, 1)


# ----- the async driver ---------------------------------------------------------------------------

class FakeOps:
    """EPS-style ops that change a shape after a controllable delay."""

    def __init__(self, shape: list[int]) -> None:
        self.shape = shape                     # [workers, servers]
        self.calls: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def _op(self, name: str, n: int, role: int, sign: int) -> None:
        self.calls.append((name, n))
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("no containers")
        self.shape[role] += sign * n

    async def add_workers(self, n: int) -> None:
        await self._op("add_workers", n, 0, 1)

    async def add_servers(self, n: int) -> None:
        await self._op("add_servers", n, 1, 1)

    async def remove_workers(self, n: int) -> None:
        await self._op("remove_workers", n, 0, -1)

    async def remove_servers(self, n: int) -> None:
        await self._op("remove_servers", n, 1, -1)

    async def reshape(self, target: Shape, nodes: tuple[str, ...], placement: Sequence[NodePlacement] = ()) -> None:
        """As EPS does it: removals first, then additions (here one after the other)."""
        for name, n in diff(Shape(*self.shape), target).steps():
            await getattr(self, name)(n)


class FakeRestart:
    """A reshaper that changes both counts in one step (the kill-based baseline), on `nodes`."""

    def __init__(self) -> None:
        self.shape = [3, 3]
        self.nodes: tuple[str, ...] = ()
        self.calls: list[tuple[int, int, tuple[str, ...]]] = []
        self.placements: list[tuple[NodePlacement, ...]] = []
        self.placement: tuple[NodePlacement, ...] = ()

    async def reshape(self, target: Shape, nodes: tuple[str, ...], placement: Sequence[NodePlacement] = ()) -> None:
        self.calls.append((target.workers, target.servers, nodes))
        self.placements.append(tuple(placement))
        self.shape = [target.workers, target.servers]
        self.nodes = nodes
        self.placement = tuple(placement)


def handler_for(ops, changes: list[bool] | None = None) -> DirectiveHandler:
    return DirectiveHandler(lambda: ops, lambda: Shape(*ops.shape), max_workers=4, max_servers=4,
                            on_change=(changes.append if changes is not None else None),
                            placed=lambda nodes, placement: not nodes or (set(getattr(ops, "nodes", ())) <= set(nodes) and bool(
                                getattr(ops, "nodes", ()))))


async def test_handler_applies_eps_calls_and_coalesces_during_a_change() -> None:
    ops = FakeOps([3, 3])
    changes: list[bool] = []
    h = handler_for(ops, changes)
    h.training_started()
    ops.gate.clear()
    h.on_directive(directive(2, 2, 1))
    await asyncio.sleep(0)                      # let the change start and block on the gate
    assert h.busy and ops.calls == [("remove_servers", 1)]
    h.on_directive(directive(1, 1, 2))          # superseded by v3 before the change ends
    h.on_directive(directive(3, 2, 3))
    h.on_directive(directive(3, 2, 3))          # a repeat
    ops.gate.set()
    await h.wait_idle(5)
    assert ops.shape == [3, 2]
    assert ops.calls == [("remove_servers", 1), ("remove_workers", 1), ("add_workers", 1)]
    assert [o.version for o in h.history] == [1, 3] and h.applied_version == 3
    assert changes == [True, False, True, False]
    await h.close()


async def test_handler_waits_for_training_and_reshapes_in_one_step() -> None:
    ops = FakeRestart()
    h = handler_for(ops)
    h.on_directive(directive(9, 1, 1))          # before training: kept
    await asyncio.sleep(0)
    assert ops.calls == [] and not h.busy
    h.training_started()
    await h.wait_idle(5)
    assert ops.calls == [(4, 1, ())]            # clamped to max_workers, one step for both roles
    h.on_directive(directive(4, 1, 2))          # the shape it already has: nothing to do
    await h.wait_idle(5)
    assert ops.calls == [(4, 1, ())] and h.history[-1].steps == []
    await h.close()


async def test_a_directive_naming_nodes_is_carried_out_even_with_the_same_counts() -> None:
    ops = FakeRestart()
    h = handler_for(ops)
    h.training_started()
    h.on_directive(ShapeDirective(workers=3, servers=3, nodes=["n3:1", "n4:1"], version=1))
    await h.wait_idle(5)
    assert ops.calls == [(3, 3, ("n3:1", "n4:1"))]          # same counts, new place: the job moves
    assert h.history[-1].record().nodes == ["n3:1", "n4:1"]
    h.on_directive(ShapeDirective(workers=3, servers=3, nodes=["n3:1", "n4:1"], version=2))
    await h.wait_idle(5)
    assert len(ops.calls) == 1                              # already there: nothing to do
    await h.close()


async def test_a_per_node_placement_is_carried_out_though_every_executor_is_on_its_nodes() -> None:
    # Harmony's one worker + one server per node: a job whose servers share n1 and workers n2 is
    # on the directive's nodes, yet not placed as it says, so the reshaper is called with the
    # placement; once it is met, the same directive again changes nothing.
    ops = FakeRestart()
    ops.shape, ops.nodes = [2, 2], ("n1", "n2")
    spread = [NodePlacement(node="n1", workers=1, servers=1), NodePlacement(node="n2", workers=1, servers=1)]
    h = DirectiveHandler(lambda: ops, lambda: Shape(*ops.shape),
                         placed=lambda nodes, placement: set(ops.nodes) <= set(nodes) and (
                             not placement or tuple(placement) == ops.placement))
    h.training_started()
    h.on_directive(ShapeDirective(workers=2, servers=2, nodes=["n1", "n2"], placement=spread, version=1))
    await h.wait_idle(5)
    assert ops.calls == [(2, 2, ("n1", "n2"))] and ops.placements == [tuple(spread)]
    h.on_directive(ShapeDirective(workers=2, servers=2, nodes=["n1", "n2"], placement=spread, version=2))
    await h.wait_idle(5)
    assert len(ops.calls) == 1
    await h.close()


async def test_the_first_run_directive_is_the_first_kept_one_that_runs_the_job_with_executors() -> None:
    # Under a policy that places new jobs the AM waits for it before starting executors: a PAUSE
    # (no node free yet) is not it; the RUN on a node that follows is, and once training starts
    # the tracker applies it and finds it carried out.
    ops = FakeRestart()
    ops.shape = [0, 0]
    placed = [NodePlacement(node="n2", workers=1, servers=1)]
    h = DirectiveHandler(lambda: ops, lambda: Shape(*ops.shape),
                         placed=lambda nodes, placement: tuple(placement) == ops.placement)
    waiter = asyncio.create_task(h.first_run_directive())
    h.on_directive(ShapeDirective(workers=0, servers=0, run_state=RunState.PAUSE, version=1))
    await asyncio.sleep(0)
    assert not waiter.done()
    h.on_directive(ShapeDirective(workers=1, servers=1, nodes=["n2"], placement=placed, version=2))
    first = await asyncio.wait_for(waiter, 5)
    assert first.version == 2 and first.placement == placed
    ops.shape, ops.placement = [1, 1], tuple(placed)      # the AM started them as it said
    h.training_started()
    await h.wait_idle(5)
    assert ops.calls == [] and h.applied_version == 2
    await h.close()


async def test_a_failed_change_is_recorded_and_later_directives_still_run() -> None:
    ops = FakeOps([2, 2])
    h = handler_for(ops)
    h.training_started()
    ops.fail = True
    h.on_directive(directive(3, 2, 1))
    await h.wait_idle(5)
    assert "no containers" in h.history[0].error and ops.shape == [2, 2]
    ops.fail = False
    h.on_directive(directive(3, 2, 2))
    await h.wait_idle(5)
    assert ops.shape == [3, 2] and h.history[1].error == ""
    await h.close()


async def test_without_elastic_ops_directives_are_dropped() -> None:
    h = DirectiveHandler(lambda: None, lambda: Shape(2, 2))
    h.training_started()
    h.on_directive(directive(1, 1, 1))
    assert not h.busy and h.history == [] and h.applied_version == 0


async def test_the_harmony_group_comes_only_from_directives_the_tracker_applies() -> None:
    ops = FakeRestart()
    groups: list[str | None] = []
    h = DirectiveHandler(lambda: ops, lambda: Shape(*ops.shape), on_group=groups.append)
    h.on_directive(ShapeDirective(workers=2, servers=2, version=1, group="g-early"))   # kept, then superseded
    h.on_directive(ShapeDirective(workers=3, servers=3, version=2, group="g1"))
    assert groups == []                                     # nothing applied before training starts
    h.training_started()
    await h.wait_idle(5)
    assert groups == ["g1"]                                 # the applied v2's group, not v1's
    h.on_directive(ShapeDirective(workers=2, servers=2, version=1, group="g-stale"))  # stale: ignored
    await h.wait_idle(5)
    assert groups == ["g1"] and h.applied_version == 2
    h.on_directive(ShapeDirective(workers=2, servers=2, version=3, group=None))       # left its group
    await h.wait_idle(5)
    assert groups == ["g1", None]
    await h.close()
