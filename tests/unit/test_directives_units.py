"""Directive handling of the PS AM, in the PS-job controller (stepped by events in
tests/support/controller_world.py) and the pure parts around it: diffing a shape against another,
a directive's target within the job's bounds, version dedup, coalescing while a change runs,
waiting for training to start, and the shape report's progress figures (injected times)."""
from __future__ import annotations

import pytest

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.phases import LIFECYCLE, JobTransitionError, Trigger
from appmaster.ps.controller.planners.eps import target_of
from appmaster.ps.controller.records import Role, Target
from appmaster.ps.job_progress import ProgressTracker, Shape, ShapeDelta, diff
from protocol import ps_job_spec
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.records import Resource
from tests.support.controller_world import World, job_state, started


def directive(w: int, s: int, v: int, **kw: object) -> ShapeDirective:
    return ShapeDirective(workers=w, servers=s, version=v, **kw)   # type: ignore[arg-type]


def send(world: World, d: ShapeDirective) -> list[ins.Instruction]:
    return world.send(ev.DirectiveArrived(at=world.at(), directive=d))


def changing(world: World, since: int = 0) -> list[bool]:
    return [i.changing for i in world.log[since:] if isinstance(i, ins.ReportProgress)]


def eps_ops(world: World, since: int = 0) -> list[tuple[str, int]]:
    """The EPS functions the changes since `since` ran, in order (from their steps)."""
    out: list[tuple[str, int]] = []
    for i in world.log[since:]:
        if isinstance(i, ins.StartExecutors):
            out.append((f"add_{i.role.value}s", i.count))
        elif isinstance(i, ins.MoveModelBlocks) and i.drop:
            out.append(("remove_servers", len(i.drop)))
        elif isinstance(i, ins.CommitSplits) and i.leaving:
            out.append(("remove_workers", len(i.leaving)))
    return out


# ----- diff / target ------------------------------------------------------------------------------

def test_diff_orders_removals_before_additions() -> None:
    assert diff(Shape(3, 3), Shape(2, 2)).steps() == [("remove_servers", 1), ("remove_workers", 1)]
    assert diff(Shape(2, 2), Shape(3, 3)).steps() == [("add_servers", 1), ("add_workers", 1)]
    assert diff(Shape(2, 3), Shape(4, 1)).steps() == [("remove_servers", 2), ("add_workers", 2)]
    assert diff(Shape(2, 2), Shape(2, 2)).empty and diff(Shape(2, 2), Shape(2, 2)).steps() == []
    assert ShapeDelta(-1, 0).steps() == [("remove_workers", 1)]


def test_target_keeps_one_of_each_and_the_job_bounds() -> None:
    def spec(**kw: object) -> ps_job_spec.PSJobSpec:
        return ps_job_spec.validate({"app": "mlr", "workers": 2, "servers": 1, **kw})
    assert target_of(directive(0, 0, 1), spec()) == Target(workers=1, servers=1)
    assert target_of(directive(9, 7, 1), spec(max_workers=4, max_servers=3)) == Target(workers=4, servers=3)
    assert target_of(directive(3, 2, 1), spec(max_workers=4)) == Target(workers=3, servers=2)
    # the job spec's minimums (Dorm's n_min per role) hold too
    assert target_of(directive(1, 1, 1), spec(min_workers=2, min_servers=3, servers=3)) == Target(workers=2, servers=3)
    sized = target_of(directive(2, 1, 1, executor_resource=Resource(384, 2)), spec())
    assert (sized.memory_mb, sized.vcores) == (384, 2)


# ----- versions, keeping, coalescing -------------------------------------------------------------

def test_directives_are_kept_until_training_starts() -> None:
    w = World(job_state(max_workers=4, max_servers=4))
    w.hold = {ins.SetupTraining}
    w.start()
    send(w, directive(2, 2, 1))
    send(w, directive(1, 1, 2))                # the newer one replaces the kept one
    assert w.job.kept_directive is not None and w.job.kept_directive.version == 2
    assert w.job.applied_directive == 0 and w.job.phase is Phase.INITIALISING
    (setup,) = w.held.values()
    w.hold = set()
    w.answer(setup)                            # training starts: the kept one is applied
    assert w.job.applied_directive == 2 and w.job.kept_directive is None
    assert w.job.shape == (1, 1) and w.job.phase is Phase.TRAINING and w.job.change is None


def test_repeated_and_older_versions_are_ignored() -> None:
    w = started(max_workers=4)
    send(w, directive(3, 1, 3))
    assert w.job.applied_directive == 3 and w.job.shape == (3, 1)
    n = len(w.log)
    assert send(w, directive(3, 1, 3)) == [] and send(w, directive(5, 5, 2)) == []     # repeat, older
    assert w.log[n:] == [] and w.job.applied_directive == 3 and w.job.seen_directive == 3
    assert w.job.change is None and w.job.shape == (3, 1)


def test_directives_during_a_change_coalesce_to_the_latest() -> None:
    w = started(workers=3, servers=3, max_workers=4, max_servers=4)
    w.hold = {ins.WaitClockBoundary}
    n = len(w.log)
    send(w, directive(2, 2, 1))
    assert w.job.phase is Phase.RESHAPING
    send(w, directive(3, 3, 2))
    send(w, directive(4, 2, 3))
    send(w, directive(4, 2, 3))                # a repeat of the kept one: still one kept
    kept = w.job.kept_directive
    assert kept is not None and (kept.workers, kept.servers, kept.version) == (4, 2, 3)
    w.hold = set()
    for s in list(w.held.values()):
        w.answer(s)
    assert w.job.applied_directive == 3 and w.job.kept_directive is None and w.job.change is None
    assert w.job.shape == (4, 2) and w.triggers()[-4:] == ["RESHAPE", "CHANGE_DONE", "RESHAPE", "CHANGE_DONE"]
    assert changing(w, n) == [True, False, True, False]


def test_no_change_ends_that_did_not_begin() -> None:
    # A step answer that belongs to no running change (one cancelled and ended already) is dropped.
    w = started()
    n = len(w.log)
    assert w.send(ev.StepDone(at=w.at(), step=999)) == [] and w.send(
        ev.StepFailed(at=w.at(), step=999, error="late")) == []
    assert w.log[n:] == [] and w.job.phase is Phase.TRAINING
    with pytest.raises(JobTransitionError, match="CHANGE_DONE is not allowed in phase TRAINING"):
        LIFECYCLE.next(Phase.TRAINING, Trigger.CHANGE_DONE)


# ----- progress / shape report --------------------------------------------------------------------

def test_progress_counts_rounds_and_speed_since_the_last_change() -> None:
    p = ProgressTracker(early_feedback_iterations=25)
    p.start(100.0)
    assert p.on_epoch({"worker-0": 10, "worker-1": 9}, 105.0) == 10      # a round of every worker
    assert p.on_epoch({"worker-0": 20, "worker-1": 19}, 110.0) == 20
    assert not p.early_feedback and p.speed == pytest.approx(2.0)
    p.change_started()
    assert p.changing
    p.change_ended(112.0)
    assert p.speed == 0.0 and p.speed_iterations == 0
    p.on_epoch({"worker-0": 30, "worker-1": 29, "worker-2": 4}, 116.0)   # a new worker counts from 0
    assert p.iterations == 30 and p.early_feedback and p.speed == pytest.approx(10 / 4.0)
    rep = p.report(Shape(3, 2), Resource(512, 1), 4, epoch=3, phase="TRAINING")
    assert (rep.workers, rep.servers, rep.iterations, rep.directive_version) == (3, 2, 30, 4)
    assert rep.started and rep.early_feedback and not rep.changing and (rep.epoch, rep.phase) == (3, "TRAINING")
    assert rep.executor_resource == Resource(512, 1)


# ----- directives carried out ---------------------------------------------------------------------

def test_eps_functions_run_removals_first_and_coalesce_during_a_change() -> None:
    w = started(workers=3, servers=3, max_workers=4, max_servers=4)
    w.hold = {ins.WaitClockBoundary}
    n = len(w.log)
    send(w, directive(2, 2, 1))
    assert w.job.change is not None
    assert [(p.op, p.n) for p in w.job.change.parts] == [("remove_servers", 1), ("remove_workers", 1)]
    send(w, directive(1, 1, 2))                # superseded by v3 before the change ends
    send(w, directive(3, 2, 3))
    send(w, directive(3, 2, 3))                # a repeat
    w.hold = set()
    for s in list(w.held.values()):
        w.answer(s)
    assert w.job.shape == (3, 2)
    assert eps_ops(w, n) == [("remove_servers", 1), ("remove_workers", 1), ("add_workers", 1)]
    assert w.job.applied_directive == 3 and changing(w, n) == [True, False, True, False]


def kill_job(**spec: object) -> World:
    return started(elastic_mode="kill", workers=3, servers=3, max_workers=4, max_servers=4, **spec)


def test_a_kill_job_waits_for_training_and_reshapes_in_one_step() -> None:
    w = World(job_state(elastic_mode="kill", workers=3, servers=3, max_workers=4, max_servers=4))
    w.hold = {ins.SetupTraining}
    w.start()
    send(w, directive(9, 1, 1))                # before training: kept
    assert not w.of(ins.PauseTraining) and w.job.change is not None and w.job.change.kind.value == "start"
    w.hold = set()
    w.answer(next(iter(w.held.values())))
    starts = w.of(ins.StartExecutors)[2:]      # after the first servers and workers
    assert [(s.role, s.count) for s in starts] == [(Role.SERVER, 1), (Role.WORKER, 4)]   # clamped, one restart
    assert w.triggers().count("RESTART") == 1 and w.job.shape == (4, 1)
    n = len(w.log)
    send(w, directive(4, 1, 2))                # the shape it already has: nothing to do
    assert w.steps_since(n) == [] and w.job.applied_directive == 2


def test_a_directive_naming_nodes_is_carried_out_even_with_the_same_counts() -> None:
    w = kill_job()
    w.nodes = ("n1", "n2", "n3", "n4")
    send(w, directive(3, 3, 1, nodes=["n3", "n4"]))
    assert w.triggers().count("RESTART") == 1           # same counts, new place: the job moves
    starts = w.of(ins.StartExecutors)[-2:]
    assert all(s.nodes == ["n3", "n4"] for s in starts)
    assert {w.job.node_of(e) for e in w.job.ids(Role.WORKER) + w.job.ids(Role.SERVER)} <= {"n3", "n4"}
    n = len(w.log)
    send(w, directive(3, 3, 2, nodes=["n3", "n4"]))
    assert w.steps_since(n) == [] and w.triggers().count("RESTART") == 1     # already there


def test_a_per_node_placement_is_carried_out_though_every_executor_is_on_its_nodes() -> None:
    # Harmony's one worker + one server per node: a job whose executors are all on n1, so on the
    # directive's nodes, yet not one of each per node, is restarted with the placement; once met,
    # the same directive again changes nothing.
    w = World(job_state(elastic_mode="kill", workers=2, servers=2), nodes=("n1",))
    w.start()
    assert {w.job.node_of(e) for e in w.job.executors} == {"n1"}
    w.nodes = ("n1", "n2")
    spread = [NodePlacement(node="n1", workers=1, servers=1), NodePlacement(node="n2", workers=1, servers=1)]
    send(w, directive(2, 2, 1, nodes=["n1", "n2"], placement=spread))
    starts = w.of(ins.StartExecutors)[-2:]
    assert [s.per_node for s in starts] == [{"n1": 1, "n2": 1}, {"n1": 1, "n2": 1}]
    n = len(w.log)
    send(w, directive(2, 2, 2, nodes=["n1", "n2"], placement=spread))
    assert w.steps_since(n) == [] and w.triggers().count("RESTART") == 1


def test_the_first_run_directive_is_the_first_kept_one_that_runs_the_job_with_executors() -> None:
    # Under a policy that places new jobs the AM waits for it before starting executors: a PAUSE
    # (no node free yet) is not it; the RUN on a node that follows is, and once training starts
    # it is found carried out.
    w = World(job_state())
    w.start(policy_places_new_jobs=True)
    send(w, directive(0, 0, 1, run_state=RunState.PAUSE))
    assert not w.of(ins.StartExecutors) and w.job.phase is Phase.STARTING
    placed = [NodePlacement(node="n2", workers=1, servers=1)]
    send(w, directive(1, 1, 2, nodes=["n2"], placement=placed))
    assert [s.per_node for s in w.of(ins.StartExecutors)] == [{"n2": 1}, {"n2": 1}]
    assert w.job.phase is Phase.TRAINING and w.job.applied_directive == 2 and w.job.change is None
    assert not w.of(ins.PauseTraining) and len(w.of(ins.StartExecutors)) == 2


def test_a_failed_change_is_recorded_and_later_directives_still_run() -> None:
    w = started(max_workers=4)
    w.hold = {ins.StartExecutors}
    send(w, directive(3, 1, 1))
    (start,) = w.held.values()
    w.hold = set()
    w.fail(start, "no containers")
    assert w.job.shape == (2, 1) and w.job.phase is Phase.TRAINING and w.job.applied_directive == 1
    assert w.triggers()[-2:] == ["RESHAPE", "CHANGE_DONE"]
    send(w, directive(3, 1, 2))
    assert w.job.shape == (3, 1) and w.job.applied_directive == 2


def test_an_ssp_jobs_directive_is_carried_out_by_a_restart() -> None:
    # EPS's live change needs BSP clocks: an SSP job takes the directive's shape through the
    # kill-based restart (checkpoint, new executors, restore), not as no change at all.
    w = started(sync="ssp", max_workers=4)
    n = len(w.log)
    send(w, directive(3, 1, 1))
    assert w.triggers().count("RESTART") == 1 and w.job.change is None and w.job.shape == (3, 1)
    assert w.steps_since(n)[:3] == ["PauseTraining", "WriteCheckpoint", "RetireExecutors"]
    assert w.job.applied_directive == 1
    n = len(w.log)
    send(w, directive(3, 1, 2))                     # the shape it has now: nothing to do
    assert w.steps_since(n) == [] and w.log[n:] == [ins.ReportProgress(changing=False, directive_version=2)]


def test_a_directive_the_job_cannot_carry_out_changes_nothing() -> None:
    w = started(max_workers=64)                     # more workers than the job has input splits
    splits = sum(len(s) for s in w.job.holdings.splits.values())
    n = len(w.log)
    send(w, directive(splits + 1, 1, 1))
    assert w.steps_since(n) == [] and w.job.change is None and w.job.shape == (2, 1)
    assert w.log[n:] == [ins.ReportProgress(changing=False, directive_version=1)]
    # The job state says why (the report carries it), so the RM does not send it again as a shape
    # the job came short of.
    why = w.job.refused_directive
    assert f"{splits + 1} workers" in why
    # A change that ends later keeps saying the version acted on was refused ...
    n = len(w.log)
    w.send(ev.ScaleRequested(at=w.at(), request=1, workers=1, servers=0))
    assert w.job.shape == (3, 1) and w.job.applied_directive == 1 and w.job.refused_directive == why
    assert [(i.changing, i.directive_version) for i in w.log[n:] if isinstance(i, ins.ReportProgress)] == [
        (True, 1), (False, 1)]
    # ... and the next directive, carried out, clears it.
    send(w, directive(2, 1, 2))
    assert w.job.shape == (2, 1) and w.job.applied_directive == 2 and w.job.refused_directive == ""


def test_the_harmony_group_comes_only_from_directives_acted_on() -> None:
    # The group travels with the directive the controller acts on: a kept one superseded before
    # training never is, a stale one is dropped, a newer one without a group leaves it.
    w = World(job_state(max_workers=4, max_servers=4))
    w.hold = {ins.SetupTraining}
    w.start()
    send(w, directive(2, 2, 1, group="g-early"))       # kept, then superseded
    send(w, directive(3, 3, 2, group="g1"))
    assert w.job.applied_directive == 0
    w.hold = set()
    w.answer(next(iter(w.held.values())))
    assert w.job.applied_directive == 2 and w.job.shape == (3, 3)
    assert send(w, directive(2, 2, 1, group="g-stale")) == [] and w.job.applied_directive == 2
    send(w, directive(2, 2, 3, group=None))             # left its group
    assert w.job.applied_directive == 3 and w.job.shape == (2, 2)
