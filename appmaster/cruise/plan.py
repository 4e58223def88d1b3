"""A reconfiguration plan: a DAG of Elastic Runtime operations (dissertation §3.3.1 Optimization
Execution, Table 3.2) and the state of its execution.

Operations: `add(n, role)` new executors (named by placeholders until the AM binds the real ids),
`delete(executor)`, `switch(executor, role)` in place, and `move(kind, blocks, src, dst)` of input
blocks between workers or model blocks between servers. An edge a -> b means b may start only
after a is done. The executor of the plan (the AM) loops: `ready()` -> start them concurrently
(`start`) -> `done` / `failed` as each finishes. Each operation's state follows an explicit
transition table; the plan itself holds no I/O.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional, Sequence, Union

from protocol.state_machine import TransitionTable

from .targets import Role
from protocol.errors import PlanningError


class PlanError(PlanningError, RuntimeError):
    """An illegal use of a plan: unknown op, a transition the table forbids, a cycle."""


class BlockKind(str, enum.Enum):
    """Which kind of block a move carries: training input (workers) or model (servers)."""

    INPUT = "input"
    MODEL = "model"

    @property
    def holder(self) -> Role:
        return Role.WORKER if self is BlockKind.INPUT else Role.SERVER


@dataclass(frozen=True)
class AddOp:
    """Launch `n` executors with `role`; `placeholders` name them until they exist."""

    op_id: str
    n: int
    role: Role
    placeholders: tuple[str, ...]

    def to_json(self) -> dict:
        return {"op": "add", "id": self.op_id, "n": self.n, "role": self.role.value,
                "executors": list(self.placeholders)}


@dataclass(frozen=True)
class DeleteOp:
    """Stop `executor` and release its container (it holds no blocks by then)."""

    op_id: str
    executor: str

    def to_json(self) -> dict:
        return {"op": "delete", "id": self.op_id, "executor": self.executor}


@dataclass(frozen=True)
class SwitchOp:
    """Change `executor` to `role` in place (worker <-> server)."""

    op_id: str
    executor: str
    role: Role

    def to_json(self) -> dict:
        return {"op": "switch", "id": self.op_id, "executor": self.executor, "role": self.role.value}


@dataclass(frozen=True)
class MoveOp:
    """Migrate `blocks` of `kind` from `src` to `dst`."""

    op_id: str
    kind: BlockKind
    blocks: tuple[int, ...]
    src: str
    dst: str

    def to_json(self) -> dict:
        return {"op": "move", "id": self.op_id, "kind": self.kind.value, "blocks": list(self.blocks),
                "src": self.src, "dst": self.dst}


Op = Union[AddOp, DeleteOp, SwitchOp, MoveOp]


class OpState(str, enum.Enum):
    """Where one operation of a plan is."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class OpEvent(str, enum.Enum):
    """What happens to one operation: the AM starts it, it finishes, or it fails."""

    START = "start"
    FINISH = "finish"
    FAIL = "fail"


# One operation's lifecycle: pending -> running -> done | failed (both final).
OP_TRANSITIONS: TransitionTable[OpState, OpEvent, OpState] = TransitionTable({
    (OpState.PENDING, OpEvent.START): OpState.RUNNING,
    (OpState.RUNNING, OpEvent.FINISH): OpState.DONE,
    (OpState.RUNNING, OpEvent.FAIL): OpState.FAILED,
}, lambda state, event: PlanError(f"cannot {event.value} a {state.value} op"))


class Plan:
    """Operations, their prerequisites, and where execution stands."""

    def __init__(self, ops: Sequence[Op], deps: Mapping[str, Iterable[str]]) -> None:
        self.ops: dict[str, Op] = {}
        for op in ops:
            if op.op_id in self.ops:
                raise PlanError(f"duplicate op id {op.op_id}")
            self.ops[op.op_id] = op
        self.deps: dict[str, frozenset[str]] = {o: frozenset(deps.get(o, ())) for o in self.ops}
        for o, ds in self.deps.items():
            unknown = ds - set(self.ops)
            if unknown:
                raise PlanError(f"{o} depends on unknown ops {sorted(unknown)}")
        self.state: dict[str, OpState] = {o: OpState.PENDING for o in self.ops}
        self.errors: dict[str, str] = {}
        self.bindings: dict[str, str] = {}       # placeholder -> real executor id
        self.order = self.topological_order()    # raises on a cycle

    def topological_order(self) -> list[str]:
        """Op ids with every op after its prerequisites (stable by insertion order)."""
        remaining = {o: set(ds) for o, ds in self.deps.items()}
        order: list[str] = []
        while remaining:
            free = [o for o in self.ops if o in remaining and not remaining[o]]
            if not free:
                raise PlanError(f"the plan has a dependency cycle among {sorted(remaining)}")
            for o in free:
                del remaining[o]
                order.append(o)
            for ds in remaining.values():
                ds.difference_update(free)
        return order

    def _on(self, op_id: str, event: OpEvent) -> None:
        if op_id not in self.ops:
            raise PlanError(f"no op {op_id} in this plan")
        self.state[op_id] = OP_TRANSITIONS.next(self.state[op_id], event)

    def resolve(self, name: str) -> str:
        return self.bindings.get(name, name)

    def _resolved(self, op: Op) -> Op:
        if isinstance(op, MoveOp):
            return replace(op, src=self.resolve(op.src), dst=self.resolve(op.dst))
        if isinstance(op, (DeleteOp, SwitchOp)):
            return replace(op, executor=self.resolve(op.executor))
        return op

    def ready(self) -> list[Op]:
        """Pending ops whose prerequisites are all done (none once the plan failed), with
        placeholders replaced by the executor ids bound so far. They may run concurrently."""
        if self.failed:
            return []
        return [self._resolved(self.ops[o]) for o in self.order
                if self.state[o] is OpState.PENDING
                and all(self.state[d] is OpState.DONE for d in self.deps[o])]

    def start(self, op_id: str) -> Op:
        if any(self.state[d] is not OpState.DONE for d in self.deps[op_id]):
            raise PlanError(f"op {op_id} started before its prerequisites finished")
        self._on(op_id, OpEvent.START)
        return self._resolved(self.ops[op_id])

    def done(self, op_id: str, executors: Optional[Sequence[str]] = None) -> None:
        """`op_id` finished; for an add, `executors` are the real ids of its new executors, in the
        order of its placeholders."""
        op = self.ops.get(op_id)
        if isinstance(op, AddOp):
            if executors is None or len(executors) != op.n:
                raise PlanError(f"add {op_id} created {op.n} executors; pass their {op.n} ids")
            self.bindings.update(zip(op.placeholders, executors))
        self._on(op_id, OpEvent.FINISH)

    def fail(self, op_id: str, reason: str) -> None:
        self._on(op_id, OpEvent.FAIL)
        self.errors[op_id] = reason

    @property
    def failed(self) -> bool:
        return any(s is OpState.FAILED for s in self.state.values())

    @property
    def finished(self) -> bool:
        return all(s is OpState.DONE for s in self.state.values())

    def of_type(self, cls: type) -> list[Op]:
        return [op for op in self.ops.values() if isinstance(op, cls)]

    def to_json(self) -> dict:
        return {"ops": [{**self.ops[o].to_json(), "after": sorted(self.deps[o]), "state": self.state[o].value}
                        for o in self.order],
                "errors": dict(self.errors), "bindings": dict(self.bindings)}
