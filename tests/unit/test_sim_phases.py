"""A simulated job runs the real AM's controller (appmaster/ps/controller): its phases are the
controller's lifecycle, its steps the controller's instructions carried out at their calibrated
costs (sim/step_costs.py), and `replay_directives` (sim/am_replay.py) gives the (phase,
instruction kind) log that issue 35's part 5 compares with a real AM's: here for an EPS add, a
kill-based restart, a pause and resume, and executor losses. Virtual time only: no sleeps."""
from __future__ import annotations

from typing import Any

import pytest

from appmaster.ps.controller import LIFECYCLE, Phase, Trigger
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.records import Role
from appmaster.ps.controller.state import Change, ChangeKind, Origin
from appmaster.ps.controller.planners.eps import Part
from protocol import ps_job_spec
from protocol.internal_api import AllocateRequest, AllocateResponse, RunState, ShapeDirective
from rm import policies
from sim.am_replay import AmReplay, Loss, replay_directives
from sim.simulator import T0, SimConfig, Simulator
from sim.step_costs import RESHAPE_SHARE, step_cost
from sim.trace import TraceJob
from test_sim import calibration

P = Phase
START = [P.STARTING, P.LAUNCHING_SERVERS, P.LAUNCHING_WORKERS, P.INITIALISING, P.TRAINING]
END = [P.TRAINING, P.FINISHING, P.SUCCEEDED]
START_STEPS = ["StartExecutors", "StartExecutors", "SetupTraining", "WriteCheckpoint", "ResumeTraining"]
END_STEPS = ["WriteCheckpoint", "ScoreModel"]


def spec(**kw: object) -> ps_job_spec.PSJobSpec:
    fields: dict[str, object] = {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 3, "max_servers": 2,
                                 "max_epochs": 20, "convergence_threshold": 1e-12}
    return ps_job_spec.validate(fields | kw)


def replay(script: list[tuple[float, ShapeDirective]], losses: tuple[Loss, ...] = (), **kw: object) -> AmReplay:
    return replay_directives(spec(**kw), script, calibration(), losses, data_scale=20.0)


def span(events: list[tuple[float, str, Phase]], phase: Phase) -> tuple[float, float]:
    """When the job entered `phase` first and when it next left it."""
    start = next(i for i, (_, _, p) in enumerate(events) if p is phase)
    end = next(i for i in range(start, len(events)) if events[i][2] is not phase)
    return events[start][0], events[end][0]


def test_an_undisturbed_job_walks_the_controllers_lifecycle() -> None:
    r = replay([])
    assert r.phases == START + END[1:]
    assert r.steps() == START_STEPS + END_STEPS
    assert r.record.final_status == "SUCCEEDED" and r.record.epochs == 20
    # Every event the AM saw left the job in a phase of the controller's table.
    assert all(isinstance(p, Phase) for _, _, p in r.events)


def test_job_reports_carry_the_controllers_phases_and_every_transition_is_in_its_table() -> None:
    job = TraceJob(name="t", arrival_s=0.0, app="mlr", threshold=0.01, workers=1, servers=1, data_scale=5.0)
    sim = Simulator([job], "static", calibration(), SimConfig(nodes=3))
    phases: list[str] = []
    original = sim.core.allocate

    def spy(claims: dict[str, Any], req: AllocateRequest) -> AllocateResponse:
        if req.shape is not None:
            phases.append(req.shape.phase)
        return original(claims, req)
    sim.core.allocate = spy  # type: ignore[method-assign]
    sim.run()
    assert set(phases) <= {p.value for p in Phase} and "TRAINING" in phases
    history = sim.jobs[0].state.history
    assert history and all(LIFECYCLE.next(before, Trigger(t)) is after for before, t, after in history)


def test_an_eps_add_reshapes_live_for_the_calibrated_reshape_cost() -> None:
    r = replay([(30.0, ShapeDirective(workers=2, servers=2))])
    assert r.phases == START + [P.RESHAPING] + END
    assert r.steps() == START_STEPS + ["StartExecutors", "StartExecutors", "JoinExecutors", "JoinExecutors",
                                       "MoveModelBlocks", "StageSplits", "CommitSplits"] + END_STEPS
    assert [s[1:] for s in r.record.shapes] == [(1, 1), (2, 2)] and r.record.reshapes == 1
    # The executors are granted at once (the cluster has room): the change is its steps' cost,
    # one reshape_cost for the two additions running side by side.
    begin, end = span(r.events, P.RESHAPING)
    assert end - begin == pytest.approx(calibration().apps["mlr"].reshape_s)


def test_a_kill_based_job_restarts_through_a_checkpoint() -> None:
    r = replay([(30.0, ShapeDirective(workers=2, servers=2))], elastic_mode="kill")
    assert r.phases == START + [P.RESTARTING] + END
    assert r.steps() == START_STEPS + ["PauseTraining", "WriteCheckpoint", "RetireExecutors", "StartExecutors",
                                       "StartExecutors", "RestoreCheckpoint", "ResumeTraining"] + END_STEPS
    assert [s[1:] for s in r.record.shapes] == [(1, 1), (0, 0), (2, 2)] and r.record.reshapes == 1
    begin, end = span(r.events, P.RESTARTING)
    assert end - begin == pytest.approx(calibration().apps["mlr"].restart_s)


def test_a_pause_and_resume_release_everything_and_come_back_at_the_directives_time() -> None:
    r = replay([(30.0, ShapeDirective(workers=1, servers=1, run_state=RunState.PAUSE)),
                (90.0, ShapeDirective(workers=1, servers=1, run_state=RunState.RESUME))])
    assert r.phases == START + [P.PAUSING, P.PAUSED, P.RESUMING] + END
    assert r.steps() == START_STEPS + ["PauseTraining", "WriteCheckpoint", "RetireExecutors", "StartExecutors",
                                       "StartExecutors", "RestoreCheckpoint", "ResumeTraining"] + END_STEPS
    assert [s[1:] for s in r.record.shapes] == [(1, 1), (0, 0), (1, 1)] and r.record.pauses == 1
    cal = calibration().apps["mlr"]
    paused_at, resumed_at = span(r.events, P.PAUSED)
    pausing = span(r.events, P.PAUSING)
    assert pausing[1] - pausing[0] == pytest.approx(cal.pause_s)
    assert 90.0 <= resumed_at <= 92.0 and paused_at < 35.0      # the next policy round and allocate
    undisturbed = replay([])
    assert r.record.jct is not None and undisturbed.record.jct is not None
    assert r.record.jct >= undisturbed.record.jct + (resumed_at - paused_at) + cal.pause_s + cal.restart_s - 1e-6


def test_a_lost_server_goes_back_to_the_checkpoint_keeping_the_worker() -> None:
    r = replay([], (Loss(30.0, Role.SERVER),))
    assert r.killed == ["server-0"]
    assert r.phases == START + [P.RECOVERING] + END
    # Its only server is started again; the worker stays with its input.
    assert r.steps() == START_STEPS + ["PauseTraining", "StartExecutors", "RestoreCheckpoint",
                                       "ResumeTraining"] + END_STEPS
    assert r.record.final_status == "SUCCEEDED" and r.record.epochs == 20
    # Training went back to the checkpoint of epoch 0: what it had done since is lost.
    undisturbed = replay([])
    assert r.record.jct is not None and undisturbed.record.jct is not None
    assert r.record.jct > undisturbed.record.jct + 20.0


def test_a_lost_server_of_a_job_with_push_logs_is_rebuilt_on_a_new_one() -> None:
    r = replay([], (Loss(30.0, Role.SERVER),), push_log=True)
    assert r.killed == ["server-0"]
    assert r.phases == START + [P.RECOVERING] + END
    # A new server takes the lost one's blocks (the checkpoint's plus the workers' pushes since):
    # nothing is redone, the recovery costs what adding a server does.
    assert r.steps() == START_STEPS + ["StartExecutors", "JoinExecutors", "RebuildServers"] + END_STEPS
    assert r.record.final_status == "SUCCEEDED" and r.record.epochs == 20
    undisturbed = replay([], push_log=True)
    assert r.record.jct is not None and undisturbed.record.jct is not None
    cal = calibration().apps["mlr"]
    assert undisturbed.record.jct < r.record.jct <= undisturbed.record.jct + cal.reshape_cost(0.0, 20.0) + 5.0


def test_a_lost_server_after_a_lost_worker_goes_back_to_the_checkpoint() -> None:
    """Once a worker was lost (replaced live), its pushes since the checkpoint are gone with it:
    a server lost before the next checkpoint takes the checkpoint path, the worker kept, push
    logs or not."""
    r = replay([], (Loss(20.0, Role.WORKER), Loss(30.0, Role.SERVER)), push_log=True)
    assert r.steps() == START_STEPS + ["StartExecutors", "JoinExecutors", "TakeOverSplits", "PauseTraining",
                                       "StartExecutors", "RestoreCheckpoint", "ResumeTraining"] + END_STEPS
    assert r.record.final_status == "SUCCEEDED" and r.record.epochs == 20
    # Training went back to the checkpoint of epoch 0: what it had done since is lost.
    undisturbed = replay([])
    assert r.record.jct is not None and undisturbed.record.jct is not None
    assert r.record.jct > undisturbed.record.jct + 20.0


def test_a_lost_worker_is_replaced_live() -> None:
    r = replay([], (Loss(30.0, Role.WORKER),))
    assert r.killed == ["worker-0"]
    assert r.phases == START + [P.RECOVERING] + END
    assert r.steps() == START_STEPS + ["StartExecutors", "JoinExecutors", "TakeOverSplits"] + END_STEPS
    assert r.record.final_status == "SUCCEEDED" and r.record.epochs == 20


def test_a_directive_arriving_during_a_change_waits_for_it_to_end() -> None:
    """One change at a time (the controller's rule table: a directive during a change is kept):
    a newer directive that arrives while a reshape runs is carried out after it, not merged."""

    class TwoSteps:
        name = "two-steps"

        def decide(self, snapshot: policies.ClusterSnapshot) -> policies.Decision:
            t = snapshot.now - T0
            shape = (3, 1) if t < 61.0 else (2, 2)       # the second a second after the first
            if t < 60.0:
                return policies.Decision()
            return policies.Decision({a.app_id: policies.JobDecision(*shape)
                                      for a in snapshot.apps if a.shape is not None and a.shape.started})

    job = TraceJob(name="t", arrival_s=0.0, app="mlr", threshold=0.01, workers=1, servers=1, max_workers=4,
                   max_servers=2, data_scale=20.0)
    sim = Simulator([job], "static", calibration(), SimConfig(nodes=3), am_logs=True)
    sim.policy = TwoSteps()
    rec = sim.run().records[0]
    sj = sim.jobs[0]
    assert sj.log is not None and rec.reshapes == 2 and rec.shapes[-1][1:] == (2, 2)
    # Two changes one after the other: the second (version 2, kept while the first ran) starts as
    # the first ends, from the shape the first made (3, 1): it removes a worker and adds a server.
    changes = [(t, after) for _, t, after in sj.state.history if t in ("RESHAPE", "CHANGE_DONE")]
    assert changes == [("RESHAPE", P.RESHAPING), ("CHANGE_DONE", P.TRAINING)] * 2
    second = [t - T0 for t, kind, phase in sj.log.events if kind == "DirectiveArrived"][1]
    assert any(kind == "DirectiveArrived" and phase is P.RESHAPING for _, kind, phase in sj.log.events)
    steps = sj.log.instructions
    first_commit = steps.index("CommitSplits")
    assert steps.index("RetireExecutors") > first_commit and "StartExecutors" in steps[first_commit:]
    assert 60.0 < second < 62.0


def _eps_change(*groups: int) -> Change:
    change = Change(ChangeKind.EPS, Origin.DIRECTIVE, 0.0)
    change.parts = [Part("add_workers", Role.WORKER, 1, g) for g in groups]
    return change


@pytest.mark.parametrize("stages", [
    [ins.JoinExecutors, ins.MoveModelBlocks],                              # add_servers
    [ins.JoinExecutors, ins.StageSplits, ins.CommitSplits],                # add_workers
    [ins.MoveModelBlocks, ins.WaitClockBoundary, ins.RetireExecutors],     # remove_servers
    [ins.StageSplits, ins.CommitSplits, ins.RetireExecutors],              # remove_workers
    [ins.JoinExecutors, ins.TakeOverSplits],                               # a worker replaced live
])
def test_each_eps_function_costs_one_reshape(stages: list[type]) -> None:
    cal = calibration().apps["mlr"]
    assert sum(RESHAPE_SHARE[s] for s in stages) == pytest.approx(1.0)
    one = step_cost(cal, ins.JoinExecutors(step=1, role=Role.WORKER, executors=[]), _eps_change(0), 0.0, 1.0)
    two = step_cost(cal, ins.JoinExecutors(step=1, role=Role.WORKER, executors=[]), _eps_change(0, 1), 0.0, 1.0)
    assert one == pytest.approx(0.25 * cal.reshape_s) and two == pytest.approx(one / 2)


def test_changes_that_stop_training_pay_at_their_checkpoint_and_restore() -> None:
    cal = calibration().apps["mlr"]
    pause = Change(ChangeKind.PAUSE, Origin.DIRECTIVE, 0.0)
    restart = Change(ChangeKind.RESTART, Origin.DIRECTIVE, 0.0)
    ckpt = ins.WriteCheckpoint(step=1, epoch=3, reason="pause")
    restore = ins.RestoreCheckpoint(step=2, directory="d", servers=[], workers=[])
    retire = ins.RetireExecutors(step=3, executors=["w"])
    assert step_cost(cal, ckpt, pause, 0.0, 1.0, halted=True) == cal.pause_s
    assert step_cost(cal, ckpt, restart, 0.0, 1.0, halted=True) == 0.0
    assert step_cost(cal, restore, restart, 0.0, 1.0, halted=True) == cal.restart_cost(0.0)
    assert step_cost(cal, retire, restart, 0.0, 1.0, halted=True) == 0.0
    assert step_cost(cal, ins.SetupTraining(step=4), None, 0.0, 1.0) == cal.startup_s
    assert step_cost(cal, ins.ScoreModel(step=5), None, 0.0, 1.0) == cal.finish_s


def test_a_job_held_back_by_a_pause_starts_on_the_newer_directive_and_stays_running() -> None:
    """A policy that places new jobs (Harmony) first holds a job back (PAUSE), then runs it: the
    held-back PAUSE must not pause the job once its start is done (a simulated Harmony run stalled
    on this with every such job PAUSED for good)."""
    from appmaster.ps.controller import events as ev
    from tests.support.controller_world import World, job_state
    w = World(job_state())
    w.start(policy_places_new_jobs=True)
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=0, servers=0, version=1,
                                                                   run_state=RunState.PAUSE)))
    w.send(ev.DirectiveArrived(at=w.at(), directive=ShapeDirective(workers=2, servers=1, version=2)))
    assert w.job.phase is P.TRAINING and w.job.kept_directive is None and w.job.applied_directive == 2
    assert "PauseTraining" not in w.kinds()
