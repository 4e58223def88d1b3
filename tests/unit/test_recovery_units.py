"""Recovery's bookkeeping in the PS-job controller (planners/recovery.py), stepped by events
without a cluster: which losses a job survives, how losses that arrive together count, when it
gives up and with what diagnostics, which losses a replacement handles and which go back to the
checkpoint, and that a recovery waits for a change a loss makes fail. No processes."""
from __future__ import annotations

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.records import Role
from appmaster.ps.controller.state import ChangeKind
from tests.support.controller_world import World, job_state, started


def lose(w: World, *losses: tuple[str, str]) -> list[ins.Instruction]:
    """The RM reports these executors' containers ended, in one allocate reply."""
    return w.send(ev.ContainersCompleted(at=w.at(), containers=[(f"c-{e}", text) for e, text in losses]))


def finished(w: World) -> list[ins.Finish]:
    return [i for i in w.log if isinstance(i, ins.Finish)]


def test_losses_within_the_limit_are_recovered_and_one_event_counts_once() -> None:
    w = started(max_executor_failures=2, workers=2, servers=2)
    lose(w, ("server-1", "server-1 (server, c2 on n1) exited with -100 (ABORTED)"),
         ("worker-1", "worker-1 (worker, c5 on n1) exited with -100 (ABORTED)"))    # same node, same event
    assert w.job.failures == 1 and w.job.phase is Phase.TRAINING and w.job.shape == (2, 2)
    assert w.triggers().count("RECOVER") == 1
    lose(w, (w.job.ids(Role.WORKER)[0], "worker-0 (worker, c9 on n2) exited with 137"))
    assert w.job.failures == 2 and w.job.phase is Phase.TRAINING
    lose(w, (w.job.ids(Role.SERVER)[0], "server-3 (server, c11 on n3) exited with 1"))
    (fin,) = finished(w)
    assert fin.final_status == "FAILED" and w.job.phase is Phase.FAILED
    assert "gave up after 3 executor failures (max_executor_failures 2)" in fin.diagnostics
    assert fin.diagnostics.endswith("server-3 (server, c11 on n3) exited with 1") and w.job.failures == 2


def test_jobs_that_cannot_recover_fail_at_the_first_loss_with_its_description() -> None:
    text = "worker-1 (worker, c5 on n1) exited with -104 (KILLED_EXCEEDED_PMEM)"
    no_budget = started(max_executor_failures=0)
    starting = World(job_state())                     # lost while the job starts: its set-up fails
    starting.hold = {ins.SetupTraining}
    starting.start()
    no_checkpoint = World(job_state())                # lost before the first checkpoint is written
    no_checkpoint.hold = {ins.WriteCheckpoint}
    no_checkpoint.start()
    for w in (no_budget, starting, no_checkpoint):
        lose(w, ("worker-1", text))
        (fin,) = finished(w)
        assert (fin.final_status, fin.diagnostics) == ("FAILED", text), w.job.phase
        assert w.job.phase is Phase.FAILED and w.job.failures == 0 and not w.job.pending_losses


def test_apps_with_worker_state_go_back_to_the_checkpoint_even_for_a_lost_worker() -> None:
    """NMF's user factors and LDA's assignments of a lost worker exist only in the checkpoint."""
    w = started()
    w.job.keeps_worker_state = True
    lose(w, ("worker-1", "worker-1 (worker, c5 on n1) exited with 137"))
    assert not w.of(ins.TakeOverSplits) and w.of(ins.PauseTraining) and w.of(ins.RestoreCheckpoint)
    assert w.job.failures == 1 and w.job.phase is Phase.TRAINING and w.job.shape == (2, 1)


def test_lost_workers_alone_are_replaced_anything_else_goes_back_to_the_checkpoint() -> None:
    alone = started()
    lose(alone, ("worker-1", "worker-1 (worker, c5 on n1) exited with -100 (ABORTED)"))
    assert alone.of(ins.TakeOverSplits) and not alone.of(ins.RestoreCheckpoint)
    # A worker and a server in one event: one recovery, and with a server in it, the checkpoint.
    both = started()
    both.hold = {ins.StartExecutors}
    lose(both, ("worker-1", "worker-1 (worker, c5 on n1) exited with -100 (ABORTED)"))
    lose(both, ("server-1", "server-1 (server, c2 on n1) exited with -100 (ABORTED)"))
    assert both.job.failures == 1 and both.job.change is not None and both.job.change.kind is ChangeKind.RECOVER
    both.hold = set()
    for s in list(both.held.values()):           # the replacement's start was cancelled by the merge
        both.fail(s, "cancelled", cancelled=True)
    assert not both.of(ins.TakeOverSplits) and both.of(ins.RestoreCheckpoint)
    assert both.job.shape == (2, 1) and both.job.phase is Phase.TRAINING
    # A clock is redone only under BSP: an SSP job goes back to the checkpoint.
    ssp = started(sync="ssp")
    lose(ssp, ("worker-1", "worker-1 (worker, c5 on n1) exited with 137"))
    assert not ssp.of(ins.TakeOverSplits) and ssp.of(ins.RestoreCheckpoint)
    # A container the job does not know of is no loss of it.
    unknown = started()
    lose(unknown, ("worker-9", "worker-9 (worker, c99 on n1) exited with 137"))
    assert unknown.job.failures == 0 and unknown.job.change is None


def test_a_lost_worker_that_held_no_splits_counts_but_leaves_nothing_to_replace() -> None:
    w = started(max_workers=4)
    w.hold = {ins.StageSplits}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))   # an EPS addition, not committed
    new = w.held_of(ins.StageSplits)[0].moves[0].dst
    assert new not in w.job.holdings.splits or not w.job.holdings.splits[new]
    lose(w, (new, f"{new} (worker, c7 on n2) exited with 137"))
    assert w.job.failures == 1 and not w.job.pending_losses
    assert w.job.change is not None and w.job.change.kind is ChangeKind.EPS     # no recovery: the change fails alone
    (stage,) = w.held.values()
    w.hold = set()
    w.fail(stage, f"{new} is gone")
    assert "RECOVER" not in w.triggers() and w.job.phase is Phase.TRAINING
    assert w.of(ins.Reply)[-1].status == 409 and w.job.shape == (2, 1)


def test_a_recovery_waits_for_the_running_change_to_end() -> None:
    """A change that a loss makes fail ends (rolled back by its own steps) before anything is
    replaced: the recovery takes the change slot after it, never beside it."""
    w = started(max_workers=4)
    w.hold = {ins.StageSplits}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    (stage,) = w.held.values()
    out = lose(w, ("worker-1", "worker-1 (worker, c5 on n1) exited with 137"))
    assert ins.CancelSteps(steps=[stage.step]) in out
    assert w.job.change is not None and w.job.change.kind is ChangeKind.EPS and w.job.pending_losses
    assert "RECOVER" not in w.triggers()
    w.send(ev.ScaleRequested(at=w.at(), request=2, workers=1, servers=0))   # a second change may not start
    assert w.log[-1] == ins.Reply(request=2, status=409, message="another change is running (eps)")
    w.hold = set()
    w.fail(stage, "cancelled", cancelled=True)
    t = w.triggers()
    assert t[-4:] == ["RESHAPE", "CHANGE_DONE", "RECOVER", "CHANGE_DONE"], t
    assert w.job.phase is Phase.TRAINING and w.job.shape == (2, 1) and not w.job.pending_losses


def test_an_executor_that_never_served_ending_is_no_loss() -> None:
    """An added server's start times out: the AM stops the one container it got (that executor
    never announced itself) and its step fails. That container's end is the start's failure, not
    an executor lost -- counted as one, it failed the job at max_executor_failures 0, or sent it
    back to its checkpoint with the phantom server in the shape it restored."""
    from appmaster.ps.controller.records import ExecutorInfo, Role  # noqa: PLC0415

    for budget in (0, 3):
        w = started(max_executor_failures=budget, max_servers=4)
        w.hold = {ins.StartExecutors}
        w.send(ev.ScaleRequested(at=w.at(), request=1, workers=0, servers=2))
        (start,) = w.held.values()
        w.send(ev.ContainersAllocated(at=w.at(), containers=[
            ExecutorInfo(executor_id="server-9", role=Role.SERVER, container_id="c-server-9", node="n1")]))
        w.hold = set()
        w.fail(start, "LaunchFailed: the new servers did not start")
        n = len(w.log)
        w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-server-9", "stopped by the AM")]))
        assert not finished(w) and w.steps_since(n) == [], budget
        assert w.job.phase is Phase.TRAINING and w.job.failures == 0 and w.job.shape == (2, 1)
