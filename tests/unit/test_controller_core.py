"""The PS-job controller stepped by events (tests/support/controller_world.py): its lifecycle,
EPS's parts, the rule table for overlapping changes, and its bookkeeping. No processes, no sleeps."""
from __future__ import annotations

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.planners.eps import adds_first, split_counts
from appmaster.ps.controller.records import Role
from appmaster.ps.controller.rules import RULES, Arrival, rule
from appmaster.ps.controller.state import ChangeKind
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import Resource
from rm.directive_retry import short_of
from tests.support.controller_world import World, job_state


def started(**spec: object) -> World:
    w = World(job_state(**spec))
    w.start()
    assert w.job.phase is Phase.TRAINING
    return w


def triggers(w: World) -> list[str]:
    return [t for _, t, _ in w.job.history]


def test_start_launches_servers_then_workers_then_sets_up_and_checkpoints() -> None:
    w = started()
    assert w.kinds()[:7] == ["StartExecutors", "ReportProgress", "StartExecutors", "SetupTraining",
                             "WriteCheckpoint", "ResumeTraining", "ReportProgress"]
    first, second = w.of(ins.StartExecutors)
    assert (first.role, first.count, second.role, second.count) == (Role.SERVER, 1, Role.WORKER, 2)
    assert triggers(w) == ["REGISTERED", "SERVERS_READY", "WORKERS_READY", "INITIALISED"]
    assert w.job.checkpoints == [(0, "ckpt/epoch-0")]
    assert w.job.shape == (2, 1)


def test_no_initial_checkpoint_without_recovery() -> None:
    w = started(max_executor_failures=0)
    assert not w.of(ins.WriteCheckpoint)


def test_new_attempt_restores_the_earlier_checkpoint() -> None:
    w = World(job_state())
    w.start(resume_from="ckpt/epoch-3")
    restore = w.of(ins.RestoreCheckpoint)
    assert [r.directory for r in restore] == ["ckpt/epoch-3"]
    assert "WORKERS_READY_RESUME" in triggers(w) and w.job.phase is Phase.TRAINING



def test_a_resumed_checkpoint_is_the_new_attempts_recovery_point_not_an_initial_one() -> None:
    """Resumed from an earlier attempt's mid-epoch cut: that checkpoint is what a later loss goes
    back to. An "initial" checkpoint written at the start took the mid-epoch model for the start
    of its epoch (clock 0, no positions): restoring it trained the epoch's clocks again."""
    w = World(job_state())
    w.hold = {ins.RestoreCheckpoint}
    w.start(resume_from="/durable/epoch-4-clock-37")
    (restore,) = w.held_of(ins.RestoreCheckpoint)
    w.send(ev.StepDone(at=w.at(), step=restore.step, holdings=w.round_robin(),
                       directory="/local/epoch-4-clock-37", epochs_done=4, checkpoint_epoch=4))
    assert w.job.phase is Phase.TRAINING
    assert not w.of(ins.WriteCheckpoint)
    assert w.job.checkpoints == [(4, "/local/epoch-4-clock-37")] and w.job.epoch == 4

def test_policy_that_places_new_jobs_is_waited_for() -> None:
    w = World(job_state())
    w.start(policy_places_new_jobs=True)
    assert w.job.phase is Phase.STARTING and not w.of(ins.StartExecutors)
    d = ShapeDirective(workers=2, servers=2, version=1,
                       placement=[NodePlacement(node="n2", workers=1, servers=1),
                                  NodePlacement(node="n3", workers=1, servers=1)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    servers = w.of(ins.StartExecutors)[0]
    assert servers.per_node == {"n2": 1, "n3": 1}
    assert w.job.phase is Phase.TRAINING and w.job.applied_directive == 1


def test_first_directive_that_arrives_before_the_registration_starts_the_job() -> None:
    """The AM's heartbeat runs while it reads its checkpoint, so the policy's first directive can
    come before Registered; the RM does not send that version again (CI hung on this)."""
    w = World(job_state())
    d = ShapeDirective(workers=1, servers=1, version=1, placement=[NodePlacement(node="n2", workers=1, servers=1)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    assert w.job.phase is Phase.STARTING and not w.of(ins.StartExecutors)
    w.start(policy_places_new_jobs=True)
    assert w.of(ins.StartExecutors)[0].per_node == {"n2": 1}
    assert w.job.phase is Phase.TRAINING and w.job.applied_directive == 1 and w.job.kept_directive is None


def test_pause_directive_before_the_registration_keeps_the_job_waiting() -> None:
    w = World(job_state())
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=1, servers=1, version=1,
                                                                   run_state=RunState.PAUSE)))
    w.start(policy_places_new_jobs=True)
    assert w.job.phase is Phase.STARTING and not w.of(ins.StartExecutors)
    d = ShapeDirective(workers=1, servers=1, version=2, placement=[NodePlacement(node="n3", workers=1, servers=1)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    assert w.of(ins.StartExecutors)[0].per_node == {"n3": 1} and w.job.phase is Phase.TRAINING


def test_failed_start_fails_the_job() -> None:
    w = World(job_state(), hold={ins.StartExecutors})
    w.start()
    (step,) = w.held.values()
    w.fail(step, "the new servers did not start")
    assert w.job.phase is Phase.FAILED
    assert w.of(ins.Finish)[-1].final_status == "FAILED"


def test_eps_scale_up_adds_then_balances_blocks_and_splits() -> None:
    w = started()
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=1))
    assert w.job.shape == (3, 2)
    moves = w.of(ins.MoveModelBlocks)[-1].moves
    assert {m.dst for m in moves} == {"server-2"} and len(moves) == 2
    assert sorted(len(v) for v in w.job.holdings.blocks.values()) == [2, 2]
    assert sorted(len(v) for v in w.job.holdings.splits.values()) == [5, 5, 6]
    commit = w.of(ins.CommitSplits)[-1]
    assert commit.keep_inactive and commit.joining == ["worker-3"]
    assert w.of(ins.Reply)[-1].status == 200
    assert triggers(w)[-2:] == ["RESHAPE", "CHANGE_DONE"]


def test_eps_scale_down_drains_waits_for_a_boundary_and_retires() -> None:
    w = started(workers=3, servers=2)
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=-1, servers=-1))
    kinds = w.kinds()
    server_retire = kinds.index("RetireExecutors")
    assert kinds.index("MoveModelBlocks") < kinds.index("WaitClockBoundary") < server_retire
    assert w.job.shape == (2, 1)
    assert sum(len(v) for v in w.job.holdings.splits.values()) == 24
    assert list(w.job.holdings.blocks) == ["server-1"]


def test_invalid_scale_is_400_and_changes_nothing() -> None:
    w = started()
    before = len(w.log)
    w.send(ev.ScaleRequested(at=w.at(), request=7, workers=-2, servers=0))
    (reply,) = w.log[before:]
    assert isinstance(reply, ins.Reply) and reply.status == 400 and "at least 1 worker" in reply.message
    w.send(ev.ScaleRequested(at=w.at(), request=8, workers=0, servers=0))
    assert w.log[-1].status == 400 and "nothing to change" in w.log[-1].message   # type: ignore[union-attr]
    assert w.job.shape == (2, 1) and w.job.change is None


def test_scale_during_a_change_is_refused_and_a_directive_kept() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.job.phase is Phase.RESHAPING
    w.send(ev.ScaleRequested(at=w.at(), request=2, workers=1, servers=0))
    assert w.log[-1] == ins.Reply(request=2, status=409, message="another change is running (eps)")
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=4, servers=1, version=1)))
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=5, servers=1, version=2)))
    assert w.job.kept_directive is not None and w.job.kept_directive.version == 2
    w.hold = set()
    (step,) = w.held.values()
    w.answer(step)
    assert w.job.shape == (5, 1) and w.job.applied_directive == 2     # the newest, after the change


def test_directive_for_the_shape_the_job_has_changes_nothing() -> None:
    w = started()
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=2, servers=1, version=1)))
    assert w.job.phase is Phase.TRAINING and w.job.applied_directive == 1
    assert w.log[-1] == ins.ReportProgress(changing=False, directive_version=1)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=9, servers=1, version=1)))
    assert w.job.shape == (2, 1)        # a repeated version is ignored


def test_placement_directive_adds_first_then_removes() -> None:
    w = started()
    d = ShapeDirective(workers=2, servers=1, version=1,
                       placement=[NodePlacement(node="n3", workers=2, servers=1)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    kinds = w.kinds()
    assert kinds.index("StartExecutors", 4) < kinds.index("RetireExecutors")
    assert {w.job.node_of(e) for e in w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER)} == {"n3"}


def test_a_placement_move_at_the_maximum_removes_first_so_the_job_never_trains_above_it() -> None:
    """At max_workers a move adds after it removes: its additions may wait on containers for the
    launch timeout, and what started meanwhile would train beside the leaving workers (the
    simulator held a DRF-moved job 5 above its maximum of 12 for two minutes)."""
    w = started(max_workers=2)
    assert {w.job.node_of(e) for e in w.job.ids(Role.WORKER)} == {"n1", "n2"}
    w.hold = {ins.StartExecutors}
    d = ShapeDirective(workers=2, servers=1, version=1, placement=[NodePlacement(node="n1", workers=1, servers=1),
                                                                   NodePlacement(node="n3", workers=1, servers=0)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    (start,) = w.held_of(ins.StartExecutors)
    assert start.role is Role.WORKER and start.per_node == {"n3": 1}
    assert w.of(ins.RetireExecutors)[-1].executors == ["worker-2"]     # the one on n2, gone first
    assert w.job.shape == (1, 1)
    w.hold = set()
    w.answer(start)
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING
    assert sorted(w.job.node_of(e) for e in w.job.ids(Role.WORKER)) == ["n1", "n3"]


def test_a_move_of_every_worker_at_the_maximum_sends_one_newcomer_first() -> None:
    w = started(max_workers=2)
    w.hold = {ins.StartExecutors}
    d = ShapeDirective(workers=2, servers=1, version=1, placement=[NodePlacement(node="n1", workers=0, servers=1),
                                                                   NodePlacement(node="n3", workers=2, servers=0)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    (first,) = w.held_of(ins.StartExecutors)
    assert first.per_node == {"n3": 1} and not w.of(ins.RetireExecutors)    # the role is never empty
    w.answer(first)
    assert w.job.shape == (1, 1) and w.of(ins.RetireExecutors)[-1].executors == ["worker-1", "worker-2"]
    (second,) = w.held_of(ins.StartExecutors)
    assert second.per_node == {"n3": 1}
    w.hold = set()
    w.answer(second)
    assert w.job.shape == (2, 1) and {w.job.node_of(e) for e in w.job.ids(Role.WORKER)} == {"n3"}


def test_adds_first_fits_under_the_maximum_and_split_counts_keeps_every_node() -> None:
    assert adds_first(5, 5, 12, 12) == 0          # at the maximum: remove first
    assert adds_first(5, 5, 10, 12) == 2          # two fit beside the ten
    assert adds_first(3, 3, 3, 3) == 1            # every executor leaves: one newcomer first
    assert adds_first(2, 1, 2, 16) == 2           # room for all of them: add first, as before
    assert split_counts({"a": 2, "b": 3}, 3) == ({"a": 2, "b": 1}, {"b": 2})
    assert split_counts({"a": 2}, 0) == ({}, {"a": 2})


def test_failed_addition_retires_the_idle_newcomers() -> None:
    w = started()
    w.hold = {ins.MoveModelBlocks}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=0, servers=1))
    (move,) = w.held.values()
    w.fail(move, "store refused")
    retire = w.of(ins.RetireExecutors)[-1]
    assert retire.executors == ["server-2"] and not retire.released
    assert w.log[-2].status == 409 and "store refused" in w.log[-2].message    # type: ignore[union-attr]
    assert w.job.phase is Phase.TRAINING


def test_loss_during_a_change_aborts_it_then_recovers() -> None:
    w = started()
    w.hold = {ins.StageSplits}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (stage,) = w.held.values()
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 137")]))
    assert w.log[-1] == ins.CancelSteps(steps=[stage.step])
    w.hold = set()
    w.fail(stage, "cancelled", cancelled=True)
    assert triggers(w)[-3:] == ["CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
    assert w.of(ins.RestoreCheckpoint)[-1].directory == "ckpt/epoch-0"
    assert w.job.shape == (2, 1) and w.job.failures == 1


def test_loss_beyond_max_executor_failures_fails_the_job() -> None:
    w = started(max_executor_failures=1)
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-1", "exited 1")]))
    assert w.job.phase is Phase.TRAINING
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-2", "exited 1")]))
    assert w.job.phase is Phase.FAILED and "gave up after 2 executor failures" in w.job.diagnostics


def test_retired_executor_exit_is_no_loss() -> None:
    w = started(workers=3)
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=-1, servers=0))
    retired = w.of(ins.RetireExecutors)[-1].executors
    w.send(ev.ContainersCompleted(at=w.at(), containers=[(f"c-{retired[0]}", "exited 143")]))
    assert w.job.failures == 0 and w.job.phase is Phase.TRAINING


def test_user_code_error_fails_the_job_at_once() -> None:
    w = started()
    w.send(ev.UserCodeError(at=w.at(), message="user app mymod.App.compute raised ValueError"))
    assert w.job.phase is Phase.FAILED and w.log[-1] == ins.Finish(
        final_status="FAILED", diagnostics="user app mymod.App.compute raised ValueError")


def test_checkpoint_requests_are_served_at_the_next_epoch_end() -> None:
    w = started(checkpoint_every_epochs=2)
    w.send(ev.CheckpointRequested(at=w.at(), request=3))
    assert not any(isinstance(i, ins.Reply) for i in w.log)
    w.send(ev.EpochDone(at=w.at(), epoch=0, objective=0.5, epoch_time_s=1.0))
    assert w.log[-2] == ins.Reply(request=3, status=200, directory="ckpt/epoch-1")
    w.send(ev.EpochDone(at=w.at(), epoch=1, objective=0.4, epoch_time_s=1.0))
    assert w.job.checkpoints[-1] == (2, "ckpt/epoch-2")          # due every 2 epochs


def test_end_of_training_checkpoints_scores_and_succeeds() -> None:
    w = started()
    w.send(ev.EpochDone(at=w.at(), epoch=0, objective=0.5, epoch_time_s=1.0))
    w.send(ev.TrainingEnded(at=w.at(), criterion="epoch limit"))
    assert w.kinds()[-4:] == ["WriteCheckpoint", "ScoreModel", "ReportProgress", "Finish"] or \
        w.kinds()[-3:] == ["ScoreModel", "ReportProgress", "Finish"] or w.kinds()[-2:] == ["ScoreModel", "Finish"]
    assert w.job.phase is Phase.SUCCEEDED
    assert w.of(ins.Finish)[-1].final_status == "SUCCEEDED"


def test_stop_cancels_running_steps_and_kills() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    w.send(ev.StopRequested(at=w.at(), reason="stopped by SIGTERM"))
    assert isinstance(w.log[-2], ins.CancelSteps) and w.log[-1] == ins.Finish(final_status=None,
                                                                             diagnostics="stopped by SIGTERM")
    assert w.job.phase is Phase.KILLED


def test_rule_table_covers_every_change_and_arrival() -> None:
    kinds = [None] + [k for k in ChangeKind if k not in (ChangeKind.RESUME,)]
    for k in kinds:
        for a in Arrival:
            if k in (ChangeKind.RESTART, ChangeKind.MIGRATE) or (k, a) in RULES:
                assert rule(k, a) is not None
    assert rule(ChangeKind.RECOVER, Arrival.LOSS).value == "MERGE"
    assert rule(None, Arrival.USER_ERROR).value == "FAIL"


def test_ssp_jobs_refuse_live_changes() -> None:
    w = started(sync="ssp")
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.log[-1].status == 400 and "BSP" in w.log[-1].message    # type: ignore[union-attr]


def test_pause_directive_is_kept_while_starting() -> None:
    w = World(job_state())
    w.start(policy_places_new_jobs=True)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=1, servers=1, version=1,
                                                                   run_state=RunState.PAUSE)))
    assert w.job.phase is Phase.STARTING and w.job.kept_directive is not None


def test_a_placement_whose_worker_addition_fails_gives_back_its_new_server() -> None:
    """Additions run before removals in a placement: when one role's addition fails, the surplus
    removals do not run and the other role's newcomers are drained away again -- the job ends
    with its old shape, never above it."""
    w = started()
    d = ShapeDirective(workers=2, servers=1, version=1,
                       placement=[NodePlacement(node="n3", workers=2, servers=1)])
    w.hold = {ins.StartExecutors}
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    starts = {s.role: s for s in w.held.values() if isinstance(s, ins.StartExecutors)}
    w.hold = set()
    w.answer(starts[Role.SERVER])                       # the new server starts and takes blocks
    assert w.job.shape == (2, 2) and w.job.holdings.blocks.get("server-2")
    w.fail(starts[Role.WORKER], "no containers on n3 within the launch timeout")
    give_back = w.of(ins.MoveModelBlocks)[-1]
    assert give_back.drop == ["server-2"] and {m.dst for m in give_back.moves} == {"server-1"}
    assert w.of(ins.RetireExecutors)[-1].executors == ["server-2"]
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING
    assert sorted(w.job.holdings.blocks["server-1"]) == list(range(w.job.spec.num_blocks))
    assert w.job.diagnostics.startswith("add_workers(2) failed: no containers on n3")


def test_a_due_checkpoint_a_change_held_up_is_taken_at_the_next_epoch_end() -> None:
    """checkpoint_every_epochs 2, and an EPS add moving blocks across epoch 2's end: the checkpoint
    due there is taken at the next epoch end -- it was skipped until epoch 4, so a job reshaping
    often could go without checkpoints and its recoveries redid more epochs."""
    from tests.support.controller_world import started  # noqa: PLC0415

    w = started(checkpoint_every_epochs=2, max_servers=4)
    w.hold = {ins.MoveModelBlocks}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=0, servers=1))
    (move,) = w.held.values()
    for epoch in (0, 1):                 # epoch 2 is due while the blocks move
        w.send(ev.EpochDone(at=w.at(), epoch=epoch, objective=1.0, epoch_time_s=1.0))
    assert [e for e, _ in w.job.checkpoints] == [0] and w.job.checkpoint_owed
    w.hold = set()
    w.answer(move)
    w.send(ev.EpochDone(at=w.at(), epoch=2, objective=1.0, epoch_time_s=1.0))
    assert [e for e, _ in w.job.checkpoints] == [0, 3] and not w.job.checkpoint_owed
    w.send(ev.EpochDone(at=w.at(), epoch=3, objective=1.0, epoch_time_s=1.0))
    assert [e for e, _ in w.job.checkpoints] == [0, 3, 4]          # and the count goes on as before


def test_a_scale_of_the_jobs_own_supersedes_its_directive_so_the_rm_does_not_resend_it() -> None:
    """A directive (3 workers) reached, then the user scales the job down through its AM: the
    report names the directive superseded. Without it the RM took 2 workers for a job short of
    its directive and sent it again a minute later, undoing the user's change
    (rm/directive_retry.py; seen in tests/cluster/test_eps_cluster.py on a slow machine)."""
    w = started()
    d = ShapeDirective(workers=3, servers=1, version=1)
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    assert w.job.shape == (3, 1) and w.job.refused_directive == ""
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=-1, servers=0))
    assert w.job.shape == (2, 1) and w.job.change is None
    assert "superseded by the job's own /scale to 2 workers, 1 servers" in w.job.refused_directive
    rep = JobReport(workers=2, servers=1, started=True, executor_resource=Resource(512, 1),
                    directive_version=w.job.applied_directive, directive_refused=w.job.refused_directive)
    assert not short_of(d, rep)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=4, servers=1, version=2)))
    assert w.job.shape == (4, 1) and w.job.refused_directive == ""     # a new directive takes over
