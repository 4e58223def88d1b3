"""App and attempt transition tables: valid paths, and every invalid event raises."""
from __future__ import annotations

import pytest

from protocol.records import AppState, AttemptState
from rm.state_machines import (APP_TRANSITIONS, ATTEMPT_TRANSITIONS, AppEvent, AttemptEvent, InvalidTransition,
                               attempt_is_final, next_app_state, next_attempt_state)


def run_app(events: list[AppEvent], start: AppState = AppState.NEW) -> AppState:
    s = start
    for e in events:
        s = next_app_state(s, e)
    return s


def test_app_happy_path_and_retry():
    E = AppEvent
    assert run_app([E.START, E.SAVED, E.ACCEPT, E.ATTEMPT_REGISTERED, E.ATTEMPT_FINISHED]) == AppState.FINISHED
    assert run_app([E.START, E.SAVED, E.ACCEPT, E.ATTEMPT_REGISTERED, E.ATTEMPT_RETRY]) == AppState.ACCEPTED
    assert run_app([E.START, E.SAVED, E.ACCEPT, E.ATTEMPT_FAILED]) == AppState.FAILED
    assert run_app([E.RECOVER]) == AppState.ACCEPTED


@pytest.mark.parametrize("state", [s for s in AppState if not s.is_final])
def test_kill_from_every_live_state(state):
    assert next_app_state(state, AppEvent.KILL) == AppState.KILLED


@pytest.mark.parametrize("state", [s for s in AppState if s.is_final])
def test_final_app_states_accept_nothing(state):
    for e in AppEvent:
        with pytest.raises(InvalidTransition, match=state.value):
            next_app_state(state, e)


def test_invalid_app_transitions_raise():
    with pytest.raises(InvalidTransition):
        next_app_state(AppState.NEW, AppEvent.ATTEMPT_REGISTERED)
    with pytest.raises(InvalidTransition):
        next_app_state(AppState.ACCEPTED, AppEvent.ATTEMPT_FINISHED)   # must register first
    assert (AppState.SUBMITTED, AppEvent.ATTEMPT_REGISTERED) not in APP_TRANSITIONS


def test_attempt_paths():
    A, E = AttemptState, AttemptEvent
    s = A.NEW
    for e in (E.START, E.SCHEDULE, E.ALLOCATED, E.LAUNCHED, E.REGISTERED, E.UNREGISTERED, E.CONTAINER_FINISHED):
        s = next_attempt_state(s, e)
    assert s == A.FINISHED and attempt_is_final(s)
    # Register may overtake the launcher's answer.
    assert next_attempt_state(A.ALLOCATED, E.REGISTERED) == A.RUNNING
    assert next_attempt_state(A.RUNNING, E.LAUNCHED) == A.RUNNING
    assert next_attempt_state(A.RUNNING, E.FAIL) == A.FAILED
    assert next_attempt_state(A.SCHEDULED, E.KILL) == A.KILLED


@pytest.mark.parametrize("state", [AttemptState.FINISHED, AttemptState.FAILED, AttemptState.KILLED])
def test_final_attempt_states_accept_nothing(state):
    for e in AttemptEvent:
        assert (state, e) not in ATTEMPT_TRANSITIONS
        with pytest.raises(InvalidTransition):
            next_attempt_state(state, e)


def test_attempt_cannot_register_before_allocation():
    with pytest.raises(InvalidTransition):
        next_attempt_state(AttemptState.SCHEDULED, AttemptEvent.REGISTERED)
