"""A stop (the RM kills the app) or a user-code error ends the job from every phase LIFECYCLE has
(KILLED / FAILED), with the step in flight left behind: each phase is reached with its step held,
then the end arrives. The stopping phases (restart, migration, suspension) have their own such
test in test_controller_suspension.py; together with the other controller tests every transition
of LIFECYCLE is stepped."""
from __future__ import annotations

from typing import Callable

import pytest

from appmaster.ps.controller import LIFECYCLE, Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.phases import Trigger
from protocol.internal_api import ShapeDirective
from tests.support.controller_world import World, job_state, started


def _starting() -> World:
    return World(job_state())


def _launching_servers() -> World:
    w = World(job_state(), hold={ins.StartExecutors})
    w.start()
    return w


def _launching_workers() -> World:
    w = _launching_servers()
    w.answer(w.held_of(ins.StartExecutors)[0])         # the servers are up; the workers' start is held
    return w


def _initialising() -> World:
    w = World(job_state(), hold={ins.SetupTraining})
    w.start()
    return w


def _restoring() -> World:
    w = World(job_state(), hold={ins.RestoreCheckpoint})
    w.start(resume_from="ckpt/epoch-3")
    return w


def _adopting() -> World:
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(resume_from="ckpt/epoch-3", adopt=True)
    return w


def _training() -> World:
    return started()


def _reshaping() -> World:
    w = started(max_workers=3)
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    return w


def _executing_plan() -> World:
    w = started(optimizer="cruise", max_workers=3)
    w.hold = {ins.ComputePlan}
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=3, servers=1, version=1)))
    return w


def _checkpointing() -> World:
    w = started(checkpoint_every_epochs=1)
    w.hold = {ins.WriteCheckpoint}
    w.send(ev.EpochDone(at=w.at(), epoch=0, objective=1.0, epoch_time_s=0.1))
    return w


def _recovering() -> World:
    w = started()
    w.hold = {ins.StartExecutors}
    lost = w.job.executors["worker-1"].info
    w.send(ev.ContainersCompleted(at=w.at(), containers=[(lost.container_id, "worker-1 exited with -100")]))
    return w


def _finishing() -> World:
    w = started()
    w.hold = {ins.ScoreModel}
    w.send(ev.TrainingEnded(at=w.at(), criterion="epoch limit"))
    return w


IN_PHASE: dict[Phase, Callable[[], World]] = {
    Phase.STARTING: _starting, Phase.LAUNCHING_SERVERS: _launching_servers,
    Phase.LAUNCHING_WORKERS: _launching_workers, Phase.INITIALISING: _initialising, Phase.RESTORING: _restoring,
    Phase.ADOPTING: _adopting,
    Phase.TRAINING: _training, Phase.RESHAPING: _reshaping, Phase.EXECUTING_PLAN: _executing_plan,
    Phase.CHECKPOINTING: _checkpointing, Phase.RECOVERING: _recovering, Phase.FINISHING: _finishing,
}
ENDS: list[tuple[ev.Event, Phase]] = [(ev.StopRequested(at=0.0, reason="killed by the user"), Phase.KILLED),
                                   (ev.UserCodeError(at=0.0, message="ValueError: raised in the app"), Phase.FAILED)]


@pytest.mark.parametrize("phase", list(IN_PHASE), ids=lambda p: p.value)
@pytest.mark.parametrize("end, final", ENDS, ids=["stop", "user-error"])
def test_an_end_arrives_in_every_phase(phase: Phase, end: ev.Event, final: Phase) -> None:
    w = IN_PHASE[phase]()
    assert w.job.phase is phase, (w.job.phase, w.job.diagnostics)
    out = w.send(end)
    assert w.job.phase is final
    assert w.job.history[-1][0] is phase and w.job.history[-1][2] is final
    if final is Phase.FAILED:
        assert [i.final_status for i in out if isinstance(i, ins.Finish)] == ["FAILED"], out
        assert "raised in the app" in w.job.diagnostics


def test_every_stop_and_failure_transition_of_the_lifecycle_is_among_them() -> None:
    stopping = {Phase.RESTARTING, Phase.MIGRATING, Phase.PAUSING, Phase.PAUSED, Phase.RESUMING}
    expected = {(a, t) for (a, t), _ in LIFECYCLE.items() if t in (Trigger.STOP, Trigger.FAIL) and a not in stopping}
    seen: set[tuple[Phase, Trigger]] = set()
    for make in IN_PHASE.values():
        for end, _ in ENDS:
            w = make()
            w.send(end)
            seen |= {(a, Trigger(t)) for a, t, _ in w.job.history}
    assert expected - seen == set()
