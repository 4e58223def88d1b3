"""A Cruise plan run by the PS-job controller (planners/cruise_plan.py), stepped by events through
the scripted world: DAG order, concurrency, placeholder binding, the stages of each op, failure
mid-plan, a loss during a plan, and a directive planned by Cruise's optimizer. No processes."""
from __future__ import annotations

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.planners.cruise_plan import plan_problem
from appmaster.ps.controller.records import PlanOp, PlanOpKind, Role
from protocol.internal_api import ShapeDirective
from tests.support.controller_world import World, job_state

ADD, DELETE, SWITCH, MOVE = PlanOpKind.ADD, PlanOpKind.DELETE, PlanOpKind.SWITCH, PlanOpKind.MOVE


def started(**spec: object) -> World:
    fields: dict[str, object] = {"blocks": 4, "optimizer": "cruise"}
    fields.update(spec)
    w = World(job_state(**fields))
    w.start()
    assert w.job.phase is Phase.TRAINING
    return w


def propose(w: World, *ops: PlanOp) -> list[ins.Instruction]:
    return w.send(ev.PlanProposed(at=w.at(), ops=list(ops), reason="metrics"))


def triggers(w: World) -> list[str]:
    return [t for _, t, _ in w.job.history]


def since(w: World, n: int) -> list[str]:
    return [type(i).__name__ for i in w.log[n:]]


def grow_plan() -> list[PlanOp]:
    """One new server taking two model blocks, one new worker taking three input splits."""
    return [PlanOp(op_id="add-servers", kind=ADD, role=Role.SERVER, n=1, placeholders=["s-new"]),
            PlanOp(op_id="add-workers", kind=ADD, role=Role.WORKER, n=1, placeholders=["w-new"]),
            PlanOp(op_id="move-0", kind=MOVE, model=True, blocks=[2, 3], src="server-1", dst="s-new",
                   after=["add-servers"]),
            PlanOp(op_id="move-1", kind=MOVE, blocks=[4, 6, 8], src="worker-1", dst="w-new", after=["add-workers"])]


def test_ready_ops_start_together_and_placeholders_bind_to_the_new_executors() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    propose(w, *grow_plan())
    assert w.job.phase is Phase.EXECUTING_PLAN
    starts = sorted(w.held.values(), key=lambda s: s.step)
    assert [(s.role, s.count) for s in starts] == [(Role.SERVER, 1), (Role.WORKER, 1)]   # type: ignore[union-attr]
    assert not w.of(ins.MoveModelBlocks) and not w.of(ins.StageSplits)      # the moves wait for their adds
    w.hold = set()
    for s in starts:
        w.answer(s)
    joins = w.of(ins.JoinExecutors)
    assert sorted(j.executors[0] for j in joins) == ["server-2", "worker-3"]
    (model,) = w.of(ins.MoveModelBlocks)
    assert [(m.item, m.src, m.dst) for m in model.moves] == [(2, "server-1", "server-2"), (3, "server-1", "server-2")]
    (stage,) = w.of(ins.StageSplits)
    assert {m.dst for m in stage.moves} == {"worker-3"}
    (commit,) = w.of(ins.CommitSplits)
    assert commit.keep_inactive and commit.joining == ["worker-3"]
    kinds = w.kinds()
    assert kinds.index("StageSplits") < kinds.index("CommitSplits")
    assert (w.job.executors["server-2"].role, w.job.executors["worker-3"].role) == (Role.SERVER, Role.WORKER)
    h = w.job.holdings
    assert h.blocks == {"server-1": [0, 1], "server-2": [2, 3]}
    assert h.splits["worker-3"] == [4, 6, 8] and h.inactive["worker-1"] == [4, 6, 8]
    assert w.job.shape == (3, 2)
    assert triggers(w)[-2:] == ["PLAN", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING


def test_an_op_starts_only_after_every_op_it_waits_for() -> None:
    w = started()
    w.hold = {ins.MoveModelBlocks}
    ops = grow_plan()
    ops[3] = PlanOp(op_id="move-1", kind=MOVE, blocks=[4], src="worker-1", dst="w-new",
                    after=["add-workers", "move-0"])
    propose(w, *ops)
    (model,) = w.held.values()
    assert w.job.shape == (3, 2) and not w.of(ins.StageSplits)      # both adds done, move-0 still runs
    w.hold = set()
    w.answer(model)
    assert w.of(ins.StageSplits) and w.job.change is None


def test_switch_and_delete_hand_off_first_and_the_sources_keep_no_copies() -> None:
    w = started(workers=3, servers=2)
    # server-2 becomes a worker: its model blocks go first, then it switches; worker-1's splits
    # move onto it meanwhile (staged now, committed once it is a worker). worker-3 leaves: its
    # splits go to worker-2 first, then it is deleted.
    h = w.job.holdings
    s2_blocks, w1_splits, w3_splits = list(h.blocks["server-2"]), h.splits["worker-1"][:3], list(h.splits["worker-3"])
    w.hold = {ins.SwitchRole}
    propose(w,
            PlanOp(op_id="move-m", kind=MOVE, model=True, blocks=s2_blocks, src="server-2", dst="server-1"),
            PlanOp(op_id="switch-server-2", kind=SWITCH, executor="server-2", role=Role.WORKER, after=["move-m"]),
            PlanOp(op_id="move-i", kind=MOVE, blocks=w1_splits, src="worker-1", dst="server-2"),
            PlanOp(op_id="move-d", kind=MOVE, blocks=w3_splits, src="worker-3", dst="worker-2"),
            PlanOp(op_id="delete-worker-3", kind=DELETE, executor="worker-3", after=["move-d"]))
    (switch,) = w.held.values()
    assert isinstance(switch, ins.SwitchRole) and (switch.executor, switch.role) == ("server-2", Role.WORKER)
    onto_s2 = [c for c in w.of(ins.CommitSplits) if any(m.dst == "server-2" for m in c.moves)]
    assert not onto_s2 and any(m.dst == "server-2" for s in w.of(ins.StageSplits) for m in s.moves)
    retire = w.of(ins.RetireExecutors)
    assert [r.executors for r in retire] == [["worker-3"]]
    leave = [c for c in w.of(ins.CommitSplits) if c.leaving]
    assert [c.leaving for c in leave] == [["worker-3"]]
    to_w2 = next(c for c in w.of(ins.CommitSplits) if any(m.dst == "worker-2" for m in c.moves))
    assert not to_w2.keep_inactive                  # worker-3 leaves in this plan
    w.hold = set()
    w.answer(switch)
    (commit,) = [c for c in w.of(ins.CommitSplits) if any(m.dst == "server-2" for m in c.moves)]
    assert commit.joining == ["server-2"] and commit.keep_inactive
    assert w.job.executors["server-2"].role is Role.WORKER
    assert sorted(h.splits["server-2"]) == sorted(w1_splits) and "server-2" not in w.job.holdings.blocks
    assert w.job.shape == (3, 1) and w.job.change is None and not w.job.diagnostics


def test_first_failure_stops_new_ops_lets_running_ones_end_and_fails_the_change() -> None:
    w = started()
    w.hold = {ins.MoveModelBlocks, ins.StageSplits}
    ops = grow_plan() + [PlanOp(op_id="after-model", kind=MOVE, model=True, blocks=[0], src="server-1",
                                dst="s-new", after=["move-0"])]
    propose(w, *ops)
    model = next(s for s in w.held.values() if isinstance(s, ins.MoveModelBlocks))
    stage = next(s for s in w.held.values() if isinstance(s, ins.StageSplits))
    w.fail(stage, "worker-3 unreachable")
    assert w.log[-1] == ins.DiscardStaged(step=w.log[-1].step, moves=stage.moves)   # type: ignore[union-attr]
    assert w.job.phase is Phase.EXECUTING_PLAN          # move-0 still runs
    n = len(w.log)
    w.answer(model)                                     # it lands; after-model does not start
    assert len(w.of(ins.MoveModelBlocks)) == 1 and "MoveModelBlocks" not in since(w, n)
    retire = w.of(ins.RetireExecutors)[-1]
    assert retire.executors == ["worker-3"] and not retire.released    # the idle newcomer goes again
    assert w.job.phase is Phase.TRAINING and "move-1: worker-3 unreachable" in w.job.diagnostics
    assert w.job.holdings.blocks["server-2"] == [2, 3] and w.job.shape == (2, 2)


def test_an_input_move_waiting_for_a_switch_gives_up_when_the_switch_fails() -> None:
    w = started(workers=2, servers=2)
    s2_blocks = list(w.job.holdings.blocks["server-2"])
    w.hold = {ins.SwitchRole}
    propose(w,
            PlanOp(op_id="move-m", kind=MOVE, model=True, blocks=s2_blocks, src="server-2", dst="server-1"),
            PlanOp(op_id="switch", kind=SWITCH, executor="server-2", role=Role.WORKER, after=["move-m"]),
            PlanOp(op_id="move-i", kind=MOVE, blocks=[0], src="worker-1", dst="server-2"))
    (switch,) = w.held.values()
    w.hold = set()
    w.fail(switch, "switch refused")
    discard = w.of(ins.DiscardStaged)
    assert len(discard) == 1 and discard[0].moves[0].dst == "server-2"
    assert not [c for c in w.of(ins.CommitSplits) if c.moves]
    assert w.job.phase is Phase.TRAINING and "switch refused" in w.job.diagnostics
    assert 0 in w.job.holdings.splits["worker-1"]


def test_an_input_move_onto_an_executor_whose_switch_waits_for_it_gives_up() -> None:
    w = started(workers=2, servers=2)
    s2_blocks = list(w.job.holdings.blocks["server-2"])
    propose(w,
            PlanOp(op_id="move-m", kind=MOVE, model=True, blocks=s2_blocks, src="server-2", dst="server-1"),
            PlanOp(op_id="move-i", kind=MOVE, blocks=[0], src="worker-1", dst="server-2"),
            PlanOp(op_id="switch", kind=SWITCH, executor="server-2", role=Role.WORKER, after=["move-m", "move-i"]))
    assert w.of(ins.DiscardStaged) and not w.of(ins.SwitchRole)
    assert w.job.phase is Phase.TRAINING and "server-2 did not become a worker" in w.job.diagnostics


def test_a_plan_the_job_cannot_run_is_refused_before_any_step() -> None:
    w = started()
    n = len(w.log)
    propose(w, PlanOp(op_id="a", kind=DELETE, executor="worker-9"))
    assert since(w, n) == ["ReportProgress", "ReportProgress"]
    assert "no executor 'worker-9'" in w.job.diagnostics and w.job.phase is Phase.TRAINING
    cycle = [PlanOp(op_id="a", kind=SWITCH, executor="worker-1", role=Role.SERVER, after=["b"]),
             PlanOp(op_id="b", kind=SWITCH, executor="worker-2", role=Role.SERVER, after=["a"])]
    assert "cycle" in plan_problem(w.job, cycle)
    assert "placeholders" in plan_problem(w.job, [PlanOp(op_id="x", kind=ADD, role=Role.WORKER, n=1,
                                                         placeholders=["worker-1"])])
    assert "unknown ops" in plan_problem(w.job, [PlanOp(op_id="x", kind=DELETE, executor="worker-1",
                                                        after=["nope"])])


def test_an_op_meeting_another_configuration_fails_the_plan() -> None:
    w = started()
    propose(w, PlanOp(op_id="m", kind=MOVE, model=True, blocks=[0], src="server-1", dst="worker-1"))
    assert "not a server" in w.job.diagnostics and w.job.phase is Phase.TRAINING
    propose(w, PlanOp(op_id="d", kind=DELETE, executor="worker-1"))
    assert "worker-1 still holds input splits" in w.job.diagnostics
    assert w.job.shape == (2, 1) and not w.of(ins.RetireExecutors)


def test_a_loss_during_a_plan_aborts_it_then_the_recovery_runs() -> None:
    w = started()
    w.hold = {ins.StageSplits}
    propose(w, *grow_plan())
    (stage,) = w.held.values()
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 137")]))
    assert w.log[-1] == ins.CancelSteps(steps=[stage.step])
    w.hold = set()
    w.fail(stage, "cancelled", cancelled=True)
    assert triggers(w)[-3:] == ["CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
    assert w.of(ins.DiscardStaged)[0].moves == stage.moves
    assert w.of(ins.RetireExecutors)[0] == ins.RetireExecutors(step=w.of(ins.RetireExecutors)[0].step,
                                                               executors=["worker-3"], released=False)
    assert w.of(ins.RestoreCheckpoint)[-1].directory == "ckpt/epoch-0"
    # The new server had landed its blocks before the loss: the shape recovered includes it.
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING and w.job.failures == 1


def test_a_directive_under_cruise_is_planned_by_the_optimizer_first() -> None:
    w = started()
    w.plan = [PlanOp(op_id="add-workers", kind=ADD, role=Role.WORKER, n=1, placeholders=["w"]),
              PlanOp(op_id="move-0", kind=MOVE, blocks=[0, 2, 4], src="worker-1", dst="w", after=["add-workers"])]
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=2, servers=2, version=1,
                                                                   nodes=["n2"])))
    (compute,) = w.of(ins.ComputePlan)
    assert (compute.workers, compute.servers, compute.nodes) == (2, 2, ["n2"])
    assert w.of(ins.StartExecutors)[-1].nodes == ["n2"]
    assert w.job.shape == (3, 1) and w.job.applied_directive == 1 and w.job.phase is Phase.TRAINING
    assert triggers(w)[-2:] == ["PLAN", "CHANGE_DONE"]


def test_cruise_keeping_its_configuration_or_a_directive_for_as_many_containers_changes_nothing() -> None:
    w = started()
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=1, servers=2, version=1)))
    assert not w.of(ins.ComputePlan) and w.log[-1] == ins.ReportProgress(changing=False, directive_version=1)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=3, servers=1, version=2)))
    assert len(w.of(ins.ComputePlan)) == 1 and not w.job.diagnostics
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING


def test_cruise_failing_to_plan_fails_the_change_only() -> None:
    w = started()
    w.hold = {ins.ComputePlan}
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=3, servers=1, version=1)))
    (compute,) = w.held.values()
    w.fail(compute, "cannot decide: no worker reports yet")
    assert w.job.phase is Phase.TRAINING and "Cruise could not plan" in w.job.diagnostics


def test_a_proposal_while_another_change_runs_is_ignored() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    n = len(w.log)
    propose(w, *grow_plan())
    assert since(w, n) == [] and w.job.phase is Phase.RESHAPING
