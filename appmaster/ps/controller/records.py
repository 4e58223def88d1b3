"""Typed records shared by the controller's events, instructions and state."""
from __future__ import annotations

import enum
from typing import Optional

import msgspec


class Role(str, enum.Enum):
    """An executor's role (the values of appmaster.ps.runtime.executor_pool.Role and of container tags)."""

    WORKER = "worker"
    SERVER = "server"


class ExecutorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One executor of the job: which, in what role, in which container, on which node."""

    executor_id: str
    role: Role
    container_id: str
    node: str


class Move(msgspec.Struct, frozen=True):
    """Move `item` (a model block or an input split) from `src` to `dst`; `reactivate`: the
    destination keeps the split in its inactive dataset already, so only its state travels."""

    item: int
    src: str
    dst: str
    reactivate: bool = False


class Holdings(msgspec.Struct, kw_only=True):
    """Who holds what: model blocks by server, active and inactive input splits by worker."""

    blocks: dict[str, list[int]] = {}
    splits: dict[str, list[int]] = {}
    inactive: dict[str, list[int]] = {}

    def copy(self) -> "Holdings":
        return Holdings(blocks={k: list(v) for k, v in self.blocks.items()},
                        splits={k: list(v) for k, v in self.splits.items()},
                        inactive={k: list(v) for k, v in self.inactive.items()})


class PlanOpKind(str, enum.Enum):
    ADD = "add"
    DELETE = "delete"
    SWITCH = "switch"
    MOVE = "move"


class PlanOp(msgspec.Struct, frozen=True, kw_only=True):
    """One operation of a Cruise plan (appmaster.cruise.plan's ops, typed for the controller):
    `after` lists the ops it waits for; an add names its executors by `placeholders` until they
    exist; a move's `model` says model blocks (servers) rather than input splits (workers)."""

    op_id: str
    kind: PlanOpKind
    after: list[str] = []
    role: Optional[Role] = None
    n: int = 0
    placeholders: list[str] = []
    executor: str = ""
    model: bool = False
    blocks: list[int] = []
    src: str = ""
    dst: str = ""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """A shape to carry the job to: workers and servers, where (`nodes`: the only nodes allowed;
    `placement`: exactly this many of each role per node) and on what executor size."""

    workers: int
    servers: int
    nodes: list[str] = []
    placement: list[tuple[str, int, int]] = []       # (node, workers, servers)
    memory_mb: Optional[int] = None
    vcores: Optional[int] = None

    def per_node(self, role: Role) -> dict[str, int]:
        counts = ((node, w if role is Role.WORKER else s) for node, w, s in self.placement)
        return {node: n for node, n in counts if n > 0}
