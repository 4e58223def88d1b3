"""Explicit transition tables for the project's state machines (YARN's StateMachineFactory idea).

Every lifecycle in Elastane -- the RM's applications and attempts, the NM's and the AM's
containers, a model block's migration, the PS job's phases, RM shape directives, EPS trials -- is
an enum of states, an enum of events and a table (state, event) -> what follows. The table is pure
data, so a module states its machine in one place and tests can walk it; `TransitionTable.next`
is the one lookup that either answers or raises that machine's own error, naming the event and the
state, so no module re-writes the try/KeyError/raise around its table.
"""
from __future__ import annotations

import enum
from typing import Callable, Dict, Mapping, Tuple, TypeVar

from protocol.errors import StateError

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")


class InvalidTransition(StateError, ValueError, RuntimeError):
    """An event that is not allowed in a machine's current state (`state` and `event` when known).

    The class of the RM's applications and attempts, its HA role, the NM's containers and a model
    block's migration; it is both a ValueError and a RuntimeError, as the per-machine classes it
    replaces were one or the other. Machines whose callers or tests name their own error raise a
    subclass of it (a capacity reclaim's targets, EPS trials, the PS job's phases, AM containers, the
    PS AM's executors), so `except InvalidTransition` catches every one of them.
    """

    def __init__(self, message: str, state: enum.Enum | None = None, event: enum.Enum | None = None) -> None:
        super().__init__(message)
        self.state = state
        self.event = event


class TransitionTable(Dict[Tuple[S, E], T]):
    """(state, event) -> what follows (the next state, or e.g. a (state, decision) pair).

    A dict, so a machine can be listed, extended while its module is built, or checked with
    `in`; `next` raises `error(state, event)` -- the machine's own exception -- for a pair that is
    not in the table, which is how every invalid transition surfaces.
    """

    def __init__(self, transitions: Mapping[Tuple[S, E], T], error: Callable[[S, E], Exception]) -> None:
        super().__init__(transitions)
        self._error = error

    def next(self, state: S, event: E) -> T:
        """What follows `event` in `state`; the machine's error if the pair is not allowed."""
        try:
            return self[(state, event)]
        except KeyError:
            raise self._error(state, event) from None

    def allows(self, state: S, event: E) -> bool:
        return (state, event) in self
