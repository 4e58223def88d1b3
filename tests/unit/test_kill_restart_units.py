"""The kill-based baseline's pure parts, through the PS-job controller (its restart planner,
stepped by events in tests/support/controller_world.py): the order of a reshape's steps, that they
cannot be skipped or repeated (one restart at a time, a failed step rolls the job back), that a
restart given up before its pause changes nothing, the shape checks that refuse impossible
requests, and which apps keep worker state (their checkpoints hold it too). No processes."""
from __future__ import annotations

import pytest

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.phases import LIFECYCLE, Trigger
from appmaster.ps.controller.planners.restart import check_target
from appmaster.ps.reconfiguration import keeps_worker_state
from psruntime.apps.registry import create_app
from tests.support.controller_world import World, started

STEPS = ["PauseTraining", "WriteCheckpoint", "RetireExecutors", "StartExecutors", "StartExecutors",
         "RestoreCheckpoint", "ResumeTraining"]


def kill_job(**spec: object) -> World:
    return started(elastic_mode="kill", workers=3, servers=3, **spec)


def test_a_reshape_goes_through_every_step_in_order_and_nothing_trains_meanwhile() -> None:
    w = kill_job()
    w.hold = set(ins.STEP_TYPES)
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=-1, servers=-1))
    seen: list[str] = []
    while w.held:
        step = w.held_of(type(min(w.held.values(), key=lambda s: s.step)))[0]
        seen.append(type(step).__name__)
        # From the pause to the resume the job is RESTARTING, where no training runs.
        assert w.job.phase is Phase.RESTARTING and not w.job.phase.trains
        w.answer(step)
    assert seen == STEPS
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING
    assert w.triggers()[-2:] == ["RESTART", "CHANGE_DONE"]
    assert w.of(ins.Reply)[-1] == ins.Reply(request=1, status=200)


def test_steps_cannot_be_skipped_or_repeated() -> None:
    # One restart at a time: RESTART is not a trigger of RESTARTING, a second /scale is refused.
    assert not LIFECYCLE.allows(Phase.RESTARTING, Trigger.RESTART)
    w = kill_job()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=-1, servers=-1))
    w.send(ev.ScaleRequested(at=w.at(), request=2, workers=1, servers=0))
    assert w.log[-1] == ins.Reply(request=2, status=409, message="another change is running (restart)")
    # A step that fails (no containers): the change fails, the job goes back to its old shape
    # from the same cut, training again, and the request is answered with the error.
    first = w.held_of(ins.StartExecutors)[0]
    w.hold = set()
    w.fail(first, "no containers")
    for s in w.held_of(ins.StartExecutors):
        w.fail(s, "no containers", cancelled=True)
    reply = w.of(ins.Reply)[-1]
    assert reply.request == 1 and reply.status == 409 and "no containers" in reply.message
    assert w.job.shape == (3, 3) and w.job.phase is Phase.TRAINING
    restores = w.of(ins.RestoreCheckpoint)
    assert len(restores) == 1 and restores[0].directory == w.job.checkpoints[-1][1]


def test_a_restart_given_up_before_its_pause_changes_nothing() -> None:
    w = kill_job()
    w.hold = {ins.PauseTraining}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (pause,) = w.held.values()
    w.fail(pause, "training ended before the clock boundary")
    assert not w.of(ins.WriteCheckpoint)[1:] and not w.of(ins.RetireExecutors) and not w.of(ins.StartExecutors)[2:]
    assert w.job.shape == (3, 3) and w.job.phase is Phase.TRAINING
    assert w.of(ins.Reply)[-1].status == 409


@pytest.mark.parametrize("workers,servers,match", [
    (0, 2, "workers must be an integer >= 1, got 0"),
    (2, -1, "servers must be an integer >= 1"),
    (True, 2, "workers must be an integer"),
    (5, 2, r"workers: 5 is above the job's max_workers \(4\)"),
    (2, 4, r"servers: 4 is above the job's max_servers \(3\)"),
])
def test_impossible_shapes_are_refused_naming_the_field(workers, servers, match) -> None:
    import re
    assert re.search(match, check_target(workers, servers, 4, 3))
    # ... and a /scale to that shape is answered 400 with it, changing nothing.
    if isinstance(workers, bool):
        return
    w = started(elastic_mode="kill", workers=2, servers=2, max_workers=4, max_servers=3)
    n = len(w.log)
    w.send(ev.ScaleRequested(at=w.at(), request=7, workers=workers - 2, servers=servers - 2))
    (reply,) = w.log[n:]
    assert isinstance(reply, ins.Reply) and reply.status == 400 and re.search(match, reply.message)
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING


def test_check_target_accepts_shapes_within_bounds() -> None:
    assert check_target(4, 3, 4, 3) == ""
    assert check_target(9, 9, None, None) == ""


@pytest.mark.parametrize("app,keeps", [("mlr", False), ("lasso", False), ("nmf", True), ("lda", True)])
def test_apps_with_worker_state_are_known(app: str, keeps: bool) -> None:
    """NMF and LDA keep state on their workers: their checkpoints hold it too."""
    assert keeps_worker_state(create_app(app, {}, {})) is keeps
