"""The container state machine on its own: transitions, refusals, external states."""
from __future__ import annotations

import pytest

from protocol.records import ContainerState
from nodemanager.container_state import (TRANSITIONS, ContainerEvent as E, InvalidTransition,
                                         NMContainerState as S, external_state, holds_resources, is_finished,
                                         transition)


def run(events: list[E], start: S = S.NEW) -> S:
    s = start
    for e in events:
        s = transition(s, e)
    return s


def test_normal_life_ends_done():
    assert run([E.LOCALIZED, E.LAUNCHED, E.EXITED_SUCCESS]) is S.EXITED_WITH_SUCCESS
    assert run([E.LOCALIZED, E.LAUNCHED, E.EXITED_SUCCESS, E.CLEANED_UP]) is S.DONE
    assert run([E.LOCALIZED, E.LAUNCHED, E.EXITED_FAILURE, E.CLEANED_UP]) is S.DONE


def test_kill_while_running_goes_through_killing():
    s = run([E.LOCALIZED, E.LAUNCHED, E.KILL])
    assert s is S.KILLING and external_state(s) is ContainerState.RUNNING
    assert transition(s, E.KILL) is S.KILLING          # a second stop is harmless
    assert transition(s, E.EXITED_SUCCESS) is S.DONE   # a process that exits 0 on SIGTERM is still killed
    assert transition(s, E.EXITED_FAILURE) is S.DONE


def test_kill_after_exit_changes_nothing():
    for s in (S.EXITED_WITH_SUCCESS, S.EXITED_WITH_FAILURE, S.DONE):
        assert transition(s, E.KILL) is s


def test_recovery_and_launch_failure():
    assert run([E.RECOVERED]) is S.RUNNING
    assert run([E.LAUNCH_FAILED]) is S.EXITED_WITH_FAILURE
    assert run([E.LOCALIZED, E.LAUNCH_FAILED, E.CLEANED_UP]) is S.DONE


@pytest.mark.parametrize("state,event", [
    (S.NEW, E.LAUNCHED), (S.NEW, E.EXITED_SUCCESS), (S.RUNNING, E.LOCALIZED), (S.RUNNING, E.CLEANED_UP),
    (S.DONE, E.LAUNCHED), (S.DONE, E.RECOVERED), (S.KILLING, E.LAUNCHED), (S.EXITED_WITH_SUCCESS, E.EXITED_FAILURE),
])
def test_invalid_transitions_are_refused(state, event):
    with pytest.raises(InvalidTransition, match=event.value):
        transition(state, event)


def test_table_covers_only_known_states_and_every_state_is_reachable():
    reachable = {S.NEW} | set(TRANSITIONS.values())
    assert reachable == set(S)


def test_external_states_follow_yarn():
    assert [external_state(s).value for s in S] == [
        "NEW", "NEW", "RUNNING", "COMPLETE", "COMPLETE", "RUNNING", "COMPLETE"]
    assert [holds_resources(s) for s in S] == [True, True, True, False, False, True, False]
    assert is_finished(S.DONE) and not is_finished(S.KILLING)
