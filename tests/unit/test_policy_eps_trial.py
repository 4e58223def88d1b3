"""The EPS growth-trial state machine (rm/policies/eps_trial.py) and the AM's shape report record."""
from __future__ import annotations

import msgspec
import pytest

from protocol.job_report import EpochObjective, JobReport, ServerTiming, WorkerTiming
from protocol.records import Resource
from rm.policies.eps_trial import (TRANSITIONS, IllegalTrialTransition, Trial, TrialConfig, TrialEvent, TrialState,
                                   advance, observe)

CFG = TrialConfig(speed_drop_tolerance=0.1, min_speed_iterations=5, settle_timeout_s=100, measure_timeout_s=300)


def trial(**kw) -> Trial:
    return Trial("app_A", before=(2, 1), after=(3, 2), speed_before=2.0, started_at=0.0, **kw)


def rep(w: int = 3, s: int = 2, speed: float = 2.0, its: int = 10, changing: bool = False) -> JobReport:
    return JobReport(workers=w, servers=s, started=True, changing=changing, speed=speed,
                              speed_iterations=its)


def test_transition_table_is_complete_and_final_states_accept_nothing():
    for state in TrialState:
        for event in TrialEvent:
            if state.is_final:
                assert (state, event) not in TRANSITIONS
                with pytest.raises(IllegalTrialTransition):
                    advance(trial(state=state), event, 1.0)
    assert {s for s, _ in TRANSITIONS} == {TrialState.SETTLING, TrialState.MEASURING}
    with pytest.raises(IllegalTrialTransition, match="SPEED_KEPT in state SETTLING"):
        advance(trial(), TrialEvent.SPEED_KEPT, 1.0)


def test_settling_waits_for_the_new_shape_without_a_change_under_way():
    t = trial()
    assert observe(t, None, 10, CFG) is None
    assert observe(t, rep(2, 1), 10, CFG) is None
    assert observe(t, rep(3, 2, changing=True), 10, CFG) is None
    assert observe(t, rep(3, 2), 10, CFG) == TrialEvent.REACHED
    assert observe(t, rep(2, 1), 100, CFG) == TrialEvent.TIMEOUT
    m = advance(t, TrialEvent.REACHED, 10)
    assert m.state == TrialState.MEASURING and m.reached_at == 10
    assert advance(t, TrialEvent.TIMEOUT, 100).state == TrialState.ABANDONED


def test_measuring_compares_speed_with_a_tolerance_once_enough_iterations_are_in():
    m = advance(trial(), TrialEvent.REACHED, 10)
    assert observe(m, rep(speed=1.0, its=4), 20, CFG) is None           # too few iterations to trust
    assert observe(m, rep(speed=1.85, its=5), 20, CFG) == TrialEvent.SPEED_KEPT   # within 10 %
    assert observe(m, rep(speed=1.7, its=5), 20, CFG) == TrialEvent.SPEED_DROPPED
    assert observe(m, rep(speed=0.0, its=0), 310, CFG) == TrialEvent.TIMEOUT
    assert advance(m, TrialEvent.SPEED_DROPPED, 20, speed_after=1.7).state == TrialState.REVERTED
    assert advance(m, TrialEvent.TIMEOUT, 310).state == TrialState.KEPT
    assert advance(m, TrialEvent.PREEMPTED, 20).state == TrialState.ABANDONED


def test_trial_knows_which_roles_it_added():
    t = Trial("a", before=(2, 1), after=(3, 1), speed_before=1.0, started_at=0.0)
    assert t.added_workers and not t.added_servers


def test_shape_report_round_trips_and_tolerates_extra_fields():
    r = JobReport(workers=3, servers=2, started=True, iterations=120, early_feedback=True,
                  early_feedback_iterations=100, speed=1.5, speed_iterations=20,
                  executor_resource=Resource(512, 1), directive_version=2, phase="TRAINING", epoch=1,
                  epoch_time_s=2.5, objective=0.4, epoch_times=[3.0, 2.5], initial_objective=0.7,
                  objectives=[EpochObjective(0, 0.5), EpochObjective(1, 0.4)],
                  worker_times=WorkerTiming(compute_s=0.02, comm_s=0.01, workers=3),
                  server_times=ServerTiming(service_s=0.001, servers=2), memory_mb=900.5, spilled_mb=0.0)
    d = r.to_json()
    assert d["executor_resource"] == {"memory": 512, "vCores": 1}
    assert d["objectives"][1] == {"epoch": 1, "objective": 0.4} and d["worker_times"]["workers"] == 3
    assert JobReport.decode(msgspec.json.decode(msgspec.json.encode(d))) == r
    # An older AM's report (counts only) and a newer one's unknown fields decode, with defaults.
    old = JobReport.decode({"workers": 2, "servers": 1, "epoch": 3, "objective": 0.5, "from_the_future": 1})
    assert not old.started and not old.early_feedback and (old.epoch, old.objective) == (3, 0.5)


def test_bad_shape_reports_name_the_field():
    with pytest.raises(msgspec.ValidationError, match="workers"):
        JobReport.decode({"workers": -1, "servers": 1})
    with pytest.raises(msgspec.ValidationError, match="servers"):
        JobReport.decode({"workers": 1})
    with pytest.raises(msgspec.ValidationError, match="speed"):
        JobReport.decode({"workers": 1, "servers": 1, "speed": "fast"})
