"""The kill-based restart planner stepped by events (tests/support/controller_world.py): /scale and
directives through pause -> checkpoint -> retire all -> start -> restore -> resume, the rule table
while it runs, its failures and rollbacks. No processes, no sleeps."""
from __future__ import annotations

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.planners.restart import check_target
from appmaster.ps.controller.records import ExecutorInfo, Role
from appmaster.ps.controller.state import ChangeKind, ExecutorState
from protocol.internal_api import NodePlacement, ShapeDirective
from tests.support.controller_world import World, job_state, started

SEQUENCE = ["PauseTraining", "WriteCheckpoint", "RetireExecutors", "StartExecutors", "StartExecutors",
            "RestoreCheckpoint", "ResumeTraining"]


def kill_job(**spec: object) -> World:
    """A training job of elastic_mode "kill" (its /scale and directives restart it)."""
    return started(elastic_mode="kill", **spec)


def test_scale_restarts_the_job_through_a_checkpoint() -> None:
    w = kill_job()
    old = sorted(w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER))
    n = len(w.log)
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=1))
    assert w.steps_since(n) == SEQUENCE
    pause, ckpt, retire, servers, workers, restore, _ = [i for i in w.log[n:] if isinstance(i, ins.STEP_TYPES)]
    assert isinstance(ckpt, ins.WriteCheckpoint) and ckpt.reason == "reshape"
    assert isinstance(retire, ins.RetireExecutors) and sorted(retire.executors) == old and retire.released
    assert isinstance(servers, ins.StartExecutors) and (servers.role, servers.count) == (Role.SERVER, 2)
    assert isinstance(workers, ins.StartExecutors) and (workers.role, workers.count) == (Role.WORKER, 3)
    assert isinstance(restore, ins.RestoreCheckpoint) and restore.directory == w.job.checkpoints[-1][1]
    assert sorted(restore.servers) == ["server-2", "server-3"] and len(restore.workers) == 3
    assert w.job.shape == (3, 2) and set(w.job.holdings.blocks) == {"server-2", "server-3"}
    assert all(w.job.executors[e].state is ExecutorState.RETIRING for e in old)
    assert w.of(ins.Reply)[-1] == ins.Reply(request=1, status=200)
    assert w.triggers()[-2:] == ["RESTART", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING
    assert (Phase.TRAINING, "RESTART", Phase.RESTARTING) in w.job.history


def test_a_retired_executor_ending_is_no_loss() -> None:
    w = kill_job()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=-1, servers=0))
    assert w.job.phase is Phase.RESTARTING
    # Their containers end while the retire step has not answered yet: expected, no loss.
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 143"), ("c-worker-1", "exited 143")]))
    assert w.job.failures == 0 and not w.job.pending_losses and w.job.phase is Phase.RESTARTING


def test_while_restarting_a_scale_is_refused_a_directive_and_a_checkpoint_request_kept() -> None:
    w = kill_job()
    w.hold = {ins.RestoreCheckpoint}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.job.phase is Phase.RESTARTING and not w.job.phase.trains
    w.send(ev.ScaleRequested(at=w.at(), request=2, workers=1, servers=0))
    assert w.log[-1] == ins.Reply(request=2, status=409, message="another change is running (restart)")
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=4, servers=1, version=1)))
    w.send(ev.CheckpointRequested(at=w.at(), request=3))
    assert w.job.kept_directive is not None and w.job.checkpoint_requests == [3]
    w.hold = set()
    (restore,) = w.held.values()
    w.answer(restore)
    # The restart ends (200), then the kept directive is applied: a second restart, to 4 workers.
    assert ins.Reply(request=1, status=200) in w.log
    assert w.triggers()[-4:] == ["RESTART", "CHANGE_DONE", "RESTART", "CHANGE_DONE"]
    assert w.job.shape == (4, 1) and w.job.applied_directive == 1


def test_impossible_scales_are_400_and_change_nothing() -> None:
    w = kill_job(max_workers=4, max_servers=3)
    for request, (dw, ds), message in ((1, (-2, 0), "workers must be an integer >= 1, got 0"),
                                       (2, (3, 0), "workers: 5 is above the job's max_workers (4)"),
                                       (3, (0, 3), "servers: 4 is above the job's max_servers (3)"),
                                       (4, (0, 0), "nothing to change: give workers and/or servers as +N or -N")):
        n = len(w.log)
        w.send(ev.ScaleRequested(at=w.at(), request=request, workers=dw, servers=ds))
        assert w.log[n:] == [ins.Reply(request=request, status=400, message=message)]
    assert w.job.shape == (2, 1) and w.job.change is None and w.job.phase is Phase.TRAINING


def test_a_kill_restart_is_bound_by_input_splits_and_model_blocks_as_an_eps_change_is() -> None:
    w = kill_job()                  # no max_workers / max_servers: the data and the model bound it
    splits = sum(len(s) for s in w.job.holdings.splits.values())
    blocks = w.job.spec.num_blocks
    for request, (dw, ds), needle in ((1, (splits - 1, 0), f"{splits + 1} workers is more than this job's maximum of {splits}"),
                                      (2, (0, blocks), f"{blocks + 1} servers is more than this job's maximum of {blocks}")):
        n = len(w.log)
        w.send(ev.ScaleRequested(at=w.at(), request=request, workers=dw, servers=ds))
        (reply,) = w.log[n:]
        assert isinstance(reply, ins.Reply) and reply.status == 400 and needle in reply.message, reply
    assert w.job.shape == (2, 1) and w.job.change is None and w.job.phase is Phase.TRAINING
    # A directive beyond them is refused with the reason, not carried out by a restart.
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=splits + 1, servers=1, version=1)))
    assert "RESTART" not in w.triggers() and w.job.shape == (2, 1)
    assert f"more than this job's maximum of {splits}" in w.job.refused_directive


def test_check_target_names_the_field() -> None:
    assert check_target(4, 3, 4, 3) == "" and check_target(9, 9, None, None) == ""
    assert check_target(True, 2, None, None) == "workers must be an integer >= 1, got True"   # type: ignore[arg-type]
    assert check_target(2, -1, None, None) == "servers must be an integer >= 1, got -1"


def test_a_directive_for_the_shape_and_place_the_job_has_is_no_restart() -> None:
    w = kill_job()
    nodes = sorted({w.job.node_of(e) for e in w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER)})
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=2, servers=1, version=1, nodes=nodes)))
    assert w.job.phase is Phase.TRAINING and "RESTART" not in w.triggers()
    assert w.log[-1] == ins.ReportProgress(changing=False, directive_version=1)


def test_a_directive_with_a_placement_restarts_the_job_per_node() -> None:
    w = kill_job()
    d = ShapeDirective(workers=2, servers=1, version=1, placement=[NodePlacement(node="n3", workers=2, servers=1)])
    n = len(w.log)
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    assert w.steps_since(n) == SEQUENCE
    starts = [i for i in w.log[n:] if isinstance(i, ins.StartExecutors)]
    assert [(s.role, s.count, s.per_node) for s in starts] == [(Role.SERVER, 1, {"n3": 1}), (Role.WORKER, 2, {"n3": 2})]
    assert {w.job.node_of(e) for e in w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER)} == {"n3"}
    assert w.job.applied_directive == 1 and w.triggers()[-2:] == ["RESTART", "CHANGE_DONE"]
    # The same placement again: the job is there already.
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(
        workers=2, servers=1, version=2, placement=[NodePlacement(node="n3", workers=2, servers=1)])))
    assert w.triggers()[-1] == "CHANGE_DONE" and w.log[-1] == ins.ReportProgress(changing=False, directive_version=2)


def test_a_directive_with_nodes_starts_the_new_executors_there() -> None:
    w = kill_job()
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=3, servers=1, version=1, nodes=["n2"])))
    starts = w.of(ins.StartExecutors)[-2:]
    assert [(s.count, s.nodes) for s in starts] == [(1, ["n2"]), (3, ["n2"])]       # type: ignore[union-attr]
    assert w.job.shape == (3, 1)


def test_a_failed_checkpoint_resumes_training_and_answers_409() -> None:
    w = kill_job()
    w.hold = {ins.WriteCheckpoint}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (ckpt,) = w.held.values()
    w.hold = set()
    n = len(w.log)
    w.fail(ckpt, "disk full")
    assert w.steps_since(n) == ["ResumeTraining"]
    reply = w.of(ins.Reply)[-1]
    assert reply.status == 409 and "checkpoint: disk full" in reply.message      # type: ignore[union-attr]
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING and w.triggers()[-2:] == ["RESTART", "CHANGE_DONE"]
    assert not w.of(ins.RetireExecutors)


def test_training_that_ends_before_the_boundary_cancels_the_restart_then_finishes() -> None:
    w = kill_job()
    w.hold = {ins.PauseTraining}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (pause,) = w.held.values()
    w.send(ev.TrainingEnded(at=w.at(), criterion="converged"))
    assert w.job.phase is Phase.RESTARTING               # the restart holds the slot: the end waits
    w.hold = set()
    w.fail(pause, "the job finished training before the reshape could start")
    assert len(w.of(ins.ResumeTraining)) == 1 and w.of(ins.Reply)[-1].status == 409    # the start's only  # type: ignore[union-attr]
    assert w.triggers()[-4:] == ["RESTART", "CHANGE_DONE", "TRAINED", "FINISHED"] and w.job.phase is Phase.SUCCEEDED


def test_new_executors_that_do_not_come_put_the_job_back_as_it_was() -> None:
    w = kill_job()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=2, servers=1))
    servers, workers = w.held_of(ins.StartExecutors)
    w.answer(servers)                                     # the new servers came ...
    n = len(w.log)
    w.hold = set()
    w.fail(workers, "no room on the cluster")             # ... the workers did not
    assert w.steps_since(n) == ["RetireExecutors", "StartExecutors", "StartExecutors", "RestoreCheckpoint",
                                 "ResumeTraining"]
    retire = w.of(ins.RetireExecutors)[-1]
    assert retire.executors == ["server-2", "server-3"] and not retire.released
    back = w.of(ins.StartExecutors)[-2:]
    assert [(s.role, s.count, s.nodes, s.per_node) for s in back] == [   # type: ignore[union-attr]
        (Role.SERVER, 1, [], {}), (Role.WORKER, 2, [], {})]
    cut = w.job.checkpoints[-1][1]
    assert w.of(ins.RestoreCheckpoint)[-1].directory == cut and cut.startswith("ckpt/")
    reply = w.of(ins.Reply)[-1]
    assert reply.status == 409 and "restart failed at start: no room on the cluster" in reply.message
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING and w.triggers()[-2:] == ["RESTART", "CHANGE_DONE"]


def test_a_start_below_the_minimum_goes_back_once_both_roles_starts_have_ended() -> None:
    w = kill_job()                                        # 2 workers, 1 server; minimum 1 of each
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    servers, workers = w.held_of(ins.StartExecutors)
    w.fail(servers, "0 of 1 new servers started within 120 s")
    assert not w.of(ins.CancelSteps) and w.job.phase is Phase.RESTARTING    # the workers' start goes on
    w.hold = set()
    w.answer(workers)                                     # three workers, no server: below the minimum
    assert w.of(ins.RetireExecutors)[-1].executors == ["worker-3", "worker-4", "worker-5"]
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING
    assert w.of(ins.Reply)[-1].status == 409


def three_of_four_workers_came(w: World, change: ev.Event) -> None:
    """`change` restarts the job to 4 workers; its servers start, and of its workers only 3 within
    the launch timeout (worker-7, -8, -9)."""
    w.hold = {ins.StartExecutors}
    w.send(change)
    servers, workers = w.held_of(ins.StartExecutors)
    w.answer(servers)
    came = [ExecutorInfo(executor_id=f"worker-{i}", role=Role.WORKER, container_id=f"c-worker-{i}", node="n1")
            for i in (7, 8, 9)]
    w.hold = set()
    w.fail(workers, "3 of 4 new workers started within 120 s", executors=came)


def test_a_short_start_at_or_above_the_minimum_trains_at_what_started() -> None:
    # A busy cluster gave 3 of the 4 workers asked for within the launch timeout: the restart goes
    # on with them (restored, training) instead of retiring them to go back, and says so.
    w = kill_job()
    three_of_four_workers_came(w, ev.ScaleRequested(at=w.at(), request=1, workers=2, servers=0))
    assert w.job.phase is Phase.TRAINING and w.job.change is None and w.job.shape == (3, 1)
    assert w.of(ins.RestoreCheckpoint)[-1].workers == ["worker-7", "worker-8", "worker-9"]
    assert w.of(ins.Reply)[-1].status == 200 and not w.of(ins.RetireExecutors)[-1].executors[0].startswith("worker-7")
    assert w.triggers()[-2:] == ["RESTART", "CHANGE_DONE"]


def test_a_directive_the_rm_sends_again_after_a_short_start_is_carried_out() -> None:
    # Version 1 asked for 4 workers and the restart got 3 (at or above the minimum: it trains at
    # 3). The RM sends the same shape again as version 2 (rm/directive_retry.py): the job restarts
    # again and, with room now, reaches 4.
    w = kill_job()
    three_of_four_workers_came(w, ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=4, servers=1,
                                                                                        version=1)))
    assert w.job.shape == (3, 1) and w.job.phase is Phase.TRAINING and w.job.applied_directive == 1
    n = len(w.log)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=4, servers=1, version=1)))
    assert w.steps_since(n) == []                         # a repeat of the version acted on: nothing
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=4, servers=1, version=2)))
    assert w.steps_since(n) == SEQUENCE
    assert w.job.shape == (4, 1) and w.job.phase is Phase.TRAINING and w.job.applied_directive == 2


def test_a_restore_that_fails_fails_the_job() -> None:
    w = kill_job()
    w.hold = {ins.RestoreCheckpoint}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (restore,) = w.held.values()
    w.fail(restore, "checkpoint unreadable")
    assert w.job.phase is Phase.FAILED and "restore: checkpoint unreadable" in w.job.diagnostics
    assert w.of(ins.Finish)[-1].final_status == "FAILED" and w.of(ins.Reply)[-1].status == 409


def test_a_failed_retire_fails_the_job() -> None:
    w = kill_job()
    w.hold = {ins.RetireExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (retire,) = w.held.values()
    w.fail(retire, "NM unreachable")
    assert w.job.phase is Phase.FAILED and w.of(ins.Finish)[-1].final_status == "FAILED"


def going_back() -> World:
    """A kill job whose restart to 3 workers got nothing: both starts failed, its way back's two
    starts (1 server, 2 workers) held for the test to answer."""
    w = kill_job()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    for step in w.held_of(ins.StartExecutors):
        w.fail(step, "no room")
    return w


def test_a_rollback_that_fails_too_fails_the_job() -> None:
    w = going_back()
    back = w.held_of(ins.StartExecutors)
    assert len(back) == 2 and w.job.change is not None and w.job.change.rolling_back
    w.fail(back[0], "still no room")                      # no server on the way back either
    w.answer(back[1])
    assert w.job.phase is Phase.FAILED
    assert "and so did going back (start: still no room)" in w.job.diagnostics


def test_going_back_short_but_at_the_minimum_keeps_the_job_training() -> None:
    w = going_back()
    servers, workers = w.held_of(ins.StartExecutors)      # the way back: 1 server, 2 workers
    w.answer(servers)
    one = ExecutorInfo(executor_id="worker-9", role=Role.WORKER, container_id="c-worker-9", node="n2")
    w.hold = set()
    w.fail(workers, "1 of 2 new workers started within 120 s", executors=[one])
    assert w.job.phase is Phase.TRAINING and w.job.shape == (1, 1)
    assert w.of(ins.Reply)[-1].status == 409              # the restart itself failed


def test_a_loss_before_the_retire_aborts_the_restart_and_the_recovery_follows() -> None:
    w = kill_job()
    w.hold = {ins.WriteCheckpoint}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (ckpt,) = w.held.values()
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 137")]))
    assert w.log[-1] == ins.CancelSteps(steps=[ckpt.step])
    w.hold = set()
    n = len(w.log)
    w.fail(ckpt, "cancelled", cancelled=True)
    # No ResumeTraining: the recovery stops training itself and goes back to the last checkpoint.
    assert w.steps_since(n)[0] == "PauseTraining"       # the recovery's
    assert w.triggers()[-4:] == ["RESTART", "CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
    assert w.of(ins.RestoreCheckpoint)[-1].directory == "ckpt/epoch-0"
    assert w.job.shape == (2, 1) and w.job.failures == 1 and w.job.phase is Phase.TRAINING
    reply = w.of(ins.Reply)[-1]
    assert reply.status == 409 and "executor lost" in reply.message


def test_a_loss_among_the_new_executors_is_recovered_by_the_rollback() -> None:
    w = kill_job()
    w.hold = {ins.RestoreCheckpoint}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=1))
    (restore,) = w.held.values()
    cut = restore.directory           # type: ignore[union-attr]
    w.send(ev.ExecutorLost(at=w.at(), executor_id="server-2", description="server-2 exited 137"))
    assert w.log[-1] == ins.CancelSteps(steps=[restore.step])
    w.hold = set()
    n = len(w.log)
    w.fail(restore, "cancelled", cancelled=True)
    assert w.steps_since(n) == ["RetireExecutors", "StartExecutors", "StartExecutors", "RestoreCheckpoint",
                                 "ResumeTraining"]
    assert sorted(w.of(ins.RetireExecutors)[-1].executors) == ["server-3", "worker-3", "worker-4", "worker-5"]
    assert w.of(ins.RestoreCheckpoint)[-1].directory == cut
    assert "RECOVER" not in w.triggers() and not w.job.pending_losses and w.job.failures == 1
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING


def test_a_loss_once_restored_leaves_the_new_shape_to_the_recovery() -> None:
    w = kill_job()
    w.hold = {ins.ResumeTraining}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=0, servers=1))
    (resume,) = w.held.values()
    w.send(ev.ExecutorLost(at=w.at(), executor_id="server-2", description="server-2 exited 137"))
    w.hold = set()
    w.fail(resume, "cancelled", cancelled=True)
    assert w.triggers()[-3:] == ["CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING


def test_a_user_code_error_during_a_restart_fails_the_job() -> None:
    w = kill_job()
    w.hold = {ins.RestoreCheckpoint}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (restore,) = w.held.values()
    w.send(ev.UserCodeError(at=w.at(), message="user app raised ValueError"))
    assert w.log[-2] == ins.CancelSteps(steps=[restore.step])
    assert w.job.phase is Phase.FAILED and w.job.change is None


def test_an_eps_job_never_restarts() -> None:
    w = World(job_state())
    w.start()
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert "RESTART" not in w.triggers() and not w.of(ins.PauseTraining)
    assert ChangeKind.RESTART.value == "restart"


def lost_after_the_pause(w: World, held: type, container: str) -> int:
    """A kill-mode scale of `w` is held at `held` (its pause, or the checkpoint after it) when
    `container`'s executor is lost; the held step then answers cancelled. Where the log was then."""
    w.hold = {held}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (step,) = w.held.values()
    w.send(ev.ContainersCompleted(at=w.at(), containers=[(container, "exited 137")]))
    w.hold = set()
    n = len(w.log)
    w.fail(step, "cancelled", cancelled=True)
    return n


def test_a_worker_lost_after_the_pause_is_replaced_and_training_resumes() -> None:
    """A kill-mode scale paused training and is writing its checkpoint when a worker dies: the
    restart is aborted and the worker replaced in place -- then training must be resumed (the
    pause stopped it), or the AM sat in TRAINING with nothing training for ever."""
    for held in (ins.PauseTraining, ins.WriteCheckpoint):
        w = kill_job()
        n = lost_after_the_pause(w, held, "c-worker-1")
        assert w.steps_since(n) == ["StartExecutors", "JoinExecutors", "TakeOverSplits", "ResumeTraining"], held
        assert w.job.phase is Phase.TRAINING and w.job.change is None and not w.job.training_stopped


def test_a_server_rebuilt_after_the_pause_resumes_training() -> None:
    """The same with a lost server rebuilt from the workers' push logs (push_log): resumed too."""
    w = kill_job(push_log=True)
    n = lost_after_the_pause(w, ins.WriteCheckpoint, "c-server-1")
    assert w.steps_since(n)[-2:] == ["RebuildServers", "ResumeTraining"]
    assert w.job.phase is Phase.TRAINING and w.job.change is None
