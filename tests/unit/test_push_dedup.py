"""Idempotent pushes (psruntime.store.push_ids): a push id is applied once per block by the servers, a
repeated one is acknowledged without being applied, ids two epochs old are forgotten, a block's
ids go with it when it migrates and are forgotten when it is restored."""
from __future__ import annotations

import numpy as np
import pytest

from psruntime.wire.frame_codec import Frame
from psruntime.store.ownership_table import OwnershipTable
from psruntime.store.push_ids import COUNT, DELTAS, EPOCH_BITS, AppliedPushes, epoch_of, push_id
from psruntime.store.store_client import StoreClient
from psruntime.store.store_service import StoreService
from store_cluster import executor_cluster

NB = 6
WIDTH = 3


def test_ids_are_unique_per_split_epoch_row_and_kind_and_name_their_epoch() -> None:
    ids = {push_id(s, e, r, k) for s in (0, 1, 5) for e in (0, 1, 7) for r in (0, 32, 64) for k in (DELTAS, COUNT)}
    assert len(ids) == 3 * 3 * 3 * 2 and all(isinstance(i, int) and 0 <= i < 2 ** 63 for i in ids)
    pid = push_id(5, 7, 64, COUNT)
    assert pid is not None and epoch_of(pid) == 7
    # Out of range: not deduplicated rather than wrong.
    assert push_id(0, 1 << EPOCH_BITS, 0) is None and push_id(-1, 0, 0) is None and push_id(0, 0, 0, 2) is None


def test_a_repeated_id_is_refused_per_block_and_ids_two_epochs_old_are_pruned() -> None:
    applied = AppliedPushes()
    a, b = push_id(3, 0, 0), push_id(3, 0, 32)
    assert a is not None and b is not None
    assert applied.first_time(a, block=1) and applied.first_time(a, block=2)     # one push, two blocks
    assert not applied.first_time(a, block=1) and applied.repeats == 1
    assert applied.first_time(b, block=1)
    e1 = push_id(3, 1, 0)
    assert e1 is not None and applied.first_time(e1, block=1)
    assert not applied.first_time(a, block=1)             # the previous epoch is still remembered
    e2 = push_id(3, 2, 0)
    assert e2 is not None and applied.first_time(e2, block=1)
    assert applied.export(1) == sorted([e1, e2]) and len(applied) == 2         # epoch 0 pruned
    assert applied.first_time(a, block=1)                 # older than anything kept: applied, not judged
    assert len(applied) == 2
    applied.forget([1])
    assert len(applied) == 0 and applied.newest == -1 and applied.first_time(e1, block=1)


@pytest.fixture
async def cluster():
    async with executor_cluster(2, NB) as c:
        yield c


async def values(c: StoreClient, keys: np.ndarray) -> np.ndarray:
    got, _ = await c.pull_array(keys, (WIDTH,), np.float32)
    return got


async def test_a_repeated_push_is_acknowledged_and_not_applied(cluster) -> None:
    executors, ctl, dp = cluster
    c = StoreClient(ctl.table, dp)
    keys = np.arange(0, 60, dtype=np.int64)                 # spread over both servers and every block
    ones = np.ones((len(keys), WIDTH), np.float32)
    pid = push_id(4, 2, 96)
    for _ in range(3):                                       # a redone mini-batch pushes its id again
        await c.push_array(keys, ones, push_id=pid)
    await c.push_array(keys, ones, push_id=push_id(4, 2, 128))    # the next mini-batch applies
    await c.push_array(keys, ones)                                # no id: always applied
    await c.push_array(keys, ones)
    await c.push(["count"], [np.ones(1, np.float32)], push_id=push_id(4, 2, 96, COUNT))
    await c.push(["count"], [np.ones(1, np.float32)], push_id=push_id(4, 2, 96, COUNT))
    await c.flush()
    np.testing.assert_array_equal(await values(c, keys), np.full((len(keys), WIDTH), 4, np.float32))
    assert float((await c.pull(["count"]))["count"][0]) == 1.0
    assert sum(e.service.applied_pushes.repeats for e in executors) == 2 * NB + 1   # every block's part, twice
    await c.close()


async def test_a_block_keeps_its_ids_when_it_migrates_and_forgets_them_when_restored(cluster) -> None:
    executors, ctl, dp = cluster
    c = StoreClient(ctl.table, dp)
    keys = np.arange(0, 60, dtype=np.int64)
    ones = np.ones((len(keys), WIDTH), np.float32)
    pid = push_id(0, 5, 0)
    await c.push_array(keys, ones, push_id=pid)
    await c.flush()
    src, dst = executors
    moved = src.service.owned_blocks()[:2]
    await ctl.move(moved, src.executor_id, dst.executor_id)
    assert all(dst.service.applied_pushes.export(b) == [pid] for b in moved)
    await c.push_array(keys, ones, push_id=pid)            # the redo reaches the block at its new owner
    await c.flush()
    np.testing.assert_array_equal(await values(c, keys), np.ones((len(keys), WIDTH), np.float32))
    # A checkpoint's blocks restored: the epochs after it are trained again, so their ids apply.
    ckpt = await dp.request(dst.address, {"op": "checkpoint_blocks"})
    await dp.request(dst.address, {"op": "restore_blocks_data", "blocks": ckpt.header["blocks"]}, ckpt.arrays)
    assert all(dst.service.applied_pushes.export(b) == [] for b in dst.service.owned_blocks())
    await c.close()


async def test_a_repeat_queued_on_an_incoming_block_is_judged_with_the_ids_it_brings() -> None:
    """A redone push that reaches a block's destination while the block is on its way (queued
    there) is not applied if the block was applied with its id at the source."""
    table = OwnershipTable(1, ["src"], {"src": "127.0.0.1:1"}, version=1)
    dst = StoreService("dst", table, None)  # type: ignore[arg-type]  # it starts no migration here
    dst.take_ownership([0], "src")                        # block 0 is on its way from src
    pid = push_id(1, 0, 50)
    keys, ones = np.arange(4, dtype=np.int64), np.ones((4, WIDTH), np.float32)

    def push(p: int | None) -> object:
        header = {"op": "update", "func": "add", "key_array": True, **({} if p is None else {"push_id": p})}
        return dst.handle_data(Frame(header, [keys, ones]))

    queued = [push(pid), push(pid), push(push_id(1, 0, 100))]    # the redo's push twice, then a new one
    # The block arrives with its data (the original push already applied: 1s) and its ids.
    dst.receive_block(0, [], [keys, ones.copy()], applied=[pid])
    for reply in queued:
        await reply  # type: ignore[misc]
    got = np.zeros((4, WIDTH), np.float32)
    dst.store.gather(0, keys, got)
    np.testing.assert_array_equal(got, np.full((4, WIDTH), 2, np.float32))    # the original + the new one
    assert dst.applied_pushes.repeats == 2


async def test_a_queued_push_that_fails_its_check_does_not_spend_its_id() -> None:
    """A push queued on an incoming block and refused when the block arrives (here: rows of the
    wrong width) applied nothing, so the same id sent again, well formed, is applied."""
    table = OwnershipTable(1, ["src"], {"src": "127.0.0.1:1"}, version=1)
    dst = StoreService("dst", table, None)  # type: ignore[arg-type]  # it starts no migration here
    dst.take_ownership([0], "src")
    pid = push_id(1, 0, 50)
    keys = np.arange(4, dtype=np.int64)

    def push(values: np.ndarray) -> object:
        header = {"op": "update", "func": "add", "key_array": True, "push_id": pid}
        return dst.handle_data(Frame(header, [keys, values]))

    bad = push(np.ones((4, WIDTH + 1), np.float32))
    dst.receive_block(0, [], [keys, np.ones((4, WIDTH), np.float32)], applied=[])
    with pytest.raises(Exception, match="shape"):
        await bad  # type: ignore[misc]
    reply = push(np.ones((4, WIDTH), np.float32))          # served now: the block is here
    assert not isinstance(reply, Exception)
    got = np.zeros((4, WIDTH), np.float32)
    dst.store.gather(0, keys, got)
    np.testing.assert_array_equal(got, np.full((4, WIDTH), 2, np.float32))
    assert dst.applied_pushes.repeats == 0
