"""The container lifecycle as a pure state machine (YARN's ContainerImpl, reduced).

No I/O here: the container manager feeds events in and acts on the states that come out.
"""
from __future__ import annotations

import enum

from protocol.records import ContainerState
from protocol.state_machine import InvalidTransition, TransitionTable


class NMContainerState(str, enum.Enum):
    """Internal container states (YARN-like)."""

    NEW = "NEW"
    LOCALIZED = "LOCALIZED"              # working and log dirs exist, launch script written
    RUNNING = "RUNNING"
    EXITED_WITH_SUCCESS = "EXITED_WITH_SUCCESS"
    EXITED_WITH_FAILURE = "EXITED_WITH_FAILURE"
    KILLING = "KILLING"                  # a stop was asked; waiting for the process tree to go
    DONE = "DONE"                        # resources released, cgroup removed


class ContainerEvent(str, enum.Enum):
    """What can happen to a container."""

    LOCALIZED = "LOCALIZED"
    LAUNCHED = "LAUNCHED"
    LAUNCH_FAILED = "LAUNCH_FAILED"
    RECOVERED = "RECOVERED"              # found running again after an NM restart
    EXITED_SUCCESS = "EXITED_SUCCESS"
    EXITED_FAILURE = "EXITED_FAILURE"
    KILL = "KILL"
    CLEANED_UP = "CLEANED_UP"


S, E = NMContainerState, ContainerEvent

# (state, event) -> next state. A missing pair is an invalid transition.
TRANSITIONS: TransitionTable[NMContainerState, ContainerEvent, NMContainerState] = TransitionTable({
    (S.NEW, E.LOCALIZED): S.LOCALIZED,
    (S.NEW, E.RECOVERED): S.RUNNING,
    (S.NEW, E.LAUNCH_FAILED): S.EXITED_WITH_FAILURE,
    (S.NEW, E.KILL): S.DONE,
    (S.LOCALIZED, E.LAUNCHED): S.RUNNING,
    (S.LOCALIZED, E.LAUNCH_FAILED): S.EXITED_WITH_FAILURE,
    (S.LOCALIZED, E.KILL): S.DONE,
    (S.RUNNING, E.EXITED_SUCCESS): S.EXITED_WITH_SUCCESS,
    (S.RUNNING, E.EXITED_FAILURE): S.EXITED_WITH_FAILURE,
    (S.RUNNING, E.KILL): S.KILLING,
    # A killed process may still exit 0 (it caught the signal); either way the kill decides.
    (S.KILLING, E.EXITED_SUCCESS): S.DONE,
    (S.KILLING, E.EXITED_FAILURE): S.DONE,
    (S.KILLING, E.KILL): S.KILLING,
    (S.EXITED_WITH_SUCCESS, E.CLEANED_UP): S.DONE,
    (S.EXITED_WITH_FAILURE, E.CLEANED_UP): S.DONE,
    # A stop that arrives after the exit changes nothing ("unless already done").
    (S.EXITED_WITH_SUCCESS, E.KILL): S.EXITED_WITH_SUCCESS,
    (S.EXITED_WITH_FAILURE, E.KILL): S.EXITED_WITH_FAILURE,
    (S.DONE, E.KILL): S.DONE,
    (S.DONE, E.CLEANED_UP): S.DONE,
}, lambda state, event: InvalidTransition(f"container event {event.value} is not valid in state {state.value}",
                                      state, event))


def transition(state: NMContainerState, event: ContainerEvent) -> NMContainerState:
    """The state after `event` in `state`; raises InvalidTransition for a pair not in the table."""
    return TRANSITIONS.next(state, event)


_EXTERNAL = {
    S.NEW: ContainerState.NEW,
    S.LOCALIZED: ContainerState.NEW,
    S.RUNNING: ContainerState.RUNNING,
    S.KILLING: ContainerState.RUNNING,
    S.EXITED_WITH_SUCCESS: ContainerState.COMPLETE,
    S.EXITED_WITH_FAILURE: ContainerState.COMPLETE,
    S.DONE: ContainerState.COMPLETE,
}


def external_state(state: NMContainerState) -> ContainerState:
    """The YARN ContainerState an NM reports for an internal state."""
    return _EXTERNAL[state]


def is_finished(state: NMContainerState) -> bool:
    """Whether the container's process is gone (its exit status is final)."""
    return external_state(state) is ContainerState.COMPLETE


def holds_resources(state: NMContainerState) -> bool:
    """Whether the container still counts against the node's capacity."""
    return state in (S.NEW, S.LOCALIZED, S.RUNNING, S.KILLING)
