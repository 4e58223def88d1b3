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


def test_a_directive_arriving_during_a_change_waits_for_it_to_end() -> None:
    """One change at a time, as the real AM's DirectiveTracker: a newer directive that arrives while
    a reshape runs is kept and carried out after it, not merged into it."""
    from rm import policies
    from sim.simulator import T0, SimConfig, Simulator
    from sim.trace import TraceJob
    from test_sim import calibration

    class TwoSteps:
        name = "two-steps"

        def decide(self, snapshot: policies.ClusterSnapshot) -> policies.Decision:
            t = snapshot.now - T0
            shape = (3, 1) if t < 61.0 else (2, 2)       # the second a second after the first
            if t < 60.0:
                return policies.Decision()
            return policies.Decision({a.app_id: policies.JobDecision(*shape)
                                      for a in snapshot.apps if a.shape is not None and a.shape.started})

    job = TraceJob(name="t", arrival_s=0.0, app="mlr", threshold=0.01, workers=1, servers=1, max_workers=4,
                   max_servers=2, data_scale=20.0)
    sim = Simulator([job], "static", calibration(), SimConfig(nodes=3))
    sim.policy = TwoSteps()
    phases: list[tuple[float, Phase, int]] = []
    sj = sim.jobs[0]
    original = sj._on

    def spy(event):  # type: ignore[no-untyped-def]
        original(event)
        phases.append((sim.loop.now - T0, sj.phase, sj.tracker.applied_version))
    sj._on = spy  # type: ignore[method-assign]
    rec = sim.run().records[0]
    assert [s[1:] for s in rec.shapes] == [(1, 1), (3, 1), (2, 2)]
    reshapes = [(t, v) for t, ph, v in phases if ph is P.RESHAPING]
    trained = [t for t, ph, _ in phases if ph is P.TRAINING]
    # The second reshape (version 2) starts only after the first ended (training resumed between).
    assert [v for _, v in reshapes] == [1, 2]
    assert any(reshapes[0][0] < t <= reshapes[1][0] for t in trained)
