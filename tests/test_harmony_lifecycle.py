"""A job's Harmony lifecycle: waiting -> profiling -> profiled -> running <-> paused -> finished."""
from __future__ import annotations

import pytest

from rm.policies.harmony_lifecycle import TRANSITIONS, HarmonyStateError, JobEvent, JobState, advance

S, E = JobState, JobEvent


def test_the_happy_path_walks_every_state():
    state = S.WAITING
    for event, after in [(E.PROFILE, S.PROFILING), (E.MEASURED, S.PROFILED), (E.RUN, S.RUNNING),
                         (E.MOVE, S.RUNNING), (E.PAUSE, S.PAUSED), (E.RESUME, S.RUNNING), (E.FINISH, S.FINISHED)]:
        state = advance(state, event)
        assert state is after


def test_a_profiled_job_may_wait_paused_and_a_profiling_one_go_back_to_waiting():
    assert advance(S.PROFILED, E.PAUSE) is S.PAUSED
    assert advance(S.PROFILING, E.REQUEUE) is S.WAITING


@pytest.mark.parametrize("state", [s for s in JobState if s is not S.FINISHED])
def test_every_live_state_can_finish(state):
    assert advance(state, E.FINISH) is S.FINISHED


@pytest.mark.parametrize("state,event", [(S.WAITING, E.RUN), (S.PROFILING, E.RUN), (S.PAUSED, E.RUN),
                                         (S.RUNNING, E.RESUME), (S.PAUSED, E.MOVE), (S.WAITING, E.PAUSE),
                                         (S.FINISHED, E.RESUME), (S.FINISHED, E.FINISH)])
def test_other_events_are_refused_naming_state_and_event(state, event):
    assert not TRANSITIONS.allows(state, event)
    with pytest.raises(HarmonyStateError, match=f"{event.value} is not allowed for a {state.value} job"):
        advance(state, event)
