"""A new AM attempt takes over the failed attempt's executors (AdoptExecutors), in the PS-job
controller stepped by events (tests/support/controller_world.py): nothing launched, set up or
restored when it works; the start as before (new executors, the checkpoint) when it does not."""
from __future__ import annotations

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.records import ExecutorInfo, Holdings, Role
from protocol.internal_api import NodePlacement, ShapeDirective
from tests.support.controller_world import World, job_state

TAKEN = [ExecutorInfo(executor_id="server-0", role=Role.SERVER, container_id="c1", node="n1"),
         ExecutorInfo(executor_id="worker-0", role=Role.WORKER, container_id="c2", node="n2"),
         ExecutorInfo(executor_id="worker-1", role=Role.WORKER, container_id="c3", node="n3")]


def taken_over(w: World, directory: str = "ckpt/epoch-4", checkpoint_epoch: int = 4) -> None:
    (step,) = w.held_of(ins.AdoptExecutors)
    holdings = Holdings(blocks={"server-0": list(range(w.job.spec.num_blocks))},
                        splits={"worker-0": [0, 2], "worker-1": [1, 3]})
    w.held.pop(step.step)
    w.send(ev.StepDone(at=w.at(), step=step.step, executors=TAKEN, holdings=holdings, epochs_done=5,
                       directory=directory, checkpoint_epoch=checkpoint_epoch))


def test_a_new_attempt_takes_the_executors_over_and_trains_on() -> None:
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(resume_from="ckpt/epoch-4", adopt=True)
    assert w.job.phase is Phase.ADOPTING and len(w.held_of(ins.AdoptExecutors)) == 1
    taken_over(w)
    assert w.job.phase is Phase.TRAINING and w.triggers() == ["ADOPT", "INITIALISED"]
    assert w.steps_since(0) == ["AdoptExecutors", "ResumeTraining"]      # nothing started, set up or restored
    assert w.job.shape == (2, 1) and w.job.epoch == 5
    assert w.job.checkpoints == [(4, "ckpt/epoch-4")]                  # what a recovery goes back to
    assert w.job.holdings.splits == {"worker-0": [0, 2], "worker-1": [1, 3]}


def test_a_server_lost_after_a_take_over_goes_back_to_the_checkpoint_until_the_next_one() -> None:
    """The new attempt's clock count restarts from the failed one's record, behind the workers'
    push logs: they cannot rebuild a server until a checkpoint this attempt wrote."""
    w = World(job_state(push_log=True), hold={ins.AdoptExecutors})
    w.start(resume_from="ckpt/epoch-4", adopt=True)
    taken_over(w)
    assert w.job.push_logs_incomplete_at == len(w.job.checkpoints)
    w.send(ev.ContainersCompleted(at=w.at(), containers=[("c1", "exited 137")]))
    assert not w.of(ins.RebuildServers) and w.of(ins.RestoreCheckpoint)[-1].workers_kept
    assert w.job.phase is Phase.TRAINING


def test_taken_over_without_a_checkpoint_the_job_writes_its_first() -> None:
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(adopt=True)
    taken_over(w, directory="", checkpoint_epoch=0)
    (ckpt,) = w.of(ins.WriteCheckpoint)
    assert (ckpt.epoch, ckpt.reason) == (5, "initial") and w.job.phase is Phase.TRAINING


def test_a_refused_take_over_starts_new_executors_on_the_checkpoint() -> None:
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(resume_from="ckpt/epoch-4", adopt=True)
    (step,) = w.held_of(ins.AdoptExecutors)
    w.fail(step, "TakeOverRefused: worker-1 holds splits [1], the record [1, 3]")
    assert w.triggers() == ["ADOPT", "ADOPT_FAILED", "SERVERS_READY", "WORKERS_READY_RESUME", "INITIALISED"]
    assert [r.directory for r in w.of(ins.RestoreCheckpoint)] == ["ckpt/epoch-4"]
    assert w.job.phase is Phase.TRAINING and w.job.shape == (2, 1) and not w.job.adopt


def test_a_cancelled_take_over_is_no_fallback() -> None:
    """The take-over stopped by a stop request: the job ends, it starts nothing."""
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(adopt=True)
    w.send(ev.StopRequested(at=w.at(), reason="killed"))
    assert w.job.phase is Phase.KILLED and not w.of(ins.StartExecutors)


def test_a_policy_placed_job_takes_over_at_once_and_applies_the_directive_after() -> None:
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(policy_places_new_jobs=True, adopt=True)
    assert w.job.phase is Phase.ADOPTING                 # the executors are placed already: no wait
    d = ShapeDirective(workers=2, servers=1, version=3)
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    assert w.job.kept_directive == d                      # kept while the job starts
    taken_over(w)
    assert w.job.phase is Phase.TRAINING and w.job.applied_directive == 3 and w.job.kept_directive is None


def test_a_refused_take_over_of_a_policy_placed_job_starts_on_the_directive() -> None:
    w = World(job_state(), hold={ins.AdoptExecutors})
    w.start(policy_places_new_jobs=True, adopt=True)
    d = ShapeDirective(workers=1, servers=1, version=2, placement=[NodePlacement(node="n3", workers=1, servers=1)])
    w.send(ev.DirectiveArrived(at=w.at(), directive=d))
    (step,) = w.held_of(ins.AdoptExecutors)
    w.fail(step, "TakeOverRefused: server-0 did not answer")
    assert [s.per_node for s in w.of(ins.StartExecutors)] == [{"n3": 1}, {"n3": 1}]
    assert w.job.phase is Phase.TRAINING and w.job.applied_directive == 2
