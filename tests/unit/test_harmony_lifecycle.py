"""A job's Harmony lifecycle: waiting -> profiling -> profiled -> running <-> paused -> finished."""
from __future__ import annotations

import pytest

from protocol.internal_api import RunState
from rm.policies.harmony_lifecycle import TRANSITIONS, HarmonyStateError, JobEvent, JobState, advance, step

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


def test_the_table_decides_the_run_state_along_the_way():
    R = RunState
    state, run = S.WAITING, R.RUN
    walk = [(E.PROFILE, S.PROFILING, R.RUN), (E.MEASURED, S.PROFILED, R.RUN), (E.PAUSE, S.PAUSED, R.PAUSE),
            (E.RESUME, S.RUNNING, R.RESUME), (E.MOVE, S.RUNNING, R.RESUME), (E.PAUSE, S.PAUSED, R.PAUSE),
            (E.RESUME, S.RUNNING, R.RESUME), (E.FINISH, S.FINISHED, R.RESUME)]
    for event, after, after_run in walk:
        state, run = step(state, run, event)
        assert (state, run) == (after, after_run), event


def test_a_move_keeps_run_and_a_requeue_keeps_the_run_state():
    assert step(S.PROFILED, RunState.RUN, E.RUN) == (S.RUNNING, RunState.RUN)
    assert step(S.RUNNING, RunState.RUN, E.MOVE) == (S.RUNNING, RunState.RUN)
    assert step(S.PROFILING, RunState.RUN, E.REQUEUE) == (S.WAITING, RunState.RUN)


def test_step_refuses_what_the_table_does_not_allow():
    with pytest.raises(HarmonyStateError):
        step(S.PAUSED, RunState.PAUSE, E.MOVE)
