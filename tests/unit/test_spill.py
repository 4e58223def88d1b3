"""Harmony's spill (dissertation §4.3.3): lz4 spill files round-trip every block kind, a job trains
the same trajectory whatever alpha is, disk blocks are reloaded ahead of use and dropped after,
the hill climber settles between load stalls and memory pressure, and the AM's report carries
alpha and the bytes spilled."""
from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from appmaster.ps.executor_status import spill_report
from protocol import executor_ops as ops
from protocol.job_report import JobReport
from protocol.ps_job_spec import JobSpecError, validate
from psruntime.spill.alpha_tuner import (HARD_PRESSURE, SOFT_PRESSURE, AlphaTuner, SpillMeasurement, initial_alpha,
                                   quantize)
from psruntime.apps.base import StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.registry import create_app
from psruntime.spill.block_reloader import BlockReloader, disk_positions
from psruntime.store.block_store import BlockArrays
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.store.migration_controller import MigrationController
from psruntime.spill.spill_store import SpillError, SpillStore, decode, encode
from psruntime.store.store_client import StoreClient
from psruntime.training_pipeline import TrainingPipeline, init_blocks, init_model, pull_key_values, set_epoch_position
from protocol import container_env
from psruntime.spill.memory_reading import ContainerMemory, MemoryCgroup, find_memory_cgroup
from psruntime.spill.worker_spill import WorkerSpill, container_limit_bytes, parse_mode
from polling import async_wait_until
from store_cluster import executor_cluster

APPS = ("mlr", "nmf", "lda", "lasso")
# Small enough for milliseconds per epoch, with enough blocks for alpha 0.5 to split them.
SIZES = {"mlr": {"num_samples": 600, "rows_per_block": 100},
         "nmf": {"num_users": 300, "rows_per_block": 50},
         "lda": {"num_docs": 120, "rows_per_block": 20},
         "lasso": {"num_samples": 600, "rows_per_block": 100}}


def _app(name: str) -> Any:
    return create_app(name, SIZES[name], preset="tiny")


# ----- lz4 round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", APPS)
def test_every_apps_input_block_round_trips_through_an_lz4_spill_file(tmp_path: Path, name: str) -> None:
    app = _app(name)
    block = app.input_block(1)
    app.init_block(block)                   # state present: it must not be written (it stays in memory)
    store = SpillStore(tmp_path / "spill")
    on_disk = store.put_input(block)
    assert 0 < on_disk == store.nbytes() and store.names() == ["input-000001"]
    back = store.get_input(1)
    assert (back.app, back.block_index, back.row_start, back.num_rows) == (name, 1, block.row_start, block.num_rows)
    assert back.state == {} and list(back.data) == list(block.data)
    for k, a in block.data.items():
        assert back.data[k].dtype == a.dtype
        np.testing.assert_array_equal(back.data[k], a)
    assert tmp_path.joinpath("spill", "input-000001.lz4").read_bytes()[:8] == b"ELBUF001"  # a buffer file


def test_model_blocks_round_trip_in_the_checkpoint_wire_form(tmp_path: Path) -> None:
    store = SpillStore(tmp_path)
    dense = BlockArrays(np.array([3, 7, 11], np.int64), np.arange(12, dtype=np.float32).reshape(3, 4),
                        ["eps:minibatches"], [np.array([5.0], np.float32)])
    only_other = BlockArrays(np.zeros(0, np.int64), None, ["k"], [np.arange(3, dtype=np.float64)])
    for b, data in ((2, dense), (5, only_other)):
        store.put_model(b, data)
        back = store.get_model(b, num_blocks=8)
        np.testing.assert_array_equal(back.keys, data.keys)
        if data.values is None:
            assert back.values is None
        else:
            np.testing.assert_array_equal(back.values, data.values)
        assert back.other_keys == data.other_keys
        for x, y in zip(back.other_arrays, data.other_arrays):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def test_a_damaged_spill_file_is_refused_naming_it(tmp_path: Path) -> None:
    raw = encode({"x": 1}, [np.arange(5, dtype=np.int32), np.zeros((2, 0), np.float64)])
    header, arrays = decode(raw)
    assert header == {"x": 1} and arrays[0].tolist() == [0, 1, 2, 3, 4] and arrays[1].shape == (2, 0)
    with pytest.raises(SpillError, match="truncated"):
        decode(raw[:-7], "f")
    corrupt = bytearray(raw)
    corrupt[raw.index(b"\x04\x22\x4d\x18")] ^= 0xFF     # the first buffer's lz4 frame magic
    with pytest.raises(SpillError, match="lz4"):
        decode(bytes(corrupt), "f")
    with pytest.raises(SpillError, match="bad magic"):
        decode(b"nonsense" * 4, "f")
    with pytest.raises(SpillError, match="is not spilled"):
        SpillStore(tmp_path).get_input(3)
    with pytest.raises(SpillError, match="non-numeric"):
        encode({}, [np.array(["a"])])


# ----- reloading ----------------------------------------------------------------------------------

def test_disk_blocks_are_spread_over_the_block_order() -> None:
    assert disk_positions(8, 0.0) == set()
    assert disk_positions(8, 1.0) == set(range(8))
    assert disk_positions(8, 0.5) == {1, 3, 5, 7}
    assert disk_positions(8, 0.25) == {3, 7}
    assert all(len(disk_positions(n, a)) == int(a * n + 1e-9) for n in (3, 7, 10) for a in (0.3, 0.5, 0.7))


class GatedStore(SpillStore):
    """A spill store whose reads wait for `gate` and note which blocks were read."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.read_blocks: list[int] = []

    def get_input(self, block_index: int) -> DataBlock:
        self.read_blocks.append(block_index)
        assert self.gate.wait(10)
        return super().get_input(block_index)


async def test_the_next_disk_block_loads_while_a_block_is_used_and_is_dropped_after(tmp_path: Path) -> None:
    app = _app("mlr")
    store = GatedStore(tmp_path)
    ticks = iter(range(100))
    reloader = BlockReloader(store, alpha=0.5, clock=lambda: float(next(ticks)))
    blocks = [app.input_block(i) for i in range(4)]
    want = [dict(b.data) for b in blocks]
    for pos, b in enumerate(blocks):
        reloader.admit(len(blocks), pos, b)
    assert reloader.disk == {1, 3} and blocks[1].data == {} and blocks[0].data
    store.gate.set()
    reloader.plan(blocks)
    await reloader.acquire(blocks[0])                 # a memory block: no wait; block 1 starts loading
    # the read runs on the reloader's thread: wait for it to reach the store, not for a loop pass
    await async_wait_until(lambda: store.read_blocks, what="block 1's prefetch read started")
    store.gate.clear()
    assert store.read_blocks == [1]
    reloader.release(blocks[0])
    store.gate.set()
    await reloader.acquire(blocks[1])                 # was prefetched: one (fake) clock tick waited at most
    assert blocks[1].data.keys() == want[1].keys()
    for k in want[1]:
        np.testing.assert_array_equal(blocks[1].data[k], want[1][k])
    reloader.release(blocks[1])
    assert blocks[1].data == {}                        # dropped right after use
    await reloader.acquire(blocks[2])
    await reloader.acquire(blocks[3])
    assert store.read_blocks == [1, 3] and reloader.loads == 2
    assert reloader.stall_s == 2.0                    # two awaits, one fake tick each
    reloader.close()


async def test_a_block_made_a_memory_block_while_training_waits_for_its_load_keeps_its_data(tmp_path: Path) -> None:
    """EPS sends a disk block's data (materialize) while the pipeline is waiting for the same block's
    load: the load is used once, the block is a memory block from then on, and the end of its pass
    keeps its data -- it was dropped before, its spill file already forgotten, so it was lost."""
    app = _app("mlr")
    store = GatedStore(tmp_path)
    reloader = BlockReloader(store, alpha=1.0)
    block = app.input_block(0)
    want = dict(block.data)
    reloader.admit(1, 0, block)
    assert reloader.disk == {0} and block.data == {}
    reloader.plan([block])
    waiting = asyncio.ensure_future(reloader.acquire(block))
    await asyncio.sleep(0)        # one loop pass: the task runs up to its wait for the load
    assert not waiting.done()
    await async_wait_until(lambda: store.read_blocks, what="the block's load started")
    store.gate.set()
    reloader.materialize(block)                       # before the pipeline resumes
    await waiting
    set_epoch_position(block, 0, block.num_rows)      # its pass is over
    reloader.release(block)
    assert store.read_blocks == [0] and reloader.disk == set()
    assert block.data.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(block.data[k], want[k])
    reloader.close()


def test_blocks_arriving_one_by_one_are_spilled_without_reading_any_back(tmp_path: Path) -> None:
    """A worker with 6 blocks at alpha 0.5 takes 6 more, one activation at a time: after each, half
    of its blocks are on disk, and no block was read back to get there -- choosing the disk blocks
    afresh by position flipped most of them each time, every flip to memory a full read."""
    app = create_app("mlr", {**SIZES["mlr"], "num_samples": 12 * SIZES["mlr"]["rows_per_block"]}, preset="tiny")
    reloader = BlockReloader(SpillStore(tmp_path), alpha=0.5)
    blocks = [app.input_block(i) for i in range(6)]
    for pos, b in enumerate(blocks):
        reloader.admit(len(blocks), pos, b)
    first = set(reloader.disk)
    for i in range(6, 12):
        blocks.append(app.input_block(i))
        reloader.rebalance(blocks)
        assert len(reloader.disk) == len(disk_positions(len(blocks), 0.5))
        assert all(not b.data for b in blocks if b.block_index in reloader.disk)
    assert reloader.loads == 0 and first <= reloader.disk
    del blocks[:4]                                  # four leave (EPS takes them): half of 8 on disk
    reloader.rebalance(blocks)
    assert len(reloader.disk & {b.block_index for b in blocks}) == 4
    reloader.close()


async def test_set_alpha_moves_blocks_between_disk_and_memory(tmp_path: Path) -> None:
    app = _app("nmf")
    reloader = BlockReloader(SpillStore(tmp_path), alpha=1.0)
    blocks = [app.input_block(i) for i in range(6)]
    want = [dict(b.data) for b in blocks]
    for pos, b in enumerate(blocks):
        reloader.admit(len(blocks), pos, b)
    assert all(b.data == {} for b in blocks) and len(SpillStore(tmp_path).names()) == 6
    reloader.set_alpha(blocks, 1 / 3)
    assert reloader.disk == {2, 5}
    assert [bool(b.data) for b in blocks] == [True, True, False, True, True, False]
    for b, w in zip(blocks, want):
        for k in b.data:
            np.testing.assert_array_equal(b.data[k], w[k])
    reloader.close()


# ----- the trajectory is the same whatever alpha is -------------------------------------------------

async def _train(name: str, spill: WorkerSpill | None, epochs: int = 3, clock_batches: int = 3,
                 sync_batches: int = 1) -> tuple[list[float], np.ndarray, set[float]]:
    """A few epochs of one worker in clocks of `clock_batches` mini-batches (so blocks split across
    clocks) and sync windows of `sync_batches`, on fresh servers (their push-id memory too); the
    objective after each epoch, the final model and the alphas it trained at."""
    async with executor_cluster(2, 8) as (_, ctl, dp):
        return await _train_on(name, ctl, dp, spill, epochs, clock_batches, sync_batches)


async def _train_on(name: str, ctl: MigrationController, dp: DataPlaneClient, spill: WorkerSpill | None,
                    epochs: int, clock_batches: int, sync_batches: int = 1) -> tuple[list[float], np.ndarray, set[float]]:
    app = _app(name)
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    pipeline = TrainingPipeline()
    pipeline.sync_batches = sync_batches
    if spill is None:
        blocks = app.generate_partition(0, 1).blocks
        await init_blocks(store, app, blocks)
    else:
        blocks = spill.load_blocks(app, range(app.num_blocks))
        await spill.init_blocks(store, app, blocks)
        pipeline.residency = spill.reloader
    objectives = []
    alphas = set()
    for epoch in range(epochs):
        while (await pipeline.run_batches(app, store, blocks, StepContext(epoch, 1), limit=clock_batches)).batches:
            if spill is not None:
                spill.after_step(blocks, 1.0)
                alphas.add(spill.alpha)
        part = await pipeline.objective(app, store, blocks)
        objectives.append(part.value)
    model = await pull_key_values(store, app.model_keys(), app.key_length)
    pipeline.close()
    return objectives, model.values, alphas


@pytest.mark.parametrize("name", APPS)
async def test_the_objective_trajectory_is_the_same_whatever_alpha_is(tmp_path: Path, name: str) -> None:
    runs = {}
    for alpha in (0.0, 0.5, 1.0):
        spill = WorkerSpill(alpha, SpillStore(tmp_path / f"a{alpha}"), limit_bytes=0) if alpha else None
        runs[alpha] = await _train(name, spill)
        if spill is not None:
            assert spill.reloader.loads > 0 and spill.figures()["spilled_bytes"] > 0
    # "auto" with a pressure that swings: the tuner moves alpha between clocks, the math stays put.
    # (Nothing in memory at first: the initial alpha is 0, and the swings move it up.)
    swings = iter([0.0] + [0.95, 0.3, 0.9, 0.5, 0.2, 0.99] * 100)
    auto = WorkerSpill("auto", SpillStore(tmp_path / "auto"), limit_bytes=2**40,
                       rss=lambda: int(2**40 * next(swings)))
    runs[-1.0] = await _train(name, auto)
    assert len(runs[-1.0][2]) > 1                      # alpha did move
    base_obj, base_model, _ = runs[0.0]
    assert len(base_obj) == 3
    for alpha, (obj, model, _) in runs.items():
        assert obj == base_obj, (alpha, obj, base_obj)
        np.testing.assert_array_equal(model, base_model)


async def test_sync_windows_that_span_a_spilled_block_train_as_in_memory(tmp_path: Path) -> None:
    # Windows of 4 over MLR's 5-batch blocks, in clocks of 6: windows start mid-block and reach
    # into the next, which may be on disk -- it is loaded before the window reads it.
    in_memory = await _train("mlr", None, clock_batches=6, sync_batches=4)
    spill = WorkerSpill(0.5, SpillStore(tmp_path), limit_bytes=0)
    spilled = await _train("mlr", spill, clock_batches=6, sync_batches=4)
    assert spill.reloader.loads > 0
    assert spilled[0] == in_memory[0]
    np.testing.assert_array_equal(spilled[1], in_memory[1])


# ----- alpha: initial value and hill climbing ------------------------------------------------------

def test_initial_alpha_keeps_what_fits_in_memory_and_spills_the_rest() -> None:
    mb = 2**20
    assert initial_alpha(100 * mb, 10 * mb, 5 * mb, 50 * mb, 0, 10) == 0.0            # no limit known
    assert initial_alpha(50 * mb, 5 * mb, 5 * mb, 50 * mb, 1000 * mb, 10) == 0.0      # fits
    # budget = 0.7 * 400 - 100 - 20 - 3 * 10 = 130 MB of 200 MB: 35 % on disk, rounded up to 4 blocks of 20
    assert initial_alpha(200 * mb, 10 * mb, 20 * mb, 100 * mb, 400 * mb, 20) == pytest.approx(0.35)
    assert initial_alpha(200 * mb, 10 * mb, 20 * mb, 100 * mb, 400 * mb, 8) == 0.375
    assert initial_alpha(200 * mb, 10 * mb, 20 * mb, 400 * mb, 400 * mb, 8) == 1.0    # nothing left
    assert quantize(0.26, 4) == 0.5 and quantize(1.3, 4) == 1.0 and quantize(-1, 4) == 0.0


def _curve(alpha: float) -> SpillMeasurement:
    """A simulated worker: stalls grow once more than 40 % of the blocks are on disk (loading falls
    behind processing), memory falls linearly with alpha from 95 % of the limit at alpha 0."""
    stall_fraction = 1.5 * max(0.0, alpha - 0.4) ** 1.2
    return SpillMeasurement(step_s=10.0, stall_s=10.0 * stall_fraction,
                            rss_bytes=int(1000 * (0.95 - 0.5 * alpha)), limit_bytes=1000)


def test_the_hill_climber_settles_near_the_best_alpha_of_a_stall_pressure_curve() -> None:
    tuner = AlphaTuner(0.0, num_blocks=64)
    grid = [i / 64 for i in range(65)]
    costs = [tuner.cost(_curve(a)) for a in grid]
    best = grid[int(np.argmin(costs))]
    seen = []
    alpha = tuner.alpha
    for _ in range(120):
        alpha = tuner.observe(_curve(alpha))
        seen.append(alpha)
    assert 0.3 < best < 0.6
    # After the climb, it stays within a few of its smallest steps of the optimum.
    assert all(abs(a - best) <= 4 / 64 for a in seen[-30:]), (best, seen[-30:])
    # It left the dangerous region at once: from alpha 0 (95 % of the limit) straight up.
    assert seen[0] > 0.0
    assert tuner.cost(_curve(seen[-1])) <= min(costs) + 0.05


def test_the_climber_steps_up_at_the_hard_limit_and_asks_for_model_spill_at_alpha_1() -> None:
    tuner = AlphaTuner(0.5, num_blocks=4, window=3)
    full = SpillMeasurement(step_s=1.0, stall_s=0.0, rss_bytes=int(1000 * (HARD_PRESSURE + 0.01)), limit_bytes=1000)
    assert tuner.observe(full) == 1.0 and not tuner.wants_model_spill
    assert tuner.observe(full) == 1.0 and tuner.wants_model_spill
    calm = SpillMeasurement(step_s=1.0, stall_s=0.5, rss_bytes=int(1000 * SOFT_PRESSURE / 2), limit_bytes=1000)
    assert tuner.observe(calm) == 1.0 and not tuner.wants_model_spill    # a window of 3 before moving
    tuner.observe(calm)
    assert tuner.observe(calm) == 0.75                                   # down: fewer stalls
    with pytest.raises(ValueError):
        AlphaTuner(1.5)


# ----- the job spec, the executor's op and the report -----------------------------------------------

def test_the_job_spec_takes_a_fixed_alpha_or_auto_and_defaults_to_no_spill() -> None:
    assert validate({"app": "mlr"}).spill_alpha is None
    assert validate({"app": "mlr", "spill_alpha": 0.25}).spill_alpha == 0.25
    assert validate({"app": "mlr", "spill_alpha": 1}).spill_alpha == 1
    assert validate({"app": "mlr", "spill_alpha": "auto"}).spill_alpha == "auto"
    for bad in (1.5, -0.1, "sometimes", True):
        with pytest.raises(JobSpecError, match="^spill_alpha: "):
            validate({"app": "mlr", "spill_alpha": bad})
    setup = ops.decode_request({"op": "app_setup", "app": "lda", "spill_alpha": "auto"})
    assert isinstance(setup, ops.AppSetup) and setup.spill_alpha == "auto"
    assert "spill_alpha" not in ops.to_header(ops.AppSetup(app="lda"))      # old executors see no change
    assert parse_mode(None) is None and parse_mode(0.5) == 0.5 and parse_mode("auto") == "auto"
    with pytest.raises(ValueError):
        parse_mode(2)


def test_the_report_carries_the_mean_alpha_and_the_spilled_megabytes() -> None:
    from appmaster.ps.runtime.executor_pool import ExecutorRecord, Role

    def rec(i: int, alpha: float | None, spilled: int) -> ExecutorRecord:
        return ExecutorRecord(f"worker-{i}", Role.WORKER, container=None, spill_alpha=alpha,  # type: ignore[arg-type]
                              spilled_bytes=spilled)

    assert spill_report([rec(0, None, 0)]) == {}
    got = spill_report([rec(0, 0.25, 2**20), rec(1, 0.75, 3 * 2**20), rec(2, None, 0)])
    assert got == {"alpha": 0.5, "spilled_mb": 4.0}
    report = JobReport(workers=2, servers=1, **got)
    assert JobReport.decode(msgspec.to_builtins(report)).alpha == 0.5
    assert JobReport.decode({"workers": 1, "servers": 1}).alpha is None
    status = ops.decode_reply({"op": "ok", "spill": {"alpha": 0.5, "spilled_bytes": 10, "stall_s": 0.1}},
                              ops.StatusReply)
    assert status.spill is not None and status.spill.alpha == 0.5
    assert ops.decode_reply({"op": "ok"}, ops.StatusReply).spill is None


# ----- model blocks: a server's last resort ------------------------------------------------------

def test_a_spilled_model_block_is_still_held_and_comes_back_on_its_next_access(tmp_path: Path) -> None:
    from psruntime.store.block_store import BlockStore
    from psruntime.spill.model_spill import ModelSpill, block_to_spill
    from psruntime.store.ownership_table import blocks_of_int_keys

    store = BlockStore(4)
    keys = np.arange(40, dtype=np.int64)
    owner = blocks_of_int_keys(keys, 4)
    for b in range(4):
        store.create_block(b)
        mine = keys[owner == b]
        store.put_many(b, mine, np.outer(mine, np.ones(3)).astype(np.float32))
    store.put("audit", np.array([7.0], np.float32))
    files = SpillStore(tmp_path)
    spill = ModelSpill(store, files)
    store.spilled = spill
    audit_block = next(b for b in range(4) if "audit" in store.keys(b))
    before = store.nbytes()
    assert spill.spill(audit_block) > 0
    assert store.has_block(audit_block) and not store.in_memory(audit_block) and store.nbytes() < before
    assert audit_block in store.block_ids() and files.names() == [files.model_name(audit_block)]
    # The next access (a pull of its keys) brings it back, whole, and the file goes: it will change.
    mine = keys[owner == audit_block]
    out = np.zeros((len(mine), 3), np.float32)
    assert not store.gather(audit_block, mine, out).any()           # none missing
    np.testing.assert_array_equal(out, np.outer(mine, np.ones(3)))
    assert store.get("audit") is not None and float(store.get("audit")[0]) == 7.0
    assert store.in_memory(audit_block) and files.names() == [] and spill.reloads == 1
    # A push to a spilled block lands on its reloaded rows; a dropped (moved away) block's file goes.
    other = (audit_block + 1) % 4
    spill.spill(other)
    theirs = keys[owner == other]
    store.update_many(other, "add", theirs, np.ones((len(theirs), 3), np.float32))
    np.testing.assert_array_equal(store.export_arrays(other).values, np.outer(theirs, np.ones(3)) + 1)
    spill.spill(other)
    store.drop_block(other)
    assert not store.has_block(other) and files.names() == []
    assert block_to_spill({0: 10, 1: 30, 2: 30, 3: 0}) == 1 and block_to_spill({3: 0}) is None


def test_a_model_spill_that_cannot_write_leaves_the_block_in_memory_whole(tmp_path: Path) -> None:
    from psruntime.spill.model_spill import ModelSpill
    from psruntime.store.block_store import BlockStore

    store = BlockStore(1)
    store.create_block(0)
    keys = np.arange(10, dtype=np.int64)
    store.put_many(0, keys, np.outer(keys, np.ones(3)).astype(np.float32))
    blocker = tmp_path / "spill"
    blocker.write_text("a file where the spill dir would be")       # mkdir fails: nowhere to write
    spill = ModelSpill(store, SpillStore(blocker))
    store.spilled = spill
    with pytest.raises(OSError):
        spill.spill(0)
    assert store.has_block(0) and store.in_memory(0) and not spill.holds(0) and spill.spills == 0
    np.testing.assert_array_equal(store.export_arrays(0).values, np.outer(keys, np.ones(3)))


async def test_a_server_at_the_hard_limit_spills_model_blocks_and_still_serves_them(tmp_path: Path) -> None:
    from psruntime.spill.model_spill import ModelSpillMonitor

    app = _app("mlr")
    async with executor_cluster(1, 4) as (executors, ctl, dp):
        store = StoreClient(ctl.table, dp)
        await init_model(store, app)
        keys = app.model_keys()
        await store.push_array(keys, np.full((len(keys), app.key_length), 0.5, np.float32))
        await store.flush()
        service = executors[0].service
        rss = [100]
        monitor = ModelSpillMonitor(service, SpillStore(tmp_path), limit_bytes=1000, rss=lambda: rss[0])
        assert monitor.check() is None                               # 10 % of the limit: nothing to do
        rss[0] = 950
        spilled = [monitor.check() for _ in range(5)]
        assert sorted(b for b in spilled if b is not None) == [0, 1, 2, 3] and spilled[-1] is None
        assert monitor.figures()["model_blocks_spilled"] == 4 and service.store.nbytes() == 0
        pulled = await pull_key_values(store, keys, app.key_length)   # every block reloaded on access
        np.testing.assert_array_equal(pulled.values, np.full((len(keys), app.key_length), 0.5, np.float32))
        assert monitor.figures()["model_blocks_spilled"] == 0 and monitor.figures()["model_reloads"] == 4


# ----- a job through the AM's training parts ---------------------------------------------------------

async def test_a_job_with_spill_trains_as_without_and_reports_alpha_and_spilled_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_ps_training import InProcessJob

    monkeypatch.setenv("PWD", str(tmp_path))          # the executors' spill/ is the "container's" dir
    # One worker: with two, a worker's pulls see the other's pushes as they happen to arrive.
    spec = {"app": "lda", "workers": 1, "servers": 2, "max_epochs": 2, "data": SIZES["lda"]}
    histories = {}
    for alpha in (None, 0.5):
        job = await InProcessJob({**spec, "spill_alpha": alpha}).start()
        try:
            await job.setup()
            seen: list[float] = []

            async def on_epoch(rec: Any) -> None:
                seen.append(rec.objective)

            await job.ctl.loop.train(on_epoch)
            histories[alpha] = seen
            await job.ctl.status.refresh()
            report = spill_report(job.pool.executors.values())
            if alpha is None:
                assert report == {}
            else:
                assert report["alpha"] == 0.5 and report["spilled_mb"] > 0
                assert all(w.spill_alpha == 0.5 and w.spill_stall_s >= 0 for w in job.pool.workers)
        finally:
            await job.close()
    assert histories[0.5] == histories[None] and len(histories[None]) == 2


def test_auto_spill_picks_alpha_from_the_first_block_and_spills_while_it_generates(tmp_path: Path) -> None:
    app = _app("mlr")
    sample = app.input_block(0).nbytes
    n = app.num_blocks
    # A limit that leaves room for about a third of the data beside a 1 MB "process" and 3 blocks.
    limit = int((2**20 + 3 * sample + app.model_nbytes() + n * sample / 3) / 0.7)
    spill = WorkerSpill("auto", SpillStore(tmp_path), limit_bytes=limit, rss=lambda: 2**20)
    blocks = spill.load_blocks(app, range(n))
    assert spill.alpha == initial_alpha(n * sample, sample, app.model_nbytes(), 2**20, limit, n)
    assert 0.5 <= spill.alpha < 1.0
    on_disk = [b.block_index for b in blocks if not b.data]
    assert len(on_disk) == round(spill.alpha * n) and sorted(spill.reloader.disk) == on_disk
    assert spill.tuner is not None and spill.tuner.alpha == spill.alpha
    # Without a known limit "auto" spills nothing.
    assert WorkerSpill("auto", SpillStore(tmp_path / "none"), limit_bytes=0).load_blocks(app, range(n))[0].data


# ----- what memory the tuner reads ---------------------------------------------------------------------------
V1_MOUNTINFO = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
                "35 31 0:32 /outer /fake/memory rw,relatime - cgroup cgroup rw,memory\n"
                "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")


def test_the_memory_cgroup_is_found_through_the_mount_root_and_v1_wins_on_a_hybrid_host() -> None:
    v1 = find_memory_cgroup("4:memory:/outer/elastane/nm/container_1\n1:cpu:/x\n0::/\n", V1_MOUNTINFO)
    assert v1 == MemoryCgroup(Path("/fake/memory/elastane/nm/container_1"), "v1")
    v2 = find_memory_cgroup("0::/elastane/c2\n", "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert v2 == MemoryCgroup(Path("/sys/fs/cgroup/elastane/c2"), "v2")
    # A cgroup outside what the mount shows cannot be read.
    assert find_memory_cgroup("4:memory:/elsewhere/c\n", V1_MOUNTINFO) is None


def _fake_proc(tmp_path: Path, limit: str, usage: int, stat: str, rss_pages: int) -> Path:
    cg = tmp_path / "cg" / "elastane" / "c1"
    cg.mkdir(parents=True)
    (cg / "memory.limit_in_bytes").write_text(limit + "\n")
    (cg / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (cg / "memory.stat").write_text(stat)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("4:memory:/elastane/c1\n")
    (proc / "mountinfo").write_text(f"35 31 0:32 / {tmp_path / 'cg'} rw - cgroup cgroup rw,memory\n")
    (proc / "statm").write_text(f"9999 {rss_pages} 10 1 0 10 0\n")
    return proc


def test_a_container_cgroup_is_read_less_its_file_cache_and_rss_is_the_fallback(tmp_path: Path) -> None:
    stat = "cache 60\ntotal_active_file 30000000\ntotal_inactive_file 20000000\ntotal_rss 90000000\n"
    mem = ContainerMemory(_fake_proc(tmp_path / "a", str(160 * 2**20), 150_000_000, stat, rss_pages=5))
    assert mem.source == "cgroup v1" and mem.limit_bytes() == 160 * 2**20
    assert mem.used_bytes() == 150_000_000 - 50_000_000      # not the RSS of 5 pages
    # No limit of its own (v1 says PAGE_COUNTER_MAX): not a container cgroup; /proc's RSS instead.
    free = ContainerMemory(_fake_proc(tmp_path / "b", "9223372036854771712", 1, stat, rss_pages=7))
    assert free.source == "rss" and free.limit_bytes() == 0
    assert free.used_bytes() == 7 * os.sysconf("SC_PAGE_SIZE")


def test_the_container_limit_is_the_tighter_of_its_environment_and_its_cgroup(monkeypatch: Any) -> None:
    monkeypatch.setenv(container_env.CONTAINER_MEMORY_MB, "200")
    assert container_limit_bytes() == 200 * 2**20
    assert container_limit_bytes(150 * 2**20) == 150 * 2**20
    monkeypatch.delenv(container_env.CONTAINER_MEMORY_MB)
    assert container_limit_bytes(150 * 2**20) == 150 * 2**20 and container_limit_bytes() == 0


def test_the_climber_holds_where_nothing_is_measurably_better_and_leaves_the_band_near_the_limit() -> None:
    def m(pressure: float, stall_fraction: float) -> SpillMeasurement:
        return SpillMeasurement(step_s=1.0, stall_s=stall_fraction, rss_bytes=int(1000 * pressure), limit_bytes=1000)

    tuner = AlphaTuner(0.5, num_blocks=8)
    # Calm: under the soft limit, stalls a few % of a step: no move (each one costs reloads, and a
    # drift down on noise ends near the limit).
    assert [tuner.observe(m(0.5, 0.02)) for _ in range(10)] == [0.5] * 10
    # Between soft and hard: up, one step per window, until under the soft limit again.
    assert [tuner.observe(m(0.75, 0.0)) for _ in range(2)] == [0.5, 0.625]
    assert [tuner.observe(m(0.6, 0.0)) for _ in range(4)] == [0.625] * 4
    # Stalls over the tolerance with memory to spare: the climb starts, downwards.
    assert [tuner.observe(m(0.5, 0.3)) for _ in range(2)] == [0.625, 0.5]
    # A warm-up step (the pipeline filling) is not measured: its stall moves nothing.
    warm = AlphaTuner(0.5, num_blocks=8, warmup=1)
    assert [warm.observe(x) for x in (m(0.5, 0.9), m(0.5, 0.0), m(0.5, 0.0))] == [0.5] * 3
