"""Recovery from executor losses and Optimus's straggler replacement in the PS-job controller
(planners/recovery.py, planners/straggler.py), stepped by events through the scripted world: the
choice between replacing lost workers and going back to the checkpoint, the fallback when a
replacement fails, further losses merged into a running recovery, and stragglers. No processes."""
from __future__ import annotations

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.planners import PLANNERS
from appmaster.ps.controller.records import Role
from appmaster.ps.controller.state import Change, ChangeKind, Origin
from tests.support.controller_world import World, job_state


def started(**spec: object) -> World:
    w = World(job_state(**spec))
    w.start()
    assert w.job.phase is Phase.TRAINING
    return w


def lose(w: World, *executors: str) -> list[ins.Instruction]:
    return w.send(ev.ContainersCompleted(at=w.at(), containers=[(f"c-{e}", "exited 137") for e in executors]))


def since(w: World, n: int) -> list[str]:
    return [type(i).__name__ for i in w.log[n:]]


def triggers(w: World) -> list[str]:
    return [t for _, t, _ in w.job.history]


def test_a_lost_worker_is_replaced_where_it_stood_without_a_checkpoint() -> None:
    w = started()
    splits = list(w.job.holdings.splits["worker-1"])
    n = len(w.log)
    lose(w, "worker-1")
    assert since(w, n) == ["StartExecutors", "ReportProgress", "JoinExecutors", "TakeOverSplits", "ReportProgress"]
    start = w.of(ins.StartExecutors)[-1]
    assert (start.role, start.count) == (Role.WORKER, 1)
    (take,) = w.of(ins.TakeOverSplits)
    assert (take.old, take.new, take.splits) == ("worker-1", "worker-3", splits)
    assert w.job.holdings.splits["worker-3"] == splits and "worker-1" not in w.job.holdings.splits
    assert not w.of(ins.PauseTraining) and not w.of(ins.RestoreCheckpoint)
    assert triggers(w)[-2:] == ["RECOVER", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING
    assert w.job.shape == (2, 1) and w.job.failures == 1


def test_worker_state_ssp_or_a_lost_server_after_a_worker_left_take_the_checkpoint_path() -> None:
    for how in ("keeps_worker_state", "ssp", "server"):
        w = started(sync="ssp") if how == "ssp" else started()
        w.job.keeps_worker_state = how == "keeps_worker_state"
        if how == "server":          # a worker left since the checkpoint: its pushes went with it
            w.job.push_logs_incomplete_at = len(w.job.checkpoints)
        lose(w, "server-1" if how == "server" else "worker-1")
        assert not w.of(ins.TakeOverSplits), how
        assert w.of(ins.PauseTraining) and w.of(ins.RestoreCheckpoint)[-1].directory == "ckpt/epoch-0", how
        assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING, how


def test_a_lost_server_replaces_every_server_and_keeps_the_workers() -> None:
    w = started(servers=2)
    w.job.keeps_worker_state = True          # no rebuild from the push logs: the checkpoint path
    splits = {k: list(v) for k, v in w.job.holdings.splits.items()}
    n = len(w.log)
    lose(w, "server-1")
    assert [k for k in since(w, n) if k != "ReportProgress"] == [
        "PauseTraining", "RetireExecutors", "StartExecutors", "RestoreCheckpoint", "ResumeTraining"]
    (retire,) = w.of(ins.RetireExecutors)
    assert retire.executors == ["server-2"] and not retire.released      # the surviving server only
    (start,) = w.of(ins.StartExecutors)[-1:]
    assert (start.role, start.count) == (Role.SERVER, 2)
    (restore,) = w.of(ins.RestoreCheckpoint)
    assert restore.workers_kept and restore.workers == ["worker-1", "worker-2"]
    assert restore.servers == ["server-3", "server-4"] and restore.directory == "ckpt/epoch-0"
    assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING and w.job.failures == 1
    assert {k: v for k, v in w.job.holdings.splits.items()} == splits
    assert triggers(w)[-2:] == ["RECOVER", "CHANGE_DONE"]


def test_a_worker_lost_while_the_servers_are_replaced_sends_the_workers_too() -> None:
    for held in (ins.RetireExecutors, ins.StartExecutors):
        w = started(servers=2)
        w.job.keeps_worker_state = True
        w.hold = {held}
        lose(w, "server-1")
        (step,) = w.held.values()
        lose(w, "worker-1")                 # merged into the recovery: the workers are not kept
        assert triggers(w).count("RECOVER") == 1 and w.job.failures == 1, held     # one event
        w.hold = set()
        w.answer(step)
        restore = w.of(ins.RestoreCheckpoint)[-1]
        assert not restore.workers_kept, held
        assert not {"worker-1", "worker-2"} & set(restore.workers) and len(restore.workers) == 2, held
        assert "worker-2" in w.of(ins.RetireExecutors)[-1].executors, held
        assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING, held


def test_a_lost_server_is_rebuilt_from_the_checkpoint_and_the_push_logs() -> None:
    w = started(servers=2, push_log=True)
    blocks = list(w.job.holdings.blocks["server-1"])
    n = len(w.log)
    lose(w, "server-1")
    assert [k for k in since(w, n) if k != "ReportProgress"] == ["StartExecutors", "JoinExecutors", "RebuildServers"]
    start = w.of(ins.StartExecutors)[-1]
    assert (start.role, start.count) == (Role.SERVER, 1)
    (join,) = w.of(ins.JoinExecutors)
    (rebuild,) = w.of(ins.RebuildServers)
    assert join.executors == ["server-3"] and join.role is Role.SERVER
    assert (rebuild.lost, rebuild.new, rebuild.directory) == (["server-1"], ["server-3"], "ckpt/epoch-0")
    assert not w.of(ins.PauseTraining) and not w.of(ins.RetireExecutors) and not w.of(ins.RestoreCheckpoint)
    assert sorted(w.job.ids(Role.SERVER)) == ["server-2", "server-3"] and w.job.shape == (2, 2)
    assert sorted(w.job.holdings.blocks) == ["server-2", "server-3"]
    assert triggers(w)[-2:] == ["RECOVER", "CHANGE_DONE"] and w.job.phase is Phase.TRAINING
    assert w.job.failures == 1 and blocks


def test_a_rebuild_needs_every_worker_since_the_latest_checkpoint() -> None:
    w = started(servers=2, push_log=True)
    lose(w, "worker-1")                      # replaced in place: its pushes since the checkpoint are gone
    assert w.job.push_logs_incomplete_at == len(w.job.checkpoints)
    lose(w, "server-1")
    assert not w.of(ins.RebuildServers) and w.of(ins.RestoreCheckpoint)[-1].workers_kept
    # The checkpoint path's restore is a new cut: after the next checkpoint a rebuild is possible again.
    w.job.checkpoints.append((3, "ckpt/epoch-3"))
    lose(w, w.job.ids(Role.SERVER)[0])
    assert w.of(ins.RebuildServers)[-1].directory == "ckpt/epoch-3"
    assert w.job.phase is Phase.TRAINING


def test_a_job_without_push_logs_takes_the_checkpoint_path_for_a_lost_server() -> None:
    w = started(servers=2)                   # push_log is off by default
    lose(w, "server-1")
    assert not w.of(ins.RebuildServers) and w.of(ins.RestoreCheckpoint)[-1].workers_kept
    assert w.job.phase is Phase.TRAINING


def test_a_failed_or_interrupted_rebuild_falls_back_to_the_checkpoint_keeping_the_workers() -> None:
    for how in ("fails", "worker lost", "server lost"):
        w = started(servers=2, push_log=True)
        w.hold = {ins.RebuildServers}
        lose(w, "server-1")
        (rebuild,) = w.held.values()
        if how == "fails":
            w.hold = set()
            w.fail(rebuild, "worker-0's push log does not hold every push since the checkpoint")
        else:
            lose(w, "worker-1" if how == "worker lost" else "server-2")
            assert w.log[-1] == ins.CancelSteps(steps=[rebuild.step]), how
            w.hold = set()
            w.fail(rebuild, "cancelled", cancelled=True)
        retire = w.of(ins.RetireExecutors)[-1]
        assert "server-3" in retire.executors, how            # the new server goes with the rest
        restore = w.of(ins.RestoreCheckpoint)[-1]
        assert restore.workers_kept == (how != "worker lost"), how
        assert w.job.shape == (2, 2) and w.job.phase is Phase.TRAINING and not w.job.diagnostics, how
        assert triggers(w).count("RECOVER") == 1, how


def test_a_failed_replacement_falls_back_to_the_checkpoint() -> None:
    w = started()
    w.hold = {ins.TakeOverSplits}
    lose(w, "worker-1")
    (take,) = w.held.values()
    w.hold = set()
    w.fail(take, "worker-3 could not read split 4")
    kinds = w.kinds()
    assert kinds.index("TakeOverSplits") < kinds.index("PauseTraining") < kinds.index("RestoreCheckpoint")
    retire = w.of(ins.RetireExecutors)[0]
    assert "worker-3" in retire.executors and not retire.released      # the replacement goes too
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING and not w.job.diagnostics
    assert triggers(w)[-2:] == ["RECOVER", "CHANGE_DONE"]


def test_no_replacement_container_falls_back_to_the_checkpoint() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    lose(w, "worker-2")
    (start,) = w.held.values()
    w.hold = set()
    w.fail(start, "no container within 60 s")
    assert w.of(ins.RestoreCheckpoint) and w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING


def test_a_second_worker_lost_during_a_replacement_is_replaced_in_the_same_recovery() -> None:
    w = started(workers=3)
    w2 = list(w.job.holdings.splits["worker-2"])
    w.hold = {ins.JoinExecutors}
    lose(w, "worker-1")
    (join,) = w.held.values()
    lose(w, "worker-2")                     # merged: one more start, no second change
    assert [s.count for s in w.of(ins.StartExecutors)[-2:]] == [1, 1]
    assert triggers(w).count("RECOVER") == 1 and w.job.failures == 1
    w.hold = set()
    w.answer(join)
    (second,) = w.held.values()
    w.answer(second)
    takes = {t.old: (t.new, t.splits) for t in w.of(ins.TakeOverSplits)}
    assert set(takes) == {"worker-1", "worker-2"} and takes["worker-2"] == ("worker-5", w2)
    assert w.job.shape == (3, 1) and w.job.phase is Phase.TRAINING and not w.of(ins.RestoreCheckpoint)


def test_a_server_lost_during_a_replacement_cancels_it_for_the_checkpoint_path() -> None:
    w = started()
    w.hold = {ins.TakeOverSplits}
    lose(w, "worker-1")
    (take,) = w.held.values()
    lose(w, "server-1")
    assert w.log[-1] == ins.CancelSteps(steps=[take.step])
    w.hold = set()
    w.fail(take, "cancelled", cancelled=True)
    assert w.of(ins.PauseTraining) and w.of(ins.RestoreCheckpoint)
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING and w.job.failures == 1
    assert triggers(w).count("RECOVER") == 1


def test_a_straggler_is_replaced_then_retired() -> None:
    w = started()
    splits = list(w.job.holdings.splits["worker-2"])
    w.send(ev.StragglerFound(at=w.at(), executor_id="worker-2", why="3.1x the median clock time"))
    kinds = w.kinds()
    assert kinds[-6:] == ["StartExecutors", "ReportProgress", "JoinExecutors", "TakeOverSplits",
                          "RetireExecutors", "ReportProgress"]
    take = w.of(ins.TakeOverSplits)[-1]
    assert (take.old, take.new, take.splits) == ("worker-2", "worker-3", splits)
    retire = w.of(ins.RetireExecutors)[-1]
    assert retire.executors == ["worker-2"] and retire.released
    assert w.job.ids(Role.WORKER) == ["worker-1", "worker-3"]
    assert triggers(w)[-2:] == ["RECOVER", "CHANGE_DONE"] and w.job.failures == 0
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c-worker-2", "exited 143")]))
    assert w.job.failures == 0 and w.job.phase is Phase.TRAINING      # retired: no loss


def test_a_straggler_replacement_that_fails_keeps_the_straggler() -> None:
    w = started()
    w.hold = {ins.TakeOverSplits}
    w.send(ev.StragglerFound(at=w.at(), executor_id="worker-2", why="slow"))
    (take,) = w.held.values()
    w.hold = set()
    w.fail(take, "worker-3 could not read split 1")
    retire = w.of(ins.RetireExecutors)[-1]
    assert retire.executors == ["worker-3"] and not retire.released
    assert "worker-2" in w.job.holdings.splits and w.job.ids(Role.WORKER) == ["worker-1", "worker-2"]
    assert w.job.phase is Phase.TRAINING and "replacing straggler worker-2 failed" in w.job.diagnostics


def test_a_straggler_is_refused_where_a_lost_worker_would_not_be_replaced() -> None:
    planner = PLANNERS[ChangeKind.STRAGGLER]

    def why(w: World, executor: str = "worker-1") -> str:
        return planner.invalid(w.job, Change(ChangeKind.STRAGGLER, Origin.JOB, w.at(), lost=[executor]))

    assert "SSP" in why(started(sync="ssp"))
    w = started()
    assert why(w) == "" and "not a worker" in why(w, "server-1")
    w.job.keeps_worker_state = True
    assert "keeps training state" in why(w)
    w.job.keeps_worker_state = False
    w.job.pending_losses.append(("worker-2", "exited 137"))
    assert "waiting for its recovery" in why(w)
    w.job.pending_losses.clear()
    n = len(w.log)
    w.job.keeps_worker_state = True
    w.send(ev.StragglerFound(at=w.at(), executor_id="worker-1", why="slow"))
    assert since(w, n) == [] and w.job.change is None


def test_a_straggler_found_while_a_change_runs_is_ignored() -> None:
    w = started()
    w.hold = {ins.StartExecutors}
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    n = len(w.log)
    w.send(ev.StragglerFound(at=w.at(), executor_id="worker-1", why="slow"))
    assert since(w, n) == [] and w.job.change is not None and w.job.change.kind is ChangeKind.EPS


def test_the_straggler_lost_during_its_replacement_aborts_it_for_a_recovery() -> None:
    w = started()
    w.hold = {ins.JoinExecutors}
    w.send(ev.StragglerFound(at=w.at(), executor_id="worker-2", why="slow"))
    (join,) = w.held.values()
    lose(w, "worker-2")
    assert w.log[-1] == ins.CancelSteps(steps=[join.step])
    w.hold = set()
    w.fail(join, "cancelled", cancelled=True)
    # The straggler change retires its idle newcomer, then the recovery replaces the lost worker.
    assert w.of(ins.RetireExecutors)[-1].executors == ["worker-3"]
    assert triggers(w)[-4:] == ["RECOVER", "CHANGE_DONE", "RECOVER", "CHANGE_DONE"]
    assert w.of(ins.TakeOverSplits)[-1].old == "worker-2"
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING and w.job.failures == 1
