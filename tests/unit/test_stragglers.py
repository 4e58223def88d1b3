"""Optimus §5.2 straggler handling: detection (appmaster/ps/stragglers.py, pure) and the replacement of
a slow, live worker at an epoch end through the lost-worker replacement (ExecutorRecovery.
replace_straggler), against real in-process executors (tests/unit/test_worker_replacement.py's harness):
training goes on exactly once per mini-batch with the new worker in the slow one's place."""
from __future__ import annotations

from pathlib import Path

from appmaster.ps.executor_pool import ExecutorState
from appmaster.ps.job import JobPhase
from appmaster.ps.metrics import EpochRecord
from appmaster.ps.recovery import ExecutorRecovery
from appmaster.ps.stragglers import MIN_BATCHES, StragglerWatch, WorkerPace, find_straggler
from protocol.shape_history import StragglerChange
from test_worker_replacement import SPEC, Job, check_exact


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
    job = Job(tmp_path)
    try:
        await job.setup()
        slow = job.pool.executors["worker-1"]
        splits = list(slow.blocks)
        replaced: list[str] = []

        async def on_epoch(rec: EpochRecord) -> None:
            job.epochs.append(rec)
            if rec.epoch == 0:       # the master's epoch-end check found worker-1 slow
                new = await job.recovery.replace_straggler(slow, "worker-1 takes 3x its peers' time")
                assert new is not None
                replaced.append(new.executor_id)

        await job.training.loop.train(on_epoch)
        check_exact(job)
        assert replaced == ["worker-2"]
        [rec] = job.records
        assert type(rec) is StragglerChange and rec.changed and rec.error == "" and not rec.clock_redone
        assert rec.replacements == {"worker-1": "worker-2"} and "3x" in rec.lost[0]
        assert job.training.membership.worker_ids() == ["worker-0", "worker-2"]
        assert job.steps.splits().active_of("worker-2") == splits
        assert slow.state is not ExecutorState.READY         # retired
        # A straggler is no loss: the job's loss budget is untouched.
        assert job.recovery.failures == 0 and job.recovery.recoveries == 0
    finally:
        await job.close()


async def test_no_replacement_where_a_lost_worker_would_not_be_replaced_either(tmp_path: Path):
    job = Job(tmp_path, {**SPEC, "sync": "ssp"})
    try:
        await job.setup()
        assert await job.recovery.replace_straggler(job.pool.executors["worker-1"], "slow") is None
        waiting = ExecutorRecovery(job.spec, job.app, job.steps, lambda: JobPhase.STARTING, on_record=job.records.append)
        assert await waiting.replace_straggler(job.pool.executors["worker-1"], "slow") is None
        assert job.records == [] and job.training.membership.worker_ids() == ["worker-0", "worker-1"]
    finally:
        await job.close()
