"""Reconfiguration plans: the right ops for a transition, switches before delete+add, blocks
conserved, a valid dependency order, concurrency of independent ops, the op state machine and
the gain threshold."""
import pytest

from appmaster.cruise.plan import (OP_TRANSITIONS, AddOp, BlockKind, DeleteOp, MoveOp, OpEvent, OpState, Plan,
                                   PlanError, SwitchOp)
from appmaster.cruise.plan_builder import (ExecutorState, apply_plan, build_plan, predicted_gain,
                                           should_reconfigure)
from appmaster.cruise.targets import Role, Target
from models.cruise_cost import Assignment

W, S = Role.WORKER, Role.SERVER


def target(workers, servers):
    return Target(Assignment(workers, servers), 1.0, 1.0)


def split(n_blocks, ids):
    """Round-robin ownership of n_blocks over ids."""
    own = {i: set() for i in ids}
    for b in range(n_blocks):
        own[ids[b % len(ids)]].add(b)
    return own


def config(workers, servers, input_blocks=60, model_blocks=30):
    inp, mod = split(input_blocks, workers), split(model_blocks, servers)
    return ([ExecutorState(w, W, frozenset(inp[w])) for w in workers]
            + [ExecutorState(s, S, frozenset(mod[s])) for s in servers])


def check_conserved(current, plan, tgt, input_blocks=60, model_blocks=30):
    final = apply_plan(current, plan)
    inp = [b for e in final.values() if e.role is W for b in e.blocks]
    mod = [b for e in final.values() if e.role is S for b in e.blocks]
    assert sorted(inp) == list(range(input_blocks))          # every block exactly one owner
    assert sorted(mod) == list(range(model_blocks))
    assert {e: len(x.blocks) for e, x in final.items() if x.role is W} == dict(tgt.assignment.workers)
    assert {e: len(x.blocks) for e, x in final.items() if x.role is S} == dict(tgt.assignment.servers)
    return final


def run_to_completion(plan, bind=None):
    """Execute like the AM: start every ready op, finish them, repeat. Returns the rounds."""
    rounds = []
    while not plan.finished:
        ready = plan.ready()
        assert ready, "stuck: pending ops but none ready"
        rounds.append(ready)
        for op in ready:
            plan.start(op.op_id)
        for op in ready:
            if isinstance(op, AddOp):
                plan.done(op.op_id, [(bind or {}).get(p, "c-" + p) for p in op.placeholders])
            else:
                plan.done(op.op_id)
    return rounds


def test_1_5_to_4_2_switches_three_servers():
    current = config(["w0"], ["s0", "s1", "s2", "s3", "s4"])
    tgt = target({"w0": 15, "s2": 15, "s3": 15, "s4": 15}, {"s0": 15, "s1": 15})
    plan = build_plan(current, tgt)
    switches = plan.of_type(SwitchOp)
    assert sorted(op.executor for op in switches) == ["s2", "s3", "s4"]
    assert all(op.role is W for op in switches)
    assert not plan.of_type(AddOp) and not plan.of_type(DeleteOp)
    check_conserved(current, plan, tgt)
    # Model blocks leave each switching server before its switch.
    for op in switches:
        moves_off = {m.op_id for m in plan.of_type(MoveOp) if m.src == op.executor}
        assert moves_off and moves_off <= plan.deps[op.op_id]
    # Largest change first: w0 gives 45 of its 60 input blocks, in exactly 3 moves of 15.
    input_moves = [m for m in plan.of_type(MoveOp) if m.kind is BlockKind.INPUT]
    assert sorted(len(m.blocks) for m in input_moves) == [15, 15, 15]
    assert sum(len(m.blocks) for m in plan.of_type(MoveOp)) == 45 + 18   # minimal: the total surplus


def test_4_2_to_1_5_switches_back_model_waits_for_switch():
    current = config(["w0", "w1", "w2", "w3"], ["s0", "s1"])
    tgt = target({"w0": 60}, {"s0": 6, "s1": 6, "w1": 6, "w2": 6, "w3": 6})
    plan = build_plan(current, tgt)
    assert sorted(op.executor for op in plan.of_type(SwitchOp)) == ["w1", "w2", "w3"]
    for m in plan.of_type(MoveOp):
        if m.kind is BlockKind.MODEL and m.dst.startswith("w"):
            assert f"switch-{m.dst}" in plan.deps[m.op_id]
    check_conserved(current, plan, tgt)


def test_two_way_switch_has_no_cycle():
    # A worker becomes a server and a server becomes a worker: they trade blocks both ways.
    current = config(["a", "b"], ["c", "d"])
    tgt = target({"b": 30, "c": 30}, {"a": 15, "d": 15})
    plan = build_plan(current, tgt)
    assert {op.executor for op in plan.of_type(SwitchOp)} == {"a", "c"}
    check_conserved(current, plan, tgt)
    run_to_completion(plan)


def test_grow_adds_before_moves_and_binds_real_ids():
    current = config(["w0", "w1"], ["s0"])
    tgt = target({"w0": 20, "w1": 20, "free-0": 20}, {"s0": 15, "free-1": 15})
    plan = build_plan(current, tgt)
    adds = {op.role: op for op in plan.of_type(AddOp)}
    assert adds[W].placeholders == ("free-0",) and adds[S].placeholders == ("free-1",)
    for m in plan.of_type(MoveOp):
        if m.dst in ("free-0", "free-1"):
            assert plan.deps[m.op_id] == {adds[W if m.dst == "free-0" else S].op_id}
    check_conserved(current, plan, tgt)
    # Adds are the only ops ready at first; their moves then carry the real container ids.
    assert {op.op_id for op in plan.ready()} == {adds[W].op_id, adds[S].op_id}
    for op in plan.ready():
        plan.start(op.op_id)
        plan.done(op.op_id, ["container_9" if op.role is W else "container_8"])
    dsts = {m.dst for m in plan.ready() if isinstance(m, MoveOp)}
    assert dsts == {"container_9", "container_8"}


def test_shrink_deletes_after_moving_state_off():
    current = config(["w0", "w1", "w2"], ["s0", "s1"])
    tgt = target({"w0": 30, "w1": 30}, {"s0": 30})
    plan = build_plan(current, tgt)
    deletes = {op.executor: op for op in plan.of_type(DeleteOp)}
    assert set(deletes) == {"w2", "s1"}
    for ex, op in deletes.items():
        assert {m.op_id for m in plan.of_type(MoveOp) if m.src == ex} == set(plan.deps[op.op_id])
    check_conserved(current, plan, tgt)


def test_dependency_order_and_concurrency():
    current = config(["w0"], ["s0", "s1", "s2", "s3", "s4"])
    tgt = target({"w0": 15, "s2": 15, "s3": 15, "s4": 15}, {"s0": 15, "s1": 15})
    plan = build_plan(current, tgt)
    pos = {o: i for i, o in enumerate(plan.order)}
    for o, ds in plan.deps.items():
        assert all(pos[d] < pos[o] for d in ds)
    rounds = run_to_completion(plan)
    first = {op.op_id for op in rounds[0]}
    # Every model move off a switching server and every input move is independent: all ready at once.
    assert {m.op_id for m in plan.of_type(MoveOp)} <= first
    assert len(rounds) == 2 and all(isinstance(op, SwitchOp) for op in rounds[1])


def test_op_state_machine_and_failures():
    assert not any(OP_TRANSITIONS.allows(s, e) for s in (OpState.DONE, OpState.FAILED) for e in OpEvent)
    current = config(["w0", "w1"], ["s0"])
    plan = build_plan(current, target({"w0": 60}, {"s0": 15, "w1": 15}))
    switch = plan.of_type(SwitchOp)[0]
    with pytest.raises(PlanError, match="before its prerequisites"):
        plan.start(switch.op_id)
    move = plan.ready()[0]
    with pytest.raises(PlanError, match="cannot finish a pending op"):
        plan.done(move.op_id)
    plan.start(move.op_id)
    plan.fail(move.op_id, "source died")
    assert plan.failed and plan.ready() == [] and plan.errors == {move.op_id: "source died"}


def test_cycle_and_bad_inputs_are_refused():
    a, b = DeleteOp("a", "x"), DeleteOp("b", "y")
    with pytest.raises(PlanError, match="cycle"):
        Plan([a, b], {"a": ["b"], "b": ["a"]})
    with pytest.raises(PlanError, match="owned by both"):
        build_plan([ExecutorState("w0", W, frozenset({1})), ExecutorState("w1", W, frozenset({1}))],
                   target({"w0": 1}, {"s": 0}))
    with pytest.raises(PlanError, match="input blocks"):
        build_plan(config(["w0"], ["s0"]), target({"w0": 59}, {"s0": 30}))


def test_unchanged_configuration_gives_empty_plan():
    current = config(["w0", "w1"], ["s0"])
    plan = build_plan(current, target({"w0": 30, "w1": 30}, {"s0": 30}))
    assert plan.ops == {} and plan.finished


def test_gain_threshold():
    assert predicted_gain(100.0, 90.0) == pytest.approx(0.10)
    assert should_reconfigure(100.0, 94.0)
    assert not should_reconfigure(100.0, 96.0)            # 4% < 5%
    assert not should_reconfigure(100.0, 96.0, 0.05)
    assert should_reconfigure(100.0, 96.0, threshold=0.03)
    assert not should_reconfigure(100.0, 110.0)


def test_a_finished_op_cannot_start_or_fail_again():
    plan = build_plan(config(["w0", "w1"], ["s0"]), target({"w0": 60}, {"s0": 15, "w1": 15}))
    move = plan.ready()[0]
    plan.start(move.op_id)
    with pytest.raises(PlanError, match="cannot start a running op"):
        plan.start(move.op_id)
    plan.done(move.op_id)
    assert plan.state[move.op_id] is OpState.DONE
    with pytest.raises(PlanError, match="cannot fail a done op"):
        plan.fail(move.op_id, "late")
