"""The AM's records of its containers and their lifecycle state machine (pure, no I/O).

    ALLOCATED --launch--> LAUNCHING --launched--> RUNNING --stop--> STOPPING
        |                     |                      |                 |
        +------release--------+---launch_failed------+---complete------+--> COMPLETED

A container a failed attempt launched and this attempt took over (keep-containers-across-
application-attempts) enters RUNNING (`adopt`).

A container reaches COMPLETED exactly once, either from the RM's completed-container report
or from the AM's own decision (a failed launch, a release before launch); later reports of the
same container are ignored so the app sees one completion per container.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from protocol.internal_api import AllocatedContainer, ContainerStatus
from protocol.records import ExitStatus, Resource
from protocol.state_machine import InvalidTransition, TransitionTable


class AmContainerState(str, enum.Enum):
    ALLOCATED = "ALLOCATED"     # granted by the RM, not launched
    LAUNCHING = "LAUNCHING"     # start request sent to the NM
    RUNNING = "RUNNING"         # the NM accepted it
    STOPPING = "STOPPING"       # stop requested (by the AM)
    COMPLETED = "COMPLETED"     # final


class ContainerEvent(str, enum.Enum):
    LAUNCH = "LAUNCH"
    LAUNCHED = "LAUNCHED"
    LAUNCH_FAILED = "LAUNCH_FAILED"
    STOP = "STOP"
    RELEASE = "RELEASE"
    COMPLETE = "COMPLETE"


S, E = AmContainerState, ContainerEvent
TRANSITIONS: TransitionTable[AmContainerState, ContainerEvent, AmContainerState] = TransitionTable({
    (S.ALLOCATED, E.LAUNCH): S.LAUNCHING,
    (S.ALLOCATED, E.RELEASE): S.COMPLETED,
    (S.ALLOCATED, E.STOP): S.COMPLETED,          # never started: stopping it is releasing it
    (S.ALLOCATED, E.COMPLETE): S.COMPLETED,      # e.g. its node was lost before launch
    (S.LAUNCHING, E.LAUNCHED): S.RUNNING,
    (S.LAUNCHING, E.LAUNCH_FAILED): S.COMPLETED,
    (S.LAUNCHING, E.STOP): S.STOPPING,
    (S.LAUNCHING, E.COMPLETE): S.COMPLETED,      # it ran and exited before the start call returned
    (S.RUNNING, E.STOP): S.STOPPING,
    (S.RUNNING, E.COMPLETE): S.COMPLETED,
    (S.STOPPING, E.COMPLETE): S.COMPLETED,
    (S.STOPPING, E.LAUNCHED): S.STOPPING,        # the start call returned after we asked to stop
    (S.STOPPING, E.LAUNCH_FAILED): S.COMPLETED,
    (S.STOPPING, E.STOP): S.STOPPING,
}, lambda state, event: TransitionError(f"container event {event.value} not allowed in state {state.value}", state,
                                        event))


class TransitionError(InvalidTransition):
    """An event that is not allowed in the container's current state."""


def next_state(state: AmContainerState, event: ContainerEvent) -> AmContainerState:
    return TRANSITIONS.next(state, event)


@dataclass
class AmContainer:
    """One container as the AM knows it."""

    container_id: str
    node_id: str
    node_http_address: str
    resource: Resource
    token: str
    ask_id: int = 0
    tag: str = ""
    state: AmContainerState = AmContainerState.ALLOCATED
    exit_status: int = ExitStatus.INVALID
    diagnostics: str = ""
    pid: Optional[int] = None

    @classmethod
    def from_allocated(cls, c: AllocatedContainer) -> "AmContainer":
        return cls(container_id=c.container_id, node_id=c.node_id, node_http_address=c.node_http_address,
                   resource=c.resource, token=c.container_token, ask_id=c.ask_id, tag=c.tag)

    @property
    def done(self) -> bool:
        return self.state is AmContainerState.COMPLETED

    def describe_exit(self) -> str:
        """E.g. "container_..._000002 exited with -104 (KILLED_EXCEEDED_PMEM)"."""
        code = self.exit_status
        text = f"{self.container_id} exited with {code}"
        if code < 0:
            text += f" ({ExitStatus.describe(code)})"
        return text


@dataclass
class ContainerBook:
    """Every container of the attempt, by id; applies state-machine events."""

    containers: dict[str, AmContainer] = field(default_factory=dict)

    def add(self, c: AllocatedContainer) -> AmContainer:
        if c.container_id in self.containers:
            raise TransitionError(f"container {c.container_id} allocated twice")
        rec = self.containers[c.container_id] = AmContainer.from_allocated(c)
        return rec

    def adopt(self, c: AllocatedContainer) -> AmContainer:
        """A container a failed attempt launched and this one took over: RUNNING already."""
        rec = self.add(c)
        rec.state = AmContainerState.RUNNING
        return rec

    def get(self, container_id: str) -> Optional[AmContainer]:
        return self.containers.get(container_id)

    def apply(self, container_id: str, event: ContainerEvent) -> AmContainer:
        rec = self.containers.get(container_id)
        if rec is None:
            raise TransitionError(f"unknown container {container_id}")
        rec.state = next_state(rec.state, event)
        return rec

    def complete(self, status: ContainerStatus) -> Optional[AmContainer]:
        """Record a completion reported by the RM. None if unknown or already completed (a duplicate)."""
        rec = self.containers.get(status.container_id)
        if rec is None or rec.done:
            return None
        rec.state = next_state(rec.state, ContainerEvent.COMPLETE)
        rec.exit_status = status.exit_status
        rec.diagnostics = status.diagnostics
        return rec

    def finish_locally(self, container_id: str, event: ContainerEvent, exit_status: int,
                       diagnostics: str) -> AmContainer:
        """Complete a container by the AM's own decision (failed launch, release before launch)."""
        rec = self.apply(container_id, event)
        if rec.done:
            rec.exit_status = exit_status
            rec.diagnostics = diagnostics
        return rec

    def live(self) -> list[AmContainer]:
        return [c for c in self.containers.values() if not c.done]
