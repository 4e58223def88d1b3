"""Current configuration + chosen target -> reconfiguration Plan (dissertation §3.3.1), and the
rule that decides whether a plan is worth executing.

Roles: an executor whose slot is in the target keeps or switches its role (a switch costs no
container, so it is always preferred to delete + add), an executor not in the target is deleted,
a target slot with no executor is added (one `add(n, role)` per role).
Blocks: for each kind (input blocks among workers, model blocks among servers) sources hold more
than their target, destinations fewer; moves pair the largest surplus with the largest deficit,
greedily, largest change first, which moves the fewest blocks (exactly the total surplus) in at
most sources + destinations - 1 moves.
Edges: add(A) -> moves onto A; moves off E -> switch(E) or delete(E) (an executor hands off its
state before it changes role or goes); switch(E) -> model moves onto E (it must be a server before
it owns model blocks). Input moves onto an executor switching to worker need not wait for the
switch: input blocks are immutable data its store can hold in either role, and dropping that edge
keeps the graph acyclic when one executor switches each way and they trade blocks.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

from .plan import AddOp, BlockKind, DeleteOp, MoveOp, Op, Plan, PlanError, SwitchOp
from .targets import Role, Target

DEFAULT_GAIN_THRESHOLD = 0.05   # dissertation §3.3.1: below 5% predicted gain, don't reconfigure


@dataclass(frozen=True)
class ExecutorState:
    """An executor as it is now: its role and the blocks it owns (input if worker, model if server)."""

    executor_id: str
    role: Role
    blocks: frozenset[int] = frozenset()


def predicted_gain(before_s: float, after_s: float) -> float:
    """Relative predicted reduction of the epoch time."""
    return (before_s - after_s) / before_s if before_s > 0 else 0.0


def should_reconfigure(before_s: float, after_s: float, threshold: float = DEFAULT_GAIN_THRESHOLD) -> bool:
    """Execute a plan only if it is predicted to cut the epoch time by at least `threshold`
    (avoids oscillating around the estimated optimum)."""
    return predicted_gain(before_s, after_s) >= threshold


def _check_current(current: Sequence[ExecutorState]) -> None:
    seen_ids: set[str] = set()
    owners: dict[tuple[Role, int], str] = {}
    for e in current:
        if e.executor_id in seen_ids:
            raise PlanError(f"executor {e.executor_id} listed twice")
        seen_ids.add(e.executor_id)
        for b in e.blocks:
            other = owners.setdefault((e.role, b), e.executor_id)
            if other != e.executor_id:
                kind = "input" if e.role is Role.WORKER else "model"
                raise PlanError(f"{kind} block {b} is owned by both {other} and {e.executor_id}")


def _greedy_moves(kind: BlockKind, holdings: Mapping[str, list[int]], targets: Mapping[str, int],
                  next_id: list[int]) -> list[MoveOp]:
    surplus = [(-(len(b) - targets.get(e, 0)), e) for e, b in holdings.items() if len(b) > targets.get(e, 0)]
    deficit = [(-(t - len(holdings.get(e, []))), e) for e, t in targets.items() if t > len(holdings.get(e, []))]
    if sum(-s for s, _ in surplus) != sum(-d for d, _ in deficit):
        raise PlanError(f"{kind.value} blocks: executors hold {sum(len(b) for b in holdings.values())}, "
                        f"the target places {sum(targets.values())}")
    heapq.heapify(surplus)
    heapq.heapify(deficit)
    pools = {e: sorted(b) for e, b in holdings.items()}
    moves = []
    while surplus:
        s_neg, src = heapq.heappop(surplus)
        d_neg, dst = heapq.heappop(deficit)
        k = min(-s_neg, -d_neg)
        pool = pools[src]
        blocks, pools[src] = tuple(pool[len(pool) - k:]), pool[:len(pool) - k]
        moves.append(MoveOp(f"move-{next_id[0]}", kind, blocks, src, dst))
        next_id[0] += 1
        if -s_neg > k:
            heapq.heappush(surplus, (s_neg + k, src))
        if -d_neg > k:
            heapq.heappush(deficit, (d_neg + k, dst))
    return moves


def build_plan(current: Sequence[ExecutorState], target: Target) -> Plan:
    """The plan that turns `current` into `target` (see the module doc). Target slot ids are
    executor ids for existing executors; any other slot id is a new executor's placeholder."""
    _check_current(current)
    by_id = {e.executor_id: e for e in current}
    ops: list[Op] = []
    deps: dict[str, set[str]] = {}
    creator: dict[str, str] = {}        # executor/placeholder -> op that must precede moves onto it
    switch_of: dict[str, str] = {}
    delete_of: dict[str, str] = {}

    for e in current:
        role = target.role_of(e.executor_id)
        if role is None:
            delete = DeleteOp(f"delete-{e.executor_id}", e.executor_id)
            delete_of[e.executor_id] = delete.op_id
            ops.append(delete)
        elif role is not e.role:
            switch = SwitchOp(f"switch-{e.executor_id}", e.executor_id, role)
            switch_of[e.executor_id] = switch.op_id
            ops.append(switch)
    for role, slots in ((Role.WORKER, target.assignment.workers), (Role.SERVER, target.assignment.servers)):
        new = tuple(sorted(s for s in slots if s not in by_id))
        if new:
            add = AddOp(f"add-{role.value}s", len(new), role, new)
            ops.append(add)
            creator.update({s: add.op_id for s in new})

    next_id = [0]
    moves: list[MoveOp] = []
    for kind, targets in ((BlockKind.INPUT, target.assignment.workers), (BlockKind.MODEL, target.assignment.servers)):
        holdings = {e.executor_id: sorted(e.blocks) for e in current if e.role is kind.holder}
        moves += _greedy_moves(kind, holdings, targets, next_id)
    for m in moves:
        deps[m.op_id] = set()
        if m.dst in creator:
            deps[m.op_id].add(creator[m.dst])
        if m.kind is BlockKind.MODEL and m.dst in switch_of:
            deps[m.op_id].add(switch_of[m.dst])
        after_src = switch_of.get(m.src) or delete_of.get(m.src)
        if after_src:
            deps.setdefault(after_src, set()).add(m.op_id)
    return Plan([*ops, *moves], deps)


def apply_plan(current: Sequence[ExecutorState], plan: Plan) -> dict[str, ExecutorState]:
    """What the configuration would be after every op of `plan`, in dependency order (placeholders
    stay as ids). Used to check plans; raises if an op is inconsistent with the state it meets:
    a switch or delete of an executor still owning blocks of its role, a move of blocks the source
    does not own, or an executor left owning blocks of the kind its final role does not serve."""
    roles = {e.executor_id: e.role for e in current}
    held: dict[str, dict[BlockKind, set[int]]] = {
        e.executor_id: {BlockKind.INPUT: set(), BlockKind.MODEL: set()} for e in current}
    for e in current:
        held[e.executor_id][BlockKind.INPUT if e.role is Role.WORKER else BlockKind.MODEL] |= e.blocks
    for o in plan.order:
        op = plan.ops[o]
        if isinstance(op, AddOp):
            for p in op.placeholders:
                if p in roles:
                    raise PlanError(f"{o}: executor {p} already exists")
                roles[p], held[p] = op.role, {BlockKind.INPUT: set(), BlockKind.MODEL: set()}
        elif isinstance(op, (SwitchOp, DeleteOp)):
            old_kind = BlockKind.INPUT if roles[op.executor] is Role.WORKER else BlockKind.MODEL
            if held[op.executor][old_kind]:
                raise PlanError(f"{o}: {op.executor} still owns {old_kind.value} blocks "
                                f"{sorted(held[op.executor][old_kind])[:5]}")
            if isinstance(op, SwitchOp):
                roles[op.executor] = op.role
            else:
                if held[op.executor][BlockKind.INPUT] or held[op.executor][BlockKind.MODEL]:
                    raise PlanError(f"{o}: {op.executor} still owns blocks")
                del roles[op.executor], held[op.executor]
        else:
            if op.kind is BlockKind.MODEL and roles[op.dst] is not Role.SERVER:
                raise PlanError(f"{o}: model blocks moved onto {op.dst}, which is not a server yet")
            if not set(op.blocks) <= held[op.src][op.kind]:
                raise PlanError(f"{o}: {op.src} does not own {op.kind.value} blocks {op.blocks}")
            held[op.src][op.kind] -= set(op.blocks)
            held[op.dst][op.kind] |= set(op.blocks)
    out = {}
    for eid, role in roles.items():
        kind = BlockKind.INPUT if role is Role.WORKER else BlockKind.MODEL
        other = BlockKind.MODEL if kind is BlockKind.INPUT else BlockKind.INPUT
        if held[eid][other]:
            raise PlanError(f"{eid} ends as {role.value} owning {other.value} blocks")
        out[eid] = ExecutorState(eid, role, frozenset(held[eid][kind]))
    return out
