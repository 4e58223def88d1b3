"""The kill-based baseline's pure parts: the order of a reshape's steps and their timing (injected
clock), the shape checks that refuse impossible requests, and which apps it can restart."""
from __future__ import annotations

import itertools

import pytest

from appmaster.ps.kill_restart import (RESTART_TRANSITIONS, RestartEvent, RestartPhase, RestartTimeline,
                                       RestartTransitionError,
                                       check_target, keeps_worker_state)
from protocol.remote_exception import BadRequest
from psruntime.apps.registry import create_app


def fake_clock(times: list[float]):
    it = iter(times)
    return lambda: next(it)


def test_a_reshape_goes_through_every_step_in_order_and_times_each() -> None:
    tl = RestartTimeline((3, 3), (2, 2), clock=fake_clock([0.0, 2.0, 2.5, 3.5, 6.0, 7.0]))
    for ev, p in ((RestartEvent.BOUNDARY, RestartPhase.PAUSED), (RestartEvent.CHECKPOINT, RestartPhase.CHECKPOINTED),
                  (RestartEvent.RELEASE, RestartPhase.RELEASED), (RestartEvent.ALLOCATE, RestartPhase.ALLOCATED),
                  (RestartEvent.RESTORE, RestartPhase.RESTORED)):
        tl.on(ev)
        assert tl.phase is p
    assert tl.steps() == {"wait_boundary_s": 2.0, "checkpoint_s": 0.5, "release_s": 1.0, "allocate_s": 2.5,
                          "restore_s": 1.0}
    assert tl.seconds == pytest.approx(5.0)      # from the pause to training resuming
    assert tl.lost_s == tl.seconds               # nothing trains meanwhile


def test_steps_cannot_be_skipped_or_repeated() -> None:
    tl = RestartTimeline((3, 3), (2, 2), clock=itertools.count().__next__)
    with pytest.raises(RestartTransitionError, match="cannot take release in REQUESTED"):
        tl.on(RestartEvent.RELEASE)
    tl.on(RestartEvent.BOUNDARY)
    with pytest.raises(RestartTransitionError):
        tl.on(RestartEvent.BOUNDARY)
    with pytest.raises(RestartTransitionError):
        tl.on(RestartEvent.CANCEL)                  # only before the pause
    tl.on(RestartEvent.FAIL, "no containers")
    assert tl.error == "no containers" and tl.phase is RestartPhase.FAILED
    assert not any(RESTART_TRANSITIONS.allows(RestartPhase.FAILED, e) for e in RestartEvent)
    assert list(tl.steps()) == ["wait_boundary_s"]


def test_a_request_is_cancelled_only_before_the_pause() -> None:
    tl = RestartTimeline((2, 2), (3, 3), clock=itertools.count().__next__)
    tl.on(RestartEvent.CANCEL)
    assert tl.seconds == 0.0 and tl.steps() == {}


@pytest.mark.parametrize("workers,servers,match", [
    (0, 2, "workers must be an integer >= 1, got 0"),
    (2, -1, "servers must be an integer >= 1"),
    (True, 2, "workers must be an integer"),
    (5, 2, r"workers: 5 is above the job's max_workers \(4\)"),
    (2, 4, r"servers: 4 is above the job's max_servers \(3\)"),
])
def test_impossible_shapes_are_refused_naming_the_field(workers, servers, match) -> None:
    with pytest.raises(BadRequest, match=match):
        check_target(workers, servers, 4, 3)


def test_check_target_accepts_shapes_within_bounds() -> None:
    check_target(4, 3, 4, 3)
    check_target(9, 9, None, None)


@pytest.mark.parametrize("app,keeps", [("mlr", False), ("lasso", False), ("nmf", True), ("lda", True)])
def test_apps_with_worker_state_are_known(app: str, keeps: bool) -> None:
    """NMF and LDA keep state on their workers: their checkpoints hold it too."""
    assert keeps_worker_state(create_app(app, {}, {})) is keeps
