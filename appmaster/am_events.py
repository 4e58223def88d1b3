"""Events the AM library hands to the application (through `ApplicationMaster.next_event`)."""
from __future__ import annotations

from dataclasses import dataclass

from protocol.internal_api import NodeReport, ShapeDirective

from .container_book import AmContainer


@dataclass(frozen=True)
class ContainersAllocated:
    """The RM granted these containers (already removed from the ask table); launch or release them."""

    containers: list[AmContainer]


@dataclass(frozen=True)
class ContainersCompleted:
    """These containers ended: `exit_status` is the process's code or a YARN code
    (-100 node lost, -104 over memory, -105 stopped by the AM, -106 by the RM, -1000 launch failed)."""

    containers: list[AmContainer]


@dataclass(frozen=True)
class NodesUpdated:
    """Nodes whose state changed (e.g. to LOST or UNHEALTHY)."""

    nodes: list[NodeReport]


@dataclass(frozen=True)
class ShapeChanged:
    """A policy's new shape directive for this (elastic) job."""

    directive: ShapeDirective


@dataclass(frozen=True)
class Shutdown:
    """Stop everything and exit: the app was killed, the attempt failed, or the RM is unreachable."""

    reason: str


AmEvent = ContainersAllocated | ContainersCompleted | NodesUpdated | ShapeChanged | Shutdown
