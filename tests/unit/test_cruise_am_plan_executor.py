"""A plan Cruise's plan builder made, run by the PS-job controller: `plan_ops` turns the cruise
Plan's DAG into the controller's ops, the controller's Cruise planner runs them (concurrently, in
dependency order, stopping cleanly on a failure or a loss) in the scripted world that answers its
steps as the AM's interpreter would, and `plan_run` turns what it did into the plan's run record.
The end configuration is the one `apply_plan` predicts. No processes, no sleeps."""
from __future__ import annotations

from appmaster.cruise.plan import BlockKind, MoveOp, Plan
from appmaster.cruise.plan_builder import ExecutorState, apply_plan, build_plan
from appmaster.cruise.targets import Role, Target
from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.records import PlanOpKind
from appmaster.ps.controller.records import Role as CRole
from appmaster.ps.controller.state import Change, ChangeKind, JobState
from appmaster.ps.cruise_driver import plan_ops, plan_run
from models.cruise_cost import Assignment
from tests.support.controller_world import World, started

BLOCK_BYTES = 100.0


def configuration(job: JobState) -> list[ExecutorState]:
    """The job's executors as Cruise's plan builder sees them (role, owned blocks)."""
    h = job.holdings
    out = [ExecutorState(w, Role.WORKER, frozenset(s)) for w, s in sorted(h.splits.items())]
    return out + [ExecutorState(s, Role.SERVER, frozenset(b)) for s, b in sorted(h.blocks.items())]


def as_built(job: JobState) -> dict[str, ExecutorState]:
    """The controller's view of the job after a plan, in apply_plan's terms."""
    h = job.holdings
    out = {}
    for e in job.executors.values():
        role = Role(e.role.value)
        held = h.splits.get(e.executor_id, []) if role is Role.WORKER else h.blocks.get(e.executor_id, [])
        out[e.executor_id] = ExecutorState(e.executor_id, role, frozenset(held))
    return out


def bad_split() -> tuple[World, list[ExecutorState], Plan]:
    """5 workers / 1 server (40 input splits, 8 model blocks) -> 3 workers / 3 servers, by
    switching two workers to servers in place."""
    w = started(workers=5, servers=1, blocks=8, optimizer="cruise")
    current = configuration(w.job)
    target = Target(Assignment({"worker-1": 14, "worker-2": 13, "worker-3": 13},
                               {"server-1": 3, "worker-4": 3, "worker-5": 2}), 1.0, 1.0)
    return w, current, build_plan(current, target)


def plan_change(w: World) -> Change:
    change = w.job.change
    assert change is not None and change.kind is ChangeKind.PLAN
    return change


def test_plan_ops_keep_the_dag_placeholders_and_what_each_move_carries() -> None:
    _, _, plan = bad_split()
    ops = plan_ops(plan)
    assert [o.op_id for o in ops] == plan.order
    by_id = {o.op_id: o for o in ops}
    for op_id, deps in plan.deps.items():
        assert sorted(by_id[op_id].after) == sorted(deps)
    for op in plan.ops.values():
        mine = by_id[op.op_id]
        if isinstance(op, MoveOp):
            assert mine.kind is PlanOpKind.MOVE and mine.model is (op.kind is BlockKind.MODEL)
            assert (mine.blocks, mine.src, mine.dst) == (list(op.blocks), op.src, op.dst)
    switches = [o for o in ops if o.kind is PlanOpKind.SWITCH]
    assert sorted((o.executor, o.role) for o in switches) == [("worker-4", CRole.SERVER), ("worker-5", CRole.SERVER)]


def test_executes_switches_and_moves_concurrently_in_order() -> None:
    w, current, plan = bad_split()
    w.hold = {ins.StageSplits}
    w.send(ev.PlanProposed(at=w.at(), ops=plan_ops(plan), reason="metrics"))
    change = plan_change(w)
    staged = w.held_of(ins.StageSplits)
    assert {m.src for s in staged for m in s.moves} == {"worker-4", "worker-5"}    # both hand-offs at once
    assert not w.of(ins.SwitchRole)                  # the switches wait for them
    w.hold = set()
    for s in staged:
        w.answer(s)
    assert w.job.phase is Phase.TRAINING and not change.error
    expected = apply_plan(current, plan)
    assert as_built(w.job) == expected
    kinds = w.kinds()
    assert kinds.index("CommitSplits") < kinds.index("SwitchRole") < kinds.index("MoveModelBlocks")
    # The run record: every op done, the moves' bytes (model blocks by size, input data as measured).
    step_bytes = {s: 1000 for s, i in change.steps.items() if isinstance(i, ins.StageSplits)}
    run = plan_run(plan, change, w.at(), step_bytes, BLOCK_BYTES)
    assert run.ok and run.plan.finished and not plan.finished      # the decision's own plan stays as built
    assert run.max_concurrency >= 2
    model_moves = [op for op in plan.ops.values() if isinstance(op, MoveOp) and op.kind is BlockKind.MODEL]
    input_moves = [op for op in plan.ops.values() if isinstance(op, MoveOp) and op.kind is BlockKind.INPUT]
    assert run.bytes_moved == BLOCK_BYTES * sum(len(m.blocks) for m in model_moves) + 1000 * len(input_moves)
    assert all(t.end_s is not None and t.end_s >= t.start_s for t in run.timings.values())
    record = run.record()
    assert [o.id for o in record.ops] == plan.order
    assert {o["state"] for o in record.plan["ops"]} == {"done"}


def test_add_binds_placeholders_before_moves_onto_new_executors() -> None:
    w = started(workers=1, servers=1, blocks=4, optimizer="cruise")
    current = configuration(w.job)
    target = Target(Assignment({"worker-1": 4, "slot-a": 4}, {"server-1": 2, "slot-b": 2}), 1.0, 1.0)
    plan = build_plan(current, target)
    w.hold = {ins.StartExecutors}
    w.send(ev.PlanProposed(at=w.at(), ops=plan_ops(plan), reason="capacity"))
    change = plan_change(w)
    assert not w.of(ins.StageSplits) and not w.of(ins.MoveModelBlocks)     # the moves wait for their adds
    w.hold = set()
    for s in w.held_of(ins.StartExecutors):
        w.answer(s)
    assert change.bindings == {"slot-a": "worker-2", "slot-b": "server-2"}
    assert w.job.holdings.blocks["server-2"] == [2, 3] and len(w.job.holdings.splits["worker-2"]) == 4
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING
    run = plan_run(plan, change, w.at())
    assert run.ok and run.record().plan["bindings"] == {"slot-a": "worker-2", "slot-b": "server-2"}


def test_failure_stops_new_ops_and_leaves_every_block_owned_once() -> None:
    w, current, plan = bad_split()
    w.hold = {ins.StageSplits}
    w.send(ev.PlanProposed(at=w.at(), ops=plan_ops(plan), reason="metrics"))
    change = plan_change(w)
    first, *rest = w.held_of(ins.StageSplits)
    w.hold = set()
    w.fail(first, "broke")
    for s in rest:
        w.answer(s)                # already running: it ends, then gives its staged data up
    assert w.job.phase is Phase.TRAINING and "broke" in change.error
    assert not w.of(ins.SwitchRole)                    # the switches waited for moves that did not all land
    assert w.of(ins.DiscardStaged)
    h = w.job.holdings
    assert sorted(b for bs in h.splits.values() for b in bs) == sorted(b for e in current if e.role is Role.WORKER
                                                                       for b in e.blocks)
    assert sorted(b for bs in h.blocks.values() for b in bs) == list(range(8))
    run = plan_run(plan, change, w.at())
    assert not run.ok and "broke" in run.error
    states = {o["id"]: o["state"] for o in run.record().plan["ops"]}
    assert "failed" in states.values() and states["switch-worker-4"] == "pending"


def test_a_loss_cancels_the_running_ops_and_the_plan_ends_with_none_left_running() -> None:
    w, _, plan = bad_split()
    w.hold = {ins.StageSplits}
    w.send(ev.PlanProposed(at=w.at(), ops=plan_ops(plan), reason="metrics"))
    change = plan_change(w)
    staged = w.held_of(ins.StageSplits)
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-worker-1", "exited 137")]))
    (cancel,) = w.of(ins.CancelSteps)
    assert sorted(cancel.steps) == sorted(s.step for s in staged)     # no op left running behind the plan
    w.hold = set()
    for s in staged:
        w.fail(s, "cancelled", cancelled=True)
    assert w.job.change is not change and change.error.startswith("executor lost")
    run = plan_run(plan, change, w.at())
    assert not run.ok and all(t.end_s is not None for t in run.timings.values())
    assert w.triggers()[-3:] == ["CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
