"""Per-iteration BSP clocks: the pacer's sizing, a worker's place in its epoch across clocks, and
training that stops at a clock boundary and resumes the epoch where it stopped."""
from __future__ import annotations

from typing import Any

import pytest

from appmaster.ps.clock_pacing import MAX_BATCHES, START_BATCHES, ClockPacer
from appmaster.ps.metrics import EpochRecord
from psruntime.wire.dataplane import RemoteError
from test_ps_training import job_factory  # noqa: F401 - the fixture

BATCHES_PER_WORKER = 2000 // 50 // 2     # mlr tiny: 2000 rows, batch 50, 2 workers


# -- the pacer (pure) --------------------------------------------------------------------------
def test_a_fixed_clock_size_is_kept() -> None:
    p = ClockPacer(7)
    p.observe(7, 100.0)
    assert p.batches == 7


def test_auto_clocks_start_small_then_aim_at_the_target() -> None:
    p = ClockPacer(0, target_s=0.5)
    assert p.batches == START_BATCHES
    p.observe(10, 0.1)                       # 10 ms per batch -> 50 batches for 0.5 s
    assert p.batches == 50
    p.observe(0, 0.0)                        # an idle worker-clock says nothing
    assert p.batches == 50
    p.observe(50, 2.5)                       # slower now: the average moves half way (30 ms)
    assert p.batches == round(0.5 / 0.03)
    p.observe(1, 1e-9)
    p.observe(1, 1e-9)
    assert p.batches <= MAX_BATCHES
    p.observe(1, 100.0)
    assert p.batches == 1


def test_bad_pacer_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="clock_batches"):
        ClockPacer(-1)
    with pytest.raises(ValueError, match="target"):
        ClockPacer(0, target_s=0)


# -- one worker's clocks ---------------------------------------------------------------------
async def test_clocks_walk_the_epoch_once_and_keep_their_place(job_factory) -> None:  # noqa: F811
    job = await job_factory({"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 2})
    await job.setup()
    w = job.pool.workers[0]

    async def op(header: dict[str, Any]) -> dict[str, Any]:
        return (await job.client.request(w.address, header)).header

    total, clocks = 0, 0
    while True:
        h = await op({"op": "run_clock", "epoch": 0, "batches": 3, "num_workers": 2})
        total, clocks = total + h["batches"], clocks + 1
        assert h["batches"] <= 3
        if h["epoch_done"]:
            break
    assert total == BATCHES_PER_WORKER and clocks == -(-BATCHES_PER_WORKER // 3)
    positions = (await op({"op": "positions"}))["positions"]
    assert positions and all(e == 0 and row > 0 for e, row in positions.values())
    again = await op({"op": "run_clock", "epoch": 0, "batches": 3, "num_workers": 2})
    assert again["batches"] == 0 and again["epoch_done"]          # nothing of epoch 0 runs twice
    nxt = await op({"op": "run_clock", "epoch": 1, "batches": 5, "num_workers": 2})
    assert nxt["batches"] == 5 and not nxt["epoch_done"]
    # positions can be set back (a restarted job), and bad ones are refused changing nothing
    block = next(iter(positions))
    with pytest.raises(RemoteError, match=r"Expected `int` >= 0 - at `\$\.positions\[\.\.\.\]\[1\]`"):
        await op({"op": "set_positions", "positions": {block: [1, -3]}})
    with pytest.raises(RemoteError, match=r"Expected `object`, got `array` - at `\$\.positions`"):
        await op({"op": "set_positions", "positions": [1]})
    with pytest.raises(RemoteError, match="batches"):
        await op({"op": "run_clock", "epoch": 1, "batches": 0, "num_workers": 2})
    assert (await op({"op": "set_positions", "positions": {block: [1, 0]}}))["applied"] == 1
    assert (await op({"op": "positions"}))["positions"][block] == [1, 0]
    rest = await op({"op": "run_epoch", "epoch": 1, "num_workers": 2})
    assert rest["batches"] > BATCHES_PER_WORKER - 5      # the first block's batches run again


# -- the AM's loop -----------------------------------------------------------------------------
async def test_bsp_training_in_clocks_runs_every_batch_once_per_epoch(job_factory) -> None:  # noqa: F811
    job = await job_factory({"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 3, "clock_batches": 4})
    initial = await job.setup()
    epochs: list[EpochRecord] = []
    clocks: list[int] = []
    job.ctl.loop.on_clock = lambda: clocks.append(job.ctl.loop.iterations)

    async def on_epoch(rec: EpochRecord) -> None:
        epochs.append(rec)

    await job.ctl.loop.train(on_epoch)
    assert [r.epoch for r in epochs] == [0, 1, 2] and job.ctl.loop.converged
    per_epoch = -(-BATCHES_PER_WORKER // 4)
    assert job.ctl.loop.clocks_done == len(clocks) == 3 * per_epoch
    assert clocks == sorted(clocks) and job.ctl.loop.iterations == 3 * BATCHES_PER_WORKER
    for w in job.pool.workers:
        assert job.metrics.workers[w.executor_id].compute_s.count == 3 * BATCHES_PER_WORKER
    objectives = [r.objective for r in epochs]
    assert all(b < a for a, b in zip([initial] + objectives, objectives)), objectives
    assert await job.ctl.evaluation.objective() == pytest.approx(objectives[-1], rel=1e-9)   # exact under BSP


async def test_a_stop_at_a_clock_boundary_resumes_the_epoch_where_it_was(job_factory) -> None:  # noqa: F811
    job = await job_factory({"app": "mlr", "workers": 2, "servers": 1, "max_epochs": 2, "clock_batches": 3})
    await job.setup()
    epochs: list[int] = []

    async def on_epoch(rec: EpochRecord) -> None:
        epochs.append(rec.epoch)

    def stop_after_two() -> None:
        if job.ctl.loop.clocks_done == 2:
            job.ctl.loop.stop()

    job.ctl.loop.on_clock = stop_after_two
    await job.ctl.loop.train(on_epoch)
    assert epochs == [] and job.ctl.loop.epochs_done == 0 and job.ctl.loop.clocks_done == 2   # mid-epoch
    for w in job.pool.workers:
        assert job.metrics.workers[w.executor_id].compute_s.count == 6
    job.ctl.loop.resume()          # as a restarted job starts: not stopped
    job.ctl.loop.on_clock = None
    await job.ctl.loop.train(on_epoch)
    assert epochs == [0, 1]
    for w in job.pool.workers:   # epoch 0 finished its remaining batches only: each batch once per epoch
        assert job.metrics.workers[w.executor_id].compute_s.count == 2 * BATCHES_PER_WORKER


async def test_ssp_runs_in_clocks_within_the_staleness(job_factory) -> None:  # noqa: F811
    job = await job_factory({"app": "lasso", "workers": 2, "servers": 1, "sync": "ssp", "staleness": 1,
                             "max_epochs": 3, "clock_batches": 2})
    await job.setup()
    epochs: list[int] = []

    async def on_epoch(rec: EpochRecord) -> None:
        epochs.append(rec.epoch)

    await job.ctl.loop.train(on_epoch)
    assert epochs[:3] == [0, 1, 2]
