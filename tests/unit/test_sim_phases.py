"""A simulated job's phases on their TransitionTable: the life the module doc describes walks
through it, and an event out of place raises."""
from __future__ import annotations

import pytest

from protocol.state_machine import TransitionTable
from sim.sim_job import PHASE_TRANSITIONS, Phase, PhaseEvent, SimPhaseError

P, E = Phase, PhaseEvent


def test_start_reshape_pause_resume_converge_and_finish_walk_the_table() -> None:
    assert isinstance(PHASE_TRANSITIONS, TransitionTable)
    phase = P.SUBMITTED
    for event, after in [(E.REGISTER, P.GATHERING), (E.GATHERED, P.LAUNCHING), (E.STARTED, P.TRAINING),
                         (E.RESHAPE, P.RESHAPING), (E.PAUSE, P.PAUSING), (E.PAUSED, P.PAUSED),
                         (E.RESUME, P.GATHERING), (E.GATHERED, P.LAUNCHING), (E.STARTED, P.TRAINING),
                         (E.RESHAPE, P.RESHAPING), (E.RESHAPED, P.TRAINING), (E.CONVERGE, P.FINISHING),
                         (E.STOP, P.DONE), (E.STOP, P.DONE)]:
        phase = PHASE_TRANSITIONS.next(phase, event)
        assert phase is after, event


@pytest.mark.parametrize("phase,event", [(P.SUBMITTED, E.STOP), (P.GATHERING, E.STARTED), (P.PAUSED, E.PAUSE),
                                         (P.FINISHING, E.PAUSE), (P.DONE, E.RESUME), (P.PAUSING, E.RESUME)])
def test_events_out_of_place_are_refused(phase: Phase, event: PhaseEvent) -> None:
    with pytest.raises(SimPhaseError, match=f"{event.value} not allowed in phase {phase.value}"):
        PHASE_TRANSITIONS.next(phase, event)
