"""Harmony's pause and resume and the migration through a checkpoint, stepped by events
(tests/support/controller_world.py): every stage, the rule table while paused or pausing, the
retries of a resume that got no executors, failures and rollbacks. No processes, no sleeps."""
from __future__ import annotations

from typing import Optional

from appmaster.ps.controller import LIFECYCLE, Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.planners.suspension import RESUME_RETRY_S, RESUME_TRIES
from appmaster.ps.controller.records import Role
from appmaster.ps.controller.rules import PAUSED_RULES, Arrival, Rule, rule
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.records import Resource
from tests.support.controller_world import World, job_state, started


def directive(w: World, version: int, run_state: RunState = RunState.RUN, workers: int = 2, servers: int = 1,
              placement: Optional[list[NodePlacement]] = None, resource: Optional[Resource] = None) -> ev.DirectiveArrived:
    return ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(
        workers=workers, servers=servers, version=version, run_state=run_state, placement=placement or [],
        nodes=[p.node for p in placement or []], executor_resource=resource))


def paused(**spec: object) -> World:
    w = started(**spec)
    w.send(directive(w, 1, RunState.PAUSE))
    assert w.job.phase is Phase.PAUSED
    return w


def test_a_pause_stops_at_a_boundary_checkpoints_and_gives_every_executor_back() -> None:
    w = started()
    everyone = sorted(w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER))
    n = len(w.log)
    w.send(directive(w, 1, RunState.PAUSE))
    assert w.steps_since(n) == ["PauseTraining", "WriteCheckpoint", "RetireExecutors"]
    ckpt = w.of(ins.WriteCheckpoint)[-1]
    retire = w.of(ins.RetireExecutors)[-1]
    assert ckpt.reason == "pause" and sorted(retire.executors) == everyone and retire.released
    assert w.job.phase is Phase.PAUSED and w.job.change is None and w.job.shape == (0, 0)
    assert w.job.checkpoints[-1] == (ckpt.epoch, f"ckpt/epoch-{ckpt.epoch}")
    assert w.triggers()[-2:] == ["PAUSE", "PAUSED"]
    assert w.log[-1] == ins.ReportProgress(changing=False, directive_version=1)


def test_while_paused_scale_and_checkpoint_are_refused_and_nothing_is_a_loss() -> None:
    w = paused()
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.log[-1] == ins.Reply(request=1, status=409, message="the job is paused: its shape changes when it resumes")
    w.send(ev.CheckpointRequested(at=w.at(), request=2))
    assert w.log[-1].status == 409            # type: ignore[union-attr]
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 143")]))
    w.send(ev.PlanProposed(at=w.at(), ops=[]))
    assert w.job.failures == 0 and w.job.phase is Phase.PAUSED
    n = len(w.log)
    w.send(directive(w, 2, RunState.PAUSE))     # a repeat of the pause: acted on, nothing to do
    assert w.log[n:] == [ins.ReportProgress(changing=False, directive_version=2)]
    assert rule(None, Arrival.DIRECTIVE, paused=True) is Rule.START and PAUSED_RULES[Arrival.LOSS] is Rule.IGNORE


def test_a_resume_starts_the_directives_placement_and_restores_the_pauses_cut() -> None:
    w = paused()
    cut = w.job.checkpoints[-1][1]
    n = len(w.log)
    placement = [NodePlacement(node="n2", workers=1, servers=1), NodePlacement(node="n3", workers=2)]
    w.send(directive(w, 2, RunState.RESUME, workers=3, servers=1, placement=placement))
    assert w.steps_since(n) == ["StartExecutors", "StartExecutors", "RestoreCheckpoint", "ResumeTraining"]
    servers, workers = w.of(ins.StartExecutors)[-2:]
    assert (servers.per_node, workers.per_node) == ({"n2": 1}, {"n2": 1, "n3": 2})  # type: ignore[union-attr]
    restore = w.of(ins.RestoreCheckpoint)[-1]
    assert restore.directory == cut and len(restore.workers) == 3
    assert w.job.phase is Phase.TRAINING and w.job.shape == (3, 1) and w.job.applied_directive == 2
    assert w.triggers()[-2:] == ["RESUME", "CHANGE_DONE"]
    assert (Phase.PAUSED, "RESUME", Phase.RESUMING) in w.job.history


def test_a_run_directive_resumes_too_and_a_resume_while_running_is_a_reshape() -> None:
    w = paused()
    w.send(directive(w, 2, RunState.RUN, workers=2, servers=1))
    assert w.job.phase is Phase.TRAINING and w.triggers()[-2:] == ["RESUME", "CHANGE_DONE"]
    w.send(directive(w, 3, RunState.RESUME, workers=3, servers=1))          # running: EPS adds a worker
    assert w.triggers()[-2:] == ["RESHAPE", "CHANGE_DONE"] and w.job.shape == (3, 1)


def test_a_resume_sizes_the_executors_as_the_directive_says() -> None:
    w = paused()
    w.send(directive(w, 2, RunState.RESUME, resource=Resource(memory=1024, vcores=2)))
    assert (w.job.memory_mb, w.job.vcores) == (1024, 2) and w.job.size == (1024, 2)
    assert w.job.phase is Phase.TRAINING


def test_a_directive_while_pausing_is_kept_and_applied_once_paused() -> None:
    w = started()
    w.hold = {ins.RetireExecutors}
    w.send(directive(w, 1, RunState.PAUSE))
    assert w.job.phase is Phase.PAUSING
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.log[-1] == ins.Reply(request=1, status=409, message="another change is running (pause)")
    w.send(ev.CheckpointRequested(at=w.at(), request=2))
    assert w.log[-1].status == 409            # type: ignore[union-attr]
    w.send(directive(w, 2, RunState.RESUME, workers=3))
    assert w.job.kept_directive is not None and w.job.kept_directive.version == 2
    w.hold = set()
    (retire,) = w.held.values()
    w.answer(retire)
    assert w.triggers()[-4:] == ["PAUSE", "PAUSED", "RESUME", "CHANGE_DONE"]
    assert w.job.phase is Phase.TRAINING and w.job.shape == (3, 1) and w.job.kept_directive is None


def test_a_pause_that_training_outran_ends_back_in_training() -> None:
    w = started()
    w.hold = {ins.PauseTraining}
    w.send(directive(w, 1, RunState.PAUSE))
    (pause,) = w.held.values()
    w.hold = set()
    w.fail(pause, "the job finished training before it could pause")
    assert w.triggers()[-2:] == ["PAUSE", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING
    assert (Phase.PAUSING, "CHANGE_DONE", Phase.TRAINING) in w.job.history
    assert w.job.shape == (2, 1) and not w.of(ins.RetireExecutors) and len(w.of(ins.ResumeTraining)) == 1


def test_a_pause_whose_checkpoint_fails_resumes_training() -> None:
    w = started()
    w.hold = {ins.WriteCheckpoint}
    w.send(directive(w, 1, RunState.PAUSE))
    (ckpt,) = [s for s in w.held.values() if s.step > 3]
    w.hold = set()
    n = len(w.log)
    w.fail(ckpt, "disk full")
    assert w.steps_since(n) == ["ResumeTraining"]
    assert w.job.phase is Phase.TRAINING and w.job.shape == (2, 1)


def test_a_loss_while_pausing_aborts_the_pause_and_the_recovery_follows() -> None:
    w = started()
    w.hold = {ins.PauseTraining}
    w.send(directive(w, 1, RunState.PAUSE))
    (pause,) = w.held.values()
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 137")]))
    assert w.log[-1] == ins.CancelSteps(steps=[pause.step])
    w.hold = set()
    w.fail(pause, "cancelled", cancelled=True)
    assert w.triggers()[-4:] == ["PAUSE", "CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
    assert w.job.phase is Phase.TRAINING and w.job.failures == 1


def test_a_resume_that_gets_no_executors_stays_paused_and_is_tried_again() -> None:
    w = paused()
    cut = w.job.checkpoints[-1]
    w.hold = {ins.StartExecutors}
    w.send(directive(w, 2, RunState.RESUME))
    servers, workers = w.held_of(ins.StartExecutors)
    w.answer(servers)                                   # a server came, the workers did not
    w.hold = set()
    w.fail(workers, "no containers on n2")
    retire = w.of(ins.RetireExecutors)[-1]
    assert retire.executors == ["server-2"] and not retire.released
    assert w.job.phase is Phase.PAUSED and w.job.change is None and w.job.checkpoints[-1] == cut
    assert w.triggers()[-2:] == ["RESUME", "PAUSED"]
    assert (Phase.RESUMING, "PAUSED", Phase.PAUSED) in w.job.history
    timer = w.of(ins.SetTimer)[-1]
    assert timer.timer == "resume:v2:1" and timer.at == w.now - 1.0 + RESUME_RETRY_S
    w.send(ev.TimerFired(at=w.at(), timer="some other timer"))
    assert w.job.phase is Phase.PAUSED
    w.send(ev.TimerFired(at=w.at(), timer=timer.timer))
    assert w.triggers()[-2:] == ["RESUME", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING
    assert w.of(ins.RestoreCheckpoint)[-1].directory == cut[1] and w.job.resume_retry is None


def test_a_resume_is_tried_at_most_resume_tries_times() -> None:
    w = paused()
    w.hold = {ins.StartExecutors}
    w.send(directive(w, 2, RunState.RESUME))
    for attempt in range(RESUME_TRIES):
        starts = w.held_of(ins.StartExecutors)
        assert len(starts) == 2, attempt
        for s in starts:
            if s.step in w.held:
                w.fail(s, "no room")
        assert w.job.phase is Phase.PAUSED
        if attempt + 1 < RESUME_TRIES:
            w.send(ev.TimerFired(at=w.at(), timer=f"resume:v2:{attempt + 1}"))
    assert len(w.of(ins.SetTimer)) == RESUME_TRIES - 1 and w.job.resume_retry is None
    assert w.triggers().count("RESUME") == RESUME_TRIES
    w.hold = set()
    w.send(directive(w, 3, RunState.RESUME))              # a newer directive still resumes it
    assert w.job.phase is Phase.TRAINING


def test_a_newer_directive_supersedes_the_retry() -> None:
    w = paused()
    w.hold = {ins.StartExecutors}
    w.send(directive(w, 2, RunState.RESUME))
    for s in w.held_of(ins.StartExecutors):
        if s.step in w.held:
            w.fail(s, "no room")
    timer = w.of(ins.SetTimer)[-1].timer
    w.hold = set()
    w.send(directive(w, 3, RunState.PAUSE))               # the policy wants it paused now
    n = len(w.job.history)
    w.send(ev.TimerFired(at=w.at(), timer=timer))
    assert len(w.job.history) == n and w.job.phase is Phase.PAUSED


def test_a_loss_while_resuming_pauses_the_job_again() -> None:
    w = paused()
    w.hold = {ins.RestoreCheckpoint}
    w.send(directive(w, 2, RunState.RESUME))
    (restore,) = w.held.values()
    w.send(ev.ExecutorLost(at=w.at(), executor_id="server-2", description="server-2 exited 137"))
    assert w.log[-1] == ins.CancelSteps(steps=[restore.step])
    w.hold = set()
    w.fail(restore, "cancelled", cancelled=True)
    assert sorted(w.of(ins.RetireExecutors)[-1].executors) == ["worker-3", "worker-4"]
    assert w.job.phase is Phase.PAUSED and not w.job.pending_losses and w.job.resume_retry is not None
    assert "RECOVER" not in w.triggers()


def test_a_resume_whose_restore_fails_fails_the_job() -> None:
    w = paused()
    w.hold = {ins.RestoreCheckpoint}
    w.send(directive(w, 2, RunState.RESUME))
    (restore,) = w.held.values()
    w.fail(restore, "checkpoint unreadable")
    assert w.job.phase is Phase.FAILED and w.of(ins.Finish)[-1].final_status == "FAILED"


def test_stop_and_user_errors_while_paused() -> None:
    w = paused()
    w.send(ev.StopRequested(at=w.at(), reason="stopped by SIGTERM"))
    assert w.job.phase is Phase.KILLED and w.log[-1] == ins.Finish(final_status=None, diagnostics="stopped by SIGTERM")
    w = paused()
    w.send(ev.UserCodeError(at=w.at(), message="user app raised"))
    assert w.job.phase is Phase.FAILED


def test_another_executor_size_migrates_the_job_through_a_checkpoint() -> None:
    w = started()
    old = sorted(w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER))
    n = len(w.log)
    placement = [NodePlacement(node="n3", workers=2, servers=1)]
    w.send(directive(w, 1, workers=2, servers=1, placement=placement, resource=Resource(memory=2048, vcores=2)))
    assert w.steps_since(n) == ["PauseTraining", "WriteCheckpoint", "RetireExecutors", "StartExecutors",
                                 "StartExecutors", "RestoreCheckpoint", "ResumeTraining"]
    assert w.of(ins.WriteCheckpoint)[-1].reason == "migrate"
    assert sorted(w.of(ins.RetireExecutors)[-1].executors) == old
    assert w.of(ins.RestoreCheckpoint)[-1].directory == w.job.checkpoints[-1][1]
    assert (w.job.memory_mb, w.job.vcores) == (2048, 2)
    assert {w.job.node_of(e) for e in w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER)} == {"n3"}
    assert w.triggers()[-2:] == ["MIGRATE", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING
    assert (Phase.TRAINING, "MIGRATE", Phase.MIGRATING) in w.job.history


def test_a_directive_repeating_the_jobs_size_is_no_migration() -> None:
    w = started()
    spec = w.job.spec
    w.send(directive(w, 1, resource=Resource(memory=spec.executor_memory_mb, vcores=spec.executor_vcores)))
    assert "MIGRATE" not in w.triggers() and w.log[-1] == ins.ReportProgress(changing=False, directive_version=1)


def test_a_migration_that_gets_no_executors_goes_back_to_the_old_size_and_shape() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    w.send(directive(w, 1, workers=3, resource=Resource(memory=2048, vcores=2)))
    assert w.job.phase is Phase.MIGRATING and (w.job.memory_mb, w.job.vcores) == (2048, 2)
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.log[-1] == ins.Reply(request=1, status=409, message="another change is running (migrate)")
    w.send(directive(w, 2, workers=4))
    assert w.job.kept_directive is not None
    for s in w.held_of(ins.StartExecutors):
        if s.step in w.held:
            w.fail(s, "no 2048 MB containers")
    w.hold = set()
    for s in w.held_of(ins.StartExecutors):     # going back: the old size, anywhere
        w.answer(s)
    assert (w.job.memory_mb, w.job.vcores) == (None, None)
    assert w.triggers()[-4:] == ["MIGRATE", "CHANGE_DONE", "RESHAPE", "CHANGE_DONE"]   # then the kept directive
    assert w.job.shape == (4, 1) and w.job.phase is Phase.TRAINING


def _held_in(phase: Phase) -> World:
    """A job stopped in `phase` with one step held."""
    if phase is Phase.RESTARTING:
        w = World(job_state(elastic_mode="kill"))
        w.start()
        w.hold = {ins.RestoreCheckpoint}
        w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    elif phase is Phase.MIGRATING:
        w = started()
        w.hold = {ins.RestoreCheckpoint}
        w.send(directive(w, 1, resource=Resource(memory=2048, vcores=2)))
    elif phase is Phase.PAUSING:
        w = started()
        w.hold = {ins.RetireExecutors}
        w.send(directive(w, 1, RunState.PAUSE))
    elif phase is Phase.PAUSED:
        w = paused()
    else:
        w = paused()
        w.hold = {ins.RestoreCheckpoint}
        w.send(directive(w, 2, RunState.RESUME))
    assert w.job.phase is phase
    return w


STOPPING = (Phase.RESTARTING, Phase.MIGRATING, Phase.PAUSING, Phase.PAUSED, Phase.RESUMING)


def test_every_transition_into_and_out_of_the_stopping_phases_is_exercised() -> None:
    """LIFECYCLE's transitions that touch a restart, a migration or the suspension all happen
    in these scenarios (the happy paths, the failures, a stop and a user-code error in each)."""
    seen: set[tuple[Phase, str, Phase]] = set()
    for phase in STOPPING:
        for end in (ev.StopRequested(at=0.0, reason="stopped"), ev.UserCodeError(at=0.0, message="raised")):
            w = _held_in(phase)
            w.send(end)
            assert w.job.phase is (Phase.KILLED if isinstance(end, ev.StopRequested) else Phase.FAILED)
            seen |= set(w.job.history)
        w = _held_in(phase)
        w.hold = set()
        for step in list(w.held.values()):
            w.answer(step)
        seen |= set(w.job.history)
    w = _held_in(Phase.PAUSED)
    w.hold = {ins.StartExecutors}
    w.send(directive(w, 2, RunState.RESUME))
    for step in w.held_of(ins.StartExecutors):
        if step.step in w.held:
            w.fail(step, "no room")
    seen |= set(w.job.history)
    w = started()
    w.hold = {ins.PauseTraining}
    w.send(directive(w, 1, RunState.PAUSE))
    w.fail(next(iter(w.held.values())), "training ended first")
    seen |= set(w.job.history)
    expected = {(a, t.value, b) for (a, t), b in LIFECYCLE.items() if {a, b} & set(STOPPING)}
    assert expected - seen == set()


def test_a_job_that_converges_while_pausing_finishes_instead_of_pausing() -> None:
    """Training meets its end criterion while the pause waits for the clock boundary: the AM's
    pause then answers done, after the TrainingEnded. The job finishes -- it went on to checkpoint,
    retire its executors and sit PAUSED, converged, waiting for a resume only to end."""
    w = started()
    w.hold = {ins.PauseTraining}
    w.send(directive(w, 1, RunState.PAUSE))
    (pause,) = w.held.values()
    w.send(ev.TrainingEnded(at=w.at(), criterion="converged"))
    w.hold = set()
    n = len(w.log)
    w.answer(pause)
    assert "RetireExecutors" not in w.steps_since(n) and "WriteCheckpoint" not in w.steps_since(n)
    assert w.job.phase is Phase.SUCCEEDED and w.triggers()[-2:] == ["TRAINED", "FINISHED"]
