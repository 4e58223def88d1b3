"""A policy's output: a typed `Decision` holding one `JobDecision` per job it reshapes.

A `JobDecision` says what a job should look like: its shape (workers, servers), where its
executors go (`placement`: per node, how many of each role; empty = anywhere), its co-location
group (Harmony; None = none), its run state (run / pause / resume), the size of its executor
containers (Harmony; None = the job spec's) and why. The policy runner
(rm/policy_runner.py) turns each into the app's `ShapeDirective` -- the wire form the AM receives
(protocol/internal_api.py) -- numbering it only when it differs from the app's current directive.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.records import Resource
from protocol.errors import PlanningError


class DecisionError(PlanningError, ValueError):
    """A job decision that does not hold together (a policy bug)."""


@dataclass(frozen=True)
class JobDecision:
    """What a policy wants of one job. With a placement, its counts add up to the shape."""

    workers: int
    servers: int
    placement: tuple[NodePlacement, ...] = ()
    group: Optional[str] = None
    run_state: RunState = RunState.RUN
    reason: str = ""
    executor_resource: Optional[Resource] = None     # each executor's container (None: the spec's)

    def __post_init__(self) -> None:
        if self.workers < 0 or self.servers < 0:
            raise DecisionError(f"negative shape ({self.workers}, {self.servers})")
        if not self.placement:
            return
        nodes = [p.node for p in self.placement]
        if len(set(nodes)) != len(nodes):
            raise DecisionError(f"placement names a node twice: {nodes}")
        if any(p.workers < 0 or p.servers < 0 for p in self.placement):
            raise DecisionError("placement has a negative count")
        placed = (sum(p.workers for p in self.placement), sum(p.servers for p in self.placement))
        if placed != (self.workers, self.servers):
            raise DecisionError(f"placement holds {placed} workers/servers, the shape is "
                                f"({self.workers}, {self.servers})")

    @classmethod
    def spread(cls, workers: int, servers: int, nodes: Sequence[str], reason: str = "") -> "JobDecision":
        """The shape spread round-robin over `nodes` (as even as the counts allow; empty: anywhere)."""
        if not nodes:
            return cls(workers, servers, reason=reason)
        n = len(nodes)
        placement = tuple(NodePlacement(node=node, workers=workers // n + (i < workers % n),
                                        servers=servers // n + (i < servers % n)) for i, node in enumerate(nodes))
        return cls(workers, servers, placement, reason=reason)

    @property
    def nodes(self) -> list[str]:
        """The placement's nodes, in placement order (empty: anywhere)."""
        return [p.node for p in self.placement]

    def same_as(self, d: Optional[ShapeDirective]) -> bool:
        """True when directive `d` already says this (the reason and version aside)."""
        return d is not None and (d.workers, d.servers, d.placement, d.nodes, d.group, d.run_state,
                                  d.executor_resource) == (
            self.workers, self.servers, list(self.placement), self.nodes, self.group, self.run_state,
            self.executor_resource)

    def directive(self, version: int) -> ShapeDirective:
        """This decision as the wire directive numbered `version`."""
        return ShapeDirective(workers=self.workers, servers=self.servers, nodes=self.nodes, reason=self.reason,
                              version=version, placement=list(self.placement), group=self.group,
                              run_state=self.run_state, executor_resource=self.executor_resource)


@dataclass(frozen=True)
class Decision:
    """One policy round's output: app id -> what that job should be. Jobs not named keep their
    current directive (or none)."""

    jobs: dict[str, JobDecision] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.jobs)


__all__ = ["Decision", "DecisionError", "JobDecision"]
