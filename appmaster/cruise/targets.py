"""From a solver's role counts to a concrete target configuration over slots.

A slot is a container that can run one executor: an existing executor (with its current role) or
capacity the RM granted and no executor runs on yet. Solvers decide how many workers each class of
identical slots gets; which slots of a class take which role is free, so we keep current roles
where we can (no switch, no move of the state it holds), switching the executors that hold the
fewest blocks, and give new slots whatever roles remain. Blocks are then split optimally
(balance.split_blocks) and the target is priced by the cost model.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from models.cruise_cost import Assignment, CostModelError, JobProfile, NodeProfile, epoch_time

from .balance import split_blocks


class Role(str, enum.Enum):
    """What an executor runs."""

    WORKER = "worker"
    SERVER = "server"

    @property
    def other(self) -> "Role":
        return Role.SERVER if self is Role.WORKER else Role.WORKER


@dataclass(frozen=True)
class Slot:
    """One container the job may use, with its measured profile and current role (None = free)."""

    profile: NodeProfile
    role: Optional[Role] = None
    blocks_held: int = 0       # blocks of its current role's kind it holds (input or model)

    @property
    def slot_id(self) -> str:
        return self.profile.node_id


@dataclass(frozen=True)
class Target:
    """A chosen configuration: per-slot roles and block counts, and its predicted epoch time."""

    assignment: Assignment
    epoch_s: float                      # eq. 3.1-3.4 with ceil(d_i / B) mini-batches
    epoch_s_continuous: float           # the same with d_i / B, the solvers' objective
    solver: str = ""
    solve_ms: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return self.assignment.shape

    def role_of(self, slot_id: str) -> Optional[Role]:
        if slot_id in self.assignment.workers:
            return Role.WORKER
        if slot_id in self.assignment.servers:
            return Role.SERVER
        return None

    def to_json(self) -> dict:
        return {"workers": len(self.assignment.workers), "servers": len(self.assignment.servers),
                "input_blocks": dict(sorted(self.assignment.workers.items())),
                "model_blocks": dict(sorted(self.assignment.servers.items())),
                "epoch_s": self.epoch_s, "epoch_s_continuous": self.epoch_s_continuous,
                "solver": self.solver, "solve_ms": self.solve_ms, **self.details}


def choose_workers(slots: Sequence[Slot], n_workers: int) -> list[Slot]:
    """`n_workers` of `slots` (one class of identical slots) to run workers, keeping roles stable:
    current workers first (most blocks held first), then free slots, then servers holding fewest
    model blocks (the cheapest to switch)."""
    if not 0 <= n_workers <= len(slots):
        raise ValueError(f"cannot pick {n_workers} workers among {len(slots)} slots")

    def preference(s: Slot) -> tuple:
        if s.role is Role.WORKER:
            return (0, -s.blocks_held, s.slot_id)
        if s.role is None:
            return (1, 0, s.slot_id)
        return (2, s.blocks_held, s.slot_id)

    return sorted(slots, key=preference)[:n_workers]


def build_target(job: JobProfile, slots: Sequence[Slot], workers: Sequence[str], solver: str = "",
                 solve_ms: float = 0.0, details: Optional[dict] = None) -> Target:
    """Target with `workers` as workers, every other slot a server, blocks split optimally."""
    worker_set = set(workers)
    w_slots = [s for s in slots if s.slot_id in worker_set]
    s_slots = [s for s in slots if s.slot_id not in worker_set]
    if len(w_slots) != len(worker_set):
        raise CostModelError(f"unknown worker slots {sorted(worker_set - {s.slot_id for s in slots})}")
    if not w_slots or not s_slots:
        raise CostModelError(f"a configuration needs >= 1 worker and >= 1 server, "
                             f"got ({len(w_slots)}, {len(s_slots)})")
    d, m = split_blocks(job, np.array([s.profile.compute_s_per_sample for s in w_slots]),
                        np.array([s.profile.worker_bandwidth for s in w_slots]),
                        np.array([s.profile.server_bandwidth for s in s_slots]),
                        np.array([s.profile.latency_s_per_batch for s in w_slots]))
    assignment = Assignment({s.slot_id: int(x) for s, x in zip(w_slots, d)},
                            {s.slot_id: int(x) for s, x in zip(s_slots, m)})
    nodes = {s.slot_id: s.profile for s in slots}
    return Target(assignment, epoch_time(job, nodes, assignment, True),
                  epoch_time(job, nodes, assignment, False), solver, solve_ms, dict(details or {}))
