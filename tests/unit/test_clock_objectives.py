"""The PS AM's objective every few clocks (appmaster.ps.clock_objectives, JobReport.clock_objectives):
fractional epochs from the blocks' places, the pacing (every 1/8 epoch, within the evaluation
budget), thinning to MAX_CLOCK_OBJECTIVES oldest first, going back after a restart; and a real BSP
job in this event loop whose samples are the exact objective, in the epoch objective's series."""
from __future__ import annotations

import math

import msgspec
import pytest

from appmaster.ps.clock_objectives import ClockObjectives, epoch_fraction
from appmaster.ps.metrics import EpochRecord
from protocol.job_report import MAX_CLOCK_OBJECTIVES, JobReport
from test_ps_training import InProcessJob


def test_epoch_fraction_counts_the_rows_trained_in_the_epoch() -> None:
    rows = [100, 100, 50]                       # the last block is short
    assert epoch_fraction({}, 0, rows) == 0.0
    # block 0 done with epoch 2, block 1 40 rows in, block 2 not started (still at epoch 1's end)
    assert epoch_fraction({0: (2, 100), 1: (2, 40), 2: (1, 50)}, 2, rows) == pytest.approx(140 / 250)
    # a block already in a later epoch has all of this one; a row past the block's end counts the block
    assert epoch_fraction({0: (3, 0), 1: (2, 100), 2: (2, 999)}, 2, rows) == 1.0
    assert epoch_fraction({0: (0, 10)}, 0, []) == 0.0


def test_a_sample_is_due_at_each_eighth_of_an_epoch() -> None:
    c = ClockObjectives(budget=10.0, first_epoch_budget=10.0)
    c.trained(1.0)
    assert not c.due(0.1) and c.due(0.125) and c.due(0.3)
    c.record(30, 0.3, 0.9, eval_s=0.01)         # taken late, at 0.3: the next mark is 3/8
    assert c.next_mark() == pytest.approx(0.375)
    assert not c.due(0.36) and c.due(0.4)
    c.record(100, 1.0, 0.7)                      # the epoch's end (no evaluation cost)
    assert c.evaluations == 1 and c.eval_s == pytest.approx(0.01)
    assert not c.due(1.1) and c.due(1.125)
    c.record(100, 1.0, 0.7)                      # the same point again: ignored
    c.record(90, 1.2, 0.6)                       # an earlier clock at a later epoch: ignored
    assert [(p.iteration, p.epochs, p.objective) for p in c.report()] == [(30, 0.3, 0.9), (100, 1.0, 0.7)]


def test_evaluations_stay_within_the_budget_counting_the_next_one() -> None:
    c = ClockObjectives(budget=0.1, first_epoch_budget=0.5)
    c.trained(0.1)
    assert c.due(0.125)                          # the first: its cost is unknown, taken
    c.record(10, 0.125, 0.9, eval_s=1.0)
    assert not c.due(0.25)                       # 1 + 1 s against 0.5 x 0.1 s of training
    c.trained(3.8)                               # 2 / 3.9 s is over half
    assert not c.due(0.5)
    c.trained(0.1)                               # 2 / 4 s is half: within the first epoch's budget
    assert c.due(0.5)
    c.record(20, 0.5, 0.8, eval_s=0.6)           # cheaper this time: the next one is predicted at 0.6 s
    assert c.eval_s == pytest.approx(1.6) and c.evaluations == 2
    assert not c.due(0.75)                       # 2.2 / 4 s: over half
    c.trained(17.0)                              # 2.2 / 21 s: within half, over a tenth
    assert c.due(0.75) and not c.due(1.2)        # after the first epoch the budget is a tenth
    c.trained(1.0)                               # 2.2 / 22 s: a tenth
    assert c.due(1.2)
    c.trained(-1.0)
    c.trained(math.nan)                          # not a time: ignored
    assert c.train_s == pytest.approx(22.0)
    for bad in ({"every": 0.0}, {"every": 1.5}, {"budget": -1.0}, {"first_epoch_budget": -0.1}):
        with pytest.raises(ValueError):
            ClockObjectives(**bad)


def test_the_report_is_thinned_evenly_oldest_first_and_goes_back_on_a_restart() -> None:
    c = ClockObjectives()
    n = 3 * MAX_CLOCK_OBJECTIVES + 7
    for j in range(1, n + 1):
        c.record(5 * j, j / 8, 1.0 / j)
    c.record(5 * n + 5, (n + 1) / 8, math.nan)   # kept out of the report: JSON has no NaN
    rep = c.report()
    assert len(rep) == MAX_CLOCK_OBJECTIVES
    assert (rep[0].iteration, rep[-1].iteration) == (5, 5 * n)        # first and last kept
    assert all(a.iteration < b.iteration and a.epochs < b.epochs for a, b in zip(rep, rep[1:]))
    assert all(p.epochs == pytest.approx(p.iteration / 40) and p.objective == pytest.approx(1 / (8 * p.epochs))
               for p in rep)
    gaps = [b.iteration - a.iteration for a, b in zip(rep, rep[1:])]
    assert max(gaps) - min(gaps) <= 5                                  # evenly: one point apart at most
    # it travels in a JobReport as the RM decodes it
    decoded = JobReport.decode(msgspec.to_builtins(JobReport(workers=1, servers=1, clock_objectives=rep)))
    assert decoded.clock_objectives == rep
    c.go_back(5 * 40)                            # back to a checkpoint taken at epoch 5
    assert c.report()[-1].iteration == 200 and c.report()[-1].epochs == pytest.approx(5.0)
    assert c.next_mark() == pytest.approx(5.125)


@pytest.fixture
async def job():
    # 2000 rows in blocks of 250, batches of 50, 2 batches per worker per clock: 10 clocks an epoch
    j = await InProcessJob({"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 2, "clock_batches": 2}).start()
    yield j
    await j.close()


async def test_a_bsp_job_samples_the_exact_objective_within_its_epochs(job) -> None:
    initial = await job.setup()
    samples = job.metrics.clock_objectives
    samples.budget = samples.first_epoch_budget = 1e9     # every mark: this test checks the values, not the pacing
    ends: list[EpochRecord] = []
    checked: list[bool] = []
    evaluate = job.ctl.evaluation.objective

    async def on_epoch(rec: EpochRecord) -> None:
        ends.append(rec)

    async def recheck() -> float:       # each sample is the objective as it is at that boundary
        value = await evaluate()
        checked.append(await evaluate() == value)
        return value

    job.ctl.evaluation.objective = recheck
    await job.ctl.loop.train(on_epoch)
    points = [(p.iteration, p.epochs, p.objective) for p in samples.report()]
    assert [r.epoch for r in ends] == [0, 1] and checked and all(checked)
    its, epochs, objectives = zip(*points)
    assert all(a < b for a, b in zip(its, its[1:])) and all(a < b for a, b in zip(epochs, epochs[1:]))
    assert its[-1] == job.ctl.loop.iterations and epochs[-1] == 2.0
    # the epoch ends are the epoch objectives themselves; in between, 1/8-epoch marks of each epoch
    assert [(e, o) for _, e, o in points if e in (1.0, 2.0)] == [(1.0, ends[0].objective), (2.0, ends[1].objective)]
    mid = [e for e in epochs if e not in (1.0, 2.0)]
    assert len(mid) >= 10 and all(0.0 < e < 2.0 for e in mid)
    assert {math.floor(e * 8) for e in mid} >= set(range(1, 8)) | set(range(9, 16))
    # iterations per epoch: every 1/8 epoch is 1/8 of its mini-batch rounds (2000 rows / 50 / 2 workers)
    assert all(i == pytest.approx(e * 20, abs=2) for i, e, _ in points)
    # the same series as the epoch ends: it starts below the initial objective and falls on the whole
    assert objectives[0] < initial and objectives[-1] < objectives[0]
    assert sum(b < a for a, b in zip(objectives, objectives[1:])) >= 0.8 * (len(objectives) - 1)
    # Each epoch's record says how much of its time the samples took: together, every sample's time.
    assert all(0.0 < r.evaluation_s < r.epoch_time_s for r in ends)
    assert sum(r.evaluation_s for r in ends) == pytest.approx(samples.eval_s)
    assert ends[0].result().evaluation_s == ends[0].evaluation_s
