"""Optimus §5.2 straggler handling: detection (appmaster/ps/stragglers.py, pure) and the replacement of
a slow, live worker at an epoch end through the lost-worker replacement (the controller's straggler
planner), against the real AM over in-process executors (tests/support/ps_inprocess.py): training
goes on exactly once per mini-batch with the new worker in the slow one's place. When it is refused
is the controller's decision, stepped by events (tests/support/controller_world.py)."""
from __future__ import annotations

from pathlib import Path

import time

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.runtime.executor_pool import ExecutorState
from appmaster.ps.stragglers import MIN_BATCHES, StragglerWatch, WorkerPace, find_straggler
from protocol.records import FinalStatus
from protocol.shape_history import StragglerChange
from ps_inprocess import SPEC, PsJob
from tests.support.controller_world import World, job_state, started
from test_worker_replacement import BATCHES_PER_WORKER_EPOCH, check_exact, records


def paces(*seconds: float, batches: int = MIN_BATCHES) -> list[WorkerPace]:
    return [WorkerPace(f"worker-{i}", s, batches) for i, s in enumerate(seconds)]


def test_a_worker_at_less_than_half_the_median_speed_of_its_peers_is_a_straggler():
    s = find_straggler(paces(0.010, 0.011, 0.025, 0.009))
    assert s is not None and s.worker == "worker-2" and s.peers_median == 0.010
    assert "2.5x" in s.describe()
    assert find_straggler(paces(0.010, 0.011, 0.019, 0.009)) is None        # slower, but not half speed
    # Two workers: each is compared with the other, so the slow one is found.
    two = find_straggler(paces(0.010, 0.030))
    assert two is not None and two.worker == "worker-1"
    assert find_straggler(paces(0.010)) is None
    # Too few mini-batches measured: not compared.
    assert find_straggler(paces(0.010, 0.011, 0.030, batches=MIN_BATCHES - 1)) is None
    assert find_straggler(paces(0.010, 0.011) + [WorkerPace("new", 0.5, 3)]) is None


def test_a_straggler_is_replaced_only_once_confirmed_and_only_so_many_times():
    watch = StragglerWatch(confirmations=2, max_replacements=1)
    assert watch.check(paces(0.01, 0.01, 0.05)) is None                 # first sighting
    assert watch.check(paces(0.01, 0.01, 0.01)) is None                 # recovered: forgotten
    assert watch.check(paces(0.01, 0.01, 0.05)) is None
    found = watch.check(paces(0.01, 0.01, 0.05))                          # seen twice in a row
    assert found is not None and found.worker == "worker-2"
    watch.record(found, "worker-3")
    assert watch.status_json()["replaced"] == [{"worker": "worker-2", "replacement": "worker-3",
                                                "seconds": 0.05, "peers_median": 0.01}]
    assert watch.check(paces(0.05, 0.01, 0.01)) is None and watch.check(paces(0.05, 0.01, 0.01)) is None


async def test_a_slow_worker_is_replaced_at_an_epoch_end_and_training_goes_on_exactly_once(tmp_path: Path):
    job = PsJob(tmp_path)
    try:
        splits: list[int] = []
        clocks_per_epoch = BATCHES_PER_WORKER_EPOCH // SPEC["clock_batches"]

        def at_epoch_end() -> None:        # the master's epoch-end check found worker-1 slow
            if job.loop.clocks_done == clocks_per_epoch and not splits:
                splits.extend(job.master.steps.splits().active_of("worker-1"))
                job.master.interp.feed(ev.StragglerFound(at=time.time(), executor_id="worker-1",
                                                         why="worker-1 takes 3x its peers' time"))
        job.trigger_after_clock(at_epoch_end)
        assert await job.run() is FinalStatus.SUCCEEDED
        check_exact(job)
        [rec] = records(job, StragglerChange)
        assert type(rec) is StragglerChange and rec.changed and rec.error == "" and not rec.clock_redone
        assert rec.replacements == {"worker-1": "worker-2"} and "3x" in rec.lost[0]
        assert job.training.membership.worker_ids() == ["worker-0", "worker-2"]
        assert splits and job.master.steps.splits().active_of("worker-2") == splits
        assert job.pool.executors["worker-1"].state is not ExecutorState.READY         # retired
        # Taken over at a clock boundary: no mini-batch ran twice, so no push was dropped as a repeat.
        assert sum(job.executor(s.executor_id).service.applied_pushes.repeats for s in job.pool.servers) == 0
        # A straggler is no loss: the job's loss budget is untouched.
        assert job.job.failures == 0 and job.master.recoveries == 0 and job.master.replaced == {"worker-1": "worker-2"}
    finally:
        await job.close()


def test_no_replacement_where_a_lost_worker_would_not_be_replaced_either() -> None:
    for w in (started(sync="ssp"), started()):
        if w.job.spec.sync == "bsp":
            w.job.keeps_worker_state = True          # NMF, LDA: a replacement could not take it over
        n = len(w.log)
        w.send(ev.StragglerFound(at=w.at(), executor_id="worker-1", why="slow"))
        assert w.log[n:] == [] and w.job.change is None and w.job.shape == (2, 1)
    # Not yet training: the finding is ignored.
    starting = World(job_state())
    starting.hold = {ins.SetupTraining}
    starting.start()
    n = len(starting.log)
    starting.send(ev.StragglerFound(at=starting.at(), executor_id="worker-1", why="slow"))
    assert starting.log[n:] == [] and starting.job.phase is Phase.INITIALISING
