"""An executor's lifecycle in the PS AM's pool: launching -> ready -> retiring -> exited, on its
TransitionTable (an event out of place raises)."""
from __future__ import annotations

import pytest

from appmaster.ps.runtime.executor_pool import (EXECUTOR_TRANSITIONS, ExecutorEvent, ExecutorRecord, ExecutorState,
                                        ExecutorStateError, Role)
from protocol.state_machine import TransitionTable

S, E = ExecutorState, ExecutorEvent


def record() -> ExecutorRecord:
    return ExecutorRecord("worker-0", Role.WORKER, container=None)  # type: ignore[arg-type]


def test_an_executor_announces_retires_and_exits_through_the_table() -> None:
    assert isinstance(EXECUTOR_TRANSITIONS, TransitionTable)
    rec = record()
    for event, after in [(E.ANNOUNCE, S.READY), (E.RETIRE, S.RETIRING), (E.RETIRE, S.RETIRING), (E.EXIT, S.EXITED),
                         (E.EXIT, S.EXITED)]:
        rec.on(event)
        assert rec.state is after


@pytest.mark.parametrize("state,event", [(S.READY, E.ANNOUNCE), (S.RETIRING, E.ANNOUNCE), (S.EXITED, E.ANNOUNCE),
                                         (S.EXITED, E.RETIRE)])
def test_an_exited_executor_never_comes_back_and_announces_once(state: ExecutorState, event: ExecutorEvent) -> None:
    rec = record()
    rec.state = state
    with pytest.raises(ExecutorStateError, match=f"{event.value} not allowed in state {state.value}"):
        rec.on(event)
    assert rec.state is state
