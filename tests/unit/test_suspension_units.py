"""Pause / resume of a PS job in the PS-job controller: the lifecycle's suspension transitions and
how directives' run states drive them (stepped by events in tests/support/controller_world.py).

The I/O of a pause (cut, checkpoint, release) and of a resume (start, restore) is checked on a
real cluster in tests/cluster/test_pause_resume_cluster.py."""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import pytest

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.phases import LIFECYCLE, JobTransitionError, Trigger
from appmaster.ps.controller.records import Role
from elastane_cli.ps_reports import colocation_text
from protocol import codec
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.ps_status import DirectiveRecord, PsStatus, decode_status
from protocol.records import Resource
from protocol.shape_history import ExecutorCounts
from tests.support.controller_world import World, started

PAUSE_STEPS = ["PauseTraining", "WriteCheckpoint", "RetireExecutors"]
RESUME_STEPS = ["StartExecutors", "StartExecutors", "RestoreCheckpoint", "ResumeTraining"]


def test_a_job_pauses_only_while_running_and_resumes_only_while_paused() -> None:
    P, T = Phase, Trigger
    assert LIFECYCLE.next(P.TRAINING, T.PAUSE) is P.PAUSING
    assert LIFECYCLE.next(P.PAUSING, T.PAUSED) is P.PAUSED
    assert LIFECYCLE.next(P.PAUSED, T.RESUME) is P.RESUMING
    assert LIFECYCLE.next(P.RESUMING, T.CHANGE_DONE) is P.TRAINING
    # converged before the boundary: back to training; a failed resume stays paused (the cut is kept)
    assert LIFECYCLE.next(P.PAUSING, T.CHANGE_DONE) is P.TRAINING
    assert LIFECYCLE.next(P.RESUMING, T.PAUSED) is P.PAUSED
    for phase, trigger in [(P.TRAINING, T.RESUME), (P.PAUSED, T.PAUSE), (P.PAUSING, T.PAUSE),
                           (P.RESUMING, T.PAUSE), (P.TRAINING, T.PAUSED)]:
        with pytest.raises(JobTransitionError, match=f"in phase {phase.value}"):
            LIFECYCLE.next(phase, trigger)


def directive(w: World, version: int, workers: int, servers: int, run_state: RunState = RunState.RUN,
              placement: Sequence[NodePlacement] = (), resource: Optional[Resource] = None) -> ev.DirectiveArrived:
    return ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(
        workers=workers, servers=servers, version=version, run_state=run_state, placement=list(placement),
        nodes=[p.node for p in placement], executor_resource=resource))


def reports(w: World, since: int) -> list[bool]:
    return [i.changing for i in w.log[since:] if isinstance(i, ins.ReportProgress)]


def test_run_states_pause_and_resume_through_the_suspension_not_the_reshaper() -> None:
    w = started(workers=2, servers=2, max_workers=4)
    n = len(w.log)
    w.send(directive(w, 1, 2, 2, RunState.PAUSE))
    assert w.steps_since(n) == PAUSE_STEPS and w.job.phase is Phase.PAUSED and w.job.shape == (0, 0)
    n = len(w.log)
    w.send(directive(w, 2, 2, 2, RunState.PAUSE))       # already paused: nothing happens
    assert w.steps_since(n) == [] and w.job.phase is Phase.PAUSED
    placement = (NodePlacement(node="n1", workers=2, servers=1), NodePlacement(node="n2", workers=1, servers=0))
    n = len(w.log)
    w.send(directive(w, 3, 3, 1, RunState.RESUME, placement, Resource(256, 1)))
    assert w.steps_since(n) == RESUME_STEPS and reports(w, n) == [True, False]
    servers, workers = w.of(ins.StartExecutors)[-2:]
    assert (servers.per_node, workers.per_node) == ({"n1": 1}, {"n1": 2, "n2": 1})
    assert w.job.phase is Phase.TRAINING and w.job.shape == (3, 1) and w.job.size == (256, 1)
    assert w.triggers()[-4:] == ["PAUSE", "PAUSED", "RESUME", "CHANGE_DONE"]
    assert not w.of(ins.MoveModelBlocks) and not w.of(ins.StageSplits)        # no EPS step for either
    n = len(w.log)
    w.send(directive(w, 4, 3, 2))                       # running again: a plain (live) reshape
    assert w.triggers()[-2:] == ["RESHAPE", "CHANGE_DONE"] and "PauseTraining" not in w.steps_since(n)
    assert w.job.shape == (3, 2)


def test_a_resume_while_the_pause_waits_for_its_boundary_is_applied_after_it() -> None:
    w = started(workers=1, servers=1)
    w.hold = {ins.PauseTraining}
    w.send(directive(w, 1, 1, 1, RunState.PAUSE))
    w.send(directive(w, 2, 2, 1, RunState.RUN))          # the policy changed its mind meanwhile
    assert w.job.phase is Phase.PAUSING and w.job.kept_directive is not None
    (pause,) = w.held.values()
    w.hold = set()
    w.answer(pause)
    assert w.triggers()[-4:] == ["PAUSE", "PAUSED", "RESUME", "CHANGE_DONE"]
    assert w.job.phase is Phase.TRAINING and w.job.shape == (2, 1) and w.job.applied_directive == 2


def test_a_failed_pause_is_recorded_and_later_directives_still_run() -> None:
    w = started(workers=2, servers=2, max_workers=4)
    w.hold = {ins.PauseTraining}
    w.send(directive(w, 1, 2, 2, RunState.PAUSE))
    (pause,) = w.held.values()
    w.hold = set()
    w.fail(pause, "the job finished training before it could pause")
    assert w.job.phase is Phase.TRAINING and w.job.shape == (2, 2)
    assert w.triggers()[-2:] == ["PAUSE", "CHANGE_DONE"] and not w.of(ins.RetireExecutors)
    w.send(directive(w, 2, 3, 2))
    assert w.triggers()[-2:] == ["RESHAPE", "CHANGE_DONE"] and w.job.shape == (3, 2)


def test_ps_status_shows_the_group_the_pause_and_the_spill() -> None:
    def as_served(status: dict[str, Any]) -> PsStatus:       # through JSON, as /status serves it
        return decode_status(json.loads(codec.dumps(status)))
    assert colocation_text(as_served({})) is None
    assert colocation_text(as_served({"suspension": {"state": "RUNNING", "pauses": 0}})) is None
    records = [DirectiveRecord(version=1, workers=2, servers=1, before=ExecutorCounts(2, 1), started=100.0),
               DirectiveRecord(version=2, workers=2, servers=1, before=ExecutorCounts(0, 0), steps=[("pause", 1)],
                               started=110.0, seconds=1.0, group="g2", run_state="pause")]
    status = {"directives": records, "suspension": {"state": "PAUSED", "pauses": 1, "paused_s": 12.0},
              "spill": {"alpha": 0.25, "spilled_mb": 31.46}}
    text = colocation_text(as_served(status))
    assert text is not None and text.startswith("group g2; paused, 1 pause (")
    assert text.endswith("spill alpha 0.25, 31.5 MB on disk")


def test_a_new_executor_size_moves_the_job_by_restarting_it_from_a_cut() -> None:
    w = started(workers=1, servers=1)
    w.job.memory_mb, w.job.vcores = 512, 1
    placement = (NodePlacement(node="n2", workers=1, servers=1),)
    n = len(w.log)
    w.send(directive(w, 1, 1, 1, placement=placement, resource=Resource(512, 1)))   # same size: live
    assert "PauseTraining" not in w.steps_since(n) and w.triggers()[-2:] == ["RESHAPE", "CHANGE_DONE"]
    assert {w.job.node_of(e) for e in w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER)} == {"n2"}
    n = len(w.log)
    w.send(directive(w, 2, 1, 1, placement=placement, resource=Resource(384, 1)))   # another size
    assert w.steps_since(n) == PAUSE_STEPS + RESUME_STEPS
    assert w.triggers()[-2:] == ["MIGRATE", "CHANGE_DONE"] and w.job.size == (384, 1)
    assert w.of(ins.WriteCheckpoint)[-1].reason == "migrate"


def test_a_resume_that_got_no_executors_is_tried_again_while_the_job_stays_paused() -> None:
    w = started(workers=1, servers=1)
    w.send(directive(w, 1, 1, 1, RunState.PAUSE))
    w.hold = {ins.StartExecutors}
    w.send(directive(w, 2, 1, 1, RunState.RESUME))
    tries = 0
    while w.held:
        servers, workers = w.held_of(ins.StartExecutors)
        if tries < 2:          # refused twice: the new workers did not start
            w.fail(workers, "the new workers did not start: 0 of 1 new workers ready after 120s")
            w.answer(servers)
            assert w.job.phase is Phase.PAUSED
            timer = w.of(ins.SetTimer)[-1]
            w.send(ev.TimerFired(at=timer.at, timer=timer.timer))
        else:
            w.hold = set()
            w.answer(servers)
            w.answer(workers)
        tries += 1
    assert tries == 3 and w.job.phase is Phase.TRAINING and w.job.shape == (1, 1)
    assert w.triggers()[-2:] == ["RESUME", "CHANGE_DONE"] and w.triggers().count("RESUME") == 3
